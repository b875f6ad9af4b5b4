//! What the user can do in the app. Panels record a [`Command`] when a widget is used; the
//! app applies them after the frame ([`VramfitApp::apply`]), so drawing never starts work and
//! tests drive the app the way its widgets do.

use std::path::PathBuf;

use super::{FRAME_BUDGET_MS, InMemoryTraining, RunHistory, View, VramfitApp, dialogs};
use crate::config::Config;
use crate::data::dataset;
use crate::device::{self, CpuBackend, DeviceChoice, SelectedDevice};
use crate::engine::session::{Job, JobKind, JobOutput};
use crate::engine::worker::{TrainingSpec, WorkerJob};
use crate::memory;

/// One user action.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Pick an adapter by index, or the CPU (`None`).
    SelectAdapter(Option<usize>),
    /// Pick the CPU backend used when no adapter is selected.
    SelectCpuBackend(CpuBackend),
    /// Use a dataset folder, or the bundled subset (`None`).
    SetDataDir(Option<PathBuf>),
    /// Open the page's folder dialog (Choose folder… in a browser): the picked folder's files
    /// become the dataset once read ([`Command::UseFiles`]); see
    /// [`VramfitApp::choose_folder_in_page`].
    #[cfg(target_arch = "wasm32")]
    ChooseFolderInPage,
    /// Use a folder's files handed over in memory as the dataset (a page's folder pick: the
    /// folder's name and each file's path within it with its bytes), scanned as a folder is
    /// ([`crate::data::dataset::from_files`]). Such data trains in memory ([`InMemoryTraining`]).
    UseFiles {
        /// The folder's name (messages and the setup panel show it).
        root: String,
        /// `(path within the folder, bytes)` of each file.
        files: Vec<(PathBuf, std::sync::Arc<[u8]>)>,
    },
    /// Apply a named preset (`configs/<name>.toml`) to the knobs.
    SelectPreset(String),
    /// Load a `configs/`-style TOML file into the knobs.
    LoadPresetFile(PathBuf),
    /// Save the knobs as a `configs/`-style TOML file.
    SavePresetFile(PathBuf),
    /// Replace the knobs' config (a slider, a checkbox); the preset becomes "custom".
    SetConfig(Box<Config>),
    /// Move the memory budget (bytes); a running job holds to it from its next memory sample.
    SetBudget(u64),
    /// Hide the notices about the saved settings.
    DismissNotices,
    /// Show a central view.
    ShowView(View),
    /// Start a new run.
    Train,
    /// Continue the last run from its newest checkpoint.
    Resume,
    /// Open a run folder: its plots, config and data folder; it becomes the last run (Resume,
    /// Evaluate, Export and Predict act on it).
    OpenRun(PathBuf),
    /// Stop the run after its current step (it saves a checkpoint).
    Stop,
    /// Run the overfit check ([`crate::train::overfit_check`]) on the dataset's training images
    /// with the knobs' config and the selected device: its steps go to the plots, its verdict to
    /// the status line.
    OverfitCheck,
    /// Evaluate the last run's newest checkpoint on the validation data.
    Evaluate,
    /// Export the last run's newest checkpoint (or the model the last in-memory run trained)
    /// into a folder.
    Export(PathBuf),
    /// Export the model the last in-memory run trained as browser downloads (a page has no
    /// folders): `model.bpk`, `model.safetensors`, `model.onnx` and `model.json`.
    Download,
    /// Use these weights (an export folder or weights file) for prediction.
    ChooseModel(PathBuf),
    /// Predict these image files.
    Predict(Vec<PathBuf>),
    /// Predict these images (files or a browser's dropped bytes) with the model the last
    /// in-memory run trained.
    PredictImages(Vec<crate::data::dataset::SampleSource>),
    /// Forget the predictions shown.
    ClearPredictions,
    /// Files dropped on the window: one dataset folder (or IDX file) becomes the dataset,
    /// anything else is predicted.
    Drop(Vec<PathBuf>),
    /// Save the run's metrics as CSV.
    SaveMetrics(PathBuf),
    /// The Data view's and the galleries' commands ([`super::DataCommand`]).
    Data(super::DataCommand),
}

impl VramfitApp {
    /// Applies one command (see [`Command`]); what fails is shown in the error line.
    pub fn apply(&mut self, command: Command) {
        match command {
            Command::SelectAdapter(a) => self.settings.adapter = a,
            Command::SelectCpuBackend(b) => self.settings.cpu_backend = b,
            Command::SetDataDir(d) => self.set_data_dir(d),
            #[cfg(target_arch = "wasm32")]
            Command::ChooseFolderInPage => self.choose_folder_in_page(),
            Command::UseFiles { root, files } => self.use_files(root, files),
            Command::SelectPreset(name) => match crate::config::presets::load_config(&name) {
                Ok(c) => (self.settings.config, self.settings.preset) = (c, name),
                Err(e) => self.error = Some(e.to_string()),
            },
            Command::LoadPresetFile(path) => match Config::load(&path) {
                Ok(c) => (self.settings.preset, self.settings.config) = (c.name.clone(), c),
                Err(e) => self.error = Some(e.to_string()),
            },
            Command::SavePresetFile(path) => self.save_preset_file(&path),
            Command::SetConfig(c) => {
                if *c != self.settings.config {
                    self.settings.config = *c;
                    self.settings.preset = "custom".into();
                }
            }
            Command::SetBudget(bytes) => {
                self.settings.config.memory.memory_budget_bytes = bytes;
                self.settings.preset = "custom".into();
                self.session.budget().set(bytes);
                // The running run's plan is judged against the budget as it is now.
                if let Some(run_plan) = &mut self.history.plan {
                    run_plan.budget_bytes = bytes;
                    run_plan.fits = run_plan.estimate.total <= bytes;
                }
            }
            Command::ShowView(v) => self.view = v,
            Command::DismissNotices => self.notices.clear(),
            Command::Train => self.start_training(false),
            Command::Resume => self.start_training(true),
            Command::OpenRun(run) => self.open_run(run),
            Command::Stop => self.stop_training(),
            Command::OverfitCheck => self.start_overfit_check(),
            Command::Evaluate => self.evaluate_now(),
            Command::Export(dir) => self.export_to(Some(dir)),
            Command::Download => self.export_to(None),
            Command::ChooseModel(path) => self.predict.model_path = Some(path),
            Command::Predict(paths) => self.predict_files(paths),
            Command::PredictImages(images) => self.predict_images(images),
            Command::ClearPredictions => self.predict.clear(),
            Command::Drop(paths) => self.handle_drop(paths),
            Command::Data(command) => self.apply_data(command),
            Command::SaveMetrics(path) => {
                if let Err(e) = crate::atomic_file::write_atomic(&path, self.history.to_csv().as_bytes()) {
                    self.error = Some(e.to_string());
                }
            }
        }
        self.refresh();
    }

    /// Saves the knobs as a `configs/`-style TOML file (atomically).
    fn save_preset_file(&mut self, path: &std::path::Path) {
        let mut c = self.settings.config.clone();
        c.name = path.file_stem().map_or("custom".into(), |s| s.to_string_lossy().to_string());
        match crate::atomic_file::write_atomic(path, c.to_toml().as_bytes()) {
            Ok(()) => self.status = format!("preset saved to {}", path.display()),
            Err(e) => self.error = Some(e.to_string()),
        }
    }

    /// Submits `job` to the session; false (with the error shown) when it cannot run.
    pub(super) fn submit(&mut self, job: Job) -> bool {
        match self.session.submit(job) {
            Ok(()) => true,
            Err(e) => {
                self.error = Some(e.to_string());
                false
            }
        }
    }

    /// Starts training (or resumes the last run) in a worker process.
    fn start_training(&mut self, resume: bool) {
        if self.in_flight.training || self.in_flight.evaluating {
            return;
        }
        // The data is checked here so a bad folder is named at once; the worker opens it again.
        if let Err(e) = &self.data {
            self.error = Some(format!("{e} (pick another dataset folder)"));
            return;
        }
        if let Some(in_memory) = self.options.in_memory.clone() {
            self.start_in_memory(resume, in_memory);
            return;
        }
        if let Some(root) = &self.files_dataset {
            self.error = Some(format!(
                "the files of {root} were handed over in memory and a worker process reads folders: choose the folder"
            ));
            return;
        }
        let Some((out, config)) = self.run_to_start(resume) else { return };
        let spec = TrainingSpec {
            data_dir: self.settings.data_dir.clone(),
            resume,
            max_steps: self.options.max_steps.map(|m| m + self.history.last_step * usize::from(resume)),
            ..TrainingSpec::new(config, self.device_choice(), out.clone())
        };
        if self.submit(Job::TrainInWorker(WorkerJob { spec, launch: self.options.worker.clone() })) {
            self.in_flight.training = true;
            self.last_run = Some(out);
            self.error = None;
            self.status = if resume { "resuming".into() } else { "training".into() };
        }
    }

    /// Starts a run in this process without a run folder (see [`InMemoryTraining`]).
    fn start_in_memory(&mut self, resume: bool, in_memory: InMemoryTraining) {
        if resume {
            self.error = Some("Resume needs a run folder: here runs are kept in memory; press Train".into());
            return;
        }
        let Ok(splits) = &self.data else { return };
        let splits = Box::new(splits.clone());
        let device = match (self.device_choice(), in_memory.gpu) {
            (DeviceChoice::Gpu(Some(i)), Some(gpu)) => SelectedDevice::on_adapter(gpu, self.adapters[i].clone()),
            (DeviceChoice::Gpu(_), None) => {
                self.error = Some("this app trains in memory on the CPU only: select CPU".into());
                return;
            }
            // A page's CPU backend computes without ever yielding to the page: it would freeze
            // (no frames, no Stop) until the run ends.
            (_, _) if cfg!(target_arch = "wasm32") => {
                self.error = Some("in a browser the app trains on the page's WebGPU adapter: select it".into());
                return;
            }
            (_, _) => SelectedDevice::on_cpu(self.settings.cpu_backend),
        };
        let mut request = crate::train::InMemoryRequest::new(self.settings.config.clone());
        request.max_steps = self.options.max_steps;
        // The page's plots show every step's memory sample, as the page itself does.
        request.config.train.memory_sample_every = 1;
        self.history = RunHistory::default();
        if self.submit(Job::TrainInMemory { request: Box::new(request), splits, device }) {
            self.in_flight.training = true;
            self.last_run = None;
            self.error = None;
            self.status = "training (in memory)".into();
        }
    }

    /// The run folder and config to start: the last run's own config on resume, else a new
    /// folder under `runs_dir` with the knobs' config.
    fn run_to_start(&mut self, resume: bool) -> Option<(PathBuf, Config)> {
        if !resume {
            self.history = RunHistory::default();
            return Some((crate::train::run_dir::new_run_dir(&self.options.runs_dir), self.settings.config.clone()));
        }
        let Some(run) = self.last_run.clone() else {
            self.error = Some("nothing to resume: train first".into());
            return None;
        };
        match crate::train::run_dir::load_config(&run) {
            Ok((c, notes)) => {
                self.history.log.extend(notes.into_iter().map(|n| format!("note: {n}")));
                Some((run, c))
            }
            Err(e) => {
                self.error = Some(e.to_string());
                None
            }
        }
    }

    /// Starts the overfit check on the session (in this process: it trains 64 images, writes
    /// nothing, and its steps are plotted as a run's).
    fn start_overfit_check(&mut self) {
        if self.in_flight.training || self.in_flight.evaluating {
            return;
        }
        let inputs = self.data.clone().map_err(|e| format!("{e} (pick another dataset folder)")).and_then(|splits| {
            device::select(self.device_choice()).map(|device| (splits.train, device)).map_err(|e| e.to_string())
        });
        let (train, device) = match inputs {
            Ok(i) => i,
            Err(e) => {
                self.error = Some(e);
                return;
            }
        };
        let config = Box::new(self.settings.config.clone());
        self.history = RunHistory::default();
        if self.submit(Job::OverfitCheck { config, train, device, steps: crate::train::OVERFIT_CHECK_STEPS }) {
            self.in_flight.training = true;
            self.error = None;
            self.status = "overfit check: memorizing 64 training images".into();
        }
    }

    /// Asks the running job to stop (it saves a checkpoint).
    fn stop_training(&mut self) {
        if self.in_flight.training {
            self.session.stop();
            self.status = "stopping after this step".into();
        }
    }

    /// Evaluates the last run's newest checkpoint on the validation data on the session; the
    /// Evaluation view shows the result when it ends.
    fn evaluate_now(&mut self) {
        if self.in_flight.evaluating || self.in_flight.training {
            return;
        }
        let Some(run) = self.last_run.clone() else {
            self.error = Some("nothing to evaluate: train first".into());
            return;
        };
        let fix = "pick the dataset the run was trained on";
        let inputs = self.data.clone().map_err(|e| format!("{e} ({fix})")).and_then(|splits| {
            device::select(self.device_choice()).map(|device| (splits, device)).map_err(|e| e.to_string())
        });
        let (splits, device) = match inputs {
            Ok(i) => i,
            Err(e) => {
                self.error = Some(e);
                return;
            }
        };
        if self.submit(Job::Evaluate { run, data: splits.val, device }) {
            self.in_flight.evaluating = true;
            self.status = "evaluating the latest checkpoint".into();
        }
    }

    /// Exports on the session: the model the last in-memory run trained, into `dir` or (`None`)
    /// as downloads; else the last run's newest checkpoint into `dir`.
    fn export_to(&mut self, dir: Option<PathBuf>) {
        let options = crate::export::ExportOptions::default();
        let job = match (self.in_memory_model.clone(), self.last_run.clone(), dir) {
            (None, None, _) => {
                self.error = Some("nothing to export: train a model first".into());
                return;
            }
            (Some(predictor), _, Some(dir)) => Job::ExportModel { predictor, dir: Some(dir), options },
            (Some(predictor), _, None) if cfg!(target_arch = "wasm32") => {
                Job::ExportModel { predictor, dir: None, options }
            }
            (None, Some(run), Some(dir)) => Job::Export { run, dir, options },
            (_, _, None) => {
                self.error = Some("downloads are made in a browser: choose an export folder".into());
                return;
            }
        };
        if self.submit(job) {
            self.in_flight.exporting += 1;
            self.status = "exporting".into();
        }
    }

    /// Predicts `images` with the model the last in-memory run trained, on the session.
    fn predict_images(&mut self, images: Vec<crate::data::dataset::SampleSource>) {
        self.view = View::Predict;
        let Some(predictor) = self.in_memory_model.clone() else {
            self.predict.error = Some("no model yet: press Train first".into());
            return;
        };
        if self.submit(Job::PredictWith { predictor, images, top_k: 5, thumbnails: true }) {
            self.in_flight.predicting += 1;
        }
    }

    /// Predicts `paths` with the chosen weights (or the last run's export, or the model the
    /// last in-memory run trained) on the session.
    fn predict_files(&mut self, paths: Vec<PathBuf>) {
        if self.options.in_memory.is_some() && self.predict.model_path.is_none() {
            let images = paths.into_iter().map(crate::data::dataset::SampleSource::File);
            self.predict_images(images.collect());
            return;
        }
        self.view = View::Predict;
        let Some(model) = self.predict.model_dir(self.last_run.as_deref()) else {
            self.predict.error = Some(
                "no model yet: train one, or choose exported weights (.bpk / .safetensors with model.json)".into(),
            );
            return;
        };
        let job = Job::Predict { model, paths, top_k: 5, device: self.device_choice(), thumbnails: true };
        if self.submit(job) {
            self.in_flight.predicting += 1;
        }
    }

    /// Uses `dir` as the dataset (`None`: the bundled one); ignored while training (a folder
    /// dropped on the window then). A readable folder of one's own images chosen while the
    /// preset is still quickstart (made for the bundled 28 px data) switches the preset to the
    /// selected card's tier ([`crate::config::presets::preset_for_card`]), when the adapter reports its
    /// memory; IDX datasets keep their preset.
    fn set_data_dir(&mut self, dir: Option<PathBuf>) {
        if self.in_flight.training {
            self.error = Some("training: the dataset changes when the run has ended".into());
            return;
        }
        // The files handed over before are dropped; the folder (or bundled data) is scanned.
        if self.files_dataset.take().is_some() {
            self.data_for = None;
        }
        let own_images = dir.as_ref().is_some_and(|d| crate::data::idx::find_split(d, "train").is_none());
        self.settings.data_dir = dir;
        let Some(card_bytes) = self.card_bytes() else { return };
        if !own_images || self.settings.preset != "quickstart" {
            return;
        }
        self.refresh();
        let Ok(classes) = self.data.as_ref().map(|d| d.train.class_names.len()) else { return };
        match crate::config::presets::preset_for_card(card_bytes, classes, self.f16_available()) {
            Ok((name, config)) => {
                self.status = format!(
                    "preset {name} for this card ({}): batch {} x {}, {}, checkpointing {}",
                    memory::human_bytes(card_bytes),
                    config.train.batch_size,
                    config.train.grad_accum_steps,
                    config.train.precision,
                    if config.train.checkpointing { "on" } else { "off" }
                );
                (self.settings.preset, self.settings.config) = (name, config);
            }
            Err(e) => self.status = format!("preset kept: {e}"),
        }
    }

    /// Uses the files of the folder `root` handed over in memory as the dataset, scanned with
    /// the config's split ([`crate::data::dataset::from_files`]); a refusal (no class folders, empty
    /// classes) shows where the dataset's summary does, naming the folder. Ignored while
    /// training.
    fn use_files(&mut self, root: String, files: Vec<(PathBuf, std::sync::Arc<[u8]>)>) {
        if self.in_flight.training {
            self.error = Some("training: the dataset changes when the run has ended".into());
            return;
        }
        self.data = dataset::from_files(&root, files, &self.scan_options()).map_err(|e| e.to_string());
        self.data_state.reset();
        self.settings.data_dir = None;
        self.data_for = Some(None);
        self.plan_for = None; // the class count may differ
        self.cache_summary = None;
        self.status = match &self.data {
            Ok(d) => format!(
                "dataset {root}: {} classes, {} images",
                d.train.class_names.len(),
                d.train.samples.len() + d.val.samples.len()
            ),
            Err(_) => format!("dataset {root} cannot be used"),
        };
        self.files_dataset = Some(root);
    }

    fn handle_drop(&mut self, paths: Vec<PathBuf>) {
        let Some(first) = paths.first() else { return };
        if paths.len() == 1 && dataset::is_run_folder(first) {
            self.open_run(first.clone());
            return;
        }
        let is_dataset = first.is_dir()
            || crate::data::idx::find_split(first.parent().unwrap_or(first), "train").is_some()
                && !dataset::has_image_extension(first);
        if paths.len() == 1 && dataset::is_labels_csv(first) {
            self.set_data_dir(Some(first.clone()));
        } else if is_dataset && paths.len() == 1 {
            let dir = if first.is_dir() { first.clone() } else { first.parent().unwrap_or(first).to_path_buf() };
            self.set_data_dir(Some(dir));
        } else {
            self.predict_files(paths);
        }
    }

    /// A session job ended: its result goes to the status line, the views or the error line.
    pub(super) fn job_finished(&mut self, kind: JobKind, result: crate::Result<JobOutput>) {
        match kind {
            JobKind::TrainInWorker | JobKind::TrainInMemory | JobKind::Train | JobKind::OverfitCheck => {
                self.training_finished(result)
            }
            JobKind::Evaluate => {
                self.in_flight.evaluating = false;
                match result {
                    Ok(JobOutput::Evaluated(r)) => {
                        self.status = format!("evaluated: top-1 {:.2}% on {} images", r.top1 * 100.0, r.samples);
                        self.evaluation = Some(*r);
                    }
                    other => self.job_failed("evaluation failed", other),
                }
            }
            JobKind::Export => {
                self.in_flight.exporting -= 1;
                match result {
                    Ok(JobOutput::Exported(files)) => {
                        let dir = files.first().and_then(|f| f.parent()).map(|d| d.display().to_string());
                        self.status = format!("exported {} files to {}", files.len(), dir.unwrap_or_default());
                    }
                    Ok(JobOutput::ExportFiles(files)) => {
                        let names = files.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(", ");
                        match dialogs::offer_downloads(files) {
                            Ok(()) => self.status = format!("downloading {names}"),
                            Err(e) => {
                                self.status = "export failed".into();
                                self.error = Some(e);
                            }
                        }
                    }
                    other => self.job_failed("export failed", other),
                }
            }
            JobKind::Data => self.data_job_finished(result),
            JobKind::Predict => {
                self.in_flight.predicting -= 1;
                match result {
                    Ok(JobOutput::Predicted(files)) => self.predict.add_results(files),
                    Ok(_) => {}
                    Err(e) => self.predict.error = Some(e.to_string()),
                }
            }
        }
    }

    fn job_failed(&mut self, status: &str, result: crate::Result<JobOutput>) {
        self.status = status.into();
        if let Err(e) = result {
            self.error = Some(e.to_string());
        }
    }

    fn training_finished(&mut self, result: crate::Result<JobOutput>) {
        self.in_flight.training = false;
        match result {
            Ok(JobOutput::TrainedInMemory(trained)) => {
                self.run_ended(&trained.end);
                let t = *trained;
                let predictor = crate::inference::predict::Predictor::from_model(t.model, t.metadata, t.device)
                    .with_buffer_limit(t.buffer_limit);
                // In a browser an image too large for the device's buffers is refused: a page
                // has no memory to spare for the CPU copy native prediction would use.
                let predictor = if cfg!(target_arch = "wasm32") { predictor.without_cpu_fallback() } else { predictor };
                self.in_memory_model = Some(std::sync::Arc::new(predictor));
            }
            Ok(JobOutput::TrainedInWorker(end)) => self.run_ended(&end),
            Ok(JobOutput::OverfitChecked(r)) => self.overfit_checked(&r),
            other => self.job_failed("failed", other),
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
    }

    /// The overfit check's verdict in the status line; a failure also in the error line, with
    /// what to look at.
    fn overfit_checked(&mut self, r: &crate::train::OverfitResult) {
        let of =
            format!("{:.1}% of 64 images after {}", r.accuracy * 100.0, crate::engine::words::count(r.steps, "step"));
        self.status = match (r.stopped, r.passed) {
            (true, _) => format!("overfit check stopped: {of}"),
            (false, true) => format!("overfit check PASSED: {of}"),
            (false, false) => {
                self.error = Some(format!(
                    "overfit check FAILED: {of}, under 98%. A working network memorizes 64 images: check the \
                     labels (each class folder holds its own images), the learning rate (optimizer.lr) and the \
                     normalization (data.mean, data.std)"
                ));
                "overfit check FAILED".into()
            }
        };
    }

    /// A run returned normally: its end goes to the status line and the evaluation view, its
    /// export (when it wrote one) becomes the prediction model.
    fn run_ended(&mut self, end: &crate::engine::events::RunEnd) {
        self.status = match (&end.val, end.stopped) {
            (_, true) if self.options.in_memory.is_some() => {
                format!("stopped at step {} (a run kept in memory cannot resume)", end.global_step)
            }
            (_, true) => format!("stopped at step {}; press Resume to continue", end.global_step),
            (Some(v), false) => {
                format!("done: validation accuracy {:.1}% after {} epochs", v.top1 * 100.0, end.epochs_completed)
            }
            (None, false) => "done".into(),
        };
        if end.val.is_some() {
            self.evaluation = end.val.clone();
        }
        if let Some(dir) = &end.export_dir {
            self.predict.model_path = Some(dir.clone());
        }
    }
}
