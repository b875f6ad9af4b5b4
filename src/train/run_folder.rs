//! Phase 3 for a run folder: the folder made ours (a new run refuses one that holds a run, a
//! process lock is held, temporaries of an interrupted save removed), resumed from its newest
//! intact checkpoint, and its manifest and `config.toml` written.

use std::path::Path;

use super::run::Run;
use super::store::{Store, truncate_csv};
use crate::config::Precision;
use crate::engine::error::{Error, Result};
use crate::engine::events::{Event, EventSink};
use crate::train::checkpoint;
use crate::train::precision::LossScaler;
use crate::train::run_dir;

impl Run<'_> {
    /// Phase 3: for a run folder, the folder made ours and resumed when asked (the returned
    /// lock holds it for the run); nothing for a run kept in memory.
    ///
    /// # Errors
    /// [`Error::Io`] for the folder's files; a new run in a folder that holds one, a folder
    /// another process trains in, or a folder of a newer format are refused.
    pub(super) fn open_store(&mut self, sink: EventSink) -> Result<Option<checkpoint::RunLock>> {
        let Store::Folder { out, resume, .. } = self.options.store else { return Ok(None) };
        if !resume {
            checkpoint::refuse_existing_run(out)?;
        }
        let lock = checkpoint::RunLock::acquire(out)?;
        if resume {
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
        if resume {
            self.resume(out, sink)?;
            if let Some(copy) = run_dir::preserve_foreign_config(out)? {
                sink(Event::Info(format!(
                    "the run's config.toml had keys this vramfit does not know: kept as {}",
                    copy.display()
                )));
            }
        }
        run_dir::write_manifest(out)?;
        // On resume this records the overrides that were applied (epochs, batch size, budget, ...).
        crate::atomic_file::write_atomic(&out.join(run_dir::CONFIG), self.config.to_toml().as_bytes())?;
        Ok(Some(lock))
    }

    /// Phase 3 (resume): the newest intact checkpoint restored, the metrics files cut back to it,
    /// and the schedule and loss scaler fitted to the steps and precision still to come. A run
    /// killed before its first checkpoint starts again from step 0.
    fn resume(&mut self, out: &Path, sink: EventSink) -> Result<()> {
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
                    crate::data::dataset::class_list(&state.class_names),
                    crate::data::dataset::class_list(&self.classes)
                ),
            });
        }
        // A new loader batch on resume: the epoch continues after the images already trained on.
        let stored = run_dir::load_config(out).ok().map(|(c, _)| c);
        let mut converted = false;
        if let Some(old) = stored.filter(|c| c.train.batch_size != self.loader_batch) {
            let images_done = state.batches_done_in_epoch * old.train.batch_size;
            state.batches_done_in_epoch = images_done / self.loader_batch;
            converted = true;
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
        let s = &self.trainer.state;
        // The schedule covers the steps still to come at the current loader batch (an unchanged
        // one gives exactly the original schedule), and the loss scaler follows the precision
        // the run continues in.
        let batches_left = self.n_batches.saturating_sub(s.batches_done_in_epoch);
        let epochs_after = self.config.train.epochs.saturating_sub(s.epoch + 1);
        self.trainer.schedule.total_steps =
            s.global_step + batches_left.div_ceil(self.accum) + epochs_after * self.steps_per_epoch;
        let scaling = self.trainer.state.scaler.growth_interval != usize::MAX;
        let f16 = self.config.train.precision == Precision::F16;
        if f16 != scaling {
            self.trainer.state.scaler = if f16 { LossScaler::new() } else { LossScaler::disabled() };
            converted = true;
        }
        // The checkpoint on disk is the state as restored unless it was converted (a new loader
        // batch, another precision's scaler): then a stop before the first step saves anew.
        if !converted {
            let s = &self.trainer.state;
            self.saved_at = Some((s.epoch, s.global_step, s.batches_done_in_epoch));
        }
        Ok(())
    }
}
