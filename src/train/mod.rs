//! Training: one run loop with two stores, and the drivers that run it.
//!
//! A run goes through named phases: check the data and the precision, plan the memory, open its
//! store, the epochs of optimizer steps (with the retry at half the micro-batch and the budget
//! held), the end of each epoch (evaluation, metrics, checkpoint) and the finish. The phases are
//! written once ([`run`], [`epoch`]) and run over one of two stores ([`run::Store`]):
//!
//! - a **run folder** ([`train`]): CSV metrics, checkpoints, resume and the export, what the CLI
//!   and the app's worker process train into;
//! - **memory** ([`train_in_memory`]): nothing is written and the model is handed back, what a
//!   browser page (which has no disk) and the session's in-memory job train into.
//!
//! Both are one async function ([`phases::run`]); natively [`train`] blocks on it, and a page awaits
//! it. One optimizer step is [`step`]'s: AdamW with warmup + cosine, label smoothing,
//! global-norm gradient clipping, gradient accumulation, f16 with dynamic loss scaling,
//! activation checkpointing and a NaN guard. The overfit check and the benchmarks' probes
//! ([`probes`]) drive the same step.
//!
//! # Batches
//! `train.batch_size` is the **loader batch**: the images the loader decodes together. One
//! optimizer step takes `grad_accum_steps` loader batches. When memory requires it a loader
//! batch is split `split_factor` ways into **micro-batches** (what one forward pass takes), and
//! the accumulation grows by the same factor: `micro_batch = ceil(loader_batch / split_factor)`,
//! computed in `Run::micro_batch` only.

use std::path::PathBuf;

use crate::config::Config;
use crate::data::dataset::Splits;
use crate::device::SelectedDevice;
use crate::engine::error::Result;
use crate::engine::events::{EventSink, LiveBudget, RunEnd, StopSignal};
use crate::export::TrainingInfo;
use crate::inference::eval::EvalResult;
use crate::memory::probe::MemoryTracker;

pub mod checkpoint;
mod data_parallel;
mod epoch;
mod epoch_data;
mod in_memory;
mod pass;
mod phases;
pub mod precision;
pub mod probes;
mod run;
pub mod run_dir;
mod run_folder;
pub mod run_metrics;
pub mod schedule;
pub mod step;
mod store;

pub use in_memory::{InMemoryRequest, TrainedModel, train_in_memory};
pub use probes::{
    DryRunMemory, OVERFIT_CHECK_STEPS, OverfitResult, StepMemory, TrainingRate, dry_run_step_memory,
    measure_data_parallel, measure_step_memory, measure_training, overfit_check, synthetic_batch,
};
pub use step::smoothed_cross_entropy;
pub use store::{EPOCHS_HEADER, METRICS_HEADER};

/// What to train into a run folder, and how.
#[derive(Clone, Debug)]
pub struct TrainRequest {
    /// The configuration (already overridden by flags).
    pub config: Config,
    /// Run folder: config, checkpoints, metrics, export.
    pub out_dir: PathBuf,
    /// Continue from the run folder's latest checkpoint.
    pub resume: bool,
    /// With `resume`: when the newest checkpoint's optimizer state is damaged, continue from its
    /// intact weights with fresh AdamW state (moments reset, step count kept) rather than from
    /// an older checkpoint.
    pub fresh_optimizer: bool,
    /// When the prediction exceeds the budget, shrink the micro-batch (keeping the effective
    /// batch with accumulation) instead of refusing.
    pub auto_fit: bool,
    /// Stop after this many optimizer steps in total (benchmarks, tests); a checkpoint is written.
    pub max_steps: Option<usize>,
    /// Write the export (bpk + safetensors + metadata) when training completes.
    pub export: bool,
    /// A budget that may move while the run trains (the app's slider); `None` holds to
    /// `config.memory.memory_budget_bytes`.
    pub live_budget: Option<LiveBudget>,
    /// Data parallelism: the devices besides the main one (`--devices`'s second and later),
    /// each running a share of every step's micro-batches (micro-batch `i` on device
    /// `i mod (1 + replicas.len())`); the model, the optimizer and the checkpoints stay on the
    /// main device. Empty: one device.
    pub replicas: Vec<SelectedDevice>,
}

impl TrainRequest {
    /// A request with defaults: no resume, no auto-fit, no step cap, export at the end.
    pub fn new(config: Config, out_dir: impl Into<PathBuf>) -> Self {
        Self {
            config,
            out_dir: out_dir.into(),
            resume: false,
            fresh_optimizer: false,
            auto_fit: false,
            max_steps: None,
            export: true,
            live_budget: None,
            replicas: Vec::new(),
        }
    }
}

/// How a run ended.
#[derive(Clone, Debug)]
pub struct TrainSummary {
    /// Run folder (empty for a run kept in memory).
    pub out_dir: PathBuf,
    /// Epochs fully completed.
    pub epochs_completed: usize,
    /// Optimizer steps taken in total.
    pub global_step: usize,
    /// Last validation result.
    pub val: Option<EvalResult>,
    /// Stopped early (user stop or step cap) rather than finished.
    pub stopped: bool,
    /// Wall time of this invocation in seconds.
    pub wall_secs: f64,
    /// Predicted peak device bytes.
    pub predicted_peak_bytes: u64,
    /// Measured memory (GPU only).
    pub memory: MemoryTracker,
    /// Training images per second over this invocation.
    pub images_per_sec: f64,
    /// Undecodable samples skipped over the run.
    pub skipped: usize,
    /// Export folder, when written.
    pub export_dir: Option<PathBuf>,
    /// Images per forward pass in effect at the end (the loader batch split `split_factor` ways).
    pub micro_batch: usize,
    /// Accumulation in effect at the end (micro-batches per optimizer step).
    pub grad_accum_steps: usize,
}

impl TrainSummary {
    /// How the run ended, as [`crate::engine::events::Event::Finished`] reports it.
    pub fn run_end(&self) -> RunEnd {
        RunEnd {
            stopped: self.stopped,
            global_step: self.global_step,
            epochs_completed: self.epochs_completed,
            export_dir: self.export_dir.clone(),
            val: self.val.clone(),
        }
    }

    /// What an export's `model.json` records of this run, trained on the device named `device`.
    pub fn training_info(&self, device: &str) -> TrainingInfo {
        TrainingInfo {
            epochs: self.epochs_completed,
            steps: self.global_step,
            val_accuracy: self.val.as_ref().map(|v| v.top1),
            device: device.to_string(),
        }
    }
}

/// Trains (or resumes) a run in a run folder, on the calling thread: [`run::run`] with the
/// folder store, driven to completion. `stop` ends it before the next step, with a checkpoint.
///
/// # Errors
/// [`crate::Error::Memory`] when the configuration cannot fit the budget or the adapter's buffer
/// limit (before anything runs), [`crate::Error::Diverged`] from the NaN guard,
/// [`crate::Error::Device`] when the device fails at micro-batch 1, [`crate::Error::Dataset`]
/// when an epoch gives no trainable image, [`crate::Error::Io`] for run-folder files. The last
/// checkpoint stays valid in every case.
pub fn train(
    req: &TrainRequest,
    device: &SelectedDevice,
    splits: &Splits,
    sink: EventSink,
    stop: &StopSignal,
) -> Result<TrainSummary> {
    let options = store::RunOptions {
        config: &req.config,
        max_steps: req.max_steps,
        auto_fit: req.auto_fit,
        live_budget: req.live_budget.as_ref(),
        replicas: &req.replicas,
        store: store::Store::Folder {
            out: &req.out_dir,
            resume: req.resume,
            export: req.export,
            fresh_optimizer: req.fresh_optimizer,
        },
    };
    let ended = pollster::block_on(phases::run(options, device, splits, sink, stop))?;
    Ok(ended.summary)
}
