//! The memory estimate under the knobs: the predicted peak against the budget, its terms, and
//! the micro-batch that would fit.

use eframe::egui;

use crate::memory::{Plan, human_bytes};

/// The estimate line shown beside the sliders: the predicted peak, the budget and the verdict.
pub(super) fn estimate_text(plan: &Plan) -> String {
    format!(
        "predicted peak {} of {}: {}",
        human_bytes(plan.estimate.total),
        human_bytes(plan.budget_bytes),
        plan.verdict()
    )
}

/// Draws the memory estimate of `plan` (the running run's plan when `of_run`): a bar against the
/// budget, the estimate line, its terms and, when it does not fit, the micro-batch that would.
pub(super) fn estimate_ui(ui: &mut egui::Ui, plan: &Plan, of_run: bool) {
    ui.label(if of_run { "Memory plan of this run" } else { "Memory estimate" });
    let fraction = plan.estimate.total as f32 / plan.budget_bytes.max(1) as f32;
    let color = if plan.fits { egui::Color32::from_rgb(60, 160, 90) } else { egui::Color32::from_rgb(200, 60, 60) };
    ui.add(egui::ProgressBar::new(fraction.min(1.0)).fill(color).text(format!("{:.0}% of budget", fraction * 100.0)));
    ui.label(estimate_text(plan));
    let e = &plan.estimate;
    ui.small(format!(
        "weights+grads+AdamW {} · activations {} · input {} · workspace {} · pool pages {}",
        human_bytes(e.parameters + e.gradients + e.optimizer_state + e.weight_casts),
        human_bytes(e.activations()),
        human_bytes(e.input_batch),
        human_bytes(e.workspace),
        human_bytes(e.allocator_overhead)
    ));
    if !plan.fits && plan.fit_batch_size > 0 {
        ui.small(format!(
            "fits as batch {} x accumulation {} (same effective batch)",
            plan.fit_batch_size, plan.fit_grad_accum_steps
        ));
    }
}
