//! What a run was trained on: the dataset's file list and the split, recorded in the run folder
//! when the run begins, and applied again when it resumes.
//!
//! A resume scans the dataset anew. Without the record a file added since would reshuffle the
//! seeded split, and validation images could move into training. With it, every recorded file
//! keeps its split; a file added since goes to the split its folder names (a `train/` + `val/`
//! layout) or, when validation was held out of the training files, to validation when the
//! stable hash of its relative path falls under `data.val_fraction` ([`held_out_by_hash`]); a
//! file deleted since is left out and named, and stays in the record as deleted, so a file put
//! back under its old name returns to its old split; an added file with the size and
//! modification time of a deleted one (a rename or a move keeps both) is taken as that file
//! renamed and keeps its split; a changed file (size or modification time) keeps its split and
//! is named. A change of the class list is refused, naming the difference.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::data::dataset::{Dataset, Sample, SampleSource, Splits};

/// Which split a file belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
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
    /// Gone from the dataset at the last resume: kept so that it keeps its split if it returns.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
}

/// The record of a run's data (the run folder's `data_files.json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SplitRecord {
    /// The record's format ([`FORMAT`]).
    #[serde(default = "format_version")]
    pub format: u32,
    /// The class names, label order.
    #[serde(default)]
    pub classes: Vec<String>,
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

/// The record format this vramfit writes and reads.
pub const FORMAT: u32 = 1;

fn format_version() -> u32 {
    FORMAT
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
    /// Deleted files found again under another name (old path, new path), split kept.
    pub renamed: Vec<(String, String)>,
    /// Why samples that are not files (IDX images) may have changed split: their count or the
    /// dataset's own validation split differs from the record.
    pub other_samples: Option<String>,
}

impl SplitChanges {
    /// Whether anything changed.
    pub fn any(&self) -> bool {
        self.added + self.deleted.len() + self.changed.len() + self.renamed.len() > 0 || self.other_samples.is_some()
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
        if !self.renamed.is_empty() {
            let pairs: Vec<String> = self.renamed.iter().map(|(old, new)| format!("{old} -> {new}")).collect();
            parts.push(format!("{} renamed (kept in their split): {}", pairs.len(), name_some(&pairs)));
        }
        parts.extend(self.other_samples.clone());
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
        let mut record = SplitRecord {
            format: FORMAT,
            classes: splits.train.class_names.clone(),
            held_out: splits.held_out,
            ..SplitRecord::default()
        };
        for (dataset, split) in [(&splits.train, Split::Train), (&splits.val, Split::Val)] {
            for sample in &dataset.samples {
                match file_of(sample, &splits.root) {
                    Some((path, full)) => {
                        let (bytes, modified) = size_and_time(full);
                        let class = dataset.class_names.get(sample.label).cloned().unwrap_or_default();
                        record.files.push(FileEntry { path, class, split, bytes, modified, deleted: false });
                    }
                    None => record.other_samples += 1,
                }
            }
        }
        record
    }

    /// `splits` (a fresh scan of the run's dataset) put back into the recorded split, with what
    /// changed since and the record to keep from now on (deleted files kept as such): recorded
    /// files keep their split, added files go where the module's rule sends them
    /// (`val_fraction`: `data.val_fraction`), deleted files are left out. Samples that are not
    /// files keep the split the scan gave them; a change in their count is reported.
    ///
    /// # Errors
    /// A record of a newer format, or a class list that differs from the record's, naming the
    /// classes added and removed.
    pub fn apply(&self, splits: &Splits, val_fraction: f64) -> Result<(Splits, SplitChanges, SplitRecord), String> {
        if self.format > FORMAT {
            return Err(format!(
                "its record of the dataset is format {}, newer than this vramfit's ({FORMAT}): update vramfit",
                self.format
            ));
        }
        self.check_classes(&splits.train.class_names)?;
        let recorded: HashMap<&str, &FileEntry> = self.files.iter().map(|f| (f.path.as_str(), f)).collect();
        let mut seen = std::collections::HashSet::new();
        let mut changes = SplitChanges::default();
        let mut added = Vec::new();
        let mut out = splits.clone();
        out.train.samples.clear();
        out.val.samples.clear();
        for (dataset, scanned) in [(&splits.train, Split::Train), (&splits.val, Split::Val)] {
            for sample in &dataset.samples {
                let Some((path, full)) = file_of(sample, &splits.root) else {
                    push(&mut out, scanned, sample, &dataset.class_names);
                    continue;
                };
                let Some(entry) = recorded.get(path.as_str()) else {
                    added.push((path, size_and_time(full), scanned, sample, &dataset.class_names));
                    continue;
                };
                seen.insert(entry.path.as_str());
                if !entry.deleted && size_and_time(full) != (entry.bytes, entry.modified) {
                    changes.changed.push(path);
                }
                push(&mut out, entry.split, sample, &dataset.class_names);
            }
        }
        // Gone since: the last record's files not seen now; with the files deleted before, the
        // candidates an added file may be a rename of.
        let gone: Vec<&FileEntry> = self.files.iter().filter(|f| !seen.contains(f.path.as_str())).collect();
        let mut renamed_from = std::collections::HashSet::new();
        for (path, size_time, scanned, sample, classes) in added {
            let class = &classes[sample.label];
            let same =
                |f: &&&FileEntry| (f.bytes, f.modified) == size_time && f.modified.is_some() && &f.class == class;
            let split = match gone.iter().find(|f| same(f) && !renamed_from.contains(f.path.as_str())) {
                Some(old) => {
                    renamed_from.insert(old.path.as_str());
                    changes.renamed.push((old.path.clone(), path));
                    old.split
                }
                None => {
                    // Where the dataset now names the split itself (val/ folders, a CSV's split
                    // column) a new file goes where it says; held out, by the stable hash.
                    let split =
                        if self.held_out && splits.held_out { held_out_by_hash(&path, val_fraction) } else { scanned };
                    changes.added += 1;
                    changes.added_to_val += usize::from(split == Split::Val);
                    split
                }
            };
            push(&mut out, split, sample, classes);
        }
        changes.deleted = gone
            .iter()
            .filter(|f| !f.deleted && !renamed_from.contains(f.path.as_str()))
            .map(|f| f.path.clone())
            .collect();
        changes.other_samples = self.other_samples_change(&out);
        let mut next = SplitRecord::of(&out);
        next.held_out = self.held_out;
        let tombstones = gone.iter().filter(|f| !renamed_from.contains(f.path.as_str()));
        next.files.extend(tombstones.map(|f| FileEntry { deleted: true, ..(*f).clone() }));
        Ok((out, changes, next))
    }

    /// Refuses `classes` when they differ from the record's (a record without a class list,
    /// from before it had one, accepts any).
    fn check_classes(&self, classes: &[String]) -> Result<(), String> {
        if self.classes.is_empty() || self.classes == classes {
            return Ok(());
        }
        let missing: Vec<&str> = self.classes.iter().filter(|c| !classes.contains(c)).map(String::as_str).collect();
        let new: Vec<&str> = classes.iter().filter(|c| !self.classes.contains(c)).map(String::as_str).collect();
        let mut diff = Vec::new();
        let quoted = |names: &[&str]| names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
        if !missing.is_empty() {
            diff.push(format!("has no {}", quoted(&missing)));
        }
        if !new.is_empty() {
            diff.push(format!("has {} besides", quoted(&new)));
        }
        if diff.is_empty() {
            diff.push("has them in another order".into());
        }
        let list = |names: &[String]| names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
        Err(format!(
            "the run was trained on the classes {} and this dataset {}: a network's classes are fixed, so \
             use the data the run was trained on (its data.txt names it), or train a new run on this data",
            list(&self.classes),
            diff.join(" and ")
        ))
    }

    /// Why samples that are not files may have moved between splits (their count changed, or
    /// the dataset's own validation files came or went), if so.
    fn other_samples_change(&self, now: &Splits) -> Option<String> {
        let count = |d: &Dataset| d.samples.iter().filter(|s| !matches!(s.source, SampleSource::File(_))).count();
        let others = count(&now.train) + count(&now.val);
        let held_out_changed = others > 0 && self.held_out != now.held_out;
        (others != self.other_samples || held_out_changed).then(|| {
            format!(
                "its IDX images changed ({} recorded, {others} now{}): their split is made anew, so validation \
                 images may be ones the run trained on",
                self.other_samples,
                if held_out_changed { ", and the validation files came or went" } else { "" }
            )
        })
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
            labels_csv: None,
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
        let (restored, changes, next) = record.apply(&rescanned, 0.25).unwrap();
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
        // The deleted file stays in the record; put back, it returns to its split (training),
        // and it is not reported as deleted again.
        assert!(next.files.iter().any(|f| f.path == "cat/b.png" && f.deleted && f.split == Split::Train));
        std::fs::write(root.join("cat/b.png"), b"back").unwrap();
        let mut files_back = files.clone();
        files_back.push("cat/b.png");
        let (back, changes, _) = next.apply(&dataset(root, &files_back, &["cat/b.png"]), 0.25).unwrap();
        assert!(names(&back.train, root).contains(&"cat/b.png".to_string()), "{changes:?}");
        assert!(changes.deleted.is_empty() && changes.added == 0, "{changes:?}");
    }

    #[test]
    fn a_renamed_file_keeps_its_split_and_other_classes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let before = dataset(root, &["cat/a.png", "cat/b.png", "dog/c.png", "dog/d.png"], &["cat/a.png"]);
        let record = SplitRecord::of(&before);
        // A rename keeps size and modification time; the rule alone would decide by the hash.
        std::fs::rename(root.join("cat/a.png"), root.join("cat/zz_renamed.png")).unwrap();
        let after = dataset(root, &["cat/zz_renamed.png", "cat/b.png", "dog/c.png", "dog/d.png"], &[]);
        let (restored, changes, next) = record.apply(&after, 0.0).unwrap();
        assert_eq!(names(&restored.val, root), ["cat/zz_renamed.png"]);
        assert_eq!(changes.renamed, [("cat/a.png".to_string(), "cat/zz_renamed.png".to_string())]);
        assert!(changes.deleted.is_empty() && changes.added == 0 && !next.files.iter().any(|f| f.deleted));
        // Another class list: refused, naming the difference.
        let mut other = after.clone();
        other.train.class_names = vec!["cat".into(), "dog".into(), "fox".into()];
        let e = record.apply(&other, 0.0).unwrap_err();
        assert!(e.contains("the classes `cat`, `dog` and this dataset has `fox` besides"), "{e}");
        let newer = SplitRecord { format: FORMAT + 1, ..record.clone() };
        assert!(newer.apply(&after, 0.0).unwrap_err().contains("newer than this vramfit"));
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
        let (restored, changes, _) = record.apply(&after, 0.0).unwrap();
        assert_eq!(names(&restored.val, root), ["cat/z.png", "dog/b.png"]);
        assert_eq!((changes.added, changes.added_to_val, changes.any()), (1, 1, true));
        let (_, none, _) = record.apply(&before, 0.0).unwrap();
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
