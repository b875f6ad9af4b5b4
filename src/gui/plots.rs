//! The live plots, each titled with its unit: loss, accuracy, device memory against the plan
//! and the budget, learning rate, images per second. Before the first step, what will appear and
//! the plan's figures; while the first step compiles its kernels, that, with the time so far.

use eframe::egui;
use egui_plot::{HLine, Legend, Line, Plot, PlotPoints, VLine};

use super::{Command, RunHistory, dialogs};
use crate::memory::{Plan, human_bytes};

/// Where the plots panel keeps (in egui's memory) when the wait for the run's first step began.
fn first_step_wait() -> egui::Id {
    egui::Id::unique("vramfit: the wait for the first step")
}

/// What the plots panel draws besides the run's points.
pub(super) struct PlotsView<'a> {
    /// The run's points.
    pub(super) history: &'a RunHistory,
    /// The plan shown in the setup panel (the settings', or the run's own while it lasts).
    pub(super) plan: &'a Plan,
    /// The memory budget now, bytes (the slider moves it while a run lasts).
    pub(super) budget: u64,
    /// Whether a run is in progress.
    pub(super) training: bool,
}

/// Draws the plots of the current run under the Save buttons (a CSV save records
/// [`Command::SaveMetrics`]; a PNG is a screenshot of the window), or, before its first step,
/// what will appear.
pub(super) fn plots_ui(ui: &mut egui::Ui, view: &PlotsView<'_>, commands: &mut Vec<Command>) {
    let h = view.history;
    if h.loss.is_empty() {
        waiting_ui(ui, view);
        return;
    }
    ui.ctx().data_mut(|d| d.remove::<f64>(first_step_wait()));
    ui.horizontal(|ui| {
        save_buttons_ui(ui, commands);
        ui.small("x axis: optimizer step");
    });
    let height = (ui.available_height() / 2.0 - 44.0).max(120.0);
    let width = (ui.available_width() / 3.0 - 8.0).max(160.0);
    // The unit is in each title: egui_plot draws an axis label over wide tick labels.
    let plot = |id: &str| Plot::new(id.to_owned()).legend(Legend::default()).height(height).width(width);
    let percent = |pts: &[[f64; 2]]| pts.iter().map(|[x, y]| [*x, 100.0 * y]).collect::<Vec<_>>();
    ui.horizontal(|ui| {
        titled(ui, "Loss (cross-entropy)", |ui| {
            plot("loss").include_y(0.0).show(ui, |p| {
                p.line(line("train", &h.loss));
                p.line(line("train, smoothed", &h.smoothed_loss()));
                p.line(line("validation", &h.val_loss));
            });
        });
        titled(ui, "Accuracy (%)", |ui| {
            plot("accuracy").include_y(0.0).include_y(100.0).show(ui, |p| {
                p.line(line("train", &percent(&h.train_accuracy)));
                p.line(line("validation", &percent(&h.val_accuracy)));
            });
        });
        memory_plot(ui, plot("memory"), h, view.budget);
    });
    ui.horizontal(|ui| {
        titled(ui, "Learning rate", |ui| {
            plot("learning rate").include_y(0.0).show(ui, |p| p.line(line("learning rate", &h.lr)));
        });
        titled(ui, "Throughput (images/s)", |ui| {
            plot("throughput").include_y(0.0).show(ui, |p| p.line(line("images/s", &h.images_per_sec)));
        });
    });
}

/// A bold `title` over what `add` draws.
fn titled(ui: &mut egui::Ui, title: &str, add: impl FnOnce(&mut egui::Ui)) {
    ui.vertical(|ui| {
        ui.strong(title);
        add(ui);
    });
}

/// Bytes in use, reserved and the peak, from 0 to at least the predicted peak, with the plan's
/// line and the budget's (named in the title instead where it is over 4 times the curves, which
/// it would flatten), and a mark where the micro-batch was halved. Without samples (the CPU
/// backends keep no device pools), a line saying so.
fn memory_plot(ui: &mut egui::Ui, plot: Plot<'_>, h: &RunHistory, budget: u64) {
    let budget_mib = budget as f64 / 1024.0 / 1024.0;
    let predicted = h.predicted_mib();
    let top = h.reserved_mib.iter().map(|p| p[1]).fold(predicted.unwrap_or(0.0), f64::max);
    let draw_budget = top == 0.0 || budget_mib <= 4.0 * top;
    let title = if draw_budget {
        "Device memory (MiB)".to_string()
    } else {
        format!("Device memory (MiB; the {} budget is far above)", human_bytes(budget))
    };
    titled(ui, &title, |ui| {
        if h.reserved_mib.is_empty() {
            ui.label("No memory samples: the CPU backends keep no device pools.");
            return;
        }
        let mut plot = plot.include_y(0.0).include_y(top);
        if draw_budget {
            plot = plot.include_y(budget_mib);
        }
        plot.show(ui, |p| {
            p.line(line("bytes_in_use", &h.in_use_mib));
            p.line(line("bytes_reserved", &h.reserved_mib));
            p.line(line("peak in use", &h.peak_mib));
            if let Some(pred) = predicted {
                p.hline(HLine::new("predicted peak", pred));
            }
            if draw_budget {
                p.hline(HLine::new("budget", budget_mib));
            }
            for &step in &h.batch_halvings {
                p.vline(VLine::new("micro-batch halved", step as f64));
            }
        });
    });
}

/// Before the first step: what the plots will show and the plan, or, once Train was pressed,
/// that the first step is being prepared, with the seconds so far (repainted each second).
fn waiting_ui(ui: &mut egui::Ui, view: &PlotsView<'_>) {
    let id = first_step_wait();
    let now = ui.input(|i| i.time);
    let plan = view.plan;
    ui.add_space(24.0);
    ui.vertical_centered(|ui| {
        if view.training {
            let since = ui.ctx().data_mut(|d| *d.get_temp_mut_or_insert_with(id, || now));
            ui.heading(format!("Preparing the first step… {:.0} s", now - since));
            ui.label(
                "The first step loads the data and, on a GPU, compiles every kernel (on a software \
                 adapter this takes minutes). Later runs reuse the compiled kernels. Stop ends it \
                 at any time.",
            );
            ui.ctx().request_repaint_after(std::time::Duration::from_secs(1));
        } else {
            ui.ctx().data_mut(|d| d.remove::<f64>(id));
            ui.heading("No run yet");
            ui.label(
                "Press Train: the loss, accuracy, device memory, learning rate and images/s of \
                 every step appear here.",
            );
        }
        ui.add_space(8.0);
        ui.label(format!(
            "Planned peak of device memory: {} of the {} budget ({:.0}%), {}.",
            human_bytes(plan.estimate.total),
            human_bytes(plan.budget_bytes),
            100.0 * plan.estimate.total as f64 / plan.budget_bytes.max(1) as f64,
            if plan.fits { "fits" } else { "does not fit: see the setup panel" }
        ));
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
