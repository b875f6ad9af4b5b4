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
    if let Some(last) = last_own_line(&history.log) {
        ui.small(last);
    }
}

/// How lines that graphics drivers write to stderr begin (Mesa's loader and its XDG warning,
/// lavapipe's conformance notice, EGL, driver option overrides): they reach the run's log with
/// the worker's other output, but they are not vramfit's and not an error of the run.
const DRIVER_LINE_PREFIXES: [&str; 8] = [
    "error: XDG_RUNTIME_DIR",
    "WARNING: lavapipe is not a conformant",
    "MESA",
    "libEGL",
    "ATTENTION: default value of option",
    "radv:",
    "amdgpu:",
    "ANV:",
];

/// Whether `line` is a graphics driver's, not vramfit's ([`DRIVER_LINE_PREFIXES`]).
fn is_driver_line(line: &str) -> bool {
    DRIVER_LINE_PREFIXES.iter().any(|p| line.trim_start().starts_with(p))
}

/// The newest log line that is vramfit's own: what the status bar shows.
fn last_own_line(log: &[String]) -> Option<&str> {
    log.iter().rev().map(String::as_str).find(|l| !is_driver_line(l))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_bar_shows_vramfits_last_line_not_a_drivers() {
        let log: Vec<String> = [
            "epoch 1: train loss 1.2 acc 55.0% | val loss 1.0 acc 61.0% (3 s)",
            "error: XDG_RUNTIME_DIR is invalid or not set in the environment.",
            "WARNING: lavapipe is not a conformant vulkan implementation, testing use only.",
            "MESA-LOADER: failed to open swrast: cannot open shared object file",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(last_own_line(&log), Some(log[0].as_str()));
        assert_eq!(last_own_line(&log[1..]), None);
        // vramfit's own errors and warnings are never taken for a driver's.
        assert!(!is_driver_line("error: out of memory: 2.1 GiB reserved over the 2.0 GiB cap"));
        assert!(!is_driver_line("warning: the loss is rising"));
    }
}
