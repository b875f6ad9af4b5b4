//! What the plots show: the events of the current run, kept as plot-ready series.

use crate::engine::events::Event;

/// Series of one training run (x = global step unless noted).
#[derive(Clone, Debug, Default)]
pub struct RunHistory {
    /// Training loss per step.
    pub loss: Vec<[f64; 2]>,
    /// Training accuracy per step (0..1).
    pub train_accuracy: Vec<[f64; 2]>,
    /// Validation loss per epoch end (x = step of the epoch end).
    pub val_loss: Vec<[f64; 2]>,
    /// Validation accuracy per epoch end (0..1).
    pub val_accuracy: Vec<[f64; 2]>,
    /// Learning rate per step.
    pub lr: Vec<[f64; 2]>,
    /// Images per second per step.
    pub images_per_sec: Vec<[f64; 2]>,
    /// bytes_in_use samples, MiB.
    pub in_use_mib: Vec<[f64; 2]>,
    /// bytes_reserved samples, MiB.
    pub reserved_mib: Vec<[f64; 2]>,
    /// Running peak of bytes_in_use, MiB.
    pub peak_mib: Vec<[f64; 2]>,
    /// The run's memory plan (from [`Event::Started`]).
    pub plan: Option<crate::memory::Plan>,
    /// Last step seen.
    pub last_step: usize,
    /// Last epoch seen (0-based).
    pub epoch: usize,
    /// Warnings and notes, newest last.
    pub log: Vec<String>,
    /// The micro-batch in use and its accumulation steps.
    pub micro_batch: Option<(usize, usize)>,
    /// Steps at which the engine halved the micro-batch to hold the budget.
    pub batch_halvings: Vec<usize>,
    /// Training samples left out, with the reason (file, reason).
    pub skipped_files: Vec<(String, String)>,
}

const MIB: f64 = 1024.0 * 1024.0;

impl RunHistory {
    /// The run's predicted peak (bytes reserved), MiB.
    pub fn predicted_mib(&self) -> Option<f64> {
        self.plan.as_ref().map(|p| p.estimate.total as f64 / MIB)
    }

    /// Adds one engine event.
    pub fn push(&mut self, event: &Event) {
        match event {
            Event::Started { plan, start_epoch, micro_batch, .. } => {
                self.plan = Some((**plan).clone());
                self.epoch = *start_epoch;
                self.micro_batch = Some(*micro_batch);
            }
            Event::Step { step, epoch, loss, accuracy, lr, images_per_sec, .. } => {
                let x = *step as f64;
                self.loss.push([x, *loss as f64]);
                self.train_accuracy.push([x, *accuracy as f64]);
                self.lr.push([x, *lr]);
                self.images_per_sec.push([x, *images_per_sec]);
                self.last_step = *step;
                self.epoch = *epoch;
            }
            Event::Memory { step, bytes_in_use, bytes_reserved, peak_bytes_in_use } => {
                let x = *step as f64;
                self.in_use_mib.push([x, *bytes_in_use as f64 / MIB]);
                self.reserved_mib.push([x, *bytes_reserved as f64 / MIB]);
                self.peak_mib.push([x, *peak_bytes_in_use as f64 / MIB]);
            }
            Event::EpochEnd { val_loss, val_accuracy, secs, .. } => {
                let x = self.last_step as f64;
                if val_loss.is_finite() && val_accuracy.is_finite() {
                    self.val_loss.push([x, *val_loss as f64]);
                    self.val_accuracy.push([x, *val_accuracy as f64]);
                }
                if let Some(metrics) = event.epoch_metrics_line() {
                    self.log.push(format!("{metrics} ({secs:.0} s)"));
                }
            }
            Event::Checkpoint { path } => self.log.push(format!("checkpoint {}", path.display())),
            Event::Warning(w) => self.log.push(format!("warning: {w}")),
            Event::SampleSkipped { source, reason } => {
                self.log.push(format!("skipped {source}: {reason}"));
                self.skipped_files.push((source.clone(), reason.clone()));
            }
            Event::Info(s) => self.log.push(s.clone()),
            Event::Finished(_) => {} // the job's result (`session::JobOutput`) carries it
            Event::BatchAdapted { micro_batch, grad_accum_steps, reason } => {
                self.micro_batch = Some((*micro_batch, *grad_accum_steps));
                self.batch_halvings.push(self.last_step);
                self.log.push(format!("memory: micro-batch {micro_batch} x {grad_accum_steps} ({reason})"))
            }
        }
    }

    /// Exponential moving average of the loss (weight 0.9), for the smoothed curve.
    pub fn smoothed_loss(&self) -> Vec<[f64; 2]> {
        let mut avg = None;
        self.loss
            .iter()
            .map(|[x, y]| {
                let a = avg.map_or(*y, |a: f64| 0.9 * a + 0.1 * y);
                avg = Some(a);
                [*x, a]
            })
            .collect()
    }

    /// The metrics as CSV (step, loss, accuracy, lr, images_per_sec).
    pub fn to_csv(&self) -> String {
        let mut s = String::from("step,loss,accuracy,lr,images_per_sec\n");
        for i in 0..self.loss.len() {
            s.push_str(&format!(
                "{},{},{},{},{}\n",
                self.loss[i][0], self.loss[i][1], self.train_accuracy[i][1], self.lr[i][1], self.images_per_sec[i][1]
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(step: usize, loss: f32) -> Event {
        Event::Step { step, epoch: 0, loss, accuracy: 0.5, lr: 1e-3, images_per_sec: 100.0, data_wait_secs: 0.0 }
    }

    #[test]
    fn steps_memory_and_epochs_become_plot_points_and_log_lines() {
        let mut h = RunHistory::default();
        h.push(&step(1, 2.0));
        h.push(&step(2, 1.0));
        h.push(&Event::Memory { step: 2, bytes_in_use: 3 << 20, bytes_reserved: 4 << 20, peak_bytes_in_use: 3 << 20 });
        let end = |val: f32| Event::EpochEnd {
            epoch: 0,
            train_loss: Some(1.5),
            train_accuracy: Some(0.5),
            val_loss: val,
            val_accuracy: val,
            secs: 1.0,
            skipped: 0,
            data_wait_secs: 0.1,
        };
        h.push(&end(f32::NAN));
        assert_eq!(h.loss, vec![[1.0, 2.0], [2.0, 1.0]]);
        assert_eq!(
            (h.last_step, h.in_use_mib.clone(), h.reserved_mib.clone()),
            (2, vec![[2.0, 3.0]], vec![[2.0, 4.0]])
        );
        assert!(h.val_accuracy.is_empty(), "an epoch without validation images plots nothing");
        assert!(h.log.last().unwrap().contains("val loss n/a acc n/a"), "{:?}", h.log);
        h.push(&end(0.25));
        assert_eq!(h.val_accuracy, vec![[2.0, 0.25]]);
        // Exponential moving average, weight 0.9: 2.0, then 0.9 * 2.0 + 0.1 * 1.0.
        let smoothed = h.smoothed_loss();
        assert_eq!(smoothed[0], [1.0, 2.0]);
        assert!((smoothed[1][1] - 1.9).abs() < 1e-9, "{smoothed:?}");
    }

    #[test]
    fn the_micro_batch_comes_from_started_and_each_halving_is_marked_at_its_step() {
        let mut h = RunHistory::default();
        h.push(&Event::Started {
            device: "cpu".into(),
            out_dir: "run".into(),
            start_epoch: 0,
            epochs: 1,
            steps_per_epoch: 4,
            samples: (128, 0),
            plan: Box::new(crate::memory::plan(&crate::config::Config::default(), 10)),
            micro_batch: (32, 1),
            augment_on_device: false,
        });
        assert_eq!(h.micro_batch, Some((32, 1)));
        let planned = crate::memory::plan(&crate::config::Config::default(), 10).estimate.total;
        assert_eq!(h.predicted_mib(), Some(planned as f64 / MIB));
        h.push(&step(3, 1.0));
        h.push(&Event::BatchAdapted { micro_batch: 16, grad_accum_steps: 2, reason: "over the budget".into() });
        assert_eq!((h.micro_batch, h.batch_halvings.clone()), (Some((16, 2)), vec![3]));
        assert!(h.log.last().unwrap().contains("micro-batch 16 x 2 (over the budget)"));
    }
}
