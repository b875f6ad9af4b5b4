//! One micro-batch's forward and backward pass, whichever device of the run computes it: its
//! inputs on the device, its loss and gradients ([`PassSettings`]).

use burn::optim::GradientsParams;
use burn::tensor::{Device, Int, Tensor};

use crate::config::Precision;
use crate::data::batch::{Batch, label_tensor};
use crate::engine::error::Result;
use crate::model::Classifier;
use crate::train::step::weighted_smoothed_cross_entropy;

/// What every micro-batch pass of one step needs besides its images, whichever device runs it:
/// owned, so a replica's thread can take a copy ([`data_parallel::spawn_share`]).
#[derive(Clone)]
pub(crate) struct PassSettings {
    /// `data.*`: the normalization of a packed batch.
    pub(crate) data: crate::config::DataConfig,
    pub(crate) precision: Precision,
    /// The f16 loss scale (1 in f32).
    pub(crate) scale: f32,
    pub(crate) label_smoothing: f32,
    /// Images in the whole step (each loss is weighted by its micro-batch's share of them).
    pub(crate) total: usize,
    /// Each class's loss weight `[C]`; `None`: all 1.
    pub(crate) class_weights: Option<Vec<f32>>,
    /// `memory.cap_to_budget`'s cap in bytes reserved, each device's ([`super::step::over_cap`]).
    pub(crate) memory_cap: Option<u64>,
}

impl PassSettings {
    /// A micro-batch's images `[n, 3, h, w]` and labels `[n]` on `ad_device` (`device` with
    /// autodiff): uploaded as normalized f32, or (a packed batch, [`Batch::packed`]) uploaded
    /// as 8-bit pixels and cropped, augmented and normalized by `shaders/augment_rgb8.wgsl`. The
    /// kernel's output is a constant of the graph (no gradient), made on the inner device and
    /// then given the training device's autodiff strategy.
    ///
    /// # Errors
    /// As [`crate::kernels::device_augment::augment_batch`].
    pub(crate) fn inputs(
        &self,
        mut batch: Batch,
        device: &Device,
        ad_device: &Device,
    ) -> Result<(Tensor<4>, Tensor<1, Int>)> {
        let Some(packed) = batch.packed.take() else { return Ok(batch.into_tensors(ad_device)) };
        let params = packed.params((batch.height, batch.width), self.data.mean, self.data.std)?;
        let images = crate::kernels::device_augment::augment_batch(packed.pixels, params, device)?;
        // On the training device, with its checkpointing strategy (operands must share one).
        let images = match ad_device.gradient_checkpointing_strategy() {
            Some(strategy) => images.autodiff().with_gradient_checkpointing_strategy(strategy),
            None => images.autodiff(),
        };
        let labels = label_tensor(batch.labels, ad_device);
        Ok((images, labels))
    }

    /// The backward pass of a micro-batch whose `logits` `[n, C]` `weights` computed: its
    /// gradients (of the loss times the loss scale and the micro-batch's share of the step's
    /// images), its loss times `n` `[1]` and its correct count `[1]` (on the inner device).
    pub(crate) fn backward(
        &self,
        weights: &Classifier,
        logits: Tensor<2>,
        labels: Tensor<1, Int>,
        ad_device: &Device,
    ) -> (GradientsParams, Tensor<1>, Tensor<1>) {
        let [n, _] = logits.dims();
        let class_weights = self
            .class_weights
            .as_ref()
            .map(|w| Tensor::<1>::from_data(burn::tensor::TensorData::new(w.clone(), [w.len()]), ad_device));
        let correct = logits.clone().inner().argmax(1).reshape([n]).equal(labels.clone().inner()).int().sum().float();
        let loss = weighted_smoothed_cross_entropy(logits, labels, self.label_smoothing, class_weights);
        let weighted = loss.clone() * (self.scale * n as f32 / self.total as f32);
        let grads = GradientsParams::from_grads(weighted.backward(), weights);
        (grads, loss.inner() * n as f32, correct)
    }
}
