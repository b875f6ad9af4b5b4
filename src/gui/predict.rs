//! The Predict view: dropped or picked images with thumbnails and top-5 probability bars.

use std::path::{Path, PathBuf};

use eframe::egui;

use super::{Command, dialogs};
use crate::engine::session::PredictedFile;
use crate::inference::predict::ClassProb;

/// One predicted image.
pub struct Prediction {
    /// The file.
    pub path: PathBuf,
    /// Top-5, or the reason the file was rejected.
    pub result: Result<Vec<ClassProb>, String>,
    /// A one-line notice, e.g. that the image ran on the CPU because it does not fit the device.
    pub notice: Option<String>,
    thumbnail: Option<egui::ColorImage>,
    texture: Option<egui::TextureHandle>,
}

/// State of the Predict view.
#[derive(Default)]
pub struct PredictView {
    /// Weights to use: an export folder or file; `None` = the last run's export.
    pub(super) model_path: Option<PathBuf>,
    /// Results, newest first.
    predictions: Vec<Prediction>,
    /// Why the model could not be loaded.
    pub(super) error: Option<String>,
}

impl PredictView {
    /// The weights predictions use: the chosen ones, else the last run's export.
    pub(super) fn model_dir(&self, last_run: Option<&Path>) -> Option<PathBuf> {
        self.model_path.clone().or_else(|| last_run.map(|r| r.join(crate::train::run_dir::EXPORT)))
    }

    /// Results, newest first.
    pub fn predictions(&self) -> &[Prediction] {
        &self.predictions
    }

    /// Forgets the results.
    pub(super) fn clear(&mut self) {
        self.predictions.clear();
    }

    /// Shows a finished prediction job's results (newest first).
    pub(super) fn add_results(&mut self, files: Vec<PredictedFile>) {
        self.error = None;
        for mut f in files {
            let thumbnail =
                f.thumbnail.map(|t| egui::ColorImage::from_rgb([t.width() as usize, t.height() as usize], t.as_raw()));
            self.predictions.insert(
                0,
                Prediction { path: f.path, result: f.result, notice: f.notices.pop(), thumbnail, texture: None },
            );
        }
    }

    /// Draws the view.
    pub(super) fn ui(&mut self, ui: &mut egui::Ui, last_run: Option<&Path>, commands: &mut Vec<Command>) {
        ui.horizontal(|ui| {
            // Weights of the last run are named from its folder (`RUN/export`), others in full.
            let model = self.model_dir(last_run);
            let full = model.as_ref().map_or("none".into(), |p| p.display().to_string());
            let short = match (&model, last_run.and_then(|r| Some((r, r.parent()?)))) {
                (Some(m), Some((run, parent))) if m.starts_with(run) => {
                    m.strip_prefix(parent).map_or(full.clone(), |p| p.display().to_string())
                }
                _ => full.clone(),
            };
            ui.label(format!("weights: {short}")).on_hover_text(full);
            if ui.button("Choose weights…").clicked()
                && let Some(f) = dialogs::pick_file("weights", &["bpk", "safetensors"])
            {
                commands.push(Command::ChooseModel(f));
            }
            if ui.button("Choose images…").clicked()
                && let Some(files) = dialogs::pick_files()
            {
                commands.push(Command::Predict(files));
            }
            if ui.button("Clear").clicked() {
                commands.push(Command::ClearPredictions);
            }
        });
        ui.label("Drop image files on the window to classify them.");
        if let Some(e) = &self.error {
            ui.colored_label(egui::Color32::RED, e);
        }
        egui::ScrollArea::vertical().show(ui, |ui| {
            for p in &mut self.predictions {
                ui.horizontal(|ui| {
                    if let (None, Some(img)) = (&p.texture, &p.thumbnail) {
                        p.texture = Some(ui.ctx().load_texture(
                            p.path.display().to_string(),
                            img.clone(),
                            egui::TextureOptions::LINEAR,
                        ));
                    }
                    match &p.texture {
                        Some(t) => {
                            ui.image((t.id(), egui::vec2(96.0, 96.0)));
                        }
                        None => {
                            ui.add_sized([96.0, 96.0], egui::Label::new("no preview"));
                        }
                    }
                    ui.vertical(|ui| {
                        ui.label(p.path.file_name().map_or(String::new(), |n| n.to_string_lossy().to_string()));
                        match &p.result {
                            Ok(top) => {
                                for c in top {
                                    ui.add(egui::ProgressBar::new(c.probability).desired_width(240.0).text(format!(
                                        "{} {:.1}%",
                                        c.name,
                                        c.probability * 100.0
                                    )));
                                }
                            }
                            Err(e) => {
                                ui.colored_label(egui::Color32::RED, e);
                            }
                        }
                        if let Some(n) = &p.notice {
                            ui.small(n);
                        }
                    });
                });
                ui.separator();
            }
        });
    }
}

/// Files dropped on a page: a browser gives their names and reads their bytes asynchronously,
/// so each is read by a task of the page and collected here for the next frame.
#[cfg(target_arch = "wasm32")]
#[derive(Default)]
pub(super) struct PageDrops {
    read: std::rc::Rc<std::cell::RefCell<Vec<crate::data::dataset::SampleSource>>>,
}

#[cfg(target_arch = "wasm32")]
impl PageDrops {
    /// Starts reading `files`; the frame after each read ends picks it up ([`Self::take`]). A
    /// file the browser cannot read comes as empty bytes, which prediction names as empty.
    pub(super) fn read(&self, files: Vec<egui::DroppedFileHandle>, ctx: &egui::Context) {
        for file in files {
            let (read, ctx) = (self.read.clone(), ctx.clone());
            wasm_bindgen_futures::spawn_local(async move {
                let bytes = file.bytes_async().await.unwrap_or_default();
                let path = file.path().to_path_buf();
                read.borrow_mut().push(crate::data::dataset::SampleSource::Encoded { path, bytes: bytes.into() });
                ctx.request_repaint();
            });
        }
    }

    /// The files read since the last call.
    pub(super) fn take(&self) -> Vec<crate::data::dataset::SampleSource> {
        std::mem::take(&mut *self.read.borrow_mut())
    }
}
