//! The native file dialogs the panels open (rfd): the one place the app asks the desktop for a
//! path. A web build has no such dialogs (rfd's are async there and yield file contents, not
//! paths), so there every function returns `None` and the page's own file input and drops are
//! the way in; files go out of a page as downloads ([`offer_downloads`]).

use std::path::PathBuf;

/// A folder (a dataset, an export destination).
pub fn pick_folder() -> Option<PathBuf> {
    #[cfg(not(target_arch = "wasm32"))]
    return rfd::FileDialog::new().pick_folder();
    #[cfg(target_arch = "wasm32")]
    None
}

/// One existing file whose name ends in one of `extensions` (`filter` names them).
pub fn pick_file(filter: &str, extensions: &[&str]) -> Option<PathBuf> {
    #[cfg(not(target_arch = "wasm32"))]
    return rfd::FileDialog::new().add_filter(filter, extensions).pick_file();
    #[cfg(target_arch = "wasm32")]
    {
        let _ = (filter, extensions);
        None
    }
}

/// Any number of existing files.
pub fn pick_files() -> Option<Vec<PathBuf>> {
    #[cfg(not(target_arch = "wasm32"))]
    return rfd::FileDialog::new().pick_files();
    #[cfg(target_arch = "wasm32")]
    None
}

/// A path to save to, `file_name` proposed.
pub fn save_file(file_name: &str) -> Option<PathBuf> {
    #[cfg(not(target_arch = "wasm32"))]
    return rfd::FileDialog::new().set_file_name(file_name).save_file();
    #[cfg(target_arch = "wasm32")]
    {
        let _ = file_name;
        None
    }
}

/// Offers `files` (`(file name, bytes)`, e.g. an export's) to the user as browser downloads,
/// one per file, in order.
///
/// # Errors
/// Natively always (the desktop app exports into a folder, [`pick_folder`]); in a page when
/// the browser refuses to make a file's blob or its link, naming the file.
pub fn offer_downloads(files: Vec<(&'static str, Vec<u8>)>) -> Result<(), String> {
    #[cfg(target_arch = "wasm32")]
    return downloads::offer(files);
    #[cfg(not(target_arch = "wasm32"))]
    {
        let _ = files;
        Err("downloads are made in a browser: choose an export folder".into())
    }
}

/// Browser downloads: a blob URL per file, clicked as an `<a download>` link.
#[cfg(target_arch = "wasm32")]
mod downloads {
    use std::cell::RefCell;

    use eframe::web_sys;
    use wasm_bindgen::JsCast;
    use wasm_bindgen::prelude::*;

    #[wasm_bindgen]
    extern "C" {
        #[wasm_bindgen(catch, js_namespace = URL, js_name = createObjectURL)]
        fn create_object_url(blob: &web_sys::Blob) -> Result<String, JsValue>;
        #[wasm_bindgen(js_namespace = URL, js_name = revokeObjectURL)]
        fn revoke_object_url(url: &str);
    }

    thread_local! {
        /// The blob URLs of the last export's downloads: released at the next export (released
        /// at once, a download the browser has not started reading yet would fail).
        static LAST_URLS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    }

    pub(super) fn offer(files: Vec<(&'static str, Vec<u8>)>) -> Result<(), String> {
        LAST_URLS.with(|urls| urls.borrow_mut().drain(..).for_each(|u| revoke_object_url(&u)));
        let document = web_sys::window().and_then(|w| w.document()).ok_or("the page has no document")?;
        for (name, bytes) in files {
            let fail = |e: JsValue| format!("{name}: the browser refused the download ({e:?})");
            let parts = js_sys::Array::of1(&js_sys::Uint8Array::from(bytes.as_slice()));
            let options = web_sys::BlobPropertyBag::new();
            options.set_type("application/octet-stream");
            let blob = web_sys::Blob::new_with_u8_array_sequence_and_options(&parts, &options).map_err(fail)?;
            let url = create_object_url(&blob).map_err(fail)?;
            LAST_URLS.with(|urls| urls.borrow_mut().push(url.clone()));
            let link = document.create_element("a").map_err(fail)?;
            link.set_attribute("href", &url).map_err(fail)?;
            link.set_attribute("download", name).map_err(fail)?;
            link.dyn_into::<web_sys::HtmlElement>().map_err(|e| fail(e.into()))?.click();
        }
        Ok(())
    }
}
