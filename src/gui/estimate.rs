//! The memory estimate under the knobs: the predicted peak against the budget, its terms, and
//! the micro-batch that would fit.

use super::*;

impl VramfitApp {
    pub(super) fn estimate_ui(&self, ui: &mut egui::Ui) {
        ui.label("Memory estimate");
        let fraction = self.plan.estimate.total as f32 / self.plan.budget_bytes.max(1) as f32;
        let color =
            if self.plan.fits { egui::Color32::from_rgb(60, 160, 90) } else { egui::Color32::from_rgb(200, 60, 60) };
        ui.add(
            egui::ProgressBar::new(fraction.min(1.0)).fill(color).text(format!("{:.0}% of budget", fraction * 100.0)),
        );
        ui.label(self.estimate_text());
        let e = &self.plan.estimate;
        ui.small(format!(
            "weights+grads+AdamW {} · activations {} · input {} · workspace {} · pool pages {}",
            human_bytes(e.parameters + e.gradients + e.optimizer_state + e.weight_casts),
            human_bytes(e.activations()),
            human_bytes(e.input_batch),
            human_bytes(e.workspace),
            human_bytes(e.allocator_overhead)
        ));
        if !self.plan.fits && self.plan.fit_batch_size > 0 {
            ui.small(format!(
                "fits as batch {} x accumulation {} (same effective batch)",
                self.plan.fit_batch_size, self.plan.fit_grad_accum_steps
            ));
        }
    }
}
