//! The desktop app: setup with a live memory estimate, Train / Stop / Resume, live plots,
//! evaluation, drag-and-drop prediction and export. A thin client of one engine
//! [`Session`]: panels record [`Command`]s while they draw, the app applies them after the
//! frame (the `command` module), and every job (training in a worker process, evaluation, export,
//! prediction) runs on the session, never on the UI thread.
//!
//! Files, by what the user sees: this file holds the app state and the frame; `command` what
//! the user can do; `setup` the setup panel; `estimate` the memory estimate; `plots` the live
//! plots; `status` the status bar; `evaluation` and `predict` the two other views; `dialogs`
//! the native file dialogs; `saved_settings` the settings kept between launches and what the
//! app says when they cannot be used; `window` the eframe window; `ui_bench` the frame-time
//! benchmark (outside the app state).
//! Each panel is a function of what it shows (borrowed from the state for the frame) and the
//! `Vec<Command>` it records into; none can change the state, [`VramfitApp::ui`] applies them.
//! The window itself ([`run`]) and the benchmark are native only: a web build gets the app
//! state and panels, not a window.

mod command;
mod data_view;
mod dialogs;
mod estimate;
mod evaluation;
mod frame_time;
mod history;
mod open_run;
mod plots;
mod predict;
pub mod saved_settings;
mod setup;
mod status;
#[cfg(not(target_arch = "wasm32"))]
mod ui_bench;
mod views;
mod window;

use std::path::PathBuf;

use eframe::egui;

use crate::config::Config;
use crate::data::dataset::{self, ScanOptions, Splits};
use crate::device::{self, AdapterInfo, DeviceChoice};
use crate::engine::session::{Report, Session};
pub use crate::engine::worker::WorkerLaunch;
use crate::memory::{self, Plan};
pub use command::Command;
pub use data_view::{DataCommand, ImageKey};
pub use frame_time::{FRAME_BUDGET_MS, FrameSummary, FrameTimes};
pub use history::RunHistory;
pub use predict::{PredictView, Prediction};
pub use saved_settings::Settings;
use setup::{DatasetView, DeviceView, SetupView, setup_ui};
use status::status_ui;
#[cfg(not(target_arch = "wasm32"))]
pub use ui_bench::{UiBenchResult, bench_ui, bench_ui_report};
#[cfg(not(target_arch = "wasm32"))]
pub use window::run;

/// Which view the central panel shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// Live plots.
    Training,
    /// Per-class accuracy and confusion matrix.
    Evaluation,
    /// Drag-and-drop prediction.
    Predict,
    /// The dataset's health: copies, label conflicts, leaked validation images, class sizes.
    Data,
}

/// How the app starts runs: where run folders go, how the training worker is started, and a
/// step cap (tests and the UI bench).
#[derive(Clone, Debug)]
pub struct AppOptions {
    /// Where runs are written (a new folder per run).
    pub runs_dir: PathBuf,
    /// How training worker processes are started.
    pub worker: WorkerLaunch,
    /// Stop each run after this many steps (a resumed run: this many more).
    pub max_steps: Option<usize>,
    /// Train in this process without a run folder (the browser); `None`: in a worker process.
    pub in_memory: Option<InMemoryTraining>,
}

impl Default for AppOptions {
    fn default() -> Self {
        Self { runs_dir: PathBuf::from("runs"), worker: WorkerLaunch::default(), max_steps: None, in_memory: None }
    }
}

/// Training in the app's own process without a run folder ([`crate::train::train_in_memory`]): the
/// browser's way, where there is no disk and no worker process. Resume, evaluation of a
/// checkpoint and export from a run folder are not available then.
#[derive(Clone, Debug, Default)]
pub struct InMemoryTraining {
    /// The device of the selected adapter, already initialized (a page's WebGPU device is made
    /// asynchronously before the app starts; the page has that one adapter); `None`: GPU
    /// training is refused and the CPU backend trains (natively; a page refuses the CPU, whose
    /// kernels never yield to the page).
    pub gpu: Option<burn::tensor::Device>,
}

/// Which jobs of the app's session are in flight (exports and predictions can queue up).
#[derive(Clone, Copy, Debug, Default)]
struct InFlight {
    training: bool,
    evaluating: bool,
    exporting: usize,
    predicting: usize,
}

/// The application state. Fields are private: the panels read them while drawing and record
/// [`Command`]s; [`VramfitApp::apply`] is the one way state changes (tests use it too).
pub struct VramfitApp {
    settings: Settings,
    adapters: Vec<AdapterInfo>,
    /// The data of `settings.data_dir`, or why it cannot be used.
    data: Result<Splits, String>,
    /// The decoded-image cache's folder and size, for a folder dataset.
    cache_summary: Option<String>,
    data_for: Option<Option<PathBuf>>,
    /// The folder whose files were handed over in memory ([`Command::UseFiles`]) when they
    /// are the dataset (`data` then holds them and `settings.data_dir` is `None`).
    files_dataset: Option<String>,
    plan: Plan,
    plan_for: Option<Config>,
    /// Why the settings' tier preset trains as it does (`None` for other settings).
    tier_reason: Option<String>,
    session: Session,
    /// Files dropped on a page, read asynchronously (a browser has no paths).
    #[cfg(target_arch = "wasm32")]
    page_drops: predict::PageDrops,
    /// The folder picked in a page, its files read asynchronously.
    #[cfg(target_arch = "wasm32")]
    page_folder: dialogs::PageFolder,
    /// The model the last in-memory run trained ([`InMemoryTraining`]), for prediction.
    in_memory_model: Option<std::sync::Arc<crate::inference::predict::Predictor>>,
    /// The context the session's repaint requests go to (known from the first frame on).
    repaint: std::sync::Arc<std::sync::OnceLock<egui::Context>>,
    in_flight: InFlight,
    history: RunHistory,
    last_run: Option<PathBuf>,
    error: Option<String>,
    /// What the app did with its saved settings (dropped, reset, missing), shown until dismissed.
    notices: Vec<String>,
    status: String,
    view: View,
    predict: PredictView,
    evaluation: Option<crate::inference::eval::EvalResult>,
    /// The Data view's health report and the galleries' thumbnails.
    data_state: data_view::DataState,
    frame_times: FrameTimes,
    title_sent: String,
    options: AppOptions,
}

impl VramfitApp {
    /// A new app with `settings` and the default [`AppOptions`]; lists adapters, opens the
    /// dataset and starts the engine session.
    ///
    /// # Panics
    /// When the engine thread cannot be spawned (the system is out of threads).
    pub fn new(settings: Settings) -> Self {
        Self::with_options(settings, AppOptions::default())
    }

    /// [`Self::new`] with `options`.
    ///
    /// # Panics
    /// As [`Self::new`].
    pub fn with_options(settings: Settings, options: AppOptions) -> Self {
        #[allow(clippy::expect_used)] // tests and callers that cannot report it; the window uses `try_with_options`
        Self::try_with_options(settings, options).expect("cannot start the engine thread")
    }

    /// [`Self::with_options`], returning the error when the engine thread cannot be spawned
    /// (the system is out of threads), for a window to report instead of crashing.
    ///
    /// # Errors
    /// The spawn's [`std::io::Error`].
    pub fn try_with_options(settings: Settings, options: AppOptions) -> std::io::Result<Self> {
        Self::with_adapters(settings, options, device::list_adapters())
    }

    /// [`Self::try_with_options`] with the adapters already listed (a browser lists its one
    /// adapter asynchronously, [`device::browser_adapter`]).
    ///
    /// # Errors
    /// As [`Self::try_with_options`].
    pub fn with_adapters(settings: Settings, options: AppOptions, adapters: Vec<AdapterInfo>) -> std::io::Result<Self> {
        let plan = memory::plan(&settings.config, 10);
        let repaint = std::sync::Arc::new(std::sync::OnceLock::<egui::Context>::new());
        let ctx = repaint.clone();
        let session = Session::start(move || {
            if let Some(ctx) = ctx.get() {
                ctx.request_repaint();
            }
        })?;
        let mut app = Self {
            settings,
            adapters,
            data: Err("not loaded".into()),
            cache_summary: None,
            data_for: None,
            files_dataset: None,
            plan,
            plan_for: None,
            tier_reason: None,
            session,
            in_memory_model: None,
            #[cfg(target_arch = "wasm32")]
            page_drops: predict::PageDrops::default(),
            #[cfg(target_arch = "wasm32")]
            page_folder: dialogs::PageFolder::default(),
            repaint,
            in_flight: InFlight::default(),
            history: RunHistory::default(),
            last_run: None,
            error: None,
            notices: Vec::new(),
            status: "ready".into(),
            view: View::Training,
            predict: PredictView::default(),
            evaluation: None,
            data_state: data_view::DataState::default(),
            frame_times: FrameTimes::default(),
            title_sent: String::new(),
            options,
        };
        app.notices = saved_settings::target_notices(&app.settings, &app.adapters, &app.device_label());
        app.refresh();
        Ok(app)
    }

    /// Adds notices (e.g. from reading the saved settings, [`saved_settings::restore`]).
    pub fn add_notices(&mut self, notices: impl IntoIterator<Item = String>) {
        let mut notices: Vec<String> = notices.into_iter().collect();
        notices.append(&mut self.notices);
        self.notices = notices;
    }

    /// What the app did with its saved settings and what they point at, until dismissed.
    pub fn notices(&self) -> &[String] {
        &self.notices
    }

    /// The settings (persisted between launches).
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// GPU adapters found at start.
    pub fn adapters(&self) -> &[AdapterInfo] {
        &self.adapters
    }

    /// The memory plan of the current settings.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The plan the setup panel shows: while a run lasts, the run's own (from its
    /// [`Event::Started`]), else the settings'.
    pub fn shown_plan(&self) -> &Plan {
        match &self.history.plan {
            Some(run_plan) if self.training() => run_plan,
            _ => &self.plan,
        }
    }

    /// The plots' data of the current run.
    pub fn history(&self) -> &RunHistory {
        &self.history
    }

    /// The dataset: its splits, or why it cannot be used.
    pub fn data(&self) -> Result<&Splits, &str> {
        self.data.as_ref().map_err(String::as_str)
    }

    /// The folder whose files, handed over in memory, are the dataset ([`Command::UseFiles`]).
    pub fn files_dataset(&self) -> Option<&str> {
        self.files_dataset.as_deref()
    }

    /// Opens the page's folder dialog (what Choose folder does in a browser); the picked
    /// folder's files become the dataset once read ([`Command::UseFiles`]). The browser shows
    /// the dialog only within a user's click (its "user activation").
    #[cfg(target_arch = "wasm32")]
    pub fn choose_folder_in_page(&mut self) {
        let Some(ctx) = self.repaint.get().cloned() else {
            self.error = Some("the app has not drawn its first frame yet: choose the folder again".into());
            return;
        };
        if let Err(e) = self.page_folder.pick(&ctx) {
            self.error = Some(e);
        }
    }

    /// The last run folder (for Resume, evaluation, prediction and export).
    pub fn last_run(&self) -> Option<&std::path::Path> {
        self.last_run.as_deref()
    }

    /// The last error, shown in red with its fix.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// The status line.
    pub fn status(&self) -> &str {
        &self.status
    }

    /// The central view.
    pub fn view(&self) -> View {
        self.view
    }

    /// The last evaluation (after each epoch, or on demand).
    pub fn evaluation(&self) -> Option<&crate::inference::eval::EvalResult> {
        self.evaluation.as_ref()
    }

    /// Predicted images, newest first.
    pub fn predictions(&self) -> &[Prediction] {
        self.predict.predictions()
    }

    /// Frame times (the status bar; `vramfit bench ui`).
    pub fn frame_times(&self) -> &FrameTimes {
        &self.frame_times
    }

    /// How runs are started; tests change the worker and the step cap between runs.
    pub fn options_mut(&mut self) -> &mut AppOptions {
        &mut self.options
    }

    /// Selects the default device ([`device::default_device`]): the first hardware adapter, else
    /// the CPU with a notice saying why (a software adapter is slower than the CPU backend).
    /// For a first start, when no saved settings chose a device.
    pub fn select_default_device(&mut self) {
        let default = device::default_device(&self.adapters);
        self.settings.adapter = match default {
            device::DefaultDevice::Adapter(i) => Some(i),
            _ => None,
        };
        let notice = default.cpu_note(&self.adapters, "choose it under Device to use it anyway");
        self.notices.extend(notice);
        self.refresh();
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
        crate::config::presets::tier_for_memory(self.card_bytes()?)
    }

    /// The selected adapter's device-local memory in bytes, where the platform reports it.
    pub fn card_bytes(&self) -> Option<u64> {
        self.settings.adapter.and_then(|i| self.adapters.get(i))?.device_local_bytes
    }

    /// Recomputes what depends on the settings (dataset scan, memory plan) when they changed.
    fn refresh(&mut self) {
        if self.data_for.as_ref() != Some(&self.settings.data_dir) {
            let opts = self.scan_options();
            self.data = match &self.settings.data_dir {
                Some(path) => dataset::open(path, &opts),
                None => dataset::open_bundled(&opts),
            }
            .map_err(|e| e.to_string());
            self.data_for = Some(self.settings.data_dir.clone());
            self.data_state.reset();
            self.plan_for = None; // the class count may differ
            self.cache_summary =
                self.settings.data_dir.as_ref().map(|_| crate::data::image_cache::summary(&self.settings.config.data));
        }
        if self.plan_for.as_ref() != Some(&self.settings.config) {
            let classes = self.data.as_ref().map_or(10, |d| d.train.class_names.len());
            self.plan = memory::plan(&self.settings.config, classes);
            self.plan_for = Some(self.settings.config.clone());
            self.tier_reason = self.find_tier_reason(classes);
        }
    }

    /// Why a tier preset has its settings ([`crate::config::tiers::tier_reason`]), while the
    /// settings are a tier's (its name starts the preset's) and hold the tier search's choice
    /// for their budget on this device.
    fn find_tier_reason(&self, classes: usize) -> Option<String> {
        use crate::config::tiers::{TIERS, TierSettings, tier_reason, tier_search};
        let preset = self.settings.preset.split(' ').next()?;
        if !TIERS.contains(&preset) {
            return None;
        }
        let config = &self.settings.config;
        let chosen = tier_search(config, classes, self.f16_available()).0?;
        (chosen.settings == TierSettings::of(config)).then(|| tier_reason(&chosen, config.memory.memory_budget_bytes))
    }

    /// The line [`Self::find_tier_reason`] made for the current settings, if any.
    pub fn shown_tier_reason(&self) -> Option<&str> {
        self.tier_reason.as_deref()
    }

    /// How the knobs' config scans a dataset (validation split, its seed, empty classes).
    fn scan_options(&self) -> ScanOptions {
        ScanOptions::of(&self.settings.config, false)
    }

    /// The estimate line shown beside the sliders.
    pub fn estimate_text(&self) -> String {
        estimate::estimate_text(&self.plan)
    }

    /// Whether a run is in progress.
    pub fn training(&self) -> bool {
        self.in_flight.training
    }

    /// Whether an on-demand evaluation is running.
    pub fn evaluating(&self) -> bool {
        self.in_flight.evaluating
    }

    /// Whether any job of the app (training, evaluation, export, prediction) is in flight.
    pub fn busy(&self) -> bool {
        let f = self.in_flight;
        f.training || f.evaluating || f.exporting > 0 || f.predicting > 0
    }

    /// Moves the session's reports into the state: events into the history, finished jobs
    /// into the status, the evaluation view and the predictions.
    fn poll(&mut self) {
        while let Some(report) = self.session.try_recv() {
            match report {
                Report::Event(e) => self.history.push(&e),
                Report::Finished { kind, result } => self.job_finished(kind, result),
            }
        }
    }

    /// Draws one frame (the whole window), then applies the commands the panels recorded.
    pub fn ui(&mut self, ui: &mut egui::Ui) {
        let _ = self.repaint.set(ui.ctx().clone());
        self.poll();
        self.refresh();
        let title = self.window_title();
        if title != self.title_sent {
            ui.ctx().send_viewport_cmd(egui::ViewportCommand::Title(title.clone()));
            self.title_sent = title;
        }
        let mut commands = self.dropped(ui.ctx());
        egui::Panel::left("setup").resizable(true).default_size(330.0).show(ui, |ui| {
            egui::ScrollArea::vertical().show(ui, |ui| setup_ui(ui, &self.setup_view(), &mut commands));
        });
        egui::Panel::bottom("status").show(ui, |ui| {
            let (h, run, error) = (&self.history, self.last_run.as_deref(), self.error.as_deref());
            status_ui(ui, &self.status, h, run, &self.frame_times, error);
        });
        egui::CentralPanel::default_margins().show(ui, |ui| self.central_ui(ui, &mut commands));
        self.apply_all(commands);
        if self.busy() {
            ui.ctx().request_repaint_after(std::time::Duration::from_millis(250));
        }
    }

    /// The commands of what was dropped on the window: native paths as [`Command::Drop`]; in a
    /// browser the dropped files' bytes and the picked folder's files once read.
    fn dropped(&mut self, ctx: &egui::Context) -> Vec<Command> {
        let mut commands = Vec::new();
        let dropped = ctx.input(|i| i.raw.dropped_files.clone());
        #[cfg(not(target_arch = "wasm32"))]
        if !dropped.is_empty() {
            commands.push(Command::Drop(dropped.iter().map(|f| crate::data::user_path::normalize(f.path())).collect()));
        }
        // A browser gives a dropped file's name and its bytes, read asynchronously.
        #[cfg(target_arch = "wasm32")]
        {
            self.page_drops.read(dropped, ctx);
            let images = self.page_drops.take();
            if !images.is_empty() {
                commands.push(Command::PredictImages(images));
            }
            match self.page_folder.take() {
                Some(Ok((root, files))) => commands.push(Command::UseFiles { root, files }),
                Some(Err(e)) => self.error = Some(e),
                None => {}
            }
        }
        commands
    }

    /// What the setup panel shows, borrowed from the state.
    fn setup_view(&self) -> SetupView<'_> {
        let device = DeviceView {
            adapters: &self.adapters,
            label: self.device_label(),
            gpu: matches!(self.device_choice(), DeviceChoice::Gpu(Some(_))),
            f16: self.f16_available(),
            card_tier: self.card_tier(),
        };
        let dataset = DatasetView {
            data_dir: self.settings.data_dir.as_deref(),
            files_dataset: self.files_dataset.as_deref(),
            data: self.data(),
            cache_summary: self.cache_summary.as_deref(),
            skipped_files: &self.history.skipped_files,
        };
        SetupView {
            settings: &self.settings,
            device,
            dataset,
            plan: self.shown_plan(),
            tier_reason: self.tier_reason.as_deref(),
            notices: &self.notices,
            training: self.training(),
            has_run: self.last_run.is_some(),
            has_model: self.last_run.is_some() || self.in_memory_model.is_some(),
        }
    }

    /// Applies `commands` (those the panels recorded during a frame), in order.
    fn apply_all(&mut self, commands: Vec<Command>) {
        for command in commands {
            self.apply(command);
        }
    }

    /// Draws the setup panel alone (what the snapshot tests compare), applying its commands.
    pub fn setup_panel(&mut self, ui: &mut egui::Ui) {
        self.refresh();
        let mut commands = Vec::new();
        setup_ui(ui, &self.setup_view(), &mut commands);
        self.apply_all(commands);
    }
}
