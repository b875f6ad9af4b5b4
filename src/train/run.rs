//! A run in progress ([`Run`]): its state between the phases, and the phases that read it
//! whole: the end of each epoch (6: evaluation, metrics, checkpoint) and the finish (7: the
//! summary, the export or the model handed back). The phases in order are
//! [`super::phases::run`]'s.

use std::path::PathBuf;

use burn::module::Module;
use web_time::Instant;

use super::TrainSummary;
use super::data_parallel::Replica;
use super::epoch_data::{EpochData, EpochTotals};
use super::step::Trainer;
use super::store::{EPOCHS_HEADER, RunOptions, Store, csv_append};
use crate::config::Config;
use crate::data::dataset::Splits;
use crate::device::SelectedDevice;
use crate::engine::error::{Error, Result};
use crate::engine::events::{Event, EventSink};
use crate::inference::eval::{self, EvalResult};
use crate::memory::probe::MemoryTracker;
use crate::memory::{self, human_bytes};
use crate::model::Classifier;

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

/// A run in progress: what the phases read and update.
pub(super) struct Run<'a> {
    pub(super) options: RunOptions<'a>,
    pub(super) device: &'a SelectedDevice,
    pub(super) config: Config,
    pub(super) classes: Vec<String>,
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
    /// Steps this invocation applied (not skipped by the f16 loss scaler): until one is, each
    /// step runs outside the pools.
    pub(super) steps_applied: usize,
    /// The next applied step is the first at its micro-batch shape (the run's first, or the
    /// first after a halving): the pools are sized after it (steps the f16 loss scaler skips
    /// before it only drop their readings).
    pub(super) new_shape: bool,
    pub(super) train_secs: f64,
    /// `(epoch, global_step, batches_done_in_epoch)` of the newest checkpoint, so a stop does
    /// not write the same checkpoint twice.
    pub(super) saved_at: Option<(usize, usize, usize)>,
    pub(super) losses: Vec<f32>,
    /// The run's memory plan (sent in [`Event::Started`]).
    pub(super) plan: memory::Plan,
    /// Whether validation images that could not be read were reported (once per invocation).
    pub(super) val_skips_reported: bool,
}

impl<'a> Run<'a> {
    /// The run's state before its store is opened: `config` as planned, with its plan
    /// ([`memory::plan`] of `config`).
    pub(super) fn new(
        options: RunOptions<'a>,
        device: &'a SelectedDevice,
        splits: &Splits,
        config: Config,
        plan: memory::Plan,
    ) -> Self {
        let classes = splits.train.class_names.clone();
        let (loader_batch, accum) = (config.train.batch_size.max(1), config.train.grad_accum_steps.max(1));
        let n_batches = splits.train.samples.len().div_ceil(loader_batch);
        let steps_per_epoch = crate::train::schedule::steps_per_epoch(splits.train.samples.len(), &config.train);
        let steps_total = steps_per_epoch * config.train.epochs;
        let precision = config.train.precision;
        let mut trainer =
            Trainer::new(&config, precision, &device.device, classes.clone(), steps_total, steps_per_epoch);
        trainer.replicas = options.replicas.iter().map(|d| Replica::new(d, config.train.checkpointing)).collect();
        if config.train.class_weights != crate::config::ClassWeights::None {
            let counts = splits.train.class_counts();
            trainer.class_weights =
                Some(crate::config::class_balance::class_weights(config.train.class_weights, &counts));
        }
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
            predicted_peak_bytes: plan.estimate.total,
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
            loader_batch,
            accum,
            n_batches,
            steps_per_epoch,
            trainer,
            summary,
            images_trained: 0,
            steps_applied: 0,
            new_shape: true,
            train_secs: 0.0,
            saved_at: None,
            losses: Vec::new(),
            plan,
            val_skips_reported: false,
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

    /// Whether training batches go to the device's augmentation kernel: where every device of
    /// the run has it, and never for a run kept in memory (see [`Store::Memory`]).
    pub(super) fn augments_on_device(&self) -> bool {
        matches!(self.options.store, Store::Folder { .. })
            && self
                .options
                .devices(self.device)
                .all(|d| crate::kernels::device_augment::augments_on_device(&self.config, &d.device))
    }

    /// The run's devices by name, the main one first, joined by ` + `.
    pub(super) fn device_names(&self) -> String {
        let names: Vec<&str> = self.options.devices(self.device).map(|d| d.name.as_str()).collect();
        names.join(" + ")
    }

    /// The run's [`Event::Started`].
    pub(super) fn started_event(&self, splits: &Splits) -> Event {
        Event::Started {
            device: self.device_names(),
            out_dir: self.summary.out_dir.clone(),
            start_epoch: self.trainer.state.epoch,
            epochs: self.config.train.epochs,
            steps_per_epoch: self.steps_per_epoch,
            samples: (splits.train.samples.len(), splits.val.samples.len()),
            plan: Box::new(self.plan.clone()),
            micro_batch: self.micro_batch(),
            augment_on_device: self.augments_on_device(),
        }
    }

    /// Why a resumed run has nothing to train (its epochs or the step cap are done), if so.
    pub(super) fn nothing_to_train(&self) -> Option<String> {
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
    pub(super) async fn evaluate(&self, data: &EpochData) -> Result<EvalResult> {
        let settings = self.eval_settings(false);
        let model = self.trainer.model().valid();
        eval::evaluate(&model, data.val.clone(), data.eval_pipe.clone(), &self.trainer.device, &settings).await
    }

    /// How the run evaluates: batches of at least 32 in its precision, on the loader threads in a
    /// run folder (on the awaiting thread in memory: a page has none), keeping each image's
    /// probabilities when `keep_probabilities`.
    fn eval_settings(&self, keep_probabilities: bool) -> eval::EvalSettings<'_> {
        let workers = match self.options.store {
            Store::Folder { .. } => self.config.data.workers,
            Store::Memory => 0,
        };
        eval::EvalSettings {
            model: &self.config.model,
            batch_size: self.loader_batch.max(32),
            precision: self.config.train.precision,
            workers,
            buffer_limit: self.device.buffer_limit(),
            keep_probabilities,
        }
    }

    /// Phase 7, a run that trained to its end: the images whose label the finished model
    /// doubts, training and validation images together ([`crate::data::health::label_issues`];
    /// one forward pass over every image), in one line to `sink` and, in a run folder, whole
    /// into [`crate::data::health::label_issues::REPORT_FILE`]. The ranking of training images
    /// uses probabilities the model learned them with (docs/data-health.md).
    ///
    /// # Errors
    /// As [`Self::evaluate`]; a report that cannot be written is a warning.
    pub(super) async fn rank_label_issues(&self, data: &EpochData, splits: &Splits, sink: EventSink<'_>) -> Result<()> {
        use crate::data::health::{label_issues, relative_name};
        let mut all = (*data.train).clone();
        all.samples.extend(data.val.samples.iter().cloned());
        let names: Vec<String> = all.samples.iter().map(|s| relative_name(&s.source, &splits.root)).collect();
        let n_train = data.train.samples.len();
        let settings = self.eval_settings(true);
        let model = self.trainer.model().valid();
        let r =
            eval::evaluate(&model, std::sync::Arc::new(all), data.eval_pipe.clone(), &self.trainer.device, &settings)
                .await?;
        let issues = r.label_issues();
        let row_names: Vec<String> = r.sample_indices.iter().map(|&i| names[i].clone()).collect();
        let row_splits: Vec<&str> =
            r.sample_indices.iter().map(|&i| if i < n_train { "train" } else { "val" }).collect();
        let whole = match self.options.store {
            Store::Folder { out, .. } => {
                let file = out.join(label_issues::REPORT_FILE);
                let csv = label_issues::to_csv(&issues, &row_names, &row_splits, &r.class_names);
                if let Err(e) = crate::atomic_file::write_atomic(&file, csv.as_bytes()) {
                    sink(Event::Warning(format!("the label issues were not written: {e}")));
                }
                file.display().to_string()
            }
            Store::Memory => "`vramfit eval --all-splits` ranks them".to_string(),
        };
        let first = issues.first().map_or_else(String::new, |i| {
            format!(
                " (the most doubtful: {}, labelled {}, looks like {})",
                row_names[i.index], r.class_names[i.given], r.class_names[i.predicted]
            )
        });
        sink(Event::Info(format!(
            "label issues: {} of {} images look mislabelled{first}; see {whole}",
            issues.len(),
            r.samples
        )));
        Ok(())
    }

    /// Phase 6: the epoch's evaluation and [`Event::EpochEnd`], its `epochs.csv` row and
    /// checkpoint (run folder), and after the first epoch the predicted against the measured
    /// memory.
    ///
    /// # Errors
    /// [`Error::Dataset`] when the epoch trained steps but none on a usable image (every image
    /// skipped): its metrics would be undefined.
    pub(super) async fn end_epoch(
        &mut self,
        data: &EpochData,
        totals: &EpochTotals,
        epoch_start: Instant,
        sink: EventSink<'_>,
    ) -> Result<()> {
        let epoch = self.trainer.state.epoch;
        if totals.batches > 0 && totals.stepped_images == 0 {
            return Err(Error::Dataset {
                path: data.root.clone(),
                message: format!("epoch {epoch} gave no trainable batch (every image was skipped)"),
            });
        }
        let val = self.evaluate(data).await?;
        if let Some((source, reason)) = val.skipped.first()
            && !self.val_skips_reported
        {
            self.val_skips_reported = true;
            sink(Event::Warning(format!(
                "validation: {} of {} images could not be read and are left out of every validation (first: \
                 {source}: {reason}); `vramfit check-data` lists them",
                val.skipped.len(),
                val.samples + val.skipped.len()
            )));
        }
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
                &out.join(crate::train::run_dir::EPOCHS_CSV),
                EPOCHS_HEADER,
                &format!(
                    "{epoch},{},{},{},{},{},{secs:.1},{},{},{}",
                    cell(train_loss),
                    cell(train_accuracy),
                    eval::csv_cell(val.loss),
                    eval::csv_cell(val.top1),
                    eval::csv_cell(val.top5),
                    totals.skipped,
                    eval::csv_cell(val.balanced_accuracy()),
                    eval::csv_cell(val.macro_f1()),
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
        Ok(())
    }

    /// After the first epoch on a device with pools: the plan against the measured peak.
    fn report_first_epoch_memory(&self, sink: EventSink) {
        let t = self.trainer.tracker;
        if self.trainer.state.epoch == 0 && t.peak_bytes_reserved > 0 {
            sink(Event::Info(format!(
                "memory after epoch 1: predicted peak {} vs measured {} reserved (ratio {:.2}); bytes_in_use after forward {}, pools high-water {}",
                human_bytes(self.summary.predicted_peak_bytes),
                human_bytes(t.peak_bytes_reserved),
                self.summary.predicted_peak_bytes as f64 / t.peak_bytes_reserved as f64,
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

    /// Phase 7: the summary, the export of a run folder that finished training in this call
    /// (`trained`: a resumed run with nothing to train keeps its export as it is), and the model
    /// of a run kept in memory.
    pub(super) fn finish(mut self, started: Instant, trained: bool) -> Result<Ended> {
        let (micro_batch, grad_accum_steps) = self.micro_batch();
        let devices = self.device_names();
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
                if export && trained && !summary.stopped {
                    let info = summary.training_info(&devices);
                    let dir = out.join(crate::train::run_dir::EXPORT);
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
