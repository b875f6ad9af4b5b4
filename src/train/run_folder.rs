//! A run folder's phases: claimed first (created, locked, a new run refuses one that holds a
//! run, a resume reads the run's config once), then opened (temporaries of an interrupted save
//! removed, resumed from its newest intact checkpoint, its manifest and `config.toml` written).

use std::path::Path;

use super::run::Run;
use super::store::{EPOCHS_HEADER, METRICS_HEADER, Store, truncate_csv};
use crate::config::{Config, Precision};
use crate::data::dataset::Splits;
use crate::data::split_record::SplitRecord;
use crate::engine::error::{Error, Result};
use crate::engine::events::{Event, EventSink};
use crate::train::checkpoint;
use crate::train::precision::LossScaler;
use crate::train::run_dir;

/// A run folder claimed for this process: its lock (held until the run ends) and, on resume,
/// the config the run was trained with, as its `config.toml` held it when the lock was taken.
pub(super) struct Claimed {
    /// Held while the run lasts (never read: dropping it releases the folder).
    pub(super) _lock: checkpoint::RunLock,
    /// The stored config (`None` for a new run).
    pub(super) stored: Option<Config>,
}

/// Phase 1 for a run folder: `out` created and marked (refused when it is or holds `data`), then
/// locked before anything in it is read; a new run then refuses a folder that already holds one,
/// a resume refuses a folder of a newer format and reads the run's config once, checking the
/// client's `config` against it (a key that shapes the network is refused; other changes are
/// announced as they will be applied).
///
/// # Errors
/// [`Error::Dataset`] for `out` holding `data`; [`Error::Io`] for a folder another process trains
/// in, a new run in a folder that holds one, a folder of a newer format, or the folder's files;
/// [`Error::Config`] for a change a resume cannot make.
pub(super) fn claim(out: &Path, resume: bool, data: &Path, config: &Config, sink: EventSink) -> Result<Claimed> {
    run_dir::create(out, data)?;
    let lock = checkpoint::RunLock::acquire(out)?;
    if !resume {
        checkpoint::refuse_existing_run(out)?;
        return Ok(Claimed { _lock: lock, stored: None });
    }
    run_dir::check_manifest(out)?;
    let (stored, _notes) = run_dir::load_config(out)?;
    for change in stored.changes_on_resume(config)? {
        sink(Event::Info(format!("resume: {change}")));
    }
    Ok(Claimed { _lock: lock, stored: Some(stored) })
}

/// The data a resumed run trains on: the fresh scan put back into the recorded split, and the
/// record to keep ([`SplitRecord::apply`]).
pub(super) struct Restored {
    /// What the run trains and validates on.
    pub(super) splits: Splits,
    /// `data_files.json` from now on (deleted files kept as such).
    pub(super) record: SplitRecord,
}

/// Phase 1 for a run folder, once claimed: the data the run trains on. A new run trains on
/// `splits`; a resume puts `splits` (a fresh scan) back into the split its `data_files.json`
/// recorded ([`SplitRecord`]), says what changed since and returns the result. The record is
/// (re)written by [`Run::open_store`] once the run is sure to go on; a run made before vramfit
/// kept the record gets one then. An unreadable record is a warning (the fresh scan is used).
///
/// # Errors
/// [`Error::Dataset`] naming the data folder when its classes differ from the record's, or the
/// record is of a newer format.
pub(super) fn data_of_run(
    out: &Path,
    resumed: bool,
    splits: &Splits,
    val_fraction: f64,
    sink: EventSink,
) -> Result<Option<Restored>> {
    let path = out.join(run_dir::DATA_FILES);
    if !resumed {
        return Ok(None);
    }
    let Ok(bytes) = std::fs::read(&path) else {
        sink(Event::Info(format!(
            "{} has no record of its files (made by an older vramfit): recorded now, so later resumes \
             keep this split and report added and deleted files",
            out.display()
        )));
        return Ok(None);
    };
    let record = match serde_json::from_slice::<SplitRecord>(&bytes) {
        Ok(record) => record,
        Err(e) => {
            sink(Event::Warning(format!(
                "{} is unreadable ({e}): the dataset's split as scanned now is used and recorded",
                path.display()
            )));
            return Ok(None);
        }
    };
    let (splits, changes, record) =
        record.apply(splits, val_fraction).map_err(|message| Error::Dataset { path: splits.root.clone(), message })?;
    if changes.any() {
        sink(Event::Warning(changes.describe()));
    }
    Ok(Some(Restored { splits, record }))
}

impl Run<'_> {
    /// Phase 3 for a run folder claimed by [`claim`]: temporaries of an interrupted save removed,
    /// the run resumed when asked (`stored`: its config before this invocation), its manifest,
    /// the record of `splits` (what it trains on) and `config.toml` written; nothing for a run
    /// kept in memory.
    ///
    /// # Errors
    /// [`Error::Io`] for the folder's files; resume errors as [`Run::resume`].
    pub(super) fn open_store(
        &mut self,
        stored: Option<&Config>,
        splits: &Splits,
        record: Option<&SplitRecord>,
        sink: EventSink,
    ) -> Result<()> {
        let Store::Folder { out, .. } = self.options.store else { return Ok(()) };
        let leftovers = checkpoint::remove_temporaries(out);
        if leftovers > 0 {
            sink(Event::Warning(format!(
                "removed {leftovers} temporary files left by an interrupted save in {}",
                out.display()
            )));
        }
        if let Some(stored) = stored {
            self.resume(out, stored, &splits.root, sink)?;
            if let Some(copy) = run_dir::preserve_foreign_config(out)? {
                sink(Event::Info(format!(
                    "the run's config.toml had keys this vramfit does not know: kept as {}",
                    copy.display()
                )));
            }
        }
        run_dir::write_manifest(out)?;
        self.write_data_note(out, splits.source(), stored.is_some(), sink)?;
        let json = match record {
            Some(kept) => serde_json::to_vec(kept),
            None => serde_json::to_vec(&SplitRecord::of(splits)),
        };
        let path = out.join(run_dir::DATA_FILES);
        crate::atomic_file::write_atomic(&path, &json.map_err(|e| Error::io(&path, e))?)?;
        // On resume this records the overrides that were applied (epochs, batch size, budget, ...).
        crate::atomic_file::write_atomic(&out.join(run_dir::CONFIG), self.config.to_toml().as_bytes())?;
        Ok(())
    }

    /// Writes `data.txt` (the data folder or labels CSV, absolute, for `--resume` without `--data`); a resume
    /// on another folder than the one it names is announced.
    fn write_data_note(&self, out: &Path, data: &Path, resumed: bool, sink: EventSink) -> Result<()> {
        let note = out.join(run_dir::DATA_NOTE);
        let data = run_dir::absolute(data);
        let before = std::fs::read_to_string(&note).ok().map(|s| s.trim_end().to_string());
        if let Some(before) = before.filter(|b| resumed && Path::new(b) != data) {
            sink(Event::Warning(format!(
                "the run was trained on the data in {before}; it goes on with {} (data.txt now names it)",
                data.display()
            )));
        }
        crate::atomic_file::write_atomic(&note, format!("{}\n", data.display()).as_bytes())
    }

    /// The checkpoint a resume continues from, and whether with its optimizer state: the newest
    /// one that is wholly intact; or, where a newer one's weights are intact but its optimizer
    /// state is not, that one with fresh optimizer state when `--fresh-optimizer` asks for it
    /// (else the way to it is named).
    ///
    /// # Errors
    /// As [`checkpoint::find_latest`] when no checkpoint can be resumed.
    fn checkpoint_to_resume(&self, out: &Path, sink: EventSink) -> Result<(checkpoint::LatestCheckpoint, bool)> {
        let fresh = matches!(self.options.store, Store::Folder { fresh_optimizer: true, .. });
        let whole = checkpoint::find_latest(out);
        let weights = checkpoint::find_latest_weights(out).ok();
        let step_of = |c: &checkpoint::LatestCheckpoint| c.state.global_step;
        let newer_weights = weights.filter(|w| whole.as_ref().map_or(true, |c| step_of(w) > step_of(c)));
        match (newer_weights, whole) {
            (Some(w), _) if fresh => {
                sink(Event::Warning(format!(
                    "continuing from step {} ({}) with fresh optimizer state: its optimizer state is damaged \
                     (--fresh-optimizer); AdamW's moments start again from zero",
                    step_of(&w),
                    w.dir.display()
                )));
                Ok((w, false))
            }
            (newer, whole) => {
                let latest = whole.map_err(|e| match &newer {
                    Some(w) => Error::io(out, format!("{e}; its weights at step {} are intact: resume with --fresh-optimizer to continue from them", step_of(w))),
                    None => e,
                })?;
                for reason in &latest.damaged {
                    sink(Event::Warning(format!("passed over a damaged checkpoint: {reason}")));
                }
                if let Some(w) = newer {
                    sink(Event::Info(format!(
                        "the weights at step {} are intact: --fresh-optimizer continues from them with fresh optimizer state",
                        step_of(&w)
                    )));
                }
                Ok((latest, true))
            }
        }
    }

    /// Phase 3 (resume): the newest intact checkpoint restored, the metrics files cut back to it,
    /// and the schedule and loss scaler fitted to the steps and precision still to come. A run
    /// killed before its first checkpoint starts again from step 0.
    fn resume(&mut self, out: &Path, stored: &Config, data: &Path, sink: EventSink) -> Result<()> {
        if !checkpoint::any_checkpoint(out) {
            // Nothing to continue, so the run starts over with its stored config (a new `train`
            // would refuse the folder).
            sink(Event::Warning(format!("{} has no checkpoint yet: the run starts again from step 0", out.display())));
            truncate_csv(&out.join(run_dir::METRICS_CSV), METRICS_HEADER, |_| false)?;
            truncate_csv(&out.join(run_dir::EPOCHS_CSV), EPOCHS_HEADER, |_| false)?;
            return Ok(());
        }
        let (latest, with_optimizer) = self.checkpoint_to_resume(out, sink)?;
        let (dir, mut state) = (latest.dir, latest.state);
        if state.class_names != self.classes {
            return Err(Error::Dataset {
                path: data.to_path_buf(),
                message: format!(
                    "this run was trained on {} but the data given has {}; resume with the data the run was trained on (its data.txt names it)",
                    crate::data::dataset::class_list(&state.class_names),
                    crate::data::dataset::class_list(&self.classes)
                ),
            });
        }
        // A new loader batch on resume: the epoch continues after the images already trained on.
        let mut converted = false;
        if stored.train.batch_size != self.loader_batch {
            let images_done = state.batches_done_in_epoch * stored.train.batch_size;
            state.batches_done_in_epoch = images_done / self.loader_batch;
            converted = true;
        }
        let steps = truncate_csv(&out.join(run_dir::METRICS_CSV), METRICS_HEADER, |step| step <= state.global_step)?;
        let epochs = truncate_csv(&out.join(run_dir::EPOCHS_CSV), EPOCHS_HEADER, |epoch| epoch < state.epoch)?;
        if steps + epochs > 0 {
            sink(Event::Info(format!(
                "dropped {} of metrics.csv and {} of epochs.csv written after step {} (the checkpoint resumed from)",
                crate::engine::words::count(steps, "row"),
                crate::engine::words::count(epochs, "row"),
                state.global_step
            )));
        }
        self.trainer.restore(&dir, state, with_optimizer)?;
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
