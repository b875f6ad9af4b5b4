//! Training without a run folder: the loop a browser tab runs, where there is no disk to write
//! checkpoints to. The model lives in memory and is handed back at the end; nothing survives
//! the process (or the tab), so Resume does not exist here.
//!
//! It is the run loop of [`super::train`] itself ([`super::phases::run`]) over the memory store:
//! the same phases, steps, halving retry, live budget, evaluations and [`crate::engine::events::Event`]s, so the app's
//! plots and the CLI's progress read it unchanged. What it leaves out is what needs a disk: the
//! run folder, checkpoints and the export; and loader threads (batches are decoded on the calling
//! thread, which is the only one a page has).
//!
//! Its device reads are awaited: in a browser the page keeps running between them; natively
//! the engine session drives it with `pollster::block_on` ([`crate::engine::session::Job::TrainInMemory`]).

use burn::module::Module;
use burn::tensor::Device;

use super::phases;
use super::store::{RunOptions, Store};
use crate::config::Config;
use crate::data::dataset::Splits;
use crate::device::SelectedDevice;
use crate::engine::error::{Error, Result};
use crate::engine::events::{EventSink, LiveBudget, RunEnd, StopSignal};
use crate::export::ModelMetadata;
use crate::model::Classifier;

/// What [`train_in_memory`] trains.
#[derive(Clone, Debug)]
pub struct InMemoryRequest {
    /// The config: epochs, batch size, accumulation, precision, optimizer and schedule are used
    /// as the run-folder loop uses them.
    pub config: Config,
    /// Stop after this many optimizer steps (the schedule still spans the config's epochs).
    pub max_steps: Option<usize>,
    /// Over the budget, shrink the micro-batch (accumulation keeps the effective batch) instead
    /// of refusing.
    pub auto_fit: bool,
    /// A budget that may move while the run trains; `None` holds to the config's.
    pub live_budget: Option<LiveBudget>,
}

impl InMemoryRequest {
    /// A request for `config` with no step cap, no auto-fit and the config's budget.
    pub fn new(config: Config) -> Self {
        Self { config, max_steps: None, auto_fit: false, live_budget: None }
    }
}

/// A model trained by [`train_in_memory`].
pub struct TrainedModel {
    /// The trained network, without autodiff, on [`Self::device`].
    pub model: Classifier,
    /// The device it trained on.
    pub device: Device,
    /// Bytes one tensor may occupy there (the adapter's buffer limit; `None` on the CPU).
    pub buffer_limit: Option<u64>,
    /// What an export's `model.json` would hold for it.
    pub metadata: ModelMetadata,
    /// How the run ended (`export_dir` is `None`: nothing was written).
    pub end: RunEnd,
    /// The training loss of every optimizer step, in order.
    pub losses: Vec<f32>,
}

impl std::fmt::Debug for TrainedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainedModel").field("end", &self.end).field("steps", &self.losses.len()).finish()
    }
}

/// Trains `request.config` on `splits.train` on `device`, evaluating on `splits.val` after each
/// epoch (and once at the end when a step cap or a stop cut the last epoch short), and hands the
/// model back. Events as [`super::train`] sends them, without [`crate::engine::events::Event::Checkpoint`]s.
///
/// # Errors
/// [`Error::Memory`] when the plan exceeds the budget (without `auto_fit`) or one micro-batch's
/// largest tensor exceeds the adapter's buffer limit (before anything is allocated);
/// [`Error::Dataset`] when the data cannot train or a whole epoch gives no trainable image;
/// [`Error::Device`] when a step fails on the device at micro-batch 1; [`Error::Diverged`] from
/// the NaN guard; evaluation's errors.
pub async fn train_in_memory(
    request: &InMemoryRequest,
    splits: &Splits,
    device: &SelectedDevice,
    sink: EventSink<'_>,
    stop: &StopSignal,
) -> Result<TrainedModel> {
    let options = RunOptions {
        config: &request.config,
        max_steps: request.max_steps,
        auto_fit: request.auto_fit,
        live_budget: request.live_budget.as_ref(),
        store: Store::Memory,
        replicas: &[],
    };
    let ended = phases::run(options, device, splits, sink, stop).await?;
    let model = ended.model.ok_or_else(|| Error::Crashed("a run kept in memory ended without its model".into()))?;
    let training = ended.summary.training_info(&device.name);
    let metadata = ModelMetadata::new(&ended.config, &ended.classes, model.num_params(), training);
    let end = ended.summary.run_end();
    Ok(TrainedModel {
        model,
        device: device.device.clone(),
        buffer_limit: device.buffer_limit(),
        metadata,
        end,
        losses: ended.losses,
    })
}
