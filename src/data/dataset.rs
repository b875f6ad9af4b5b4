//! Datasets: ImageFolder trees and IDX files, scanned into lists of samples (nothing decoded).
//!
//! Folder layout: `root/<class>/**/<image>` or `root/{train,val}/<class>/...` (`test/` is taken
//! when there is no `val/`). Scan rules:
//! - hidden files and folders and OS junk (`.DS_Store`, `._*`, `Thumbs.db`, `desktop.ini`,
//!   `__MACOSX`, `.ipynb_checkpoints`) are ignored and counted;
//! - extensions are matched case-insensitively (`jpg jpeg png bmp webp gif tif tiff`), each file once;
//! - nested folders under a class belong to that class; symlinks are followed, loops skipped;
//! - class names are the folder names, byte-exact UTF-8, in code-point order;
//! - a class with no image is an error naming it (or a warning with `allow_empty_classes`).
//!
//! An IDX folder holds `train-*` and optionally `t10k-*` image/label pairs (see [`crate::data::idx`]).
//! A labels CSV file (`path,label[,split]`, paths relative to the file) is the third form
//! (`labels_csv`). A folder's files handed over in memory (a browser page's folder pick) follow the same
//! layout and rules ([`from_files`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rand::SeedableRng;
use rand::seq::SliceRandom;

use crate::data::idx::{self, IdxImages};
use crate::engine::error::{Error, Result};

mod folder;
mod formats;
mod in_memory;
mod labels_csv;
use folder::scan_folder_inner;
pub use folder::{image_files, scan_folder};
pub use formats::{
    IGNORED_EXTENSION, IMAGE_EXTENSIONS, describe_empty_classes, has_image_extension, ignored_because,
    is_unsupported_format,
};
pub use in_memory::from_files;
pub use labels_csv::is_labels_csv;

/// The file vramfit writes into every run folder it creates, so no scan takes a run folder for
/// data (its `checkpoints/` and `export/` would look like class folders with no images).
pub const RUN_MARKER: &str = ".vramfit-run";

/// Whether `dir` is a vramfit run folder: it holds [`RUN_MARKER`], or the manifest (`run.json`)
/// or lock file (`.vramfit.lock`) that run folders made before the marker hold.
pub fn is_run_folder(dir: &Path) -> bool {
    [RUN_MARKER, "run.json", ".vramfit.lock"].iter().any(|f| dir.join(f).is_file())
}

/// Whether `dir` is a run folder, or a folder of run folders and nothing else (`runs/`).
pub(super) fn holds_only_runs(dir: &Path) -> bool {
    if is_run_folder(dir) {
        return true;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    let mut any = false;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if is_junk(&name.to_string_lossy()) {
            continue;
        }
        if !is_run_folder(&entry.path()) {
            return false;
        }
        any = true;
    }
    any
}

/// Fashion-MNIST's class names, label order.
pub const FASHION_MNIST_CLASSES: [&str; 10] =
    ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"];

/// Where one sample's pixels come from.
#[derive(Clone, Debug, PartialEq)]
pub enum SampleSource {
    /// An encoded image file.
    File(PathBuf),
    /// An encoded image file's bytes, held in memory (a file a browser handed over: a page
    /// has no paths to read), with the file's path for messages.
    Encoded {
        /// The file's path within its dataset (messages name it).
        path: PathBuf,
        /// The file's bytes, shared.
        bytes: Arc<[u8]>,
    },
    /// Image `index` of an IDX file.
    Idx {
        /// The shared images.
        images: Arc<IdxImages>,
        /// Which image.
        index: usize,
    },
}

impl SampleSource {
    /// A name for messages: the path, or `idx#N`.
    pub fn describe(&self) -> String {
        match self {
            SampleSource::File(p) | SampleSource::Encoded { path: p, .. } => p.display().to_string(),
            SampleSource::Idx { index, .. } => format!("idx image #{index}"),
        }
    }
}

/// One labelled sample.
#[derive(Clone, Debug)]
pub struct Sample {
    /// The pixels' source.
    pub source: SampleSource,
    /// Class index into [`Dataset::class_names`].
    pub label: usize,
}

/// A list of samples and the class names.
#[derive(Clone, Debug, Default)]
pub struct Dataset {
    /// Class names, index = label.
    pub class_names: Vec<String>,
    /// The samples.
    pub samples: Vec<Sample>,
}

impl Dataset {
    /// Number of samples per class, index = label.
    pub fn class_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.class_names.len()];
        for s in &self.samples {
            counts[s.label] += 1;
        }
        counts
    }

    /// A class-balanced subset of at most `n` samples, first ones of each class in order.
    pub fn balanced_subset(&self, n: usize) -> Dataset {
        let per_class = n.div_ceil(self.class_names.len().max(1));
        let mut taken = vec![0; self.class_names.len()];
        let samples = self
            .samples
            .iter()
            .filter(|s| {
                taken[s.label] += 1;
                taken[s.label] <= per_class
            })
            .take(n)
            .cloned()
            .collect();
        Dataset { class_names: self.class_names.clone(), samples }
    }
}

/// What a scan found besides the samples.
#[derive(Clone, Debug, Default)]
pub struct ScanReport {
    /// Hidden files, OS junk and files with other extensions that were ignored, each with the
    /// reason ([`IGNORED_JUNK`] or [`IGNORED_EXTENSION`]).
    pub ignored: Vec<(PathBuf, &'static str)>,
    /// Class folders without images that were skipped (only with `allow_empty_classes`).
    pub empty_classes: Vec<String>,
    /// Symlinked folders not followed: they lead back into the walk, to an ancestor of the
    /// dataset, or into another class (whose images would be counted under this one).
    pub symlink_loops: Vec<PathBuf>,
    /// Images directly in the dataset root next to class folders: in no class, so not used.
    pub stray_root_images: Vec<PathBuf>,
    /// vramfit run folders (or folders of them) inside the dataset: output, not data, skipped.
    pub run_folders: Vec<PathBuf>,
}

impl ScanReport {
    /// One warning line per finding that changes what trains: stray root images, run folders
    /// skipped and symlinks not followed (hidden files and other extensions are only counted).
    pub fn warnings(&self) -> Vec<String> {
        let stray = self.stray_root_images.iter().map(|p| {
            format!(
                "{} is directly in the dataset root, in no class folder: not used (move it into a class)",
                p.display()
            )
        });
        let runs = self
            .run_folders
            .iter()
            .map(|p| format!("{} is a vramfit run folder (output, not data): skipped by the scan", p.display()));
        let loops = self.symlink_loops.iter().map(|p| {
            format!(
                "{} is a symbolic link back into the dataset (an ancestor or another class): not followed",
                p.display()
            )
        });
        stray.chain(runs).chain(loops).collect()
    }
}

/// Why a scan ignored a hidden or OS-junk entry.
pub const IGNORED_JUNK: &str = "hidden file or OS junk (.DS_Store, Thumbs.db, desktop.ini, __MACOSX, ._*)";
/// Why a scan ignored a symbolic link whose target does not exist.
pub const IGNORED_DANGLING: &str = "dangling symbolic link (its target does not exist)";
/// Training and validation data with where they came from.
#[derive(Clone, Debug)]
pub struct Splits {
    /// Training samples.
    pub train: Dataset,
    /// Validation (or test) samples.
    pub val: Dataset,
    /// One line saying where the data came from and how it was split.
    pub description: String,
    /// Scan findings (folders only).
    pub report: ScanReport,
    /// The dataset folder.
    pub root: PathBuf,
    /// Whether validation was held out of the training files (a seeded [`split`] by
    /// `data.val_fraction`) rather than given by the dataset (a `val/` folder, IDX t10k files).
    pub held_out: bool,
    /// The labels CSV file the dataset was read from (`root` is its folder); `None` for folders.
    pub labels_csv: Option<PathBuf>,
}

impl Splits {
    /// What names this dataset for a later run: the labels CSV file, else the folder.
    pub fn source(&self) -> &Path {
        self.labels_csv.as_deref().unwrap_or(&self.root)
    }

    /// Checks that the data can train a classifier, before anything runs; returns warnings.
    ///
    /// Refused: fewer than 2 classes (a single class trains to a meaningless 100%), and any class
    /// with no image that `decodes` accepts (every file empty, truncated or not an image: its
    /// batches would all be skipped). `decodes` is tried in order, train then validation files,
    /// and stops at a class's first success, so a healthy dataset costs one decode per class.
    /// Warned: an empty validation split (no validation metrics: they show as n/a) and classes
    /// with no validation image.
    ///
    /// # Errors
    /// [`Error::Dataset`] naming the folder, the classes at fault and their counts.
    pub fn check_trainable(&self, decodes: impl Fn(&SampleSource) -> bool) -> Result<Vec<String>> {
        match self.refusal(decodes) {
            Some(e) => Err(e),
            None => Ok(self.validation_warnings()),
        }
    }

    /// Why this data cannot train a classifier (the refusals of [`Self::check_trainable`]), or
    /// `None`.
    pub fn refusal(&self, decodes: impl Fn(&SampleSource) -> bool) -> Option<Error> {
        let names = &self.train.class_names;
        if names.len() < 2 {
            return Some(Error::Dataset {
                path: self.root.clone(),
                message: format!(
                    "{} class ({names:?}): a classifier needs at least 2 class folders (root/<class>/*.jpg)",
                    names.len()
                ),
            });
        }
        let mut bad = Vec::new();
        for (label, name) in names.iter().enumerate() {
            let mut tried = 0;
            let mut of_class = self.train.samples.iter().chain(&self.val.samples).filter(|s| s.label == label);
            // At most 10,000 failures are tried per class: a class that bad is refused anyway.
            let found = of_class.by_ref().take(10_000).any(|s| {
                tried += 1;
                decodes(&s.source)
            });
            if !found {
                bad.push(format!("{name:?}: 0 of {tried} files decode"));
            }
        }
        if !bad.is_empty() {
            return Some(Error::Dataset {
                path: self.root.clone(),
                message: format!(
                    "classes with no decodable image: {}; `vramfit check-data` lists each file and why",
                    bad.join(", ")
                ),
            });
        }
        None
    }

    /// Warnings about the splits: classes without a training image (files deleted since a run
    /// began), an empty validation split (metrics show as n/a), or classes without a validation
    /// image.
    pub fn validation_warnings(&self) -> Vec<String> {
        let names = &self.train.class_names;
        let mut warnings = Vec::new();
        let untrained: Vec<&String> =
            names.iter().zip(self.train.class_counts()).filter(|(_, c)| *c == 0).map(|(n, _)| n).collect();
        if !untrained.is_empty() {
            warnings.push(format!(
                "classes with no training image: {untrained:?}; the network cannot learn them (add images)"
            ));
        }
        let val_counts = self.val.class_counts();
        if self.val.samples.is_empty() {
            let fix = match &self.labels_csv {
                Some(_) => "raise data.val_fraction, or mark some rows `val` in the CSV's split column",
                None => "raise data.val_fraction or add a val/ folder",
            };
            warnings.push(format!(
                "the validation split of {} is empty: validation metrics will show as n/a ({fix})",
                self.source().display()
            ));
        } else {
            let missing: Vec<&String> =
                names.iter().zip(&val_counts).filter(|(_, c)| **c == 0).map(|(n, _)| n).collect();
            if !missing.is_empty() {
                warnings.push(format!(
                    "classes with no validation image: {missing:?}; their validation accuracy cannot be measured"
                ));
            }
        }
        warnings
    }
}

/// Class names for a message, with the word "classes": all of them when few
/// (`classes ["a", "b"]`), else the count and the first three (`10 classes (a, b, c, ...)`).
pub fn class_list(names: &[String]) -> String {
    if names.len() <= 6 {
        format!("classes {names:?}")
    } else {
        format!("{} classes ({}, ...)", names.len(), names[..3].join(", "))
    }
}

/// Scan options.
#[derive(Clone, Copy, Debug)]
pub struct ScanOptions {
    /// Fraction held out for validation when the data has no validation split.
    pub val_fraction: f64,
    /// Seed of that split.
    pub seed: u64,
    /// Skip empty classes with a warning instead of failing.
    pub allow_empty_classes: bool,
    /// A labels CSV may name images outside its folder (`data.csv_paths_outside`).
    pub csv_paths_outside: bool,
}

impl ScanOptions {
    /// The options `config` sets (`data.val_fraction`, `seed`, `data.allow_empty_classes` or
    /// `allow_empty`, `data.csv_paths_outside`).
    pub fn of(config: &crate::config::Config, allow_empty: bool) -> Self {
        Self {
            val_fraction: config.data.val_fraction,
            seed: config.seed,
            allow_empty_classes: allow_empty || config.data.allow_empty_classes,
            csv_paths_outside: config.data.csv_paths_outside,
        }
    }
}

/// Is this directory entry name hidden or OS junk?
pub fn is_junk(name: &str) -> bool {
    name.starts_with('.')
        || name.eq_ignore_ascii_case("thumbs.db")
        || name.eq_ignore_ascii_case("desktop.ini")
        || name == "__MACOSX"
}

/// Opens a dataset folder (ImageFolder or IDX) or labels CSV file (`path,label[,split]`, see
/// `labels_csv`) and splits it.
///
/// # Errors
/// [`Error::Dataset`] naming the folder: missing, no classes, images in the root, empty classes;
/// or the CSV file with each row that cannot be used.
pub fn open(path: &Path, opts: &ScanOptions) -> Result<Splits> {
    open_inner(path, opts, None)
}

/// [`open`] for a report (`check-data`): the problems that make [`open`] refuse a dataset whose
/// folders can still be read (class names that are not UTF-8, class folders with no images) are
/// returned as messages, and those folders left out, so the report can go on to name every other
/// problem.
///
/// # Errors
/// As [`open`] for a folder that cannot be read as a dataset at all.
pub fn survey(path: &Path, opts: &ScanOptions) -> Result<(Splits, Vec<String>)> {
    let mut refusals = Vec::new();
    let splits = open_inner(path, opts, Some(&mut refusals))?;
    Ok((splits, refusals))
}

fn open_inner(path: &Path, opts: &ScanOptions, mut refusals: Option<&mut Vec<String>>) -> Result<Splits> {
    if labels_csv::is_labels_csv(path) {
        return labels_csv::open(path, opts);
    }
    let dir = if path.is_file() { path.parent().unwrap_or(Path::new(".")).to_path_buf() } else { path.to_path_buf() };
    if !dir.is_dir() {
        return Err(Error::Dataset {
            path: path.into(),
            message: "no such folder; pass --data with an ImageFolder (root/<class>/*.jpg), an IDX folder or a labels \
                      CSV file (path,label rows)"
                .into(),
        });
    }
    if let Some((imgs, labs)) = idx::find_split(&dir, "train") {
        return open_idx(&dir, &imgs, &labs, opts);
    }
    let train_dir = dir.join("train");
    if train_dir.is_dir() {
        let val_dir = ["val", "valid", "validation", "test"].iter().map(|n| dir.join(n)).find(|p| p.is_dir());
        let (train, mut report) = scan_folder_inner(&train_dir, opts, refusals.as_deref_mut())?;
        if let Some(val_dir) = val_dir {
            let (mut val, r2) = scan_folder_inner(&val_dir, opts, refusals)?;
            remap_labels(&mut val, &train.class_names, &val_dir)?;
            report.ignored.extend(r2.ignored);
            let description = format!(
                "{} (train/ and {}/)",
                dir.display(),
                val_dir.file_name().unwrap_or_default().to_string_lossy()
            );
            return Ok(Splits { train, val, description, report, root: dir, held_out: false, labels_csv: None });
        }
        let (train, val) = split(train, opts);
        let description = format!("{} (train/, {})", dir.display(), held_out_note(&train, &val, opts));
        return Ok(Splits { train, val, description, report, root: dir, held_out: true, labels_csv: None });
    }
    let (all, report) = scan_folder_inner(&dir, opts, refusals)?;
    let (train, val) = split(all, opts);
    let description = format!("{} ({})", dir.display(), held_out_note(&train, &val, opts));
    Ok(Splits { train, val, description, report, root: dir, held_out: true, labels_csv: None })
}

fn remap_labels(val: &mut Dataset, train_classes: &[String], val_dir: &Path) -> Result<()> {
    let mut map = Vec::new();
    for name in &val.class_names {
        let idx = train_classes.iter().position(|c| c == name).ok_or_else(|| Error::Dataset {
            path: val_dir.join(name),
            message: "class not present in train/; validation classes must be a subset of training classes".into(),
        })?;
        map.push(idx);
    }
    for s in &mut val.samples {
        s.label = map[s.label];
    }
    val.class_names = train_classes.to_vec();
    Ok(())
}

/// The split as it came out, in words: the real count held out (a class of 2 or more gives at
/// least one, so a small dataset holds out more than `data.val_fraction`), the fraction and seed.
pub(super) fn held_out_note(train: &Dataset, val: &Dataset, opts: &ScanOptions) -> String {
    let (n_val, total) = (val.samples.len(), val.samples.len() + train.samples.len());
    format!(
        "{n_val} of {total} images held out for validation: data.val_fraction {:.0}%, at least 1 per class, seed {}",
        opts.val_fraction * 100.0,
        opts.seed
    )
}

/// Seeded stratified split: `val_fraction` of each class goes to validation.
fn split(all: Dataset, opts: &ScanOptions) -> (Dataset, Dataset) {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(opts.seed);
    let mut train = Dataset { class_names: all.class_names.clone(), samples: vec![] };
    let mut val = train.clone();
    for class in 0..all.class_names.len() {
        let mut of_class: Vec<Sample> = all.samples.iter().filter(|s| s.label == class).cloned().collect();
        of_class.shuffle(&mut rng);
        let n_val = if of_class.len() >= 2 {
            ((of_class.len() as f64 * opts.val_fraction).round() as usize).max(usize::from(opts.val_fraction > 0.0))
        } else {
            0
        };
        val.samples.extend(of_class.drain(..n_val));
        train.samples.extend(of_class);
    }
    (train, val)
}

fn open_idx(dir: &Path, imgs: &Path, labs: &Path, opts: &ScanOptions) -> Result<Splits> {
    let (train_imgs, train_labels) = idx::load_pair(imgs, labs)?;
    let class_names = idx_class_names(dir, &train_labels);
    let to_dataset = |images, labels: Vec<u8>| idx_dataset(images, &labels, class_names.clone(), dir);
    let train = to_dataset(train_imgs, train_labels)?;
    if let Some((ti, tl)) = idx::find_split(dir, "t10k") {
        let (test_imgs, test_labels) = idx::load_pair(&ti, &tl)?;
        let val = to_dataset(test_imgs, test_labels)?;
        return Ok(Splits {
            train,
            val,
            description: format!("{} (IDX, train + t10k)", dir.display()),
            report: ScanReport::default(),
            root: dir.to_path_buf(),
            held_out: false,
            labels_csv: None,
        });
    }
    let (train, val) = split(train, opts);
    let description = format!("{} (IDX, {})", dir.display(), held_out_note(&train, &val, opts));
    Ok(Splits {
        train,
        val,
        description,
        report: ScanReport::default(),
        root: dir.to_path_buf(),
        held_out: true,
        labels_csv: None,
    })
}

/// The samples of one IDX image file and its labels, with `class_names` (label `l` is
/// `class_names[l]`).
///
/// # Errors
/// [`Error::Dataset`] naming `dir` when a label has no class name.
pub fn idx_dataset(images: IdxImages, labels: &[u8], class_names: Vec<String>, dir: &Path) -> Result<Dataset> {
    let images = Arc::new(images);
    let samples = labels
        .iter()
        .enumerate()
        .map(|(index, &l)| {
            if (l as usize) < class_names.len() {
                Ok(Sample { source: SampleSource::Idx { images: images.clone(), index }, label: l as usize })
            } else {
                Err(Error::Dataset { path: dir.into(), message: format!("label {l} has no class name in classes.txt") })
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Dataset { class_names, samples })
}

/// Class names of an IDX folder: `classes.txt` (one per line) if present, Fashion-MNIST's when
/// the folder name says fashion, else the label numbers.
fn idx_class_names(dir: &Path, labels: &[u8]) -> Vec<String> {
    if let Ok(text) = std::fs::read_to_string(dir.join("classes.txt")) {
        let names: Vec<String> = text.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect();
        if !names.is_empty() {
            return names;
        }
    }
    if dir.to_string_lossy().to_ascii_lowercase().contains("fashion") {
        return FASHION_MNIST_CLASSES.iter().map(|s| s.to_string()).collect();
    }
    let n = labels.iter().copied().max().map_or(0, |m| m as usize + 1);
    (0..n).map(|i| i.to_string()).collect()
}

/// The bundled Fashion-MNIST subset as [`open`] gives it (train + t10k): read from
/// [`bundled_dataset_dir`] natively; in a browser, which has no files, from copies built into
/// the WebAssembly.
///
/// # Errors
/// As [`open`] natively; [`Error::Idx`] if the built-in bytes do not parse (a broken build).
pub fn open_bundled(opts: &ScanOptions) -> Result<Splits> {
    #[cfg(not(target_arch = "wasm32"))]
    return open(&bundled_dataset_dir(), opts);
    #[cfg(target_arch = "wasm32")]
    {
        let _ = opts; // the subset has its own test split: nothing is held out
        bundled_in_binary::splits()
    }
}

/// The bundled subset's files, built into the WebAssembly (4 files, 1.1 MB compressed).
#[cfg(target_arch = "wasm32")]
mod bundled_in_binary {
    use super::*;

    const TRAIN_IMAGES: &[u8] = include_bytes!("../../assets/fashion-mnist-subset/train-images-idx3-ubyte.gz");
    const TRAIN_LABELS: &[u8] = include_bytes!("../../assets/fashion-mnist-subset/train-labels-idx1-ubyte.gz");
    const TEST_IMAGES: &[u8] = include_bytes!("../../assets/fashion-mnist-subset/t10k-images-idx3-ubyte.gz");
    const TEST_LABELS: &[u8] = include_bytes!("../../assets/fashion-mnist-subset/t10k-labels-idx1-ubyte.gz");

    /// One split from its two built-in files; errors name the file as it is in `assets/`.
    fn split(images: &[u8], labels: &[u8], name: &str, dir: &Path) -> Result<Dataset> {
        let (imgs, labs) = crate::data::idx::parse_pair(
            images.to_vec(),
            labels.to_vec(),
            &dir.join(format!("{name}-images-idx3-ubyte.gz")),
            &dir.join(format!("{name}-labels-idx1-ubyte.gz")),
        )?;
        let classes = FASHION_MNIST_CLASSES.iter().map(|s| s.to_string()).collect();
        idx_dataset(imgs, &labs, classes, dir)
    }

    pub(super) fn splits() -> Result<Splits> {
        let dir = Path::new("assets/fashion-mnist-subset");
        Ok(Splits {
            train: split(TRAIN_IMAGES, TRAIN_LABELS, "train", dir)?,
            val: split(TEST_IMAGES, TEST_LABELS, "t10k", dir)?,
            description: "the bundled Fashion-MNIST subset (IDX, train + t10k, built into the page)".into(),
            report: ScanReport::default(),
            root: dir.to_path_buf(),
            held_out: false,
            labels_csv: None,
        })
    }
}

/// The bundled Fashion-MNIST subset: `$VRAMFIT_ASSETS`, else `assets/` under the current
/// directory, else `assets/` of the source tree this binary was built from.
pub fn bundled_dataset_dir() -> PathBuf {
    let sub = "fashion-mnist-subset";
    if let Ok(dir) = std::env::var("VRAMFIT_ASSETS") {
        return PathBuf::from(dir).join(sub);
    }
    let local = PathBuf::from("assets").join(sub);
    if local.is_dir() {
        return local;
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets").join(sub)
}
