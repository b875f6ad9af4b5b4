//! Opening a run folder in the app (Open run…, or a run folder dropped on the window): its
//! metrics into the plots, its config into the knobs, its data folder as the dataset; Resume,
//! Evaluate, Export and Predict then act on it, as on a run trained in this window.

use std::path::PathBuf;

use super::{RunHistory, VramfitApp};
use crate::data::dataset;
use crate::train::run_dir;

impl VramfitApp {
    /// Opens the run folder `run` ([`crate::train::run_metrics::read`] for its plots). Its data
    /// folder is the one its `data.txt` names (the bundled subset when that is the bundled one
    /// or the note is missing).
    pub(super) fn open_run(&mut self, run: PathBuf) {
        if self.in_flight.training {
            self.error = Some("training: open a run when this one has ended".into());
            return;
        }
        let read = run_dir::load_config(&run).and_then(|c| Ok((c, crate::train::run_metrics::read(&run)?)));
        let ((config, notes), metrics) = match read {
            Ok(r) => r,
            Err(e) => {
                self.error = Some(format!("{e} (open a run folder: the one holding config.toml and metrics.csv)"));
                return;
            }
        };
        let bundled = dataset::bundled_dataset_dir().canonicalize().ok();
        let data = std::fs::read_to_string(run.join(run_dir::DATA_NOTE))
            .ok()
            .map(|s| PathBuf::from(s.trim_end()))
            .filter(|d| d.canonicalize().ok() != bundled);
        self.history = RunHistory::default();
        for event in &metrics.events {
            self.history.push(event);
        }
        self.history.log.extend(notes.into_iter().map(|n| format!("note: {n}")));
        if !metrics.unreadable_rows.is_empty() {
            self.history.log.push(format!("left out unreadable rows: {}", metrics.unreadable_rows.join(", ")));
        }
        self.settings.preset = config.name.clone();
        self.settings.config = config;
        self.settings.data_dir = data;
        self.files_dataset = None;
        self.data_for = None;
        self.evaluation = None;
        // Its export predicts, as a run trained in this window does (a run stopped before its
        // end has none until Export).
        self.predict.model_path = Some(run.join(run_dir::EXPORT)).filter(|e| e.is_dir());
        self.status =
            format!("opened run {}: step {}, epoch {}", run.display(), self.history.last_step, self.history.epoch + 1);
        self.last_run = Some(run);
        self.error = None;
    }
}
