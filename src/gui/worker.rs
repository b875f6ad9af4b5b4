//! The engine threads behind the app: one named thread per job (training, or an on-demand
//! evaluation) that owns the device work, events back over a channel, and a repaint request after
//! each so the UI wakes up. A panic in the engine (a driver error surfacing through wgpu's
//! handler) ends the job with a message; the app stays up.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, TryRecvError, sync_channel};
use std::thread::JoinHandle;

use crate::config::Config;
use crate::dataset::{Dataset, Splits};
use crate::device::SelectedDevice;
use crate::eval::EvalResult;
use crate::events::{Event, LiveBudget, StopSignal};
use crate::train::{TrainRequest, TrainSummary};

/// A training job in flight.
pub struct TrainingJob {
    events: Receiver<Event>,
    stop: StopSignal,
    budget: LiveBudget,
    handle: Option<JoinHandle<crate::Result<TrainSummary>>>,
}

/// How a job ended.
pub enum JobEnd {
    /// Finished or stopped with a summary.
    Done(TrainSummary),
    /// An engine error, or a panic turned into one.
    Failed(String),
}

impl TrainingJob {
    /// Starts training on its own thread. `repaint` is called after every event.
    pub fn start(
        config: Config,
        splits: Splits,
        device: SelectedDevice,
        out_dir: PathBuf,
        resume: bool,
        max_steps: Option<usize>,
        repaint: impl Fn() + Send + 'static,
    ) -> std::io::Result<Self> {
        let (tx, rx) = sync_channel::<Event>(4096);
        let stop = StopSignal::new();
        let engine_stop = stop.clone();
        let budget = LiveBudget::new(config.memory.memory_budget_bytes);
        let engine_budget = budget.clone();
        let dir = out_dir;
        let handle = std::thread::Builder::new().name("vramfit-engine".into()).spawn(move || {
            let mut req = TrainRequest::new(config, dir);
            req.resume = resume;
            req.max_steps = max_steps;
            req.live_budget = Some(engine_budget);
            let mut sink = |e: Event| {
                let _ = tx.try_send(e);
                repaint();
            };
            let result = crate::train::train(&req, &device, &splits, &mut sink, &engine_stop);
            repaint();
            result
        })?;
        Ok(Self { events: rx, stop, budget, handle: Some(handle) })
    }

    /// Moves the memory budget of the running job (bytes); it acts at its next memory sample.
    pub fn set_budget(&self, bytes: u64) {
        self.budget.set(bytes);
    }

    /// Asks the engine to stop after the current step (it saves a checkpoint).
    pub fn stop(&self) {
        self.stop.stop();
    }

    /// Events received since the last call (never blocks).
    pub fn drain(&self) -> Vec<Event> {
        let mut out = Vec::new();
        loop {
            match self.events.try_recv() {
                Ok(e) => out.push(e),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return out,
            }
        }
    }

    /// The result once the thread has ended (never blocks).
    pub fn try_finish(&mut self) -> Option<JobEnd> {
        if !self.handle.as_ref().is_some_and(JoinHandle::is_finished) {
            return None;
        }
        let handle = self.handle.take()?;
        Some(match handle.join() {
            Ok(Ok(summary)) => JobEnd::Done(summary),
            Ok(Err(e)) => JobEnd::Failed(e.to_string()),
            Err(panic) => {
                let msg = crate::events::panic_message(panic.as_ref());
                JobEnd::Failed(format!("the engine crashed ({msg}); the last checkpoint is intact, press Resume"))
            }
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
