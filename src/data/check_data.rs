//! `vramfit check-data`: a dataset's report before training: classes and counts, files that
//! would be skipped grouped by reason, the scan's findings, the data's health (copies, label
//! conflicts, validation copies of training images, imbalance: [`crate::data::health`]), what
//! would stop training, and what the preprocess mode makes of the smallest and largest images.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::config::Config;
use crate::data::dataset::{Dataset, Splits};
use crate::data::pipeline::SamplePipeline;
use crate::engine::error::{Error, Result};

/// The `check-data` report ([`report`]).
#[derive(Clone, Debug, PartialEq)]
pub struct DataReport {
    /// The report's lines.
    pub text: String,
    /// How many of them say training would stop (each a `training would stop: ...` line).
    pub stops: usize,
}

/// The `check-data` report: classes with counts, skipped files grouped by reason, the data's
/// health ([`crate::data::health::DataHealth::report`]), size spread, what would stop training, and what the preprocess mode makes of the smallest
/// and largest images.
///
/// # Errors
/// [`crate::Error::Dataset`] when the folder cannot be used at all.
pub fn report(path: &std::path::Path, config: &Config, allow_empty: bool) -> Result<DataReport> {
    let opts = crate::data::dataset::ScanOptions::of(config, allow_empty);
    let (splits, refusals) = crate::data::dataset::survey(path, &opts)?;
    let pipe = SamplePipeline::from_config(config, false);
    let mut s = format!("dataset {}\n", splits.description);
    let mut stops = Vec::new();
    stops.extend(refusals);
    let mut all = splits.train.clone();
    all.samples.extend(splits.val.samples.iter().cloned());
    write_classes(&mut s, &splits, &all);
    let decoded = DecodeSurvey::of(&all, &pipe);
    decoded.write_skips(&mut s);
    write_findings(&mut s, &splits, &decoded.flat);
    s.push_str(&crate::data::health::scan(&splits, &config.data).report());
    stops.extend(splits.refusal(|source| pipe.decode(source).is_ok()).map(|e| e.to_string()));
    stops.extend(crate::data::loader::check_sizes_agree(&all, &config.data.preprocess).err().map(|e| e.to_string()));
    for stop in &stops {
        let _ = writeln!(s, "training would stop: {stop}");
    }
    decoded.write_extremes(&mut s, config);
    write_cache(&mut s, &all, &pipe, config);
    if let Some(kb) = crate::bench::peak_rss_kb() {
        let _ = writeln!(s, "peak resident memory: {:.1} MB", kb as f64 / 1024.0);
    }
    Ok(DataReport { text: s, stops: stops.len() })
}

/// The decoded-image cache: where it is, its size against its bounds, and how many of the
/// dataset's files it already holds at this geometry.
fn write_cache(s: &mut String, all: &Dataset, pipe: &SamplePipeline, config: &Config) {
    let _ = writeln!(s, "{}", crate::data::image_cache::summary(&config.data));
    let Some(dir) = crate::data::image_cache::disk_folder(&config.data) else { return };
    let geometry = pipe.cache_geometry();
    let files: Vec<&std::path::Path> = all
        .samples
        .iter()
        .filter_map(|x| match &x.source {
            crate::data::dataset::SampleSource::File(p) => Some(p.as_path()),
            crate::data::dataset::SampleSource::Encoded { .. } | crate::data::dataset::SampleSource::Idx { .. } => None,
        })
        .collect();
    let held = files.iter().filter(|f| crate::data::image_cache::on_disk(&dir, f, &geometry)).count();
    let _ = writeln!(s, "  {held} of {} image files cached at {geometry}", files.len());
}

/// Class count lines and the imbalance ratio of `all` (train + validation).
fn write_classes(s: &mut String, splits: &Splits, all: &Dataset) {
    let counts = all.class_counts();
    let _ = writeln!(
        s,
        "{}, {} ({} train, {} validation)",
        crate::engine::words::count(all.class_names.len(), "class"),
        crate::engine::words::count(all.samples.len(), "file"),
        splits.train.samples.len(),
        splits.val.samples.len()
    );
    // Every class when they fit a screen; else the smallest ten (where imbalance bites) and
    // the count of the rest.
    let mut order: Vec<usize> = (0..counts.len()).collect();
    if counts.len() > 30 {
        order.sort_by_key(|&c| counts[c]);
        order.truncate(10);
    }
    for &c in &order {
        let _ = writeln!(s, "  {}: {}", all.class_names[c], counts[c]);
    }
    if order.len() < counts.len() {
        let _ = writeln!(s, "  ... and {} more classes (the 10 smallest are listed)", counts.len() - order.len());
    }
}

/// What the scan left out, flat images and the dataset's warnings.
fn write_findings(s: &mut String, splits: &Splits, flat: &[String]) {
    if !splits.report.ignored.is_empty() {
        let _ = writeln!(s, "{} files ignored by the scan", splits.report.ignored.len());
        for (file, why) in &splits.report.ignored {
            let _ = writeln!(s, "  {}: {why}", file.display());
        }
    }
    for f in flat {
        let _ = writeln!(s, "warning: {f} is one flat colour: a blank or wrongly decoded image?");
    }
    for warning in splits.report.warnings().into_iter().chain(splits.validation_warnings()) {
        let _ = writeln!(s, "warning: {warning}");
    }
}

/// An image's size in pixels and its name.
struct Sized {
    width: u32,
    height: u32,
    name: String,
}

/// Every sample decoded once: the files that would be skipped, grouped by the kind of their
/// [`crate::data::image_io::ImageFault`], the flat images, and the smallest and largest images.
#[derive(Default)]
struct DecodeSurvey {
    skipped: BTreeMap<&'static str, Vec<String>>,
    flat: Vec<String>,
    smallest: Option<Sized>,
    largest: Option<Sized>,
}

impl DecodeSurvey {
    fn of(all: &Dataset, pipe: &SamplePipeline) -> Self {
        let mut survey = Self::default();
        for sample in &all.samples {
            let name = sample.source.describe();
            match pipe.decode(&sample.source) {
                Ok(img) => {
                    if crate::data::image_io::is_flat(&img) {
                        survey.flat.push(name.clone());
                    }
                    let (width, height) = img.dimensions();
                    let area = |m: &Sized| m.width as u64 * m.height as u64;
                    let this = width as u64 * height as u64;
                    if survey.smallest.as_ref().is_none_or(|m| this < area(m)) {
                        survey.smallest = Some(Sized { width, height, name: name.clone() });
                    }
                    if survey.largest.as_ref().is_none_or(|m| this > area(m)) {
                        survey.largest = Some(Sized { width, height, name });
                    }
                }
                Err(e) => {
                    let kind = match &e {
                        Error::Image { fault, .. } => fault.kind(),
                        _ => "other",
                    };
                    survey.skipped.entry(kind).or_default().push(name);
                }
            }
        }
        survey
    }

    /// "N files would be skipped", then each kind of fault with its count and up to 5 files.
    fn write_skips(&self, s: &mut String) {
        let skipped: usize = self.skipped.values().map(Vec::len).sum();
        let _ = writeln!(s, "{} would be skipped", crate::engine::words::count(skipped, "file"));
        for (kind, files) in &self.skipped {
            let _ = writeln!(s, "  {kind}: {}", files.len());
            for f in files.iter().take(5) {
                let _ = writeln!(s, "    {f}");
            }
            if files.len() > 5 {
                let _ = writeln!(s, "    and {} more", files.len() - 5);
            }
        }
    }

    /// What the preprocess mode makes of the smallest and largest images.
    fn write_extremes(&self, s: &mut String, config: &Config) {
        let p = &config.data.preprocess;
        for (label, m) in [("smallest", &self.smallest), ("largest", &self.largest)] {
            let Some(Sized { width, height, name }) = m else { continue };
            let out = match p.output_size_for((*width, *height)) {
                Ok((ow, oh)) => format!("{ow}x{oh}"),
                Err(e) => format!("error: {e}"),
            };
            let _ = writeln!(s, "{label} image {width}x{height} ({name}) -> {} gives {out}", p.mode.name());
        }
    }
}
