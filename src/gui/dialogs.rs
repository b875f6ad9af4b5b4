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

/// A folder's files, `(folder name, [(path within the folder, bytes)])`.
#[cfg(target_arch = "wasm32")]
pub(super) type PickedFolder = (String, Vec<(PathBuf, std::sync::Arc<[u8]>)>);

/// The folder dialog of a page: an `<input type="file" webkitdirectory>` the app clicks; the
/// browser then hands over every file of the picked folder with its path within the folder
/// (`webkitRelativePath`), read here asynchronously by a task of the page and collected for
/// the next frame ([`Self::take`]). The bytes live in the page's memory (wasm's 4 GiB at most).
#[cfg(target_arch = "wasm32")]
#[derive(Default)]
pub(super) struct PageFolder {
    read: std::rc::Rc<std::cell::RefCell<Option<Result<PickedFolder, String>>>>,
}

#[cfg(target_arch = "wasm32")]
impl PageFolder {
    /// Opens the browser's folder dialog (a click's user activation must still hold: call it
    /// in the frame of the click). Nothing happens if the user cancels.
    ///
    /// # Errors
    /// When the page has no document or the input cannot be made.
    pub(super) fn pick(&self, ctx: &eframe::egui::Context) -> Result<(), String> {
        use eframe::web_sys;
        use wasm_bindgen::JsCast;
        use wasm_bindgen::closure::Closure;
        let document = web_sys::window().and_then(|w| w.document()).ok_or("the page has no document")?;
        let input = document
            .create_element("input")
            .ok()
            .and_then(|e| e.dyn_into::<web_sys::HtmlInputElement>().ok())
            .ok_or("the page cannot make a file input")?;
        input.set_type("file");
        input.set_multiple(true);
        input.set_webkitdirectory(true);
        let (read, ctx, picked) = (self.read.clone(), ctx.clone(), input.clone());
        let on_change = Closure::once(move || {
            wasm_bindgen_futures::spawn_local(async move {
                let result = read_picked(&picked).await;
                *read.borrow_mut() = Some(result);
                ctx.request_repaint();
            });
        });
        input.set_onchange(Some(on_change.as_ref().unchecked_ref()));
        on_change.forget(); // runs once, when the user picks; a cancelled dialog leaks it
        input.click();
        Ok(())
    }

    /// The folder read since the last call, or why it could not be read.
    pub(super) fn take(&self) -> Option<Result<PickedFolder, String>> {
        self.read.borrow_mut().take()
    }
}

/// The files of a folder input: the folder's name (the first component of each file's
/// `webkitRelativePath`) and each file's path below it with its bytes (empty for the files the
/// scan ignores by name). A file the browser cannot read comes as empty bytes, which the loader
/// skips naming it as empty.
#[cfg(target_arch = "wasm32")]
async fn read_picked(input: &eframe::web_sys::HtmlInputElement) -> Result<PickedFolder, String> {
    let list = input.files().ok_or("the browser handed over no files")?;
    let mut root = String::new();
    let mut files = Vec::with_capacity(list.length() as usize);
    for file in (0..list.length()).filter_map(|i| list.get(i)) {
        let relative = js_sys::Reflect::get(&file, &"webkitRelativePath".into())
            .ok()
            .and_then(|p| p.as_string())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| file.name());
        let (folder, within) = relative.split_once('/').unwrap_or(("", relative.as_str()));
        if root.is_empty() {
            root = folder.to_string();
        }
        // Only images are read: the scan ignores the rest by name (`.git` objects, videos,
        // junk), and the page's memory holds every byte read.
        let within = PathBuf::from(within);
        let skipped = within.iter().any(|c| crate::data::dataset::is_junk(&c.to_string_lossy()))
            || !crate::data::dataset::has_image_extension(&within);
        let bytes = match skipped {
            true => Vec::new(),
            false => match wasm_bindgen_futures::JsFuture::from(file.array_buffer()).await {
                Ok(buffer) => js_sys::Uint8Array::new(&buffer).to_vec(),
                Err(_) => Vec::new(),
            },
        };
        files.push((within, std::sync::Arc::from(bytes)));
    }
    if files.is_empty() {
        return Err("the picked folder has no files".into());
    }
    Ok((if root.is_empty() { "picked folder".into() } else { root }, files))
}
