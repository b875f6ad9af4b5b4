//! One optimizer step and what it needs: the model, AdamW, the schedule and the loop state on
//! one device ([`Trainer`]); the loss; the NaN diagnosis; and the compute precision a device
//! gives a config ([`precision_on`]).
//!
//! One optimizer step consumes `grad_accum_steps` loader batches of `loader_batch` images
//! (`train.batch_size`). Each loader batch may be split into `split_factor` micro-batches when
//! memory requires it (the budget was crossed, or the device refused an allocation); the loss of
//! each micro-batch is weighted by its share of the step's images, so the gradient is the same
//! whatever the split. The step counter (`state.global_step`) is advanced here, by an applied
//! update, and nowhere else.

use crate::config::{Config, Precision};
use crate::data::batch::Batch;
use crate::device::SelectedDevice;
use crate::engine::error::{Error, Result};
use crate::engine::events::{Event, EventSink};
use crate::memory::probe::MemoryTracker;
use crate::model::Classifier;
use crate::train::checkpoint::{self, TrainState};
use crate::train::data_parallel::{self, Replica, Share};
use crate::train::pass::PassSettings;
use crate::train::precision::LossScaler;
use crate::train::schedule::WarmupCosine;
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer};
use burn::tensor::{Device, Int, Tensor};
use std::path::{Path, PathBuf};

/// Result of one optimizer step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StepStats {
    pub(crate) loss: f32,
    pub(crate) accuracy: f32,
    pub(crate) images: usize,
    pub(crate) applied: bool,
}

pub(crate) enum StepError {
    /// The device failed (allocation, buffer limit): retry smaller.
    Device(String),
    Fatal(Error),
}

impl From<StepError> for Error {
    /// Where no retry follows (benchmarks, the in-memory loop): a device refusal is an
    /// [`Error::Device`].
    fn from(e: StepError) -> Self {
        match e {
            StepError::Device(m) => Error::Device(m),
            StepError::Fatal(e) => e,
        }
    }
}

impl StepError {
    /// A device failure from a runtime error, kept to one line ([`crate::engine::error::one_line_cause`]).
    pub(crate) fn device(cause: &impl std::fmt::Debug) -> Self {
        StepError::Device(crate::engine::error::one_line_cause(&format!("{cause:?}")))
    }
}

/// Cross-entropy with label smoothing `eps` (Szegedy et al. 2016), mean over the batch:
/// `(1 - eps) * nll(target) + eps * mean_c(-log p_c)`.
///
/// # Shapes
/// `logits` `[B, C]`, `labels` `[B]` -> loss `[1]`.
pub fn smoothed_cross_entropy(logits: Tensor<2>, labels: Tensor<1, Int>, eps: f32) -> Tensor<1> {
    weighted_smoothed_cross_entropy(logits, labels, eps, None)
}

/// [`smoothed_cross_entropy`] with each image's loss multiplied by its class's weight
/// (`train.class_weights`, [`crate::config::class_balance::class_weights`]) before the mean:
/// `mean_i(w[y_i] * loss_i)`. The balanced weights average 1 over the training set, so this is
/// an unbiased estimate of the class-balanced loss whatever the batch holds (PyTorch's
/// `CrossEntropyLoss(weight=...)` divides by the batch's summed weights instead, which makes a
/// batch's rare images count less the more of them it holds).
///
/// # Shapes
/// `logits` `[B, C]`, `labels` `[B]`, `class_weights` `[C]` -> loss `[1]`.
pub fn weighted_smoothed_cross_entropy(
    logits: Tensor<2>,
    labels: Tensor<1, Int>,
    eps: f32,
    class_weights: Option<Tensor<1>>,
) -> Tensor<1> {
    let [b, _] = logits.dims();
    let logp = burn::tensor::activation::log_softmax(logits, 1);
    let nll = logp.clone().gather(1, labels.clone().reshape([b, 1])).neg(); // [B, 1]
    let per_image = if eps == 0.0 { nll } else { nll * (1.0 - eps) + logp.mean_dim(1).neg() * eps }; // [B, 1]
    match class_weights {
        Some(w) => (per_image.reshape([b]) * w.select(0, labels)).mean(),
        None => per_image.mean(),
    }
}

/// Squared global L2 norm of all gradients, as `torch.nn.utils.clip_grad_norm_` computes it.
struct GradNormSq<'a> {
    grads: &'a GradientsParams,
    acc: Option<Tensor<1>>,
}

impl ModuleVisitor for GradNormSq<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.get::<D>(param.id) {
            let s = (g.clone() * g).sum();
            self.acc = Some(match self.acc.take() {
                Some(a) => a + s,
                None => s,
            });
        }
    }
}

/// Multiplies every gradient by `factor`.
struct ScaleGrads<'a> {
    grads: &'a mut GradientsParams,
    factor: f32,
}

impl ModuleVisitor for ScaleGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.remove::<D>(param.id) {
            self.grads.register(param.id, g * self.factor);
        }
    }
}

/// Model, optimizer and loop state on the main device (and the replicas of a data-parallel run).
pub(crate) struct Trainer {
    pub(crate) config: Config,
    pub(crate) precision: Precision,
    pub(crate) device: Device,
    pub(crate) ad_device: Device,
    pub(crate) model: Option<Classifier>,
    pub(crate) optim: ModuleOptimizer,
    pub(crate) schedule: WarmupCosine,
    pub(crate) state: TrainState,
    pub(crate) tracker: MemoryTracker,
    /// `memory.cap_to_budget`: the bytes reserved that fail a step as out of memory (the live
    /// budget; the run updates it when a client changes the budget).
    pub(crate) memory_cap: Option<u64>,
    /// Steps in a row whose loss was over [`EXPLODING_LOSS_FACTOR`] times the chance level.
    pub(crate) exploding_steps: usize,
    /// Each class's loss weight `[C]` (`train.class_weights`); `None`: all 1.
    pub(crate) class_weights: Option<Vec<f32>>,
    /// Whether the step runs under cubecl's dry run ([`super::probes::dry_run_step_memory`]),
    /// where what it reads back is meaningless: the step then takes its loss and gradient norm
    /// as 0, so it is applied, unclipped, like a healthy step, whatever the buffers held.
    pub(crate) dry_run: bool,
    /// The other devices of a data-parallel run ([`super::data_parallel`]), each running its
    /// share of every step's micro-batches; empty on one device.
    pub(crate) replicas: Vec<Replica>,
}

/// A loss over this many times the chance-level loss `ln(classes)` (what an untrained network
/// scores, and where every run starts) on [`EXPLODING_STEPS`] steps in a row is a diverging run:
/// it stops with the same diagnosis as a non-finite loss, before it reaches one. A healthy run
/// never comes near it (its loss falls from `ln(classes)`); with `optimizer.lr = 10` the loss
/// of the C36 case is 41177 at its second step against a chance level of 0.69.
pub const EXPLODING_LOSS_FACTOR: f32 = 10.0;
/// See [`EXPLODING_LOSS_FACTOR`].
pub const EXPLODING_STEPS: usize = 2;

impl Trainer {
    pub(crate) fn new(
        config: &Config,
        precision: Precision,
        device: &Device,
        class_names: Vec<String>,
        steps_total: usize,
        steps_per_epoch: usize,
    ) -> Self {
        let ad_device = if config.train.checkpointing {
            device.clone().autodiff().gradient_checkpointing()
        } else {
            device.clone().autodiff()
        };
        ad_device.seed(config.seed);
        let model = Classifier::new(&config.model, class_names.len(), &ad_device);
        let o = &config.optimizer;
        let optim = AdamWConfig::new()
            .with_beta_1(o.beta1)
            .with_beta_2(o.beta2)
            .with_epsilon(o.epsilon)
            .with_weight_decay(o.weight_decay as f32)
            .init();
        let schedule = WarmupCosine {
            peak_lr: o.lr,
            warmup_steps: (o.warmup_epochs * steps_per_epoch as f64).round() as usize,
            total_steps: steps_total,
            min_lr_ratio: o.min_lr_ratio,
        };
        let scaler = if precision == Precision::F16 { LossScaler::new() } else { LossScaler::disabled() };
        let state = TrainState {
            epoch: 0,
            batches_done_in_epoch: 0,
            global_step: 0,
            scaler,
            split_factor: 1,
            best_val_accuracy: 0.0,
            class_names,
        };
        Self {
            config: config.clone(),
            precision,
            device: device.clone(),
            ad_device,
            model: Some(model),
            optim,
            schedule,
            state,
            exploding_steps: 0,
            dry_run: false,
            replicas: Vec::new(),
            class_weights: None,
            tracker: MemoryTracker::default(),
            memory_cap: config.memory.cap_to_budget.then_some(config.memory.memory_budget_bytes),
        }
    }

    pub(crate) fn model(&self) -> &Classifier {
        self.model.as_ref().expect("the model is only taken out for the duration of an optimizer step")
    }

    /// Loads the checkpoint in `dir` with its `state`: the weights and, when `with_optimizer`,
    /// the AdamW state (else the optimizer starts fresh: its moments at zero).
    ///
    /// # Errors
    /// [`Error::Io`] naming the file that cannot be read or loaded.
    pub(crate) fn restore(&mut self, dir: &Path, state: TrainState, with_optimizer: bool) -> Result<()> {
        let mut model = self.model.take().expect("model present between steps");
        let model_path = dir.join("model.bpk");
        let bytes = std::fs::read(&model_path).map_err(|e| Error::io(&model_path, e));
        let loaded = bytes.and_then(|b| checkpoint::load_model_bytes(&mut model, b, &model_path));
        self.model = Some(model);
        loaded?;
        if !with_optimizer {
            self.state = state;
            return Ok(());
        }
        let opt_path = dir.join("optimizer.bpk");
        let bytes = std::fs::read(&opt_path).map_err(|e| Error::io(&opt_path, e))?;
        let optim = std::mem::replace(&mut self.optim, AdamWConfig::new().init());
        self.optim = optim
            .from_bytes(burn::tensor::Bytes::from_bytes_vec(bytes))
            .map_err(|e| Error::io(&opt_path, format!("cannot load optimizer state: {e}")))?;
        self.state = state;
        Ok(())
    }

    pub(crate) fn save(&self, run_dir: &Path) -> Result<PathBuf> {
        let opt = self.optim.into_bytes().map_err(|e| Error::io(run_dir.join("optimizer.bpk"), e))?;
        checkpoint::save(run_dir, self.model(), &opt, &self.state, self.config.train.keep_checkpoints)
    }

    /// [`Self::step`] for a run's first step on a GPU: its allocations stay out of
    /// cubecl's pools ([`crate::device::outside_the_pools`]), so its autotuner's buffers do
    /// not size the pages the run's steady steps get; the step's events reach `sink` after it.
    /// Its long-lived outputs (parameters, AdamW moments) are in buffers of their own; the
    /// next steps either replace them with tensors in the pools or (where burn's fusion updates
    /// a tensor in place) keep them, exact-fit; which, was not checked: the reserved bytes
    /// measured count both.
    ///
    /// A device error while waiting for the step's work is fatal, not a refusal to retry at
    /// half: the step may already be applied.
    pub(crate) fn step_outside_the_pools(
        &mut self,
        batches: &[Batch],
        sample_memory: bool,
        sink: EventSink,
    ) -> std::result::Result<StepStats, StepError> {
        let device = self.device.clone();
        let mut events = Vec::new();
        let result = crate::device::outside_the_pools(&device, || {
            self.step(batches, sample_memory, &mut |e: Event| events.push(e))
        });
        for e in events {
            sink(e);
        }
        result.map_err(|m| StepError::Fatal(Error::Device(m)))?
    }

    /// [`Self::step_async`] driven to completion on the calling thread (the engine thread), which
    /// sleeps until the device's read wakes it.
    pub(crate) fn step(
        &mut self,
        batches: &[Batch],
        sample_memory: bool,
        sink: EventSink,
    ) -> std::result::Result<StepStats, StepError> {
        pollster::block_on(self.step_async(batches, sample_memory, sink))
    }

    /// One optimizer step over `batches` (the step's loader batches). Its one read of the device
    /// (loss, correct count and gradient norm, [`Self::forward_backward`]) is awaited, so in a
    /// browser the page runs while the device works; natively [`Self::step`] blocks on it.
    pub(crate) async fn step_async(
        &mut self,
        batches: &[Batch],
        sample_memory: bool,
        sink: EventSink<'_>,
    ) -> std::result::Result<StepStats, StepError> {
        self.check_memory_cap()?;
        let total: usize = batches.iter().map(Batch::len).sum();
        let scale = self.state.scaler.scale;
        let model = self.model.take().expect("model present between steps");
        let measured = self
            .forward_backward(&model, batches, total, sample_memory, sink)
            .await
            .and_then(|r| self.check_memory_cap().map(|()| r));
        let (mut grads, stats) = match measured {
            Ok(Some(r)) => r,
            Ok(None) => {
                self.model = Some(model);
                return Ok(StepStats { loss: 0.0, accuracy: 0.0, images: 0, applied: false });
            }
            Err(e) => {
                self.model = Some(model);
                return Err(e);
            }
        };
        let (mut loss, accuracy) = (stats[0] / total as f32, stats[1] / total as f32);
        let mut grad_norm = stats[2].sqrt() / scale;
        if self.dry_run {
            (loss, grad_norm) = (0.0, 0.0);
        }
        let finite = loss.is_finite() && grad_norm.is_finite();
        let applied = self.state.scaler.update(finite);
        if !finite {
            self.model = Some(model);
            if self.precision == Precision::F32
                || self.state.scaler.skipped_in_a_row >= self.config.train.max_skipped_steps
            {
                let step = self.state.global_step + 1;
                let what = format!("non-finite values at step {step} (loss {loss}, gradient norm {grad_norm})");
                return Err(StepError::Fatal(Error::Diverged(diagnosis(&what, &self.config))));
            }
            sink(Event::Warning(format!(
                "step {}: f16 gradients overflowed; step skipped, loss scale lowered to {}",
                self.state.global_step + 1,
                self.state.scaler.scale
            )));
            return Ok(StepStats { loss, accuracy, images: total, applied });
        }
        let chance = (self.state.class_names.len().max(2) as f32).ln();
        self.exploding_steps = if loss > EXPLODING_LOSS_FACTOR * chance { self.exploding_steps + 1 } else { 0 };
        if self.exploding_steps >= EXPLODING_STEPS {
            self.model = Some(model);
            let what = format!(
                "the loss is {loss} at step {}, over {EXPLODING_LOSS_FACTOR} times the chance-level loss ln({}) = {chance:.2} \
                 for {EXPLODING_STEPS} steps in a row",
                self.state.global_step + 1,
                self.state.class_names.len()
            );
            return Err(StepError::Fatal(Error::Diverged(diagnosis(&what, &self.config))));
        }
        let clip = self.config.train.grad_clip_norm;
        let clip_factor = if clip > 0.0 && grad_norm > clip { clip / (grad_norm + 1e-6) } else { 1.0 };
        let multiplier = clip_factor / scale;
        if multiplier != 1.0 {
            model.visit(&mut ScaleGrads { grads: &mut grads, factor: multiplier });
        }
        let lr = self.schedule.lr(self.state.global_step);
        self.model = Some(self.optim.step(lr, model, grads));
        if applied {
            self.state.global_step += 1;
        }
        Ok(StepStats { loss, accuracy, images: total, applied })
    }
}

impl Trainer {
    /// Forward and backward passes over the step's micro-batches (each loader batch split into
    /// `split_factor` chunks), dealt to the main device and the replicas
    /// ([`super::data_parallel`]), gradients accumulated with weights `n / total` and the loss
    /// scale and summed on the main device.
    /// Returns the gradients and `[loss sum, correct count, squared gradient norm]`, read back in
    /// one transfer; `None` when the batches hold no image. Samples memory after the first
    /// forward pass when `sample_memory`.
    async fn forward_backward(
        &mut self,
        model: &Classifier,
        batches: &[Batch],
        total: usize,
        sample_memory: bool,
        sink: EventSink<'_>,
    ) -> std::result::Result<Option<(GradientsParams, Vec<f32>)>, StepError> {
        let settings = PassSettings {
            memory_cap: self.memory_cap,
            data: self.config.data.clone(),
            precision: self.precision,
            scale: self.state.scaler.scale,
            label_smoothing: self.config.train.label_smoothing,
            total,
            class_weights: self.class_weights.clone(),
        };
        let chunks = batches.iter().flat_map(|b| b.split(self.state.split_factor));
        let mut dealt = data_parallel::deal(chunks, 1 + self.replicas.len()).into_iter();
        let own = dealt.next().unwrap_or_default();
        // The replicas' shares run on threads of their own while this one runs the main device's.
        let replicas: Vec<_> = dealt
            .zip(&self.replicas)
            .map(|(chunks, replica)| data_parallel::spawn_share(settings.clone(), model, replica, chunks))
            .collect();
        let main = self.main_share(model, own, &settings, sample_memory, sink).await;
        // Every replica is waited for whatever the main device's share gave, so that no share of
        // a failed step still runs when the step is retried at half the micro-batch.
        let replicas: Vec<_> = replicas.into_iter().map(data_parallel::join_share).collect();
        let mut shares = vec![main?];
        for replica in replicas {
            shares.push(replica?);
        }
        let Some((grads, loss_sum, correct_sum)) = data_parallel::gather(shares, model, &self.ad_device, &self.device)
        else {
            return Ok(None);
        };
        let mut norm = GradNormSq { grads: &grads, acc: None };
        model.visit(&mut norm);
        let Some(norm_sq) = norm.acc else { return Ok(None) };
        let stats = Tensor::cat(vec![loss_sum, correct_sum, norm_sq], 0)
            .into_data_async()
            .await
            .map_err(|e| StepError::device(&e))?;
        let stats = stats.try_to_vec::<f32>().map_err(|e| StepError::Fatal(Error::device(&e)))?;
        Ok(Some((grads, stats)))
    }

    /// The main device's share of a step: the forward and backward passes of `own` (its
    /// micro-batches) with `model`, memory sampled after the first forward pass when
    /// `sample_memory` (and held to the cap, [`Self::over_memory_cap`]).
    async fn main_share(
        &mut self,
        model: &Classifier,
        own: Vec<Batch>,
        settings: &PassSettings,
        sample_memory: bool,
        sink: EventSink<'_>,
    ) -> std::result::Result<Share, StepError> {
        let mut share = Share::default();
        let mut sampled = !sample_memory;
        for chunk in own {
            let (images, labels) = settings.inputs(chunk, &self.device, &self.ad_device).map_err(StepError::Fatal)?;
            let logits = model.forward(images, self.precision);
            if !sampled {
                // The peak in use sits at the end of the forward pass, or (checkpointing) early
                // in the backward pass.
                crate::device::sync_async(&self.device).await.map_err(|e| StepError::device(&e))?;
                // Under a cap, the reading the run records is one the card must hold: pools
                // hand free pages back during the backward pass, so the check after it can
                // read less than this peak.
                if let Some((_, reserved)) = self.sample_memory(sink) {
                    self.over_memory_cap(reserved)?;
                }
                sampled = true;
            }
            let (grads, loss_n, correct) = settings.backward(model, logits, labels, &self.ad_device);
            share.add(model, grads, loss_n, correct);
        }
        Ok(share)
    }

    /// Samples the device's memory, reports it, and returns `(bytes_in_use, bytes_reserved)`.
    fn sample_memory(&mut self, sink: EventSink) -> Option<(u64, u64)> {
        let (in_use, reserved) = self.tracker.sample(&self.device)?;
        sink(Event::Memory {
            step: self.state.global_step + 1,
            bytes_in_use: in_use,
            bytes_reserved: reserved,
            peak_bytes_in_use: self.tracker.peak_bytes_in_use,
        });
        Some((in_use, reserved))
    }

    /// With a memory cap, fails as out of memory when the device's reserved bytes exceed it:
    /// checked before a step (the previous optimizer step's allocations), at the memory sample
    /// after the first forward pass (the training loop samples every step under a cap), and
    /// after the backward pass, before the update is applied.
    fn check_memory_cap(&self) -> std::result::Result<(), StepError> {
        if self.memory_cap.is_none() {
            return Ok(());
        }
        match crate::memory::probe::sample(&self.device) {
            Some((_, reserved)) => self.over_memory_cap(reserved),
            None => Ok(()),
        }
    }

    /// [`Self::check_memory_cap`] on a reading already taken: out of memory when `reserved`
    /// bytes exceed the cap.
    fn over_memory_cap(&self, reserved: u64) -> std::result::Result<(), StepError> {
        over_cap(reserved, self.memory_cap)
    }
}

/// Out of memory ([`StepError::Device`], retried at half the micro-batch) when `reserved` bytes
/// exceed `cap` (`memory.cap_to_budget`: the live budget, each device's).
pub(crate) fn over_cap(reserved: u64, cap: Option<u64>) -> std::result::Result<(), StepError> {
    match cap {
        Some(cap) if reserved > cap => Err(StepError::Device(format!(
            "out of memory: {} reserved over the {} cap (memory.cap_to_budget emulates a card of the budget's size)",
            crate::memory::human_bytes(reserved),
            crate::memory::human_bytes(cap)
        ))),
        _ => Ok(()),
    }
}

/// The precision `config` trains in on `device`: its `train.precision`, except f16 on a device
/// without shader f16, which trains in f32 (the one place this fallback is decided; the run sends
/// the warning).
pub(crate) fn precision_on(config: &Config, device: &SelectedDevice) -> Precision {
    if config.train.precision == Precision::F16 && !device.supports_f16() {
        Precision::F32
    } else {
        config.train.precision
    }
}

/// The divergence message (a non-finite or exploding loss): `what` was seen, then the likely
/// causes in order.
fn diagnosis(what: &str, config: &Config) -> String {
    format!(
        "{what}. Likely causes, most likely first: \
         1) learning rate too high (optimizer.lr = {}; try {:.1e}, and lower again if the loss stays \
         above its starting value), 2) head init too large (model.head_init_std = {}; 0.01 is safe), \
         3) un-normalized inputs (data.mean/std = {:?}/{:?}). Checkpoints written before this step are kept.",
        config.optimizer.lr,
        // A tenth, at most the presets' 3e-3 (AdamW's usual range): a tenth of 10 still diverges.
        (config.optimizer.lr / 10.0).min(3e-3),
        config.model.head_init_std,
        config.data.mean,
        config.data.std
    )
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Int, Tensor, TensorData};

    #[test]
    fn smoothed_cross_entropy_matches_a_hand_computed_value() {
        let device = burn::tensor::Device::flex();
        // Row 1: p = [1/4, 3/4], label 1. Row 2: p = [1/2, 1/2], label 0. eps = 0.1.
        let logits = Tensor::<2>::from_data(TensorData::new(vec![0.0f32, 3f32.ln(), 0.0, 0.0], [2, 2]), &device);
        let labels = Tensor::<1, Int>::from_data(TensorData::new(vec![1i64, 0], [2]), &device);
        let loss: f32 = super::smoothed_cross_entropy(logits, labels, 0.1).into_scalar();
        // Row 1: 0.9 * -ln(3/4) + 0.1 * (ln 4 - ln(3/4)) / 2; row 2: ln 2 either way.
        let row1 = 0.9 * -(0.75f64.ln()) + 0.1 * (4f64.ln() - 0.75f64.ln()) / 2.0;
        let want = (row1 + 2f64.ln()) / 2.0;
        assert!((f64::from(loss) - want).abs() < 1e-6, "{loss} vs {want}");
        assert!((want - 0.517_880).abs() < 1e-5);
    }
}
