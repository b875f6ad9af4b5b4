//! The Predict view: dropped or picked images with thumbnails and top-5 probability bars.

use std::path::{Path, PathBuf};

use eframe::egui;

use crate::device::{self, DeviceChoice};
use crate::infer::{ClassProb, Predictor};

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
    pub model_path: Option<PathBuf>,
    /// Results, newest first.
    pub predictions: Vec<Prediction>,
    /// Why the model could not be loaded.
    pub error: Option<String>,
}

impl PredictView {
    fn model_dir(&self, last_run: Option<&Path>) -> Option<PathBuf> {
        self.model_path.clone().or_else(|| last_run.map(|r| r.join(crate::run_dir::EXPORT)))
    }

    /// Predicts `paths` with the current weights on `device`.
    pub fn add_files(&mut self, paths: Vec<PathBuf>, choice: DeviceChoice, last_run: Option<&Path>) {
        let Some(model) = self.model_dir(last_run) else {
            self.error = Some(
                "no model yet: train one, or choose exported weights (.bpk / .safetensors with model.json)".into(),
            );
            return;
        };
        let device = match device::select(choice) {
            Ok(d) => d,
            Err(e) => {
                self.error = Some(e.to_string());
                return;
            }
        };
        let predictor = match Predictor::load(&model, device.device.clone()) {
            Ok(p) => p.with_buffer_limit(device.buffer_limit()),
            Err(e) => {
                self.error = Some(e.to_string());
                return;
            }
        };
        self.error = None;
        for path in paths {
            let loaded = predictor.load_image(&path);
            let thumbnail = loaded.as_ref().ok().map(|img| {
                let t = image::imageops::thumbnail(img, 96, 96);
                egui::ColorImage::from_rgb([t.width() as usize, t.height() as usize], t.as_raw())
            });
            let result = loaded
                .map_err(|e| e.to_string())
                .and_then(|img| predictor.predict_image(&img, 5).map_err(|e| e.to_string()));
            let notice = predictor.take_notices().pop();
            self.predictions.insert(0, Prediction { path, result, notice, thumbnail, texture: None });
        }
    }

    /// Draws the view.
    pub fn ui(&mut self, ui: &mut egui::Ui, choice: DeviceChoice, last_run: Option<&Path>) {
        ui.horizontal(|ui| {
            let model = self.model_dir(last_run).map_or("none".into(), |p| p.display().to_string());
            ui.label(format!("weights: {model}"));
            if ui.button("Choose weights…").clicked()
                && let Some(f) = rfd::FileDialog::new().add_filter("weights", &["bpk", "safetensors"]).pick_file()
            {
                self.model_path = Some(f);
            }
            if ui.button("Choose images…").clicked()
                && let Some(files) = rfd::FileDialog::new().pick_files()
            {
                self.add_files(files, choice, last_run);
            }
            if ui.button("Clear").clicked() {
                self.predictions.clear();
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
