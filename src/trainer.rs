//! One optimizer step and what it needs: the model, AdamW, the schedule and the loop state on
//! one device ([`Trainer`]); the loss; the NaN diagnosis; and the short runs built on a bare
//! trainer (the overfit check, the throughput measurement).
//!
//! One optimizer step consumes `grad_accum_steps` loader batches of `batch_size` images. Each
//! loader batch may be split into `split_factor` micro-batches when memory requires it (the
//! budget was crossed, or the device refused an allocation); the loss of each micro-batch is
//! weighted by its share of the step's images, so the gradient is the same whatever the split.

use crate::checkpoint::{self, TrainState};
use crate::config::{Config, Precision};
use crate::dataset::Dataset;
use crate::device::SelectedDevice;
use crate::error::{Error, Result};
use crate::eval::{self, batch_tensors};
use crate::events::{Event, EventSink};
use crate::loader::{self, Batch, SamplePipeline};
use crate::memory::MemoryTracker;
use crate::model::Classifier;
use crate::precision::LossScaler;
use crate::schedule::WarmupCosine;
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{AdamWConfig, GradientsAccumulator, GradientsParams, ModuleOptimizer};
use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::SeedableRng;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use web_time::Instant;

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
    /// A device failure from a runtime error, kept to one line ([`crate::error::one_line_cause`]).
    fn device(cause: &impl std::fmt::Debug) -> Self {
        StepError::Device(crate::error::one_line_cause(&format!("{cause:?}")))
    }
}

/// Cross-entropy with label smoothing `eps` (Szegedy et al. 2016), mean over the batch:
/// `(1 - eps) * nll(target) + eps * mean_c(-log p_c)`.
///
/// # Shapes
/// `logits` `[B, C]`, `labels` `[B]` -> loss `[1]`.
pub fn smoothed_cross_entropy(logits: Tensor<2>, labels: Tensor<1, Int>, eps: f32) -> Tensor<1> {
    let [b, _] = logits.dims();
    let logp = burn::tensor::activation::log_softmax(logits, 1);
    let nll = logp.clone().gather(1, labels.reshape([b, 1])).neg(); // [B, 1]
    if eps == 0.0 {
        return nll.mean();
    }
    let smooth = logp.mean_dim(1).neg(); // [B, 1]
    (nll * (1.0 - eps) + smooth * eps).mean()
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

/// Model, optimizer and loop state on one device.
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
}

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
            tracker: MemoryTracker::default(),
            memory_cap: config.memory.cap_to_budget.then_some(config.memory.memory_budget_bytes),
        }
    }

    pub(crate) fn model(&self) -> &Classifier {
        self.model.as_ref().expect("the model is only taken out for the duration of an optimizer step")
    }

    pub(crate) fn restore(&mut self, dir: &Path, state: TrainState) -> Result<()> {
        let mut model = self.model.take().expect("model present between steps");
        let model_path = dir.join("model.bpk");
        let bytes = std::fs::read(&model_path).map_err(|e| Error::io(&model_path, e))?;
        checkpoint::load_model_bytes(&mut model, bytes, &model_path)?;
        self.model = Some(model);
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
        let (loss, accuracy) = (stats[0] / total as f32, stats[1] / total as f32);
        let grad_norm = stats[2].sqrt() / scale;
        let finite = loss.is_finite() && grad_norm.is_finite();
        let applied = self.state.scaler.update(finite);
        if !finite {
            self.model = Some(model);
            if self.precision == Precision::F32
                || self.state.scaler.skipped_in_a_row >= self.config.train.max_skipped_steps
            {
                return Err(StepError::Fatal(Error::Diverged(diagnosis(
                    loss,
                    grad_norm,
                    &self.config,
                    self.state.global_step,
                ))));
            }
            sink(Event::Warning(format!(
                "step {}: f16 gradients overflowed; step skipped, loss scale lowered to {}",
                self.state.global_step + 1,
                self.state.scaler.scale
            )));
            return Ok(StepStats { loss, accuracy, images: total, applied });
        }
        let clip = self.config.train.grad_clip_norm;
        let clip_factor = if clip > 0.0 && grad_norm > clip { clip / (grad_norm + 1e-6) } else { 1.0 };
        let multiplier = clip_factor / scale;
        if multiplier != 1.0 {
            model.visit(&mut ScaleGrads { grads: &mut grads, factor: multiplier });
        }
        let lr = self.schedule.lr(self.state.global_step);
        self.model = Some(self.optim.step(lr, model, grads));
        Ok(StepStats { loss, accuracy, images: total, applied })
    }
}

impl Trainer {
    /// Forward and backward passes over the step's micro-batches (each loader batch split into
    /// `split_factor` chunks), gradients accumulated with weights `n / total` and the loss scale.
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
        let (scale, eps) = (self.state.scaler.scale, self.config.train.label_smoothing);
        let mut accumulator = GradientsAccumulator::<Classifier>::new();
        let mut loss_sum: Option<Tensor<1>> = None;
        let mut correct_sum: Option<Tensor<1>> = None;
        let mut sampled = !sample_memory;
        let factor = self.state.split_factor;
        for chunk in batches.iter().flat_map(|b| b.split(factor)) {
            let n = chunk.len();
            let (images, labels) = self.input_tensors(chunk).map_err(StepError::Fatal)?;
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
            let correct =
                logits.clone().inner().argmax(1).reshape([n]).equal(labels.clone().inner()).int().sum().float();
            let loss = smoothed_cross_entropy(logits, labels, eps);
            let weighted = loss.clone() * (scale * n as f32 / total as f32);
            accumulator.accumulate(model, GradientsParams::from_grads(weighted.backward(), model));
            let loss_n = loss.inner() * n as f32;
            loss_sum = Some(match loss_sum {
                Some(a) => a + loss_n,
                None => loss_n,
            });
            correct_sum = Some(match correct_sum {
                Some(a) => a + correct,
                None => correct,
            });
        }
        let grads = accumulator.grads();
        let mut norm = GradNormSq { grads: &grads, acc: None };
        model.visit(&mut norm);
        let (Some(loss_sum), Some(correct_sum), Some(norm_sq)) = (loss_sum, correct_sum, norm.acc) else {
            return Ok(None);
        };
        let stats = Tensor::cat(vec![loss_sum, correct_sum, norm_sq], 0)
            .into_data_async()
            .await
            .map_err(|e| StepError::device(&e))?;
        let stats = stats.try_to_vec::<f32>().map_err(|e| StepError::Fatal(Error::device(&e)))?;
        Ok(Some((grads, stats)))
    }

    /// A micro-batch's images `[n, 3, h, w]` and labels `[n]` on the training device: uploaded
    /// as normalized f32, or (a packed batch, [`Batch::packed`]) uploaded as 8-bit pixels and
    /// cropped, augmented and normalized by `shaders/augment_rgb8.wgsl`. The kernel's output is
    /// a constant of the graph (no gradient), made on the inner device and then given the
    /// training device's autodiff strategy.
    ///
    /// # Errors
    /// As [`crate::device_augment::augment_batch`].
    fn input_tensors(&self, mut batch: Batch) -> Result<(Tensor<4>, Tensor<1, Int>)> {
        let Some(packed) = batch.packed.take() else { return Ok(batch_tensors(batch, &self.ad_device)) };
        let data = &self.config.data;
        let params = packed.params((batch.height, batch.width), data.mean, data.std)?;
        let images = crate::device_augment::augment_batch(packed.pixels, params, &self.device)?;
        // On the training device, with its checkpointing strategy (operands must share one).
        let images = match self.ad_device.gradient_checkpointing_strategy() {
            Some(strategy) => images.autodiff().with_gradient_checkpointing_strategy(strategy),
            None => images.autodiff(),
        };
        let labels = Tensor::<1, Int>::from_data(TensorData::new(batch.labels, [images.dims()[0]]), &self.ad_device);
        Ok((images, labels))
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
        match crate::memory::sample(&self.device) {
            Some((_, reserved)) => self.over_memory_cap(reserved),
            None => Ok(()),
        }
    }

    /// [`Self::check_memory_cap`] on a reading already taken: out of memory when `reserved`
    /// bytes exceed the cap.
    fn over_memory_cap(&self, reserved: u64) -> std::result::Result<(), StepError> {
        match self.memory_cap {
            Some(cap) if reserved > cap => Err(StepError::Device(format!(
                "out of memory: {} reserved over the {} cap (memory.cap_to_budget emulates a card of the budget's size)",
                crate::memory::human_bytes(reserved),
                crate::memory::human_bytes(cap)
            ))),
            _ => Ok(()),
        }
    }
}

/// The NaN guard's message: the values seen and the likely causes in order.
fn diagnosis(loss: f32, grad_norm: f32, config: &Config, step: usize) -> String {
    format!(
        "non-finite values at step {} (loss {loss}, gradient norm {grad_norm}). Likely causes, most likely first: \
         1) learning rate too high (optimizer.lr = {}; try {:.1e}), \
         2) head init too large (model.head_init_std = {}; 0.01 is safe), \
         3) un-normalized inputs (data.mean/std = {:?}/{:?}). The last good checkpoint is kept.",
        step + 1,
        config.optimizer.lr,
        config.optimizer.lr / 10.0,
        config.model.head_init_std,
        config.data.mean,
        config.data.std
    )
}

/// Result of [`overfit_check`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OverfitResult {
    /// Optimizer steps taken.
    pub steps: usize,
    /// Accuracy on the 64 images afterwards (evaluation mode), 0..1.
    pub accuracy: f32,
    /// Whether accuracy reached 98%.
    pub passed: bool,
}

/// Trains on 64 images (no augmentation, constant learning rate after a short warmup) for up to
/// `steps` steps and checks the network can memorize them (>= 98% accuracy): a test of the whole
/// pipeline, model and optimizer. It stops early once a whole pass of training batches was
/// classified without error and an evaluation confirms the 98%.
///
/// # Errors
/// As [`train`].
pub fn overfit_check(
    config: &Config,
    device: &SelectedDevice,
    data: &Dataset,
    steps: usize,
    sink: EventSink,
) -> Result<OverfitResult> {
    let subset = data.balanced_subset(64);
    let mut cfg = config.clone();
    cfg.augment = crate::config::AugmentConfig {
        random_crop: false,
        hflip: false,
        color_jitter: 0.0,
        random_erasing: 0.0,
        on_device: false,
    };
    cfg.train.label_smoothing = 0.0;
    cfg.train.batch_size = cfg.train.batch_size.min(32);
    cfg.train.grad_accum_steps = 1;
    cfg.optimizer.weight_decay = 0.0;
    cfg.optimizer.min_lr_ratio = 1.0;
    let n_batches = subset.samples.len().div_ceil(cfg.train.batch_size);
    let precision = if cfg.train.precision == Precision::F16 && !device.supports_f16() {
        Precision::F32
    } else {
        cfg.train.precision
    };
    let mut trainer = Trainer::new(&cfg, precision, &device.device, subset.class_names.clone(), steps, 0);
    trainer.schedule.warmup_steps = 10.min(steps);
    let ds = Arc::new(subset);
    // The evaluations read the 64 images from RAM after the first.
    let ram_only = crate::image_cache::ImageCache::new(1 << 30, 0, None);
    let pipe = Arc::new(SamplePipeline::from_config(&cfg, false).with_cache(Some(Arc::new(ram_only))));
    // Decode the 64 images once.
    let pass = loader::Pass::in_order(ds.samples.len(), cfg.train.batch_size, cfg.seed);
    let batches: Vec<Batch> = loader::batches(ds.clone(), pipe.clone(), pass, cfg.data.workers, 2).collect();
    let settings = eval::EvalSettings {
        model: &cfg.model,
        batch_size: 64,
        precision,
        workers: cfg.data.workers,
        buffer_limit: device.buffer_limit(),
    };
    let mut done = 0;
    // Consecutive steps whose batch was classified without error (before its update).
    let mut perfect_steps = 0;
    while done < steps {
        let batch = &batches[done % n_batches];
        let stats = trainer.step(std::slice::from_ref(batch), false, sink)?;
        if stats.applied {
            trainer.state.global_step += 1;
        }
        done += 1;
        sink(Event::Step {
            step: done,
            epoch: 0,
            loss: stats.loss,
            accuracy: stats.accuracy,
            lr: trainer.schedule.lr(done - 1),
            images_per_sec: 0.0,
            data_wait_secs: 0.0,
        });
        perfect_steps = if stats.accuracy >= 1.0 { perfect_steps + 1 } else { 0 };
        if perfect_steps >= n_batches && done < steps {
            perfect_steps = 0;
            let val = eval::evaluate(&trainer.model().valid(), ds.clone(), pipe.clone(), &trainer.device, &settings)?;
            if val.top1 >= 0.98 {
                return Ok(OverfitResult { steps: done, accuracy: val.top1, passed: true });
            }
        }
    }
    let val = eval::evaluate(&trainer.model().valid(), ds, pipe, &trainer.device, &settings)?;
    Ok(OverfitResult { steps: done, accuracy: val.top1, passed: val.top1 >= 0.98 })
}

/// What [`measure_training`] measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct TrainingRate {
    /// Training images per second over the timed steps.
    pub images_per_sec: f64,
    /// Seconds of the first step (the first warmup step, or the first timed one without
    /// warmup), its optimizer update included: on a GPU it compiles and autotunes the step's
    /// kernels, unless this process already did (an earlier config of the same bench) or
    /// cubecl's autotune cache and the driver's shader cache hold them from an earlier run.
    pub first_step_secs: f64,
    /// Memory sampled after the forward pass of every timed step.
    pub memory: MemoryTracker,
}

/// Throughput and memory of `steps` timed optimizer steps on synthetic images (after `warmup`
/// untimed ones): what `vramfit bench` measures. Memory is sampled after the forward pass of
/// every timed step (which synchronizes the device, as a real run does every few steps). The
/// first step waits for all its device work, optimizer update included; `steps` is at least 1.
///
/// # Errors
/// [`Error::Device`] when the device fails.
pub fn measure_training(
    config: &Config,
    device: &SelectedDevice,
    num_classes: usize,
    warmup: usize,
    steps: usize,
    sample_memory: bool,
) -> Result<TrainingRate> {
    let (mut trainer, batches) = bench_trainer(config, device, num_classes, warmup + steps);
    let sample = sample_memory && device.is_gpu();
    let steps = steps.max(1);
    let first = Instant::now();
    let first_images = bench_step(&mut trainer, &batches, warmup == 0 && sample)?;
    // The step reads its loss before the optimizer update, whose kernels (compiled at the first
    // step) run only when something waits for them.
    device.device.sync().map_err(|e| Error::device(&e))?;
    let first_step_secs = first.elapsed().as_secs_f64();
    for _ in 1..warmup {
        bench_step(&mut trainer, &batches, false)?;
    }
    if warmup > 0 {
        trainer.tracker = MemoryTracker::default();
    }
    let start = if warmup == 0 { first } else { Instant::now() };
    let mut images = if warmup == 0 { first_images } else { 0 };
    for _ in usize::from(warmup == 0)..steps {
        images += bench_step(&mut trainer, &batches, sample)?;
    }
    let images_per_sec = images as f64 / start.elapsed().as_secs_f64();
    Ok(TrainingRate { images_per_sec, first_step_secs, memory: trainer.tracker })
}

/// Device memory over training steps, as `vramfit bench memory` reads it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepMemory {
    /// Samples at the end of each forward pass of the steady steps.
    pub tracker: MemoryTracker,
    /// A probe thread's peaks over the steady steps (backward passes included).
    pub probe: crate::memory::ProbePeaks,
    /// Largest bytes reserved a probe read during the first step (the first step at a new shape
    /// autotunes its kernels with buffers of its own; 0 without pools). A lower bound: the probe
    /// reads between the device's operations.
    pub first_step_reserved_bytes: u64,
}

/// Memory of `steps` optimizer steps after one first step, as a training run sees it: the
/// first step (which autotunes kernels at a new shape and allocates for that) is run outside
/// the pools ([`Trainer::step_outside_the_pools`]) with a probe reading its peak reservation, and
/// the pools' free pages are handed back
/// ([`burn::tensor::Device::memory_cleanup`], as the training loop does after its first step);
/// then a [`crate::memory::MemoryProbe`] reads the device from its own thread during the
/// steady steps.
///
/// # Errors
/// [`Error::Device`] when the device fails.
pub fn measure_step_memory(
    config: &Config,
    device: &SelectedDevice,
    num_classes: usize,
    steps: usize,
) -> Result<StepMemory> {
    let interval = std::time::Duration::from_millis(1);
    let (mut trainer, batches) = bench_trainer(config, device, num_classes, 1 + steps);
    let first = crate::memory::MemoryProbe::start(&device.device, interval);
    trainer.step_outside_the_pools(&batches, false, &mut |_e: Event| {})?;
    let first_step_reserved_bytes = first.map_or(0, |p| p.finish().bytes_reserved);
    device.device.memory_cleanup();
    trainer.tracker = MemoryTracker::default();
    let probe = crate::memory::MemoryProbe::start(&device.device, interval);
    let mut result = Ok(());
    for _ in 0..steps {
        if let Err(e) = bench_step(&mut trainer, &batches, device.is_gpu()) {
            result = Err(e);
            break;
        }
    }
    let probe = probe.map(crate::memory::MemoryProbe::finish).unwrap_or_default();
    result.map(|()| StepMemory { tracker: trainer.tracker, probe, first_step_reserved_bytes })
}

/// A trainer for `total_steps` steps of `config` on synthetic images, and its step's batches.
fn bench_trainer(
    config: &Config,
    device: &SelectedDevice,
    num_classes: usize,
    total_steps: usize,
) -> (Trainer, Vec<Batch>) {
    let precision = if config.train.precision == Precision::F16 && !device.supports_f16() {
        Precision::F32
    } else {
        config.train.precision
    };
    let trainer = Trainer::new(
        config,
        precision,
        &device.device,
        (0..num_classes).map(|i| i.to_string()).collect(),
        total_steps,
        1,
    );
    let batch = synthetic_batch(config, num_classes);
    (trainer, vec![batch; config.train.grad_accum_steps])
}

/// One optimizer step of a benchmark; returns the images it trained on.
fn bench_step(trainer: &mut Trainer, batches: &[Batch], sample_memory: bool) -> Result<usize> {
    Ok(trainer.step(batches, sample_memory, &mut |_e: Event| {})?.images)
}

/// A batch of `config.train.batch_size` random normalized images with labels `i % classes`.
pub fn synthetic_batch(config: &Config, num_classes: usize) -> Batch {
    use rand::Rng;
    let px = config.image_size_px();
    let n = config.train.batch_size;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(config.seed);
    Batch {
        images: (0..n * 3 * px * px).map(|_| rng.random_range(-2.0f32..2.0)).collect(),
        labels: (0..n).map(|i| (i % num_classes) as i64).collect(),
        height: px,
        width: px,
        ..Default::default()
    }
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
