//! The status bar: what the app is doing, the step and epoch, the run folder, frame times, the
//! last error and the last log line.

use std::path::Path;

use eframe::egui;

use super::{FRAME_BUDGET_MS, FrameTimes, RunHistory};

/// Draws the status bar: `status` with the run's step, epoch and micro-batch from `history`,
/// the run folder, the frame times, the last `error` (in red) and the last log line.
pub(super) fn status_ui(
    ui: &mut egui::Ui,
    status: &str,
    history: &RunHistory,
    last_run: Option<&Path>,
    frame_times: &FrameTimes,
    error: Option<&str>,
) {
    ui.horizontal(|ui| {
        let h = history;
        let mut line = format!("{status} · step {} · epoch {}", h.last_step, h.epoch + 1);
        if let Some((batch, accum)) = h.micro_batch {
            line.push_str(&format!(" · micro-batch {batch} x {accum}"));
        }
        ui.label(line);
        if let Some(run) = last_run {
            ui.label(format!("run {}", run.display()));
        }
        let (last, t) = (frame_times.last_ms(), frame_times.while_training());
        if t.frames > 0 {
            ui.small(format!(
                "frame {last:.0} ms (longest while training {:.0} ms, {} over {FRAME_BUDGET_MS:.0} ms)",
                t.max_ms, t.over_budget
            ));
        } else if last > 0.0 {
            ui.small(format!("frame {last:.0} ms"));
        }
    });
    if let Some(e) = error {
        ui.colored_label(egui::Color32::RED, e);
    }
    if let Some(last) = history.log.last() {
        ui.small(last);
    }
}
