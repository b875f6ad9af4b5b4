//! The desktop app: setup with a live memory estimate, Train / Stop / Resume, live plots,
//! evaluation, drag-and-drop prediction and export. A thin client of the engine: it edits a
//! [`Config`], starts [`worker::TrainingJob`]s and draws the [`crate::events::Event`]s they send.

mod evaluation;
mod frame_time;
mod history;
mod plots;
mod predict;
mod setup;
mod ui_bench;
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
use ui_bench::UiBench;
pub use ui_bench::{UiBenchResult, bench_ui};
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

    /// The tier preset matching the selected adapter's memory, where the platform reports it
    /// (marked "this card" in the preset picker).
    pub fn card_tier(&self) -> Option<&'static str> {
        let bytes = self.settings.adapter.and_then(|i| self.adapters.get(i))?.device_local_bytes?;
        crate::presets::tier_for_memory(bytes)
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
