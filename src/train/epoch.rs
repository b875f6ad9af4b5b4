//! Phase 5 of a training run, for both stores: one epoch of optimizer steps, with the retry at
//! half the micro-batch when the device refuses a step, the budget held after each memory
//! sample, and each step recorded (its [`Event::Step`], and a `metrics.csv` row in a run folder).
//!
//! The order inside the loop is the run's contract with its clients: the step's loader batches
//! are gathered; Stop is honoured (before the step, so a stop ends the run without starting the
//! next step, which on a GPU may compile for minutes); the step runs, sampling memory after its
//! first forward pass where sampled; the step is recorded; then the first-shape cleanup, the
//! budget check, the periodic checkpoint and the step cap.

use web_time::Instant;

use super::epoch_data::{EpochData, EpochTotals};
use super::run::Run;
use super::step::{StepError, StepStats};
use super::store::{METRICS_HEADER, Store, csv_append};
use crate::data::batch::Batch;
use crate::data::loader;
use crate::engine::error::{Error, Result};
use crate::engine::events::{Event, EventSink, LiveBudget, StopSignal};
use crate::memory::human_bytes;
use crate::memory::probe::MemoryTracker;
use crate::train::checkpoint;
use crate::train::run_dir;

impl Run<'_> {
    /// Phase 5: one epoch's optimizer steps (from where a resumed epoch left off); sets
    /// `summary.stopped` when Stop or the step cap ended it early (after a checkpoint, in a run
    /// folder). A stop or cap falling on the epoch's last step leaves the epoch to end.
    pub(super) async fn train_epoch(
        &mut self,
        data: &EpochData,
        sink: EventSink<'_>,
        stop: &StopSignal,
    ) -> Result<EpochTotals> {
        let epoch = self.trainer.state.epoch;
        let skip = self.trainer.state.batches_done_in_epoch;
        let (len, batch, seed) = (data.train.samples.len(), self.loader_batch, self.config.seed);
        let pass = match self.config.data.sampler {
            crate::config::Sampler::Shuffle => loader::Pass::training_epoch(len, batch, seed, epoch as u64, skip),
            crate::config::Sampler::Balanced => {
                let labels: Vec<usize> = data.train.samples.iter().map(|s| s.label).collect();
                loader::Pass::class_balanced_epoch(&labels, batch, seed, epoch as u64, skip)
            }
        };
        let mut batches = data.batches(pass, &self.config);
        let mut totals = EpochTotals::default();
        let mut batch_index = skip;
        loop {
            let mut step_wait_secs = 0.0;
            let step_start = Instant::now();
            let mut pending: Vec<Batch> = Vec::with_capacity(self.accum);
            while pending.len() < self.accum {
                let wait = Instant::now();
                let Some(batch) = batches.next() else { break };
                step_wait_secs += wait.elapsed().as_secs_f64();
                batch_index += 1;
                pending.push(batch);
            }
            if pending.is_empty() {
                break; // the epoch is over
            }
            if stop.is_set() {
                // The gathered batches go untrained: a resume reports their skipped files.
                self.summary.stopped = true;
                self.save_checkpoint(sink)?;
                break;
            }
            for batch in &pending {
                self.report_batch(batch, epoch, &mut totals, sink);
            }
            let sample_now = self.device.is_gpu()
                && (self.config.memory.cap_to_budget
                    || self.trainer.state.global_step.is_multiple_of(self.config.train.memory_sample_every));
            let stats = self.step_with_retry(&pending, sample_now, sink).await?;
            self.trainer.state.batches_done_in_epoch += pending.len();
            totals.batches += pending.len();
            totals.data_wait_secs += step_wait_secs;
            if stats.images == 0 {
                continue;
            }
            self.steps_applied += usize::from(stats.applied);
            totals.stepped_images += stats.images;
            let secs = step_start.elapsed().as_secs_f64();
            self.record_step(&stats, (secs, step_wait_secs), sample_now, &mut totals, sink)?;
            self.after_step(&stats, sample_now, batch_index >= self.n_batches, sink)?;
            if self.capped() && batch_index < self.n_batches {
                self.summary.stopped = true;
                self.save_checkpoint(sink)?;
                break;
            }
        }
        self.summary.skipped += totals.skipped;
        Ok(totals)
    }

    /// A loader batch taken: its skipped samples reported and counted, and in the first epoch
    /// its flat images warned about.
    fn report_batch(&self, batch: &Batch, epoch: usize, totals: &mut EpochTotals, sink: EventSink) {
        for (source, reason) in &batch.skipped {
            sink(Event::SampleSkipped { source: source.to_string(), reason: reason.to_string() });
        }
        totals.skipped += batch.skipped.len();
        if epoch == 0 {
            for source in &batch.flat {
                sink(Event::Warning(format!("{source} is one flat colour: a blank or wrongly decoded image?")));
            }
        }
    }

    /// After a recorded step: the first step at a new shape hands its autotune pages back, a
    /// memory sample is held against the budget, and a run folder gets its periodic checkpoint
    /// (not on the epoch's last step, whose epoch-end checkpoint follows).
    fn after_step(&mut self, stats: &StepStats, sampled: bool, last_of_epoch: bool, sink: EventSink) -> Result<()> {
        if self.new_shape && self.device.is_gpu() {
            // The first step at a new shape (the run's first, or the first after a halving)
            // autotunes its kernels with buffers of its own: their pages go back and the
            // step's readings are dropped, so the run holds, and is measured against the
            // budget at, the plan's steady state. A step the f16 loss scaler skipped made no
            // AdamW moments yet: the pools are sized after the first applied one.
            self.trainer.tracker = MemoryTracker::default();
            if stats.applied {
                self.new_shape = false;
                let (micro_batch, _) = self.micro_batch();
                let classes = self.trainer.state.class_names.len();
                let plan = crate::memory::estimate(&self.config, micro_batch, classes);
                crate::device::size_the_pools(&self.trainer.device, plan.largest_allocation);
            }
        }
        if sampled && !self.config.memory.cap_to_budget {
            // Under a cap the next step's own check fails it instead, as the card would.
            self.hold_budget(sink);
        }
        let every = self.config.train.checkpoint_every_steps;
        if every > 0 && stats.applied && self.trainer.state.global_step.is_multiple_of(every) && !last_of_epoch {
            self.save_checkpoint(sink)?;
        }
        Ok(())
    }

    /// One optimizer step; when the device refuses it (allocation, buffer limit) the micro-batch
    /// halves and the same step is retried, down to micro-batch 1.
    async fn step_with_retry(&mut self, pending: &[Batch], sample_now: bool, sink: EventSink<'_>) -> Result<StepStats> {
        if self.config.memory.cap_to_budget {
            self.trainer.memory_cap = Some(self.budget());
        }
        loop {
            // The run's steps until one is applied (the f16 loss scaler skips some at first,
            // and a skipped step makes no AdamW moments), and their retries at half, run
            // outside the pools natively (see `Trainer::step_outside_the_pools`; a page cannot
            // wait synchronously and has no autotuner); once a step has trained, a halving's
            // retry stays in them: its buffers would come on top of the pool pages the live
            // tensors of the earlier steps hold, over the cap that halved it.
            let step = if self.steps_applied == 0 && self.device.is_gpu() && !cfg!(target_arch = "wasm32") {
                self.trainer.step_outside_the_pools(pending, sample_now, sink)
            } else {
                self.trainer.step_async(pending, sample_now, sink).await
            };
            match step {
                Ok(s) => return Ok(s),
                Err(StepError::Fatal(e)) => return Err(e),
                Err(StepError::Device(msg)) => {
                    if let Some(lost) = self.lost_server(&msg) {
                        return Err(Error::Device(lost));
                    }
                    let (micro, _) = self.micro_batch();
                    if micro <= 1 {
                        return Err(Error::Device(self.failed_at_one(&msg)));
                    }
                    self.halve_micro_batch(
                        format!("the device refused the step at micro-batch {micro} ({msg}); retrying it at half"),
                        sink,
                    );
                }
            }
        }
    }

    /// After a failed step: the error for a remote device whose session is gone (burn's client
    /// does not reconnect a closed session, so a smaller retry could only fail again), saying
    /// whether its server still answers ([`crate::device::remote::server_answers`]), what is
    /// kept and how to go on; `None` when every remote device of the run still syncs.
    fn lost_server(&self, msg: &str) -> Option<String> {
        let lost = self
            .options
            .devices(self.device)
            .filter_map(|d| d.remote.map(|r| (d, r)))
            .find(|(d, _)| d.device.sync().is_err())
            .map(|(_, r)| r)?;
        let what = if crate::device::remote::server_answers(lost, std::time::Duration::from_secs(5)) {
            "closed its session (the server's log says why)"
        } else {
            "no longer answers"
        };
        // The main device's weights may have lived on the server: what is kept is the newest
        // checkpoint.
        let kept = match self.options.store {
            Store::Folder { out, .. } => match checkpoint::latest(out) {
                Ok((dir, state)) => format!(
                    "; the checkpoint of step {} ({}) is intact: resume with --resume once the server is back, or on another device",
                    state.global_step,
                    dir.display()
                ),
                Err(_) => {
                    "; no checkpoint was written yet (train.checkpoint_every_steps sets how often): start the run again"
                        .into()
                }
            },
            Store::Memory => String::new(),
        };
        Some(format!("the server of {} {what} ({msg}){kept}", lost.token()))
    }

    /// The error of a step the device refused at micro-batch 1: what is kept, and the fixes.
    fn failed_at_one(&self, msg: &str) -> String {
        match self.options.store {
            Store::Folder { out, .. } => format!(
                "the device failed even at micro-batch 1 ({msg}); the last checkpoint in {} is intact — lower crop_size or use --device cpu",
                checkpoint::checkpoints_dir(out).display()
            ),
            Store::Memory => {
                format!("the device failed even at micro-batch 1 ({msg}); lower crop_size or train on the CPU")
            }
        }
    }

    /// Halves the micro-batch from the next step (the accumulation doubles, so the effective
    /// batch and the gradient stay the same) and tells the clients why.
    fn halve_micro_batch(&mut self, reason: String, sink: EventSink) {
        self.trainer.state.split_factor *= 2;
        self.trainer.device.memory_cleanup();
        // The readings were of the refused shape; the next step is the first at the new one.
        self.trainer.tracker = MemoryTracker::default();
        self.new_shape = true;
        let (micro_batch, grad_accum_steps) = self.micro_batch();
        sink(Event::BatchAdapted { micro_batch, grad_accum_steps, reason });
    }

    /// A finished step: its totals, the [`Event::Step`] and, in a run folder, its `metrics.csv`
    /// row. `(secs, data_wait_secs)`: the step's wall time, and the part of it spent waiting for
    /// batches. A step skipped by the f16 loss scaler has no step number of its own: it is not
    /// recorded (its warning was sent) and its loss counts nowhere.
    fn record_step(
        &mut self,
        stats: &StepStats,
        (secs, data_wait_secs): (f64, f64),
        sampled: bool,
        totals: &mut EpochTotals,
        sink: EventSink,
    ) -> Result<()> {
        if !stats.applied {
            return Ok(());
        }
        let (step, epoch) = (self.trainer.state.global_step, self.trainer.state.epoch);
        self.train_secs += secs;
        self.images_trained += stats.images;
        self.losses.push(stats.loss);
        totals.loss += f64::from(stats.loss) * stats.images as f64;
        totals.correct += f64::from(stats.accuracy) * stats.images as f64;
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
        let Store::Folder { out, .. } = self.options.store else { return Ok(()) };
        let t = &self.trainer.tracker;
        let (in_use, reserved) = if sampled {
            (t.peak_bytes_in_use.to_string(), t.peak_bytes_reserved.to_string())
        } else {
            (String::new(), String::new())
        };
        csv_append(
            &out.join(run_dir::METRICS_CSV),
            METRICS_HEADER,
            &format!("{step},{epoch},{},{},{lr:e},{ips:.1},{in_use},{reserved}", stats.loss, stats.accuracy),
        )
    }

    /// The budget now: the client's live value, else the config's.
    fn budget(&self) -> u64 {
        self.options.live_budget.map_or(self.config.memory.memory_budget_bytes, LiveBudget::get)
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
