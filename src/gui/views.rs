//! The central panel: the tabs and the view they show (the training plots, the evaluation, the
//! prediction, the data's health).

use eframe::egui;

use super::evaluation::{EvaluationView, evaluation_ui};
use super::plots::{PlotsView, plots_ui};
use super::{Command, View, VramfitApp};

impl VramfitApp {
    /// Draws the tabs and the view shown; what the user does goes to `commands`.
    pub(super) fn central_ui(&mut self, ui: &mut egui::Ui, commands: &mut Vec<Command>) {
        let can_evaluate = !self.training() && !self.evaluating() && self.last_run.is_some();
        let evaluating = self.evaluating();
        view_tabs_ui(ui, self.view, commands);
        ui.separator();
        match self.view {
            View::Training => {
                let view = PlotsView {
                    history: &self.history,
                    plan: self.shown_plan(),
                    budget: self.settings.config.memory.memory_budget_bytes,
                    training: self.training(),
                };
                plots_ui(ui, &view, commands)
            }
            View::Evaluation => {
                let view = EvaluationView {
                    evaluation: self.evaluation.as_ref(),
                    can_evaluate,
                    evaluating,
                    cell: self.data_state.cell,
                };
                evaluation_ui(ui, &view, &mut self.data_state.thumbnails, commands)
            }
            View::Predict => self.predict.ui(ui, self.last_run.as_deref(), commands),
            View::Data => self.data_ui(ui, commands),
        }
    }

    /// Draws the central panel alone (what the snapshot tests of the views compare: the setup
    /// panel and the status bar show this machine's paths), applying its commands.
    pub fn central_view(&mut self, ui: &mut egui::Ui) {
        self.poll();
        self.refresh();
        let mut commands = Vec::new();
        // The central panel's margins, as the window draws it.
        egui::Frame::central_panel(ui.style()).show(ui, |ui| self.central_ui(ui, &mut commands));
        self.apply_all(commands);
    }
}

/// The tabs of the central views; a click records [`Command::ShowView`].
fn view_tabs_ui(ui: &mut egui::Ui, shown: View, commands: &mut Vec<Command>) {
    ui.horizontal(|ui| {
        let views = [
            (View::Training, "Training"),
            (View::Evaluation, "Evaluation"),
            (View::Predict, "Predict"),
            (View::Data, "Data"),
        ];
        for (view, name) in views {
            if ui.selectable_label(shown == view, name).clicked() {
                commands.push(Command::ShowView(view));
            }
        }
    });
}
