//! The status bar: what the app is doing, the step and epoch, the run folder, frame times, the
//! last error and the last log line.

use super::*;

impl VramfitApp {
    pub(super) fn status_ui(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            let h = &self.history;
            let mut line = format!("{} · step {} · epoch {}", self.status, h.last_step, h.epoch + 1);
            if let Some((batch, accum)) = h.micro_batch {
                line.push_str(&format!(" · micro-batch {batch} x {accum}"));
            }
            ui.label(line);
            if let Some(run) = &self.last_run {
                ui.label(format!("run {}", run.display()));
            }
            let (last, t) = (self.frame_times.last_ms(), self.frame_times.while_training());
            if t.frames > 0 {
                ui.small(format!(
                    "frame {last:.0} ms (longest while training {:.0} ms, {} over {FRAME_BUDGET_MS:.0} ms)",
                    t.max_ms, t.over_budget
                ));
            } else if last > 0.0 {
                ui.small(format!("frame {last:.0} ms"));
            }
        });
        if let Some(e) = &self.error {
            ui.colored_label(egui::Color32::RED, e);
        }
        if let Some(last) = self.history.log.last() {
            ui.small(last);
        }
    }
}
