//! What a run was trained on: the dataset's file list and the split, recorded in the run folder
//! when the run begins, and applied again when it resumes.
//!
//! A resume scans the dataset anew. Without the record a file added since would reshuffle the
//! seeded split, and validation images could move into training. With it, every recorded file
//! keeps its split; a file added since goes to the split its folder names (a `train/` + `val/`
//! layout) or, when validation was held out of the training files, to validation when the
//! stable hash of its relative path falls under `data.val_fraction` ([`held_out_by_hash`]); a
//! file deleted since is left out and counted; a changed file (size or modification time)
//! keeps its split and is named.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::data::dataset::{Dataset, Sample, SampleSource, Splits};

/// Which split a file belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Training.
    Train,
    /// Validation.
    Val,
}

/// One recorded file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Relative to the dataset folder, `/`-separated.
    pub path: String,
    /// Its class name.
    pub class: String,
    /// Its split.
    pub split: Split,
    /// Its size in bytes when recorded.
    pub bytes: u64,
    /// Its modification time when recorded, seconds since 1970 (`None` where the file system
    /// does not say).
    #[serde(default)]
    pub modified: Option<u64>,
}

/// The record of a run's data (the run folder's `data_files.json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SplitRecord {
    /// The record's format (1).
    #[serde(default = "format_version")]
    pub format: u32,
    /// Whether validation was held out of the training files (new files then split by
    /// [`held_out_by_hash`]); `false` when the dataset gives its own validation folder.
    pub held_out: bool,
    /// The dataset's image files, training first.
    pub files: Vec<FileEntry>,
    /// Samples that are not files (images of an IDX file): not listed; their split follows the
    /// seed, which a resume keeps.
    #[serde(default)]
    pub other_samples: usize,
}

fn format_version() -> u32 {
    1
}

/// What changed in the dataset since its record, as a resume applies it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SplitChanges {
    /// Files added since.
    pub added: usize,
    /// How many of the added files went to validation.
    pub added_to_val: usize,
    /// Recorded files that are gone (relative paths).
    pub deleted: Vec<String>,
    /// Recorded files whose size or modification time differ (relative paths).
    pub changed: Vec<String>,
}

impl SplitChanges {
    /// Whether anything changed.
    pub fn any(&self) -> bool {
        self.added + self.deleted.len() + self.changed.len() > 0
    }

    /// One line for the user, naming up to three files of each kind.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.added > 0 {
            parts.push(format!(
                "{} added ({} to training, {} to validation; no recorded file changed its split)",
                self.added,
                self.added - self.added_to_val,
                self.added_to_val
            ));
        }
        for (list, what) in [(&self.deleted, "deleted (left out)"), (&self.changed, "changed (kept in their split)")] {
            if !list.is_empty() {
                parts.push(format!("{} {what}: {}", list.len(), name_some(list)));
            }
        }
        format!("the dataset changed since the run began: {}", parts.join("; "))
    }
}

/// Up to three names, then how many more.
fn name_some(names: &[String]) -> String {
    let shown = names.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
    match names.len() {
        n if n > 3 => format!("{shown} and {} more", n - 3),
        _ => shown,
    }
}

impl SplitRecord {
    /// The record of `splits` (sizes and times read from the files; a file that cannot be read
    /// is recorded with size 0 and no time, so a resume reports it as changed if it reappears).
    pub fn of(splits: &Splits) -> SplitRecord {
        let mut record = SplitRecord { format: format_version(), held_out: splits.held_out, ..SplitRecord::default() };
        for (dataset, split) in [(&splits.train, Split::Train), (&splits.val, Split::Val)] {
            for sample in &dataset.samples {
                match file_of(sample, &splits.root) {
                    Some((path, full)) => {
                        let (bytes, modified) = size_and_time(full);
                        let class = dataset.class_names.get(sample.label).cloned().unwrap_or_default();
                        record.files.push(FileEntry { path, class, split, bytes, modified });
                    }
                    None => record.other_samples += 1,
                }
            }
        }
        record
    }

    /// `splits` (a fresh scan of the run's dataset) put back into the recorded split, with what
    /// changed since: recorded files keep their split, added files go where the module's rule
    /// sends them (`val_fraction`: `data.val_fraction`), deleted files are left out. Samples
    /// that are not files keep the split the scan gave them.
    pub fn apply(&self, splits: &Splits, val_fraction: f64) -> (Splits, SplitChanges) {
        let recorded: HashMap<&str, &FileEntry> = self.files.iter().map(|f| (f.path.as_str(), f)).collect();
        let mut seen = std::collections::HashSet::new();
        let mut changes = SplitChanges::default();
        let mut out = splits.clone();
        out.train.samples.clear();
        out.val.samples.clear();
        for (dataset, scanned) in [(&splits.train, Split::Train), (&splits.val, Split::Val)] {
            for sample in &dataset.samples {
                let split = match file_of(sample, &splits.root) {
                    None => scanned,
                    Some((path, full)) => match recorded.get(path.as_str()) {
                        Some(entry) => {
                            seen.insert(entry.path.as_str());
                            if size_and_time(full) != (entry.bytes, entry.modified) {
                                changes.changed.push(path);
                            }
                            entry.split
                        }
                        None => {
                            let split = if self.held_out { held_out_by_hash(&path, val_fraction) } else { scanned };
                            changes.added += 1;
                            changes.added_to_val += usize::from(split == Split::Val);
                            split
                        }
                    },
                };
                push(&mut out, split, sample, &dataset.class_names);
            }
        }
        changes.deleted =
            self.files.iter().filter(|f| !seen.contains(f.path.as_str())).map(|f| f.path.clone()).collect();
        (out, changes)
    }
}

/// Adds `sample` (labelled in `classes`) to `split` of `out`, relabelled to `out`'s class list.
fn push(out: &mut Splits, split: Split, sample: &Sample, classes: &[String]) {
    let target: &mut Dataset = match split {
        Split::Train => &mut out.train,
        Split::Val => &mut out.val,
    };
    let name = &classes[sample.label];
    let label = target.class_names.iter().position(|c| c == name).unwrap_or(sample.label);
    target.samples.push(Sample { source: sample.source.clone(), label });
}

/// The stable rule for a file added to a dataset whose validation is held out: validation when
/// the 64-bit FNV-1a hash of its relative path, as a fraction of 2^64, is under `val_fraction`.
/// FNV-1a (Fowler, Noll, Vo) is fixed by its definition, so the rule gives the same answer in
/// every vramfit version and on every machine; a file's split never depends on other files.
pub fn held_out_by_hash(relative_path: &str, val_fraction: f64) -> Split {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in relative_path.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    if (hash as f64) < val_fraction * u64::MAX as f64 { Split::Val } else { Split::Train }
}

/// A file sample's path relative to `root` (`/`-separated) and its full path; `None` for
/// samples that are not files.
fn file_of<'a>(sample: &'a Sample, root: &Path) -> Option<(String, &'a Path)> {
    let SampleSource::File(full) = &sample.source else { return None };
    let relative = full.strip_prefix(root).unwrap_or(full);
    let parts: Vec<_> = relative.components().map(|c| c.as_os_str().to_string_lossy()).collect();
    Some((parts.join("/"), full))
}

/// A file's size and modification time (seconds since 1970); `(0, None)` when it cannot be read.
fn size_and_time(path: &Path) -> (u64, Option<u64>) {
    match std::fs::metadata(path) {
        Ok(m) => {
            let modified = m.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
            (m.len(), modified.map(|d| d.as_secs()))
        }
        Err(_) => (0, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A held-out dataset of `files` (class/name) under `root`, written as small files, split
    /// by the given validation names.
    fn dataset(root: &Path, files: &[&str], val: &[&str]) -> Splits {
        let classes = vec!["cat".to_string(), "dog".to_string()];
        let mut splits = Splits {
            train: Dataset { class_names: classes.clone(), samples: vec![] },
            val: Dataset { class_names: classes.clone(), samples: vec![] },
            description: String::new(),
            report: Default::default(),
            root: root.to_path_buf(),
            held_out: true,
        };
        for f in files {
            let path = root.join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            if !path.exists() {
                std::fs::write(&path, f.as_bytes()).unwrap();
            }
            let label = classes.iter().position(|c| f.starts_with(c.as_str())).unwrap();
            let sample = Sample { source: SampleSource::File(path), label };
            if val.contains(f) { splits.val.samples.push(sample) } else { splits.train.samples.push(sample) }
        }
        splits
    }

    fn names(d: &Dataset, root: &Path) -> Vec<String> {
        let mut v: Vec<String> = d.samples.iter().map(|s| file_of(s, root).unwrap().0).collect();
        v.sort();
        v
    }

    #[test]
    fn recorded_files_keep_their_split_added_ones_follow_the_hash_and_deleted_ones_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let before = dataset(root, &["cat/a.png", "cat/b.png", "dog/c.png", "dog/d.png"], &["cat/a.png", "dog/d.png"]);
        let record = SplitRecord::of(&before);
        let json = serde_json::to_string(&record).unwrap();
        assert_eq!(serde_json::from_str::<SplitRecord>(&json).unwrap(), record, "the record round-trips");
        // Rescanned after changes: a file added, one deleted, one rewritten, and a reshuffled
        // split (what a seeded split does when the file count changes).
        std::fs::remove_file(root.join("cat/b.png")).unwrap();
        std::fs::write(root.join("dog/c.png"), b"longer than before").unwrap();
        let added: Vec<String> = (0..40).map(|i| format!("cat/new{i}.png")).collect();
        let mut files = vec!["cat/a.png", "dog/c.png", "dog/d.png"];
        files.extend(added.iter().map(String::as_str));
        let rescanned = dataset(root, &files, &["dog/c.png"]);
        let (restored, changes) = record.apply(&rescanned, 0.25);
        let val = names(&restored.val, root);
        assert!(val.contains(&"cat/a.png".to_string()) && val.contains(&"dog/d.png".to_string()), "{val:?}");
        assert!(names(&restored.train, root).contains(&"dog/c.png".to_string()));
        assert_eq!(
            (changes.deleted.clone(), changes.changed.clone()),
            (vec!["cat/b.png".into()], vec!["dog/c.png".into()])
        );
        let to_val: Vec<&String> = added.iter().filter(|p| held_out_by_hash(p, 0.25) == Split::Val).collect();
        assert_eq!((changes.added, changes.added_to_val), (40, to_val.len()));
        assert!((4..=16).contains(&to_val.len()), "about a quarter of 40 go to validation: {}", to_val.len());
        assert_eq!(restored.val.samples.len(), 2 + to_val.len());
        let line = changes.describe();
        assert!(line.contains("40 added") && line.contains("1 deleted (left out): cat/b.png"), "{line}");
    }

    #[test]
    fn a_dataset_with_its_own_validation_folder_sends_added_files_where_the_scan_found_them() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let mut before = dataset(root, &["cat/a.png", "dog/b.png"], &["dog/b.png"]);
        before.held_out = false;
        let record = SplitRecord::of(&before);
        let mut after = dataset(root, &["cat/a.png", "dog/b.png", "cat/z.png"], &["dog/b.png", "cat/z.png"]);
        after.held_out = false;
        let (restored, changes) = record.apply(&after, 0.0);
        assert_eq!(names(&restored.val, root), ["cat/z.png", "dog/b.png"]);
        assert_eq!((changes.added, changes.added_to_val, changes.any()), (1, 1, true));
        let (_, none) = record.apply(&before, 0.0);
        assert!(!none.any(), "an unchanged dataset reports nothing: {none:?}");
    }

    #[test]
    fn the_hash_rule_is_fixed_by_its_definition() {
        // FNV-1a 64 of "" is the offset basis; of "a" the published test vector af63dc4c8601ec8c.
        assert_eq!(held_out_by_hash("a", 0xaf63_dc4c_8601_ec8c_u64 as f64 / u64::MAX as f64 + 1e-9), Split::Val);
        assert_eq!(held_out_by_hash("a", 0xaf63_dc4c_8601_ec8c_u64 as f64 / u64::MAX as f64 - 1e-6), Split::Train);
        assert_eq!(held_out_by_hash("cat/a.png", 0.0), Split::Train);
        assert_eq!(held_out_by_hash("cat/a.png", 1.0), Split::Val);
    }
}
