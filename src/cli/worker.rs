//! `vramfit train` runs its engine in a child process: the same binary with the same arguments
//! plus the hidden `--worker` flag ([`crate::engine::worker`] has the protocol and the parent's
//! side). This file is the child's side, and the CLI as a parent: it renders the child's events
//! and prints its crash report. Ctrl-C reaches both processes; the child stops after its step
//! with a checkpoint and the parent waits for it. Fault injection for tests: [`crate::fault`].

use std::ffi::OsString;
use std::io::{BufRead, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use super::render::Renderer;
use crate::engine::events::{Event, LiveBudget, StopSignal};
use crate::engine::worker::{End, Output, WorkerProcess};

/// Child side: writes one event line to stdout (flushed, so the parent sees it at once).
pub fn emit(event: &Event) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", crate::engine::worker::event_line(event));
    let _ = out.flush();
}

/// Child side: obeys the parent's lines on stdin: `stop` stops the run (after its step, with a
/// checkpoint), `budget BYTES` moves the live memory budget. The end of stdin, which is what
/// happens when the parent dies, stops the run too: a worker never trains on alone.
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
        stop.stop();
    });
}

/// Child side: the fault point of a reported step ([`crate::fault`], tests only).
pub fn inject_fault(event: &Event) {
    if let Event::Step { step, .. } = event {
        crate::fault::at_step(*step);
    }
}

/// Parent side: runs `vramfit train` (these arguments, `--out` resolved to `out`) in a child
/// process, renders its events, and reports a crash. Returns the exit code to use.
///
/// # Errors
/// When the child cannot be started.
pub fn train_in_child(out: &Path, out_given: bool, gpu: bool) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find the vramfit executable to start the training process")?;
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if !out_given {
        args.extend(["--out".into(), out.as_os_str().to_owned()]);
    }
    args.push("--worker".into());
    // Ctrl-C is for the child (it stops with a checkpoint); the parent waits for it.
    let _ = ctrlc::set_handler(|| {});
    let (tx, rx) = std::sync::mpsc::channel();
    let mut child =
        WorkerProcess::spawn(&exe, &args, &[], out, gpu, tx, || {}).context("cannot start the training process")?;
    let (mut renderer, mut epochs) = (Renderer::default(), 0);
    for item in rx {
        match item {
            Output::Event(event) => renderer.handle(&event, &mut epochs),
            Output::Stdout(line) => println!("{line}"),
            Output::Stderr(line) => eprintln!("{line}"),
        }
    }
    renderer.finish();
    match child.wait().context("lost the training process")? {
        End::Done => Ok(ExitCode::SUCCESS),
        // An error the child explained, or a second Ctrl-C: the user's choice.
        End::Explained { code, .. } => Ok(ExitCode::from(code as u8)),
        End::Crashed(report) => {
            eprintln!("error: {report}");
            Ok(ExitCode::FAILURE)
        }
    }
}
