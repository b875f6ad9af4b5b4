//! A run folder's metrics read back: `metrics.csv` and `epochs.csv` as the events that wrote
//! them ([`Event::Step`], [`Event::Memory`], [`Event::EpochEnd`]), so a client shows a past run
//! with the code that shows a live one (the app's plots of an opened run).

use std::path::Path;

use crate::engine::error::{Error, Result};
use crate::engine::events::Event;
use crate::train::run_dir::{EPOCHS_CSV, METRICS_CSV};

/// A run's metrics as events, in the order a run emits them.
#[derive(Clone, Debug, Default)]
pub struct RunMetrics {
    /// Steps (each followed by its memory sample, where the row has one) and epoch ends (after
    /// the epoch's last step).
    pub events: Vec<Event>,
    /// Rows that could not be read (a line cut short by a crash, a hand edit), as
    /// `file:line`: left out, so the rest of the run still shows.
    pub unreadable_rows: Vec<String>,
}

/// Reads `run`'s `metrics.csv` and `epochs.csv` (either may be missing: a run stopped before
/// its first step or its first epoch). Columns are found by their header names, so a file with
/// columns added later still reads; empty cells (memory is sampled every
/// `train.memory_sample_every` steps) are absent values.
///
/// # Errors
/// [`Error::Io`] naming the file when it exists but cannot be read, or has no header naming
/// `step` (metrics) or `epoch` (epochs).
pub fn read(run: &Path) -> Result<RunMetrics> {
    let mut out = RunMetrics::default();
    let steps = read_table(&run.join(METRICS_CSV), "step", &mut out.unreadable_rows)?;
    let epochs = read_table(&run.join(EPOCHS_CSV), "epoch", &mut out.unreadable_rows)?;
    let mut epoch_ends: Vec<(usize, Event)> = epochs.iter().filter_map(epoch_end).collect();
    epoch_ends.sort_by_key(|(epoch, _)| *epoch);
    let mut peak = 0;
    let mut rows = steps.iter().peekable();
    while let Some(row) = rows.next() {
        let (Some(step), Some(epoch)) = (row.usize("step"), row.usize("epoch")) else { continue };
        out.events.push(Event::Step {
            step,
            epoch,
            loss: row.f64("loss").unwrap_or(f64::NAN) as f32,
            accuracy: row.f64("accuracy").unwrap_or(f64::NAN) as f32,
            lr: row.f64("lr").unwrap_or(f64::NAN),
            images_per_sec: row.f64("images_per_sec").unwrap_or(f64::NAN),
            data_wait_secs: 0.0,
        });
        if let (Some(in_use), Some(reserved)) = (row.u64("bytes_in_use"), row.u64("bytes_reserved")) {
            peak = peak.max(in_use);
            out.events.push(Event::Memory {
                step,
                bytes_in_use: in_use,
                bytes_reserved: reserved,
                peak_bytes_in_use: peak,
            });
        }
        // The epoch's end follows its last step.
        let next_epoch = rows.peek().and_then(|r| r.usize("epoch"));
        if next_epoch != Some(epoch) {
            while epoch_ends.first().is_some_and(|(e, _)| *e <= epoch) {
                out.events.push(epoch_ends.remove(0).1);
            }
        }
    }
    // Epochs whose steps are not in metrics.csv (an older run's, a file cut short).
    out.events.extend(epoch_ends.into_iter().map(|(_, e)| e));
    Ok(out)
}

/// One row of a CSV table, its cells by column name.
struct Row {
    header: std::rc::Rc<[String]>,
    cells: Vec<String>,
}

impl Row {
    fn cell(&self, name: &str) -> Option<&str> {
        let i = self.header.iter().position(|h| h == name)?;
        self.cells.get(i).map(String::as_str).filter(|c| !c.is_empty())
    }

    fn f64(&self, name: &str) -> Option<f64> {
        self.cell(name)?.parse().ok()
    }

    fn usize(&self, name: &str) -> Option<usize> {
        self.cell(name)?.parse().ok()
    }

    fn u64(&self, name: &str) -> Option<u64> {
        self.cell(name)?.parse().ok()
    }
}

/// The rows of the CSV file at `path` whose `key` column is a number (none when the file does
/// not exist); other rows are named in `unreadable`.
fn read_table(path: &Path, key: &str, unreadable: &mut Vec<String>) -> Result<Vec<Row>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(path, e)),
    };
    let mut lines = text.lines();
    let header: Vec<String> = lines.next().unwrap_or_default().split(',').map(|h| h.trim().to_string()).collect();
    if !header.iter().any(|h| h == key) {
        return Err(Error::io(
            path,
            std::io::Error::other(format!("its first line names no `{key}` column: not a vramfit metrics file")),
        ));
    }
    let header: std::rc::Rc<[String]> = header.into();
    let mut rows = Vec::new();
    for (i, line) in lines.enumerate() {
        let row = Row { header: header.clone(), cells: line.split(',').map(|c| c.trim().to_string()).collect() };
        if row.cells.len() == header.len() && row.usize(key).is_some() {
            rows.push(row);
        } else if !line.trim().is_empty() {
            unreadable.push(format!("{}:{}", path.display(), i + 2));
        }
    }
    Ok(rows)
}

/// An `epochs.csv` row as its [`Event::EpochEnd`], with its epoch.
fn epoch_end(row: &Row) -> Option<(usize, Event)> {
    let epoch = row.usize("epoch")?;
    let event = Event::EpochEnd {
        epoch,
        train_loss: row.f64("train_loss").map(|v| v as f32),
        train_accuracy: row.f64("train_accuracy").map(|v| v as f32),
        val_loss: row.f64("val_loss").map_or(f32::NAN, |v| v as f32),
        val_accuracy: row.f64("val_accuracy").map_or(f32::NAN, |v| v as f32),
        secs: row.f64("secs").unwrap_or(0.0),
        skipped: row.usize("skipped").unwrap_or(0),
        data_wait_secs: 0.0,
    };
    Some((epoch, event))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_folders_csv_files_read_back_as_the_events_that_wrote_them() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(METRICS_CSV),
            "step,epoch,loss,accuracy,lr,images_per_sec,bytes_in_use,bytes_reserved\n\
             1,0,2.30,0.10,1e-3,100.0,1000,4000\n\
             2,0,2.10,0.20,2e-3,110.0,,\n\
             3,1,1.90,0.30,3e-3,120.0,900,4000\n\
             4,1,1.7\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join(EPOCHS_CSV),
            "epoch,train_loss,train_accuracy,val_loss,val_accuracy,val_top5,secs,skipped\n\
             0,2.2,0.15,2.0,0.25,0.9,3.5,0\n\
             1,1.9,0.30,,,,4.0,2\n",
        )
        .unwrap();
        let m = read(dir.path()).unwrap();
        let kinds: Vec<String> = m
            .events
            .iter()
            .map(|e| match e {
                Event::Step { step, .. } => format!("step {step}"),
                Event::Memory { step, peak_bytes_in_use, .. } => format!("memory {step} peak {peak_bytes_in_use}"),
                Event::EpochEnd { epoch, .. } => format!("epoch {epoch}"),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            ["step 1", "memory 1 peak 1000", "step 2", "epoch 0", "step 3", "memory 3 peak 1000", "epoch 1"]
        );
        let Event::Step { loss, lr, images_per_sec, .. } = &m.events[2] else { panic!() };
        assert_eq!((*loss, *lr, *images_per_sec), (2.10, 2e-3, 110.0));
        let Event::EpochEnd { val_accuracy, train_loss, skipped, .. } = &m.events[6] else { panic!() };
        assert!(val_accuracy.is_nan() && *train_loss == Some(1.9) && *skipped == 2);
        // The row cut short is named, not read.
        assert_eq!(m.unreadable_rows, [format!("{}:5", dir.path().join(METRICS_CSV).display())]);
    }

    #[test]
    fn a_run_without_metrics_reads_empty_and_a_foreign_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let m = read(dir.path()).unwrap();
        assert!(m.events.is_empty() && m.unreadable_rows.is_empty());
        std::fs::write(dir.path().join(METRICS_CSV), "a,b\n1,2\n").unwrap();
        let e = read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("metrics.csv") && e.contains("no `step` column"), "{e}");
    }
}
