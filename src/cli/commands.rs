//! One function per subcommand. Each builds engine inputs from arguments, runs the engine and
//! prints the result.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;

use super::{ConfigArgs, DeviceArgs};
use crate::config::Config;
use crate::data::dataset::{self, ScanOptions, Splits};
use crate::device::{self, DeviceChoice, SelectedDevice};
use crate::engine::session::{Job, JobOutput, Session};
use crate::inference::eval::percent_or_na;
use crate::memory::human_bytes;
use crate::model::{self, LayerKind};

/// Runs one job without progress events (eval, predict, export) on a session of its own.
fn run_job(job: Job) -> anyhow::Result<JobOutput> {
    Ok(Session::start(|| {})?.run(job, &mut |_| {})?)
}

/// Opens `--data` (or the bundled subset) with the config's split settings.
pub(super) fn open_data(data: Option<&PathBuf>, config: &Config, allow_empty: bool) -> anyhow::Result<Splits> {
    let path = data.cloned().unwrap_or_else(dataset::bundled_dataset_dir);
    let opts = ScanOptions::of(config, allow_empty);
    let splits = dataset::open(&path, &opts)?;
    if !splits.report.empty_classes.is_empty() {
        eprintln!("warning: skipped class folders with no images: {}", splits.report.empty_classes.join(", "));
    }
    let ignored = &splits.report.ignored;
    let unsupported = ignored.iter().filter(|(_, why)| dataset::is_unsupported_format(why)).count();
    if unsupported > 0 {
        eprintln!(
            "warning: {unsupported} images in formats vramfit cannot read (HEIC, AVIF, RAW, ...) are left out: \
             convert them to JPEG or PNG (`vramfit check-data` lists them)"
        );
    }
    if ignored.len() > unsupported {
        eprintln!("note: ignored {} hidden, OS-junk or non-image files", ignored.len() - unsupported);
    }
    Ok(splits)
}

pub(super) fn select_device(choice: DeviceChoice) -> anyhow::Result<SelectedDevice> {
    let d = device::select(choice)?;
    if let Some(note) = &d.note {
        eprintln!("note: {note}");
    }
    Ok(d)
}

/// `vramfit eval`.
#[derive(Args, Debug)]
pub struct EvalArgs {
    /// Exported model: run folder, export folder, or .bpk/.safetensors file.
    #[arg(value_parser = crate::data::user_path::UserPathParser, long)]
    model: PathBuf,
    /// Dataset folder or labels CSV (default: the run's own data, named in its data.txt, else the
    /// bundled subset); its validation/test split is evaluated.
    #[arg(value_parser = crate::data::user_path::UserPathParser, long)]
    data: Option<PathBuf>,
    /// Evaluate the training split instead.
    #[arg(long, conflicts_with = "all_splits")]
    train_split: bool,
    /// Evaluate the training and validation splits together (to rank every image's label).
    #[arg(long)]
    all_splits: bool,
    #[command(flatten)]
    device: DeviceArgs,
    /// Images per batch.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Where to write the confusion matrix CSV (default: confusion.csv in the working directory).
    #[arg(value_parser = crate::data::user_path::UserPathParser, long)]
    csv: Option<PathBuf>,
    /// Skip class folders without images (with a warning) instead of failing.
    #[arg(long)]
    allow_empty_classes: bool,
    /// Where to write the images whose label the model doubts, most doubtful first (default:
    /// label_issues.csv in the working directory).
    #[arg(value_parser = crate::data::user_path::UserPathParser, long)]
    label_issues: Option<PathBuf>,
}

/// `splits` put back into the split of the run `model` names, when it is a run folder that
/// recorded one (`data_files.json`): evaluating a run on its own validation images, never on
/// images it trained on (a fresh scan of a dataset that changed since would split it anew).
fn run_split(model: &Path, splits: Splits) -> anyhow::Result<Splits> {
    let record_path = model.join(crate::train::run_dir::DATA_FILES);
    let Ok(bytes) = std::fs::read(&record_path) else { return Ok(splits) };
    let record: crate::data::split_record::SplitRecord =
        serde_json::from_slice(&bytes).with_context(|| format!("{} is unreadable", record_path.display()))?;
    let config = crate::train::run_dir::load_config(model).map(|(c, _)| c).unwrap_or_default();
    let (restored, changes, _) = record
        .apply(&splits, config.data.val_fraction)
        .map_err(|e| anyhow::anyhow!("{}: {e}", splits.root.display()))?;
    eprintln!(
        "the run's own split ({}): {} train / {} validation images",
        record_path.display(),
        restored.train.samples.len(),
        restored.val.samples.len()
    );
    if changes.any() {
        eprintln!("note: {}", changes.describe());
    }
    Ok(restored)
}

pub fn eval(args: EvalArgs) -> anyhow::Result<ExitCode> {
    let device = select_device(args.device.choice()?)?;
    let config = crate::export::load_metadata(&args.model)?.inference_config();
    // A run folder's own data when --data is not given (its data.txt names it).
    let data_path = args.data.clone().or_else(|| {
        let note = std::fs::read_to_string(args.model.join(crate::train::run_dir::DATA_NOTE)).ok()?;
        let path = PathBuf::from(note.trim_end());
        eprintln!("data: {} (the run's, from its data.txt)", path.display());
        Some(path)
    });
    let splits = run_split(&args.model, open_data(data_path.as_ref(), &config, args.allow_empty_classes)?)?;
    let root = splits.root.clone();
    let (data, split_names) = match (args.train_split, args.all_splits) {
        (true, _) => (splits.train, vec!["train"; 0]),
        (_, true) => {
            let names = [vec!["train"; splits.train.samples.len()], vec!["val"; splits.val.samples.len()]].concat();
            let mut all = splits.train;
            all.samples.extend(splits.val.samples);
            (all, names)
        }
        _ => (splits.val, vec![]),
    };
    let split_of = |i: usize| split_names.get(i).copied().unwrap_or(if args.train_split { "train" } else { "val" });
    let names: Vec<String> =
        data.samples.iter().map(|s| crate::data::health::relative_name(&s.source, &root)).collect();
    let job =
        Job::EvaluateExport { model: args.model.clone(), data, device: device.clone(), batch_size: args.batch_size };
    let JobOutput::Evaluated(r) = run_job(job)? else { bail!("the engine returned another job's output") };
    if r.samples == 0 {
        bail!(
            "no image of {} could be evaluated ({} files skipped: decoding or size): there is nothing to measure",
            data_path.as_ref().map_or_else(|| "the bundled data".to_string(), |d| d.display().to_string()),
            r.skipped.len()
        );
    }
    println!(
        "{} images on {}: top-1 {:.2}%  top-5 {:.2}%  loss {:.4}",
        r.samples,
        device.name,
        r.top1 * 100.0,
        r.top5 * 100.0,
        r.loss
    );
    println!(
        "balanced accuracy {}  macro-F1 {} (every class weighs the same{})",
        percent_or_na(r.balanced_accuracy()),
        percent_or_na(r.macro_f1()),
        if r.balanced_accuracy() < r.top1 - 0.05 { ": well under top-1, so small classes are neglected" } else { "" }
    );
    print!("{}", super::render::eval_report(&r));
    // The CSV goes to --csv or the working directory, never beside the model (which may be
    // read-only); the evaluation succeeded either way, so failing to write it is a warning.
    let csv = args.csv.unwrap_or_else(|| PathBuf::from("confusion.csv"));
    match crate::atomic_file::write_atomic(&csv, r.confusion_csv().as_bytes()) {
        Ok(()) => println!("\nconfusion matrix written to {}", csv.display()),
        Err(e) => eprintln!("warning: the confusion matrix was not saved ({e}); choose a writable file with --csv"),
    }
    write_label_issues(&r, &names, &split_of, args.label_issues.unwrap_or_else(|| PathBuf::from("label_issues.csv")));
    if !r.skipped.is_empty() {
        println!("{} files skipped:", r.skipped.len());
        for (source, reason) in r.skipped.iter().take(10) {
            println!("  {source}: {reason}");
        }
        if r.skipped.len() > 10 {
            println!("  and {} more", r.skipped.len() - 10);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `eval`'s label issues: a count, the five most doubtful, and the whole ranking as CSV at
/// `path` ([`crate::data::health::label_issues::to_csv`]); `names[i]` is the evaluated dataset's
/// image `i` and `split_of(i)` its split.
fn write_label_issues(
    r: &crate::inference::eval::EvalResult,
    names: &[String],
    split_of: &dyn Fn(usize) -> &'static str,
    path: PathBuf,
) {
    let issues = r.label_issues();
    let row_names: Vec<String> = r.sample_indices.iter().map(|&i| names[i].clone()).collect();
    let row_splits: Vec<&str> = r.sample_indices.iter().map(|&i| split_of(i)).collect();
    println!(
        "\nlabel issues: {} of {} images look mislabelled (confident learning: the model is confidently sure of \
         another class){}",
        issues.len(),
        r.samples,
        if issues.is_empty() { "" } else { "; the most doubtful:" }
    );
    for issue in issues.iter().take(5) {
        println!(
            "  {}: labelled {}, looks like {} (p {:.2} against {:.2})",
            row_names[issue.index],
            r.class_names[issue.given],
            r.class_names[issue.predicted],
            issue.given_probability,
            issue.predicted_probability
        );
    }
    let csv = crate::data::health::label_issues::to_csv(&issues, &row_names, &row_splits, &r.class_names);
    // Only a ranking is replaced: --label-issues pointing at the dataset's own CSV would lose it.
    let existing = std::fs::read_to_string(&path).ok();
    if existing.is_some_and(|text| !text.starts_with(crate::data::health::label_issues::HEADER)) {
        eprintln!(
            "warning: {} exists and is not a label-issues file: not overwritten; choose another file with --label-issues",
            path.display()
        );
        return;
    }
    match crate::atomic_file::write_atomic(&path, csv.as_bytes()) {
        Ok(()) => println!("ranking written to {}", path.display()),
        Err(e) => {
            eprintln!("warning: the label issues were not saved ({e}); choose a writable file with --label-issues")
        }
    }
}

/// `vramfit predict`.
#[derive(Args, Debug)]
pub struct PredictArgs {
    /// Image files or folders.
    #[arg(value_parser = crate::data::user_path::UserPathParser, required = true)]
    inputs: Vec<PathBuf>,
    /// Exported model: run folder, export folder, or .bpk/.safetensors file.
    #[arg(value_parser = crate::data::user_path::UserPathParser, long)]
    model: PathBuf,
    #[command(flatten)]
    device: DeviceArgs,
    /// Classes to show per image (at least 1).
    #[arg(long, default_value_t = 5, value_parser = parse_top_k)]
    top_k: usize,
    /// Print JSON lines instead of text.
    #[arg(long)]
    json: bool,
}

/// `--top-k`: a whole number of at least 1 (0 would print nothing for every image).
fn parse_top_k(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("0 classes would show nothing: give at least 1".into()),
        Ok(k) => Ok(k),
        Err(e) => Err(format!("expected a whole number of classes ({e})")),
    }
}

pub fn predict(args: PredictArgs) -> anyhow::Result<ExitCode> {
    // Selected here for its note (e.g. no adapter: the CPU); the session's job reuses the device.
    let choice = args.device.choice()?;
    select_device(args.device.choice()?)?;
    let files = crate::inference::predict::expand_inputs(&args.inputs);
    if files.is_empty() {
        bail!("no image files in {:?}", args.inputs);
    }
    let job =
        Job::Predict { model: args.model.clone(), paths: files, top_k: args.top_k, device: choice, thumbnails: false };
    let JobOutput::Predicted(predicted) = run_job(job)? else { bail!("the engine returned another job's output") };
    let mut failures = 0;
    for crate::engine::session::PredictedFile { path, result, notices, .. } in &predicted {
        match result {
            // A path that is not UTF-8 is written lossily (U+FFFD for the bad bytes), never a panic.
            Ok(top) if args.json => {
                println!("{}", serde_json::json!({ "file": path.to_string_lossy(), "top": top }))
            }
            Ok(top) => {
                let line: Vec<String> =
                    top.iter().map(|c| format!("{} {:.1}%", c.name, c.probability * 100.0)).collect();
                println!("{}: {}", path.display(), line.join(", "));
            }
            Err(e) => {
                failures += 1;
                eprintln!("error: {e}");
            }
        }
        for notice in notices {
            eprintln!("note: {}: {notice}", path.display());
        }
    }
    // Like `cat` with a missing file: the readable images are predicted, and the exit status
    // says that not all of them were.
    if failures > 0 {
        eprintln!("error: {failures} of {} images could not be predicted", predicted.len());
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

pub fn devices() -> anyhow::Result<ExitCode> {
    let adapters = device::list_adapters();
    let default = match device::default_device(&adapters) {
        device::DefaultDevice::Adapter(i) => Some(i),
        _ => None,
    };
    if adapters.is_empty() {
        println!(
            "no GPU adapter found; commands run on the CPU (burn flex). Install a Vulkan driver (e.g. mesa-vulkan-drivers) for a GPU or software adapter."
        );
    }
    for a in &adapters {
        println!(
            "{}{} {} [{} {}{}] driver {} | memory {} | max buffer {} | max storage binding {} | f16 {}",
            if Some(a.index) == default { "*" } else { " " },
            a.index,
            a.name,
            a.backend,
            a.device_type,
            if a.is_software() { ", software: slower than the CPU backend" } else { "" },
            if a.driver.is_empty() { "?" } else { &a.driver },
            a.device_local_bytes.map_or("unknown (not Vulkan)".into(), human_bytes),
            human_bytes(a.max_buffer_size),
            human_bytes(a.max_storage_buffer_binding_size),
            if a.shader_f16 { "yes" } else { "no" }
        );
    }
    println!("{} cpu: burn flex (default CPU backend), burn ndarray", if default.is_none() { "*" } else { " " });
    println!("* = the device used by default; pick an adapter with --adapter N, the CPU with --device cpu");
    Ok(ExitCode::SUCCESS)
}

/// `vramfit export`.
#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Run folder whose latest checkpoint to export.
    #[arg(value_parser = crate::data::user_path::UserPathParser, long)]
    run: PathBuf,
    /// Output folder (default <run>/export).
    #[arg(value_parser = crate::data::user_path::UserPathParser, long)]
    out: Option<PathBuf>,
    /// Weight files to write: all (model.bpk, model.safetensors, model.onnx), bpk, safetensors
    /// or onnx; model.json is always written.
    #[arg(long, default_value = "all", value_parser = ["all", "bpk", "safetensors", "onnx"])]
    format: String,
    /// Input of the ONNX graph: f32-nchw (normalized [N, 3, H, W] floats) or u8-nhwc ([N, H, W, 3]
    /// RGB pixels, normalized inside the graph).
    #[arg(long, default_value = "f32-nchw", value_parser = ["f32-nchw", "u8-nhwc"])]
    onnx_input: String,
}

pub fn export(args: ExportArgs) -> anyhow::Result<ExitCode> {
    let out = args.out.unwrap_or_else(|| args.run.join(crate::train::run_dir::EXPORT));
    let options = crate::export::ExportOptions {
        format: args.format.parse().map_err(anyhow::Error::msg)?,
        onnx_input: if args.onnx_input == "u8-nhwc" {
            crate::export::onnx::OnnxInput::U8Nhwc
        } else {
            crate::export::onnx::OnnxInput::F32Nchw
        },
    };
    // A run made by another version: what its config lacked or had extra (errors come below).
    for note in crate::train::run_dir::load_config(&args.run).map(|(_, notes)| notes).unwrap_or_default() {
        eprintln!("note: {note}");
    }
    if let Ok(latest) = crate::train::checkpoint::find_latest_weights(&args.run) {
        for reason in &latest.damaged {
            eprintln!("warning: passed over a damaged checkpoint: {reason}");
        }
        let s = &latest.state;
        eprintln!(
            "exporting the weights of step {}, after {} ({})",
            s.global_step,
            crate::engine::words::count(s.epoch, "epoch"),
            latest.dir.display()
        );
    }
    let job = Job::Export { run: args.run.clone(), dir: out, options };
    let JobOutput::Exported(files) = run_job(job)? else { bail!("the engine returned another job's output") };
    for f in files {
        println!("wrote {}", f.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `vramfit info`.
#[derive(Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Number of classes of the head.
    #[arg(long, default_value_t = 10)]
    classes: usize,
}

pub fn info(args: InfoArgs) -> anyhow::Result<ExitCode> {
    let config = args.config.load()?;
    let px = config.image_size_px();
    let plan = model::layer_plan(&config.model, args.classes, (px, px));
    let flops = model::forward_flops(&plan);
    println!("config {}: {} classes, {px}x{px} input", config.name, args.classes);
    println!("parameters: {} ({:.2}M)", model::param_count(&plan), model::param_count(&plan) as f64 / 1e6);
    println!(
        "FLOPs per image: forward {:.3} GFLOP, training step ~{:.3} GFLOP (forward + 2x backward)",
        flops as f64 / 1e9,
        3.0 * flops as f64 / 1e9
    );
    println!("\n{:<14}{:<11}{:>8}{:>8}{:>16}{:>12}", "layer", "kind", "stride", "params", "output", "MFLOPs");
    let mut stage = usize::MAX;
    for l in &plan {
        if l.stage != stage && l.kind != LayerKind::Stem && l.kind != LayerKind::Head {
            stage = l.stage;
            println!("-- stage {stage}");
        }
        let out = if l.kind == LayerKind::Head {
            format!("[{}]", l.out_channels)
        } else {
            format!("[{}, {}, {}]", l.out_channels, l.out_hw.0, l.out_hw.1)
        };
        println!(
            "{:<14}{:<11}{:>8}{:>8}{:>16}{:>12.2}",
            l.name,
            format!("{:?}", l.kind),
            l.stride,
            l.params(),
            out,
            2.0 * l.macs() as f64 / 1e6
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `vramfit check-data`.
#[derive(Args, Debug)]
pub struct CheckDataArgs {
    /// Dataset folder, IDX folder or labels CSV file.
    #[arg(value_parser = crate::data::user_path::UserPathParser)]
    path: PathBuf,
    #[command(flatten)]
    config: ConfigArgs,
    /// Skip empty class folders instead of failing.
    #[arg(long)]
    allow_empty_classes: bool,
}

pub fn check_data(args: CheckDataArgs) -> anyhow::Result<ExitCode> {
    let config = args.config.load()?;
    let report = crate::data::check_data::report(&args.path, &config, args.allow_empty_classes)?;
    print!("{}", report.text);
    if report.stops > 0 {
        eprintln!("error: training on this dataset would stop ({} problem(s) above); fix them first", report.stops);
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
