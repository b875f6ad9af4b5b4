//! `vramfit train` runs its engine in a child process: the same binary as `vramfit train
//! --worker`, which reads its job from its stdin ([`crate::engine::worker`] has the protocol and
//! the parent's loop). This file is the child's side, and the CLI as a parent: it renders the
//! child's events and prints its crash report. Ctrl-C reaches both processes; the child stops
//! after its step with a checkpoint and the parent waits for it. Fault injection for tests:
//! [`crate::fault`].

use std::io::{BufRead, Write};
use std::process::ExitCode;

use anyhow::Context;

use super::render::Renderer;
use crate::engine::events::{Event, LiveBudget, StopSignal};
use crate::engine::worker::{End, Output, TrainingSpec, WorkerJob, WorkerLaunch, supervise_with};

/// Child side: writes one event line to stdout (flushed, so the parent sees it at once).
pub fn emit(event: &Event) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", crate::engine::worker::event_line(event));
    let _ = out.flush();
}

/// Child side: the job, the parent's first line on stdin.
///
/// # Errors
/// When stdin cannot be read or its first line is not a job.
pub fn read_job() -> anyhow::Result<TrainingSpec> {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).context("cannot read the job from the parent process")?;
    Ok(TrainingSpec::from_job_line(&line)?)
}

/// Child side: whether this worker has finished a step ([`note_progress`]).
static STEPPED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Child side: notes a finished step among the events the worker relays.
pub fn note_progress(event: &Event) {
    if matches!(event, Event::Step { .. }) {
        STEPPED.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Child side: obeys the parent's lines on stdin: `stop` stops the run (after its step, with a
/// checkpoint), `budget BYTES` moves the live memory budget. The end of stdin, which is what
/// happens when the parent dies (a second Ctrl-C, SIGTERM, a kill), stops the run too: a worker
/// never trains on alone. One that has not finished a step yet (its first step may compile
/// kernels for minutes, holding the run folder's lock) exits at once: it has nothing to save.
pub fn obey_parent(stop: StopSignal, budget: Option<LiveBudget>) {
    let _ = std::thread::Builder::new().name("vramfit-parent".into()).spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            let line = line.trim();
            if line == "stop" {
                // Keep reading: the end of stdin must still be noticed.
                stop.stop();
                continue;
            }
            if let (Some(bytes), Some(b)) = (line.strip_prefix("budget ").and_then(|v| v.parse().ok()), &budget) {
                b.set(bytes);
            }
        }
        if !STEPPED.load(std::sync::atomic::Ordering::SeqCst) {
            // Not `eprintln!`: with the parent gone, stderr is a pipe nobody reads, and a failed
            // print panics this thread before the exit.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "the parent process is gone before the first step ended: exiting");
            std::process::exit(130);
        }
        stop.stop();
    });
}

/// Ctrl-C sets `stop` (the run stops after its step, with a checkpoint); a second Ctrl-C quits
/// at once with status 130. The parent's and, run alone, the worker's own handler.
pub(super) fn stop_on_ctrl_c(stop: StopSignal) {
    let _ = ctrlc::set_handler(move || {
        if stop.is_set() {
            std::process::exit(130);
        }
        eprintln!("\nstopping after this step (a checkpoint will be saved); Ctrl-C again to quit now");
        stop.stop();
    });
}

/// Child side: the fault point of a reported step ([`crate::fault`], tests only).
pub fn inject_fault(event: &Event) {
    if let Event::Step { step, .. } = event {
        crate::fault::at_step(*step);
    }
}

/// Parent side: runs `spec` in a worker process (this executable), renders its events, passes
/// its other lines through, and reports a crash. Returns the exit code to use: the child's when
/// it explained an error (or was interrupted), failure after a crash.
///
/// # Errors
/// When the child cannot be started or is lost.
pub fn train_in_child(spec: TrainingSpec) -> anyhow::Result<ExitCode> {
    // The child has a process group of its own, so Ctrl-C (or a SIGINT to this process alone)
    // comes here: the first asks the child to stop after its step, with a checkpoint;
    // a second quits at once (the child, its stdin closed, still stops and saves).
    let stop = StopSignal::default();
    stop_on_ctrl_c(stop.clone());
    let budget = LiveBudget::new(spec.config.memory.memory_budget_bytes);
    let job = WorkerJob { spec, launch: WorkerLaunch::default() };
    let (mut renderer, mut epochs) = (Renderer::default(), 0);
    let mut on_output = |item| match item {
        Output::Event(event) => renderer.handle(&event, &mut epochs),
        Output::Stdout(line) => println!("{line}"),
        Output::Stderr(line) => eprintln!("{line}"),
    };
    let end = supervise_with(&job, &mut on_output, &stop, &budget);
    renderer.finish();
    match end? {
        End::Done => Ok(ExitCode::SUCCESS),
        // An error the child explained, or a second Ctrl-C: the user's choice.
        End::Explained { code, .. } => Ok(ExitCode::from(code as u8)),
        End::Crashed(report) => {
            eprintln!("error: {report}");
            Ok(ExitCode::FAILURE)
        }
        End::StoppedBeforeFirstStep => {
            let out = &job.spec.out_dir;
            let resume = format!("vramfit train --resume --out {}{}", out.display(), job.spec.device_flags());
            match crate::train::checkpoint::latest(out) {
                Ok((_, state)) => eprintln!(
                    "stopped before step {} ended: the run stands at step {} (its checkpoint kept); continue with: {resume}",
                    state.global_step + 1,
                    state.global_step
                ),
                Err(_) => {
                    eprintln!("stopped before the first step ended (nothing to save); start it again with: {resume}")
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
