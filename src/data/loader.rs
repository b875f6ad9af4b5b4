//! Turning samples into batches: decode, preprocess, augment and normalize on worker threads,
//! with a bounded prefetch queue so host memory stays bounded for any dataset size.
//!
//! This file and `image_io::load_image` are where the engine touches threads and files; the
//! training loop only sees an iterator of [`Batch`]es.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, sync_channel};

use image::RgbImage;
use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::data::batch::{Batch, PackedImages};
use crate::data::dataset::{Dataset, SampleSource};
use crate::data::pipeline::{SamplePipeline, StageTimes, in_source};
use crate::data::preprocess::PreprocessConfig;
use crate::kernels::device_augment::{self, AugmentParams, ImageAugment};

/// Builds batch `b` of `pass` (its `order` indexes `dataset`): each sample decoded (or read from
/// the cache), resized and cropped, then augmented and normalized here, or (the pipeline runs
/// [`SamplePipeline::on_device`]) packed as 8-bit pixels with its drawn augmentation for the
/// device. A sample whose output size differs from the batch's first is skipped with the reason
/// on both paths.
fn build_batch(dataset: &Dataset, pipeline: &SamplePipeline, pass: &Pass, b: usize) -> Batch {
    let (order, batch_size, seed) = (&pass.order, pass.batch_size, pass.seed);
    let mut batch = Batch::default();
    let start = b * batch_size;
    let mut crops: Vec<(usize, RgbImage, ImageAugment)> = Vec::new();
    for (offset, &i) in order[start..(start + batch_size).min(order.len())].iter().enumerate() {
        let sample = &dataset.samples[i];
        // A pass that repeats samples draws each occurrence's augmentation apart.
        let key = if pass.repeats { start + offset } else { i };
        let mut rng = sample_rng(seed, key);
        let mut times = StageTimes::default();
        let made = pipeline.resized(&sample.source, &mut times).and_then(|img| {
            if crate::data::image_io::is_flat(&img) {
                batch.flat.push(sample.source.describe());
            }
            let made = match pipeline.on_device {
                true => device_crop(pipeline, &img, &mut rng).map(Made::Device),
                false => {
                    pipeline.tensor_from_resized(&img, &mut rng, &mut times).map(|(chw, h, w)| Made::Cpu(chw, h, w))
                }
            };
            made.map_err(|e| in_source(&sample.source, e))
        });
        let made = match made {
            Ok(made) => made,
            Err(reason) => {
                batch.skipped.push((sample.source.describe(), reason.to_string()));
                continue;
            }
        };
        let (h, w) = made.size();
        if batch.labels.is_empty() {
            (batch.height, batch.width) = (h, w);
        } else if (h, w) != (batch.height, batch.width) {
            batch.skipped.push((
                sample.source.describe(),
                format!("is {w}x{h} after preprocess but the batch is {}x{}; mode `none` needs equal sizes, use resize_and_crop", batch.width, batch.height),
            ));
            continue;
        }
        batch.labels.push(sample.label as i64);
        batch.indices.push(i);
        match made {
            Made::Cpu(chw, ..) => batch.images.extend_from_slice(&chw),
            Made::Device((crop, augment)) => crops.push((key, crop, augment)),
        }
    }
    if !crops.is_empty() {
        pack_for_device(pipeline, crops, seed, &mut batch);
    }
    batch
}

/// One sample as [`build_batch`] made it.
enum Made {
    /// `[3, h, w]` normalized values, `h`, `w`.
    Cpu(Vec<f32>, usize, usize),
    /// The crop (8-bit) and the augmentation the device applies to it.
    Device((RgbImage, ImageAugment)),
}

impl Made {
    /// `(height, width)` of the sample's output.
    fn size(&self) -> (usize, usize) {
        match self {
            Made::Cpu(_, h, w) => (*h, *w),
            Made::Device((crop, _)) => (crop.height() as usize, crop.width() as usize),
        }
    }
}

/// The crop of a resized image and the rest of its augmentation, drawn from `rng` as the CPU
/// path draws them ([`AugmentParams::draw`]). The crop is cut here, an 8-bit copy, so a batch
/// uploads only its output pixels whatever the mode (a 12 MP source in mode `crop` is 48 MB as
/// packed pixels), and the device only flips, jitters, normalizes and erases (crop origin 0).
///
/// # Errors
/// As [`crate::data::preprocess::PreprocessConfig::crop_origin`].
fn device_crop(
    pipeline: &SamplePipeline,
    resized: &RgbImage,
    rng: &mut SmallRng,
) -> crate::Result<(RgbImage, ImageAugment)> {
    let (w, h) = resized.dimensions();
    let augment = AugmentParams::draw(&pipeline.preprocess, pipeline.augment.as_ref(), (w, h), rng)?;
    let (out_w, out_h) = pipeline.preprocess.output_size_for((w, h))?;
    let crop = if (w, h) == (out_w, out_h) {
        resized.clone()
    } else {
        let (x, y) = augment.crop_origin;
        image::imageops::crop_imm(resized, x, y, out_w, out_h).to_image()
    };
    Ok((crop, ImageAugment { crop_origin: (0, 0), ..augment }))
}

/// Packs the batch's `crops` (one size, the batch's) for the device into `batch.packed`. When
/// the kernel refuses them ([`AugmentParams::new`]: over 65535 images or its 32-bit indices,
/// which the planner's buffer-limit check already rules out in training), the crops go through
/// the CPU path instead, each with its generator drawn again: a crop is already its output size,
/// so its draws are the ones the device would have used.
fn pack_for_device(
    pipeline: &SamplePipeline,
    crops: Vec<(usize, RgbImage, ImageAugment)>,
    seed: u64,
    batch: &mut Batch,
) {
    let out = (batch.height, batch.width);
    let packed = PackedImages {
        pixels: crops.iter().flat_map(|(_, crop, _)| device_augment::pack_rgb8(crop.as_raw())).collect(),
        augments: crops.iter().map(|(_, _, a)| *a).collect(),
    };
    if packed.params(out, pipeline.mean, pipeline.std).is_ok() {
        batch.packed = Some(packed);
        return;
    }
    for (i, crop, _) in crops {
        let elems = 3 * crop.width() as usize * crop.height() as usize;
        // A crop is its output size, so the geometry cannot fail here; zeros keep the labels
        // aligned if it ever did.
        let chw = pipeline
            .tensor_from_resized(&crop, &mut sample_rng(seed, i), &mut StageTimes::default())
            .map_or_else(|_| vec![0.0; elems], |(chw, ..)| chw);
        batch.images.extend_from_slice(&chw);
    }
}

/// The generator of sample `i` in a pass of `seed`: it depends on the two alone, not on the
/// thread, the batch or the path (CPU or device) that uses it.
fn sample_rng(seed: u64, i: usize) -> SmallRng {
    SmallRng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// Iterator over the batches of one pass, in order, built by worker threads (or, without
/// them, [`batches_on_this_thread`]).
pub struct BatchIter {
    rx: Receiver<(usize, Batch)>,
    pending: BTreeMap<usize, Batch>,
    next: usize,
    end: usize,
    /// The pass, when its batches are built on the iterating thread.
    inline: Option<(Arc<Dataset>, Arc<SamplePipeline>, Pass)>,
}

impl Iterator for BatchIter {
    type Item = Batch;
    fn next(&mut self) -> Option<Batch> {
        if self.next >= self.end {
            return None;
        }
        if let Some((dataset, pipeline, pass)) = &self.inline {
            let batch = build_batch(dataset, pipeline, pass, self.next);
            self.next += 1;
            return Some(batch);
        }
        loop {
            if let Some(b) = self.pending.remove(&self.next) {
                self.next += 1;
                return Some(b);
            }
            let (i, b) = self.rx.recv().ok()?;
            self.pending.insert(i, b);
        }
    }
}

/// For preprocess modes without a fixed output size (`none`), checks that the dataset's images
/// give one training size: up to 256 files, evenly spaced, reading only their headers. Files
/// that cannot be read are left to the loader, which skips them with their reason.
///
/// Returns the one training size `(height, width)` in pixels of mode `none` (`None` for modes
/// with a fixed output size, or when no header could be read).
///
/// # Errors
/// [`Error::Preprocess`] naming two files whose sizes differ and the setting that fixes it.
pub fn check_sizes_agree(dataset: &Dataset, p: &PreprocessConfig) -> crate::Result<Option<(usize, usize)>> {
    if p.output_size().is_some() {
        return Ok(None);
    }
    // The image files with their sources, whether on disk or in memory.
    let files: Vec<(&std::path::Path, &SampleSource)> = dataset
        .samples
        .iter()
        .filter_map(|s| match &s.source {
            SampleSource::File(path) | SampleSource::Encoded { path, .. } => Some((path.as_path(), &s.source)),
            SampleSource::Idx { .. } => None,
        })
        .collect();
    let header_size = |source: &SampleSource| -> Option<(u32, u32)> {
        match source {
            SampleSource::File(path) => {
                image::ImageReader::open(path).ok()?.with_guessed_format().ok()?.into_dimensions().ok()
            }
            SampleSource::Encoded { bytes, .. } => image::ImageReader::new(std::io::Cursor::new(&bytes[..]))
                .with_guessed_format()
                .ok()?
                .into_dimensions()
                .ok(),
            SampleSource::Idx { .. } => None,
        }
    };
    // (source size, output size, file) of the first readable image.
    type Sized<'a> = ((u32, u32), (u32, u32), &'a std::path::Path);
    let mut first: Option<Sized> = None;
    for &(file, source) in files.iter().step_by((files.len() / 256).max(1)) {
        let Some(src) = header_size(source) else { continue };
        let Ok(out) = p.output_size_for(src) else { continue };
        match first {
            None => first = Some((src, out, file)),
            Some((src0, out0, file0)) if out0 != out => {
                return Err(crate::Error::Preprocess(format!(
                    "mode `none` trains each image at its own size, but {} is {}x{} and {} is {}x{}; \
                     set data.preprocess.mode = \"resize_and_crop\" with a load_size and crop_size (--preprocess resize_and_crop --load-size 256 --crop-size 224)",
                    file0.display(),
                    src0.0,
                    src0.1,
                    file.display(),
                    src.0,
                    src.1
                )));
            }
            Some(_) => {}
        }
    }
    Ok(first.map(|(_, (w, h), _)| (h as usize, w as usize)))
}

/// Number of worker threads for `requested` (0 = automatic).
pub fn worker_count(requested: usize) -> usize {
    if requested > 0 {
        return requested;
    }
    std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 4)
}

/// One pass over a dataset: which samples in which order, in batches of `batch_size`, from
/// batch `skip_batches` on (a resumed epoch), with `seed` fixing every random choice of the
/// pass (crop, flip, jitter, erasing) independently of thread timing.
#[derive(Clone, Debug)]
pub struct Pass {
    /// Indices into the dataset, in the order batches take them.
    pub order: Arc<Vec<usize>>,
    /// Samples per batch.
    pub batch_size: usize,
    /// Batches already done (not built again).
    pub skip_batches: usize,
    /// The pass's random seed.
    pub seed: u64,
    /// The order may hold a sample more than once ([`Self::class_balanced_epoch`]): each
    /// occurrence's random choices are keyed by its position, not by the sample.
    pub repeats: bool,
}

impl Pass {
    /// Every sample of a dataset of `len` in order, from the first batch.
    pub fn in_order(len: usize, batch_size: usize, seed: u64) -> Self {
        Self { order: Arc::new((0..len).collect()), batch_size, skip_batches: 0, seed, repeats: false }
    }

    /// Training epoch `epoch` of a run seeded `seed` over a dataset of `len`: the samples shuffled
    /// by `seed + epoch`, the pass seeded `seed ^ (epoch << 32)`, from batch `skip_batches`.
    pub fn training_epoch(len: usize, batch_size: usize, seed: u64, epoch: u64, skip_batches: usize) -> Self {
        use rand::SeedableRng;
        use rand::seq::SliceRandom;
        let mut order: Vec<usize> = (0..len).collect();
        order.shuffle(&mut SmallRng::seed_from_u64(seed.wrapping_add(epoch)));
        Self { order: Arc::new(order), batch_size, skip_batches, seed: seed ^ (epoch << 32), repeats: false }
    }

    /// Training epoch `epoch` drawn class-balanced (`data.sampler = "balanced"`,
    /// [`crate::config::Sampler::Balanced`]): `labels.len()` draws, each a class chosen uniformly
    /// among those with samples, then one of its samples uniformly (with replacement), by `seed +
    /// epoch`; seeded and resumable as [`Self::training_epoch`].
    pub fn class_balanced_epoch(
        labels: &[usize],
        batch_size: usize,
        seed: u64,
        epoch: u64,
        skip_batches: usize,
    ) -> Self {
        use rand::{Rng, SeedableRng};
        let mut by_class: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, &label) in labels.iter().enumerate() {
            by_class.entry(label).or_default().push(i);
        }
        let classes: Vec<&Vec<usize>> = by_class.values().collect();
        let mut rng = SmallRng::seed_from_u64(seed.wrapping_add(epoch));
        let order = (0..labels.len())
            .map(|_| {
                let members = classes[rng.random_range(0..classes.len())];
                members[rng.random_range(0..members.len())]
            })
            .collect();
        Self { order: Arc::new(order), batch_size, skip_batches, seed: seed ^ (epoch << 32), repeats: true }
    }
}

/// Starts `pass` on `workers` threads (0 = automatic, [`worker_count`]) that build up to
/// `prefetch` batches ahead. Batches arrive in order; dropping the iterator stops the workers
/// after their current batch.
pub fn batches(
    dataset: Arc<Dataset>,
    pipeline: Arc<SamplePipeline>,
    pass: Pass,
    workers: usize,
    prefetch: usize,
) -> BatchIter {
    let n_batches = pass.order.len().div_ceil(pass.batch_size.max(1));
    let skip_batches = pass.skip_batches;
    let pass = Arc::new(pass);
    let (tx, rx) = sync_channel(prefetch.max(1));
    let counter = Arc::new(AtomicUsize::new(skip_batches));
    let mut spawned_any = false;
    for w in 0..worker_count(workers).min(n_batches.saturating_sub(skip_batches)).max(1) {
        let (tx, counter, dataset, pipeline, pass) =
            (tx.clone(), counter.clone(), dataset.clone(), pipeline.clone(), pass.clone());
        let spawned = std::thread::Builder::new().name(format!("vramfit-loader-{w}")).spawn(move || {
            loop {
                let b = counter.fetch_add(1, Ordering::Relaxed);
                if b >= n_batches {
                    break;
                }
                let batch = build_batch(&dataset, &pipeline, &pass, b);
                if tx.send((b, batch)).is_err() {
                    break;
                }
            }
        });
        if spawned.is_err() {
            break;
        }
        spawned_any = true;
    }
    if !spawned_any {
        return batches_on_this_thread(dataset, pipeline, Arc::unwrap_or_clone(pass));
    }
    BatchIter { rx, pending: BTreeMap::new(), next: skip_batches, end: n_batches, inline: None }
}

/// `pass` built batch by batch on the thread that iterates, as each is asked for: where no
/// thread can be started (a browser; a system out of threads, where [`batches`] falls back to
/// it). The batches are the ones the workers would build: each depends only on the pass.
pub fn batches_on_this_thread(dataset: Arc<Dataset>, pipeline: Arc<SamplePipeline>, pass: Pass) -> BatchIter {
    let end = pass.order.len().div_ceil(pass.batch_size.max(1));
    let (_, rx) = sync_channel(0);
    BatchIter { rx, pending: BTreeMap::new(), next: pass.skip_batches, end, inline: Some((dataset, pipeline, pass)) }
}

#[cfg(test)]
mod tests;
