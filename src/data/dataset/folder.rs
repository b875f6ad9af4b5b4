//! The ImageFolder scan: `root/<class>/**/<image>`, with junk, links, stray files and
//! non-UTF-8 names reported rather than guessed at.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::{
    Dataset, IGNORED_DANGLING, IGNORED_JUNK, Sample, SampleSource, ScanOptions, ScanReport, has_image_extension,
    holds_only_runs, ignored_because, is_junk, is_run_folder,
};
use crate::engine::error::{Error, Result};

/// Scans one ImageFolder root: `root/<class>/**/<image>`.
///
/// # Errors
/// [`Error::Dataset`]: unreadable root, images directly in the root, no class folder, empty classes.
pub fn scan_folder(root: &Path, opts: &ScanOptions) -> Result<(Dataset, ScanReport)> {
    scan_folder_inner(root, opts, None)
}

/// [`scan_folder`]; with `refusals`, the refusals that leave a usable dataset are pushed there
/// (and the folders at fault left out) instead of returned as the error.
pub(super) fn scan_folder_inner(
    root: &Path,
    opts: &ScanOptions,
    mut refusals: Option<&mut Vec<String>>,
) -> Result<(Dataset, ScanReport)> {
    let mut refuse = |message: String| match refusals.as_deref_mut() {
        Some(list) => {
            list.push(format!("dataset {}: {message}", root.display()));
            Ok(())
        }
        None => Err(Error::Dataset { path: root.into(), message }),
    };
    let err = |message: String| Error::Dataset { path: root.into(), message };
    let entries = std::fs::read_dir(root).map_err(|e| err(format!("cannot read folder: {e}")))?;
    let mut report = ScanReport::default();
    let RootEntries { class_dirs, root_images, mut not_utf8 } = sort_root_entries(root, entries, &mut report);
    // Class names are the folder names, byte-exact, in the export and every output; names that
    // are not UTF-8 (Latin-1 from an old archive) cannot be shown or stored faithfully, and two
    // of them could display the same: refused, with the fix.
    if !not_utf8.is_empty() {
        not_utf8.sort();
        let shown: Vec<String> = not_utf8.iter().map(|p| format!("{:?}", p.display().to_string())).collect();
        let message = format!(
            "class folder names that are not valid UTF-8 (bad bytes shown as U+FFFD): {}; rename them \
             to UTF-8, e.g. `convmv -f latin1 -t utf8 -r --notest {}`",
            shown.join(", "),
            root.display()
        );
        if class_dirs.is_empty() {
            return Err(err(message)); // nothing else to report on
        }
        refuse(message)?;
    }
    if class_dirs.is_empty() {
        let found = if root_images > 0 {
            format!("{root_images} images directly in it and no class folders")
        } else {
            "no class folders".into()
        };
        return Err(err(format!(
            "{found}; expected one folder per class: {}/<class_name>/<image files> (e.g. cats/001.jpg, dogs/002.jpg)",
            root.display()
        )));
    }
    report.stray_root_images.sort();
    let (dataset, empty) = collect_classes(root, class_dirs, &mut report);
    if !empty.is_empty() {
        if !opts.allow_empty_classes {
            refuse(format!(
                "class folders with no images: {}; add images, delete the folders, or pass --allow-empty-classes to skip them",
                super::describe_empty_classes(root, &empty, &report)
            ))?;
        }
        report.empty_classes = empty;
    }
    if dataset.class_names.is_empty() {
        return Err(err("no images found in any class folder".into()));
    }
    Ok((dataset, report))
}

/// Image files under `dir` by the scan rules (junk ignored, extensions any case, links back into
/// `dir` or its ancestors not followed), sorted, with the files in image formats the decoders
/// do not read (HEIC, AVIF, ...: [`super::is_unsupported_format`]) after them, so that a
/// caller can name each one rather than pass over it.
pub fn image_files(dir: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut files = Vec::new();
    let mut report = ScanReport::default();
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    walk_class(dir, (&canonical, &canonical), &mut files, &mut HashSet::new(), &mut report);
    files.sort();
    let mut unsupported: Vec<PathBuf> =
        report.ignored.into_iter().filter(|(_, why)| super::is_unsupported_format(why)).map(|(p, _)| p).collect();
    unsupported.sort();
    (files, unsupported)
}

/// Whether a directory entry is a symbolic link whose target does not exist.
fn is_dangling(entry: &std::fs::DirEntry) -> bool {
    entry.file_type().is_ok_and(|t| t.is_symlink()) && std::fs::metadata(entry.path()).is_err()
}

/// Collects the image files of one class folder. `(root, class)` are the canonical dataset root
/// and class folder: a folder reached through a link that resolves to the root, one of its
/// ancestors, or a place in the dataset outside this class is not followed (reported in
/// `symlink_loops`), so no image is ever counted under another class. Links out of the dataset
/// (to a folder elsewhere) are followed.
fn walk_class(
    dir: &Path,
    (root, class): (&Path, &Path),
    files: &mut Vec<PathBuf>,
    visited: &mut HashSet<PathBuf>,
    report: &mut ScanReport,
) {
    let Ok(canonical) = dir.canonicalize() else { return };
    let into_dataset_elsewhere =
        !canonical.starts_with(class) && (root.starts_with(&canonical) || canonical.starts_with(root));
    if into_dataset_elsewhere || !visited.insert(canonical) {
        report.symlink_loops.push(dir.into());
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let path = entry.path();
        if is_junk(&name) {
            report.ignored.push((path, IGNORED_JUNK));
        } else if path.is_dir() && is_run_folder(&path) {
            report.run_folders.push(path);
        } else if path.is_dir() {
            walk_class(&path, (root, class), files, visited, report);
        } else if path.is_file() && has_image_extension(&path) {
            files.push(path);
        } else if is_dangling(&entry) {
            report.ignored.push((path, IGNORED_DANGLING));
        } else {
            report.ignored.push((path.clone(), ignored_because(&path)));
        }
    }
}

/// What the root of an ImageFolder holds: class folders (name, path), sorted by name; the count
/// of images directly in it; folders whose names are not UTF-8. Junk, links back into the
/// dataset, stray images and other files go into the report.
struct RootEntries {
    class_dirs: Vec<(String, PathBuf)>,
    root_images: usize,
    not_utf8: Vec<PathBuf>,
}

fn sort_root_entries(root: &Path, entries: std::fs::ReadDir, report: &mut ScanReport) -> RootEntries {
    let mut found = RootEntries { class_dirs: Vec::new(), root_images: 0, not_utf8: Vec::new() };
    let root_canonical = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let path = entry.path();
        // A class folder that is a link into the dataset (to the root, an ancestor or another
        // class) would count images twice or under another label: reported, not followed.
        let link_inside = entry.file_type().is_ok_and(|t| t.is_symlink())
            && path.canonicalize().is_ok_and(|t| t.starts_with(&root_canonical) || root_canonical.starts_with(&t));
        if is_junk(&name) {
            report.ignored.push((path, IGNORED_JUNK));
        } else if link_inside && path.is_dir() {
            report.symlink_loops.push(path);
        } else if path.is_dir() && holds_only_runs(&path) {
            report.run_folders.push(path);
        } else if path.is_dir() && entry.file_name().to_str().is_none() {
            found.not_utf8.push(path);
        } else if path.is_dir() {
            found.class_dirs.push((name, path));
        } else if has_image_extension(&path) {
            found.root_images += 1;
            report.stray_root_images.push(path);
        } else if is_dangling(&entry) {
            report.ignored.push((path, IGNORED_DANGLING));
        } else {
            report.ignored.push((path.clone(), ignored_because(&path)));
        }
    }
    found.class_dirs.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// The images of each class folder (labels in folder order) and the names of the folders that
/// hold none.
fn collect_classes(root: &Path, class_dirs: Vec<(String, PathBuf)>, report: &mut ScanReport) -> (Dataset, Vec<String>) {
    let root_canonical = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let mut dataset = Dataset::default();
    let mut empty = Vec::new();
    for (name, path) in class_dirs {
        let mut files = Vec::new();
        let mut visited = HashSet::new();
        let class_canonical = path.canonicalize().unwrap_or_else(|_| path.clone());
        let bounds = (root_canonical.as_path(), class_canonical.as_path());
        walk_class(&path, bounds, &mut files, &mut visited, report);
        files.sort();
        if files.is_empty() {
            empty.push(name);
            continue;
        }
        let label = dataset.class_names.len();
        dataset.class_names.push(name);
        dataset.samples.extend(files.into_iter().map(|p| Sample { source: SampleSource::File(p), label }));
    }
    (dataset, empty)
}
