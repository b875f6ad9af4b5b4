//! One sample's way from its source to a training or evaluation tensor ([`SamplePipeline`]):
//! decode (through the decoded-image cache), the preprocess geometry, augmentation and
//! normalization, with the seconds each stage took ([`StageTimes`]). The loader
//! ([`crate::data::loader`]) runs it on its worker threads, prediction on its images.

use std::sync::Arc;
use web_time::Instant;

use image::RgbImage;
use rand::rngs::SmallRng;

use crate::config::{AugmentConfig, Config};
use crate::data::augment;
use crate::data::dataset::SampleSource;
use crate::data::image_cache::ImageCache;
use crate::data::image_io::{self, LoadOptions};
use crate::data::preprocess::{PreprocessConfig, PreprocessMode};

/// Seconds spent in each stage of the input pipeline (summed over images).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct StageTimes {
    /// Reading and decoding the file to RGB.
    pub decode: f64,
    /// The preprocess geometry: resize and crop.
    pub resize: f64,
    /// Flip, colour jitter and random erasing.
    pub augment: f64,
    /// u8 to f32, mean and std.
    pub normalize: f64,
}

/// How one sample becomes a normalized `[3, H, W]` tensor.
#[derive(Clone, Debug)]
pub struct SamplePipeline {
    /// Geometry.
    pub preprocess: PreprocessConfig,
    /// Augmentation, `None` for evaluation and prediction.
    pub augment: Option<AugmentConfig>,
    /// Per-channel mean (after scaling to 0..1).
    pub mean: [f32; 3],
    /// Per-channel std.
    pub std: [f32; 3],
    /// Decoding options.
    pub load: LoadOptions,
    /// Decoded, resized images shared across epochs (training and evaluation share one).
    pub cache: Option<Arc<ImageCache>>,
    /// Batches go to the device as 8-bit crops with their drawn augmentation
    /// ([`Batch::packed`]); the training step runs `shaders/augment_rgb8.wgsl` on them. Set by
    /// [`Self::with_device_augment`].
    pub on_device: bool,
}

impl SamplePipeline {
    /// The pipeline of `config`, augmenting when `train` is true.
    pub fn from_config(config: &Config, train: bool) -> Self {
        Self {
            preprocess: config.data.preprocess.clone(),
            augment: train.then(|| config.augment.clone()),
            mean: config.data.mean,
            std: config.data.std,
            load: LoadOptions { max_pixels: config.data.max_image_pixels, alpha: config.data.alpha },
            cache: None,
            on_device: false,
        }
    }

    /// This pipeline handing batches to the device's augmentation kernel when `on_device`
    /// (the caller checks that the device runs it, [`crate::kernels::device_augment::runs_wgsl`]).
    #[must_use]
    pub fn with_device_augment(mut self, on_device: bool) -> Self {
        self.on_device = on_device;
        self
    }

    /// This pipeline reading image files through `cache`.
    #[must_use]
    pub fn with_cache(mut self, cache: Option<Arc<ImageCache>>) -> Self {
        self.cache = cache;
        self
    }

    /// What makes two pipelines' [`Self::resized`] images equal besides the file: the geometry
    /// and decoding options (the decoded-image cache's key includes it).
    pub fn cache_geometry(&self) -> String {
        let (p, l) = (&self.preprocess, &self.load);
        format!(
            "{} load {} crop {} alpha {} max_pixels {}",
            p.mode.name(),
            p.load_size,
            p.crop_size,
            l.alpha.name(),
            l.max_pixels
        )
    }

    /// The smallest side a decoded image needs for [`PreprocessConfig::resize_stage`] to give
    /// the same result (up to the scaled decoder's rounding) as from the full image: JPEGs twice
    /// as large decode at a reduced DCT scale ([`image_io::decode_image_scaled`]). Modes that
    /// crop the decoded image itself (`crop`, `none`) need the full size.
    pub fn decode_min_side(&self) -> u32 {
        let p = &self.preprocess;
        match p.mode {
            PreprocessMode::ResizeAndCrop | PreprocessMode::ScaleWidth | PreprocessMode::ScaleWidthAndCrop => {
                p.load_size.max(p.crop_size) as u32
            }
            PreprocessMode::Crop | PreprocessMode::None => u32::MAX,
        }
    }

    /// The sample decoded and passed through [`PreprocessConfig::resize_stage`] (the
    /// deterministic part of the geometry), from the cache when one is attached. Adds the
    /// seconds spent decoding and resizing to `times` (nothing on a cache hit).
    ///
    /// # Errors
    /// As [`Self::decode`]; a geometry failure is [`crate::Error::Preprocess`] naming the source.
    pub fn resized(&self, source: &SampleSource, times: &mut StageTimes) -> crate::Result<Arc<RgbImage>> {
        let mut make = || -> crate::Result<RgbImage> {
            let t = Instant::now();
            let img = self.decode_scaled(source)?;
            times.decode += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let resized = self.preprocess.resize_stage(&img).map_err(|e| in_source(source, e));
            times.resize += t.elapsed().as_secs_f64();
            resized
        };
        match (source, &self.cache) {
            (SampleSource::File(path), Some(cache)) => cache.get_or_insert_with(path, &self.cache_geometry(), make),
            _ => make().map(Arc::new),
        }
    }

    /// Decodes `source` to RGB.
    ///
    /// # Errors
    /// [`crate::Error::Image`] naming the file, with the typed [`image_io::ImageFault`].
    pub fn decode(&self, source: &SampleSource) -> crate::Result<RgbImage> {
        match source {
            SampleSource::File(path) => image_io::load_image(path, &self.load),
            SampleSource::Encoded { path, bytes } => image_io::decode_image(bytes, &self.load)
                .map_err(|fault| crate::Error::Image { path: path.clone(), fault }),
            SampleSource::Idx { images, index } => Ok(images.rgb_image(*index)),
        }
    }

    /// Decodes `source` to RGB at the smallest size the geometry needs ([`Self::decode_min_side`]:
    /// a large JPEG at a reduced DCT scale): what training and prediction feed the network.
    ///
    /// # Errors
    /// [`crate::Error::Image`] naming the file, with the typed [`image_io::ImageFault`].
    pub fn decode_scaled(&self, source: &SampleSource) -> crate::Result<RgbImage> {
        match source {
            SampleSource::File(path) => image_io::load_image_scaled(path, &self.load, self.decode_min_side()),
            SampleSource::Encoded { path, bytes } => {
                image_io::decode_image_scaled(bytes, &self.load, self.decode_min_side())
                    .map_err(|fault| crate::Error::Image { path: path.clone(), fault })
            }
            SampleSource::Idx { .. } => self.decode(source),
        }
    }

    /// Preprocesses, augments and normalizes a decoded image.
    /// Returns `([3, H, W] values, height, width)`.
    ///
    /// # Errors
    /// [`crate::Error::Preprocess`]: the geometry's reason (no file name).
    pub fn tensor_from_image(&self, img: &RgbImage, rng: &mut SmallRng) -> crate::Result<(Vec<f32>, usize, usize)> {
        self.tensor_from_image_timed(img, rng, &mut StageTimes::default())
    }

    /// [`Self::tensor_from_image`], adding the seconds each stage took to `times` (what
    /// `vramfit bench loader` reports).
    ///
    /// # Errors
    /// As [`Self::tensor_from_image`].
    pub fn tensor_from_image_timed(
        &self,
        img: &RgbImage,
        rng: &mut SmallRng,
        times: &mut StageTimes,
    ) -> crate::Result<(Vec<f32>, usize, usize)> {
        let t = Instant::now();
        let resized = self.preprocess.resize_stage(img)?;
        times.resize += t.elapsed().as_secs_f64();
        self.tensor_from_resized(&resized, rng, times)
    }

    /// [`Self::tensor_from_image_timed`] from the output of [`Self::resized`]: the crop,
    /// augmentation and normalization. Returns `([3, H, W] values, height, width)`.
    ///
    /// # Errors
    /// As [`Self::tensor_from_image`].
    pub fn tensor_from_resized(
        &self,
        resized: &RgbImage,
        rng: &mut SmallRng,
        times: &mut StageTimes,
    ) -> crate::Result<(Vec<f32>, usize, usize)> {
        let random_crop = self.augment.as_ref().is_some_and(|a| a.random_crop);
        let t = Instant::now();
        let img = self.preprocess.crop_stage(resized, random_crop, rng)?;
        times.resize += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let (w, h) = (img.width() as usize, img.height() as usize);
        let n = w * h;
        let mut chw = vec![0f32; 3 * n];
        for (i, p) in img.pixels().enumerate() {
            for c in 0..3 {
                chw[c * n + i] = p.0[c] as f32 / 255.0;
            }
        }
        times.normalize += t.elapsed().as_secs_f64();
        let t = Instant::now();
        if let Some(aug) = &self.augment {
            augment::before_normalize(&mut chw, h, w, aug, rng);
        }
        times.augment += t.elapsed().as_secs_f64();
        let t = Instant::now();
        for c in 0..3 {
            for v in &mut chw[c * n..(c + 1) * n] {
                *v = (*v - self.mean[c]) / self.std[c];
            }
        }
        times.normalize += t.elapsed().as_secs_f64();
        let t = Instant::now();
        if let Some(aug) = &self.augment {
            augment::random_erasing(&mut chw, h, w, aug.random_erasing, rng);
        }
        times.augment += t.elapsed().as_secs_f64();
        Ok((chw, h, w))
    }

    /// Decodes and transforms one sample.
    ///
    /// # Errors
    /// As [`Self::decode`]; a preprocess failure becomes [`crate::Error::Preprocess`] naming the source.
    pub fn load(&self, source: &SampleSource, rng: &mut SmallRng) -> crate::Result<(Vec<f32>, usize, usize)> {
        let mut times = StageTimes::default();
        let resized = self.resized(source, &mut times)?;
        self.tensor_from_resized(&resized, rng, &mut times).map_err(|e| in_source(source, e))
    }
}

/// A preprocess failure of one sample, naming the sample.
pub(crate) fn in_source(source: &SampleSource, e: crate::Error) -> crate::Error {
    match e {
        crate::Error::Preprocess(m) => {
            crate::Error::Preprocess(format!("{}: {m} (data.preprocess)", source.describe()))
        }
        other => other,
    }
}
