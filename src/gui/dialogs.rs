//! The native file dialogs the panels open (rfd): the one place the app asks the desktop for a
//! path. A web build has no such dialogs (rfd's are async there and yield file contents, not
//! paths), so there every function returns `None` and the page's own file input and drops are
//! the way in.

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
