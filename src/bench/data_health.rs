//! The data-health measurements: the duplicate finder's recall and false matches on generated
//! copies (`vramfit bench duplicates`), and the label-issue ranking's recall on deliberately
//! flipped labels (`vramfit bench label-errors`). Results in docs/data-health.md.

use std::io::Cursor;

use image::RgbImage;
use image::imageops::FilterType;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::data::health::hashes::ImageHashes;

/// The kinds of copy the duplicate bench makes of each picture, by name.
pub const COPY_KINDS: [&str; 9] =
    ["resize 0.5x", "resize 0.75x", "resize 1.5x", "jpeg q95", "jpeg q75", "jpeg q50", "crop 5%", "crop 10%", "mirror"];

/// One threshold's result.
#[derive(Clone, Debug, Serialize)]
pub struct DuplicateBenchRow {
    /// Bits of 64 within which two perceptual hashes match.
    pub threshold: u32,
    /// Per copy kind ([`COPY_KINDS`]), the share of copies matched to their picture (mirror: as
    /// a mirrored copy).
    pub recall: Vec<f64>,
    /// Pairs of distinct pictures that matched.
    pub false_pairs: usize,
    /// Pairs of distinct pictures compared.
    pub pairs: usize,
    /// Of all matches among pictures and their copies, the share that are true copies.
    pub precision: f64,
}

/// `kind` of copy of `img` ([`COPY_KINDS`]).
fn copy_of(img: &RgbImage, kind: &str) -> RgbImage {
    let (w, h) = img.dimensions();
    let scaled = |f: f32| {
        image::imageops::resize(
            img,
            ((w as f32 * f) as u32).max(1),
            ((h as f32 * f) as u32).max(1),
            FilterType::Triangle,
        )
    };
    let jpeg = |q: u8| {
        let mut bytes = Vec::new();
        let encoded = image::codecs::jpeg::JpegEncoder::new_with_quality(Cursor::new(&mut bytes), q)
            .encode_image(img)
            .ok()
            .and_then(|()| crate::data::image_io::decode_image(&bytes, &Default::default()).ok());
        encoded.unwrap_or_else(|| img.clone())
    };
    let crop = |share: f32| {
        let (dx, dy) = ((w as f32 * share) as u32, (h as f32 * share) as u32);
        image::imageops::crop_imm(img, dx, dy, w - 2 * dx, h - 2 * dy).to_image()
    };
    match kind {
        "resize 0.5x" => scaled(0.5),
        "resize 0.75x" => scaled(0.75),
        "resize 1.5x" => scaled(1.5),
        "jpeg q95" => jpeg(95),
        "jpeg q75" => jpeg(75),
        "jpeg q50" => jpeg(50),
        "crop 5%" => crop(0.05),
        "crop 10%" => crop(0.10),
        _ => image::imageops::flip_horizontal(img),
    }
}

/// Whether hashes `a` and `b` match within `t` bits, as the same picture or as mirror images
/// ([`crate::data::health::duplicates::near_kind`], as the duplicate finder links them).
fn matches(a: &ImageHashes, b: &ImageHashes, t: u32) -> bool {
    crate::data::health::duplicates::near_kind(a, b, t).is_some()
}

/// Recall and false matches of the perceptual hash at each of `thresholds` over `pictures`
/// (distinct pictures) and [`COPY_KINDS`] copies of each. Precision counts, as a dataset of the
/// pictures and all their copies would: true matches (each copy with its picture) against false
/// ones (distinct pictures, and a copy with another picture: counted as the pictures' pairs
/// times the copies), same-picture or mirrored alike.
pub fn bench_duplicates(pictures: &[RgbImage], thresholds: &[u32]) -> Vec<DuplicateBenchRow> {
    use rayon::prelude::*;
    let hashes: Vec<ImageHashes> = pictures.par_iter().map(|p| ImageHashes::of(p.as_raw(), p)).collect();
    let copies: Vec<Vec<ImageHashes>> = pictures
        .par_iter()
        .map(|p| {
            COPY_KINDS
                .iter()
                .map(|k| {
                    let c = copy_of(p, k);
                    ImageHashes::of(c.as_raw(), &c)
                })
                .collect()
        })
        .collect();
    let usable: Vec<usize> = (0..pictures.len()).filter(|&i| !hashes[i].flat).collect();
    thresholds
        .iter()
        .map(|&t| {
            let recall: Vec<f64> = (0..COPY_KINDS.len())
                .map(|k| {
                    let found = usable.iter().filter(|&&i| matches(&hashes[i], &copies[i][k], t)).count();
                    found as f64 / usable.len().max(1) as f64
                })
                .collect();
            let false_pairs: usize = usable
                .par_iter()
                .enumerate()
                .map(|(a, &i)| usable[a + 1..].iter().filter(|&&j| matches(&hashes[i], &hashes[j], t)).count())
                .sum();
            let pairs = usable.len() * usable.len().saturating_sub(1) / 2;
            let true_matches: f64 = recall.iter().sum::<f64>() * usable.len() as f64;
            let false_matches = false_pairs as f64 * (1 + COPY_KINDS.len()) as f64;
            DuplicateBenchRow {
                threshold: t,
                recall,
                false_pairs,
                pairs,
                precision: true_matches / (true_matches + false_matches).max(1.0),
            }
        })
        .collect()
}

/// The duplicate bench as a table: one row per threshold.
pub fn duplicates_table(rows: &[DuplicateBenchRow], pictures: usize) -> String {
    use std::fmt::Write as _;
    let mut s = format!("{pictures} pictures, {} copies of each; recall per kind of copy:\n", COPY_KINDS.len());
    let _ = write!(s, "| bits |");
    for k in COPY_KINDS {
        let _ = write!(s, " {k} |");
    }
    let _ = writeln!(s, " false pairs (per million) | precision |");
    let _ = writeln!(s, "|{}", "---|".repeat(COPY_KINDS.len() + 3));
    for r in rows {
        let _ = write!(s, "| {} |", r.threshold);
        for v in &r.recall {
            let _ = write!(s, " {:.3} |", v);
        }
        let per_million = r.false_pairs as f64 * 1e6 / r.pairs.max(1) as f64;
        let _ = writeln!(s, " {} ({per_million:.1}) | {:.4} |", r.false_pairs, r.precision);
    }
    s
}

/// `n` pictures from `dataset` (the first ones), decoded and scaled up `scale` times (a
/// 28 px Fashion-MNIST item becomes a 112 px picture, so half-size copies stay legible).
pub fn pictures_of(dataset: &crate::data::dataset::Dataset, n: usize, scale: u32) -> Vec<RgbImage> {
    let pipe = crate::data::pipeline::SamplePipeline::from_config(&crate::config::Config::default(), false);
    dataset
        .samples
        .iter()
        .filter_map(|s| pipe.decode(&s.source).ok())
        .take(n)
        .map(|img| {
            let (w, h) = img.dimensions();
            image::imageops::resize(&img, w * scale, h * scale, FilterType::Triangle)
        })
        .collect()
}

/// `labels` with `share` of them (rounded down) changed to another class at random, seeded;
/// returns the indices changed, sorted.
pub fn flip_labels(labels: &mut [usize], classes: usize, share: f64, seed: u64) -> Vec<usize> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..labels.len()).collect();
    order.shuffle(&mut rng);
    let mut flipped: Vec<usize> = order.into_iter().take((labels.len() as f64 * share) as usize).collect();
    for &i in &flipped {
        let shift = rng.random_range(1..classes.max(2));
        labels[i] = (labels[i] + shift) % classes.max(2);
    }
    flipped.sort_unstable();
    flipped
}

/// How well a label-issue ranking finds `flipped` among `ranked` (issue indices, most doubtful
/// first): recall within the first `flipped.len()` (equal to the precision there), recall of
/// all issues, and how many were flagged.
#[derive(Clone, Debug, Serialize)]
pub struct RankingScore {
    /// Images whose label was flipped.
    pub flipped: usize,
    /// Images flagged as issues.
    pub flagged: usize,
    /// Share of the flipped images among the first `flipped` ranked.
    pub recall_at_k: f64,
    /// Share of the flipped images flagged at all.
    pub recall: f64,
    /// Share of the flagged images that were flipped.
    pub precision: f64,
}

/// Scores a ranking against the flipped indices (both index the same image list).
pub fn score_ranking(ranked: &[usize], flipped: &[usize]) -> RankingScore {
    let is_flipped = |i: &&usize| flipped.binary_search(i).is_ok();
    let k = flipped.len();
    let top = ranked.iter().take(k).filter(is_flipped).count();
    let all = ranked.iter().filter(is_flipped).count();
    RankingScore {
        flipped: k,
        flagged: ranked.len(),
        recall_at_k: top as f64 / k.max(1) as f64,
        recall: all as f64 / k.max(1) as f64,
        precision: all as f64 / ranked.len().max(1) as f64,
    }
}

/// What `vramfit bench label-errors` measured.
#[derive(Clone, Debug, Serialize)]
pub struct LabelErrorBench {
    /// The ranking on the training images (in sample: the model trained on their labels).
    pub train: RankingScore,
    /// The ranking on the validation images (out of sample).
    pub val: RankingScore,
    /// The model's validation accuracy against the flipped labels.
    pub val_accuracy: f32,
    /// Seconds of training.
    pub train_secs: f64,
}

/// Flips `share` of the labels of `splits` (training and validation alike, seeded), trains
/// `config` on them in memory on `device`, ranks each split's label issues and scores the
/// rankings against the flips.
///
/// # Errors
/// As [`crate::train::train_in_memory`] and [`crate::inference::eval::evaluate`].
pub fn bench_label_errors(
    config: &crate::config::Config,
    splits: &crate::data::dataset::Splits,
    share: f64,
    seed: u64,
    device: &crate::device::SelectedDevice,
    progress: &mut dyn FnMut(&str),
) -> crate::Result<LabelErrorBench> {
    let classes = splits.train.class_names.len();
    let mut noisy = splits.clone();
    let mut flips = Vec::new();
    for (k, dataset) in [&mut noisy.train, &mut noisy.val].into_iter().enumerate() {
        let mut labels: Vec<usize> = dataset.samples.iter().map(|s| s.label).collect();
        flips.push(flip_labels(&mut labels, classes, share, seed + k as u64));
        for (s, l) in dataset.samples.iter_mut().zip(labels) {
            s.label = l;
        }
    }
    progress(&format!(
        "flipped {} training and {} validation labels of {} and {}; training {} epochs...",
        flips[0].len(),
        flips[1].len(),
        noisy.train.samples.len(),
        noisy.val.samples.len(),
        config.train.epochs
    ));
    let started = web_time::Instant::now();
    let request = crate::train::InMemoryRequest::new(config.clone());
    let stop = crate::engine::events::StopSignal::new();
    let trained = pollster::block_on(crate::train::train_in_memory(&request, &noisy, device, &mut |_| {}, &stop))?;
    let train_secs = started.elapsed().as_secs_f64();
    let settings = crate::inference::eval::EvalSettings {
        model: &config.model,
        batch_size: 64,
        precision: crate::config::Precision::F32,
        workers: 0,
        buffer_limit: device.buffer_limit(),
        keep_probabilities: true,
    };
    let pipe = std::sync::Arc::new(crate::data::pipeline::SamplePipeline::from_config(config, false));
    let mut scores = Vec::new();
    let mut val_accuracy = f32::NAN;
    for (dataset, flipped) in [&noisy.train, &noisy.val].into_iter().zip(&flips) {
        let data = std::sync::Arc::new(dataset.clone());
        let r = pollster::block_on(crate::inference::eval::evaluate(
            &trained.model,
            data,
            pipe.clone(),
            &trained.device,
            &settings,
        ))?;
        let ranked: Vec<usize> = r.label_issues().iter().map(|issue| r.sample_indices[issue.index]).collect();
        scores.push(score_ranking(&ranked, flipped));
        val_accuracy = r.top1;
    }
    let val = scores.pop().unwrap_or_else(|| score_ranking(&[], &[]));
    let train = scores.pop().unwrap_or_else(|| score_ranking(&[], &[]));
    Ok(LabelErrorBench { train, val, val_accuracy, train_secs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flipped_labels_change_class_and_scores_count_them() {
        let mut labels: Vec<usize> = (0..100).map(|i| i % 4).collect();
        let before = labels.clone();
        let flipped = flip_labels(&mut labels, 4, 0.1, 3);
        assert_eq!(flipped.len(), 10);
        assert!(flipped.iter().all(|&i| labels[i] != before[i]));
        assert_eq!((0..100).filter(|&i| labels[i] != before[i]).count(), 10);
        let s = score_ranking(&[flipped[0], 99_000, flipped[1]], &flipped);
        assert_eq!((s.recall_at_k, s.flagged), (0.2, 3));
        assert!((s.precision - 2.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn copies_of_fashion_mnist_items_are_found_at_the_chosen_threshold_and_distinct_items_are_not() {
        let splits = crate::data::dataset::open(
            &crate::data::dataset::bundled_dataset_dir(),
            &crate::data::dataset::ScanOptions {
                val_fraction: 0.1,
                seed: 0,
                allow_empty_classes: false,
                csv_paths_outside: false,
            },
        )
        .unwrap();
        let pictures = pictures_of(&splits.train, 40, 4);
        let rows = bench_duplicates(&pictures, &[crate::data::health::hashes::NEAR_BITS]);
        let r = &rows[0];
        assert_eq!(r.pairs, 40 * 39 / 2);
        // docs/data-health.md over 6,000 items: 1.6 false pairs a million, so none of these 780.
        assert_eq!(r.false_pairs, 0);
        let recall = |kind: &str| r.recall[COPY_KINDS.iter().position(|k| *k == kind).unwrap()];
        for kind in ["resize 0.75x", "resize 1.5x", "jpeg q95", "jpeg q75", "jpeg q50"] {
            assert_eq!(recall(kind), 1.0, "{kind}: {:?}", r.recall);
        }
        assert!(recall("resize 0.5x") >= 0.9 && recall("mirror") >= 0.9, "{:?}", r.recall);
    }
}
