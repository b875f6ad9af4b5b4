//! One engine session: the engine thread, the jobs it runs one at a time (train, resume,
//! train in a worker process, overfit check, evaluate, export, predict), the stop and budget
//! controls, and one bounded queue of what the jobs report, with one back-pressure policy.
//! The CLI, the app and the training worker process are its clients; none of them starts an
//! engine thread of its own.
//!
//! # Back-pressure
//! The engine never blocks on a slow client and never drops a report that changes state.
//! [`Report`]s wait in a queue of [`QUEUE_CAPACITY`]; when it is full, a new step or memory
//! sample or output line ([`Event::Step`], [`Event::Memory`], [`Event::Info`]) replaces the
//! oldest queued report of its kind (the plots lose a point, never the newest one), and every
//! other report (epoch ends, checkpoints, warnings, skipped samples, errors, the job's result)
//! is queued whatever the queue holds.
//!
//! # Threads
//! [`Session::start`] spawns the thread `vramfit-engine`; jobs that compute run there one at a
//! time and their tensors live on it. [`Job::TrainInWorker`] computes in another process: it is
//! supervised from a thread of its own (`vramfit-supervisor`), so the engine thread stays free
//! to predict or export while the worker trains. After each report the session calls the
//! client's `notify` (the app repaints). A panic inside a job ends that job with
//! [`Error::Crashed`], not the session.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
#[cfg(not(target_arch = "wasm32"))]
use std::sync::mpsc::channel;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

use image::RgbImage;

#[cfg(target_arch = "wasm32")]
use runner::run_async;
#[cfg(not(target_arch = "wasm32"))]
use runner::{Engine, catch_panic};

use crate::config::Config;
use crate::data::dataset::{Dataset, SampleSource, Splits};
use crate::device::{DeviceChoice, SelectedDevice};
use crate::engine::error::{Error, Result};
use crate::engine::events::{Event, LiveBudget, RunEnd, StopSignal};
use crate::engine::worker::WorkerJob;
use crate::inference::eval::EvalResult;
use crate::inference::predict::{ClassProb, Predictor};
use crate::train::{InMemoryRequest, TrainedModel};
use crate::train::{OverfitResult, TrainRequest, TrainSummary};

/// Reports the queue holds before samples start replacing each other (see the module docs).
pub const QUEUE_CAPACITY: usize = 1024;

/// Side of the thumbnails a [`Job::Predict`] returns, in pixels.
pub const THUMBNAIL_SIZE: u32 = 96;

/// A job for the session's engine thread.
pub enum Job {
    /// Train (or with `request.resume`, continue) in this process. The session's
    /// [`LiveBudget`] starts at the config's budget and is the run's live budget.
    Train {
        /// What to train and where.
        request: Box<TrainRequest>,
        /// The data.
        splits: Splits,
        /// The device.
        device: SelectedDevice,
    },
    /// Train in this process without a run folder ([`crate::train::train_in_memory`]): the browser's
    /// way to train, where there is no disk. The model comes back in the output.
    TrainInMemory {
        /// What to train. The session's [`LiveBudget`] starts at the config's budget and is
        /// the run's live budget.
        request: Box<InMemoryRequest>,
        /// Training data, and the data evaluated after each epoch.
        splits: Box<Splits>,
        /// The device (in a browser: the page's WebGPU device, initialized asynchronously, on
        /// the page's adapter).
        device: SelectedDevice,
    },
    /// Train in a worker process (`vramfit train --worker`, see [`crate::engine::worker`]), so a
    /// driver crash ends the job, not the client. Its events are relayed, its other output comes
    /// as [`Event::Info`]; stop and budget changes are passed on to it.
    TrainInWorker(WorkerJob),
    /// `--overfit-check`: `steps` steps on 64 images of `train`.
    OverfitCheck {
        /// The config (augmentation and smoothing are turned off by the check).
        config: Box<Config>,
        /// Training data (64 images are taken, balanced over classes).
        train: Dataset,
        /// The device.
        device: SelectedDevice,
        /// Optimizer steps at most.
        steps: usize,
    },
    /// Evaluate the newest intact checkpoint of the run folder `run` on `data`.
    Evaluate {
        /// The run folder.
        run: PathBuf,
        /// Validation data with the run's classes.
        data: Dataset,
        /// The device.
        device: SelectedDevice,
    },
    /// Evaluate exported weights (an export folder or weights file) on `data`.
    EvaluateExport {
        /// The export folder or weights file.
        model: PathBuf,
        /// Data with the model's classes.
        data: Dataset,
        /// The device.
        device: SelectedDevice,
        /// Images per batch.
        batch_size: usize,
    },
    /// Export the newest checkpoint of `run` into `dir` (.bpk, .safetensors, ONNX, model.json).
    Export {
        /// The run folder.
        run: PathBuf,
        /// The export folder.
        dir: PathBuf,
        /// Which files, and the ONNX graph's input.
        options: crate::export::ExportOptions,
    },
    /// Export a model already on its device (the one [`Job::TrainInMemory`] trained, which has
    /// no run folder): its weights are read back asynchronously
    /// ([`crate::export::model_files_async`]), so this runs in a page too.
    ExportModel {
        /// The model and its metadata (`model.json`).
        predictor: Arc<Predictor>,
        /// The export folder; `None`: the files come back as bytes ([`JobOutput::ExportFiles`],
        /// a page offers them as downloads).
        dir: Option<PathBuf>,
        /// Which files, and the ONNX graph's input.
        options: crate::export::ExportOptions,
    },
    /// The top `top_k` classes of each image file. The predictor (weights on the device) is
    /// loaded once per model and device and kept until its weights file changes.
    Predict {
        /// An export folder or weights file.
        model: PathBuf,
        /// Image files.
        paths: Vec<PathBuf>,
        /// Classes per image.
        top_k: usize,
        /// The device.
        device: DeviceChoice,
        /// Return a thumbnail of each image (the app shows them).
        thumbnails: bool,
    },
    /// Hash and compare every image of `splits` and weigh its classes
    /// ([`crate::data::health::scan`]: copies, label conflicts, validation copies of training
    /// images, imbalance).
    DataHealth {
        /// The dataset.
        splits: Box<Splits>,
        /// How images decode and where the hash cache is (`data.*`).
        data: Box<crate::config::DataConfig>,
    },
    /// Thumbnails (at most [`THUMBNAIL_SIZE`] pixels on a side) of images, for the app's
    /// galleries; `None` for an image that does not decode.
    Thumbnails {
        /// The images.
        sources: Vec<SampleSource>,
    },
    /// [`Job::Predict`] with a model already on its device (the one [`Job::TrainInMemory`]
    /// trained, where there is no export folder to load) on images given as files or bytes.
    PredictWith {
        /// The model, with the device it is on.
        predictor: Arc<Predictor>,
        /// The images.
        images: Vec<SampleSource>,
        /// Classes per image.
        top_k: usize,
        /// Return a thumbnail of each image.
        thumbnails: bool,
    },
}

/// One image of a [`Job::Predict`].
#[derive(Clone, Debug)]
pub struct PredictedFile {
    /// The file.
    pub path: PathBuf,
    /// The top classes, most probable first, or why the file was rejected.
    pub result: std::result::Result<Vec<ClassProb>, String>,
    /// One-line notices, e.g. that the image ran on the CPU because it does not fit the device.
    pub notices: Vec<String>,
    /// The image at most [`THUMBNAIL_SIZE`] pixels on a side, when it decoded.
    pub thumbnail: Option<RgbImage>,
}

/// What a finished job returns.
#[derive(Debug)]
pub enum JobOutput {
    /// [`Job::Train`].
    Trained(Box<TrainSummary>),
    /// [`Job::TrainInWorker`]: the worker's summary.
    TrainedInWorker(Box<RunEnd>),
    /// [`Job::TrainInMemory`]: the trained model.
    TrainedInMemory(Box<TrainedModel>),
    /// [`Job::OverfitCheck`].
    OverfitChecked(OverfitResult),
    /// [`Job::Evaluate`] and [`Job::EvaluateExport`].
    Evaluated(Box<EvalResult>),
    /// [`Job::Export`], and [`Job::ExportModel`] into a folder: the files written.
    Exported(Vec<PathBuf>),
    /// [`Job::ExportModel`] without a folder: `(file name, bytes)` of each file.
    ExportFiles(Vec<(&'static str, Vec<u8>)>),
    /// [`Job::Predict`]: one entry per file, in order.
    Predicted(Vec<PredictedFile>),
    /// [`Job::DataHealth`].
    DataHealth(Box<crate::data::health::DataHealth>),
    /// [`Job::Thumbnails`]: one per image, in order.
    Thumbnails(Vec<Option<RgbImage>>),
}

/// The kind of a [`Job`], named in its [`Report::Finished`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobKind {
    /// [`Job::Train`].
    Train,
    /// [`Job::TrainInWorker`].
    TrainInWorker,
    /// [`Job::TrainInMemory`].
    TrainInMemory,
    /// [`Job::OverfitCheck`].
    OverfitCheck,
    /// [`Job::Evaluate`] and [`Job::EvaluateExport`].
    Evaluate,
    /// [`Job::Export`] and [`Job::ExportModel`].
    Export,
    /// [`Job::Predict`].
    Predict,
    /// [`Job::DataHealth`] and [`Job::Thumbnails`].
    Data,
}

impl Job {
    /// Its kind.
    pub fn kind(&self) -> JobKind {
        match self {
            Job::Train { .. } => JobKind::Train,
            Job::TrainInWorker(_) => JobKind::TrainInWorker,
            Job::TrainInMemory { .. } => JobKind::TrainInMemory,
            Job::OverfitCheck { .. } => JobKind::OverfitCheck,
            Job::Evaluate { .. } | Job::EvaluateExport { .. } => JobKind::Evaluate,
            Job::Export { .. } | Job::ExportModel { .. } => JobKind::Export,
            Job::Predict { .. } | Job::PredictWith { .. } => JobKind::Predict,
            Job::DataHealth { .. } | Job::Thumbnails { .. } => JobKind::Data,
        }
    }
}

/// What the session reports, in order.
#[derive(Debug)]
pub enum Report {
    /// A job's progress.
    Event(Event),
    /// A job ended: its output or its error.
    Finished {
        /// Which kind of job.
        kind: JobKind,
        /// Its output, or why it failed.
        result: Result<JobOutput>,
    },
}

impl Report {
    /// Whether a full queue may replace this report by a newer one of its kind.
    fn sample_kind(&self) -> Option<std::mem::Discriminant<Event>> {
        match self {
            Report::Event(e @ (Event::Step { .. } | Event::Memory { .. } | Event::Info(_))) => {
                Some(std::mem::discriminant(e))
            }
            _ => None,
        }
    }
}

/// The queue between the engine thread and the client (policy in the module docs).
#[derive(Default)]
struct ReportQueue {
    reports: Mutex<(VecDeque<Report>, bool)>,
    ready: Condvar,
}

impl ReportQueue {
    fn push(&self, report: Report) {
        let mut guard = self.reports.lock().unwrap_or_else(PoisonError::into_inner);
        let queue = &mut guard.0;
        if queue.len() >= QUEUE_CAPACITY
            && let Some(kind) = report.sample_kind()
            && let Some(i) = queue.iter().position(|r| r.sample_kind() == Some(kind))
        {
            queue.remove(i);
        }
        queue.push_back(report);
        self.ready.notify_all();
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn close(&self) {
        self.reports.lock().unwrap_or_else(PoisonError::into_inner).1 = true;
        self.ready.notify_all();
    }

    fn try_pop(&self) -> Option<Report> {
        self.reports.lock().unwrap_or_else(PoisonError::into_inner).0.pop_front()
    }

    /// The next report; `None` once the session is closed and the queue empty.
    fn pop(&self) -> Option<Report> {
        let mut guard = self.reports.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(r) = guard.0.pop_front() {
                return Some(r);
            }
            if guard.1 {
                return None;
            }
            guard = self.ready.wait(guard).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// An engine session (see the module docs). Dropping it stops the running jobs (training saves
/// a checkpoint; a worker that does not stop within [`crate::engine::worker::WORKER_STOP_GRACE`] is killed), lets
/// queued jobs go (they finish with [`Error::Stopped`]) and waits for its threads.
pub struct Session {
    jobs: Option<Sender<Job>>,
    queue: Arc<ReportQueue>,
    notify: Arc<dyn Fn() + Send + Sync>,
    stop: StopSignal,
    worker_stop: StopSignal,
    budget: LiveBudget,
    pending: Arc<AtomicUsize>,
    closing: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    supervisors: Mutex<Vec<JoinHandle<()>>>,
}

/// Closes the report queue when the engine thread ends, even by a panic outside a job.
#[cfg(not(target_arch = "wasm32"))]
struct CloseOnDrop(Arc<ReportQueue>);

#[cfg(not(target_arch = "wasm32"))]
impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl Session {
    /// Starts the engine thread. `notify` is called after every report (from the engine thread).
    ///
    /// # Errors
    /// When the thread cannot be spawned.
    pub fn start(notify: impl Fn() + Send + Sync + 'static) -> std::io::Result<Self> {
        let notify: Arc<dyn Fn() + Send + Sync> = Arc::new(notify);
        #[cfg(target_arch = "wasm32")]
        let session = Ok(Self::in_page(notify));
        #[cfg(not(target_arch = "wasm32"))]
        let session = Self::start_engine_thread(notify);
        session
    }

    /// A session without an engine thread: a page has one thread, so jobs run as tasks of the
    /// page's executor ([`Self::run_in_page`]).
    #[cfg(target_arch = "wasm32")]
    fn in_page(notify: Arc<dyn Fn() + Send + Sync>) -> Self {
        Self {
            jobs: None,
            queue: Arc::new(ReportQueue::default()),
            notify,
            stop: StopSignal::new(),
            worker_stop: StopSignal::new(),
            budget: LiveBudget::new(u64::MAX),
            pending: Arc::new(AtomicUsize::new(0)),
            closing: Arc::new(AtomicBool::new(false)),
            thread: None,
            supervisors: Mutex::new(Vec::new()),
        }
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn start_engine_thread(notify: Arc<dyn Fn() + Send + Sync>) -> std::io::Result<Self> {
        let (jobs, inbox) = channel::<Job>();
        let queue = Arc::new(ReportQueue::default());
        let (stop, budget) = (StopSignal::new(), LiveBudget::new(u64::MAX));
        let pending = Arc::new(AtomicUsize::new(0));
        let engine = Engine { queue: queue.clone(), stop: stop.clone(), budget: budget.clone(), predictor: None };
        let (done, engine_notify) = (pending.clone(), notify.clone());
        let closing = Arc::new(AtomicBool::new(false));
        let engine_closing = closing.clone();
        let thread = std::thread::Builder::new().name("vramfit-engine".into()).spawn(move || {
            let mut engine = engine;
            // However this thread ends, the queue is closed so `recv` returns.
            let _close = CloseOnDrop(engine.queue.clone());
            for job in inbox {
                let kind = job.kind();
                let result = if engine_closing.load(Ordering::SeqCst) {
                    Err(Error::Stopped) // the session is being dropped: queued jobs are let go
                } else {
                    catch_panic(|| engine.run(job, engine_notify.as_ref()))
                };
                done.fetch_sub(1, Ordering::SeqCst);
                engine.queue.push(Report::Finished { kind, result });
                engine_notify();
            }
            engine_notify();
        })?;
        Ok(Self {
            jobs: Some(jobs),
            queue,
            notify,
            stop,
            worker_stop: StopSignal::new(),
            budget,
            pending,
            closing,
            thread: Some(thread),
            supervisors: Mutex::new(Vec::new()),
        })
    }

    /// Queues `job`; it runs after the engine thread's jobs before it ([`Job::TrainInWorker`]
    /// starts at once on its own thread). A stop asked for before this call does not carry over
    /// to it, and a training job's budget starts at its config's; both are reset here, on the
    /// caller's thread, so a stop or budget given after `submit` returns is never overwritten.
    ///
    /// # Errors
    /// [`Error::Crashed`] when the engine thread is gone or no supervisor thread can start.
    pub fn submit(&self, mut job: Job) -> Result<()> {
        match &mut job {
            Job::Train { request, .. } => {
                self.stop.clear();
                self.budget.set(request.config.memory.memory_budget_bytes);
            }
            Job::TrainInMemory { request, .. } => {
                self.stop.clear();
                self.budget.set(request.config.memory.memory_budget_bytes);
                request.live_budget = Some(self.budget.clone());
            }
            Job::TrainInWorker(w) => {
                self.worker_stop.clear();
                self.budget.set(w.spec.config.memory.memory_budget_bytes);
            }
            _ if !self.busy() => self.stop.clear(),
            _ => {}
        }
        self.pending.fetch_add(1, Ordering::SeqCst);
        #[cfg(target_arch = "wasm32")]
        let sent = self.run_in_page(job);
        #[cfg(not(target_arch = "wasm32"))]
        let sent = match job {
            Job::TrainInWorker(job) => self.supervise(job),
            job => self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok()),
        };
        if !sent {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            return Err(Error::Crashed("the engine thread has ended".into()));
        }
        Ok(())
    }

    /// In a browser: runs `job` as a task of the page's executor, which runs it between the
    /// page's own work (every device read is awaited). Only [`Job::TrainInMemory`],
    /// [`Job::PredictWith`] and [`Job::ExportModel`] run there; the other jobs need a disk, threads or processes and
    /// finish with an error saying so. A page reads reports with [`Self::try_recv`]: the
    /// blocking [`Self::recv`], [`Self::wait`] and [`Self::run`] would wait on the page's only
    /// thread for a task that thread has to run.
    /// Jobs submitted while one runs are not queued behind it: their awaits interleave.
    #[cfg(target_arch = "wasm32")]
    fn run_in_page(&self, job: Job) -> bool {
        let (queue, notify, done, stop) =
            (self.queue.clone(), self.notify.clone(), self.pending.clone(), self.stop.clone());
        wasm_bindgen_futures::spawn_local(async move {
            let kind = job.kind();
            let mut sink = |e: Event| {
                queue.push(Report::Event(e));
                notify();
            };
            let result = run_async(job, &mut sink, &stop).await;
            done.fetch_sub(1, Ordering::SeqCst);
            queue.push(Report::Finished { kind, result });
            notify();
        });
        true
    }

    /// Starts the supervisor thread of a worker process; whether it started.
    #[cfg(not(target_arch = "wasm32"))]
    fn supervise(&self, job: WorkerJob) -> bool {
        let (queue, notify, done) = (self.queue.clone(), self.notify.clone(), self.pending.clone());
        let (stop, budget) = (self.worker_stop.clone(), self.budget.clone());
        let spawned = std::thread::Builder::new().name("vramfit-supervisor".into()).spawn(move || {
            let mut sink = |e: Event| {
                queue.push(Report::Event(e));
                notify();
            };
            let result = catch_panic(|| {
                let end = crate::engine::worker::supervise(&job, &mut sink, &stop, &budget)?;
                Ok(JobOutput::TrainedInWorker(Box::new(end)))
            });
            done.fetch_sub(1, Ordering::SeqCst);
            queue.push(Report::Finished { kind: JobKind::TrainInWorker, result });
            notify();
        });
        match spawned {
            Ok(handle) => {
                let mut supervisors = self.supervisors.lock().unwrap_or_else(PoisonError::into_inner);
                supervisors.retain(|h| !h.is_finished());
                supervisors.push(handle);
                true
            }
            Err(_) => false,
        }
    }

    /// Whether a job is queued or running.
    pub fn busy(&self) -> bool {
        self.pending.load(Ordering::SeqCst) > 0
    }

    /// Asks the running jobs to stop after their current step (training saves a checkpoint).
    pub fn stop(&self) {
        self.stop.stop();
        self.worker_stop.stop();
    }

    /// The stop control, for handlers on other threads (Ctrl-C, the worker's stdin).
    pub fn stop_signal(&self) -> StopSignal {
        self.stop.clone()
    }

    /// The live memory budget of the running training job, in bytes.
    pub fn budget(&self) -> LiveBudget {
        self.budget.clone()
    }

    /// The next report if there is one (never blocks: the app polls each frame).
    pub fn try_recv(&self) -> Option<Report> {
        self.queue.try_pop()
    }

    /// The next report, waiting for it (the CLI); `None` once the session has ended.
    pub fn recv(&self) -> Option<Report> {
        self.queue.pop()
    }

    /// Queues `job` and returns its output, handing every event to `on_event` on this thread
    /// as it arrives (the CLI's way to run one job).
    ///
    /// # Errors
    /// The job's error.
    pub fn run(&self, job: Job, on_event: &mut dyn FnMut(Event)) -> Result<JobOutput> {
        self.submit(job)?;
        self.wait(on_event)
    }

    /// Waits for the next job to finish, handing every event before it to `on_event`.
    ///
    /// # Errors
    /// The job's error; [`Error::Crashed`] when the engine thread ended without a result.
    pub fn wait(&self, on_event: &mut dyn FnMut(Event)) -> Result<JobOutput> {
        while let Some(report) = self.recv() {
            match report {
                Report::Event(e) => on_event(e),
                Report::Finished { result, .. } => return result,
            }
        }
        Err(Error::Crashed("the engine thread ended without a result".into()))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        self.stop();
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        for handle in self.supervisors.lock().unwrap_or_else(PoisonError::into_inner).drain(..) {
            let _ = handle.join();
        }
    }
}

mod runner;
#[cfg(test)]
mod tests;
