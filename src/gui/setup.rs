//! The setup panel: adapter, dataset, tier preset, the knobs and the live memory estimate.

use super::*;

impl VramfitApp {
    pub(super) fn setup_ui(&mut self, ui: &mut egui::Ui) {
        let busy = self.training();
        ui.heading("Setup");
        ui.add_enabled_ui(!busy, |ui| {
            let label = |a: &AdapterInfo| match a.device_local_bytes {
                Some(bytes) => format!("{} ({} {}, {})", a.name, a.backend, a.device_type, human_bytes(bytes)),
                None => format!("{} ({} {})", a.name, a.backend, a.device_type),
            };
            let selected = self.device_label();
            let device_label = ui.label("Device");
            egui::ComboBox::from_id_salt("device")
                .selected_text(selected)
                .width(ui.available_width() - 8.0)
                .truncate()
                .show_ui(ui, |ui| {
                    for a in &self.adapters {
                        ui.selectable_value(&mut self.settings.adapter, Some(a.index), label(a));
                    }
                    ui.selectable_value(&mut self.settings.adapter, None, "CPU");
                })
                .response
                .labelled_by(device_label.id);
            if self.settings.adapter.is_none() {
                ui.horizontal(|ui| {
                    ui.radio_value(&mut self.settings.cpu_backend, CpuBackend::Flex, "flex");
                    ui.radio_value(&mut self.settings.cpu_backend, CpuBackend::Ndarray, "ndarray");
                });
            }
            ui.separator();
            ui.label("Dataset");
            ui.horizontal(|ui| {
                let shown = self
                    .settings
                    .data_dir
                    .as_ref()
                    .map_or("bundled Fashion-MNIST subset".into(), |p| p.display().to_string());
                ui.label(shown);
            });
            ui.horizontal(|ui| {
                if ui.button("Choose folder…").clicked()
                    && let Some(dir) = rfd::FileDialog::new().pick_folder()
                {
                    self.settings.data_dir = Some(dir);
                }
                if ui.button("Bundled").clicked() {
                    self.settings.data_dir = None;
                }
            });
            match &self.data {
                Ok(d) => {
                    let counts = d.train.class_counts();
                    ui.label(format!(
                        "{} classes, {} train / {} validation images",
                        d.train.class_names.len(),
                        d.train.samples.len(),
                        d.val.samples.len()
                    ));
                    egui::CollapsingHeader::new("classes").show(ui, |ui| {
                        for (name, n) in d.train.class_names.iter().zip(counts) {
                            ui.label(format!("{name}: {n}"));
                        }
                    });
                    dataset_report_ui(ui, &d.report, &self.history.skipped_files);
                }
                Err(e) => {
                    ui.colored_label(egui::Color32::RED, e);
                }
            }
            ui.separator();
            ui.horizontal(|ui| {
                let label = ui.label("Preset");
                let mut chosen = None;
                egui::ComboBox::from_id_salt("preset")
                    .selected_text(self.settings.preset.clone())
                    .show_ui(ui, |ui| {
                        let this_card = self.card_tier();
                        for (name, _) in crate::presets::PRESETS {
                            let text =
                                if this_card == Some(name) { format!("{name} (this card)") } else { name.to_string() };
                            if ui.selectable_label(self.settings.preset == name, text).clicked() {
                                chosen = Some(name);
                            }
                        }
                    })
                    .response
                    .labelled_by(label.id);
                if let Some(name) = chosen {
                    self.select_preset(name);
                }
            });
            ui.horizontal(|ui| {
                if ui.button("Load preset…").clicked()
                    && let Some(path) = rfd::FileDialog::new().add_filter("config", &["toml"]).pick_file()
                {
                    self.load_preset_file(&path);
                }
                if ui.button("Save preset…").clicked()
                    && let Some(path) = rfd::FileDialog::new().set_file_name("custom.toml").save_file()
                {
                    self.save_preset_file(&path);
                }
            });
            let f16_ok = self.f16_available();
            let before = self.settings.config.clone();
            knobs_ui(ui, &mut self.settings.config, f16_ok);
            if self.settings.config != before {
                self.settings.preset = "custom".into();
            }
        });
        // The budget stays live while training: the engine halves its micro-batch when the
        // measured peak is over it.
        let mut gib = self.settings.config.memory.memory_budget_bytes as f64 / (1u64 << 30) as f64;
        if ui.add(egui::Slider::new(&mut gib, 0.25..=24.0).step_by(0.25).text("budget (GiB)")).changed() {
            self.settings.config.memory.memory_budget_bytes = (gib * (1u64 << 30) as f64) as u64;
            self.settings.preset = "custom".into();
            if let Some(job) = &mut self.job {
                job.set_budget(self.settings.config.memory.memory_budget_bytes);
            }
        }
        ui.add_enabled_ui(!busy, |ui| {
            ui.checkbox(&mut self.settings.config.memory.cap_to_budget, "cap device memory at the budget")
                .on_hover_text(
                    "Emulate a card of the budget's size: a step whose reserved bytes cross the budget fails \
                     as out of memory and is retried at half the micro-batch (one extra sync per step).",
                );
        });
        ui.separator();
        self.estimate_ui(ui);
        ui.separator();
        ui.horizontal(|ui| {
            if ui.add_enabled(!busy, egui::Button::new("Train")).clicked() {
                let ctx = ui.ctx().clone();
                self.start_training(&ctx, false);
            }
            if ui.add_enabled(busy, egui::Button::new("Stop")).clicked() {
                self.stop_training();
            }
            if ui.add_enabled(!busy && self.last_run.is_some(), egui::Button::new("Resume")).clicked() {
                let ctx = ui.ctx().clone();
                self.start_training(&ctx, true);
            }
            if ui.add_enabled(!busy && self.last_run.is_some(), egui::Button::new("Export…")).clicked()
                && let Some(dir) = rfd::FileDialog::new().pick_folder()
            {
                match self.export_to(&dir) {
                    Ok(files) => self.status = format!("exported {} files to {}", files.len(), dir.display()),
                    Err(e) => self.error = Some(e),
                }
            }
        });
    }

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

/// What the scan left out and what training skipped, one line per file with the reason.
fn dataset_report_ui(ui: &mut egui::Ui, report: &dataset::ScanReport, skipped: &[(String, String)]) {
    const SHOWN: usize = 200;
    let section = |ui: &mut egui::Ui, key: &str, title: String, lines: Vec<String>| {
        if lines.is_empty() {
            return;
        }
        egui::CollapsingHeader::new(title).id_salt(key).show(ui, |ui| {
            egui::ScrollArea::vertical().max_height(160.0).id_salt(key).show(ui, |ui| {
                for line in lines.iter().take(SHOWN) {
                    ui.small(line);
                }
                if lines.len() > SHOWN {
                    ui.small(format!("… and {} more (vramfit check-data lists all)", lines.len() - SHOWN));
                }
            });
        });
    };
    let ignored: Vec<String> = report.ignored.iter().map(|(p, why)| format!("{}: {why}", p.display())).collect();
    section(ui, "ignored", format!("{} files ignored by the scan", ignored.len()), ignored);
    let mut other: Vec<String> =
        report.empty_classes.iter().map(|c| format!("class folder {c}: no images, skipped")).collect();
    other.extend(report.symlink_loops.iter().map(|p| {
        format!("{}: symlink back into the dataset (an ancestor or another class), not followed", p.display())
    }));
    section(ui, "folders", format!("{} folders skipped", other.len()), other);
    let skipped: Vec<String> = skipped.iter().map(|(f, why)| format!("{f}: {why}")).collect();
    section(ui, "skipped", format!("{} files skipped while training", skipped.len()), skipped);
}

/// Sliders and toggles for every knob a preset sets.
fn knobs_ui(ui: &mut egui::Ui, c: &mut Config, f16_ok: bool) {
    ui.add(egui::Slider::new(&mut c.train.batch_size, 1..=256).logarithmic(true).text("batch size"));
    ui.add(egui::Slider::new(&mut c.train.grad_accum_steps, 1..=64).logarithmic(true).text("grad accumulation"));
    ui.add(egui::Slider::new(&mut c.data.preprocess.crop_size, 16..=512).step_by(4.0).text("crop size (px)"));
    ui.add(egui::Slider::new(&mut c.data.preprocess.load_size, 16..=640).step_by(4.0).text("load size (px)"));
    ui.horizontal(|ui| {
        let label = ui.label("preprocess");
        egui::ComboBox::from_id_salt("mode")
            .selected_text(c.data.preprocess.mode.name())
            .show_ui(ui, |ui| {
                for m in PreprocessMode::ALL {
                    ui.selectable_value(&mut c.data.preprocess.mode, m, m.name());
                }
            })
            .response
            .labelled_by(label.id);
    });
    ui.add(egui::Slider::new(&mut c.train.epochs, 1..=200).logarithmic(true).text("epochs"));
    ui.add(egui::Slider::new(&mut c.optimizer.lr, 1e-5..=1e-1).logarithmic(true).text("learning rate"));
    ui.horizontal(|ui| {
        ui.label("precision");
        ui.radio_value(&mut c.train.precision, Precision::F32, "f32");
        ui.add_enabled_ui(f16_ok, |ui| {
            ui.radio_value(&mut c.train.precision, Precision::F16, "f16")
                .on_disabled_hover_text("this device has no shader f16");
        });
    });
    if !f16_ok && c.train.precision == Precision::F16 {
        ui.small("f16 is not available on this device: training will run in f32");
    }
    ui.checkbox(&mut c.train.checkpointing, "activation checkpointing");
    ui.checkbox(&mut c.augment.random_crop, "random crop");
    ui.checkbox(&mut c.augment.hflip, "horizontal flip");
    ui.add(egui::Slider::new(&mut c.augment.color_jitter, 0.0..=1.0).text("color jitter"));
    ui.add(egui::Slider::new(&mut c.augment.random_erasing, 0.0..=1.0).text("random erasing"));
    if c.data.preprocess.crop_size > c.data.preprocess.load_size {
        c.data.preprocess.load_size = c.data.preprocess.crop_size;
    }
}
