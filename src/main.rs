//! The `vramfit` command line: `vramfit --help`.

fn main() -> std::process::ExitCode {
    keep_freed_memory();
    private_runtime_dir();
    quiet_broken_pipe();
    vramfit::cli::main(vramfit::cli::App { open: vramfit::gui::run, bench_ui: vramfit::gui::bench_ui_report })
}

/// Makes glibc's allocator keep freed memory for reuse instead of returning it to the kernel.
///
/// A CPU training step allocates and frees the same large activation buffers every step. By
/// default glibc serves each from a fresh `mmap` and unmaps it on free, so every step faults in
/// and clears the same pages again and flushes TLBs (`perf`: 11% of a flex 12gb step in the
/// kernel). With `mmap` off and trimming off, freed blocks return to the heap and the next step
/// reuses them. One arena: a thread's own arena (the engine thread, rayon's workers) serves
/// requests over its 64 MiB heap size from `mmap` whatever `M_MMAP_MAX` says, so every thread
/// shares the main heap instead (2 cores: no measurable lock contention). Measured with
/// `farm-bench`: `bench train -c 12gb --backends flex --steps 2` (main thread) wall 0.88x, system
/// time 3.5 s -> 1.6 s; `train -c 12gb --device cpu --max-steps 2` (the engine thread), one
/// arena against these settings without it: wall 0.86x, system 2.4 s -> 1.2 s, peak RSS
/// 2.25 -> 2.06 GB. The cost: the process keeps its high-water mark of host memory until it
/// exits.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const TOP_PAD_BYTES: libc::c_int = 256 << 20;
        // SAFETY: mallopt only changes allocator parameters; it is called before any thread
        // starts, and every value is within glibc's documented range.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
            libc::mallopt(libc::M_MMAP_MAX, 0);
            libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX);
            libc::mallopt(libc::M_TOP_PAD, TOP_PAD_BYTES);
        }
    }
}

/// Lets a command whose output is piped into a reader that stops early (`vramfit eval | head`)
/// end quietly, as Unix tools do, instead of panicking on the broken pipe: SIGPIPE's default
/// action is restored. Not in a training worker (`train --worker`), whose parent may go away:
/// it must see the write fail, stop after its step and save a checkpoint.
fn quiet_broken_pipe() {
    #[cfg(unix)]
    if !std::env::args_os().any(|a| a == "--worker") {
        // SAFETY: called first thing in main, before any thread exists; SIG_DFL is a valid
        // disposition for SIGPIPE.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
}

/// Gives the process a private runtime directory when `XDG_RUNTIME_DIR` is unset or not a
/// folder (a container, `sudo`, a service): Mesa's Vulkan drivers otherwise print "error:
/// XDG_RUNTIME_DIR is invalid or not set in the environment." once per instance they create,
/// which a user reads as vramfit's error. The folder is `$TMPDIR/vramfit-runtime-<uid>`, mode
/// 0700 as the XDG spec asks; a worker process inherits it.
fn private_runtime_dir() {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        if std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|d| std::path::Path::new(&d).is_dir()) {
            return;
        }
        let uid = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
        let dir = std::env::temp_dir().join(format!("vramfit-runtime-{uid}"));
        let _ = std::fs::create_dir(&dir);
        // Used only when it is a real folder (not a link someone else planted) of this user's.
        let ours = std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir() && m.uid() == uid);
        let ready = ours && std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).is_ok();
        if ready {
            // SAFETY: called first thing in main, before any thread exists, so no other thread
            // can read the environment while it changes.
            unsafe { std::env::set_var("XDG_RUNTIME_DIR", &dir) };
        }
    }
}
