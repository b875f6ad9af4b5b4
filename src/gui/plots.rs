//! The live plots: loss, accuracy, learning rate and device memory against the budget.

use eframe::egui;
use egui_plot::{HLine, Legend, Line, Plot, PlotPoints, VLine};

use super::{Command, RunHistory, dialogs};
use crate::memory::human_bytes;

/// Draws the plots of the current run (`history`) with the memory `budget` in bytes, under the
/// Save buttons (a CSV save records [`Command::SaveMetrics`]; a PNG is a screenshot of the window).
pub(super) fn plots_ui(ui: &mut egui::Ui, history: &RunHistory, budget: u64, commands: &mut Vec<Command>) {
    let h = history;
    save_buttons_ui(ui, commands);
    let height = (ui.available_height() / 2.0 - 24.0).max(120.0);
    let width = (ui.available_width() / 2.0 - 8.0).max(160.0);
    let plot =
        |id: &str| Plot::new(id.to_owned()).legend(Legend::default()).height(height).width(width).x_axis_label("step");
    ui.horizontal(|ui| {
        plot("loss").show(ui, |p| {
            p.line(line("train loss", &h.loss));
            p.line(line("smoothed", &h.smoothed_loss()));
            p.line(line("validation loss", &h.val_loss));
        });
        plot("accuracy").show(ui, |p| {
            p.line(line("train accuracy", &h.train_accuracy));
            p.line(line("validation accuracy", &h.val_accuracy));
        });
    });
    ui.horizontal(|ui| {
        // A budget far above the curves would flatten them to the axis: once the run's
        // memory is known, it is named in the axis label instead of drawn.
        let budget_mib = budget as f64 / 1024.0 / 1024.0;
        let top = h.reserved_mib.iter().map(|p| p[1]).fold(h.predicted_mib().unwrap_or(0.0), f64::max);
        let draw_budget = top == 0.0 || budget_mib <= 4.0 * top;
        let label =
            if draw_budget { "MiB".to_string() } else { format!("MiB (budget {}, above)", human_bytes(budget)) };
        plot("memory").y_axis_label(label).show(ui, |p| {
            p.line(line("bytes_in_use", &h.in_use_mib));
            p.line(line("bytes_reserved", &h.reserved_mib));
            p.line(line("peak in use", &h.peak_mib));
            if let Some(pred) = h.predicted_mib() {
                p.hline(HLine::new("predicted peak", pred));
            }
            if draw_budget {
                p.hline(HLine::new("budget", budget_mib));
            }
            for &step in &h.batch_halvings {
                p.vline(VLine::new("micro-batch halved", step as f64));
            }
        });
        plot("rate").show(ui, |p| {
            p.line(line("learning rate x1000", &h.lr.iter().map(|[x, y]| [*x, y * 1000.0]).collect::<Vec<_>>()));
            p.line(line("images/s ÷100", &h.images_per_sec.iter().map(|[x, y]| [*x, y / 100.0]).collect::<Vec<_>>()));
        });
    });
}

/// A plot line named `name` through `pts`.
fn line(name: &str, pts: &[[f64; 2]]) -> Line<'static> {
    Line::new(name.to_owned(), PlotPoints::from(pts.to_vec()))
}

/// Save metrics CSV… (records [`Command::SaveMetrics`]) and Save plots PNG… (asks egui for a
/// screenshot of the window, saved when it comes).
fn save_buttons_ui(ui: &mut egui::Ui, commands: &mut Vec<Command>) {
    ui.horizontal(|ui| {
        if ui.button("Save metrics CSV…").clicked()
            && let Some(path) = dialogs::save_file("metrics.csv")
        {
            commands.push(Command::SaveMetrics(path));
        }
        if ui.button("Save plots PNG…").clicked()
            && let Some(path) = dialogs::save_file("vramfit-plots.png")
        {
            let callback = egui::ScreenshotCallback::new(move |image| save_png(&image, &path));
            ui.ctx().send_viewport_cmd(egui::ViewportCommand::Screenshot(callback));
        }
    });
}

/// Writes a window screenshot as PNG (errors are logged: the user picked the path moments ago).
fn save_png(image: &egui::ColorImage, path: &std::path::Path) {
    let [w, h] = image.size;
    let bytes: Vec<u8> = image.pixels.iter().flat_map(|p| p.to_array()).collect();
    match image::RgbaImage::from_raw(w as u32, h as u32, bytes).map(|img| img.save(path)) {
        Some(Ok(())) => {}
        Some(Err(e)) => tracing::warn!("cannot save {}: {e}", path.display()),
        None => tracing::warn!("screenshot has an unexpected size"),
    }
}
