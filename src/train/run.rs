//! The run loop's phases around the epochs: check the data and the precision (1), plan the
//! memory (2), open the store (3, [`super::run_folder`] for a run folder), the epochs
//! ([`super::epoch`]), the end of each epoch (6) and the finish (7). One async function,
//! [`run`], for both stores.

use std::path::{Path, PathBuf};

use burn::module::Module;
use web_time::Instant;

use super::TrainSummary;
use super::epoch::{EpochData, EpochTotals};
use super::run_folder::{self, csv_append};
use super::step::{Trainer, precision_on};
use crate::config::Config;
use crate::dataset::Splits;
use crate::device::SelectedDevice;
use crate::error::{Error, Result};
use crate::eval::{self, EvalResult};
use crate::events::{Event, EventSink, LiveBudget, RunEnd, StopSignal};
use crate::loader::{self, SamplePipeline};
use crate::memory::{self, MemoryTracker, human_bytes};
use crate::model::Classifier;

/// Where a run keeps what it makes.
#[derive(Clone, Copy, Debug)]
pub(super) enum Store<'a> {
    /// A run folder: its lock, `config.toml`, `metrics.csv` and `epochs.csv` rows, checkpoints
    /// (resume continues from the newest) and, when `export`, the export of a finished run.
    Folder {
        /// The run folder.
        out: &'a Path,
        /// Continue from its newest intact checkpoint.
        resume: bool,
        /// Write `export/` when the run finishes.
        export: bool,
    },
    /// Memory: nothing is written; the model is handed back. The loader builds batches on the
    /// calling thread (a page has no other), without the image cache's disk and with the
    /// augmentation on the CPU, as a page computes them.
    Memory,
}

/// What a run is asked to do, whichever its store.
pub(super) struct RunOptions<'a> {
    /// The configuration (flags applied).
    pub(super) config: &'a Config,
    /// Stop after this many optimizer steps in total (the schedule still spans the epochs).
    pub(super) max_steps: Option<usize>,
    /// Over the budget, shrink the micro-batch (accumulation keeps the effective batch) instead
    /// of refusing.
    pub(super) auto_fit: bool,
    /// A budget that may move while the run trains; `None` holds to the config's.
    pub(super) live_budget: Option<&'a LiveBudget>,
    /// Where the run keeps what it makes.
    pub(super) store: Store<'a>,
}

/// What a finished (or stopped) run leaves: its summary, and the model for a run kept in memory.
pub(super) struct Ended {
    pub(super) summary: TrainSummary,
    /// The trained network without autodiff, for [`Store::Memory`].
    pub(super) model: Option<Classifier>,
    /// The model's config and classes (what `model.json` records).
    pub(super) config: Config,
    pub(super) classes: Vec<String>,
    /// The training loss of every applied optimizer step of this invocation, in order.
    pub(super) losses: Vec<f32>,
}

/// Runs the phases of a training run on `device` over `splits`, sending [`Event`]s to `sink`:
/// [`Event::Started`], per step [`Event::Step`] (and [`Event::Memory`] where sampled), per epoch
/// [`Event::EpochEnd`], and [`Event::Finished`] last. Stop is honoured before each step; the
/// step cap after the step that reaches it; either one falling on an epoch's last step still
/// ends that epoch (evaluated, counted as completed).
///
/// # Errors
/// As [`super::train`]; [`Store::Memory`] writes nothing, so it has no I/O errors of its own.
pub(super) async fn run(
    options: RunOptions<'_>,
    device: &SelectedDevice,
    splits: &Splits,
    sink: EventSink<'_>,
    stop: &StopSignal,
) -> Result<Ended> {
    let started = Instant::now();
    if let Store::Folder { out, .. } = options.store {
        std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    }
    let config = check_data_and_precision(&options, device, splits, sink)?;
    let config = plan_memory(&options, device, splits, config, sink)?;
    let mut run = Run::new(options, device, splits, config);
    let _lock = run.open_store(sink)?;
    sink(run.started_event(splits));
    if let Some(why) = run.nothing_to_train() {
        // Nothing to train: leave the run's export as it is.
        sink(Event::Warning(format!("nothing to train: {why}")));
        run.summary.stopped = run.trainer.state.epoch < run.config.train.epochs;
    } else {
        let data = EpochData::new(splits, &run.config, run.augments_on_device(), run.options.store);
        while run.trainer.state.epoch < run.config.train.epochs {
            let epoch_start = Instant::now();
            let totals = run.train_epoch(&data, sink, stop).await?;
            if run.summary.stopped {
                break;
            }
            run.end_epoch(&data, &totals, epoch_start, sink).await?;
            let more = run.trainer.state.epoch < run.config.train.epochs;
            if more && (stop.is_set() || run.capped()) {
                run.summary.stopped = true;
                break;
            }
        }
        if run.summary.stopped && matches!(run.options.store, Store::Memory) {
            // A model handed back cut short: the end's accuracy is of the model as it is now.
            run.summary.val = Some(run.evaluate(&data).await?);
        }
    }
    let ended = run.finish(started)?;
    sink(Event::Finished(RunEnd {
        stopped: ended.summary.stopped,
        global_step: ended.summary.global_step,
        epochs_completed: ended.summary.epochs_completed,
        export_dir: ended.summary.export_dir.clone(),
        val: ended.summary.val.clone(),
    }));
    Ok(ended)
}

/// Phase 1: the data can train (warnings sent), and the precision the device can compute in
/// (f16 falls back to f32 on a device without it, with a warning).
fn check_data_and_precision(
    options: &RunOptions<'_>,
    device: &SelectedDevice,
    splits: &Splits,
    sink: EventSink,
) -> Result<Config> {
    let mut config = options.config.clone();
    if splits.train.samples.is_empty() {
        let path = match options.store {
            Store::Folder { out, .. } => out.to_path_buf(),
            Store::Memory => splits.root.clone(),
        };
        return Err(Error::Dataset { path, message: "no training samples".into() });
    }
    let probe = SamplePipeline::from_config(&config, false);
    for warning in
        splits.report.warnings().into_iter().chain(splits.check_trainable(|source| probe.decode(source).is_ok())?)
    {
        sink(Event::Warning(warning));
    }
    let precision = precision_on(&config, device);
    if precision != config.train.precision {
        sink(Event::Warning(format!("{} has no shader f16: training in f32", device.name)));
        config.train.precision = precision;
    }
    Ok(config)
}

/// Phase 2: the predicted peak fits the budget (or `auto_fit` makes it fit) and one
/// micro-batch's largest tensor fits the adapter's buffer limit, before anything is allocated.
fn plan_memory(
    options: &RunOptions<'_>,
    device: &SelectedDevice,
    splits: &Splits,
    mut config: Config,
    sink: EventSink,
) -> Result<Config> {
    let classes = splits.train.class_names.len();
    let px = config.image_size_px();
    let image_hw = loader::check_sizes_agree(&splits.train, &config.data.preprocess)?.unwrap_or((px, px));
    let plan = memory::plan(&config, classes);
    if !plan.fits {
        if plan.fit_batch_size == 0 {
            return Err(Error::Memory(format!(
                "predicted peak {} {} of the {} budget (memory.memory_budget_bytes), and not even batch 1 fits: \
                 lower data.preprocess.crop_size or the model's width, turn on f16 or checkpointing, or raise the budget",
                human_bytes(plan.estimate.total),
                plan.verdict(),
                human_bytes(plan.budget_bytes),
            )));
        }
        if !options.auto_fit {
            return Err(Error::Memory(format!(
                "predicted peak {} {} of the {} budget (memory.memory_budget_bytes); set train.batch_size = {} with \
                 train.grad_accum_steps = {} to keep the effective batch, turn on checkpointing or f16, or pass --auto-fit",
                human_bytes(plan.estimate.total),
                plan.verdict(),
                human_bytes(plan.budget_bytes),
                plan.fit_batch_size,
                plan.fit_grad_accum_steps
            )));
        }
        sink(Event::BatchAdapted {
            micro_batch: plan.fit_batch_size,
            grad_accum_steps: plan.fit_grad_accum_steps,
            reason: format!("--auto-fit: batch {} {}", config.train.batch_size, plan.verdict()),
        });
        config.train.batch_size = plan.fit_batch_size;
        config.train.grad_accum_steps = plan.fit_grad_accum_steps;
    }
    if let Some(limit) = device.buffer_limit() {
        memory::check_buffer_limit(&config.model, classes, image_hw, config.train.batch_size, limit, &device.name)?;
    }
    Ok(config)
}

/// A run in progress: what the phases read and update.
pub(super) struct Run<'a> {
    pub(super) options: RunOptions<'a>,
    pub(super) device: &'a SelectedDevice,
    pub(super) config: Config,
    pub(super) classes: Vec<String>,
    /// The run's memory plan, computed once (phase 2's config) and handed down.
    pub(super) estimate: memory::MemoryEstimate,
    /// Images the loader decodes per batch (`train.batch_size`).
    pub(super) loader_batch: usize,
    /// Loader batches per optimizer step (`train.grad_accum_steps`).
    pub(super) accum: usize,
    /// Loader batches per epoch.
    pub(super) n_batches: usize,
    pub(super) steps_per_epoch: usize,
    pub(super) trainer: Trainer,
    pub(super) summary: TrainSummary,
    pub(super) images_trained: usize,
    /// The next finished step is the first at its micro-batch shape (the run's first step, or
    /// the first after a halving): its autotune pages are handed back after it.
    pub(super) new_shape: bool,
    pub(super) train_secs: f64,
    /// `(epoch, global_step, batches_done_in_epoch)` of the newest checkpoint, so a stop does
    /// not write the same checkpoint twice.
    pub(super) saved_at: Option<(usize, usize, usize)>,
    pub(super) losses: Vec<f32>,
}

impl<'a> Run<'a> {
    fn new(options: RunOptions<'a>, device: &'a SelectedDevice, splits: &Splits, config: Config) -> Self {
        let classes = splits.train.class_names.clone();
        let estimate = memory::estimate(&config, config.train.batch_size, classes.len());
        let (loader_batch, accum) = (config.train.batch_size.max(1), config.train.grad_accum_steps.max(1));
        let n_batches = splits.train.samples.len().div_ceil(loader_batch);
        let steps_per_epoch = crate::schedule::steps_per_epoch(splits.train.samples.len(), &config.train);
        let steps_total = steps_per_epoch * config.train.epochs;
        let precision = config.train.precision;
        let trainer = Trainer::new(&config, precision, &device.device, classes.clone(), steps_total, steps_per_epoch);
        let out_dir = match options.store {
            Store::Folder { out, .. } => out.to_path_buf(),
            Store::Memory => PathBuf::new(),
        };
        let summary = TrainSummary {
            out_dir,
            epochs_completed: 0,
            global_step: 0,
            val: None,
            stopped: false,
            wall_secs: 0.0,
            predicted_peak_bytes: estimate.total,
            memory: MemoryTracker::default(),
            images_per_sec: 0.0,
            skipped: 0,
            export_dir: None,
            micro_batch: loader_batch,
            grad_accum_steps: accum,
        };
        Self {
            options,
            device,
            config,
            classes,
            estimate,
            loader_batch,
            accum,
            n_batches,
            steps_per_epoch,
            trainer,
            summary,
            images_trained: 0,
            new_shape: true,
            train_secs: 0.0,
            saved_at: None,
            losses: Vec::new(),
        }
    }

    /// The micro-batch in use and its accumulation steps: the loader batch split
    /// `split_factor` ways (the one place this is computed; clients get it in
    /// [`Event::Started`] and [`Event::BatchAdapted`]).
    pub(super) fn micro_batch(&self) -> (usize, usize) {
        let split = self.trainer.state.split_factor;
        (self.loader_batch.div_ceil(split), self.accum * split)
    }

    /// Whether the step cap is reached.
    pub(super) fn capped(&self) -> bool {
        self.options.max_steps.is_some_and(|m| self.trainer.state.global_step >= m)
    }

    /// Whether training batches go to the device's augmentation kernel (never for a run kept in
    /// memory: see [`Store::Memory`]).
    fn augments_on_device(&self) -> bool {
        matches!(self.options.store, Store::Folder { .. })
            && crate::device_augment::augments_on_device(&self.config, &self.device.device)
    }

    /// The run's [`Event::Started`].
    fn started_event(&self, splits: &Splits) -> Event {
        Event::Started {
            device: self.device.name.clone(),
            out_dir: self.summary.out_dir.clone(),
            start_epoch: self.trainer.state.epoch,
            epochs: self.config.train.epochs,
            steps_per_epoch: self.steps_per_epoch,
            samples: (splits.train.samples.len(), splits.val.samples.len()),
            predicted_peak_bytes: self.estimate.total,
            micro_batch: self.micro_batch(),
            augment_on_device: self.augments_on_device(),
        }
    }

    /// Why a resumed run has nothing to train (its epochs or the step cap are done), if so.
    fn nothing_to_train(&self) -> Option<String> {
        let state = &self.trainer.state;
        let resumed = matches!(self.options.store, Store::Folder { resume: true, .. });
        let max_steps = self.options.max_steps;
        let already_done = state.epoch >= self.config.train.epochs || self.capped();
        if !resumed || !already_done {
            return None;
        }
        Some(match max_steps {
            Some(m) if state.epoch < self.config.train.epochs => format!(
                "the run is at step {} and --max-steps {m} counts steps over the whole run; pass a larger --max-steps",
                state.global_step
            ),
            _ => format!(
                "the run has done {} of {} epochs ({} steps); pass --epochs N (N > {}) to extend it",
                state.epoch, self.config.train.epochs, state.global_step, state.epoch
            ),
        })
    }

    /// The model as it is now, evaluated on the validation split.
    async fn evaluate(&self, data: &EpochData) -> Result<EvalResult> {
        let workers = match self.options.store {
            Store::Folder { .. } => self.config.data.workers,
            Store::Memory => 0,
        };
        let settings = eval::EvalSettings {
            model: &self.config.model,
            batch_size: self.loader_batch.max(32),
            precision: self.config.train.precision,
            workers,
            buffer_limit: self.device.buffer_limit(),
        };
        let model = self.trainer.model().valid();
        eval::evaluate_async(&model, data.val.clone(), data.eval_pipe.clone(), &self.trainer.device, &settings).await
    }

    /// Phase 6: the epoch's evaluation and [`Event::EpochEnd`], its `epochs.csv` row and
    /// checkpoint (run folder), and after the first epoch the predicted against the measured
    /// memory.
    ///
    /// # Errors
    /// [`Error::Dataset`] when the epoch trained steps but none on a usable image (every image
    /// skipped): its metrics would be undefined.
    async fn end_epoch(
        &mut self,
        data: &EpochData,
        totals: &EpochTotals,
        epoch_start: Instant,
        sink: EventSink<'_>,
    ) -> Result<()> {
        let epoch = self.trainer.state.epoch;
        if totals.batches > 0 && totals.images == 0 {
            return Err(Error::Dataset {
                path: data.root.clone(),
                message: format!("epoch {epoch} gave no trainable batch (every image was skipped)"),
            });
        }
        let val = self.evaluate(data).await?;
        let secs = epoch_start.elapsed().as_secs_f64();
        let (train_loss, train_accuracy) = totals.means();
        sink(Event::EpochEnd {
            epoch,
            train_loss,
            train_accuracy,
            val_loss: val.loss,
            val_accuracy: val.top1,
            secs,
            skipped: totals.skipped,
            data_wait_secs: totals.data_wait_secs,
        });
        if let Store::Folder { out, .. } = self.options.store {
            let cell = |v: Option<f32>| v.map_or_else(String::new, |v| v.to_string());
            csv_append(
                &out.join(crate::run_dir::EPOCHS_CSV),
                run_folder::EPOCHS_HEADER,
                &format!(
                    "{epoch},{},{},{},{},{},{secs:.1},{}",
                    cell(train_loss),
                    cell(train_accuracy),
                    eval::csv_cell(val.loss),
                    eval::csv_cell(val.top1),
                    eval::csv_cell(val.top5),
                    totals.skipped
                ),
            )?;
        }
        self.report_first_epoch_memory(sink);
        let state = &mut self.trainer.state;
        state.best_val_accuracy = state.best_val_accuracy.max(val.top1);
        state.epoch += 1;
        state.batches_done_in_epoch = 0;
        self.summary.val = Some(val);
        self.save_checkpoint(sink)?;
        self.summary.epochs_completed = self.trainer.state.epoch;
        Ok(())
    }

    /// After the first epoch on a device with pools: the plan against the measured peak.
    fn report_first_epoch_memory(&self, sink: EventSink) {
        let t = self.trainer.tracker;
        if self.trainer.state.epoch == 0 && t.peak_bytes_reserved > 0 {
            sink(Event::Info(format!(
                "memory after epoch 1: predicted peak {} vs measured {} reserved (ratio {:.2}); bytes_in_use after forward {}, pools high-water {}",
                human_bytes(self.estimate.total),
                human_bytes(t.peak_bytes_reserved),
                self.estimate.total as f64 / t.peak_bytes_reserved as f64,
                human_bytes(t.peak_bytes_in_use),
                human_bytes(t.pools_high_water)
            )));
        }
    }

    /// A checkpoint of the run as it is now, in a run folder, unless the newest one already is
    /// ([`Event::Checkpoint`] sent); nothing for a run kept in memory.
    pub(super) fn save_checkpoint(&mut self, sink: EventSink) -> Result<()> {
        let Store::Folder { out, .. } = self.options.store else { return Ok(()) };
        let s = &self.trainer.state;
        let at = (s.epoch, s.global_step, s.batches_done_in_epoch);
        if self.saved_at == Some(at) {
            return Ok(());
        }
        let dir = self.trainer.save(out)?;
        self.saved_at = Some(at);
        sink(Event::Checkpoint { path: dir });
        Ok(())
    }

    /// Phase 7: the summary, the export of a run folder that finished, and the model of a run
    /// kept in memory.
    fn finish(mut self, started: Instant) -> Result<Ended> {
        let (micro_batch, grad_accum_steps) = self.micro_batch();
        let summary = &mut self.summary;
        summary.global_step = self.trainer.state.global_step;
        summary.epochs_completed = self.trainer.state.epoch;
        summary.micro_batch = micro_batch;
        summary.grad_accum_steps = grad_accum_steps;
        summary.memory = self.trainer.tracker;
        summary.images_per_sec = self.images_trained as f64 / self.train_secs.max(1e-9);
        let model = self.trainer.model().valid();
        let model = match self.options.store {
            Store::Folder { out, export, .. } => {
                if export && !summary.stopped {
                    let info = crate::export::TrainingInfo {
                        epochs: summary.epochs_completed,
                        steps: summary.global_step,
                        val_accuracy: summary.val.as_ref().map(|v| v.top1),
                        device: self.device.name.clone(),
                    };
                    let dir = out.join(crate::run_dir::EXPORT);
                    crate::export::export(&model, &self.config, &self.classes, &info, &dir)?;
                    summary.export_dir = Some(dir);
                }
                None
            }
            Store::Memory => Some(model),
        };
        summary.wall_secs = started.elapsed().as_secs_f64();
        Ok(Ended { summary: self.summary, model, config: self.config, classes: self.classes, losses: self.losses })
    }
}
