//! The training worker process, parent side: training runs in a child process (`vramfit train
//! --worker`), so a crash below the engine (a segfault in the GPU driver, an abort in the GPU
//! runtime, the kernel's out-of-memory killer, `kill -9`) ends only the child. The CLI and the app
//! are both parents; the run folder keeps its last checkpoint and the parent says what happened
//! and how to resume.
//!
//! Protocol, child to parent:
//! - stdout: each engine event as one line, [`EVENT_PREFIX`] then the event as JSON
//!   ([`crate::engine::events::Event`]); every other line is the child's own output.
//! - stderr: the child's messages; the last [`STDERR_TAIL`] lines are kept for the report.
//! - exit: 0 done, 1 or 2 an error the child has already explained (its `error:` line), 130 a
//!   second Ctrl-C; anything else (a signal, a panic's 101) is a crash.
//!
//! Parent to child, on the child's stdin: first the run as data, [`JOB_PREFIX`] then the
//! [`TrainingSpec`] as JSON (the config travels as a value, not as a file or as text to parse
//! again); then `stop` (stop after this step, with a checkpoint) and `budget BYTES` (move the
//! live memory budget). Its end (the parent died) stops the run too: a worker never trains on
//! alone.
//!
//! [`supervise_with`] is the one parent loop (the CLI renders what it passes on; the app's
//! session uses [`supervise`], which turns it into events and a result).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::device::DeviceChoice;
use crate::engine::error::{Error, Result};
use crate::engine::events::{Event, LiveBudget, RunEnd, StopSignal};

/// How long a worker process may take to stop after being asked before it is killed (its run
/// folder keeps its last checkpoint, as after any crash).
pub const WORKER_STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(120);

/// How long a worker process that has not finished a step yet may take to stop before it is
/// ended: its first step compiles every kernel (minutes on a software adapter) and cannot be
/// interrupted, and ending it loses nothing (no step of this process to save; its run folder
/// resumes from the checkpoint it started from, or from step 0).
pub const FIRST_STEP_STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Marks an event line on the child's stdout.
pub const EVENT_PREFIX: &str = "\u{1e}vramfit-event ";
/// Marks the job line, the first line the parent writes to the child's stdin.
pub const JOB_PREFIX: &str = "job ";
/// Lines of the child's stderr kept for the crash report.
pub const STDERR_TAIL: usize = 12;

/// Child side: one event as its stdout line (without the newline).
pub fn event_line(event: &Event) -> String {
    let json = serde_json::to_string(event).unwrap_or_else(|e| {
        serde_json::to_string(&Event::Warning(format!("an event could not be encoded: {e}"))).unwrap_or_default()
    });
    format!("{EVENT_PREFIX}{json}")
}

/// What the child said, in order of arrival per stream.
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    /// An engine event.
    Event(Event),
    /// A line of the child's stdout that is not an event.
    Stdout(String),
    /// A line of the child's stderr.
    Stderr(String),
}

/// How the child ended.
#[derive(Clone, Debug, PartialEq)]
pub enum End {
    /// Exit status 0: finished, stopped or capped, with a checkpoint.
    Done,
    /// Exit status 1, 2 or 130: an error the child explained (its last `error:` line, if any).
    Explained {
        /// The exit status.
        code: i32,
        /// The child's last `error:` line, without the prefix.
        message: Option<String>,
    },
    /// Killed by a signal or a panic: the report says the cause, where, its last messages and
    /// the command that resumes the run.
    Crashed(String),
    /// Asked to stop before it finished a step, and ended after [`FIRST_STEP_STOP_GRACE`].
    StoppedBeforeFirstStep,
}

/// A training worker process in flight.
pub struct WorkerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    tail: Arc<Mutex<VecDeque<String>>>,
    last_step: Arc<Mutex<Option<usize>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
    out_dir: PathBuf,
    /// The flags that choose the run's devices again ([`TrainingSpec::device_flags`]).
    device_flags: String,
}

impl WorkerProcess {
    /// Starts `exe` (the vramfit binary) with `args` (a `train ... --worker` command line) and
    /// `env` added to the environment. Everything the child says is sent to `output` as it
    /// arrives; `notify` is called after each line (the app repaints). `out_dir` and `device_flags`
    /// (the flags that choose the run's devices, for the resume command) only shape the crash
    /// report.
    ///
    /// # Errors
    /// When the process cannot be started.
    pub fn spawn(
        exe: &Path,
        args: &[OsString],
        env: &[(OsString, OsString)],
        out_dir: &Path,
        device_flags: String,
        output: Sender<Output>,
        notify: impl Fn() + Send + Sync + 'static,
    ) -> std::io::Result<Self> {
        let mut command = Command::new(exe);
        command
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped()) // kept open while the parent lives: its end tells the child to stop
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // A process group of its own: a terminal's Ctrl-C (and a signal to the parent's group)
        // reaches the parent only, which asks the child to stop over stdin; the child never gets
        // a second signal that it would take for "quit now".
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command.spawn()?;
        let notify = Arc::new(notify);
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
        let last_step = Arc::new(Mutex::new(None));
        let mut readers = Vec::new();
        if let Some(err) = child.stderr.take() {
            let (tail, output, notify) = (tail.clone(), output.clone(), notify.clone());
            readers.push(std::thread::Builder::new().name("vramfit-worker-stderr".into()).spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    {
                        let mut t = tail.lock().unwrap_or_else(PoisonError::into_inner);
                        if t.len() == STDERR_TAIL {
                            t.pop_front();
                        }
                        t.push_back(line.clone());
                    }
                    let _ = output.send(Output::Stderr(line));
                    notify();
                }
            })?);
        }
        if let Some(out) = child.stdout.take() {
            let last_step = last_step.clone();
            readers.push(std::thread::Builder::new().name("vramfit-worker-stdout".into()).spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let item = match line.strip_prefix(EVENT_PREFIX).map(serde_json::from_str::<Event>) {
                        Some(Ok(event)) => {
                            if let Event::Step { step, .. } = &event {
                                *last_step.lock().unwrap_or_else(PoisonError::into_inner) = Some(*step);
                            }
                            Output::Event(event)
                        }
                        Some(Err(e)) => {
                            Output::Stderr(format!("warning: unreadable event from the training process: {e}"))
                        }
                        None => Output::Stdout(line),
                    };
                    let _ = output.send(item);
                    notify();
                }
                notify(); // the end of the output: the parent can collect the exit
            })?);
        }
        let stdin = child.stdin.take();
        Ok(Self { child, stdin, tail, last_step, readers, out_dir: out_dir.to_path_buf(), device_flags })
    }

    /// Asks the child to stop after its current step (it saves a checkpoint).
    pub fn stop(&mut self) {
        self.send("stop");
    }

    /// Whether the child reported a finished step.
    pub fn has_stepped(&self) -> bool {
        self.last_step.lock().unwrap_or_else(PoisonError::into_inner).is_some()
    }

    /// Kills the child (a worker that did not stop when asked); its run folder keeps its last
    /// checkpoint.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// Moves the child's memory budget (bytes); it acts at its next memory sample.
    pub fn set_budget(&mut self, bytes: u64) {
        self.send(&format!("budget {bytes}"));
    }

    fn send(&mut self, line: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = writeln!(stdin, "{line}").and_then(|()| stdin.flush());
        }
    }

    /// How the child ended, once it has and all its output has been sent (never blocks).
    pub fn try_end(&mut self) -> Option<End> {
        if !self.readers.iter().all(std::thread::JoinHandle::is_finished) {
            return None;
        }
        let status = self.child.try_wait().ok().flatten()?;
        Some(self.end(status))
    }

    /// Waits for the child to end.
    ///
    /// # Errors
    /// When the child cannot be waited for.
    pub fn wait(&mut self) -> std::io::Result<End> {
        let status = self.child.wait()?;
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        Ok(self.end(status))
    }

    fn end(&self, status: ExitStatus) -> End {
        let tail: Vec<String> = self.tail.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned().collect();
        match status.code() {
            Some(0) => End::Done,
            Some(code @ (1 | 2 | 130)) => End::Explained {
                code,
                message: tail.iter().rev().find_map(|l| l.strip_prefix("error: ")).map(str::to_string),
            },
            _ => {
                let last_step = *self.last_step.lock().unwrap_or_else(PoisonError::into_inner);
                End::Crashed(crash_report(&status, last_step, &tail, &self.out_dir, &self.device_flags))
            }
        }
    }
}

impl Drop for WorkerProcess {
    /// Closing stdin stops the child after its step; it is waited for so no zombie remains.
    fn drop(&mut self) {
        self.stdin = None;
        let _ = self.child.wait();
    }
}

/// How a client starts training workers: the vramfit executable (this one, by default) and
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

/// What a training run in a worker process needs: sent to the child as its job line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainingSpec {
    /// The config of the run. On resume: the run's stored config with the client's changes,
    /// checked against it by the run ([`Config::changes_on_resume`]).
    pub config: Config,
    /// The dataset folder (`None`: the bundled data; on resume, the run's `data.txt`).
    pub data_dir: Option<PathBuf>,
    /// The device (with `replicas`, the main one).
    pub device: DeviceChoice,
    /// The other devices of a data-parallel run (`--devices`' second and later entries).
    #[serde(default)]
    pub replicas: Vec<DeviceChoice>,
    /// The run folder.
    pub out_dir: PathBuf,
    /// Continue the run in `out_dir`.
    pub resume: bool,
    /// Stop after this global step.
    pub max_steps: Option<usize>,
    /// Shrink the micro-batch and raise accumulation when the plan exceeds the budget.
    #[serde(default)]
    pub auto_fit: bool,
    /// On resume, continue from intact weights with fresh optimizer state when the newest
    /// checkpoint's optimizer state is damaged ([`crate::train::TrainRequest::fresh_optimizer`]).
    #[serde(default)]
    pub fresh_optimizer: bool,
    /// Skip class folders without images instead of failing.
    #[serde(default)]
    pub allow_empty_classes: bool,
    /// Run the overfit check (`vramfit train --overfit-check`) instead of training.
    #[serde(default)]
    pub overfit_check: bool,
}

impl TrainingSpec {
    /// A new run of `config` into `out_dir` on `device`, with the bundled data and no options.
    pub fn new(config: Config, device: DeviceChoice, out_dir: PathBuf) -> Self {
        Self {
            config,
            data_dir: None,
            device,
            replicas: Vec::new(),
            out_dir,
            resume: false,
            max_steps: None,
            auto_fit: false,
            fresh_optimizer: false,
            allow_empty_classes: false,
            overfit_check: false,
        }
    }

    /// The flags of a `vramfit train --resume` command that choose this run's devices again:
    /// [`DeviceChoice::flags`] of the device, or `--devices` with every device of a
    /// data-parallel run ([`DeviceChoice::list_flag`]).
    pub fn device_flags(&self) -> String {
        if self.replicas.is_empty() {
            self.device.flags()
        } else {
            DeviceChoice::list_flag(&[&[self.device], self.replicas.as_slice()].concat())
        }
    }

    /// The parent's first line to the child (without the newline).
    ///
    /// # Errors
    /// [`Error::Worker`] naming the folder when a path is not valid UTF-8 (JSON carries text
    /// only): rename it, or move the data or the run folder to a path that is.
    pub fn job_line(&self) -> Result<String> {
        let json = serde_json::to_string(self).map_err(|e| {
            let paths = [Some(&self.out_dir), self.data_dir.as_ref()];
            let bad = paths.into_iter().flatten().find(|p| p.to_str().is_none());
            let named = bad.map_or_else(|| e.to_string(), |p| format!("{} is not valid UTF-8", p.display()));
            Error::Worker(format!(
                "cannot pass the run to the training process: {named}; rename the folder or choose one whose \
                 path is valid UTF-8"
            ))
        })?;
        Ok(format!("{JOB_PREFIX}{json}"))
    }

    /// Child side: the spec in the parent's first line.
    ///
    /// # Errors
    /// [`Error::Worker`] when the line is not a job line of this version of vramfit.
    pub fn from_job_line(line: &str) -> Result<Self> {
        let json = line.trim_end().strip_prefix(JOB_PREFIX).ok_or_else(|| {
            Error::Worker("a training worker reads its job from its parent (`vramfit train` starts it)".into())
        })?;
        serde_json::from_str(json).map_err(|e| Error::Worker(format!("unreadable job from the parent process: {e}")))
    }
}

/// A training run in a worker process: what to train and how to start the worker
/// ([`crate::engine::session::Job::TrainInWorker`]).
#[derive(Clone, Debug)]
pub struct WorkerJob {
    /// The run.
    pub spec: TrainingSpec,
    /// The executable and environment.
    pub launch: WorkerLaunch,
}

/// Runs `job` in a worker process and waits for it: the child gets the job line, then `stop`
/// once `stop` is set (and is killed when it has not ended [`WORKER_STOP_GRACE`] later) and each
/// change of `budget`; everything it says goes to `on_output` as it arrives. Returns how it
/// ended.
///
/// # Errors
/// [`Error::Io`] when the process cannot be started; [`Error::Worker`] when it is lost, or
/// the run cannot be written as its job line ([`TrainingSpec::job_line`]).
pub fn supervise_with(
    job: &WorkerJob,
    on_output: &mut dyn FnMut(Output),
    stop: &StopSignal,
    budget: &LiveBudget,
) -> Result<End> {
    let spec = &job.spec;
    let job_line = spec.job_line()?;
    let io = |e: std::io::Error| Error::io(&spec.out_dir, format!("cannot start the training process: {e}"));
    let (tx, output) = std::sync::mpsc::channel();
    let args: [OsString; 2] = ["train".into(), "--worker".into()];
    let mut process =
        WorkerProcess::spawn(&job.launch.exe, &args, &job.launch.env, &spec.out_dir, spec.device_flags(), tx, || {})
            .map_err(io)?;
    process.send(&job_line);
    let (mut budget_sent, mut stop_sent) = (spec.config.memory.memory_budget_bytes, None);
    let mut ended_before_first_step = false;
    loop {
        match output.recv_timeout(std::time::Duration::from_millis(50)) {
            Ok(item) => on_output(item),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        match stop_sent {
            None if stop.is_set() => {
                process.stop();
                stop_sent = Some(std::time::Instant::now());
            }
            Some(at) if !process.has_stepped() && at.elapsed() > FIRST_STEP_STOP_GRACE && !ended_before_first_step => {
                process.kill();
                ended_before_first_step = true;
            }
            // A worker stuck below the engine (in the driver) would hold its client forever.
            Some(at) if at.elapsed() > WORKER_STOP_GRACE => process.kill(),
            _ => {}
        }
        if budget.get() != budget_sent {
            budget_sent = budget.get();
            process.set_budget(budget_sent);
        }
    }
    let end = process.wait().map_err(|e| Error::Worker(format!("lost the training process: {e}")))?;
    Ok(match end {
        End::Crashed(_) if ended_before_first_step => End::StoppedBeforeFirstStep,
        end => end,
    })
}

/// [`supervise_with`] for a client of events: the child's events go to `sink`, its other
/// output lines as [`Event::Info`]; its summary is returned.
///
/// # Errors
/// As [`supervise_with`]; [`Error::Worker`] with the error the worker explained, or its crash
/// report.
pub fn supervise(
    job: &WorkerJob,
    sink: &mut dyn FnMut(Event),
    stop: &StopSignal,
    budget: &LiveBudget,
) -> Result<RunEnd> {
    let mut finished = None;
    let mut on_output = |item| match item {
        Output::Event(Event::Finished(end)) => finished = Some(end),
        Output::Event(e) => sink(e),
        Output::Stdout(line) | Output::Stderr(line) if !line.trim().is_empty() => sink(Event::Info(line)),
        Output::Stdout(_) | Output::Stderr(_) => {}
    };
    let end = supervise_with(job, &mut on_output, stop, budget)?;
    match end {
        End::Done => {
            finished.ok_or_else(|| Error::Worker("the training process ended without a summary; see the log".into()))
        }
        End::Explained { code: 130, .. } => Err(Error::Worker("the training process was interrupted".into())),
        End::Explained { message, .. } => {
            Err(Error::Worker(message.unwrap_or_else(|| "the training process failed; see the log".into())))
        }
        End::Crashed(report) => Err(Error::Worker(format!("{report}\n(the app: press Resume)"))),
        End::StoppedBeforeFirstStep => {
            // Nothing of this process to save: the run stands where its last checkpoint left it.
            let state = crate::train::checkpoint::latest(&job.spec.out_dir).ok().map(|(_, s)| s);
            Ok(RunEnd {
                stopped: true,
                global_step: state.as_ref().map_or(0, |s| s.global_step),
                epochs_completed: state.as_ref().map_or(0, |s| s.epoch),
                export_dir: None,
                val: None,
            })
        }
    }
}

/// The report for a child that died: the cause, where, its last messages, what the run folder
/// holds and the command that resumes it (at half the micro-batch when the death looks like
/// running out of memory).
pub fn crash_report(
    status: &ExitStatus,
    last_step: Option<usize>,
    tail: &[String],
    out: &Path,
    device_flags: &str,
) -> String {
    let signal = signal_of(status);
    let cause = match (signal, status.code()) {
        (Some(6), _) => "SIGABRT: aborted, e.g. by the GPU runtime".to_string(),
        (Some(9), _) => "SIGKILL: killed, by the system's out-of-memory killer or kill -9".to_string(),
        (Some(11), _) => "SIGSEGV: a segmentation fault, typically in the GPU driver".to_string(),
        (Some(s), _) => format!("signal {s}"),
        (None, Some(101)) => "a panic (exit status 101)".to_string(),
        (None, Some(c)) => format!("exit status {c}"),
        (None, None) => "an unknown cause".to_string(),
    };
    let text = tail.join("\n").to_lowercase();
    let out_of_memory = signal == Some(9)
        || ["out of memory", "outofmemory", "oom", "cannot allocate"].iter().any(|k| text.contains(k));
    let mut report = format!(
        "the training process died ({cause}) {}",
        last_step.map_or("before its first step".to_string(), |s| format!("after step {s}"))
    );
    if !tail.is_empty() {
        report += &format!("; its last messages:\n  {}", tail.join("\n  "));
    }
    let held = crate::train::checkpoint::describe_run(out).unwrap_or_else(|| "no checkpoint yet".into());
    let mut resume = format!("vramfit train --resume --out {}{device_flags}", out.display());
    if out_of_memory {
        let batch = crate::train::run_dir::load_config(out).map_or(2, |(c, _)| c.train.batch_size);
        resume += &format!(" --batch-size {}", (batch / 2).max(1));
        report += "\nthis looks like running out of memory (device or machine): resume at half the micro-batch";
    }
    report + &format!("\nthe run folder is intact ({held}); continue with: {resume}")
}

#[cfg(unix)]
fn signal_of(status: &ExitStatus) -> Option<i32> {
    std::os::unix::process::ExitStatusExt::signal(status)
}

#[cfg(not(unix))]
fn signal_of(_status: &ExitStatus) -> Option<i32> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_line_reads_back_as_the_same_run_and_other_lines_are_refused() {
        let mut config = Config::default();
        config.train.epochs = 7;
        let spec = TrainingSpec {
            data_dir: Some("/data/Fotos März".into()),
            resume: true,
            max_steps: Some(12),
            auto_fit: true,
            ..TrainingSpec::new(config, DeviceChoice::Gpu(Some(1)), "runs/a b".into())
        };
        let line = spec.job_line().unwrap();
        assert!(line.starts_with(JOB_PREFIX) && !line.contains('\n'), "{line}");
        assert_eq!(TrainingSpec::from_job_line(&format!("{line}\n")).unwrap(), spec);
        let err = TrainingSpec::from_job_line("stop").unwrap_err().to_string();
        assert!(err.contains("reads its job from its parent"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn a_path_that_is_not_utf8_is_named_not_sent_empty() {
        use std::os::unix::ffi::OsStrExt;
        let out = PathBuf::from(std::ffi::OsStr::from_bytes(b"/runs/M\xe4rz"));
        let spec = TrainingSpec::new(Config::default(), DeviceChoice::Gpu(None), out);
        let err = spec.job_line().unwrap_err().to_string();
        assert!(err.contains("is not valid UTF-8") && err.contains("/runs/M"), "{err}");
    }
}
