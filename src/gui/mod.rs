//! The desktop app: setup with a live memory estimate, Train / Stop / Resume, live plots,
//! evaluation, drag-and-drop prediction and export. A thin client of the engine: it edits a
//! [`Config`], starts [`worker::TrainingJob`]s and draws the [`crate::events::Event`]s they send.

mod frame_time;
mod history;
mod predict;
mod worker;

use std::path::PathBuf;

use eframe::egui;
use egui_plot::{HLine, Legend, Line, Plot, PlotPoints};
use serde::{Deserialize, Serialize};

use crate::config::{Config, Precision};
use crate::dataset::{self, ScanOptions, Splits};
use crate::device::{self, AdapterInfo, CpuBackend, DeviceChoice};
use crate::memory::{self, Plan, human_bytes};
use crate::preprocess::PreprocessMode;
pub use frame_time::{FRAME_BUDGET_MS, FrameSummary, FrameTimes};
pub use history::RunHistory;
pub use predict::PredictView;
pub use worker::WorkerLaunch;
use worker::{EvalJob, JobEnd, TrainingJob, TrainingSpec};

/// Settings kept between launches (eframe persistence).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// Preset the sliders started from, or "custom" once edited.
    pub preset: String,
    /// The configuration the sliders edit.
    pub config: Config,
    /// Dataset folder; `None` = the bundled subset.
    pub data_dir: Option<PathBuf>,
    /// Adapter index, or `None` for CPU.
    pub adapter: Option<usize>,
    /// CPU backend when `adapter` is `None`.
    pub cpu_backend: CpuBackend,
}

impl Default for Settings {
    fn default() -> Self {
        let config = crate::presets::load_config("quickstart").unwrap_or_default();
        Self { preset: "quickstart".into(), config, data_dir: None, adapter: Some(0), cpu_backend: CpuBackend::DEFAULT }
    }
}

/// Which view the central panel shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// Live plots.
    Training,
    /// Per-class accuracy and confusion matrix.
    Evaluation,
    /// Drag-and-drop prediction.
    Predict,
}

/// The application state (built by tests too).
pub struct VramfitApp {
    /// Persisted settings.
    pub settings: Settings,
    /// GPU adapters found at start.
    pub adapters: Vec<AdapterInfo>,
    /// The data of `settings.data_dir`, or why it cannot be used.
    pub data: Result<Splits, String>,
    data_for: Option<Option<PathBuf>>,
    /// Memory plan of the current settings.
    pub plan: Plan,
    plan_for: Option<Config>,
    job: Option<TrainingJob>,
    /// Plots of the current run.
    pub history: RunHistory,
    /// The last run folder (for Resume, evaluation, prediction and export).
    pub last_run: Option<PathBuf>,
    /// Last error, shown in red with its fix.
    pub error: Option<String>,
    /// Status line.
    pub status: String,
    /// The central view.
    pub view: View,
    /// Prediction state.
    pub predict: PredictView,
    /// Last evaluation (after each epoch, or on demand).
    pub evaluation: Option<crate::eval::EvalResult>,
    eval_job: Option<EvalJob>,
    /// Frame times (status bar; `vramfit bench ui`).
    pub frame_times: FrameTimes,
    title_sent: String,
    bench: Option<UiBench>,
    /// Stop each run after this many steps (tests).
    pub max_steps: Option<usize>,
    /// Where runs are written.
    pub runs_dir: PathBuf,
    /// How training worker processes are started.
    pub worker: WorkerLaunch,
}

impl VramfitApp {
    /// A new app with `settings`; lists adapters and opens the dataset.
    pub fn new(settings: Settings) -> Self {
        let adapters = device::list_adapters();
        let plan = memory::plan(&settings.config, 10);
        let mut app = Self {
            settings,
            adapters,
            data: Err("not loaded".into()),
            data_for: None,
            plan,
            plan_for: None,
            job: None,
            history: RunHistory::default(),
            last_run: None,
            error: None,
            status: "ready".into(),
            view: View::Training,
            predict: PredictView::default(),
            evaluation: None,
            eval_job: None,
            frame_times: FrameTimes::default(),
            title_sent: String::new(),
            bench: None,
            max_steps: None,
            runs_dir: PathBuf::from("runs"),
            worker: WorkerLaunch::default(),
        };
        app.refresh();
        app
    }

    /// The device the settings select (CPU when the adapter is gone).
    pub fn device_choice(&self) -> DeviceChoice {
        match self.settings.adapter {
            Some(i) if i < self.adapters.len() => DeviceChoice::Gpu(Some(i)),
            _ => DeviceChoice::Cpu(self.settings.cpu_backend),
        }
    }

    /// The selected device in words, e.g. `llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan Cpu)` or `CPU (flex)`.
    pub fn device_label(&self) -> String {
        match self.device_choice() {
            DeviceChoice::Gpu(Some(i)) => {
                let a = &self.adapters[i];
                format!("{} ({} {})", a.name, a.backend, a.device_type)
            }
            _ => format!("CPU ({})", self.settings.cpu_backend.name()),
        }
    }

    /// The window title: the app and the device in use.
    pub fn window_title(&self) -> String {
        format!("vramfit — {}", self.device_label())
    }

    /// Whether the selected device computes in f16.
    pub fn f16_available(&self) -> bool {
        match self.device_choice() {
            DeviceChoice::Gpu(Some(i)) => self.adapters[i].shader_f16,
            _ => false,
        }
    }

    /// Applies a preset to the sliders.
    pub fn select_preset(&mut self, name: &str) {
        match crate::presets::load_config(name) {
            Ok(c) => {
                self.settings.config = c;
                self.settings.preset = name.into();
                self.refresh();
            }
            Err(e) => self.error = Some(e.to_string()),
        }
    }

    /// Loads a `configs/`-style TOML file into the sliders.
    pub fn load_preset_file(&mut self, path: &std::path::Path) {
        match Config::load(path) {
            Ok(c) => {
                self.settings.preset = c.name.clone();
                self.settings.config = c;
                self.refresh();
            }
            Err(e) => self.error = Some(e.to_string()),
        }
    }

    /// Saves the sliders as a `configs/`-style TOML file (atomically).
    pub fn save_preset_file(&mut self, path: &std::path::Path) {
        let mut c = self.settings.config.clone();
        c.name = path.file_stem().map_or("custom".into(), |s| s.to_string_lossy().to_string());
        match crate::checkpoint::write_atomic(path, c.to_toml().as_bytes()) {
            Ok(()) => self.status = format!("preset saved to {}", path.display()),
            Err(e) => self.error = Some(e.to_string()),
        }
    }

    /// Recomputes what depends on the settings (dataset scan, memory plan) when they changed.
    pub fn refresh(&mut self) {
        if self.data_for.as_ref() != Some(&self.settings.data_dir) {
            let path = self.settings.data_dir.clone().unwrap_or_else(dataset::bundled_dataset_dir);
            let c = &self.settings.config;
            let opts = ScanOptions {
                val_fraction: c.data.val_fraction,
                seed: c.seed,
                allow_empty_classes: c.data.allow_empty_classes,
            };
            self.data = dataset::open(&path, &opts).map_err(|e| e.to_string());
            self.data_for = Some(self.settings.data_dir.clone());
        }
        if self.plan_for.as_ref() != Some(&self.settings.config) {
            let classes = self.data.as_ref().map_or(10, |d| d.train.class_names.len());
            self.plan = memory::plan(&self.settings.config, classes);
            self.plan_for = Some(self.settings.config.clone());
        }
    }

    /// The estimate line shown beside the sliders.
    pub fn estimate_text(&self) -> String {
        format!(
            "predicted peak {} of {}: {}",
            human_bytes(self.plan.estimate.total),
            human_bytes(self.plan.budget_bytes),
            self.plan.verdict()
        )
    }

    /// Whether a run is in progress.
    pub fn training(&self) -> bool {
        self.job.is_some()
    }

    /// The data and the opened device a job needs; `None` after showing why not (`fix` says what
    /// to do about unusable data).
    fn job_inputs(&mut self, fix: &str) -> Option<(Splits, device::SelectedDevice)> {
        let inputs = self.data.clone().map_err(|e| format!("{e} ({fix})")).and_then(|splits| {
            device::select(self.device_choice()).map(|device| (splits, device)).map_err(|e| e.to_string())
        });
        inputs.map_err(|e| self.error = Some(e)).ok()
    }

    /// Starts training (or resumes the last run) in a worker process.
    pub fn start_training(&mut self, ctx: &egui::Context, resume: bool) {
        if self.job.is_some() {
            return;
        }
        // The data is checked here so a bad folder is named at once; the worker opens it again.
        if let Err(e) = &self.data {
            self.error = Some(format!("{e} (pick another dataset folder)"));
            return;
        }
        let (out, config) = if resume {
            let Some(run) = self.last_run.clone() else {
                self.error = Some("nothing to resume: train first".into());
                return;
            };
            match crate::run_dir::load_config(&run) {
                Ok((c, notes)) => {
                    self.history.log.extend(notes.into_iter().map(|n| format!("note: {n}")));
                    (run, c)
                }
                Err(e) => {
                    self.error = Some(e.to_string());
                    return;
                }
            }
        } else {
            self.history = RunHistory::default();
            (crate::run_dir::new_run_dir(&self.runs_dir), self.settings.config.clone())
        };
        let spec = TrainingSpec {
            config,
            data_dir: self.settings.data_dir.clone(),
            device: self.device_choice(),
            out_dir: out.clone(),
            resume,
            max_steps: self.max_steps.map(|m| m + self.history.last_step * usize::from(resume)),
        };
        let ctx = ctx.clone();
        match TrainingJob::start(&spec, &self.worker, move || ctx.request_repaint()) {
            Ok(job) => {
                self.job = Some(job);
                self.last_run = Some(out);
                self.error = None;
                self.status = if resume { "resuming".into() } else { "training".into() };
            }
            Err(e) => self.error = Some(format!("cannot start the training process: {e}")),
        }
    }

    /// Evaluates the last run's newest checkpoint on the validation data, on its own thread;
    /// the Evaluation view shows the result when it ends.
    pub fn evaluate_now(&mut self, ctx: &egui::Context) {
        if self.eval_job.is_some() || self.job.is_some() {
            return;
        }
        let Some(run) = self.last_run.clone() else {
            self.error = Some("nothing to evaluate: train first".into());
            return;
        };
        let Some((splits, device)) = self.job_inputs("pick the dataset the run was trained on") else { return };
        let ctx = ctx.clone();
        match EvalJob::start(run, splits.val, device, move || ctx.request_repaint()) {
            Ok(job) => {
                self.eval_job = Some(job);
                self.status = "evaluating the latest checkpoint".into();
            }
            Err(e) => self.error = Some(format!("cannot start the evaluation thread: {e}")),
        }
    }

    /// Whether an on-demand evaluation is running.
    pub fn evaluating(&self) -> bool {
        self.eval_job.is_some()
    }

    /// Asks the running job to stop (it saves a checkpoint).
    pub fn stop_training(&mut self) {
        if let Some(job) = &mut self.job {
            job.stop();
            self.status = "stopping after this step".into();
        }
    }

    /// Moves engine events into the history; finishes jobs whose thread ended.
    pub fn poll(&mut self) {
        if let Some(result) = self.eval_job.as_mut().and_then(EvalJob::try_finish) {
            self.eval_job = None;
            match result {
                Ok(r) => {
                    self.status = format!("evaluated: top-1 {:.2}% on {} images", r.top1 * 100.0, r.samples);
                    self.evaluation = Some(r);
                }
                Err(e) => {
                    self.status = "evaluation failed".into();
                    self.error = Some(e);
                }
            }
        }
        let Some(job) = &mut self.job else { return };
        for e in job.drain() {
            self.history.push(&e);
        }
        if let Some(end) = job.try_finish() {
            for e in job.drain() {
                self.history.push(&e);
            }
            match end {
                JobEnd::Done(summary) => {
                    self.status = match (&summary.val, summary.stopped) {
                        (_, true) => format!("stopped at step {}; press Resume to continue", summary.global_step),
                        (Some(v), false) => format!(
                            "done: validation accuracy {:.1}% after {} epochs",
                            v.top1 * 100.0,
                            summary.epochs_completed
                        ),
                        (None, false) => "done".into(),
                    };
                    if summary.val.is_some() {
                        self.evaluation = summary.val.clone();
                    }
                    if let Some(dir) = &summary.export_dir {
                        self.predict.model_path = Some(dir.clone());
                    }
                }
                JobEnd::Failed(msg) => {
                    self.status = "failed".into();
                    self.error = Some(msg);
                }
            }
            let t = self.frame_times.while_training();
            tracing::info!(
                "frames while training: {}, p50 {:.1} ms, p95 {:.1} ms, longest {:.1} ms, {} over {FRAME_BUDGET_MS} ms",
                t.frames,
                t.p50_ms,
                t.p95_ms,
                t.max_ms,
                t.over_budget
            );
            self.job = None;
        }
    }

    /// Writes the last run's latest checkpoint as .bpk + .safetensors + model.json into `dir`.
    ///
    /// # Errors
    /// A message when there is no run or the files cannot be written.
    pub fn export_to(&self, dir: &std::path::Path) -> Result<Vec<PathBuf>, String> {
        let run = self.last_run.as_ref().ok_or("train a model first")?;
        crate::export::export_run(run, dir).map_err(|e| e.to_string())
    }

    /// Draws one frame (the whole window).
    pub fn ui(&mut self, ui: &mut egui::Ui) {
        self.poll();
        self.refresh();
        let title = self.window_title();
        if title != self.title_sent {
            ui.ctx().send_viewport_cmd(egui::ViewportCommand::Title(title.clone()));
            self.title_sent = title;
        }
        let dropped: Vec<egui::DroppedFileHandle> = ui.ctx().input(|i| i.raw.dropped_files.clone());
        if !dropped.is_empty() {
            self.handle_drop(dropped);
        }
        egui::Panel::left("setup").resizable(true).default_size(330.0).show(ui, |ui| {
            egui::ScrollArea::vertical().show(ui, |ui| self.setup_ui(ui));
        });
        egui::Panel::bottom("status").show(ui, |ui| self.status_ui(ui));
        egui::CentralPanel::default_margins().show(ui, |ui| {
            ui.horizontal(|ui| {
                ui.selectable_value(&mut self.view, View::Training, "Training");
                ui.selectable_value(&mut self.view, View::Evaluation, "Evaluation");
                ui.selectable_value(&mut self.view, View::Predict, "Predict");
            });
            ui.separator();
            match self.view {
                View::Training => self.plots_ui(ui),
                View::Evaluation => self.evaluation_ui(ui),
                View::Predict => {
                    let device = self.device_choice();
                    self.predict.ui(ui, device, self.last_run.as_deref());
                }
            }
        });
        if self.training() || self.evaluating() {
            ui.ctx().request_repaint_after(std::time::Duration::from_millis(250));
        }
    }

    fn handle_drop(&mut self, files: Vec<egui::DroppedFileHandle>) {
        let paths: Vec<PathBuf> = files.iter().map(|f| crate::user_path::normalize(f.path())).collect();
        let Some(first) = paths.first() else { return };
        let is_dataset = first.is_dir()
            || crate::idx::find_split(first.parent().unwrap_or(first), "train").is_some()
                && !dataset::has_image_extension(first);
        if is_dataset && paths.len() == 1 {
            self.settings.data_dir =
                Some(if first.is_dir() { first.clone() } else { first.parent().unwrap_or(first).to_path_buf() });
            self.refresh();
        } else {
            self.view = View::Predict;
            self.predict.add_files(paths, self.device_choice(), self.last_run.as_deref());
        }
    }

    fn setup_ui(&mut self, ui: &mut egui::Ui) {
        let busy = self.training();
        ui.heading("Setup");
        ui.add_enabled_ui(!busy, |ui| {
            let label = |a: &AdapterInfo| format!("{} ({} {})", a.name, a.backend, a.device_type);
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
                if ui.button("Choose folder…").clicked() {
                    if let Some(dir) = rfd::FileDialog::new().pick_folder() {
                        self.settings.data_dir = Some(dir);
                    }
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
                        for (name, _) in crate::presets::PRESETS {
                            if ui.selectable_label(self.settings.preset == name, name).clicked() {
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
                if ui.button("Load preset…").clicked() {
                    if let Some(path) = rfd::FileDialog::new().add_filter("config", &["toml"]).pick_file() {
                        self.load_preset_file(&path);
                    }
                }
                if ui.button("Save preset…").clicked() {
                    if let Some(path) = rfd::FileDialog::new().set_file_name("custom.toml").save_file() {
                        self.save_preset_file(&path);
                    }
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
            if ui.add_enabled(!busy && self.last_run.is_some(), egui::Button::new("Export…")).clicked() {
                if let Some(dir) = rfd::FileDialog::new().pick_folder() {
                    match self.export_to(&dir) {
                        Ok(files) => self.status = format!("exported {} files to {}", files.len(), dir.display()),
                        Err(e) => self.error = Some(e),
                    }
                }
            }
        });
    }

    fn estimate_ui(&self, ui: &mut egui::Ui) {
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
            "weights+grads+AdamW {} · activations {} · input {} · workspace {} · allocator {}",
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

    fn status_ui(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            ui.label(format!("{} · step {} · epoch {}", self.status, self.history.last_step, self.history.epoch + 1));
            if let Some(run) = &self.last_run {
                ui.label(format!("run {}", run.display()));
            }
            let (last, t) = (self.frame_times.last_ms(), self.frame_times.while_training());
            if t.frames > 0 {
                ui.small(format!(
                    "frame {last:.0} ms (longest while training {:.0} ms, {} over {FRAME_BUDGET_MS:.0} ms)",
                    t.max_ms, t.over_budget
                ));
            } else if last > 0.0 {
                ui.small(format!("frame {last:.0} ms"));
            }
        });
        if let Some(e) = &self.error {
            ui.colored_label(egui::Color32::RED, e);
        }
        if let Some(last) = self.history.log.last() {
            ui.small(last);
        }
    }

    fn plots_ui(&mut self, ui: &mut egui::Ui) {
        let h = &self.history;
        ui.horizontal(|ui| {
            if ui.button("Save metrics CSV…").clicked() {
                if let Some(path) = rfd::FileDialog::new().set_file_name("metrics.csv").save_file() {
                    if let Err(e) = crate::checkpoint::write_atomic(&path, h.to_csv().as_bytes()) {
                        self.error = Some(e.to_string());
                    }
                }
            }
            if ui.button("Save plots PNG…").clicked() {
                if let Some(path) = rfd::FileDialog::new().set_file_name("vramfit-plots.png").save_file() {
                    let callback = egui::ScreenshotCallback::new(move |image| save_png(&image, &path));
                    ui.ctx().send_viewport_cmd(egui::ViewportCommand::Screenshot(callback));
                }
            }
        });
        let height = (ui.available_height() / 2.0 - 24.0).max(120.0);
        let width = (ui.available_width() / 2.0 - 8.0).max(160.0);
        let plot = |id: &str| {
            Plot::new(id.to_owned()).legend(Legend::default()).height(height).width(width).x_axis_label("step")
        };
        let line = |name: &str, pts: &Vec<[f64; 2]>| Line::new(name.to_owned(), PlotPoints::from(pts.clone()));
        ui.horizontal(|ui| {
            plot("loss").show(ui, |p| {
                p.line(line("train loss", &h.loss));
                p.line(line("smoothed", &h.smoothed_loss()));
                p.line(line("validation loss", &h.val_loss));
            });
            plot("accuracy").show(ui, |p| {
                p.line(line("train accuracy", &h.train_accuracy));
                p.line(line("validation accuracy", &h.val_accuracy));
            });
        });
        ui.horizontal(|ui| {
            // A budget far above the curves would flatten them to the axis: once the run's
            // memory is known, it is named in the axis label instead of drawn.
            let budget = self.plan.budget_bytes as f64 / 1024.0 / 1024.0;
            let top = h.reserved_mib.iter().map(|p| p[1]).fold(h.predicted_mib.unwrap_or(0.0), f64::max);
            let draw_budget = top == 0.0 || budget <= 4.0 * top;
            let label = if draw_budget {
                "MiB".to_string()
            } else {
                format!("MiB (budget {}, above)", human_bytes(self.plan.budget_bytes))
            };
            plot("memory").y_axis_label(label).show(ui, |p| {
                p.line(line("bytes_in_use", &h.in_use_mib));
                p.line(line("bytes_reserved", &h.reserved_mib));
                p.line(line("peak in use", &h.peak_mib));
                if let Some(pred) = h.predicted_mib {
                    p.hline(HLine::new("predicted peak", pred));
                }
                if draw_budget {
                    p.hline(HLine::new("budget", budget));
                }
            });
            plot("rate").show(ui, |p| {
                p.line(line("learning rate x1000", &h.lr.iter().map(|[x, y]| [*x, y * 1000.0]).collect()));
                p.line(line("images/s ÷100", &h.images_per_sec.iter().map(|[x, y]| [*x, y / 100.0]).collect()));
            });
        });
    }

    fn evaluation_ui(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            let can = !self.training() && !self.evaluating() && self.last_run.is_some();
            let button = ui
                .add_enabled(can, egui::Button::new("Evaluate latest checkpoint"))
                .on_disabled_hover_text("needs a run that is not training");
            if button.clicked() {
                let ctx = ui.ctx().clone();
                self.evaluate_now(&ctx);
            }
            if self.evaluating() {
                ui.spinner();
            }
            ui.small("validation data; also runs after each epoch");
        });
        let Some(eval) = &self.evaluation else {
            ui.label("No evaluation yet: it runs after each epoch, or press the button after training or Stop.");
            return;
        };
        ui.label(format!(
            "top-1 {:.2}%  top-5 {:.2}%  on {} images",
            eval.top1 * 100.0,
            eval.top5 * 100.0,
            eval.samples
        ));
        egui::Grid::new("per_class").striped(true).show(ui, |ui| {
            for (name, acc) in eval.class_names.iter().zip(eval.per_class_accuracy()) {
                ui.label(name);
                ui.add(egui::ProgressBar::new(acc).text(format!("{:.1}%", acc * 100.0)).desired_width(160.0));
                ui.end_row();
            }
        });
        ui.label("Confusion matrix (rows: true class, columns: predicted)");
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

impl eframe::App for VramfitApp {
    fn ui(&mut self, ui: &mut egui::Ui, frame: &mut eframe::Frame) {
        // The previous frame's CPU time, UI code and rendering (eframe measures it).
        if let Some(secs) = frame.info().cpu_usage {
            self.frame_times.record(secs * 1000.0, self.training());
        }
        VramfitApp::ui(self, ui);
        self.bench_tick(ui.ctx());
    }

    fn save(&mut self, storage: &mut dyn eframe::Storage) {
        eframe::set_value(storage, eframe::APP_KEY, &self.settings);
    }
}

/// What `vramfit bench ui` measured.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct UiBenchResult {
    /// The device the app trained on.
    pub device: String,
    /// Frames drawn while training (eframe's CPU time per frame: UI code and rendering).
    pub training: FrameSummary,
    /// Optimizer steps taken meanwhile.
    pub steps: usize,
    /// Why training did not start or failed, if it did.
    pub error: Option<String>,
}

/// Bench mode of the app: train for `seconds`, stop, then close the window.
struct UiBench {
    seconds: f64,
    /// When training is stopped; set on the first frame, which starts it.
    deadline: Option<std::time::Instant>,
    result: std::sync::Arc<std::sync::Mutex<Option<UiBenchResult>>>,
}

impl VramfitApp {
    fn bench_tick(&mut self, ctx: &egui::Context) {
        let Some(b) = &mut self.bench else { return };
        let Some(deadline) = b.deadline else {
            b.deadline = Some(std::time::Instant::now() + std::time::Duration::from_secs_f64(b.seconds));
            self.start_training(ctx, false);
            return;
        };
        if self.training() {
            if std::time::Instant::now() >= deadline {
                self.stop_training();
            }
            return;
        }
        if let Some(b) = self.bench.take() {
            let result = UiBenchResult {
                device: self.device_label(),
                training: self.frame_times.while_training(),
                steps: self.history.last_step,
                error: self.error.clone(),
            };
            if let Ok(mut slot) = b.result.lock() {
                *slot = Some(result);
            }
            ctx.send_viewport_cmd(egui::ViewportCommand::Close);
        }
    }
}

/// `vramfit bench ui`: opens the window with the default settings (quickstart on the first
/// adapter), trains for `seconds`, stops, closes, and returns the frame times it drew meanwhile.
///
/// # Errors
/// When no window can be created (no display: run it under `xvfb-run`).
pub fn bench_ui(seconds: f64) -> anyhow::Result<UiBenchResult> {
    let result = std::sync::Arc::new(std::sync::Mutex::new(None));
    let slot = result.clone();
    let runs_dir = std::env::temp_dir().join(format!("vramfit-bench-ui-{}", std::process::id()));
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default().with_inner_size([1280.0, 820.0]).with_title("vramfit"),
        persist_window: false,
        ..Default::default()
    };
    let dir = runs_dir.clone();
    eframe::run_native(
        "vramfit-bench-ui",
        options,
        Box::new(move |_cc| {
            let mut app = VramfitApp::new(Settings::default());
            app.runs_dir = dir;
            app.bench = Some(UiBench { seconds, deadline: None, result: slot });
            Ok(Box::new(app))
        }),
    )
    .map_err(|e| anyhow::anyhow!("cannot open the window: {e}; on a machine without a display use xvfb-run"))?;
    let _ = std::fs::remove_dir_all(&runs_dir);
    let r = result.lock().map_err(|_| anyhow::anyhow!("the app thread panicked"))?.take();
    r.ok_or_else(|| anyhow::anyhow!("the window closed before the benchmark ended"))
}

/// Opens the window (`vramfit` with no command).
///
/// # Errors
/// When no window can be created (no display).
pub fn run() -> anyhow::Result<()> {
    let options = eframe::NativeOptions {
        // The first frame sets the title to the selected device (`VramfitApp::window_title`).
        viewport: egui::ViewportBuilder::default().with_inner_size([1280.0, 820.0]).with_title("vramfit"),
        ..Default::default()
    };
    eframe::run_native(
        "vramfit",
        options,
        Box::new(|cc| {
            let settings =
                cc.storage.and_then(|s| eframe::get_value::<Settings>(s, eframe::APP_KEY)).unwrap_or_default();
            Ok(Box::new(VramfitApp::new(settings)))
        }),
    )
    .map_err(|e| {
        anyhow::anyhow!(
            "cannot open the window: {e}; use the command line (vramfit --help) on machines without a display"
        )
    })
}
