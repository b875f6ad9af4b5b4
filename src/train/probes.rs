//! The short runs built on a bare [`Trainer`] and its one optimizer step: the overfit check
//! (the recipe's first sanity test), the throughput measurement (`vramfit bench`) and the
//! memory probe (`vramfit bench memory`). Each is a thin driver of [`Trainer::step`]: the step,
//! its counter and its memory samples are the training loop's own.

use std::sync::Arc;

use burn::module::Module;
use rand::SeedableRng;
use web_time::Instant;

use super::data_parallel::Replica;
use super::step::{Trainer, precision_on};
use crate::config::Config;
use crate::data::batch::Batch;
use crate::data::dataset::Dataset;
use crate::data::loader;
use crate::data::pipeline::SamplePipeline;
use crate::device::SelectedDevice;
use crate::engine::error::{Error, Result};
use crate::engine::events::{Event, EventSink, StopSignal};
use crate::inference::eval;
use crate::memory::probe::MemoryTracker;

/// Optimizer steps the overfit check may take (`vramfit train --overfit-check`, the app's button).
pub const OVERFIT_CHECK_STEPS: usize = 200;

/// Result of [`overfit_check`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OverfitResult {
    /// Optimizer steps taken.
    pub steps: usize,
    /// Accuracy on the 64 images afterwards (evaluation mode), 0..1; after a stop, the last
    /// step's training accuracy on its batch.
    pub accuracy: f32,
    /// Whether accuracy reached 98%.
    pub passed: bool,
    /// Whether `stop` ended the check before it could decide (then it has not passed).
    pub stopped: bool,
}

/// Trains on 64 images (no augmentation, constant learning rate after a short warmup) for up to
/// `steps` steps and checks the network can memorize them (>= 98% accuracy): a test of the whole
/// pipeline, model and optimizer. It stops early once a whole pass of training batches was
/// classified without error and an evaluation confirms the 98%.
///
/// # Errors
/// As [`super::train`].
pub fn overfit_check(
    config: &Config,
    device: &SelectedDevice,
    data: &Dataset,
    steps: usize,
    sink: EventSink,
    stop: &StopSignal,
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
    let precision = precision_on(&cfg, device);
    let mut trainer = Trainer::new(&cfg, precision, &device.device, subset.class_names.clone(), steps, 0);
    trainer.schedule.warmup_steps = 10.min(steps);
    let ds = Arc::new(subset);
    // The evaluations read the 64 images from RAM after the first.
    let ram_only = crate::data::image_cache::ImageCache::new(1 << 30, 0, None);
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
        keep_probabilities: false,
    };
    let mut done = 0;
    // Consecutive steps whose batch was classified without error (before its update).
    let mut perfect_steps = 0;
    let mut last_accuracy = 0.0;
    while done < steps {
        if stop.is_set() {
            let accuracy = last_accuracy;
            return Ok(OverfitResult { steps: done, accuracy, passed: false, stopped: true });
        }
        let batch = &batches[done % n_batches];
        let stats = trainer.step(std::slice::from_ref(batch), false, sink)?;
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
        last_accuracy = stats.accuracy;
        perfect_steps = if stats.accuracy >= 1.0 { perfect_steps + 1 } else { 0 };
        if perfect_steps >= n_batches && done < steps {
            perfect_steps = 0;
            let val = pollster::block_on(eval::evaluate(
                &trainer.model().valid(),
                ds.clone(),
                pipe.clone(),
                &trainer.device,
                &settings,
            ))?;
            if val.top1 >= 0.98 {
                return Ok(OverfitResult { steps: done, accuracy: val.top1, passed: true, stopped: false });
            }
        }
    }
    let val = pollster::block_on(eval::evaluate(&trainer.model().valid(), ds, pipe, &trainer.device, &settings))?;
    Ok(OverfitResult { steps: done, accuracy: val.top1, passed: val.top1 >= 0.98, stopped: false })
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

/// Training images per second of `config` on `devices` at once (the first the main one, the
/// others its replicas: [`super::TrainRequest::replicas`]) over `steps` timed optimizer steps
/// of `config.train.grad_accum_steps` synthetic micro-batches, after `warmup` untimed ones;
/// what `vramfit bench devices` measures. Each timed step waits for its loss, as the training
/// loop's does.
///
/// # Errors
/// [`Error::Device`] when a device fails or `devices` is empty.
pub fn measure_data_parallel(
    config: &Config,
    devices: &[SelectedDevice],
    num_classes: usize,
    warmup: usize,
    steps: usize,
) -> Result<f64> {
    let [main, replicas @ ..] = devices else { return Err(Error::Device("no device to measure".into())) };
    // f16 only where every device has it, as a run decides.
    let mut config = config.clone();
    if devices.iter().any(|d| precision_on(&config, d) != config.train.precision) {
        config.train.precision = crate::config::Precision::F32;
    }
    let config = &config;
    let (mut trainer, batches) = bench_trainer(config, main, num_classes, warmup + steps);
    trainer.replicas = replicas.iter().map(|d| Replica::new(d, config.train.checkpointing)).collect();
    for _ in 0..warmup {
        bench_step(&mut trainer, &batches, false)?;
    }
    let start = Instant::now();
    let mut images = 0;
    for _ in 0..steps.max(1) {
        images += bench_step(&mut trainer, &batches, false)?;
    }
    Ok(images as f64 / start.elapsed().as_secs_f64())
}

/// Device memory over training steps, as `vramfit bench memory` reads it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepMemory {
    /// Samples at the end of each forward pass of the steady steps.
    pub tracker: MemoryTracker,
    /// A probe thread's peaks over the steady steps (backward passes included).
    pub probe: crate::memory::probe::ProbePeaks,
    /// Largest bytes reserved a probe read during the first step, and the steps the f16 loss
    /// scaler skipped before it (the first step at a new shape autotunes its kernels with
    /// buffers of its own; 0 without pools). A lower bound: the probe reads between the
    /// device's operations.
    pub first_step_reserved_bytes: u64,
}

/// Memory of `steps` optimizer steps after one first step, as a training run sees it: the
/// first step (which autotunes kernels at a new shape and allocates for that) is run outside
/// the pools ([`Trainer::step_outside_the_pools`]), repeated while the f16 loss scaler skips
/// it ([`first_applied_step`]), with a probe reading its peak reservation, and
/// the pools are sized and their free pages handed back ([`crate::device::size_the_pools`], as
/// the training loop does after its first applied step);
/// then a [`crate::memory::probe::MemoryProbe`] reads the device from its own thread during the
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
    let first = crate::memory::probe::MemoryProbe::start(&device.device, interval);
    first_applied_step(&mut trainer, &batches)?;
    let first_step_reserved_bytes = first.map_or(0, |p| p.finish().bytes_reserved);
    let plan = crate::memory::estimate(config, config.train.batch_size, num_classes);
    crate::device::size_the_pools(&device.device, plan.largest_allocation);
    trainer.tracker = MemoryTracker::default();
    let probe = crate::memory::probe::MemoryProbe::start(&device.device, interval);
    let mut result = Ok(());
    for _ in 0..steps {
        if let Err(e) = bench_step(&mut trainer, &batches, device.is_gpu()) {
            result = Err(e);
            break;
        }
    }
    let probe = probe.map(crate::memory::probe::MemoryProbe::finish).unwrap_or_default();
    result.map(|()| StepMemory { tracker: trainer.tracker, probe, first_step_reserved_bytes })
}

/// What a training step reserves, measured without running it: [`dry_run_step_memory`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DryRunMemory {
    /// Bytes the device reserved after the dry steps (pages are never handed back within a
    /// step, so this is the steps' peak), outside-the-pools buffers included.
    pub bytes_reserved: u64,
    /// Seconds the dry run took, the trainer's creation, the kernels' compilation and (built
    /// with the default features) the first step's autotuning included.
    pub secs: f64,
}

/// The bytes `steps` training steps of `config` reserve on `device`, found by running the
/// steps as a training run does ([`measure_step_memory`]: a first step outside the pools, the
/// pools sized, then the steps) under cubecl's dry run (`cubecl::dry_run::DryRun`, cubecl
/// 0.11): every kernel is compiled and dropped instead of dispatched, and the pools carve their
/// pages lazily, without device memory behind them until something reads one. The pools take
/// the step's own allocation stream and carve first-fit pages from it: on 48 random cells on
/// lavapipe the dry run was -4.1%..+13.2% from the real steps' reserved peak, median 1.3%. It
/// was up to 4.7 MiB under on the largest cells (it misses the launches' uniform buffers,
/// among other things), and on 3 cells it held one page more
/// (without kernels, buffers are released at other moments; run to run, 2 cells differed by a
/// page), so `plan --exact` takes the smaller of it and the plan
/// ([`crate::memory::exact_peak`]). Only the parameters (made before the dry run) and the
/// autotuner's candidates (which cubecl runs for real) take device memory. The values the steps
/// compute are meaningless and the trainer is dropped.
///
/// Run it in a process that trains nothing else on `device` (the pools' page size stays where
/// the dry run left it): `vramfit plan --exact` runs it first in its process, `vramfit bench
/// memory` after the real steps and a cleanup (the same figure on the cell compared, 83.1 MiB).
/// The trainer's step takes its loss and gradient norm as 0 ([`Trainer`]'s `dry_run`). The
/// lazy pages go back (a cleanup) before it returns, on every path.
///
/// # Errors
/// [`Error::Device`] when the device fails or keeps no memory pools (a CPU backend).
pub fn dry_run_step_memory(
    config: &Config,
    device: &SelectedDevice,
    num_classes: usize,
    steps: usize,
) -> Result<DryRunMemory> {
    let start = Instant::now();
    let (mut trainer, batches) = bench_trainer(config, device, num_classes, 1 + steps);
    trainer.dry_run = true;
    let plan = crate::memory::estimate(config, config.train.batch_size, num_classes);
    let dry_run = burn::cubecl::dry_run::DryRun::new();
    let mut run = || -> Result<u64> {
        first_applied_step(&mut trainer, &batches)?;
        crate::device::size_the_pools(&device.device, plan.largest_allocation);
        for _ in 0..steps {
            bench_step(&mut trainer, &batches, false)?;
        }
        crate::memory::probe::sample(&device.device)
            .map(|(_, reserved)| reserved)
            .ok_or_else(|| Error::Device(format!("{} reports no memory pools to measure", device.name)))
    };
    let bytes_reserved = run();
    drop(dry_run);
    drop(trainer);
    // The lazy pages go back on every path, so the device is as it was.
    device.device.memory_cleanup();
    Ok(DryRunMemory { bytes_reserved: bytes_reserved?, secs: start.elapsed().as_secs_f64() })
}

/// A trainer for `total_steps` steps of `config` on synthetic images, and its step's batches.
fn bench_trainer(
    config: &Config,
    device: &SelectedDevice,
    num_classes: usize,
    total_steps: usize,
) -> (Trainer, Vec<Batch>) {
    let trainer = Trainer::new(
        config,
        precision_on(config, device),
        &device.device,
        (0..num_classes).map(|i| i.to_string()).collect(),
        total_steps,
        1,
    );
    let batch = synthetic_batch(config, num_classes);
    (trainer, vec![batch; config.train.grad_accum_steps])
}

/// A run's first step as the training loop runs it: outside the pools
/// ([`Trainer::step_outside_the_pools`]), repeated until one is applied. A step the f16 loss
/// scaler skips makes no AdamW moments, so steps measured after it would miss them: batch 1,
/// 283 px, f16, 661 classes (12gb) skipped its first two steps at the starting scale, and its
/// two measured steps reserved 63.6 MiB against 89.1 MiB once the moments existed. The trainer
/// fails the run after `train.max_skipped_steps` skipped in a row, which ends the loop.
fn first_applied_step(trainer: &mut Trainer, batches: &[Batch]) -> Result<()> {
    while !trainer.step_outside_the_pools(batches, false, &mut |_e: Event| {})?.applied {}
    Ok(())
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
    use super::*;
    use crate::device::{CpuBackend, DeviceChoice};

    /// Steps the loss scaler skips are repeated until one is applied, so a measurement's steps
    /// come after the AdamW moments exist: a scale of 2^100 overflows the gradients (f16 and f32
    /// alike) until the scaler has halved it enough, and then exactly one step is applied.
    #[test]
    fn the_first_step_is_repeated_until_one_is_applied() {
        let mut config = crate::config::presets::load_config("quickstart").unwrap();
        config.train.batch_size = 4;
        config.train.precision = crate::config::Precision::F16;
        config.train.max_skipped_steps = 200;
        let device = crate::device::select(DeviceChoice::Cpu(CpuBackend::Flex)).unwrap();
        let (mut trainer, batches) = bench_trainer(&config, &device, 10, 1);
        let start = 2f32.powi(100);
        trainer.state.scaler.scale = start;
        first_applied_step(&mut trainer, &batches).unwrap();
        assert_eq!(trainer.state.global_step, 1);
        let halvings = (start / trainer.state.scaler.scale).log2();
        assert!(halvings >= 1.0, "no step was skipped (scale {})", trainer.state.scaler.scale);
        assert_eq!(trainer.state.scaler.skipped_in_a_row, 0);
        assert_eq!(trainer.state.scaler.good_steps, 1);
    }
}
