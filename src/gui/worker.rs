//! The engine thread behind the app: one named thread per job that owns the device work, events
//! back over a channel, and a repaint request after each so the UI wakes up. A panic in the
//! engine (a driver error surfacing through wgpu's handler) ends the job with a message; the app
//! stays up.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, TryRecvError, sync_channel};
use std::thread::JoinHandle;

use crate::config::Config;
use crate::dataset::Splits;
use crate::device::SelectedDevice;
use crate::events::{Event, StopSignal};
use crate::train::{TrainRequest, TrainSummary};

/// A training job in flight.
pub struct TrainingJob {
    events: Receiver<Event>,
    stop: StopSignal,
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
        let dir = out_dir;
        let handle = std::thread::Builder::new().name("vramfit-engine".into()).spawn(move || {
            let mut req = TrainRequest::new(config, dir);
            req.resume = resume;
            req.max_steps = max_steps;
            let mut sink = |e: Event| {
                let _ = tx.try_send(e);
                repaint();
            };
            let result = crate::train::train(&req, &device, &splits, &mut sink, &engine_stop);
            repaint();
            result
        })?;
        Ok(Self { events: rx, stop, handle: Some(handle) })
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
