//! A training run, in named phases: check the data and the precision, plan the memory, open the
//! run folder, resume, the epochs of optimizer steps (with the retry at half the micro-batch and
//! the budget held), the end of each epoch (evaluation, metrics, checkpoint) and the finish
//! (export). One optimizer step is [`crate::trainer`]'s: AdamW with warmup + cosine, label
//! smoothing, global-norm gradient clipping, gradient accumulation, f16 with dynamic loss
//! scaling, activation checkpointing and a NaN guard.

use std::io::Write;
use std::path::{Path, PathBuf};
use web_time::Instant;

use burn::module::Module;

use crate::checkpoint;
use crate::config::{Config, Precision};
use crate::dataset::Splits;
use crate::device::SelectedDevice;
use crate::error::{Error, Result};
use crate::eval::{self, EvalResult};
use crate::events::{Event, EventSink, LiveBudget, RunEnd, StopSignal};
use crate::loader::{self, SamplePipeline};
use crate::memory::{self, MemoryTracker, human_bytes};
use crate::precision::LossScaler;
use crate::run_dir;
use crate::trainer::Trainer;
pub use crate::trainer::{
    OverfitResult, StepMemory, TrainingRate, measure_step_memory, measure_training, overfit_check,
    smoothed_cross_entropy, synthetic_batch,
};

mod epoch;
use epoch::{EpochData, EpochTotals};

/// What to train and where.
#[derive(Clone, Debug)]
pub struct TrainRequest {
    /// The configuration (already overridden by flags).
    pub config: Config,
    /// Run folder: config, checkpoints, metrics, export.
    pub out_dir: PathBuf,
    /// Continue from the run folder's latest checkpoint.
    pub resume: bool,
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
}

impl TrainRequest {
    /// A request with defaults: no resume, no auto-fit, no step cap, export at the end.
    pub fn new(config: Config, out_dir: impl Into<PathBuf>) -> Self {
        Self {
            config,
            out_dir: out_dir.into(),
            resume: false,
            auto_fit: false,
            max_steps: None,
            export: true,
            live_budget: None,
        }
    }
}

/// How a run ended.
#[derive(Clone, Debug)]
pub struct TrainSummary {
    /// Run folder.
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
    /// Micro-batch size in effect at the end.
    pub batch_size: usize,
    /// Accumulation in effect at the end (micro-batches per optimizer step).
    pub grad_accum_steps: usize,
}

/// Keeps the header and the rows of a CSV file whose first column `keep` accepts, dropping the
/// rest (rows written after the checkpoint a run resumes from, so no step appears twice).
///
/// # Errors
/// [`Error::Io`] naming the file.
fn truncate_csv(path: &Path, keep: impl Fn(usize) -> bool) -> Result<usize> {
    let Ok(text) = std::fs::read_to_string(path) else { return Ok(0) };
    let mut out = String::with_capacity(text.len());
    let mut dropped = 0;
    for (i, line) in text.lines().enumerate() {
        let first = line.split(',').next().and_then(|v| v.parse::<usize>().ok());
        if i == 0 || first.is_some_and(&keep) {
            out.push_str(line);
            out.push('\n');
        } else {
            dropped += 1;
        }
    }
    if dropped > 0 {
        crate::atomic_file::write_atomic(path, out.as_bytes())?;
    }
    Ok(dropped)
}

fn csv_append(path: &Path, header: &str, line: &str) -> Result<()> {
    let new = !path.exists();
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| Error::io(path, e))?;
    if new {
        writeln!(f, "{header}").map_err(|e| Error::io(path, e))?;
    }
    writeln!(f, "{line}").map_err(|e| Error::io(path, e))
}

/// Header of `metrics.csv`.
pub const METRICS_HEADER: &str = "step,epoch,loss,accuracy,lr,images_per_sec,bytes_in_use,bytes_reserved";
/// Header of `epochs.csv`.
pub const EPOCHS_HEADER: &str = "epoch,train_loss,train_accuracy,val_loss,val_accuracy,val_top5,secs,skipped";

/// Trains (or resumes) a run. Runs on the calling thread; `stop` ends it after the current
/// step with a checkpoint.
///
/// # Errors
/// [`Error::Memory`] when the configuration cannot fit the budget or the adapter's buffer limit
/// (before anything runs), [`Error::Diverged`] from the NaN guard, [`Error::Device`] when the
/// device fails at micro-batch 1, [`Error::Io`] for run-folder files. The last checkpoint stays
/// valid in every case.
pub fn train(
    req: &TrainRequest,
    device: &SelectedDevice,
    splits: &Splits,
    sink: EventSink,
    stop: &StopSignal,
) -> Result<TrainSummary> {
    let started = Instant::now();
    let (mut run, _lock) = prepare(req, device, splits, sink)?;
    let summary = match nothing_to_train(req, &run) {
        Some(why) => {
            // Nothing to train: leave the run's export as it is.
            sink(Event::Warning(format!("nothing to train: {why}")));
            run.summary.stopped = run.trainer.state.epoch < run.config.train.epochs;
            run.summary.wall_secs = started.elapsed().as_secs_f64();
            run.summary
        }
        None => {
            let on_device = crate::device_augment::augments_on_device(&run.config, &device.device);
            let data = EpochData::new(splits, &run.config, on_device);
            while run.trainer.state.epoch < run.config.train.epochs {
                let epoch_start = Instant::now();
                let totals = run.train_epoch(&data, sink, stop)?;
                if run.summary.stopped {
                    break;
                }
                run.end_epoch(&data, &totals, epoch_start, sink)?;
                if stop.is_set() && run.trainer.state.epoch < run.config.train.epochs {
                    run.summary.stopped = true;
                    break;
                }
            }
            run.finish(started)?
        }
    };
    sink(Event::Finished(RunEnd {
        stopped: summary.stopped,
        global_step: summary.global_step,
        epochs_completed: summary.epochs_completed,
        export_dir: summary.export_dir.clone(),
        val: summary.val.clone(),
    }));
    Ok(summary)
}

/// Phases 1 to 3: data and precision checked, memory planned, the run folder locked (the
/// returned guard holds the lock), resumed from its checkpoint when asked, its config and
/// manifest written, and [`Event::Started`] sent.
fn prepare<'a>(
    req: &'a TrainRequest,
    device: &'a SelectedDevice,
    splits: &'a Splits,
    sink: EventSink,
) -> Result<(Run<'a>, checkpoint::RunLock)> {
    let out = &req.out_dir;
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let (config, precision) = check_data_and_precision(req, device, splits, sink)?;
    let config = plan_memory(req, device, splits, config, sink)?;
    let mut run = Run::new(req, device, splits, config, precision);
    let lock = open_run_folder(req, sink)?;
    if req.resume {
        run.resume(sink)?;
        if let Some(copy) = run_dir::preserve_foreign_config(out)? {
            sink(Event::Info(format!(
                "the run's config.toml had keys this vramfit does not know: kept as {}",
                copy.display()
            )));
        }
    }
    run_dir::write_manifest(out)?;
    // On resume this records the overrides that were applied (epochs, batch size, budget, ...).
    crate::atomic_file::write_atomic(&out.join(run_dir::CONFIG), run.config.to_toml().as_bytes())?;
    sink(Event::Started {
        device: device.name.clone(),
        out_dir: out.clone(),
        start_epoch: run.trainer.state.epoch,
        epochs: run.config.train.epochs,
        steps_per_epoch: run.steps_per_epoch,
        samples: (splits.train.samples.len(), splits.val.samples.len()),
        predicted_peak_bytes: run.estimate.total,
        micro_batch: run.micro_batch(),
        augment_on_device: crate::device_augment::augments_on_device(&run.config, &device.device),
    });
    Ok((run, lock))
}

/// Why a resumed run has nothing to train (its epochs or `--max-steps` are done), if so.
fn nothing_to_train(req: &TrainRequest, run: &Run<'_>) -> Option<String> {
    let state = &run.trainer.state;
    let already_done = state.epoch >= run.config.train.epochs || req.max_steps.is_some_and(|m| state.global_step >= m);
    if !req.resume || !already_done {
        return None;
    }
    Some(match req.max_steps {
        Some(m) if state.epoch < run.config.train.epochs => format!(
            "the run is at step {} and --max-steps {m} counts steps over the whole run; pass a larger --max-steps",
            state.global_step
        ),
        _ => format!(
            "the run has done {} of {} epochs ({} steps); pass --epochs N (N > {}) to extend it",
            state.epoch, run.config.train.epochs, state.global_step, state.epoch
        ),
    })
}

/// Phase 1: the data can train (warnings sent), and the precision the device can compute in.
fn check_data_and_precision(
    req: &TrainRequest,
    device: &SelectedDevice,
    splits: &Splits,
    sink: EventSink,
) -> Result<(Config, Precision)> {
    let mut config = req.config.clone();
    if splits.train.samples.is_empty() {
        return Err(Error::Dataset { path: req.out_dir.clone(), message: "no training samples".into() });
    }
    let probe = SamplePipeline::from_config(&config, false);
    for warning in
        splits.report.warnings().into_iter().chain(splits.check_trainable(|source| probe.decode(source).is_ok())?)
    {
        sink(Event::Warning(warning));
    }
    let mut precision = config.train.precision;
    if precision == Precision::F16 && !device.supports_f16() {
        sink(Event::Warning(format!("{} has no shader f16: training in f32", device.name)));
        precision = Precision::F32;
        config.train.precision = Precision::F32;
    }
    Ok((config, precision))
}

/// Phase 2: the predicted peak fits the budget (or `--auto-fit` makes it fit) and one micro-batch's
/// largest tensor fits the adapter's buffer limit, before anything is allocated.
fn plan_memory(
    req: &TrainRequest,
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
        if !req.auto_fit {
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
            batch_size: plan.fit_batch_size,
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

/// Phase 3: the run folder is ours: a new run refuses a folder holding one, a process lock is
/// held for the run, the manifest is checked (resume) and written, and temporaries of an
/// interrupted save are removed.
fn open_run_folder(req: &TrainRequest, sink: EventSink) -> Result<checkpoint::RunLock> {
    let out = &req.out_dir;
    if !req.resume {
        checkpoint::refuse_existing_run(out)?;
    }
    let lock = checkpoint::RunLock::acquire(out)?;
    if req.resume {
        // A folder of a newer format is refused before anything in it changes (the client that
        // read its config has shown the notes).
        run_dir::check_manifest(out)?;
    }
    let leftovers = checkpoint::remove_temporaries(out);
    if leftovers > 0 {
        sink(Event::Warning(format!(
            "removed {leftovers} temporary files left by an interrupted save in {}",
            out.display()
        )));
    }
    Ok(lock)
}

/// A run in progress: what the phases of [`train`] read and update.
struct Run<'a> {
    req: &'a TrainRequest,
    device: &'a SelectedDevice,
    config: Config,
    precision: Precision,
    classes: Vec<String>,
    estimate: memory::MemoryEstimate,
    /// Loader batch size (the micro-batch is `batch_size / trainer.state.split_factor`).
    batch_size: usize,
    accum: usize,
    n_batches: usize,
    steps_per_epoch: usize,
    trainer: Trainer,
    summary: TrainSummary,
    images_trained: usize,
    /// The next finished step is the first at its micro-batch shape (the run's first step, or
    /// the first after a halving): its autotune pages are handed back after it.
    new_shape: bool,
    train_secs: f64,
}

impl<'a> Run<'a> {
    fn new(
        req: &'a TrainRequest,
        device: &'a SelectedDevice,
        splits: &Splits,
        config: Config,
        precision: Precision,
    ) -> Self {
        let classes = splits.train.class_names.clone();
        let estimate = memory::estimate(&config, config.train.batch_size, classes.len());
        let (batch_size, accum) = (config.train.batch_size, config.train.grad_accum_steps);
        let n_batches = splits.train.samples.len().div_ceil(batch_size);
        let steps_per_epoch = n_batches.div_ceil(accum);
        let steps_total = steps_per_epoch * config.train.epochs;
        let trainer = Trainer::new(&config, precision, &device.device, classes.clone(), steps_total, steps_per_epoch);
        let summary = TrainSummary {
            out_dir: req.out_dir.clone(),
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
            batch_size,
            grad_accum_steps: accum,
        };
        Self {
            req,
            device,
            config,
            precision,
            classes,
            estimate,
            batch_size,
            accum,
            n_batches,
            steps_per_epoch,
            trainer,
            summary,
            images_trained: 0,
            new_shape: true,
            train_secs: 0.0,
        }
    }

    fn out(&self) -> &'a Path {
        &self.req.out_dir
    }

    /// Phase 4 (resume): the newest intact checkpoint restored, the metrics files cut back to it,
    /// and the schedule and loss scaler fitted to the steps and precision still to come. A run
    /// killed before its first checkpoint starts again from step 0.
    fn resume(&mut self, sink: EventSink) -> Result<()> {
        let out = self.out();
        if !checkpoint::any_checkpoint(out) {
            // Nothing to continue, so the run starts over with its stored config (a new `train`
            // would refuse the folder).
            sink(Event::Warning(format!("{} has no checkpoint yet: the run starts again from step 0", out.display())));
            truncate_csv(&out.join(run_dir::METRICS_CSV), |_| false)?;
            truncate_csv(&out.join(run_dir::EPOCHS_CSV), |_| false)?;
            return Ok(());
        }
        let latest = checkpoint::find_latest(out)?;
        for reason in &latest.damaged {
            sink(Event::Warning(format!("passed over a damaged checkpoint: {reason}")));
        }
        let (dir, mut state) = (latest.dir, latest.state);
        if state.class_names != self.classes {
            return Err(Error::Dataset {
                path: out.to_path_buf(),
                message: format!(
                    "this run was trained on {} but the data given has {}; resume with the data the run was trained on (its data.txt names it)",
                    crate::dataset::class_list(&state.class_names),
                    crate::dataset::class_list(&self.classes)
                ),
            });
        }
        // A new batch size on resume: the epoch continues after the images already trained on.
        let stored = run_dir::load_config(out).ok().map(|(c, _)| c);
        if let Some(old) = stored.filter(|c| c.train.batch_size != self.batch_size) {
            let images_done = state.batches_done_in_epoch * old.train.batch_size;
            state.batches_done_in_epoch = images_done / self.batch_size;
        }
        let dropped = truncate_csv(&out.join(run_dir::METRICS_CSV), |step| step <= state.global_step)?
            + truncate_csv(&out.join(run_dir::EPOCHS_CSV), |epoch| epoch < state.epoch)?;
        if dropped > 0 {
            sink(Event::Info(format!(
                "dropped {dropped} metrics rows written after step {} (the checkpoint resumed from)",
                state.global_step
            )));
        }
        self.trainer.restore(&dir, state)?;
        // The schedule covers the steps still to come at the current batch size (an unchanged
        // batch size gives exactly the original schedule), and the loss scaler follows the
        // precision the run continues in.
        let s = &self.trainer.state;
        let batches_left = self.n_batches.saturating_sub(s.batches_done_in_epoch);
        let epochs_after = self.config.train.epochs.saturating_sub(s.epoch + 1);
        self.trainer.schedule.total_steps =
            s.global_step + batches_left.div_ceil(self.accum) + epochs_after * self.steps_per_epoch;
        let scaling = self.trainer.state.scaler.growth_interval != usize::MAX;
        if (self.precision == Precision::F16) != scaling {
            let f16 = self.precision == Precision::F16;
            self.trainer.state.scaler = if f16 { LossScaler::new() } else { LossScaler::disabled() };
        }
        self.summary.epochs_completed = self.trainer.state.epoch;
        self.summary.global_step = self.trainer.state.global_step;
        Ok(())
    }

    /// Phase 6: the epoch's evaluation, its epochs.csv row and checkpoint, and after the first
    /// epoch the predicted against the measured memory.
    fn end_epoch(
        &mut self,
        data: &EpochData,
        totals: &EpochTotals,
        epoch_start: Instant,
        sink: EventSink,
    ) -> Result<()> {
        let epoch = self.trainer.state.epoch;
        let settings = eval::EvalSettings {
            model: &self.config.model,
            batch_size: self.batch_size.max(32),
            precision: self.precision,
            workers: self.config.data.workers,
            buffer_limit: self.device.buffer_limit(),
        };
        let val_model = self.trainer.model().valid();
        let val =
            eval::evaluate(&val_model, data.val.clone(), data.eval_pipe.clone(), &self.trainer.device, &settings)?;
        let secs = epoch_start.elapsed().as_secs_f64();
        let (train_loss, train_acc) = if totals.images > 0 {
            ((totals.loss / totals.images as f64) as f32, (totals.correct / totals.images as f64) as f32)
        } else {
            (f32::NAN, f32::NAN)
        };
        sink(Event::EpochEnd {
            epoch,
            train_loss,
            train_accuracy: train_acc,
            val_loss: val.loss,
            val_accuracy: val.top1,
            secs,
            skipped: totals.skipped,
            data_wait_secs: totals.data_wait_secs,
        });
        csv_append(
            &self.out().join(run_dir::EPOCHS_CSV),
            EPOCHS_HEADER,
            &format!(
                "{epoch},{train_loss},{train_acc},{},{},{},{secs:.1},{}",
                eval::csv_cell(val.loss),
                eval::csv_cell(val.top1),
                eval::csv_cell(val.top5),
                totals.skipped
            ),
        )?;
        let t = self.trainer.tracker;
        if epoch == 0 && t.peak_bytes_reserved > 0 {
            sink(Event::Info(format!(
                "memory after epoch 1: predicted peak {} vs measured {} reserved (ratio {:.2}); bytes_in_use after forward {}, pools high-water {}",
                human_bytes(self.estimate.total),
                human_bytes(t.peak_bytes_reserved),
                self.estimate.total as f64 / t.peak_bytes_reserved as f64,
                human_bytes(t.peak_bytes_in_use),
                human_bytes(t.pools_high_water)
            )));
        }
        let state = &mut self.trainer.state;
        state.best_val_accuracy = state.best_val_accuracy.max(val.top1);
        state.epoch += 1;
        state.batches_done_in_epoch = 0;
        self.summary.val = Some(val);
        let dir = self.trainer.save(self.out())?;
        sink(Event::Checkpoint { path: dir });
        self.summary.epochs_completed = self.trainer.state.epoch;
        Ok(())
    }

    /// Phase 7: the summary, and the export of a run that finished.
    fn finish(mut self, started: Instant) -> Result<TrainSummary> {
        let summary = &mut self.summary;
        summary.global_step = self.trainer.state.global_step;
        summary.batch_size = self.batch_size.div_ceil(self.trainer.state.split_factor);
        summary.grad_accum_steps = self.accum * self.trainer.state.split_factor;
        summary.images_per_sec = self.images_trained as f64 / self.train_secs.max(1e-9);
        if self.req.export && !summary.stopped {
            let model = self.trainer.model().valid();
            let info = crate::export::TrainingInfo {
                epochs: summary.epochs_completed,
                steps: summary.global_step,
                val_accuracy: summary.val.as_ref().map(|v| v.top1),
                device: self.device.name.clone(),
            };
            let dir = self.req.out_dir.join(run_dir::EXPORT);
            crate::export::export(&model, &self.config, &self.classes, &info, &dir)?;
            summary.export_dir = Some(dir);
        }
        summary.wall_secs = started.elapsed().as_secs_f64();
        Ok(self.summary)
    }
}
