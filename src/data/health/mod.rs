//! Data health: what in a dataset costs accuracy before any training does. Copies of one picture
//! ([`duplicates`]: inside a class, under two labels, or in validation and training at once),
//! class imbalance ([`imbalance`]), and after training the images whose label the model doubts
//! ([`label_issues`]).
//!
//! [`scan`] hashes every image ([`hashes`]; file images through [`hash_cache`], so a second scan
//! of a folder reads its hashes back instead of decoding) and groups the copies. `check-data`
//! prints the whole report, `train` one line of it and the whole into the run folder
//! ([`REPORT_FILE`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::Serialize;

use crate::config::DataConfig;
use crate::data::dataset::{SampleSource, Splits};
use crate::data::image_io::{self, LoadOptions};
use crate::data::split_record::Split;

pub mod duplicates;
pub mod hash_cache;
pub mod hashes;
pub mod imbalance;
pub mod label_issues;

use duplicates::{Duplicates, Member};
use hashes::ImageHashes;
use imbalance::Imbalance;

/// Which findings a run's config already deals with ([`DataHealth::summary_line`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Remedies {
    /// `data.drop_leaked_val`: validation leaves out its copies of training images.
    pub leaked_dropped: bool,
    /// `train.class_weights` or `data.sampler` is `"balanced"`.
    pub balanced: bool,
}

impl Remedies {
    /// The remedies `config` turns on.
    pub fn of(config: &crate::config::Config) -> Self {
        Self {
            leaked_dropped: config.data.drop_leaked_val,
            balanced: config.train.class_weights != crate::config::ClassWeights::None
                || config.data.sampler != crate::config::Sampler::Shuffle,
        }
    }
}

/// The report's file in a run folder.
pub const REPORT_FILE: &str = "data_health.txt";

/// The smallest side images are decoded at for hashing (a large JPEG at a reduced DCT scale, as
/// [`image_io::decode_image_scaled`] does): the perceptual hash averages down to 32 x 32, so 64
/// loses nothing it uses, and the pixel hash then compares the decode at that scale.
const HASH_DECODE_SIDE: u32 = 64;

/// Groups listed per kind in the report (the rest are counted).
const LISTED: usize = 10;

/// Files listed per group in the report (the rest are counted).
const LISTED_FILES: usize = 4;

/// A dataset's health: its copies and its class balance.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DataHealth {
    /// Groups of copies.
    pub duplicates: Duplicates,
    /// The class sizes (training and validation).
    pub imbalance: Imbalance,
    /// Images hashed (training and validation).
    pub images: usize,
    /// Images that did not decode (left out of the search; check-data lists them).
    pub undecodable: usize,
    /// Image files whose hashes came from the cache.
    pub from_cache: usize,
    /// Seconds the scan took.
    pub secs: f64,
}

/// Hashes every image of `splits` (training and validation, on all cores; image files through
/// the hash cache in the folder of `data`'s decoded-image cache) and finds its copies and its
/// imbalance. Never fails: an image that does not decode is counted in
/// [`DataHealth::undecodable`] and left out.
pub fn scan(splits: &Splits, data: &DataConfig) -> DataHealth {
    let started = web_time::Instant::now();
    let load = LoadOptions { max_pixels: data.max_image_pixels, alpha: data.alpha };
    let cache = hash_cache::HashCache::open(crate::data::image_cache::disk_folder(data).as_deref(), &splits.root);
    let samples: Vec<(Split, usize)> = (0..splits.train.samples.len())
        .map(|i| (Split::Train, i))
        .chain((0..splits.val.samples.len()).map(|i| (Split::Val, i)))
        .collect();
    let hashed: Vec<(Member, Option<ImageHashes>, Option<Cached>)> = samples
        .par_iter()
        .map(|&(split, index)| {
            let dataset = if split == Split::Train { &splits.train } else { &splits.val };
            let sample = &dataset.samples[index];
            let path = match &sample.source {
                // IDX images by the split's file: `val idx image #3` is image 3 of the file
                // validation reads (t10k-*, or train-* where validation is held out of it).
                SampleSource::Idx { index, .. } => format!("{} idx image #{index}", split_name(split)),
                source => relative_name(source, &splits.root),
            };
            let member = Member { split, path, class: dataset.class_names[sample.label].clone(), index };
            let (hashes, cached) = hash_source(&sample.source, &load, &cache);
            (member, hashes, cached)
        })
        .collect();
    let from_cache = hashed.iter().filter(|(_, _, c)| matches!(c, Some(Cached { hit: true, .. }))).count();
    if from_cache < hashed.iter().filter(|(_, _, c)| c.is_some()).count() {
        let files: Vec<_> =
            hashed.iter().filter_map(|(_, h, c)| Some((c.as_ref()?.path.clone(), c.as_ref()?.stamp, (*h)?))).collect();
        cache.store(&files);
    }
    let undecodable = hashed.iter().filter(|(_, h, _)| h.is_none()).count();
    let images: Vec<(Member, Option<ImageHashes>)> = hashed.into_iter().map(|(m, h, _)| (m, h)).collect();
    DataHealth {
        duplicates: duplicates::find(&images, hashes::NEAR_BITS),
        imbalance: imbalance_of(splits),
        images: images.len(),
        undecodable,
        from_cache,
        secs: started.elapsed().as_secs_f64(),
    }
}

/// The class sizes of `splits`, training and validation images together (validation's labels
/// index the training split's classes).
pub fn imbalance_of(splits: &Splits) -> Imbalance {
    let mut counts = splits.train.class_counts();
    for s in &splits.val.samples {
        if let Some(c) = counts.get_mut(s.label) {
            *c += 1;
        }
    }
    Imbalance { counts, class_names: splits.train.class_names.clone() }
}

/// `train` or `val`.
pub fn split_name(split: Split) -> &'static str {
    match split {
        Split::Train => "train",
        Split::Val => "val",
    }
}

/// An image file's place in the hash cache.
struct Cached {
    path: PathBuf,
    stamp: hash_cache::FileStamp,
    hit: bool,
}

/// The hashes of one sample (`None`: it does not decode), and for an image file its cache entry.
fn hash_source(
    source: &SampleSource,
    load: &LoadOptions,
    cache: &hash_cache::HashCache,
) -> (Option<ImageHashes>, Option<Cached>) {
    let decode = |bytes: &[u8]| image_io::decode_image_scaled(bytes, load, HASH_DECODE_SIDE).ok();
    match source {
        SampleSource::File(path) => {
            let Some(stamp) = hash_cache::stamp(path) else { return (None, None) };
            if let Some(h) = cache.get(path, stamp) {
                return (Some(h), Some(Cached { path: path.clone(), stamp, hit: true }));
            }
            let hashes = std::fs::read(path).ok().and_then(|b| Some(ImageHashes::of(&b, &decode(&b)?)));
            (hashes, hashes.map(|_| Cached { path: path.clone(), stamp, hit: false }))
        }
        SampleSource::Encoded { bytes, .. } => (decode(bytes).map(|img| ImageHashes::of(bytes, &img)), None),
        SampleSource::Idx { images, index } => {
            (Some(ImageHashes::of(images.image(*index), &images.rgb_image(*index))), None)
        }
    }
}

/// A sample's name in reports: a file's path relative to the dataset folder, `/`-separated.
pub fn relative_name(source: &SampleSource, root: &Path) -> String {
    match source {
        SampleSource::File(p) | SampleSource::Encoded { path: p, .. } => {
            let rel = p.strip_prefix(root).unwrap_or(p);
            rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/")
        }
        SampleSource::Idx { .. } => source.describe(),
    }
}

impl DataHealth {
    /// Indices (into the validation dataset) of validation images that copy a training image.
    pub fn leaked_val_indices(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.duplicates.leaked().iter().map(|(m, _)| m.index).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The findings that should stop a user before training, one line each: leakage, label
    /// conflicts, imbalance.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let leaked = self.leaked_val_indices().len();
        if leaked > 0 {
            out.push(format!(
                "{} (validation accuracy is inflated; data.drop_leaked_val = true evaluates without them)",
                counted(
                    leaked,
                    "validation image is a copy of a training image",
                    "validation images are copies of training images"
                )
            ));
        }
        let conflicts = self.duplicates.conflicts().count();
        if conflicts > 0 {
            out.push(format!(
                "{} filed under two or more labels (one label of each is wrong: keep one copy in the right class)",
                crate::engine::words::count(conflicts, "picture")
            ));
        }
        out.extend(self.imbalance.warning());
        out
    }

    /// The one line `train` prints: the findings' counts, copies inside classes, and where the
    /// report is, with whether it is a warning; `None` when there is nothing to say. `remedies`
    /// says which findings the run's config already deals with: their part says so and does
    /// not make the line a warning.
    pub fn summary_line(&self, report: &str, remedies: Remedies) -> Option<(String, bool)> {
        let leaked = self.leaked_val_indices().len();
        let conflicts = self.duplicates.conflicts().count();
        let within: usize = self.duplicates.within_class().map(|g| g.members.len() - 1).sum();
        let imbalanced = self.imbalance.ratio() > imbalance::WARN_RATIO;
        let mut parts = Vec::new();
        if leaked > 0 {
            let copies = counted(leaked, "validation copy", "validation copies");
            parts.push(if remedies.leaked_dropped {
                format!("{copies} of training images (left out of validation: data.drop_leaked_val)")
            } else {
                format!("{copies} of training images (validation accuracy inflated)")
            });
        }
        if conflicts > 0 {
            parts.push(counted(conflicts, "picture under two labels", "pictures under two labels"));
        }
        if within > 0 {
            parts.push(format!("{} inside classes", counted(within, "extra copy", "extra copies")));
        }
        if imbalanced {
            let balanced = if remedies.balanced { " (balanced by the config)" } else { "" };
            parts.push(format!("class imbalance {:.1}:1{balanced}", self.imbalance.ratio()));
        }
        let warn = conflicts > 0 || (leaked > 0 && !remedies.leaked_dropped) || (imbalanced && !remedies.balanced);
        (!parts.is_empty()).then(|| (format!("data health: {}; see {report}", parts.join(", ")), warn))
    }

    /// The whole report: a heading line, then copies under two labels, validation copies of
    /// training images and copies inside a class, each group with its files and how they match
    /// (at most 10 groups per kind and 4 files per group; the rest counted), then the imbalance.
    pub fn report(&self) -> String {
        let mut s = String::new();
        let d = &self.duplicates;
        let _ = writeln!(
            s,
            "duplicates among {} images ({:.1} s{}): {} groups, {} extra copies",
            self.images,
            self.secs,
            if self.from_cache > 0 {
                format!(", {} from the cache", counted(self.from_cache, "hash", "hashes"))
            } else {
                String::new()
            },
            d.groups.len(),
            d.extra_copies()
        );
        if !d.near_searched {
            let _ = writeln!(
                s,
                "  only exact copies were searched: near copies are searched up to {} images",
                duplicates::NEAR_SEARCH_MAX_IMAGES
            );
        }
        if self.undecodable > 0 {
            let _ = writeln!(s, "  {} images did not decode and were not compared", self.undecodable);
        }
        let conflicts: Vec<_> = d.conflicts().collect();
        write_groups(&mut s, "the same picture under two labels (one label is wrong)", &conflicts);
        let leaking: Vec<_> = d.groups.iter().filter(|g| !g.leaked().is_empty()).collect();
        if !leaking.is_empty() {
            let _ = writeln!(
                s,
                "validation images that copy training images: {} (validation accuracy is inflated; \
                 data.drop_leaked_val = true evaluates without them)",
                self.leaked_val_indices().len()
            );
            for g in leaking.iter().take(LISTED) {
                let in_split = |split| -> Vec<String> {
                    g.members.iter().filter(|m| m.split == split).map(|m| m.path.clone()).collect()
                };
                let (val, train) = (in_split(Split::Val), in_split(Split::Train));
                let _ = writeln!(s, "  {} = {} ({})", some(&val, ", "), some(&train, ", "), g.kind.describe());
            }
            if leaking.len() > LISTED {
                let _ = writeln!(s, "  and {}", counted(leaking.len() - LISTED, "more group", "more groups"));
            }
        }
        let within: Vec<_> = d.within_class().collect();
        write_groups(&mut s, "copies inside one class (harmless, but the picture weighs more)", &within);
        let counts = &self.imbalance.counts;
        let _ = writeln!(
            s,
            "class imbalance: largest/smallest = {:.1}{}",
            self.imbalance.ratio(),
            if counts.len() > 1 { format!(" (warned above {:.0})", imbalance::WARN_RATIO) } else { String::new() }
        );
        if let Some(w) = self.imbalance.warning() {
            let _ = writeln!(s, "warning: {w}");
        }
        s
    }
}

/// `n` with the singular or the plural phrase.
fn counted(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// One kind of group, headed by `title` and its count; each group on a line as its files joined
/// by `=`, its kind in brackets and, under two labels, each file's class.
fn write_groups(s: &mut String, title: &str, groups: &[&duplicates::DuplicateGroup]) {
    if groups.is_empty() {
        return;
    }
    let _ = writeln!(s, "{title}: {}", groups.len());
    for g in groups.iter().take(LISTED) {
        let files: Vec<String> = g
            .for_display()
            .into_iter()
            .map(|m| if g.is_conflict() { format!("{} [{}]", m.path, m.class) } else { m.path.clone() })
            .collect();
        let _ = writeln!(s, "  {} ({})", some(&files, " = "), g.kind.describe());
    }
    if groups.len() > LISTED {
        let _ = writeln!(s, "  and {}", counted(groups.len() - LISTED, "more group", "more groups"));
    }
}

/// Files a report line names of a group: up to [`LISTED_FILES`] joined by `sep`, then how many
/// more.
fn some(files: &[String], sep: &str) -> String {
    let shown = files[..files.len().min(LISTED_FILES)].join(sep);
    if files.len() > LISTED_FILES { format!("{shown} and {} more", files.len() - LISTED_FILES) } else { shown }
}
