//! Load-time geometry: the preprocess modes of the pix2pix/CycleGAN codebases, fitted so that
//! every sample of a batch has one shape.
//!
//! | mode | what happens | 300x100 source, load 256, crop 224 |
//! |---|---|---|
//! | `resize_and_crop` | resize to load_size x load_size, crop crop_size (random in training, center otherwise) | 224x224 |
//! | `crop` | crop crop_size from the source as is; sources smaller than crop_size are an error | 224x100 is too small: error |
//! | `scale_width` | width to crop_size, aspect kept, height center-cropped or padded to crop_size | 224x224 (content 224x75, padded) |
//! | `scale_width_and_crop` | width to load_size, height max(aspect height, crop_size), then crop crop_size (as CycleGAN) | 224x224 |
//! | `none` | source size rounded down to a multiple of 4 (never below 4); all images must share it | 300x100 |
//!
//! Differences from CycleGAN, so that a batch has one shape: `scale_width` pads/crops the height
//! to a square, and `none` requires every image of the dataset to round to the same size.

use image::{RgbImage, imageops::FilterType};
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::engine::error::{Error, Result};

/// Preprocess mode names as in the pix2pix/CycleGAN `--preprocess` flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PreprocessMode {
    /// Resize to `load_size` square, then crop `crop_size`.
    ResizeAndCrop,
    /// Crop `crop_size` from the source.
    Crop,
    /// Width to `crop_size` keeping the aspect, height fitted to `crop_size`.
    ScaleWidth,
    /// Width to `load_size` keeping the aspect (height at least `crop_size`), then crop `crop_size`.
    ScaleWidthAndCrop,
    /// No resizing; sizes rounded down to a multiple of 4.
    None,
}

impl PreprocessMode {
    /// Every mode, in the order the app lists them.
    pub const ALL: [PreprocessMode; 5] = [
        PreprocessMode::ResizeAndCrop,
        PreprocessMode::Crop,
        PreprocessMode::ScaleWidth,
        PreprocessMode::ScaleWidthAndCrop,
        PreprocessMode::None,
    ];

    /// The config name, e.g. `resize_and_crop`.
    pub fn name(self) -> &'static str {
        match self {
            PreprocessMode::ResizeAndCrop => "resize_and_crop",
            PreprocessMode::Crop => "crop",
            PreprocessMode::ScaleWidth => "scale_width",
            PreprocessMode::ScaleWidthAndCrop => "scale_width_and_crop",
            PreprocessMode::None => "none",
        }
    }
}

/// Geometry settings (`[data.preprocess]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PreprocessConfig {
    /// The mode.
    pub mode: PreprocessMode,
    /// Size in pixels images are scaled to before cropping.
    pub load_size: usize,
    /// Side in pixels of the square the network sees.
    pub crop_size: usize,
}

impl Default for PreprocessConfig {
    fn default() -> Self {
        Self { mode: PreprocessMode::ResizeAndCrop, load_size: 256, crop_size: 224 }
    }
}

/// Size of a `none`-mode image: rounded down to a multiple of 4, never below 4.
pub fn round_to_multiple_of_4(px: u32) -> u32 {
    (px / 4 * 4).max(4)
}

impl PreprocessConfig {
    /// Checks the sizes; the message names the key.
    ///
    /// # Errors
    /// A message when a size is out of 4..=4096 or `crop_size > load_size` in a mode that crops
    /// after loading.
    pub fn validate(&self) -> Result<()> {
        if !(4..=4096).contains(&self.crop_size) {
            return Err(Error::Preprocess("data.preprocess.crop_size must be in 4..=4096 pixels".into()));
        }
        if !(4..=8192).contains(&self.load_size) {
            return Err(Error::Preprocess("data.preprocess.load_size must be in 4..=8192 pixels".into()));
        }
        if matches!(self.mode, PreprocessMode::ResizeAndCrop | PreprocessMode::ScaleWidthAndCrop)
            && self.crop_size > self.load_size
        {
            return Err(Error::Preprocess(format!(
                "data.preprocess.crop_size ({}) must not exceed load_size ({}) in mode {}",
                self.crop_size,
                self.load_size,
                self.mode.name()
            )));
        }
        Ok(())
    }

    /// The fixed `(width, height)` in pixels every sample has, or `None` for mode `none`,
    /// where it is the (rounded) size of the dataset's images.
    pub fn output_size(&self) -> Option<(u32, u32)> {
        let c = self.crop_size as u32;
        match self.mode {
            PreprocessMode::None => None,
            _ => Some((c, c)),
        }
    }

    /// Output `(width, height)` for a source of `src` pixels, or why that source cannot be used.
    ///
    /// # Errors
    /// A message naming the source size and the setting (the caller adds the file name).
    pub fn output_size_for(&self, src: (u32, u32)) -> Result<(u32, u32)> {
        let (w, h) = src;
        if w == 0 || h == 0 {
            return Err(Error::Preprocess(format!("image is {w}x{h}: nothing to train on")));
        }
        match self.mode {
            PreprocessMode::Crop => {
                let c = self.crop_size as u32;
                if w < c || h < c {
                    return Err(Error::Preprocess(format!(
                        "image is {w}x{h}, smaller than data.preprocess.crop_size {c} in mode crop; \
                         use mode resize_and_crop or a smaller crop_size"
                    )));
                }
                Ok((c, c))
            }
            PreprocessMode::None => Ok((round_to_multiple_of_4(w), round_to_multiple_of_4(h))),
            _ => Ok(self.output_size().unwrap_or((w, h))),
        }
    }

    /// Applies the geometry to one decoded image: [`Self::resize_stage`], then
    /// [`Self::crop_stage`].
    ///
    /// `rng` chooses crop positions when `random_crop` is true (training); otherwise crops are
    /// centered (evaluation and prediction).
    ///
    /// # Errors
    /// As [`Self::output_size_for`].
    pub fn apply(&self, img: &RgbImage, random_crop: bool, rng: &mut impl Rng) -> Result<RgbImage> {
        self.crop_stage(&self.resize_stage(img)?, random_crop, rng)
    }

    /// The deterministic part of the geometry (no random choice): the image scaled to
    /// `load_size` as the mode says, before any crop. This is what the decoded-image cache
    /// keeps (`image_cache`), so later epochs only crop and augment.
    ///
    /// | mode | result |
    /// |---|---|
    /// | `resize_and_crop` | `load_size` x `load_size` |
    /// | `scale_width_and_crop` | `load_size` x `max(load_size * h / w, crop_size)` |
    /// | `scale_width` | `crop_size` x `crop_size`: width scaled, height center-cropped or padded with gray |
    /// | `crop`, `none` | the image as decoded (`none` scales images under 4 px up to 4) |
    ///
    /// # Errors
    /// As [`Self::output_size_for`].
    pub fn resize_stage(&self, img: &RgbImage) -> Result<RgbImage> {
        let (w, h) = img.dimensions();
        let (out_w, out_h) = self.output_size_for((w, h))?;
        let load = self.load_size as u32;
        Ok(match self.mode {
            PreprocessMode::ResizeAndCrop => resize(img, load, load),
            PreprocessMode::Crop => img.clone(),
            PreprocessMode::ScaleWidth => {
                let new_h = ((h as f64 * out_w as f64 / w as f64).round() as u32).max(1);
                fit_height(&resize(img, out_w, new_h), out_h)
            }
            PreprocessMode::ScaleWidthAndCrop => {
                // CycleGAN's __scale_width: height = max(load * h / w, crop_size).
                let new_h = ((load as f64 * h as f64 / w as f64).round() as u32).max(self.crop_size as u32);
                resize(img, load, new_h)
            }
            // Smaller than the output (under 4 pixels on a side): scale up so nothing is zero-sized.
            PreprocessMode::None if w < out_w || h < out_h => resize(img, out_w, out_h),
            PreprocessMode::None => img.clone(),
        })
    }

    /// The random part of the geometry on the output of [`Self::resize_stage`]: the crop to the
    /// output size, at a random position when `random_crop` is true, else centered.
    ///
    /// # Errors
    /// As [`Self::output_size_for`].
    pub fn crop_stage(&self, resized: &RgbImage, random_crop: bool, rng: &mut impl Rng) -> Result<RgbImage> {
        let (out_w, out_h) = self.output_size_for(resized.dimensions())?;
        let (x, y) = self.crop_origin(resized.dimensions(), random_crop, rng)?;
        if resized.dimensions() == (out_w, out_h) {
            return Ok(resized.clone());
        }
        Ok(image::imageops::crop_imm(resized, x, y, out_w, out_h).to_image())
    }

    /// Top-left corner `(x, y)` of the crop [`Self::crop_stage`] takes from a resized image of
    /// `resized` `(width, height)`. The cropping modes draw the corner from `rng` even when the
    /// image is already the output size (a draw of 0), so a run's random stream does not depend
    /// on image sizes; `scale_width` and an exact-size `none` image draw nothing.
    ///
    /// # Errors
    /// As [`Self::output_size_for`].
    pub fn crop_origin(&self, resized: (u32, u32), random_crop: bool, rng: &mut impl Rng) -> Result<(u32, u32)> {
        let (rw, rh) = resized;
        let (out_w, out_h) = self.output_size_for(resized)?;
        let exact = (rw, rh) == (out_w, out_h);
        if self.mode == PreprocessMode::ScaleWidth || (self.mode == PreprocessMode::None && exact) {
            return Ok((0, 0));
        }
        Ok(if random_crop {
            (rng.random_range(0..=rw - out_w), rng.random_range(0..=rh - out_h))
        } else {
            ((rw - out_w) / 2, (rh - out_h) / 2)
        })
    }
}

fn resize(img: &RgbImage, w: u32, h: u32) -> RgbImage {
    if img.dimensions() == (w, h) {
        return img.clone();
    }
    image::imageops::resize(img, w, h, FilterType::Triangle)
}

/// Center-crops or pads (with mid-gray) the height of `img` to `target_h`.
fn fit_height(img: &RgbImage, target_h: u32) -> RgbImage {
    let (w, h) = img.dimensions();
    if h >= target_h {
        return image::imageops::crop_imm(img, 0, (h - target_h) / 2, w, target_h).to_image();
    }
    let mut out = RgbImage::from_pixel(w, target_h, image::Rgb([128, 128, 128]));
    image::imageops::overlay(&mut out, img, 0, ((target_h - h) / 2) as i64);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn cfg(mode: PreprocessMode) -> PreprocessConfig {
        PreprocessConfig { mode, load_size: 256, crop_size: 224 }
    }

    #[test]
    fn every_mode_gives_its_documented_size() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let src = RgbImage::new(300, 100);
        let out = |m| cfg(m).apply(&src, true, &mut rng.clone()).map(|i| i.dimensions()).map_err(|e| e.to_string());
        assert_eq!(out(PreprocessMode::ResizeAndCrop), Ok((224, 224)));
        assert!(out(PreprocessMode::Crop).unwrap_err().contains("300x100"));
        assert_eq!(out(PreprocessMode::ScaleWidth), Ok((224, 224)));
        assert_eq!(out(PreprocessMode::ScaleWidthAndCrop), Ok((224, 224)));
        assert_eq!(out(PreprocessMode::None), Ok((300, 100)));
        let big = RgbImage::new(500, 400);
        assert_eq!(cfg(PreprocessMode::Crop).apply(&big, false, &mut rng).unwrap().dimensions(), (224, 224));
    }

    #[test]
    fn none_never_yields_zero_size() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        for (w, h, want) in [(1, 1, (4, 4)), (37, 23, (36, 20)), (255, 255, (252, 252)), (3, 9, (4, 8))] {
            let img = RgbImage::new(w, h);
            assert_eq!(cfg(PreprocessMode::None).apply(&img, false, &mut rng).unwrap().dimensions(), want);
        }
    }

    #[test]
    fn center_crop_is_centered() {
        let mut img = RgbImage::new(8, 8);
        img.put_pixel(4, 4, image::Rgb([255, 0, 0]));
        let c = PreprocessConfig { mode: PreprocessMode::Crop, load_size: 8, crop_size: 4 };
        let mut rng = rand::rngs::SmallRng::seed_from_u64(0);
        let out = c.apply(&img, false, &mut rng).unwrap();
        assert_eq!(out.get_pixel(2, 2).0, [255, 0, 0]);
    }
}
