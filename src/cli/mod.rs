//! The command line: parses arguments, builds engine inputs, runs the engine on its own thread
//! and renders its events (see the `render` module). Nothing here is used by the engine.

mod bench;
mod commands;
mod render;
mod train;
mod worker;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::Config;
use crate::device::{CpuBackend, DeviceChoice};

pub use crate::config::presets::{PRESETS, load_config};

#[derive(Parser, Debug)]
#[command(
    name = "vramfit",
    version,
    about = "Train small image classifiers on any GPU with memory you can predict before you press Train"
)]
struct Cli {
    /// Without a command the desktop app opens.
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Train a classifier (default data: the bundled Fashion-MNIST subset).
    Train(train::TrainArgs),
    /// Evaluate exported weights: top-1/top-5, per-class accuracy, confusion matrix.
    Eval(commands::EvalArgs),
    /// Top-k classes for images or folders of images.
    Predict(commands::PredictArgs),
    /// Predict peak device memory for a config and say whether it fits its budget.
    Plan(commands::PlanArgs),
    /// List the GPU adapters wgpu sees and the one the default picks.
    Devices,
    /// Export a run's newest intact checkpoint as model.bpk, model.safetensors, model.onnx and model.json.
    Export(commands::ExportArgs),
    /// Measure throughput (`bench train`), memory predictions (`bench memory`) or the app's frame times (`bench ui`).
    Bench(bench::BenchArgs),
    /// Parameter count, FLOPs and per-stage output shapes of a config's network.
    Info(commands::InfoArgs),
    /// Scan a dataset and report classes, skipped files, sizes and what preprocessing makes of them.
    CheckData(commands::CheckDataArgs),
}

/// Config file and per-field overrides, shared by every command that needs a config.
#[derive(Args, Debug, Clone, Default)]
pub struct ConfigArgs {
    /// Preset name (quickstart, fashion-mnist, 4gb, 6gb, 8gb, 12gb) or path to a TOML config.
    #[arg(long, short = 'c', default_value = "quickstart")]
    pub config: String,
    /// Override any config key, e.g. `--set train.batch_size=32` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Override train.epochs.
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Override train.batch_size (images per micro-batch).
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Override train.grad_accum_steps.
    #[arg(long)]
    pub grad_accum_steps: Option<usize>,
    /// Override optimizer.lr.
    #[arg(long)]
    pub lr: Option<f64>,
    /// Override train.precision (f32 or f16).
    #[arg(long)]
    pub precision: Option<String>,
    /// Override train.checkpointing.
    #[arg(long)]
    pub checkpointing: Option<bool>,
    /// Override data.preprocess.mode.
    #[arg(long)]
    pub preprocess: Option<String>,
    /// Override data.preprocess.load_size (pixels).
    #[arg(long)]
    pub load_size: Option<usize>,
    /// Override data.preprocess.crop_size (pixels).
    #[arg(long)]
    pub crop_size: Option<usize>,
    /// Override memory.memory_budget_bytes (bytes, or with a unit: 6GiB, 512MiB).
    #[arg(long)]
    pub budget: Option<String>,
}

impl ConfigArgs {
    /// Loads the preset or file and applies the overrides.
    ///
    /// # Errors
    /// [`crate::Error::Config`] naming the file or key.
    pub fn load(&self) -> crate::Result<Config> {
        let mut config = load_config(&self.config)?;
        config.set_all(&self.overrides()?)?;
        Ok(config)
    }

    /// Every override given, flags first then `--set`, as `KEY=VALUE` for [`Config::set`].
    ///
    /// # Errors
    /// [`crate::Error::Config`] for a `--budget` that is not a size.
    pub fn overrides(&self) -> crate::Result<Vec<String>> {
        let mut sets: Vec<String> = Vec::new();
        let mut push = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                sets.push(format!("{k}={v}"));
            }
        };
        push("train.epochs", self.epochs.map(|v| v.to_string()));
        push("train.batch_size", self.batch_size.map(|v| v.to_string()));
        push("train.grad_accum_steps", self.grad_accum_steps.map(|v| v.to_string()));
        push("optimizer.lr", self.lr.map(|v| format!("{v:e}")));
        push("train.precision", self.precision.as_ref().map(|v| format!("\"{v}\"")));
        push("train.checkpointing", self.checkpointing.map(|v| v.to_string()));
        push("data.preprocess.mode", self.preprocess.as_ref().map(|v| format!("\"{v}\"")));
        push("data.preprocess.load_size", self.load_size.map(|v| v.to_string()));
        push("data.preprocess.crop_size", self.crop_size.map(|v| v.to_string()));
        if let Some(b) = &self.budget {
            let bytes = parse_bytes(b).ok_or_else(|| crate::Error::Config {
                source_name: format!("--budget {b}"),
                message: "expected bytes or a size with a unit, e.g. 6GiB, 512MiB, 8GB".into(),
            })?;
            sets.push(format!("memory.memory_budget_bytes={bytes}"));
        }
        sets.extend(self.set.iter().cloned());
        Ok(sets)
    }
}

/// `6GiB`, `512MiB`, `8GB`, `1000000` -> bytes.
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some((v * mult) as u64)
}

/// Which device: the GPU adapter (default) or a CPU backend.
#[derive(Args, Debug, Clone, Default)]
pub struct DeviceArgs {
    /// `gpu` (a wgpu adapter; falls back to the CPU when none exists) or `cpu`.
    #[arg(long, value_enum, default_value_t = DeviceFlag::Gpu)]
    pub device: DeviceFlag,
    /// Adapter index from `vramfit devices`.
    #[arg(long)]
    pub adapter: Option<usize>,
    /// CPU backend for `--device cpu`.
    #[arg(long, value_enum, default_value_t = CpuFlag::Flex)]
    pub cpu_backend: CpuFlag,
}

/// `--device`.
#[derive(ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeviceFlag {
    /// A wgpu adapter.
    #[default]
    Gpu,
    /// burn's CPU backend.
    Cpu,
}

/// `--cpu-backend`.
#[derive(ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CpuFlag {
    /// burn flex (default: measured faster, see README).
    #[default]
    Flex,
    /// burn ndarray.
    Ndarray,
}

impl DeviceArgs {
    /// The engine's device choice.
    pub fn choice(&self) -> DeviceChoice {
        match self.device {
            DeviceFlag::Gpu => DeviceChoice::Gpu(self.adapter),
            DeviceFlag::Cpu => DeviceChoice::Cpu(match self.cpu_backend {
                CpuFlag::Flex => CpuBackend::Flex,
                CpuFlag::Ndarray => CpuBackend::Ndarray,
            }),
        }
    }
}

pub use crate::train::run_dir::default_run_dir;

/// The desktop app as the command line sees it. The binary passes [`crate::gui`]'s functions
/// (`src/main.rs`), so the CLI and the app both import the engine and never each other.
#[derive(Clone, Copy)]
pub struct App {
    /// Opens the window (`vramfit` with no command).
    pub open: fn() -> anyhow::Result<()>,
    /// `vramfit bench ui`: trains for the seconds given with the window open; returns the
    /// report (a Markdown table) and its JSON.
    pub bench_ui: fn(f64) -> anyhow::Result<(String, String)>,
}

/// Entry point of the `vramfit` binary; `app` is the desktop app.
pub fn main(app: App) -> ExitCode {
    let cli = Cli::parse();
    install_panic_hook();
    // RUST_LOG when set; otherwise vramfit's own warnings (not its dependencies').
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("vramfit=warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    let Some(command) = cli.command else {
        return match (app.open)() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    };
    // A panic that escapes a command (the GPU runtime's, through burn) ends it with one line and
    // exit status 101, which the training worker's parent reports as a crash.
    let result = std::panic::catch_unwind(|| match command {
        Command::Train(a) => train::train(a),
        Command::Eval(a) => commands::eval(a),
        Command::Predict(a) => commands::predict(a),
        Command::Plan(a) => commands::plan(a),
        Command::Devices => commands::devices(),
        Command::Export(a) => commands::export(a),
        Command::Bench(a) => bench::bench(a, app),
        Command::Info(a) => commands::info(a),
        Command::CheckData(a) => commands::check_data(a),
    });
    let Ok(result) = result else { return ExitCode::from(101) };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            // A job that panicked on the session's thread exits as a panic would.
            if matches!(e.downcast_ref::<crate::Error>(), Some(crate::Error::Crashed(_))) {
                return ExitCode::from(101);
            }
            ExitCode::FAILURE
        }
    }
}

/// Panics print one line (the thread, the message's first line and root cause) instead of the
/// default report, unless `RUST_BACKTRACE` asks for the backtrace. The GPU runtime panics on its
/// own threads for device errors it also returns as values; the user gets those values as errors.
fn install_panic_hook() {
    if std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0") {
        return;
    }
    std::panic::set_hook(Box::new(|info| {
        let message = crate::engine::error::one_line_cause(&crate::engine::events::panic_message(info.payload()));
        let thread = std::thread::current().name().unwrap_or("a thread").to_string();
        eprintln!("error: {thread} failed: {message} (RUST_BACKTRACE=1 shows where)");
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("6GiB"), Some(6 << 30));
        assert_eq!(parse_bytes("512 MiB"), Some(512 << 20));
        assert_eq!(parse_bytes("8GB"), Some(8_000_000_000));
        assert_eq!(parse_bytes("12x"), None);
    }

    #[test]
    fn flags_override_the_preset() {
        let args = ConfigArgs {
            config: "quickstart".into(),
            epochs: Some(3),
            crop_size: Some(24),
            budget: Some("1GiB".into()),
            ..Default::default()
        };
        let c = args.load().unwrap();
        assert_eq!(c.train.epochs, 3);
        assert_eq!(c.data.preprocess.crop_size, 24);
        assert_eq!(c.memory.memory_budget_bytes, 1 << 30);
    }

    #[test]
    fn an_unknown_bench_backend_is_refused_naming_the_ones_there_are() {
        let err = Cli::try_parse_from(["vramfit", "bench", "train", "--backends", "wgpu"]).unwrap_err().to_string();
        assert!(err.contains("'wgpu'") && err.contains("[possible values: gpu, flex, ndarray]"), "{err}");
        let ok = Cli::try_parse_from(["vramfit", "bench", "train", "--backends", "gpu,ndarray"]);
        assert!(ok.is_ok(), "{ok:?}");
    }
}
