//! Fault injection for the crash tests: `VRAMFIT_FAULT=KIND@POINT` makes the process die at a
//! chosen moment, so a test can reproduce a crash deterministically. Unset, every call is one
//! environment lookup.
//!
//! - KIND: `abort` (`std::process::abort`, SIGABRT), `kill` (SIGKILL to itself, as the
//!   out-of-memory killer or `kill -9`), `exit` (status 3), `panic`, `hang` (the training
//!   thread sleeps 10 minutes, as a first step compiling its kernels for minutes does).
//! - POINT: `N` (when step N is reported, in the training worker), `started` (in the training
//!   loop, after the run's start is reported and before its first step) or `save:N` (in the N-th checkpoint save of the
//!   process, after the weights are written and before the checksums, i.e. mid-save).

use std::sync::atomic::{AtomicUsize, Ordering};

static SAVES: AtomicUsize = AtomicUsize::new(0);

/// A fault point at optimizer step `step`.
pub fn at_step(step: usize) {
    hit(&step.to_string());
}

/// A fault point when a run's start is reported, before its first step.
pub fn at_start() {
    hit("started");
}

/// A fault point in the middle of a checkpoint save (counted per process).
pub fn in_save() {
    let n = SAVES.fetch_add(1, Ordering::SeqCst) + 1;
    hit(&format!("save:{n}"));
}

fn hit(point: &str) {
    let Ok(spec) = std::env::var("VRAMFIT_FAULT") else { return };
    let Some((kind, at)) = spec.split_once('@') else { return };
    if at != point {
        return;
    }
    eprintln!("VRAMFIT_FAULT: {kind} at {point}");
    match kind {
        "abort" => std::process::abort(),
        "exit" => std::process::exit(3),
        "panic" => panic!("VRAMFIT_FAULT panic at {point}"),
        "hang" => std::thread::sleep(std::time::Duration::from_secs(600)),
        "kill" => {
            let _ = std::process::Command::new("kill").args(["-9", &std::process::id().to_string()]).status();
            std::thread::sleep(std::time::Duration::from_secs(60));
        }
        _ => {}
    }
}
