//! What the engine reports while it works, and how it is told to stop.
//!
//! The engine calls an [`EventSink`] (a plain callback) from the thread it runs on; the CLI
//! renders events with progress bars, the app forwards them over a channel to its UI thread.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// One progress report from training or evaluation.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Event {
    /// Training began (or resumed).
    Started {
        /// Adapter or backend name.
        device: String,
        /// Run folder.
        out_dir: PathBuf,
        /// First epoch to run (0-based; > 0 when resuming).
        start_epoch: usize,
        /// Total epochs.
        epochs: usize,
        /// Optimizer steps per epoch.
        steps_per_epoch: usize,
        /// Training and validation sample counts.
        samples: (usize, usize),
        /// The run's memory plan: the config it trains (after `--auto-fit`) against the budget;
        /// `plan.estimate.total` is the predicted peak (bytes reserved). The app shows it while
        /// the run lasts.
        plan: Box<crate::memory::Plan>,
        /// The micro-batch and its accumulation steps (a resumed run keeps its halvings).
        #[serde(default)]
        micro_batch: (usize, usize),
        /// Training batches are cropped, augmented and normalized on the device
        /// (`shaders/augment_rgb8.wgsl`) rather than by the loader's CPU workers.
        #[serde(default)]
        augment_on_device: bool,
    },
    /// One optimizer step finished.
    Step {
        /// Global optimizer step (1-based, continues across resume).
        step: usize,
        /// Epoch (0-based).
        epoch: usize,
        /// Mean training loss of the step's micro-batches.
        loss: f32,
        /// Training accuracy of the step's micro-batches, 0..1.
        accuracy: f32,
        /// Learning rate used.
        lr: f64,
        /// Training images per second over the step.
        images_per_sec: f64,
        /// Seconds of the step spent waiting for the loader's batches: the device idle for want
        /// of data (0 when the prefetch queue kept up).
        #[serde(default)]
        data_wait_secs: f64,
    },
    /// A device-memory sample (taken every `memory_sample_every` steps; it synchronizes).
    Memory {
        /// Global step.
        step: usize,
        /// Bytes held by live tensors.
        bytes_in_use: u64,
        /// Bytes reserved by the allocator.
        bytes_reserved: u64,
        /// Running maximum of `bytes_in_use` samples this run.
        peak_bytes_in_use: u64,
    },
    /// An epoch ended and was evaluated.
    EpochEnd {
        /// Epoch (0-based).
        epoch: usize,
        /// Mean training loss over the epoch's steps this run trained; `None` when it trained
        /// none (an epoch resumed at its end), never a NaN.
        train_loss: Option<f32>,
        /// Training accuracy, 0..1 (`None` as `train_loss`).
        train_accuracy: Option<f32>,
        /// Validation loss.
        #[serde(deserialize_with = "f32_or_nan")]
        val_loss: f32,
        /// Validation top-1 accuracy, 0..1.
        #[serde(deserialize_with = "f32_or_nan")]
        val_accuracy: f32,
        /// Wall time of the epoch in seconds.
        secs: f64,
        /// Samples skipped this epoch (undecodable files).
        skipped: usize,
        /// Seconds of `secs` the training loop waited for the input pipeline's next batch:
        /// near 0 when decoding keeps up, most of the epoch when the loader sets the pace.
        #[serde(default)]
        data_wait_secs: f64,
    },
    /// A checkpoint was written.
    Checkpoint {
        /// Its folder.
        path: PathBuf,
    },
    /// Something the user should know that does not stop the run.
    Warning(String),
    /// A training sample could not be used (undecodable, over the pixel cap) and was left out.
    SampleSkipped {
        /// The file (or `file#index` inside an IDX file).
        source: String,
        /// Why, with the fix where there is one.
        reason: String,
    },
    /// A plain note (e.g. predicted vs measured memory after the first epoch).
    Info(String),
    /// The run returned normally (finished, stopped or capped): its last event.
    Finished(RunEnd),
    /// The micro-batch was changed to hold the memory budget.
    BatchAdapted {
        /// Images per forward pass from now on.
        micro_batch: usize,
        /// New accumulation steps (effective batch unchanged).
        grad_accum_steps: usize,
        /// Why.
        reason: String,
    },
}

/// How a run that returned normally ended (a summary that crosses process boundaries).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunEnd {
    /// Stopped early (user stop or step cap) rather than finished.
    pub stopped: bool,
    /// Optimizer steps taken in total.
    pub global_step: usize,
    /// Epochs fully completed.
    pub epochs_completed: usize,
    /// Export folder, when written.
    pub export_dir: Option<PathBuf>,
    /// Last validation result.
    pub val: Option<crate::inference::eval::EvalResult>,
}

/// Receiver of engine events.
pub type EventSink<'a> = &'a mut dyn FnMut(Event);

impl Event {
    /// An epoch's metrics in words, `epoch N: train loss L acc A | val loss L acc A` ("n/a"
    /// where nothing was measured); `None` for other events. The CLI and the app's log add
    /// their own timings.
    pub fn epoch_metrics_line(&self) -> Option<String> {
        use crate::inference::eval::{loss_or_na, percent_or_na};
        let Event::EpochEnd { epoch, train_loss, train_accuracy, val_loss, val_accuracy, .. } = self else {
            return None;
        };
        Some(format!(
            "epoch {}: train loss {} acc {} | val loss {} acc {}",
            epoch + 1,
            loss_or_na(train_loss.unwrap_or(f32::NAN)),
            percent_or_na(train_accuracy.unwrap_or(f32::NAN)),
            loss_or_na(*val_loss),
            percent_or_na(*val_accuracy)
        ))
    }
}

/// A cloneable stop flag: set it from any thread; a training run stops before its next step
/// (the step under way finishes), saving a checkpoint in a run folder; a stop that falls on an
/// epoch's last step lets that epoch end (evaluated) first.
#[derive(Clone, Debug, Default)]
pub struct StopSignal(Arc<AtomicBool>);

impl StopSignal {
    /// A new, unset signal.
    pub fn new() -> Self {
        Self::default()
    }
    /// Asks the engine to stop.
    pub fn stop(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    /// Withdraws a stop (a new job starts).
    pub fn clear(&self) {
        self.0.store(false, Ordering::SeqCst);
    }
    /// Whether a stop was asked for.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The memory budget a running job holds to, in bytes, shared with whoever may move it (the
/// app's budget slider stays live while training). The engine reads it at every memory sample:
/// when the measured peak is over it, the micro-batch halves (see [`crate::train::train`]).
#[derive(Clone, Debug)]
pub struct LiveBudget(Arc<AtomicU64>);

impl LiveBudget {
    /// A budget of `bytes`.
    pub fn new(bytes: u64) -> Self {
        Self(Arc::new(AtomicU64::new(bytes)))
    }
    /// Moves the budget to `bytes`; the engine acts on it at its next memory sample.
    pub fn set(&self, bytes: u64) {
        self.0.store(bytes, Ordering::SeqCst);
    }
    /// The budget now, in bytes.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// The message of a caught panic (the payload of `JoinHandle::join`'s error), for the thread
/// edges that turn an engine panic into an error message.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

/// Reads an `f32` that JSON may carry as `null` (serde_json writes NaN, "not measured", so).
///
/// # Errors
/// The deserializer's error for anything but a number or null.
pub fn f32_or_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
    Ok(<Option<f32> as serde::Deserialize>::deserialize(d)?.unwrap_or(f32::NAN))
}
