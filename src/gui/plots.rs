//! The live plots: loss, accuracy, learning rate and device memory against the budget.

use super::*;

impl VramfitApp {
    pub(super) fn plots_ui(&mut self, ui: &mut egui::Ui) {
        let h = &self.history;
        ui.horizontal(|ui| {
            if ui.button("Save metrics CSV…").clicked()
                && let Some(path) = dialogs::save_file("metrics.csv")
            {
                self.commands.push(Command::SaveMetrics(path));
            }
            if ui.button("Save plots PNG…").clicked()
                && let Some(path) = dialogs::save_file("vramfit-plots.png")
            {
                let callback = egui::ScreenshotCallback::new(move |image| save_png(&image, &path));
                ui.ctx().send_viewport_cmd(egui::ViewportCommand::Screenshot(callback));
            }
        });
        let height = (ui.available_height() / 2.0 - 24.0).max(120.0);
        let width = (ui.available_width() / 2.0 - 8.0).max(160.0);
        let plot = |id: &str| {
            Plot::new(id.to_owned()).legend(Legend::default()).height(height).width(width).x_axis_label("step")
        };
        let line = |name: &str, pts: &Vec<[f64; 2]>| Line::new(name.to_owned(), PlotPoints::from(pts.clone()));
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
            let budget = self.plan.budget_bytes as f64 / 1024.0 / 1024.0;
            let top = h.reserved_mib.iter().map(|p| p[1]).fold(h.predicted_mib.unwrap_or(0.0), f64::max);
            let draw_budget = top == 0.0 || budget <= 4.0 * top;
            let label = if draw_budget {
                "MiB".to_string()
            } else {
                format!("MiB (budget {}, above)", human_bytes(self.plan.budget_bytes))
            };
            plot("memory").y_axis_label(label).show(ui, |p| {
                p.line(line("bytes_in_use", &h.in_use_mib));
                p.line(line("bytes_reserved", &h.reserved_mib));
                p.line(line("peak in use", &h.peak_mib));
                if let Some(pred) = h.predicted_mib {
                    p.hline(HLine::new("predicted peak", pred));
                }
                if draw_budget {
                    p.hline(HLine::new("budget", budget));
                }
                for &step in &h.batch_halvings {
                    p.vline(VLine::new("micro-batch halved", step as f64));
                }
            });
            plot("rate").show(ui, |p| {
                p.line(line("learning rate x1000", &h.lr.iter().map(|[x, y]| [*x, y * 1000.0]).collect()));
                p.line(line("images/s ÷100", &h.images_per_sec.iter().map(|[x, y]| [*x, y / 100.0]).collect()));
            });
        });
    }
}

/// Writes a window screenshot as PNG (errors are logged: the user picked the path moments ago).
pub(super) fn save_png(image: &egui::ColorImage, path: &std::path::Path) {
    let [w, h] = image.size;
    let bytes: Vec<u8> = image.pixels.iter().flat_map(|p| p.to_array()).collect();
    match image::RgbaImage::from_raw(w as u32, h as u32, bytes).map(|img| img.save(path)) {
        Some(Ok(())) => {}
        Some(Err(e)) => tracing::warn!("cannot save {}: {e}", path.display()),
        None => tracing::warn!("screenshot has an unexpected size"),
    }
}
