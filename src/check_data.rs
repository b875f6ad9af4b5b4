//! `vramfit check-data`: a dataset's report before training: classes and counts, files that
//! would be skipped grouped by reason, the scan's findings, what would stop training, and what
//! the preprocess mode makes of the smallest and largest images.

use crate::config::Config;
use crate::error::Result;

/// The `check-data` report: classes with counts, skipped files grouped by reason, imbalance,
/// size spread and what the preprocess mode makes of the smallest and largest images.
///
/// # Errors
/// [`crate::Error::Dataset`] when the folder cannot be used at all.
pub fn report(path: &std::path::Path, config: &Config, allow_empty: bool) -> Result<String> {
    use std::collections::BTreeMap;
    let opts = crate::dataset::ScanOptions {
        val_fraction: config.data.val_fraction,
        seed: config.seed,
        allow_empty_classes: allow_empty || config.data.allow_empty_classes,
    };
    let (splits, refusals) = crate::dataset::survey(path, &opts)?;
    let pipe = crate::loader::SamplePipeline::from_config(config, false);
    let mut s = format!("dataset {}\n", splits.description);
    for refusal in &refusals {
        s.push_str(&format!("training would stop: {refusal}\n"));
    }
    let mut all = splits.train.clone();
    all.samples.extend(splits.val.samples.iter().cloned());
    let counts = all.class_counts();
    s.push_str(&format!(
        "{} classes, {} files ({} train, {} validation)\n",
        all.class_names.len(),
        all.samples.len(),
        splits.train.samples.len(),
        splits.val.samples.len()
    ));
    for (name, n) in all.class_names.iter().zip(&counts) {
        s.push_str(&format!("  {name}: {n}\n"));
    }
    let (min, max) = (counts.iter().min().copied().unwrap_or(0), counts.iter().max().copied().unwrap_or(0));
    s.push_str(&format!("class imbalance: largest/smallest = {:.1}\n", max as f64 / min.max(1) as f64));
    let mut reasons: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let (mut smallest, mut largest): (Option<(u32, u32, String)>, Option<(u32, u32, String)>) = (None, None);
    let mut flat = Vec::new();
    for sample in &all.samples {
        match pipe.decode(&sample.source) {
            Ok(img) => {
                let (w, h) = img.dimensions();
                let name = sample.source.describe();
                if crate::image_io::is_flat(&img) {
                    flat.push(name.clone());
                }
                if smallest.as_ref().is_none_or(|m| (w * h) < m.0 * m.1) {
                    smallest = Some((w, h, name.clone()));
                }
                if largest.as_ref().is_none_or(|m| (w * h) > m.0 * m.1) {
                    largest = Some((w, h, name));
                }
            }
            Err(reason) => {
                let key = reason.split(": ").skip(1).collect::<Vec<_>>().join(": ");
                let key = key.split(" (").next().unwrap_or(&key).to_string();
                reasons.entry(key).or_default().push(sample.source.describe());
            }
        }
    }
    let skipped: usize = reasons.values().map(Vec::len).sum();
    s.push_str(&format!("{skipped} files would be skipped\n"));
    for (reason, files) in &reasons {
        s.push_str(&format!("  {reason}: {}\n", files.len()));
        for f in files.iter().take(5) {
            s.push_str(&format!("    {f}\n"));
        }
    }
    if !splits.report.ignored.is_empty() {
        s.push_str(&format!("{} files ignored by the scan\n", splits.report.ignored.len()));
        for (file, why) in &splits.report.ignored {
            s.push_str(&format!("  {}: {why}\n", file.display()));
        }
    }
    for f in &flat {
        s.push_str(&format!("warning: {f} is one flat colour: a blank or wrongly decoded image?\n"));
    }
    for warning in splits.report.warnings() {
        s.push_str(&format!("warning: {warning}\n"));
    }
    for w in splits.validation_warnings() {
        s.push_str(&format!("warning: {w}\n"));
    }
    if let Some(e) = splits.refusal(|source| pipe.decode(source).is_ok()) {
        s.push_str(&format!("training would stop: {e}\n"));
    }
    if let Err(e) = crate::loader::check_sizes_agree(&all, &config.data.preprocess) {
        s.push_str(&format!("training would stop: {e}\n"));
    }
    let p = &config.data.preprocess;
    for (label, m) in [("smallest", &smallest), ("largest", &largest)] {
        if let Some((w, h, name)) = m {
            let out = match p.output_size_for((*w, *h)) {
                Ok((ow, oh)) => format!("{ow}x{oh}"),
                Err(e) => format!("error: {e}"),
            };
            s.push_str(&format!("{label} image {w}x{h} ({name}) -> {} gives {out}\n", p.mode.name()));
        }
    }
    if let Some(kb) = crate::bench::peak_rss_kb() {
        s.push_str(&format!("peak resident memory: {:.1} MB\n", kb as f64 / 1024.0));
    }
    Ok(s)
}
