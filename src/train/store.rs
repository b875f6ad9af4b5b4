//! Where a run keeps what it makes ([`Store`]: a run folder or memory), what a run is asked
//! to do whichever its store ([`RunOptions`]), and the CSV files a run folder's runs append to.

use std::io::Write;
use std::path::Path;

use crate::config::Config;
use crate::device::SelectedDevice;
use crate::engine::error::{Error, Result};
use crate::engine::events::LiveBudget;

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
        /// On resume, continue from the newest checkpoint whose weights are intact with fresh
        /// AdamW state when its optimizer state is damaged (the step count is kept).
        fresh_optimizer: bool,
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
    /// The other devices of a data-parallel run ([`super::data_parallel`]); empty on one device.
    pub(super) replicas: &'a [SelectedDevice],
}

impl<'a> RunOptions<'a> {
    /// Every device of the run: `main`, then the replicas.
    pub(super) fn devices(&self, main: &'a SelectedDevice) -> impl Iterator<Item = &'a SelectedDevice> {
        std::iter::once(main).chain(self.replicas)
    }
}

/// Header of `metrics.csv`.
pub const METRICS_HEADER: &str = "step,epoch,loss,accuracy,lr,images_per_sec,bytes_in_use,bytes_reserved";
/// Header of `epochs.csv`.
/// Columns were added at the end since the first version (`val_balanced_accuracy`,
/// `val_macro_f1`); [`truncate_csv`] brings an older run's file up to date when it resumes.
pub const EPOCHS_HEADER: &str =
    "epoch,train_loss,train_accuracy,val_loss,val_accuracy,val_top5,secs,skipped,val_balanced_accuracy,val_macro_f1";

/// Keeps the header and the rows of a CSV file whose first column `keep` accepts, dropping the
/// rest (rows written after the checkpoint a run resumes from, so no step appears twice). A
/// file written before columns were added to `header` (its header a prefix of it) gets `header`
/// and empty cells in the new columns of its rows, so the rows appended next line up.
///
/// # Errors
/// [`Error::Io`] naming the file.
pub(super) fn truncate_csv(path: &Path, header: &str, keep: impl Fn(usize) -> bool) -> Result<usize> {
    let Ok(text) = std::fs::read_to_string(path) else { return Ok(0) };
    let mut out = String::with_capacity(text.len());
    let mut dropped = 0;
    let old = text.lines().next().unwrap_or_default();
    let added = if old != header && header.starts_with(&format!("{old},")) {
        header[old.len()..].matches(',').count()
    } else {
        0
    };
    for (i, line) in text.lines().enumerate() {
        let first = line.split(',').next().and_then(|v| v.parse::<usize>().ok());
        if i == 0 && added > 0 {
            out.push_str(header);
            out.push('\n');
        } else if i == 0 || first.is_some_and(&keep) {
            out.push_str(line);
            if i > 0 {
                out.push_str(&",".repeat(added));
            }
            out.push('\n');
        } else {
            dropped += 1;
        }
    }
    if dropped > 0 || added > 0 {
        crate::atomic_file::write_atomic(path, out.as_bytes())?;
    }
    Ok(dropped)
}

pub(super) fn csv_append(path: &Path, header: &str, line: &str) -> Result<()> {
    let new = !path.exists();
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| Error::write(path, &e))?;
    if new {
        writeln!(f, "{header}").map_err(|e| Error::write(path, &e))?;
    }
    writeln!(f, "{line}").map_err(|e| Error::write(path, &e))
}
