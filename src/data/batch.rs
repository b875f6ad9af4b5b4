//! A batch on the host (normalized pixels, or 8-bit crops for the device's augmentation
//! kernel, with its labels and the samples it skipped) and its one way onto a device.

use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::kernels::device_augment::{AugmentParams, ImageAugment};

/// Host images `[n, 3, h, w]` (normalized f32, row-major) as a device tensor: the one upload of
/// images for training, evaluation and prediction.
///
/// # Panics
/// When `values.len()` is not `n * 3 * h * w` (the callers build the vector from those dims).
pub fn image_tensor(values: Vec<f32>, n: usize, (h, w): (usize, usize), device: &Device) -> Tensor<4> {
    Tensor::<4>::from_data(TensorData::new(values, [n, 3, h, w]), device)
}

/// Class indices `[n]` as a device tensor.
pub fn label_tensor(labels: Vec<i64>, device: &Device) -> Tensor<1, Int> {
    let n = labels.len();
    Tensor::<1, Int>::from_data(TensorData::new(labels, [n]), device)
}

/// One batch on the host.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// `[batch, 3, height, width]` normalized pixels, row-major.
    pub images: Vec<f32>,
    /// `[batch]` class indices.
    pub labels: Vec<i64>,
    /// `[batch]` each image's index in its dataset (evaluation keeps its per-image results by it).
    pub indices: Vec<usize>,
    /// Height in pixels.
    pub height: usize,
    /// Width in pixels.
    pub width: usize,
    /// Samples skipped while building this batch: (source, reason).
    pub skipped: Vec<(String, String)>,
    /// Samples that decoded to one flat colour (trained on, but worth a warning): sources.
    pub flat: Vec<String>,
    /// The batch as 8-bit crops for the device's augmentation kernel
    /// ([`SamplePipeline::on_device`]); `images` is then empty and the training step augments
    /// and normalizes on the device ([`crate::kernels::device_augment`]).
    pub packed: Option<PackedImages>,
}

/// A batch's crops (each the batch's `height` x `width`) before augmentation and normalization,
/// as [`crate::kernels::device_augment::augment_batch`] takes them.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedImages {
    /// `[batch, height, width]` pixels packed by [`crate::kernels::device_augment::pack_rgb8`].
    pub pixels: Vec<u32>,
    /// Each image's flip, jitter and erasing (crop origin 0: the loader cut the crop), drawn on
    /// the CPU from the sample's generator as the CPU path draws them.
    pub augments: Vec<ImageAugment>,
}

impl PackedImages {
    /// The kernel's parameters for these crops of `hw` `(height, width)`, normalized with `mean`
    /// and `std`.
    ///
    /// # Errors
    /// As [`AugmentParams::new`].
    pub fn params(&self, hw: (usize, usize), mean: [f32; 3], std: [f32; 3]) -> crate::Result<AugmentParams> {
        AugmentParams::new(&self.augments, hw, hw, mean, std)
    }
}

impl Batch {
    /// Splits a host batch into `factor` nearly equal pieces (fewer if the batch is smaller).
    pub fn split(&self, factor: usize) -> Vec<Batch> {
        let n = self.len();
        if n == 0 {
            // Every file of the batch failed to decode: nothing to run (an empty tensor would crash
            // GroupNorm). The step counts no images and the loop moves on.
            return vec![];
        }
        if factor <= 1 || n <= 1 {
            return vec![Batch { skipped: vec![], flat: vec![], ..self.clone() }];
        }
        let per = n.div_ceil(factor.min(n));
        let elems = 3 * self.height * self.width;
        (0..n)
            .step_by(per)
            .map(|start| {
                let end = (start + per).min(n);
                let plane = self.height * self.width;
                let packed = self.packed.as_ref().map(|p| PackedImages {
                    pixels: p.pixels[start * plane..end * plane].to_vec(),
                    augments: p.augments[start..end].to_vec(),
                });
                Batch {
                    images: if packed.is_some() { vec![] } else { self.images[start * elems..end * elems].to_vec() },
                    labels: self.labels[start..end].to_vec(),
                    // A batch made by hand (benchmarks' synthetic batches) may carry none.
                    indices: self.indices.get(start..end).map(<[usize]>::to_vec).unwrap_or_default(),
                    height: self.height,
                    width: self.width,
                    skipped: vec![],
                    flat: vec![],
                    packed,
                }
            })
            .collect()
    }

    /// Number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when every sample was skipped.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

impl Batch {
    /// The batch on `device`: images `[B, 3, H, W]` and labels `[B]` ([`image_tensor`],
    /// [`label_tensor`]); a packed batch's images are the training step's to upload.
    pub fn into_tensors(self, device: &Device) -> (Tensor<4>, Tensor<1, Int>) {
        let n = self.len();
        (image_tensor(self.images, n, (self.height, self.width), device), label_tensor(self.labels, device))
    }
}
