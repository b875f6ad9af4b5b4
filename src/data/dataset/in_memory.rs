//! A dataset from a folder's files handed over in memory: what a browser page gets when the user
//! picks a folder (`<input webkitdirectory>`: each file's bytes and its path relative to the
//! picked folder), where there is no file system to scan. The layout and rules are the folder
//! scan's ([`super::folder`]): `<class>/**/<image>` or `train/<class>/...` with `val/` (or
//! `valid/`, `validation/`, `test/`), junk and other extensions ignored and reported, images
//! beside the class folders reported as stray, a class with no image refused (or skipped with
//! `allow_empty_classes`), classes in code-point order, files sorted by path. What a file list
//! cannot show: empty folders (a browser lists files only, so a class folder with nothing in it
//! does not exist here, where on disk it is refused), symbolic links and IDX folders (whose
//! files are not images: "no class folders"). In the `train/` layout, junk and other files
//! outside `train/` and the validation folder are listed as ignored (the disk scan never reads
//! them).

use std::collections::{BTreeMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use super::{
    Dataset, IGNORED_JUNK, Sample, SampleSource, ScanOptions, ScanReport, Splits, has_image_extension, ignored_because,
    is_junk, remap_labels, split,
};
use crate::engine::error::{Error, Result};

/// A handed-over file: its path's components, with its bytes when it is an image the scan
/// takes (`None`: ignored, yet it still shows that its class folder exists, as on disk).
type Entry = (Vec<String>, Option<Arc<[u8]>>);

/// The folder names taken as the validation split beside `train/`, in order of preference.
const VAL_FOLDERS: [&str; 4] = ["val", "valid", "validation", "test"];

/// The dataset of the folder `root` (its name, for messages) from its files: `(path relative to
/// root, bytes)`, e.g. `cats/001.jpg` or `train/cats/001.jpg`. Splits as [`super::open`] splits
/// a folder: `train/` with a validation folder as given, else `val_fraction` of each class held
/// out with `seed`. Nothing is decoded here; a file that does not decode is skipped by the
/// loader with its reason, as a file on disk is.
///
/// # Errors
/// [`Error::Dataset`] naming the folder (or the class folder): a path that leaves the folder
/// (absolute, `..`), no class folders (with the count of images directly in it), class folders
/// with no images (unless `allow_empty_classes`), validation classes missing from `train/`.
pub fn from_files(root: &str, files: Vec<(PathBuf, Arc<[u8]>)>, opts: &ScanOptions) -> Result<Splits> {
    let root_path = PathBuf::from(root);
    let mut report = ScanReport::default();
    let mut kept: Vec<Entry> = Vec::with_capacity(files.len());
    let mut junk_reported = HashSet::new();
    for (path, bytes) in files {
        let parts = components(&path).ok_or_else(|| Error::Dataset {
            path: root_path.join(&path),
            message: "the path leaves the dataset folder (absolute or `..`); hand over paths relative to it".into(),
        })?;
        // A junk folder is ignored (and reported) once, as the folder scan skips it whole.
        let junk = parts.iter().position(|p| is_junk(p));
        if let Some(i) = junk {
            let ignored = parts[..=i].iter().fold(root_path.clone(), |d, p| d.join(p));
            if junk_reported.insert(ignored.clone()) {
                report.ignored.push((ignored, IGNORED_JUNK));
            }
        } else if !has_image_extension(&path) {
            report.ignored.push((root_path.join(&path), ignored_because(&path)));
        }
        let taken = junk.is_none() && has_image_extension(&path);
        kept.push((parts, taken.then_some(bytes)));
    }
    // A folder exists, as on disk, when any file lies below it (junk and other files included).
    let folder_exists = |name: &str| kept.iter().any(|(parts, _)| parts.len() >= 2 && parts[0] == name);
    let has_train = folder_exists("train");
    if !has_train {
        let all = scan(&root_path, &[], &kept, opts, &mut report)?;
        let (train, val) = split(all, opts);
        let description = format!("{root} (images handed over; {})", super::held_out_note(&train, &val, opts));
        return Ok(Splits { train, val, description, report, root: root_path, held_out: true, labels_csv: None });
    }
    let train = scan(&root_path, &["train"], &kept, opts, &mut report)?;
    let val_folder = VAL_FOLDERS.into_iter().find(|v| folder_exists(v));
    let Some(val_folder) = val_folder else {
        let (train, val) = split(train, opts);
        let description = format!("{root} (train/, {})", super::held_out_note(&train, &val, opts));
        return Ok(Splits { train, val, description, report, root: root_path, held_out: true, labels_csv: None });
    };
    let mut val = scan(&root_path, &[val_folder], &kept, opts, &mut report)?;
    remap_labels(&mut val, &train.class_names, &root_path.join(val_folder))?;
    let description = format!("{root} (train/ and {val_folder}/)");
    Ok(Splits { train, val, description, report, root: root_path, held_out: false, labels_csv: None })
}

/// The path's normal components, or `None` when it is absolute or climbs out (`..`).
fn components(path: &Path) -> Option<Vec<String>> {
    path.components()
        .filter(|c| !matches!(c, Component::CurDir))
        .map(|c| match c {
            Component::Normal(name) => Some(name.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect()
}

/// An image of a class: its path for messages and its bytes.
type Image<'a> = (PathBuf, &'a Arc<[u8]>);

/// The classes under `prefix` (e.g. `["train"]`, or `[]` for the root): a class is the first
/// folder below it, its images every file below that folder; images directly under `prefix` are
/// stray. Labels in class-name (code-point) order, samples sorted by path.
fn scan(root: &Path, prefix: &[&str], files: &[Entry], opts: &ScanOptions, report: &mut ScanReport) -> Result<Dataset> {
    let dir = prefix.iter().fold(root.to_path_buf(), |d, p| d.join(p));
    // Class name -> (path, bytes) of its images.
    let mut classes: BTreeMap<&str, Vec<Image>> = BTreeMap::new();
    let mut stray = 0;
    let prefix: Vec<String> = prefix.iter().map(|p| p.to_string()).collect();
    for (parts, bytes) in files {
        let Some(rest) = parts.strip_prefix(prefix.as_slice()) else { continue };
        match (rest, bytes) {
            ([file], Some(_)) => {
                stray += 1;
                report.stray_root_images.push(dir.join(file));
            }
            ([class, _, ..], bytes) if !is_junk(class) => {
                let images = classes.entry(class.as_str()).or_default();
                if let Some(bytes) = bytes {
                    images.push((rest.iter().fold(dir.clone(), |d, p| d.join(p)), bytes));
                }
            }
            _ => {}
        }
    }
    report.stray_root_images.sort();
    if classes.is_empty() {
        let found = if stray > 0 {
            format!("{stray} images directly in it and no class folders")
        } else {
            "no class folders".into()
        };
        return Err(Error::Dataset {
            path: dir.clone(),
            message: format!(
                "{found}; expected one folder per class: {}/<class_name>/<image files> (e.g. cats/001.jpg, dogs/002.jpg)",
                dir.display()
            ),
        });
    }
    let empty: Vec<String> =
        classes.iter().filter(|(_, images)| images.is_empty()).map(|(c, _)| c.to_string()).collect();
    if !empty.is_empty() && !opts.allow_empty_classes {
        let message = format!(
            "class folders with no images: {}; add images, delete the folders, or pass --allow-empty-classes to skip them",
            super::describe_empty_classes(&dir, &empty, report)
        );
        return Err(Error::Dataset { path: dir, message });
    }
    report.empty_classes.extend(empty);
    let mut dataset = Dataset::default();
    for (name, mut images) in classes.into_iter().filter(|(_, images)| !images.is_empty()) {
        images.sort_by(|a, b| a.0.cmp(&b.0));
        let label = dataset.class_names.len();
        dataset.class_names.push(name.to_string());
        dataset.samples.extend(
            images
                .into_iter()
                .map(|(path, bytes)| Sample { source: SampleSource::Encoded { path, bytes: bytes.clone() }, label }),
        );
    }
    if dataset.class_names.is_empty() {
        return Err(Error::Dataset { path: dir, message: "no images found in any class folder".into() });
    }
    Ok(dataset)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPTS: ScanOptions =
        ScanOptions { val_fraction: 0.25, seed: 7, allow_empty_classes: false, csv_paths_outside: false };

    fn files(paths: &[&str]) -> Vec<(PathBuf, Arc<[u8]>)> {
        paths.iter().map(|p| (PathBuf::from(p), Arc::from(p.as_bytes()))).collect()
    }

    /// The same files in a temporary folder, each holding its own path as bytes.
    fn on_disk(layout: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for p in layout {
            let path = dir.path().join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, p.as_bytes()).unwrap();
        }
        dir
    }

    /// (class name, path relative to the dataset root) of each sample, in order.
    fn listed(d: &Dataset, root: &Path) -> Vec<(String, String)> {
        d.samples
            .iter()
            .map(|s| {
                let path = match &s.source {
                    SampleSource::File(p) | SampleSource::Encoded { path: p, .. } => p.clone(),
                    SampleSource::Idx { .. } => panic!("not a file"),
                };
                (d.class_names[s.label].clone(), path.strip_prefix(root).unwrap().display().to_string())
            })
            .collect()
    }

    /// The same files on disk and handed over in memory give the same classes, samples, split,
    /// ignored files and stray images, for both layouts (class folders; train/ + val/).
    #[test]
    fn files_in_memory_scan_as_the_same_folder_on_disk() {
        let layouts: [&[&str]; 4] = [
            &[
                "dogs/b.png",
                "dogs/a.JPG",
                "cats/1.png",
                "cats/deep/2.png",
                "cats/3.png",
                "cats/.DS_Store",
                "cats/notes.txt",
                "stray.png",
                "__MACOSX/cats/._1.png",
                "birds/x.webp",
                "birds/y.gif",
            ],
            &["train/cats/1.png", "train/cats/2.png", "train/dogs/1.png", "train/dogs/2.png", "val/dogs/9.png"],
            // Without train/, folders named like validation folders are classes, nested or not.
            &["test/a/1.png", "test/2.png", "val/3.png", "val/4.png", "cats/1.png", "cats/2.png"],
            // train/ exists whatever it holds directly; test/ is taken when there is no val/.
            &["train/x/1.png", "train/x/2.png", "train/y/1.png", "train/.DS_Store", "test/y/7.png"],
        ];
        for layout in layouts {
            let dir = on_disk(layout);
            let disk = super::super::open(dir.path(), &OPTS).unwrap();
            let memory = from_files("picked", files(layout), &OPTS).unwrap();
            let root = Path::new("picked");
            assert_eq!(memory.train.class_names, disk.train.class_names);
            assert_eq!(listed(&memory.train, root), listed(&disk.train, dir.path()), "{layout:?}");
            assert_eq!(listed(&memory.val, root), listed(&disk.val, dir.path()), "{layout:?}");
            let relative = |v: &[PathBuf], r: &Path| -> Vec<String> {
                let mut v: Vec<String> = v.iter().map(|p| p.strip_prefix(r).unwrap().display().to_string()).collect();
                v.sort();
                v
            };
            let ignored = |r: &ScanReport| r.ignored.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>();
            assert_eq!(relative(&ignored(&memory.report), root), relative(&ignored(&disk.report), dir.path()));
            assert_eq!(
                relative(&memory.report.stray_root_images, root),
                relative(&disk.report.stray_root_images, dir.path())
            );
        }
    }

    /// Layouts the disk scan refuses are refused in memory too: a validation folder holding only
    /// junk, images directly in train/.
    #[test]
    fn files_in_memory_are_refused_where_the_same_folder_is() {
        let layouts: [&[&str]; 2] = [
            &["train/cats/1.png", "train/dogs/1.png", "val/.DS_Store", "val/notes.txt"],
            &["train/1.png", "train/2.png", "cats/1.png"],
        ];
        for layout in layouts {
            let dir = on_disk(layout);
            let disk = super::super::open(dir.path(), &OPTS).map(|_| ()).unwrap_err().to_string();
            let memory = from_files("picked", files(layout), &OPTS).map(|_| ()).unwrap_err().to_string();
            let tail = |e: &str| e.split(": ").skip(1).collect::<Vec<_>>().join(": ");
            assert_eq!(
                tail(&memory).replace("picked", "ROOT"),
                tail(&disk).replace(&dir.path().display().to_string(), "ROOT"),
                "{layout:?}"
            );
        }
    }

    #[test]
    fn the_bytes_handed_over_are_the_samples_bytes() {
        let splits =
            from_files("d", files(&["a/1.png", "b/1.png"]), &ScanOptions { val_fraction: 0.0, ..OPTS }).unwrap();
        let SampleSource::Encoded { path, bytes } = &splits.train.samples[1].source else { panic!() };
        assert_eq!((path.as_path(), &bytes[..]), (Path::new("d/b/1.png"), &b"b/1.png"[..]));
    }

    #[test]
    fn bad_layouts_are_refused_naming_the_folder_and_the_fix() {
        let err =
            |paths: &[&str], opts: &ScanOptions| from_files("picked", files(paths), opts).unwrap_err().to_string();
        let e = err(&["a.png", "b.png"], &OPTS);
        assert!(e.contains("picked") && e.contains("2 images directly in it and no class folders"), "{e}");
        let e = err(&["cats/1.png", "dogs/notes.txt", "dogs/.DS_Store"], &OPTS);
        assert!(e.contains("class folders with no images: dogs") && e.contains("--allow-empty-classes"), "{e}");
        let allowed = ScanOptions { allow_empty_classes: true, ..OPTS };
        let ok = from_files("picked", files(&["cats/1.png", "cats/2.png", "dogs/notes.txt"]), &allowed).unwrap();
        assert_eq!(
            (ok.train.class_names.clone(), ok.report.empty_classes.clone()),
            (vec!["cats".to_string()], vec!["dogs".to_string()])
        );
        let e = err(&["cats/1.png", "../outside/2.png"], &OPTS);
        assert!(e.contains("leaves the dataset folder"), "{e}");
        let e = err(&["train/cats/1.png", "train/cats/2.png", "val/dogs/1.png"], &OPTS);
        assert!(e.contains("class not present in train/"), "{e}");
    }
}
