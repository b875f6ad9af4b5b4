//! `vramfit train`: a new run, `--resume`, or `--overfit-check`. Without `--worker` the command
//! starts itself again as a child process (see [`super::worker`]) so that a driver crash cannot
//! take the terminal's process down; the child runs the engine and streams its events back.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;

use super::commands::{open_data, select_device};
use super::{ConfigArgs, DeviceArgs, DevicesArgs};
use crate::config::Config;
use crate::data::dataset;
use crate::device::{CpuBackend, DeviceChoice, SelectedDevice};
use crate::engine::session::{Job, JobOutput, Session};
use crate::engine::words::count;
use crate::engine::worker::TrainingSpec;
use crate::memory::human_bytes;
use crate::train::run_dir::DATA_NOTE;
use crate::train::{self, TrainRequest};

/// `vramfit train`.
#[derive(Args, Debug)]
pub struct TrainArgs {
    #[command(flatten)]
    config: ConfigArgs,
    #[command(flatten)]
    device: DeviceArgs,
    #[command(flatten)]
    devices: DevicesArgs,
    /// Dataset: ImageFolder (root/<class>/*.jpg, or root/train + root/val), an IDX folder, or a labels
    /// CSV file (path,label[,split] rows, paths relative to it).
    /// Default: the bundled Fashion-MNIST subset.
    #[arg(value_parser = crate::data::user_path::UserPathParser, long)]
    data: Option<PathBuf>,
    /// Run folder (default runs/<date-time>).
    #[arg(value_parser = crate::data::user_path::UserPathParser, long)]
    out: Option<PathBuf>,
    /// Continue the run in --out from its latest checkpoint (its config.toml is used).
    #[arg(long)]
    resume: bool,
    /// When the predicted peak exceeds the budget, shrink the micro-batch and raise accumulation.
    #[arg(long)]
    auto_fit: bool,
    /// With --resume: when the newest checkpoint's optimizer state is damaged, continue from its
    /// intact weights with fresh optimizer state (the step count is kept) instead of an older
    /// checkpoint.
    #[arg(long, requires = "resume")]
    fresh_optimizer: bool,
    /// Train on 64 images for 200 steps and check the network memorizes them (>= 98%).
    #[arg(long)]
    overfit_check: bool,
    /// Stop at this global optimizer step, counted over the whole run (a checkpoint is written; --resume continues).
    #[arg(long, value_parser = parse_max_steps)]
    max_steps: Option<usize>,
    /// Skip class folders without images (with a warning) instead of failing.
    #[arg(long)]
    allow_empty_classes: bool,
    /// Internal: this process is the training worker of a parent `vramfit train` ([`super::worker`]).
    #[arg(long, hide = true)]
    worker: bool,
}

/// Runs `job` on an engine [`Session`] in the worker process, its events passed to the parent;
/// Ctrl-C and the parent's `stop` stop it cleanly.
fn run_engine(job: Job) -> anyhow::Result<JobOutput> {
    let session = Session::start(|| {})?;
    super::worker::stop_on_ctrl_c(session.stop_signal());
    // Submitted before the parent's lines are read, so a `stop` or `budget` that was sent early
    // is applied after the job's reset, never overwritten by it.
    session.submit(job)?;
    super::worker::obey_parent(session.stop_signal(), Some(session.budget()));
    let result = session.wait(&mut |event| {
        super::worker::note_progress(&event);
        super::worker::inject_fault(&event);
        super::worker::emit(&event);
    });
    match result {
        Err(crate::Error::Crashed(msg)) => {
            bail!("the engine crashed ({msg}); the last checkpoint is intact: rerun with --resume --out <run folder>")
        }
        other => Ok(other?),
    }
}

/// `vramfit train`: the run resolved here (the config with its overrides, the run folder), then
/// trained in a worker process (see [`super::worker`]), or, in that worker, the job it reads.
///
/// # Errors
/// Bad arguments, an unusable config or dataset, a run folder that already holds a run, or the
/// engine's error.
pub fn train(args: TrainArgs) -> anyhow::Result<ExitCode> {
    if args.worker {
        return run_job(super::worker::read_job()?);
    }
    if args.resume && args.out.is_none() {
        bail!("--resume continues a run: name its folder with --out (e.g. --resume --out runs/2026-11-30_15-42-07)");
    }
    // Two runs started within a second get `-2`, `-3`, ... rather than one refusing the other.
    let out = args.out.clone().unwrap_or_else(|| crate::train::run_dir::new_run_dir(Path::new("runs")));
    let config = if args.resume { resumed_config(&args, &out)? } else { new_run_config(&args, &out)? };
    let (device, replicas) = args.devices.choices(&args.device)?;
    if !replicas.is_empty() && args.overfit_check {
        bail!("--overfit-check trains on one device: drop --devices, or give --device");
    }
    let spec = TrainingSpec {
        data_dir: args.data.clone(),
        resume: args.resume,
        max_steps: args.max_steps,
        auto_fit: args.auto_fit,
        fresh_optimizer: args.fresh_optimizer,
        allow_empty_classes: args.allow_empty_classes,
        overfit_check: args.overfit_check,
        replicas,
        ..TrainingSpec::new(config, device, out)
    };
    // The engine trains in a child process, so a driver crash cannot take this one down.
    super::worker::train_in_child(spec)
}

/// `--max-steps`: a whole number of at least 1 (0 would train nothing and still write a run).
fn parse_max_steps(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("0 steps would train nothing: give at least 1, or leave --max-steps out".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("expected a whole number of steps ({e})")),
    }
}

/// The worker's side of `vramfit train`: runs `spec` on an engine session, its events to the
/// parent.
fn run_job(spec: TrainingSpec) -> anyhow::Result<ExitCode> {
    // Every device is opened (a server connected, its token checked) before the run folder is made.
    let device = select_device(spec.device)?;
    let replicas = spec.replicas.iter().map(|&choice| select_device(choice)).collect::<anyhow::Result<Vec<_>>>()?;
    let data = data_folder(&spec)?;
    let splits = open_data(data.as_ref(), &spec.config, spec.allow_empty_classes)?;
    eprintln!("data: {}", splits.description);
    if spec.overfit_check {
        return overfit_check(spec.config, device, splits.train);
    }
    let out = spec.out_dir.clone();
    let resume_flags = if spec.replicas.is_empty() { device_flags(&device, spec.device) } else { spec.device_flags() };
    let mut req = TrainRequest::new(spec.config, &out);
    req.resume = spec.resume;
    req.auto_fit = spec.auto_fit;
    req.fresh_optimizer = spec.fresh_optimizer;
    req.max_steps = spec.max_steps;
    req.replicas = replicas;
    let names: Vec<&str> = std::iter::once(&device).chain(&req.replicas).map(|d| d.name.as_str()).collect();
    let devices = names.join(" + ");
    let spec_max_steps = spec.max_steps;
    let job = Job::Train { request: Box::new(req), splits, device };
    let JobOutput::Trained(summary) = run_engine(job)? else { bail!("the engine returned another job's output") };
    print_summary(&summary, &devices, &out, spec_max_steps, &resume_flags);
    Ok(ExitCode::SUCCESS)
}

/// The config of the run in `out`, with the command line's overrides (the run refuses those
/// that may not change on resume, [`Config::changes_on_resume`], and announces the others).
fn resumed_config(args: &TrainArgs, out: &Path) -> anyhow::Result<Config> {
    let (mut config, notes) = crate::train::run_dir::load_config(out)
        .with_context(|| format!("--resume needs the run folder given with --out ({})", out.display()))?;
    for note in notes {
        eprintln!("note: {note}");
    }
    if args.config.config != "quickstart" {
        eprintln!(
            "warning: --config {} is not used on resume: the run continues with its own config.toml \
             (overrides such as --epochs apply)",
            args.config.config
        );
    }
    args.config.apply_to(&mut config)?;
    Ok(config)
}

/// The config of a new run; refuses an `out` that already holds a run.
fn new_run_config(args: &TrainArgs, out: &Path) -> anyhow::Result<Config> {
    crate::train::checkpoint::refuse_existing_run(out)?;
    Ok(args.config.load()?)
}

/// The dataset folder: the spec's, or on resume the one the run folder remembers (`data.txt`,
/// written by the run once it holds the folder); `None` is the bundled subset. A new run's
/// folder is made here (the worker starts in it).
fn data_folder(spec: &TrainingSpec) -> anyhow::Result<Option<PathBuf>> {
    let out = &spec.out_dir;
    let data_note = out.join(DATA_NOTE);
    let data = match (&spec.data_dir, spec.resume) {
        (Some(d), _) => Some(d.clone()),
        (None, true) => std::fs::read_to_string(&data_note).ok().map(|s| PathBuf::from(s.trim_end())),
        (None, false) => None,
    };
    if !spec.resume && !spec.overfit_check {
        let path = data.clone().map_or_else(dataset::bundled_dataset_dir, |d| d.canonicalize().unwrap_or(d));
        crate::train::run_dir::create(out, &path)?;
    }
    Ok(data)
}

/// `--overfit-check`: up to 200 steps on 64 images; PASS when they are memorized (>= 98%).
fn overfit_check(config: Config, device: SelectedDevice, train_ds: dataset::Dataset) -> anyhow::Result<ExitCode> {
    let images = train_ds.samples.len().min(64);
    let job = Job::OverfitCheck {
        config: Box::new(config),
        train: train_ds,
        device: device.clone(),
        steps: crate::train::OVERFIT_CHECK_STEPS,
    };
    let JobOutput::OverfitChecked(result) = run_engine(job)? else { bail!("the engine returned another job's output") };
    println!(
        "overfit check on {}: {} after {} steps, accuracy on the {} {:.1}% (needs 98%)",
        device.name,
        if result.passed { "PASS" } else { "FAIL" },
        result.steps,
        count(images, "image"),
        result.accuracy * 100.0
    );
    Ok(if result.passed { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The lines printed after a run: accuracy, throughput, memory, skips and what to do next.
/// The device flags that select `device` again (chosen as `choice`) for a resume command: none
/// for the default device's adapter, `--device gpu` for the default adapter asked for by
/// `--device gpu`, `--adapter N`, or `--device cpu` with a CPU backend other than the default
/// (also when a GPU was asked for and the CPU was used for want of one).
fn device_flags(device: &SelectedDevice, choice: DeviceChoice) -> String {
    match choice {
        // A GPU asked for (or the default) and the CPU used: the hint names the CPU.
        DeviceChoice::Auto | DeviceChoice::Gpu(_) if !device.is_gpu() => DeviceChoice::Cpu(CpuBackend::DEFAULT).flags(),
        choice => choice.flags(),
    }
}

fn print_summary(
    summary: &train::TrainSummary,
    devices: &str,
    out: &Path,
    max_steps: Option<usize>,
    resume_flags: &str,
) {
    if let Some(val) = &summary.val {
        println!(
            "validation accuracy {} (top-5 {}) on {} after {}, {}, {:.0} s on {}",
            crate::inference::eval::percent_or_na(val.top1),
            crate::inference::eval::percent_or_na(val.top5),
            count(val.samples, "image"),
            count(summary.epochs_completed, "epoch"),
            count(summary.global_step, "step"),
            summary.wall_secs,
            devices
        );
    }
    println!("training throughput {:.0} images/s", summary.images_per_sec);
    if summary.memory.peak_bytes_reserved > 0 {
        println!(
            "memory: predicted peak {}, measured {} reserved ({} in use after forward)",
            human_bytes(summary.predicted_peak_bytes),
            human_bytes(summary.memory.peak_bytes_reserved),
            human_bytes(summary.memory.peak_bytes_in_use)
        );
    }
    if summary.skipped > 0 {
        println!(
            "{} samples were skipped in all (each epoch counts them again; the warnings name the files and why)",
            summary.skipped
        );
    }
    if summary.stopped {
        let why = match max_steps {
            Some(cap) if summary.global_step >= cap => format!("reached --max-steps {cap}"),
            _ => "stopped".to_string(),
        };
        println!("{why}; continue with: vramfit train --resume --out {}{resume_flags}", out.display());
    } else if let Some(dir) = &summary.export_dir {
        println!("run folder {}; exported weights in {}", out.display(), dir.display());
    }
}

#[cfg(test)]
mod tests {
    use crate::device::{self, CpuBackend, DeviceChoice};

    #[test]
    fn resume_hints_select_the_same_device_again() {
        let ndarray = device::select(DeviceChoice::Cpu(CpuBackend::Ndarray)).unwrap();
        let flags = super::device_flags(&ndarray, DeviceChoice::Cpu(CpuBackend::Ndarray));
        assert_eq!(flags, " --device cpu --cpu-backend ndarray");
        let flex = device::select(DeviceChoice::Cpu(CpuBackend::Flex)).unwrap();
        assert_eq!(super::device_flags(&flex, DeviceChoice::Cpu(CpuBackend::Flex)), " --device cpu");
        // A GPU asked for, the CPU used for want of one: the hint names the CPU.
        assert_eq!(super::device_flags(&flex, DeviceChoice::Gpu(None)), " --device cpu");
        // The default device chose the CPU (only a software adapter here): the hint keeps it there.
        assert_eq!(super::device_flags(&flex, DeviceChoice::Auto), " --device cpu");
    }
}
