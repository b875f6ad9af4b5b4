//! The command line: parses arguments, builds engine inputs, runs the engine on its own thread
//! and renders its events (see the `render` module). Nothing here is used by the engine.

mod bench;
mod commands;
mod plan;
mod render;
mod serve;
mod train;
mod worker;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{Config, Precision};
use crate::data::preprocess::PreprocessMode;
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
    Plan(plan::PlanArgs),
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
    /// Serve this machine's devices to other machines' runs (`--device remote:HOST:PORT[/N]`).
    Serve(serve::ServeArgs),
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
    /// Override train.batch_size (images per loader batch; split into micro-batches when memory needs it).
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Override train.grad_accum_steps.
    #[arg(long)]
    pub grad_accum_steps: Option<usize>,
    /// Override optimizer.lr.
    #[arg(long)]
    pub lr: Option<f64>,
    /// Override train.precision (f32 or f16).
    #[arg(long, value_parser = parse_precision)]
    pub precision: Option<Precision>,
    /// Override train.checkpointing.
    #[arg(long)]
    pub checkpointing: Option<bool>,
    /// Override data.preprocess.mode.
    #[arg(long, value_parser = parse_preprocess)]
    pub preprocess: Option<PreprocessMode>,
    /// Override data.preprocess.load_size (pixels).
    #[arg(long)]
    pub load_size: Option<usize>,
    /// Override data.preprocess.crop_size (pixels).
    #[arg(long)]
    pub crop_size: Option<usize>,
    /// Override memory.memory_budget_bytes (bytes, or with a unit: 6GiB, 512MiB).
    #[arg(long, value_parser = parse_budget)]
    pub budget: Option<u64>,
}

impl ConfigArgs {
    /// Loads the preset or file and applies the overrides.
    ///
    /// # Errors
    /// [`crate::Error::Config`] naming the file or key.
    pub fn load(&self) -> crate::Result<Config> {
        let mut config = load_config(&self.config)?;
        self.apply_to(&mut config)?;
        Ok(config)
    }

    /// Applies the overrides to `config`: the flags to their fields, then each `--set KEY=VALUE`
    /// ([`Config::set_all`]), validated once at the end so overrides that only agree together
    /// (`--load-size` and `--crop-size` both shrunk) are accepted.
    ///
    /// # Errors
    /// [`crate::Error::Config`] naming the flags when a value is out of range, or the `--set`
    /// key that does not exist; `config` is unchanged on error.
    pub fn apply_to(&self, config: &mut Config) -> crate::Result<()> {
        let mut next = config.clone();
        let train = &mut next.train;
        train.epochs = self.epochs.unwrap_or(train.epochs);
        train.batch_size = self.batch_size.unwrap_or(train.batch_size);
        train.grad_accum_steps = self.grad_accum_steps.unwrap_or(train.grad_accum_steps);
        train.precision = self.precision.unwrap_or(train.precision);
        train.checkpointing = self.checkpointing.unwrap_or(train.checkpointing);
        next.optimizer.lr = self.lr.unwrap_or(next.optimizer.lr);
        let preprocess = &mut next.data.preprocess;
        preprocess.mode = self.preprocess.unwrap_or(preprocess.mode);
        preprocess.load_size = self.load_size.unwrap_or(preprocess.load_size);
        preprocess.crop_size = self.crop_size.unwrap_or(preprocess.crop_size);
        next.memory.memory_budget_bytes = self.budget.unwrap_or(next.memory.memory_budget_bytes);
        if self.set.is_empty() {
            next.validate("the command line's flags")?;
        } else {
            next.set_all(&self.set)?;
        }
        *config = next;
        Ok(())
    }
}

/// `--precision`: a [`Precision`] by its config name.
fn parse_precision(s: &str) -> Result<Precision, String> {
    Precision::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| "expected f32 or f16".to_string())
}

/// `--preprocess`: a [`PreprocessMode`] by its config name.
fn parse_preprocess(s: &str) -> Result<PreprocessMode, String> {
    PreprocessMode::ALL.into_iter().find(|m| m.name() == s).ok_or_else(|| {
        let names: Vec<&str> = PreprocessMode::ALL.iter().map(|m| m.name()).collect();
        format!("expected one of {}", names.join(", "))
    })
}

/// `--budget`: bytes, or a size with a unit ([`parse_bytes`]).
fn parse_budget(s: &str) -> Result<u64, String> {
    parse_bytes(s).ok_or_else(|| crate::config::byte_size::not_a_size(s))
}

pub use crate::config::byte_size::parse_bytes;

/// Which device: the fastest here (default), a GPU adapter or a CPU backend.
#[derive(Args, Debug, Clone, Default)]
pub struct DeviceArgs {
    /// `auto` (a hardware GPU adapter, else the CPU: a software adapter such as llvmpipe is
    /// slower than the CPU backend), `gpu` (a wgpu adapter, software ones included; the CPU when
    /// none exists), `cpu`, or `remote:HOST:PORT[/N]` (device N of a `vramfit serve` server;
    /// its token in the VRAMFIT_TOKEN environment variable).
    #[arg(long, default_value = "auto")]
    pub device: DeviceFlag,
    /// Adapter index from `vramfit devices` (implies `--device gpu`).
    #[arg(long)]
    pub adapter: Option<usize>,
    /// CPU backend for `--device cpu`.
    #[arg(long, value_enum, default_value_t = CpuFlag::Flex)]
    pub cpu_backend: CpuFlag,
}

/// `--devices`: data parallelism over several devices ([`crate::train::TrainRequest::replicas`]).
#[derive(Args, Debug, Clone, Default)]
pub struct DevicesArgs {
    /// Train on several devices at once, comma-separated, the first the main one (it keeps the
    /// model, the optimizer and the checkpoints): each runs its share of every step's
    /// micro-batches (micro-batch i on device i mod n; give --grad-accum-steps a multiple of n).
    /// Entries: auto, gpu, gpu:N (adapter N of `vramfit devices`), cpu, cpu:flex, cpu:ndarray,
    /// remote:HOST:PORT[/N] (device N of a `vramfit serve` server).
    /// Instead of --device and --adapter.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["device", "adapter", "cpu_backend"])]
    pub devices: Vec<DeviceChoice>,
}

impl DevicesArgs {
    /// The main device and the replicas: `--devices`' first entry and the rest, or, without
    /// `--devices`, `device`'s choice ([`DeviceArgs::choice`]) alone.
    ///
    /// # Errors
    /// As [`DeviceArgs::choice`].
    pub fn choices(&self, device: &DeviceArgs) -> anyhow::Result<(DeviceChoice, Vec<DeviceChoice>)> {
        match self.devices.split_first() {
            Some((main, replicas)) => Ok((*main, replicas.to_vec())),
            None => Ok((device.choice()?, Vec::new())),
        }
    }
}

/// `--device`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeviceFlag {
    /// A hardware GPU adapter, else the CPU (a software adapter is slower than the CPU backend).
    #[default]
    Auto,
    /// A wgpu adapter.
    Gpu,
    /// burn's CPU backend.
    Cpu,
    /// A device of a `vramfit serve` server.
    Remote(crate::device::RemoteAddr),
}

impl std::str::FromStr for DeviceFlag {
    type Err = String;

    /// `auto`, `gpu`, `cpu` or `remote:HOST:PORT[/N]`.
    ///
    /// # Errors
    /// Any other value, or a remote address that does not resolve.
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(rest) = s.trim().strip_prefix("remote:") {
            return crate::device::RemoteAddr::parse(rest).map(DeviceFlag::Remote);
        }
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DeviceFlag::Auto),
            "gpu" => Ok(DeviceFlag::Gpu),
            "cpu" => Ok(DeviceFlag::Cpu),
            _ => Err(format!("`{s}` is not a device: use auto, gpu, cpu or remote:HOST:PORT[/N]")),
        }
    }
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
    ///
    /// # Errors
    /// `--device cpu` with `--adapter N`: two devices asked for.
    pub fn choice(&self) -> anyhow::Result<DeviceChoice> {
        Ok(match self.device {
            DeviceFlag::Auto if self.adapter.is_none() => DeviceChoice::Auto,
            DeviceFlag::Auto | DeviceFlag::Gpu => DeviceChoice::Gpu(self.adapter),
            DeviceFlag::Remote(remote) => {
                if let Some(i) = self.adapter {
                    anyhow::bail!(
                        "--device {} and --adapter {i} ask for two devices: drop --adapter (a server's devices are chosen with remote:HOST:PORT/N)",
                        remote.token()
                    );
                }
                DeviceChoice::Remote(remote)
            }
            DeviceFlag::Cpu => {
                if let Some(i) = self.adapter {
                    anyhow::bail!(
                        "--device cpu and --adapter {i} ask for two devices: drop --adapter to train on the CPU, or --device cpu for the adapter"
                    );
                }
                DeviceChoice::Cpu(self.cpu_backend())
            }
        })
    }

    /// The device choice of a command that measures a GPU (`bench`): as [`Self::choice`], but
    /// `auto` takes the default adapter, a software one included, since measuring one is the point.
    ///
    /// # Errors
    /// As [`Self::choice`].
    pub fn gpu_choice(&self) -> anyhow::Result<DeviceChoice> {
        Ok(match self.choice()? {
            DeviceChoice::Auto => DeviceChoice::Gpu(None),
            choice => choice,
        })
    }

    fn cpu_backend(&self) -> CpuBackend {
        match self.cpu_backend {
            CpuFlag::Flex => CpuBackend::Flex,
            CpuFlag::Ndarray => CpuBackend::Ndarray,
        }
    }
}

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
    if let Ok(token) = std::env::var(crate::device::remote::TOKEN_VARIABLE) {
        crate::device::remote::set_credential(token);
    }
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
        Command::Plan(a) => plan::plan(a),
        Command::Devices => commands::devices(),
        Command::Export(a) => commands::export(a),
        Command::Bench(a) => bench::bench(a, app),
        Command::Info(a) => commands::info(a),
        Command::CheckData(a) => commands::check_data(a),
        Command::Serve(a) => serve::serve(a),
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

/// The command-line flags that select `choice` in a child `vramfit` process
/// (`--device auto`, `--device gpu [--adapter N]` or `--device cpu --cpu-backend flex|ndarray`).
pub fn device_flags(choice: DeviceChoice) -> Vec<String> {
    match choice {
        DeviceChoice::Auto => vec!["--device".into(), "auto".into()],
        DeviceChoice::Gpu(adapter) => {
            let mut args = vec!["--device".to_string(), "gpu".to_string()];
            if let Some(i) = adapter {
                args.extend(["--adapter".to_string(), i.to_string()]);
            }
            args
        }
        DeviceChoice::Cpu(backend) => {
            let name = backend.name();
            vec!["--device".into(), "cpu".into(), "--cpu-backend".into(), name.into()]
        }
        DeviceChoice::Remote(remote) => vec!["--device".into(), remote.token()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_flag_defaults_to_auto_and_an_adapter_index_means_that_adapter() {
        #[derive(Parser)]
        struct DeviceOnly {
            #[command(flatten)]
            device: DeviceArgs,
        }
        let parse = |args: &[&str]| DeviceOnly::try_parse_from(args).unwrap().device.choice().unwrap();
        assert_eq!(parse(&["vramfit"]), DeviceChoice::Auto);
        assert_eq!(parse(&["vramfit", "--adapter", "1"]), DeviceChoice::Gpu(Some(1)));
        assert_eq!(parse(&["vramfit", "--device", "gpu"]), DeviceChoice::Gpu(None));
        assert_eq!(parse(&["vramfit", "--device", "cpu"]), DeviceChoice::Cpu(CpuBackend::Flex));
        // Two devices at once are refused, naming both flags.
        let both = DeviceOnly::try_parse_from(["vramfit", "--device", "cpu", "--adapter", "0"]).unwrap();
        let e = both.device.choice().unwrap_err().to_string();
        assert!(e.contains("--device cpu and --adapter 0"), "{e}");
        // Each choice survives the trip to the worker process's command line.
        for choice in [DeviceChoice::Auto, DeviceChoice::Gpu(Some(1)), DeviceChoice::Gpu(None)] {
            let mut args = vec!["vramfit".to_string()];
            args.extend(device_flags(choice));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            assert_eq!(parse(&args), choice);
        }
    }

    /// Just the config flags, as a command line gives them.
    #[derive(Parser)]
    struct ConfigFlags {
        #[command(flatten)]
        config: ConfigArgs,
    }

    fn config_from(flags: &[&str]) -> crate::Result<Config> {
        let args = ConfigFlags::try_parse_from(std::iter::once("vramfit").chain(flags.iter().copied())).unwrap();
        args.config.load()
    }

    #[test]
    fn flags_override_the_preset_as_typed_values_and_set_keys_after_them() {
        let c = config_from(&[
            "--epochs=3",
            "--crop-size=24",
            "--budget=1GiB",
            "--precision=f16",
            "--preprocess=crop",
            "--set=train.grad_accum_steps=2",
            "--lr=0.25",
        ])
        .unwrap();
        assert_eq!((c.train.epochs, c.train.grad_accum_steps, c.optimizer.lr), (3, 2, 0.25));
        assert_eq!((c.data.preprocess.crop_size, c.data.preprocess.mode), (24, PreprocessMode::Crop));
        assert_eq!((c.memory.memory_budget_bytes, c.train.precision), (1 << 30, Precision::F16));
        // Flags that only agree together are validated together, in any order.
        let both = ["--preprocess=resize_and_crop", "--crop-size=40", "--set=data.preprocess.load_size=40"];
        assert!(config_from(&both[..2]).is_err(), "a crop over the load size alone is refused");
        let c = config_from(&both).unwrap();
        assert_eq!((c.data.preprocess.load_size, c.data.preprocess.crop_size), (40, 40));
        let err = config_from(&["--batch-size=0"]).unwrap_err().to_string();
        assert!(err.contains("batch_size"), "{err}");
        for bad in ["--precision=bf16", "--preprocess=zoom", "--budget=12x"] {
            assert!(ConfigFlags::try_parse_from(["vramfit", bad]).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn an_unknown_bench_backend_is_refused_naming_the_ones_there_are() {
        let err = Cli::try_parse_from(["vramfit", "bench", "train", "--backends", "wgpu"]).unwrap_err().to_string();
        assert!(err.contains("'wgpu'") && err.contains("[possible values: gpu, flex, ndarray]"), "{err}");
        let ok = Cli::try_parse_from(["vramfit", "bench", "train", "--backends", "gpu,ndarray"]);
        assert!(ok.is_ok(), "{ok:?}");
    }
}
