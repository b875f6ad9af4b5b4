//! Phase 5 of a training run: one epoch of optimizer steps, with the retry at half the
//! micro-batch when the device refuses a step, the budget held after each memory sample, and a
//! row of `metrics.csv` per step.

use std::sync::Arc;
use web_time::Instant;

use super::{METRICS_HEADER, Run, csv_append};
use crate::checkpoint;
use crate::config::Config;
use crate::dataset::{Dataset, Splits};
use crate::error::{Error, Result};
use crate::events::{Event, EventSink, LiveBudget, StopSignal};
use crate::loader::{self, Batch, SamplePipeline};
use crate::memory::{MemoryTracker, human_bytes};
use crate::run_dir;
use crate::trainer::{StepError, StepStats};

/// The data of every epoch: datasets and their pipelines (augmented for training).
pub(super) struct EpochData {
    pub(super) train: Arc<Dataset>,
    pub(super) val: Arc<Dataset>,
    pub(super) train_pipe: Arc<SamplePipeline>,
    pub(super) eval_pipe: Arc<SamplePipeline>,
}

impl EpochData {
    /// The run's datasets and pipelines; training and evaluation share one decoded-image cache
    /// (their resized images are the same). Training batches go to the device's augmentation
    /// kernel when `augment_on_device` ([`crate::device_augment::augments_on_device`]).
    pub(super) fn new(splits: &Splits, config: &Config, augment_on_device: bool) -> Self {
        let cache = crate::image_cache::ImageCache::from_config(&config.data).map(Arc::new);
        Self {
            train: Arc::new(splits.train.clone()),
            val: Arc::new(splits.val.clone()),
            train_pipe: Arc::new(
                SamplePipeline::from_config(config, true)
                    .with_cache(cache.clone())
                    .with_device_augment(augment_on_device),
            ),
            eval_pipe: Arc::new(SamplePipeline::from_config(config, false).with_cache(cache)),
        }
    }
}

/// Sums over one epoch's steps, for its summary.
#[derive(Default)]
pub(super) struct EpochTotals {
    pub(super) loss: f64,
    pub(super) correct: f64,
    pub(super) images: usize,
    pub(super) skipped: usize,
    /// Seconds the loop waited for the loader's next batch (the device idle for want of data).
    pub(super) data_wait_secs: f64,
}

impl Run<'_> {
    /// Phase 5: one epoch's optimizer steps (from where a resumed epoch left off); sets
    /// `summary.stopped` when Stop or the step cap ended it early (after a checkpoint).
    pub(super) fn train_epoch(&mut self, data: &EpochData, sink: EventSink, stop: &StopSignal) -> Result<EpochTotals> {
        let epoch = self.trainer.state.epoch;
        let skip = self.trainer.state.batches_done_in_epoch;
        let pass = loader::Pass::training_epoch(
            data.train.samples.len(),
            self.batch_size,
            self.config.seed,
            epoch as u64,
            skip,
        );
        let mut batches = loader::batches(
            data.train.clone(),
            data.train_pipe.clone(),
            pass,
            self.config.data.workers,
            self.config.data.prefetch_batches,
        );
        let mut totals = EpochTotals::default();
        let mut pending: Vec<Batch> = Vec::with_capacity(self.accum);
        let mut batch_index = skip;
        let mut step_start = Instant::now();
        let mut step_wait_secs = 0.0;
        loop {
            let wait = Instant::now();
            let Some(batch) = batches.next() else { break };
            step_wait_secs += wait.elapsed().as_secs_f64();
            batch_index += 1;
            for (source, reason) in &batch.skipped {
                sink(Event::SampleSkipped { source: source.to_string(), reason: reason.to_string() });
            }
            totals.skipped += batch.skipped.len();
            if epoch == 0 {
                for source in &batch.flat {
                    sink(Event::Warning(format!("{source} is one flat colour: a blank or wrongly decoded image?")));
                }
            }
            pending.push(batch);
            if pending.len() < self.accum && batch_index < self.n_batches {
                continue;
            }
            let sample_now = self.device.is_gpu()
                && (self.config.memory.cap_to_budget
                    || self.trainer.state.global_step.is_multiple_of(self.config.train.memory_sample_every));
            let stats = self.step_with_retry(&pending, sample_now, sink)?;
            self.trainer.state.batches_done_in_epoch += pending.len();
            pending.clear();
            let secs = step_start.elapsed().as_secs_f64();
            step_start = Instant::now();
            totals.data_wait_secs += step_wait_secs;
            let waited = std::mem::take(&mut step_wait_secs);
            if stats.images == 0 {
                continue;
            }
            self.record_step(&stats, (secs, waited), sample_now, &mut totals, sink)?;
            if std::mem::take(&mut self.new_shape) && self.device.is_gpu() {
                // The first step at a new shape (the run's first, or the first after a halving)
                // autotunes its kernels with buffers of its own: their pages go back and the
                // step's readings are dropped, so the run holds, and is measured against the
                // budget at, the plan's steady state.
                self.trainer.device.memory_cleanup();
                self.trainer.tracker = MemoryTracker::default();
            }
            if sample_now && !self.config.memory.cap_to_budget {
                // Under a cap the next step's own check fails it instead, as the card would.
                self.hold_budget(sink);
            }
            let every = self.config.train.checkpoint_every_steps;
            let last_of_epoch = batch_index >= self.n_batches; // the epoch-end checkpoint follows
            if every > 0 && stats.applied && self.trainer.state.global_step.is_multiple_of(every) && !last_of_epoch {
                let dir = self.trainer.save(self.out())?;
                sink(Event::Checkpoint { path: dir });
            }
            let capped = self.req.max_steps.is_some_and(|m| self.trainer.state.global_step >= m);
            if stop.is_set() || capped {
                let dir = self.trainer.save(self.out())?;
                sink(Event::Checkpoint { path: dir });
                self.summary.stopped = true;
                break;
            }
        }
        self.summary.skipped += totals.skipped;
        self.summary.memory = self.trainer.tracker;
        Ok(totals)
    }

    /// One optimizer step; when the device refuses it (allocation, buffer limit) the micro-batch
    /// halves and the same step is retried, down to micro-batch 1.
    fn step_with_retry(&mut self, pending: &[Batch], sample_now: bool, sink: EventSink) -> Result<StepStats> {
        if self.config.memory.cap_to_budget {
            self.trainer.memory_cap = Some(self.budget());
        }
        loop {
            // The run's first step, and its retries at half, run outside the pools (see
            // `Trainer::step_outside_the_pools`); once a step has trained, a halving's retry
            // stays in them: its buffers would come on top of the pool pages the live tensors
            // of the earlier steps hold, over the cap that halved it.
            let step = if self.images_trained == 0 && self.device.is_gpu() {
                self.trainer.step_outside_the_pools(pending, sample_now, sink)
            } else {
                self.trainer.step(pending, sample_now, sink)
            };
            match step {
                Ok(s) => return Ok(s),
                Err(StepError::Fatal(e)) => return Err(e),
                Err(StepError::Device(msg)) => {
                    let (micro, _) = self.micro_batch();
                    if micro <= 1 {
                        return Err(Error::Device(format!(
                            "the device failed even at micro-batch 1 ({msg}); the last checkpoint in {} is intact — lower crop_size or use --device cpu",
                            checkpoint::checkpoints_dir(self.out()).display()
                        )));
                    }
                    self.halve_micro_batch(
                        format!("the device refused the step at micro-batch {micro} ({msg}); retrying it at half"),
                        sink,
                    );
                }
            }
        }
    }

    /// The micro-batch in use and its accumulation steps: the loader's batch split
    /// `split_factor` ways (the one place this is computed; clients get it in
    /// [`Event::Started`] and [`Event::BatchAdapted`]).
    pub(super) fn micro_batch(&self) -> (usize, usize) {
        let split = self.trainer.state.split_factor;
        (self.batch_size.div_ceil(split), self.accum * split)
    }

    /// Halves the micro-batch from the next step (the accumulation doubles, so the effective
    /// batch and the gradient stay the same) and tells the clients why.
    fn halve_micro_batch(&mut self, reason: String, sink: EventSink) {
        self.trainer.state.split_factor *= 2;
        self.trainer.device.memory_cleanup();
        // The readings were of the refused shape; the next step is the first at the new one.
        self.trainer.tracker = MemoryTracker::default();
        self.new_shape = true;
        let (batch_size, grad_accum_steps) = self.micro_batch();
        sink(Event::BatchAdapted { batch_size, grad_accum_steps, reason });
    }

    /// A finished step: counters, the Step event and its metrics.csv row. `(secs,
    /// data_wait_secs)`: the step's wall time, and the part of it spent waiting for batches.
    fn record_step(
        &mut self,
        stats: &StepStats,
        (secs, data_wait_secs): (f64, f64),
        sampled: bool,
        totals: &mut EpochTotals,
        sink: EventSink,
    ) -> Result<()> {
        if stats.applied {
            self.trainer.state.global_step += 1;
        }
        let (step, epoch) = (self.trainer.state.global_step, self.trainer.state.epoch);
        self.train_secs += secs;
        self.images_trained += stats.images;
        totals.loss += stats.loss as f64 * stats.images as f64;
        totals.correct += stats.accuracy as f64 * stats.images as f64;
        totals.images += stats.images;
        let lr = self.trainer.schedule.lr(step.saturating_sub(1));
        let ips = stats.images as f64 / secs.max(1e-9);
        sink(Event::Step {
            step,
            epoch,
            loss: stats.loss,
            accuracy: stats.accuracy,
            lr,
            images_per_sec: ips,
            data_wait_secs,
        });
        // A step skipped by the f16 loss scaler has no step number of its own: no CSV row.
        if !stats.applied {
            return Ok(());
        }
        let t = &self.trainer.tracker;
        let (in_use, reserved) = if sampled {
            (t.peak_bytes_in_use.to_string(), t.peak_bytes_reserved.to_string())
        } else {
            (String::new(), String::new())
        };
        csv_append(
            &self.out().join(run_dir::METRICS_CSV),
            METRICS_HEADER,
            &format!("{step},{epoch},{},{},{lr:e},{ips:.1},{in_use},{reserved}", stats.loss, stats.accuracy),
        )
    }

    /// The budget now: the client's live value, else the config's.
    fn budget(&self) -> u64 {
        self.req.live_budget.as_ref().map_or(self.config.memory.memory_budget_bytes, LiveBudget::get)
    }

    /// After a memory sample: when the measured peak crossed the (live) budget, the micro-batch
    /// halves from the next step.
    fn hold_budget(&mut self, sink: EventSink) {
        let budget = self.budget();
        let measured = self.trainer.tracker.peak_bytes_reserved;
        let (micro, _) = self.micro_batch();
        if measured > budget && micro > 1 {
            self.trainer.tracker = MemoryTracker::default();
            let reason = format!("measured {} crossed the {} budget", human_bytes(measured), human_bytes(budget));
            self.halve_micro_batch(reason, sink);
        }
    }
}
