//! The evaluation view: per-class accuracy and the confusion matrix.

use eframe::egui;

use super::Command;
use crate::inference::eval::EvalResult;

/// Draws the evaluation view: the Evaluate button (enabled when `can_evaluate`, a spinner while
/// `evaluating`; a click records [`Command::Evaluate`]), then the last `evaluation`'s accuracy,
/// per class and as a confusion matrix.
pub(super) fn evaluation_ui(
    ui: &mut egui::Ui,
    evaluation: Option<&EvalResult>,
    can_evaluate: bool,
    evaluating: bool,
    commands: &mut Vec<Command>,
) {
    ui.horizontal(|ui| {
        let button = ui
            .add_enabled(can_evaluate, egui::Button::new("Evaluate latest checkpoint"))
            .on_disabled_hover_text("needs a run that is not training");
        if button.clicked() {
            commands.push(Command::Evaluate);
        }
        if evaluating {
            ui.spinner();
        }
        ui.small("validation data; also runs after each epoch");
    });
    let Some(eval) = evaluation else {
        ui.label("No evaluation yet: it runs after each epoch, or press the button after training or Stop.");
        return;
    };
    ui.label(format!("top-1 {:.2}%  top-5 {:.2}%  on {} images", eval.top1 * 100.0, eval.top5 * 100.0, eval.samples));
    egui::Grid::new("per_class").striped(true).show(ui, |ui| {
        for (name, acc) in eval.class_names.iter().zip(eval.per_class_accuracy()) {
            ui.label(name);
            ui.add(egui::ProgressBar::new(acc).text(format!("{:.1}%", acc * 100.0)).desired_width(160.0));
            ui.end_row();
        }
    });
    ui.label("Confusion matrix (rows: true class, columns: predicted)");
    confusion_ui(ui, eval);
}

/// The confusion matrix of `eval` as a grid of cells, each row shaded by its share of the row.
fn confusion_ui(ui: &mut egui::Ui, eval: &EvalResult) {
    let n = eval.class_names.len();
    let cell = 22.0;
    let (rect, _) = ui.allocate_exact_size(egui::vec2(cell * n as f32, cell * n as f32), egui::Sense::hover());
    let painter = ui.painter_at(rect);
    for (i, row) in eval.confusion.iter().enumerate() {
        let total = row.iter().sum::<u64>().max(1) as f32;
        for (j, v) in row.iter().enumerate() {
            let t = *v as f32 / total;
            let color = egui::Color32::from_rgb((255.0 * (1.0 - t)) as u8, (255.0 * (1.0 - t * 0.6)) as u8, 255);
            let r = egui::Rect::from_min_size(
                rect.min + egui::vec2(j as f32 * cell, i as f32 * cell),
                egui::vec2(cell - 1.0, cell - 1.0),
            );
            painter.rect_filled(r, 0.0, color);
        }
    }
}
