//! The setup panel: adapter, dataset, tier preset, the knobs and the live memory estimate.

use std::path::Path;

use eframe::egui;

use super::estimate::estimate_ui;
use super::{Command, Settings, dialogs};
use crate::config::{Config, Precision};
use crate::data::dataset::{ScanReport, Splits};
use crate::data::preprocess::PreprocessMode;
use crate::device::{AdapterInfo, CpuBackend};
use crate::memory::{Plan, human_bytes};

/// What the setup panel shows, borrowed from the app for one frame.
pub(super) struct SetupView<'a> {
    /// The settings (the panel records commands that change them).
    pub(super) settings: &'a Settings,
    /// The adapters and what the settings select among them.
    pub(super) device: DeviceView<'a>,
    /// The dataset of the settings.
    pub(super) dataset: DatasetView<'a>,
    /// The memory plan shown: the settings', or while a run lasts the run's own (what it
    /// trains after `--auto-fit`, against the budget as it is now).
    pub(super) plan: &'a Plan,
    /// Why the tier preset in use trains as it does, when the settings are a tier's.
    pub(super) tier_reason: Option<&'a str>,
    /// What the app did with its saved settings, shown at the top until dismissed.
    pub(super) notices: &'a [String],
    /// Whether a run is in progress (most of the panel is disabled then).
    pub(super) training: bool,
    /// Whether there is a last run folder (Resume, Export).
    pub(super) has_run: bool,
    /// Whether there is a model to export (a run folder or a model trained in memory).
    pub(super) has_model: bool,
}

/// The device picker's facts.
pub(super) struct DeviceView<'a> {
    /// GPU adapters found at start.
    pub(super) adapters: &'a [AdapterInfo],
    /// The selected device in words.
    pub(super) label: String,
    /// Whether the selection is a GPU adapter.
    pub(super) gpu: bool,
    /// Whether the selected device computes in f16.
    pub(super) f16: bool,
    /// The tier preset matching the selected adapter's memory, where it is known.
    pub(super) card_tier: Option<&'static str>,
}

/// The dataset section's facts.
pub(super) struct DatasetView<'a> {
    /// The dataset folder of the settings; `None`: the bundled subset (or the files below).
    pub(super) data_dir: Option<&'a Path>,
    /// The folder whose files, handed over in memory, are the dataset.
    pub(super) files_dataset: Option<&'a str>,
    /// The dataset's splits, or why it cannot be used.
    pub(super) data: Result<&'a Splits, &'a str>,
    /// The decoded-image cache's folder and size, for a folder dataset.
    pub(super) cache_summary: Option<&'a str>,
    /// Training samples the current run left out, with the reason.
    pub(super) skipped_files: &'a [(String, String)],
}

/// Draws the setup panel of `view`: the run buttons, device, dataset, preset, knobs, budget and
/// the memory estimate; what the user changes or presses goes to `commands`.
pub(super) fn setup_ui(ui: &mut egui::Ui, view: &SetupView<'_>, commands: &mut Vec<Command>) {
    let settings = view.settings;
    ui.heading("Setup");
    // First, so Train is on screen however long the panel grows (notices, a tall dataset).
    run_buttons_ui(ui, view.training, view.has_run, view.has_model, commands);
    ui.separator();
    if !view.notices.is_empty() {
        for notice in view.notices {
            ui.colored_label(egui::Color32::from_rgb(200, 140, 0), notice);
        }
        if ui.small_button("dismiss").clicked() {
            commands.push(Command::DismissNotices);
        }
        ui.separator();
    }
    ui.add_enabled_ui(!view.training, |ui| {
        device_ui(ui, settings, &view.device, commands);
        ui.separator();
        dataset_ui(ui, &view.dataset, commands);
        ui.separator();
        preset_ui(ui, &settings.preset, view.device.card_tier, commands);
        if let Some(reason) = view.tier_reason {
            ui.small(format!("This tier trains with {reason}."));
        }
        let mut config = settings.config.clone();
        knobs_ui(ui, &mut config, view.device.f16, view.device.gpu);
        if config != settings.config {
            commands.push(Command::SetConfig(Box::new(config)));
        }
    });
    budget_ui(ui, &settings.config, view.training, commands);
    ui.separator();
    estimate_ui(ui, view.plan, view.training);
}

/// The budget slider (live while training: the engine halves its micro-batch when the
/// measured peak is over it) and the cap toggle (not while `training`).
fn budget_ui(ui: &mut egui::Ui, config: &Config, training: bool, commands: &mut Vec<Command>) {
    let mut gib = config.memory.memory_budget_bytes as f64 / (1u64 << 30) as f64;
    if ui.add(egui::Slider::new(&mut gib, 0.25..=24.0).step_by(0.25).text("budget (GiB)")).changed() {
        commands.push(Command::SetBudget((gib * (1u64 << 30) as f64) as u64));
    }
    ui.add_enabled_ui(!training, |ui| {
        let mut edited = config.clone();
        ui.checkbox(&mut edited.memory.cap_to_budget, "cap device memory at the budget").on_hover_text(
            "Emulate a card of the budget's size: a step whose reserved bytes cross the budget fails \
             as out of memory and is retried at half the micro-batch (one extra sync per step).",
        );
        if edited != *config {
            commands.push(Command::SetConfig(Box::new(edited)));
        }
    });
}

/// The adapter picker (with each card's memory) and, for the CPU, the backend.
fn device_ui(ui: &mut egui::Ui, settings: &Settings, device: &DeviceView<'_>, commands: &mut Vec<Command>) {
    let label = |a: &AdapterInfo| {
        let memory = a.device_local_bytes.map(|b| format!(", {}", human_bytes(b))).unwrap_or_default();
        // A software adapter trains about 16x slower than the CPU backend on the same cores.
        let software = if a.is_software() { "; software, slower than the CPU" } else { "" };
        format!("{} ({} {}{memory}{software})", a.name, a.backend, a.device_type)
    };
    let device_label = ui.label("Device");
    let mut adapter = settings.adapter;
    egui::ComboBox::from_id_salt("device")
        .selected_text(device.label.as_str())
        .width(ui.available_width() - 8.0)
        .truncate()
        .show_ui(ui, |ui| {
            for a in device.adapters {
                ui.selectable_value(&mut adapter, Some(a.index), label(a));
            }
            ui.selectable_value(&mut adapter, None, "CPU (burn flex or ndarray)");
        })
        .response
        .labelled_by(device_label.id);
    if adapter != settings.adapter {
        commands.push(Command::SelectAdapter(adapter));
    }
    if settings.adapter.is_none() {
        let mut backend = settings.cpu_backend;
        ui.horizontal(|ui| {
            ui.radio_value(&mut backend, CpuBackend::Flex, "flex");
            #[cfg(not(target_arch = "wasm32"))]
            ui.radio_value(&mut backend, CpuBackend::Ndarray, "ndarray");
        });
        if backend != settings.cpu_backend {
            commands.push(Command::SelectCpuBackend(backend));
        }
    }
}

/// The dataset folder, its classes and what its scan and training left out.
fn dataset_ui(ui: &mut egui::Ui, dataset: &DatasetView<'_>, commands: &mut Vec<Command>) {
    ui.label("Dataset");
    let shown = match (dataset.files_dataset, dataset.data_dir) {
        (Some(root), _) => format!("{root} (its files, in memory)"),
        (None, Some(dir)) => dir.display().to_string(),
        (None, None) => "bundled Fashion-MNIST subset".into(),
    };
    ui.label(shown);
    ui.horizontal(|ui| {
        let choose = ui.button("Choose folder…").clicked();
        // A page reads the picked folder's files; the desktop scans the folder.
        #[cfg(target_arch = "wasm32")]
        if choose {
            commands.push(Command::ChooseFolderInPage);
        }
        if choose
            && !cfg!(target_arch = "wasm32")
            && let Some(dir) = dialogs::pick_folder()
        {
            commands.push(Command::SetDataDir(Some(dir)));
        }
        #[cfg(not(target_arch = "wasm32"))]
        if ui
            .button("Labels CSV…")
            .on_hover_text("a CSV file of path,label[,split] rows, paths relative to it")
            .clicked()
            && let Some(file) = dialogs::pick_file("labels CSV", &["csv"])
        {
            commands.push(Command::SetDataDir(Some(file)));
        }
        if ui.button("Bundled").clicked() {
            commands.push(Command::SetDataDir(None));
        }
    });
    match dataset.data {
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
            if let Some(cache) = dataset.cache_summary {
                ui.label(cache);
            }
            dataset_report_ui(ui, &d.report, dataset.skipped_files);
        }
        Err(e) => {
            ui.colored_label(egui::Color32::RED, e);
        }
    }
}

/// The preset picker (`card_tier`, the tier of this card, marked) and preset files.
fn preset_ui(ui: &mut egui::Ui, preset: &str, card_tier: Option<&str>, commands: &mut Vec<Command>) {
    ui.horizontal(|ui| {
        let label = ui.label("Preset");
        egui::ComboBox::from_id_salt("preset")
            .selected_text(preset)
            .show_ui(ui, |ui| {
                for (name, _) in crate::config::presets::PRESETS {
                    let text = if card_tier == Some(name) { format!("{name} (this card)") } else { name.to_string() };
                    if ui.selectable_label(preset == name, text).clicked() {
                        commands.push(Command::SelectPreset(name.to_string()));
                    }
                }
            })
            .response
            .labelled_by(label.id);
    });
    ui.horizontal(|ui| {
        if ui.button("Load preset…").clicked()
            && let Some(path) = dialogs::pick_file("config", &["toml"])
        {
            commands.push(Command::LoadPresetFile(path));
        }
        if ui.button("Save preset…").clicked()
            && let Some(path) = dialogs::save_file("custom.toml")
        {
            commands.push(Command::SavePresetFile(path));
        }
    });
}

/// Train, Stop, Resume and Export: enabled by whether a run is `training`, there `has_run`
/// (a run folder) and there `has_model` (one to export).
fn run_buttons_ui(ui: &mut egui::Ui, training: bool, has_run: bool, has_model: bool, commands: &mut Vec<Command>) {
    ui.horizontal(|ui| {
        if ui.add_enabled(!training, egui::Button::new("Train")).clicked() {
            commands.push(Command::Train);
        }
        if ui.add_enabled(training, egui::Button::new("Stop")).clicked() {
            commands.push(Command::Stop);
        }
        if ui.add_enabled(!training && has_run, egui::Button::new("Resume")).clicked() {
            commands.push(Command::Resume);
        }
        // A page exports as downloads; the desktop into a folder it asks for.
        let export_clicked = ui.add_enabled(!training && has_model, egui::Button::new("Export…")).clicked();
        if export_clicked && cfg!(target_arch = "wasm32") {
            commands.push(Command::Download);
        } else if export_clicked && let Some(dir) = dialogs::pick_folder() {
            commands.push(Command::Export(dir));
        }
    });
    // The recipe's first sanity test and run folders on disk; a page runs only in-memory
    // training jobs and has no folders.
    if !cfg!(target_arch = "wasm32") {
        ui.horizontal(|ui| {
            let check = ui.add_enabled(!training, egui::Button::new("Overfit check")).on_hover_text(
                "Train on 64 images of this dataset, without augmentation, for up to 200 steps: a \
                 network, data and optimizer that work memorize them (98% or more). Writes no run folder.",
            );
            if check.clicked() {
                commands.push(Command::OverfitCheck);
            }
            let open = ui.add_enabled(!training, egui::Button::new("Open run…")).on_hover_text(
                "Show a run folder's plots and make it the run Resume, Evaluate and Export act on \
                 (dropping a run folder on the window does the same).",
            );
            if open.clicked()
                && let Some(dir) = dialogs::pick_folder()
            {
                commands.push(Command::OpenRun(dir));
            }
        });
    }
}

/// What the scan left out and what training skipped, one line per file with the reason.
fn dataset_report_ui(ui: &mut egui::Ui, report: &ScanReport, skipped: &[(String, String)]) {
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
fn knobs_ui(ui: &mut egui::Ui, c: &mut Config, f16_ok: bool, gpu: bool) {
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
    ui.add_enabled_ui(gpu, |ui| {
        ui.checkbox(&mut c.augment.on_device, "augment on the device")
            .on_hover_text(
                "Crop, flip, jitter, erasing and normalization in vramfit's shader \
                 (shaders/augment_rgb8.wgsl) from 8-bit uploads, instead of the loader's CPU workers. \
                 The same seed gives the same augmentation on either.",
            )
            .on_disabled_hover_text("only a GPU adapter runs the augmentation shader");
    });
    ui.small(if gpu && c.augment.on_device {
        "augmentation runs on the GPU (the loader cuts the crops)"
    } else {
        "augmentation runs on the CPU workers"
    });
    if c.data.preprocess.crop_size > c.data.preprocess.load_size {
        c.data.preprocess.load_size = c.data.preprocess.crop_size;
    }
}
