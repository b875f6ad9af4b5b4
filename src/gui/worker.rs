//! The jobs behind the app. Training runs in a worker process (`vramfit train --worker`, see
//! [`crate::worker_process`]), so a crash in the GPU driver or runtime ends the job, not the
//! window; the run folder keeps its last checkpoint and Resume continues from it. An on-demand
//! evaluation runs on a named thread. Each job requests a repaint when it has news.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::thread::JoinHandle;

use crate::config::Config;
use crate::dataset::Dataset;
use crate::device::{DeviceChoice, SelectedDevice};
use crate::eval::EvalResult;
use crate::events::{Event, RunEnd};
use crate::worker_process::{End, Output, WorkerProcess};

/// How the app starts its training worker: the vramfit executable (this one, by default) and
/// variables added to its environment (the tests inject faults with `VRAMFIT_FAULT`).
#[derive(Clone, Debug)]
pub struct WorkerLaunch {
    /// The vramfit binary.
    pub exe: PathBuf,
    /// Added to the worker's environment.
    pub env: Vec<(OsString, OsString)>,
}

impl Default for WorkerLaunch {
    fn default() -> Self {
        Self { exe: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("vramfit")), env: Vec::new() }
    }
}

/// What a training job needs to start.
#[derive(Clone, Debug)]
pub struct TrainingSpec {
    /// The config of a new run (a resumed run uses its own `config.toml`).
    pub config: Config,
    /// The dataset folder (`None`: the bundled data; on resume, the run's `data.txt`).
    pub data_dir: Option<PathBuf>,
    /// The device.
    pub device: DeviceChoice,
    /// The run folder.
    pub out_dir: PathBuf,
    /// Continue the run in `out_dir`.
    pub resume: bool,
    /// Stop after this global step.
    pub max_steps: Option<usize>,
}

impl TrainingSpec {
    /// The worker's command line; `config_file` holds `config` for a new run.
    fn args(&self, config_file: &Path) -> Vec<OsString> {
        let mut args: Vec<OsString> =
            vec!["train".into(), "--worker".into(), "--out".into(), self.out_dir.clone().into()];
        if self.resume {
            args.push("--resume".into());
        } else {
            args.extend(["--config".into(), config_file.into()]);
        }
        if let Some(dir) = &self.data_dir {
            args.extend(["--data".into(), dir.clone().into()]);
        }
        args.extend(crate::worker_process::device_args(self.device).into_iter().map(Into::into));
        if let Some(m) = self.max_steps {
            args.extend(["--max-steps".into(), m.to_string().into()]);
        }
        args
    }
}

/// A training job in flight.
pub struct TrainingJob {
    process: WorkerProcess,
    output: Receiver<Output>,
    /// The new run's config, read by the worker at its start; deleted when the job is dropped.
    _config_file: tempfile::TempPath,
    finished: Option<RunEnd>,
}

/// How a job ended.
pub enum JobEnd {
    /// Finished or stopped with a checkpoint.
    Done(RunEnd),
    /// An error the worker explained, or its crash report.
    Failed(String),
}

impl TrainingJob {
    /// Starts the worker process. `repaint` is called whenever it reports something.
    ///
    /// # Errors
    /// When the config cannot be written or the process cannot be started.
    pub fn start(
        spec: &TrainingSpec,
        launch: &WorkerLaunch,
        repaint: impl Fn() + Send + Sync + 'static,
    ) -> std::io::Result<Self> {
        let mut file = tempfile::Builder::new().prefix("vramfit-app-").suffix(".toml").tempfile()?;
        std::io::Write::write_all(&mut file, spec.config.to_toml().as_bytes())?;
        let config_file = file.into_temp_path();
        let (tx, output) = std::sync::mpsc::channel();
        let gpu = matches!(spec.device, DeviceChoice::Gpu(_));
        let process =
            WorkerProcess::spawn(&launch.exe, &spec.args(&config_file), &launch.env, &spec.out_dir, gpu, tx, repaint)?;
        Ok(Self { process, output, _config_file: config_file, finished: None })
    }

    /// Moves the memory budget of the running job (bytes); it acts at its next memory sample.
    pub fn set_budget(&mut self, bytes: u64) {
        self.process.set_budget(bytes);
    }

    /// Asks the worker to stop after the current step (it saves a checkpoint).
    pub fn stop(&mut self) {
        self.process.stop();
    }

    /// Events received since the last call (never blocks); the worker's own output lines come
    /// as [`Event::Info`].
    pub fn drain(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        while let Ok(item) = self.output.try_recv() {
            match item {
                Output::Event(Event::Finished(end)) => self.finished = Some(end),
                Output::Event(e) => out.push(e),
                Output::Stdout(line) | Output::Stderr(line) if !line.trim().is_empty() => out.push(Event::Info(line)),
                Output::Stdout(_) | Output::Stderr(_) => {}
            }
        }
        out
    }

    /// How the job ended, once the worker has exited and its output is read (never blocks).
    pub fn try_finish(&mut self) -> Option<JobEnd> {
        let end = self.process.try_end()?;
        Some(match end {
            End::Done => match self.finished.take() {
                Some(run) => JobEnd::Done(run),
                None => JobEnd::Failed("the training process ended without a summary; see the log".into()),
            },
            End::Explained { code: 130, .. } => JobEnd::Failed("the training process was interrupted".into()),
            End::Explained { message, .. } => {
                JobEnd::Failed(message.unwrap_or_else(|| "the training process failed; see the log".into()))
            }
            End::Crashed(report) => JobEnd::Failed(format!("{report}\n(the app: press Resume)")),
        })
    }
}

/// An on-demand evaluation of a run's newest checkpoint.
pub struct EvalJob {
    handle: Option<JoinHandle<crate::Result<EvalResult>>>,
}

impl EvalJob {
    /// Evaluates the newest checkpoint of `run` on `data` on its own thread. `repaint` is called
    /// when it ends.
    pub fn start(
        run: PathBuf,
        data: Dataset,
        device: SelectedDevice,
        repaint: impl Fn() + Send + 'static,
    ) -> std::io::Result<Self> {
        let handle = std::thread::Builder::new().name("vramfit-eval".into()).spawn(move || {
            let result = (|| {
                let (model, config, state) = crate::checkpoint::load_latest_model(&run, &device.device)?;
                if state.class_names != data.class_names {
                    return Err(crate::Error::Dataset {
                        path: run.clone(),
                        message: "the dataset's classes differ from the run's; choose the dataset it was trained on"
                            .into(),
                    });
                }
                let pipe = std::sync::Arc::new(crate::loader::SamplePipeline::from_config(&config, false));
                let settings = crate::eval::EvalSettings {
                    model: &config.model,
                    batch_size: config.train.batch_size.max(32),
                    precision: crate::config::Precision::F32,
                    workers: config.data.workers,
                    buffer_limit: device.buffer_limit(),
                };
                crate::eval::evaluate(&model, std::sync::Arc::new(data), pipe, &device.device, &settings)
            })();
            repaint();
            result
        })?;
        Ok(Self { handle: Some(handle) })
    }

    /// The result once the thread has ended (never blocks).
    pub fn try_finish(&mut self) -> Option<Result<EvalResult, String>> {
        if !self.handle.as_ref().is_some_and(JoinHandle::is_finished) {
            return None;
        }
        let handle = self.handle.take()?;
        Some(match handle.join() {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(panic) => Err(format!("the evaluation crashed ({})", crate::events::panic_message(panic.as_ref()))),
        })
    }
}
