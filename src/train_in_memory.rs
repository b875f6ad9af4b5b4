//! Training without a run folder: the loop a browser tab runs, where there is no disk to write
//! checkpoints to. The model lives in memory and is handed back at the end; nothing survives
//! the process (or the tab), so Resume does not exist here.
//!
//! It is the same engine as [`crate::train::train`] underneath: [`Trainer::step_async`] for each
//! optimizer step (forward, backward, clipping, AdamW, warmup + cosine, label smoothing),
//! [`eval::evaluate_async`] at each epoch's end and the same [`Event`]s, so the app's plots and
//! the CLI's progress read it unchanged. What it leaves out is what needs a disk: the run folder,
//! checkpoints, the export, the adaptive micro-batch (it refuses a config whose tensors exceed
//! the adapter's buffer limit up front instead) and loader threads (batches are decoded on the
//! calling thread, which is the only one a page has).
//!
//! Its device reads are awaited: in a browser the page keeps running between them; natively
//! the engine session drives it with `pollster::block_on` ([`crate::session::Job::TrainInMemory`]).

use std::path::PathBuf;
use std::sync::Arc;

use burn::module::Module;
use burn::tensor::{Device, FloatDType};
use web_time::Instant;

use crate::config::{Config, Precision};
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::eval::{self, EvalResult};
use crate::events::{Event, EventSink, RunEnd, StopSignal};
use crate::export::{ModelMetadata, TrainingInfo};
use crate::loader::{self, Pass, SamplePipeline};
use crate::memory;
use crate::model::Classifier;
use crate::trainer::Trainer;

/// What [`train_in_memory`] trains.
#[derive(Clone, Debug)]
pub struct InMemoryRequest {
    /// The config: epochs, batch size, accumulation, precision, optimizer and schedule are used
    /// as the run-folder loop uses them.
    pub config: Config,
    /// Stop after this many optimizer steps (the schedule still spans the config's epochs).
    pub max_steps: Option<usize>,
    /// Bytes one tensor may occupy on the device (the adapter's buffer limit); `None` on the CPU.
    pub buffer_limit: Option<u64>,
}

/// A model trained by [`train_in_memory`].
pub struct TrainedModel {
    /// The trained network, without autodiff, on [`Self::device`].
    pub model: Classifier,
    /// The device it trained on.
    pub device: Device,
    /// Bytes one tensor may occupy there (the request's buffer limit).
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

/// Trains `request.config` on `train` on `device` and evaluates on `val` after each epoch (and
/// once at the end when a step cap or a stop cut the last epoch short), sending
/// [`Event::Started`], then per optimizer step [`Event::Step`] and [`Event::Memory`] (every
/// step, where the device has pools to read: not on flex), [`Event::SampleSkipped`] per
/// undecodable training image, [`Event::EpochEnd`] per epoch and [`Event::Finished`]; f16 on a
/// device without it trains in f32 after an [`Event::Warning`], as the run-folder loop does.
/// A stop set on `stop` ends the run after the current step (`end.stopped`); a cap or stop that
/// falls on an epoch's last step still ends that epoch (evaluated, counted as completed).
///
/// # Errors
/// [`Error::Memory`] when one micro-batch's largest tensor exceeds `request.buffer_limit` (before
/// anything is allocated); [`Error::Dataset`] when `train` is empty or a whole epoch gives no
/// trainable image; [`Error::Device`] when a step fails on the device; [`Error::Diverged`] from
/// the NaN guard; evaluation's errors.
pub async fn train_in_memory(
    request: &InMemoryRequest,
    train: Arc<Dataset>,
    val: Arc<Dataset>,
    device: &Device,
    sink: EventSink<'_>,
    stop: &StopSignal,
) -> Result<TrainedModel> {
    let config = &request.config;
    let classes = train.class_names.len();
    let batch_size = config.train.batch_size.max(1);
    let accum = config.train.grad_accum_steps.max(1);
    check_request(request, &train, device)?;
    let steps_per_epoch = crate::schedule::steps_per_epoch(train.samples.len(), &config.train);
    let epochs = config.train.epochs.max(1);
    let planned = steps_per_epoch * epochs;
    let mut config = config.clone();
    if config.train.precision == Precision::F16 && !device.supports_dtype(FloatDType::F16) {
        sink(Event::Warning(format!("{device:?} has no f16: training in f32")));
        config.train.precision = Precision::F32;
    }
    let (config, precision) = (&config, config.train.precision);
    let mut run = Run {
        trainer: Trainer::new(config, precision, device, train.class_names.clone(), planned, steps_per_epoch),
        device,
        buffer_limit: request.buffer_limit,
        last_step: request.max_steps.map_or(planned, |m| m.min(planned)),
        planned,
        losses: Vec::new(),
        peak_bytes_in_use: 0,
    };
    sink(Event::Started {
        device: format!("{device:?}"),
        out_dir: PathBuf::new(),
        start_epoch: 0,
        epochs,
        steps_per_epoch,
        samples: (train.samples.len(), val.samples.len()),
        predicted_peak_bytes: memory::estimate(config, batch_size, classes).total,
        micro_batch: (batch_size, accum),
        augment_on_device: false,
    });
    let pipeline = Arc::new(SamplePipeline::from_config(config, true).with_device_augment(false));
    let eval_pipeline = Arc::new(SamplePipeline::from_config(config, false));
    let settings = eval::EvalSettings {
        model: &config.model,
        batch_size,
        precision,
        workers: 0,
        buffer_limit: request.buffer_limit,
    };
    let (mut val_result, mut stopped) = (None::<EvalResult>, false);
    for epoch in 0..epochs {
        run.trainer.state.epoch = epoch;
        let epoch_start = Instant::now();
        let pass = Pass::training_epoch(train.samples.len(), batch_size, config.seed, epoch as u64, 0);
        let batches = loader::batches_on_this_thread(train.clone(), pipeline.clone(), pass);
        let totals = run.epoch(epoch, batches, accum, sink, stop).await?;
        if totals.cut_short {
            stopped = true;
            break;
        }
        if totals.images == 0 {
            return Err(Error::Dataset {
                path: PathBuf::from("train"),
                message: format!("epoch {epoch} gave no trainable batch (every image was skipped)"),
            });
        }
        let valid = run.trainer.model().valid();
        let r = eval::evaluate_async(&valid, val.clone(), eval_pipeline.clone(), device, &settings).await?;
        sink(totals.epoch_end(epoch, &r, epoch_start.elapsed().as_secs_f64()));
        run.trainer.state.epoch = epoch + 1;
        val_result = Some(r);
    }
    let model = run.trainer.model().valid();
    if stopped {
        // Cut short: the end's accuracy is of the model as it is now.
        val_result = Some(eval::evaluate_async(&model, val, eval_pipeline, device, &settings).await?);
    }
    Ok(run.finish(model, stopped, val_result, sink))
}

/// What [`train_in_memory`] refuses before it allocates anything: no training images, or a
/// micro-batch whose largest tensor exceeds the buffer limit.
fn check_request(request: &InMemoryRequest, train: &Dataset, device: &Device) -> Result<()> {
    if train.samples.is_empty() {
        return Err(Error::Dataset { path: PathBuf::from("train"), message: "no training images".into() });
    }
    let Some(limit) = request.buffer_limit else { return Ok(()) };
    let (config, px) = (&request.config, request.config.image_size_px());
    let classes = train.class_names.len();
    let batch_size = config.train.batch_size.max(1);
    memory::check_buffer_limit(&config.model, classes, (px, px), batch_size, limit, &format!("{device:?}"))
}

/// The state of one [`train_in_memory`] run between its epochs.
struct Run<'a> {
    trainer: Trainer,
    device: &'a Device,
    buffer_limit: Option<u64>,
    /// The step after which the run stops (the step cap, or the last planned step).
    last_step: usize,
    /// Steps the schedule spans (the config's epochs).
    planned: usize,
    losses: Vec<f32>,
    peak_bytes_in_use: u64,
}

/// What one epoch of [`Run::epoch`] trained on.
struct EpochTotals {
    /// Sum over applied steps of loss x images, and of accuracy x images.
    loss_sum: f64,
    accuracy_sum: f64,
    images: usize,
    /// Training samples left out (undecodable), each also sent as [`Event::SampleSkipped`].
    skipped: usize,
    /// The step cap or a stop ended the run inside this epoch.
    cut_short: bool,
}

impl EpochTotals {
    /// The epoch's [`Event::EpochEnd`], with its validation result `val` and wall time `secs`.
    fn epoch_end(&self, epoch: usize, val: &EvalResult, secs: f64) -> Event {
        let images = self.images.max(1) as f64;
        Event::EpochEnd {
            epoch,
            train_loss: (self.loss_sum / images) as f32,
            train_accuracy: (self.accuracy_sum / images) as f32,
            val_loss: val.loss,
            val_accuracy: val.top1,
            secs,
            skipped: self.skipped,
            data_wait_secs: 0.0,
        }
    }
}

impl Run<'_> {
    /// The run's end: [`Event::Finished`] sent, and the model with its metadata.
    fn finish(self, model: Classifier, stopped: bool, val: Option<EvalResult>, sink: EventSink<'_>) -> TrainedModel {
        let state = &self.trainer.state;
        let training = TrainingInfo {
            epochs: state.epoch,
            steps: state.global_step,
            val_accuracy: val.as_ref().map(|r| r.top1),
            device: format!("{:?}", self.device),
        };
        let metadata = ModelMetadata::new(&self.trainer.config, &state.class_names, model.num_params(), training);
        let end =
            RunEnd { stopped, global_step: state.global_step, epochs_completed: state.epoch, export_dir: None, val };
        sink(Event::Finished(end.clone()));
        TrainedModel {
            model,
            device: self.device.clone(),
            buffer_limit: self.buffer_limit,
            metadata,
            end,
            losses: self.losses,
        }
    }

    /// Trains on `batches` (one epoch's), `accum` loader batches per optimizer step, sending
    /// [`Event::Step`] and [`Event::Memory`] after each step, until the batches run out, the
    /// step cap is reached before the planned end, or `stop` is set.
    async fn epoch(
        &mut self,
        epoch: usize,
        mut batches: loader::BatchIter,
        accum: usize,
        sink: EventSink<'_>,
        stop: &StopSignal,
    ) -> Result<EpochTotals> {
        let mut totals = EpochTotals { loss_sum: 0.0, accuracy_sum: 0.0, images: 0, skipped: 0, cut_short: false };
        loop {
            let step_batches: Vec<_> = batches.by_ref().take(accum).collect();
            if step_batches.is_empty() {
                // The epoch is over, even when the cap or a stop falls on its last step.
                return Ok(totals);
            }
            let step = self.trainer.state.global_step;
            if stop.is_set() || step >= self.last_step && self.last_step < self.planned {
                totals.cut_short = true;
                return Ok(totals);
            }
            for batch in &step_batches {
                totals.skipped += batch.skipped.len();
                for (source, reason) in &batch.skipped {
                    sink(Event::SampleSkipped { source: source.clone(), reason: reason.clone() });
                }
            }
            let step_start = Instant::now();
            // The first step natively runs outside the GPU pools, as the run-folder loop
            // does (its autotuner's buffers would size the pages); a browser has no autotuner
            // and cannot wait synchronously.
            let stats = if step == 0 && !cfg!(target_arch = "wasm32") {
                self.trainer.step_outside_the_pools(&step_batches, false, sink)
            } else {
                self.trainer.step_async(&step_batches, false, sink).await
            };
            let stats = stats?;
            if !stats.applied || stats.images == 0 {
                continue;
            }
            self.trainer.state.global_step += 1;
            let step = step + 1;
            if step == 1 {
                // As the run-folder loop does: the pages the first step's first use of each
                // kernel held go back, so the pool shows the plan's steady state.
                self.device.memory_cleanup();
            }
            self.losses.push(stats.loss);
            let n = stats.images as f64;
            totals.loss_sum += f64::from(stats.loss) * n;
            totals.accuracy_sum += f64::from(stats.accuracy) * n;
            totals.images += stats.images;
            sink(Event::Step {
                step,
                epoch,
                loss: stats.loss,
                accuracy: stats.accuracy,
                lr: self.trainer.schedule.lr(step - 1),
                images_per_sec: n / step_start.elapsed().as_secs_f64().max(1e-9),
                data_wait_secs: 0.0,
            });
            if let Some(usage) = self.device.memory_pool_usage() {
                self.peak_bytes_in_use = self.peak_bytes_in_use.max(usage.bytes_in_use);
                sink(Event::Memory {
                    step,
                    bytes_in_use: usage.bytes_in_use,
                    bytes_reserved: usage.bytes_reserved,
                    peak_bytes_in_use: self.peak_bytes_in_use,
                });
            }
        }
    }
}
