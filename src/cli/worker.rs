//! `vramfit train` runs its engine in a child process: the same binary with the same arguments
//! plus the hidden `--worker` flag. A crash below the engine (a segfault in the GPU driver, an
//! abort in the GPU runtime, the kernel's out-of-memory killer, `kill -9`) ends only the child;
//! the parent says what happened and how to resume, and the run folder keeps its last checkpoint.
//!
//! Protocol, child to parent:
//! - stdout: each engine event as one line, [`EVENT_PREFIX`] then the event as JSON
//!   ([`crate::events::Event`]); every other line is the child's own output, printed as is.
//! - stderr: passed through; its last [`STDERR_TAIL`] lines are kept for the report.
//! - exit: 0 done, 1 or 2 an error the child has already explained, 130 a second Ctrl-C;
//!   anything else (a signal, a panic's 101) is a crash that the parent reports.
//!
//! Ctrl-C reaches both processes; the child stops after its step with a checkpoint and the parent
//! waits for it. Parent to child: the child's stdin; a `stop` line, or its end (the parent died),
//! stops the run the same way. Fault injection for tests: [`crate::fault`].

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::Context;

use super::render::Renderer;
use crate::events::Event;

/// Marks an event line on the child's stdout.
pub const EVENT_PREFIX: &str = "\u{1e}vramfit-event ";
/// Lines of the child's stderr kept for the crash report.
pub const STDERR_TAIL: usize = 12;

/// Child side: writes one event line to stdout (flushed, so the parent sees it at once).
pub fn emit(event: &Event) {
    let line = serde_json::to_string(event).unwrap_or_else(|e| {
        serde_json::to_string(&Event::Warning(format!("an event could not be encoded: {e}"))).unwrap_or_default()
    });
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{EVENT_PREFIX}{line}");
    let _ = out.flush();
}

/// Child side: stops the run (after its step, with a checkpoint) when the parent writes `stop` on
/// the child's stdin or when stdin closes, which is what happens when the parent dies: a worker
/// never trains on alone.
pub fn stop_on_parent_request(stop: crate::events::StopSignal) {
    let _ = std::thread::Builder::new().name("vramfit-parent".into()).spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(l) if l.trim() == "stop" => break,
                Ok(_) => {}
                Err(_) => break,
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
    let mut child = Command::new(exe)
        .args(&args)
        .stdin(Stdio::piped()) // kept open while the parent lives: its end tells the child to stop
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start the training process")?;
    let tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
    let stderr = child.stderr.take().map(|err| {
        let tail = tail.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("{line}");
                let mut t = tail.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if t.len() == STDERR_TAIL {
                    t.pop_front();
                }
                t.push_back(line);
            }
        })
    });
    let (mut renderer, mut epochs, mut last_step) = (Renderer::default(), 0, None);
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            match line.strip_prefix(EVENT_PREFIX).map(serde_json::from_str::<Event>) {
                Some(Ok(event)) => {
                    if let Event::Step { step, .. } = &event {
                        last_step = Some(*step);
                    }
                    renderer.handle(&event, &mut epochs);
                }
                Some(Err(e)) => eprintln!("warning: unreadable event from the training process: {e}"),
                None => println!("{line}"),
            }
        }
    }
    renderer.finish();
    let status = child.wait().context("lost the training process")?;
    if let Some(t) = stderr {
        let _ = t.join();
    }
    match status.code() {
        Some(0) => return Ok(ExitCode::SUCCESS),
        // 1 and 2: an error the child explained; 130: a second Ctrl-C, the user's choice.
        Some(c @ (1 | 2 | 130)) => return Ok(ExitCode::from(c as u8)),
        _ => {}
    }
    let tail: Vec<String> = tail.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().cloned().collect();
    eprintln!("{}", crash_report(&status, last_step, &tail, out, gpu));
    Ok(ExitCode::FAILURE)
}

/// What the parent prints when the training process died: the cause, where it was, its last
/// messages, what the run folder holds and the command that resumes it (at half the micro-batch
/// when the death looks like running out of memory).
fn crash_report(
    status: &std::process::ExitStatus,
    last_step: Option<usize>,
    tail: &[String],
    out: &Path,
    gpu: bool,
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
        "error: the training process died ({cause}) {}",
        last_step.map_or("before its first step".to_string(), |s| format!("after step {s}"))
    );
    if !tail.is_empty() {
        report += &format!("; its last messages:\n  {}", tail.join("\n  "));
    }
    let held = crate::checkpoint::describe_run(out).unwrap_or_else(|| "no checkpoint yet".into());
    let mut resume = format!("vramfit train --resume --out {}", out.display());
    if !gpu {
        resume += " --device cpu";
    }
    if out_of_memory {
        let batch = crate::run_dir::load_config(out).map_or(2, |(c, _)| c.train.batch_size);
        resume += &format!(" --batch-size {}", (batch / 2).max(1));
        report += "\nthis looks like running out of memory (device or machine): resume at half the micro-batch";
    }
    report + &format!("\nthe run folder is intact ({held}); continue with: {resume}")
}

#[cfg(unix)]
fn signal_of(status: &std::process::ExitStatus) -> Option<i32> {
    std::os::unix::process::ExitStatusExt::signal(status)
}

#[cfg(not(unix))]
fn signal_of(_status: &std::process::ExitStatus) -> Option<i32> {
    None
}
