//! `vramfit bench loader`: the input pipeline alone (no model), so a reader can compare what it
//! delivers with what training consumes (`vramfit bench train`). It generates JPEG photos at
//! typical camera sizes itself (12 MP and 2 MP, a smooth gradient with noise, so they compress
//! and decode like photos), and also measures the bundled data.
//!
//! Per source set and preprocess mode: the CPU time per image of each stage (decode, resize,
//! augment, normalize) in one thread, the upload of a batch to the device per image, and the
//! images per second the loader delivers with each worker count.

use std::path::Path;
use std::sync::Arc;
use web_time::Instant;

use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::config::Config;
use crate::data::dataset::{Dataset, Sample, SampleSource};
use crate::data::image_cache::ImageCache;
use crate::data::loader;
use crate::data::pipeline::{SamplePipeline, StageTimes};
use crate::data::preprocess::PreprocessMode;
use crate::device::SelectedDevice;
use crate::engine::error::{Error, Result};

/// One row of `bench loader`.
#[derive(Clone, Debug, Serialize)]
pub struct LoaderBenchRow {
    /// The images, e.g. "12 MP JPEG (4000x3000)".
    pub source: String,
    /// Preprocess mode and sizes, e.g. "resize_and_crop 256/224".
    pub mode: String,
    /// Milliseconds of CPU per image in each stage (one thread, training pipeline).
    pub ms_per_image: StageTimes,
    /// Milliseconds per image to upload a batch of 16 to the device and wait for it (f32, after
    /// the CPU's augmentation and normalization).
    pub upload_ms_per_image: f64,
    /// Milliseconds per image to upload the same batch as 8-bit pixels and crop, augment and
    /// normalize it on the device (`shaders/augment_rgb8.wgsl`), synchronized: what replaces
    /// the CPU's augment, normalize and f32 upload when `augment.on_device` is on. `None` where
    /// the device does not run the kernel.
    pub device_augment_ms_per_image: Option<f64>,
    /// (worker threads, images per second the loader delivers), no cache.
    pub images_per_sec: Vec<(usize, f64)>,
    /// Milliseconds per image to decode at full size and resize (one thread): the pipeline
    /// before scaled decoding, for comparison with `decode + resize` of `ms_per_image`.
    pub full_decode_resize_ms: f64,
    /// Images per second with the decoded-image cache (the most workers measured): the first
    /// epoch (empty cache), the second (RAM), and a new run on the same folder (disk only).
    pub cached_images_per_sec: [f64; 3],
}

/// Milliseconds per image to upload the first batch of `pass` as f32 (NaN for an empty batch),
/// and to upload it packed and augment it on the device (`None` where the device does not run
/// the kernel), both synchronized.
fn time_uploads(
    dataset: &Arc<Dataset>,
    pipe: &Arc<SamplePipeline>,
    pass: &loader::Pass,
    config: &Config,
    device: &SelectedDevice,
) -> Result<(f64, Option<f64>)> {
    let first = loader::batches(dataset.clone(), pipe.clone(), pass.clone(), 1, 2).next();
    let upload_ms_per_image = match first {
        Some(batch) if !batch.is_empty() => {
            let images = batch.len();
            // An untimed first upload: the device's first transfer sets up its staging buffers.
            let (x, labels) = batch.clone().into_tensors(&device.device);
            device.device.sync().map_err(|e| Error::device(&e))?;
            drop((x, labels));
            let t = Instant::now();
            let (x, labels) = batch.into_tensors(&device.device);
            device.device.sync().map_err(|e| Error::device(&e))?;
            drop((x, labels));
            1000.0 * t.elapsed().as_secs_f64() / images as f64
        }
        _ => f64::NAN,
    };
    if !crate::kernels::device_augment::runs_wgsl(&device.device) {
        return Ok((upload_ms_per_image, None));
    }
    let on_device = Arc::new(pipe.as_ref().clone().with_device_augment(true));
    let packed = loader::batches(dataset.clone(), on_device, pass.clone(), 1, 2).next();
    Ok((upload_ms_per_image, time_device_augment(packed, config, &device.device)?))
}

/// Milliseconds per image of a packed batch's upload and augmentation on the device (the
/// kernel compiled by a first, untimed launch), synchronized; `None` when the loader did not
/// pack the batch (an empty batch, or one the kernel refuses).
fn time_device_augment(
    batch: Option<crate::data::batch::Batch>,
    config: &Config,
    device: &burn::tensor::Device,
) -> Result<Option<f64>> {
    let Some(batch) = batch else { return Ok(None) };
    let Some(packed) = batch.packed.as_ref() else { return Ok(None) };
    let params = packed.params((batch.height, batch.width), config.data.mean, config.data.std)?;
    let run = || -> Result<()> {
        let out = crate::kernels::device_augment::augment_batch(packed.pixels.clone(), params.clone(), device)?;
        device.sync().map_err(|e| Error::device(&e))?;
        drop(out);
        Ok(())
    };
    run()?;
    let t = Instant::now();
    run()?;
    Ok(Some(1000.0 * t.elapsed().as_secs_f64() / batch.len() as f64))
}

/// Writes `count` JPEGs of `width` x `height` into `dir` (quality 90): a diagonal gradient per
/// image with pixel noise, so they compress and decode like photos rather than flat colour.
///
/// # Errors
/// [`Error::Io`] naming the file that cannot be written.
pub fn write_photos(dir: &Path, width: u32, height: u32, count: usize, seed: u64) -> Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    (0..count)
        .map(|i| {
            let tint: [f32; 3] = [rng.random_range(0.3..1.0), rng.random_range(0.3..1.0), rng.random_range(0.3..1.0)];
            let img = image::RgbImage::from_fn(width, height, |x, y| {
                let t = (x + y) as f32 / (width + height) as f32;
                let noise = rng.random_range(-12i16..12);
                image::Rgb(tint.map(|k| ((255.0 * k * t) as i16 + noise).clamp(0, 255) as u8))
            });
            let path = dir.join(format!("photo_{i:03}.jpg"));
            let file = std::fs::File::create(&path).map_err(|e| Error::io(&path, e))?;
            let mut encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(std::io::BufWriter::new(file), 90);
            encoder.encode_image(&img).map_err(|e| Error::io(&path, e))?;
            Ok(path)
        })
        .collect()
}

/// Measures one source set in one mode: stage times over `samples` (one thread), the upload,
/// the loader's throughput for each of `workers`, and three passes through a decoded-image
/// cache in `cache_dir` (an empty folder of this row's own).
///
/// # Errors
/// [`Error::Preprocess`] / [`Error::Image`] when a sample cannot be loaded; [`Error::Device`]
/// when the upload fails.
pub fn measure(
    source: &str,
    dataset: Dataset,
    config: &Config,
    device: &SelectedDevice,
    workers: &[usize],
    cache_dir: &Path,
) -> Result<LoaderBenchRow> {
    let pipe = SamplePipeline::from_config(config, true);
    let (ms_per_image, full_decode_resize_ms) = stage_times(&dataset, &pipe)?;
    let dataset = Arc::new(dataset);
    let pipe = Arc::new(pipe);
    // Small batches, so that every worker measured gets batches to build (workers take whole
    // batches: one batch of 8 photos kept the second worker idle, so 1 and 2 workers read alike).
    let batch_size = 2.min(dataset.samples.len()).max(1);
    let pass = loader::Pass::in_order(dataset.samples.len(), batch_size, 7);
    // Uploads are timed on one batch of up to 16, as training would send them.
    let upload_pass = loader::Pass::in_order(dataset.samples.len(), 16.min(dataset.samples.len()).max(1), 7);
    let (upload_ms_per_image, device_augment_ms_per_image) =
        time_uploads(&dataset, &pipe, &upload_pass, config, device)?;
    let mut images_per_sec = Vec::new();
    for &w in workers {
        let t = Instant::now();
        let images: usize = loader::batches(dataset.clone(), pipe.clone(), pass.clone(), w, 4).map(|b| b.len()).sum();
        images_per_sec.push((w, images as f64 / t.elapsed().as_secs_f64().max(1e-9)));
    }
    let w = workers.iter().copied().max().unwrap_or(1);
    let cached_images_per_sec = cached_passes(&dataset, &pipe, &pass, w, cache_dir);
    let p = &config.data.preprocess;
    let mode = match p.mode {
        PreprocessMode::None => "none".to_string(),
        m => format!("{} {}/{}", m.name(), p.load_size, p.crop_size),
    };
    Ok(LoaderBenchRow {
        source: source.into(),
        mode,
        ms_per_image,
        upload_ms_per_image,
        device_augment_ms_per_image,
        images_per_sec,
        full_decode_resize_ms,
        cached_images_per_sec,
    })
}

/// Milliseconds per image in each stage of `pipe` on one thread over `dataset` (decoded at
/// the reduced size the geometry needs), and of a full-size decode and resize for comparison.
///
/// # Errors
/// As [`SamplePipeline::resized`].
fn stage_times(dataset: &Dataset, pipe: &SamplePipeline) -> Result<(StageTimes, f64)> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
    let mut times = StageTimes::default();
    let mut full_decode_resize = 0.0;
    for sample in &dataset.samples {
        let resized = pipe.resized(&sample.source, &mut times)?;
        pipe.tensor_from_resized(&resized, &mut rng, &mut times)?;
        let t = Instant::now();
        pipe.preprocess.resize_stage(&pipe.decode(&sample.source)?)?;
        full_decode_resize += t.elapsed().as_secs_f64();
    }
    let n = dataset.samples.len().max(1) as f64;
    let per_image_ms = |s: f64| 1000.0 * s / n;
    let ms_per_image = StageTimes {
        decode: per_image_ms(times.decode),
        resize: per_image_ms(times.resize),
        augment: per_image_ms(times.augment),
        normalize: per_image_ms(times.normalize),
    };
    Ok((ms_per_image, per_image_ms(full_decode_resize)))
}

/// Loader throughput (images/s, `workers` threads) through a decoded-image cache in
/// `cache_dir`: the first pass (filling it), the second (from RAM) and a pass from its disk
/// copy alone.
fn cached_passes(
    dataset: &Arc<Dataset>,
    pipe: &SamplePipeline,
    pass: &loader::Pass,
    workers: usize,
    cache_dir: &Path,
) -> [f64; 3] {
    let pass_rate = |pipe: SamplePipeline| {
        let t = Instant::now();
        let images: usize =
            loader::batches(dataset.clone(), Arc::new(pipe), pass.clone(), workers, 4).map(|b| b.len()).sum();
        images as f64 / t.elapsed().as_secs_f64().max(1e-9)
    };
    let dir = cache_dir.to_path_buf();
    let unbounded = 1u64 << 40;
    let cache = Arc::new(ImageCache::new(unbounded, unbounded, Some(dir.clone())));
    let with_cache = pipe.clone().with_cache(Some(cache));
    let first = pass_rate(with_cache.clone());
    let second = pass_rate(with_cache);
    let disk_only = Arc::new(ImageCache::new(0, unbounded, Some(dir)));
    [first, second, pass_rate(pipe.clone().with_cache(Some(disk_only)))]
}

/// A dataset of `paths`, all labelled 0 (the loader needs no classes).
pub fn dataset_of(paths: Vec<std::path::PathBuf>) -> Dataset {
    Dataset {
        class_names: vec!["photos".into()],
        samples: paths.into_iter().map(|p| Sample { source: SampleSource::File(p), label: 0 }).collect(),
    }
}

/// One row of `bench loader --train-steps`: training on generated photos with augmentation on
/// the CPU workers or on the device.
#[derive(Clone, Debug, Serialize)]
pub struct AugmentTrainRow {
    /// Where augmentation ran: "CPU workers" or "device (WGSL)".
    pub augmentation: String,
    /// Micro-batch size.
    pub batch_size: usize,
    /// Steps timed (after the first, which compiles and autotunes).
    pub steps: usize,
    /// Training images per second over the timed steps.
    pub images_per_sec: f64,
    /// Mean seconds per timed step.
    pub step_secs: f64,
    /// Mean seconds per timed step spent waiting for the loader: the device idle for want of data.
    pub data_wait_secs_per_step: f64,
}

/// Trains `config` for `steps + 1` steps on `paths` (two alternating classes) twice, with
/// augmentation on the CPU workers and then on the device, after an untimed pass that fills a
/// decoded-image cache in `dir` (so both runs read the same cache and differ only in where they
/// augment). The first step of each run is not timed.
///
/// # Errors
/// [`Error::Device`] when the device does not run the kernel ([`crate::kernels::device_augment::runs_wgsl`]);
/// a training error as `train::train` returns it.
pub fn train_augment_comparison(
    paths: &[std::path::PathBuf],
    config: &Config,
    device: &SelectedDevice,
    steps: usize,
    dir: &Path,
) -> Result<Vec<AugmentTrainRow>> {
    if !crate::kernels::device_augment::runs_wgsl(&device.device) {
        return Err(Error::Device(format!(
            "{} does not run the augmentation kernel (a wgpu adapter does)",
            device.name
        )));
    }
    let samples: Vec<Sample> =
        paths.iter().enumerate().map(|(i, p)| Sample { source: SampleSource::File(p.clone()), label: i % 2 }).collect();
    let class_names = vec!["even".to_string(), "odd".to_string()];
    let splits = crate::data::dataset::Splits {
        train: Dataset { class_names: class_names.clone(), samples: samples.clone() },
        val: Dataset { class_names, samples: samples[..2.min(samples.len())].to_vec() },
        description: "generated photos".into(),
        report: Default::default(),
        root: dir.to_path_buf(),
        held_out: false,
        labels_csv: None,
    };
    let mut base = config.clone();
    base.data.cache_dir = dir.join("cache").display().to_string();
    base.train.grad_accum_steps = 1;
    let run = |name: &str, on_device: bool| -> Result<Vec<(f64, f64, usize)>> {
        let mut cfg = base.clone();
        cfg.augment.on_device = on_device;
        let mut req = crate::train::TrainRequest::new(cfg, dir.join(name));
        req.max_steps = Some(steps + 1);
        req.export = false;
        let mut timed = Vec::new();
        let mut sink = |e: crate::engine::events::Event| {
            if let crate::engine::events::Event::Step { images_per_sec, data_wait_secs, .. } = e {
                timed.push((images_per_sec, data_wait_secs, base.train.batch_size));
            }
        };
        crate::train::train(&req, device, &splits, &mut sink, &crate::engine::events::StopSignal::new())?;
        Ok(timed.into_iter().skip(1).collect())
    };
    run("warm-cache", false)?;
    let mut rows = Vec::new();
    for (label, on_device) in [("CPU workers", false), ("device (WGSL)", true)] {
        let timed = run(label, on_device)?;
        let n = timed.len().max(1) as f64;
        let step_secs = timed.iter().map(|(ips, _, b)| *b as f64 / ips.max(1e-9)).sum::<f64>() / n;
        rows.push(AugmentTrainRow {
            augmentation: label.into(),
            batch_size: base.train.batch_size,
            steps: timed.len(),
            images_per_sec: base.train.batch_size as f64 / step_secs.max(1e-9),
            step_secs,
            data_wait_secs_per_step: timed.iter().map(|(_, w, _)| w).sum::<f64>() / n,
        });
    }
    Ok(rows)
}

/// The rows of [`train_augment_comparison`] as a Markdown table.
pub fn augment_train_table(rows: &[AugmentTrainRow]) -> String {
    let mut s = String::from(
        "| augmentation | batch | steps timed | train img/s | s per step | s waiting for data per step |\n|---|---|---|---|---|---|",
    );
    for r in rows {
        s.push_str(&format!(
            "\n| {} | {} | {} | {:.2} | {:.2} | {:.3} |",
            r.augmentation, r.batch_size, r.steps, r.images_per_sec, r.step_secs, r.data_wait_secs_per_step
        ));
    }
    s
}

/// The rows as a Markdown table: milliseconds per image of each stage (decode at the scale
/// the geometry allows), the full-size decode + resize it replaces, images per second per
/// worker count without the cache, then the three cached passes.
pub fn table(rows: &[LoaderBenchRow]) -> String {
    let workers: Vec<usize> =
        rows.first().map(|r| r.images_per_sec.iter().map(|(w, _)| *w).collect()).unwrap_or_default();
    let mut s = String::from(
        "| images | mode | decode ms | resize ms | augment ms | normalize ms | upload ms | on-device augment ms | full decode + resize ms |",
    );
    for w in &workers {
        s.push_str(&format!(" img/s, {w} worker{} |", if *w == 1 { "" } else { "s" }));
    }
    s.push_str(" cached epoch 1 img/s | epoch 2 (RAM) | new run (disk) |\n|---|---|---|---|---|---|---|---|---|");
    s.push_str(&"---|".repeat(workers.len() + 3));
    for r in rows {
        let t = &r.ms_per_image;
        s.push_str(&format!(
            "\n| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3} | {} | {:.2} |",
            r.source,
            r.mode,
            t.decode,
            t.resize,
            t.augment,
            t.normalize,
            r.upload_ms_per_image,
            r.device_augment_ms_per_image.map_or("-".to_string(), |ms| format!("{ms:.3}")),
            r.full_decode_resize_ms
        ));
        for (_, ips) in &r.images_per_sec {
            s.push_str(&format!(" {ips:.0} |"));
        }
        for ips in r.cached_images_per_sec {
            s.push_str(&format!(" {ips:.0} |"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_photos_decode_at_their_size_and_timing_changes_no_pixel() {
        let dir = tempfile::tempdir().unwrap();
        let paths = write_photos(dir.path(), 320, 240, 2, 5).unwrap();
        let mut config = crate::config::presets::load_config("8gb").unwrap();
        config.set_all(&["data.preprocess.load_size=128".into(), "data.preprocess.crop_size=112".into()]).unwrap();
        let pipe = SamplePipeline::from_config(&config, true);
        for path in &paths {
            let img = pipe.decode(&SampleSource::File(path.clone())).unwrap();
            assert_eq!(img.dimensions(), (320, 240));
            assert!(!crate::data::image_io::is_flat(&img), "a gradient with noise, not a flat colour");
            let mut times = StageTimes::default();
            let seeded = || rand::rngs::SmallRng::seed_from_u64(9);
            let timed = pipe.tensor_from_image_timed(&img, &mut seeded(), &mut times).unwrap();
            assert_eq!(timed, pipe.tensor_from_image(&img, &mut seeded()).unwrap(), "timing changes nothing");
            assert_eq!((timed.1, timed.2), (112, 112));
            assert!(times.resize > 0.0 && times.normalize > 0.0 && times.augment >= 0.0, "{times:?}");
        }
    }
}
