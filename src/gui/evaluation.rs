//! The evaluation view: per-class recall, balanced accuracy and macro-F1, a confusion matrix
//! whose cells list their images, and a gallery of the images whose label the model doubts.

use eframe::egui;

use super::Command;
use super::data_view::{DataCommand, ImageKey, Thumbnails};
use crate::data::split_record::Split;
use crate::inference::eval::EvalResult;

/// Images a gallery shows at most.
const GALLERY: usize = 24;

/// What the evaluation view draws.
pub(super) struct EvaluationView<'a> {
    /// The last evaluation (of the validation images).
    pub(super) evaluation: Option<&'a EvalResult>,
    /// The Evaluate button is enabled.
    pub(super) can_evaluate: bool,
    /// An evaluation is running (a spinner).
    pub(super) evaluating: bool,
    /// The confusion-matrix cell whose images are shown.
    pub(super) cell: Option<(usize, usize)>,
}

/// Draws the evaluation view: the Evaluate button (enabled when `can_evaluate`, a spinner while
/// `evaluating`; a click records [`Command::Evaluate`]), then the last evaluation's accuracy,
/// per class and as a confusion matrix (a click on a cell lists its images), and the images
/// whose label the model doubts. Thumbnails not yet loaded are asked for.
pub(super) fn evaluation_ui(
    ui: &mut egui::Ui,
    view: &EvaluationView<'_>,
    thumbnails: &mut Thumbnails,
    commands: &mut Vec<Command>,
) {
    ui.horizontal(|ui| {
        let button = ui
            .add_enabled(view.can_evaluate, egui::Button::new("Evaluate latest checkpoint"))
            .on_disabled_hover_text("needs a run that is not training");
        if button.clicked() {
            commands.push(Command::Evaluate);
        }
        if view.evaluating {
            ui.spinner();
        }
        ui.small("validation data; also runs after each epoch");
    });
    let Some(eval) = view.evaluation else {
        ui.label("No evaluation yet: it runs after each epoch, or press the button after training or Stop.");
        return;
    };
    let pct = |v: f32| crate::inference::eval::percent_or_na(v);
    ui.label(format!(
        "top-1 {}  top-5 {}  balanced accuracy {}  macro-F1 {}  on {} images",
        pct(eval.top1),
        pct(eval.top5),
        pct(eval.balanced_accuracy()),
        pct(eval.macro_f1()),
        eval.samples
    ));
    let mut wanted = Vec::new();
    egui::ScrollArea::vertical().auto_shrink([false, false]).show(ui, |ui| {
        let (recalls, precisions) = (eval.per_class_accuracy(), eval.per_class_precision());
        egui::Grid::new("per_class").striped(true).show(ui, |ui| {
            for (c, name) in eval.class_names.iter().enumerate() {
                let (recall, precision) = (recalls[c], precisions[c]);
                ui.label(name);
                let bar = egui::ProgressBar::new(if recall.is_finite() { recall } else { 0.0 });
                ui.add(bar.text(format!("recall {}", pct(recall))).desired_width(160.0));
                ui.small(format!("precision {}", pct(precision)));
                ui.end_row();
            }
        });
        ui.label("Confusion matrix (rows: true class, columns: predicted); click a cell for its images");
        if let Some(cell) = confusion_ui(ui, eval, view.cell) {
            commands.push(Command::Data(DataCommand::SelectCell(Some(cell))));
        }
        cell_gallery_ui(ui, eval, view.cell, thumbnails, &mut wanted);
        review_ui(ui, eval, thumbnails, &mut wanted);
    });
    let missing = thumbnails.missing(wanted);
    if !missing.is_empty() {
        commands.push(Command::Data(DataCommand::LoadThumbnails(missing)));
    }
}

/// The most probable class of row `row` of `eval`'s kept probabilities.
fn predicted(eval: &EvalResult, row: usize) -> usize {
    let c = eval.class_names.len();
    crate::inference::eval::top_k(&eval.probabilities[row * c..(row + 1) * c], 1)[0].0
}

/// The images of the selected cell, as thumbnails.
fn cell_gallery_ui(
    ui: &mut egui::Ui,
    eval: &EvalResult,
    cell: Option<(usize, usize)>,
    thumbnails: &mut Thumbnails,
    wanted: &mut Vec<ImageKey>,
) {
    let Some((t, p)) = cell else { return };
    let (Some(true_name), Some(predicted_name)) = (eval.class_names.get(t), eval.class_names.get(p)) else { return };
    ui.label(format!("True {true_name}, predicted {predicted_name}: {} images", eval.confusion[t][p]));
    if eval.probabilities.is_empty() {
        ui.small("Press Evaluate latest checkpoint to see the images behind each cell.");
        return;
    }
    let rows: Vec<usize> =
        (0..eval.sample_labels.len()).filter(|&r| eval.sample_labels[r] == t && predicted(eval, r) == p).collect();
    ui.horizontal_wrapped(|ui| {
        for &r in rows.iter().take(GALLERY) {
            let key = (Split::Val, eval.sample_indices[r]);
            wanted.push(key);
            thumbnails.show(ui, key);
        }
        if rows.len() > GALLERY {
            ui.small(format!("and {} more", rows.len() - GALLERY));
        }
    });
}

/// "Review these": the images whose label the model doubts most (confident learning), each
/// with its given and likely class.
fn review_ui(ui: &mut egui::Ui, eval: &EvalResult, thumbnails: &mut Thumbnails, wanted: &mut Vec<ImageKey>) {
    if eval.probabilities.is_empty() {
        return;
    }
    let issues = eval.label_issues();
    ui.separator();
    ui.label(format!(
        "Review these: {} of {} images look mislabelled (the model is confidently sure of another class)",
        issues.len(),
        eval.samples
    ));
    ui.horizontal_wrapped(|ui| {
        for issue in issues.iter().take(GALLERY) {
            let key = (Split::Val, eval.sample_indices[issue.index]);
            wanted.push(key);
            ui.vertical(|ui| {
                thumbnails.show(ui, key);
                ui.small(format!("labelled {}", eval.class_names[issue.given]));
                ui.small(format!(
                    "looks {} {:.0}%",
                    eval.class_names[issue.predicted],
                    issue.predicted_probability * 100.0
                ));
            });
        }
    });
}

/// The confusion matrix of `eval` as a grid of cells, each row shaded by its share of the row,
/// `selected` outlined; returns the cell clicked.
fn confusion_ui(ui: &mut egui::Ui, eval: &EvalResult, selected: Option<(usize, usize)>) -> Option<(usize, usize)> {
    let n = eval.class_names.len();
    let cell = 22.0;
    let (rect, response) = ui.allocate_exact_size(egui::vec2(cell * n as f32, cell * n as f32), egui::Sense::click());
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
            if selected == Some((i, j)) {
                painter.rect_stroke(r, 0.0, ui.visuals().selection.stroke, egui::StrokeKind::Outside);
            }
        }
    }
    let at = response.interact_pointer_pos().filter(|_| response.clicked())? - rect.min;
    let (i, j) = ((at.y / cell) as usize, (at.x / cell) as usize);
    (i < n && j < n).then_some((i, j))
}
