//! `vramfit bench`: the benchmarks' command line (the measuring lives in the engine's
//! [`crate::bench`], [`crate::bench::memory`] and [`crate::bench::loader`]).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use super::DeviceArgs;
use super::commands::{open_data, select_device};
use crate::config::Config;
use crate::device::SelectedDevice;

/// `vramfit bench loader`: generated photos in three crop modes of the 8gb preset, and the
/// bundled data as quickstart loads it.
fn bench_loader(
    args: &BenchArgs,
    device: &SelectedDevice,
) -> anyhow::Result<Vec<crate::bench::loader::LoaderBenchRow>> {
    use crate::bench::loader::{dataset_of, measure, write_photos};
    let dir = tempfile::tempdir().context("cannot create a folder for the generated photos")?;
    let mut rows = Vec::new();
    let photo = super::load_config("8gb")?;
    for (label, (w, h)) in [("12 MP JPEG (4000x3000)", (4000, 3000)), ("2 MP JPEG (1632x1224)", (1632, 1224))] {
        eprintln!("writing {} photos of {w}x{h}...", args.images);
        let paths = write_photos(&dir.path().join(format!("{w}x{h}")), w, h, args.images, 3)?;
        for mode in ["resize_and_crop", "scale_width_and_crop", "crop"] {
            let mut config = photo.clone();
            config.set(&format!("data.preprocess.mode={mode}"))?;
            eprintln!("measuring {label}, {mode}...");
            let cache = dir.path().join(format!("cache-{w}x{h}-{mode}"));
            rows.push(measure(label, dataset_of(paths.clone()), &config, device, &args.workers, &cache)?);
        }
    }
    let quick = super::load_config("quickstart")?;
    let bundled = open_data(None, &quick, false)?.train;
    let n = (args.images * 8).min(bundled.samples.len());
    let subset = crate::data::dataset::Dataset {
        class_names: bundled.class_names.clone(),
        samples: bundled.samples[..n].to_vec(),
    };
    let cache = dir.path().join("cache-bundled");
    rows.push(measure("bundled Fashion-MNIST (28x28 IDX)", subset, &quick, device, &args.workers, &cache)?);
    Ok(rows)
}

/// `vramfit bench loader --train-steps N`: the 8gb preset (batch at most `--images`) trained on
/// generated 12 MP JPEGs with augmentation on the CPU workers and on the device.
fn bench_augment_training(
    args: &BenchArgs,
    device: &SelectedDevice,
) -> anyhow::Result<Vec<crate::bench::loader::AugmentTrainRow>> {
    let dir = tempfile::tempdir().context("cannot create a folder for the generated photos")?;
    let mut config = super::load_config("8gb")?;
    config.train.batch_size = config.train.batch_size.min(args.images.max(1));
    let count = config.train.batch_size * (args.train_steps + 1);
    eprintln!("writing {count} photos of 4000x3000 for training...");
    let paths = crate::bench::loader::write_photos(&dir.path().join("photos"), 4000, 3000, count, 5)?;
    eprintln!("training {} steps per run (augmentation on the CPU, then on the device)...", args.train_steps + 1);
    Ok(crate::bench::loader::train_augment_comparison(&paths, &config, device, args.train_steps, dir.path())?)
}

/// `vramfit bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// `train` (throughput per backend), `memory` (predicted vs measured peak grid), `loader`
    /// (the input pipeline alone, on generated 12 MP / 2 MP JPEGs and the bundled data), `ui`
    /// (the app's frame times while it trains; needs a display, e.g. `xvfb-run`), `duplicates`
    /// (the duplicate finder's recall and false matches on generated copies) or `label-errors`
    /// (the label-issue ranking's recall on deliberately flipped labels) or `devices` (training
    /// throughput on the first 1, 2, ... of `--devices`, the same micro-batches a step in each).
    #[arg(value_parser = ["train", "memory", "loader", "ui", "duplicates", "label-errors", "devices"])]
    what: String,
    /// `duplicates`, `label-errors`: the dataset (default: the bundled Fashion-MNIST subset).
    #[arg(value_parser = crate::data::user_path::UserPathParser, long)]
    data: Option<PathBuf>,
    /// `duplicates`: distinct pictures to copy and compare (the dataset's first ones).
    #[arg(long, default_value_t = 2000)]
    pictures: usize,
    /// `label-errors`: share of the labels flipped to another class.
    #[arg(long, default_value_t = 0.1)]
    flip: f64,
    /// `label-errors`: the flips' seed; `memory --random`: the cells' seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Images per generated photo set for `bench loader` (the bundled set uses 8 times as many).
    #[arg(long, default_value_t = 16)]
    images: usize,
    /// `bench loader`: also train the 8gb preset (batch at most `--images`) this many timed
    /// steps on generated 12 MP photos, augmenting on the CPU and then on the device (a GPU).
    #[arg(long, default_value_t = 0)]
    train_steps: usize,
    /// Loader worker threads to measure for `bench loader`.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    workers: Vec<usize>,
    /// Configs to measure (default: quickstart for memory; quickstart and every tier for train).
    #[arg(long = "config", short = 'c')]
    configs: Vec<String>,
    #[command(flatten)]
    device: DeviceArgs,
    #[command(flatten)]
    devices: super::DevicesArgs,
    /// Backends for `bench train`: any of gpu, flex, ndarray.
    #[arg(long, value_delimiter = ',', default_value = "gpu,flex,ndarray", value_parser = ["gpu", "flex", "ndarray"])]
    backends: Vec<String>,
    /// Timed optimizer steps per row (after warm-up steps).
    #[arg(long, default_value_t = 5)]
    steps: usize,
    /// Warm-up steps per row (compilation, autotune).
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// `bench memory` grid: `tiny` or `small` (CI-sized), `tiers` (224 px, batch 8-32) or `full`
    /// (batch 4-32 x 64-224 px), each x f32/f16 x checkpointing off/on.
    #[arg(long, default_value = "full")]
    grid: String,
    /// `bench memory`: measure each cell in a process of its own, so no cell inherits another's
    /// reserved pages (and a driver crash costs one cell, not the bench).
    #[arg(long)]
    fresh: bool,
    /// `bench memory`: measure this many cells drawn at random (seeded by `--seed`) from both
    /// shipped networks, micro-batch 1-64, 64-320 px, f32/f16, checkpointing on/off,
    /// accumulation 1-4 and 2-1000 classes, each in a fresh process, and summarize the plan's
    /// error. A cell over the adapter's buffer limit or `--max-plan-mib` is drawn again.
    #[arg(long)]
    random: Option<usize>,
    /// `bench memory --random`: draw again any cell whose plan is over this many MiB (bounds the
    /// bench's time on a slow adapter).
    #[arg(long)]
    max_plan_mib: Option<u64>,
    /// `bench memory --random`: draw again any cell whose optimizer step trains more than this
    /// many megapixels (micro-batch x accumulation x side^2; bounds the bench's time on a slow
    /// adapter: lavapipe trains the 12gb network at about 0.03 MP/s).
    #[arg(long)]
    max_step_mpx: Option<f64>,
    /// `bench memory`: measure one cell `MICRO_BATCH,PX,f32|f16,on|off[,ACCUM,CLASSES]` and print
    /// its row as JSON
    /// (what `--fresh` runs in each child process).
    #[arg(long)]
    cell: Option<String>,
    /// `bench memory`: run each cell's steps only under cubecl's dry run (what `vramfit plan
    /// --exact` prints: seconds a cell), not for real; the rows' measured columns stay empty.
    #[arg(long)]
    dry_run_only: bool,
    /// `bench devices`: rounds over the rows, every other one in reverse order.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds of training for `bench ui`.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// `bench train`: measure the rows of this baseline (an earlier `--json` output, e.g. in
    /// `benches/baseline/`) again and compare: fresh / baseline throughput per row; exits with 1
    /// when a row is more than 20% slower or could not be measured. The baseline decides the
    /// configs and backends (`--config` and `--backends` are not used with it).
    #[arg(value_parser = crate::data::user_path::UserPathParser, long)]
    compare: Option<PathBuf>,
    /// Write results as JSON here too (an array of rows; `bench memory --random` writes
    /// `{seed, rows, summary}`).
    #[arg(value_parser = crate::data::user_path::UserPathParser, long)]
    json: Option<PathBuf>,
}

pub fn bench(args: BenchArgs, app: super::App) -> anyhow::Result<ExitCode> {
    if !args.devices.devices.is_empty() && args.what != "devices" {
        anyhow::bail!(
            "--devices is for `bench devices`; `bench {}` measures one device (--device, --adapter)",
            args.what
        );
    }
    let rows_json = match args.what.as_str() {
        "train" if args.compare.is_some() => return compare_with_baseline(&args),
        "train" => {
            let names = if args.configs.is_empty() {
                vec!["quickstart".into(), "4gb".into(), "6gb".into(), "8gb".into(), "12gb".into()]
            } else {
                args.configs.clone()
            };
            let mut configs = Vec::new();
            for n in &names {
                configs.push(super::load_config(n)?);
            }
            let rows = crate::bench::bench_train(
                &configs,
                &args.backends,
                args.device.adapter,
                args.warmup,
                args.steps,
                &mut |line| eprintln!("{line}"),
            )?;
            println!("{}", crate::bench::train_table(&rows));
            serde_json::to_string_pretty(&rows)?
        }
        "loader" => {
            let device = select_device(args.device.gpu_choice()?)?;
            if args.train_steps > 0 {
                anyhow::ensure!(
                    crate::kernels::device_augment::runs_wgsl(&device.device),
                    "--train-steps compares augmentation on the CPU and on the device: {} does not run the kernel (a wgpu adapter does)",
                    device.name
                );
            }
            let rows = bench_loader(&args, &device)?;
            println!("{}", crate::bench::loader::table(&rows));
            if args.train_steps > 0 {
                let trained = bench_augment_training(&args, &device)?;
                println!("\n{}", crate::bench::loader::augment_train_table(&trained));
                serde_json::to_string_pretty(&serde_json::json!({ "loader": rows, "training": trained }))?
            } else {
                serde_json::to_string_pretty(&rows)?
            }
        }
        "ui" => {
            let (table, json) = (app.bench_ui)(args.seconds)?;
            println!("{table}");
            json
        }
        "devices" => bench_devices(&args)?,
        "duplicates" => bench_duplicates(&args)?,
        "label-errors" => bench_label_errors(&args)?,
        _ => match bench_memory(&args)? {
            Some(json) => json,
            None => return Ok(ExitCode::SUCCESS),
        },
    };
    if let Some(path) = args.json {
        crate::atomic_file::write_atomic(&path, rows_json.as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `vramfit bench devices`: the first config (default quickstart) on 1, 2, ... of `--devices`.
fn bench_devices(args: &BenchArgs) -> anyhow::Result<String> {
    anyhow::ensure!(
        !args.devices.devices.is_empty(),
        "bench devices measures the devices of --devices (e.g. --devices cpu,cpu:ndarray)"
    );
    let config = super::load_config(args.configs.first().map_or("quickstart", String::as_str))?;
    let devices = args.devices.devices.iter().map(|&d| select_device(d)).collect::<anyhow::Result<Vec<_>>>()?;
    let log = &mut |l: String| eprintln!("{l}");
    let rows = crate::bench::devices::bench_devices(&config, &devices, args.warmup, args.steps, args.rounds, log)?;
    println!("{}", crate::bench::devices::table(&rows));
    Ok(serde_json::to_string_pretty(&rows)?)
}

/// `vramfit bench duplicates`: the table of [`crate::bench::data_health::bench_duplicates`];
/// returns its rows as JSON.
fn bench_duplicates(args: &BenchArgs) -> anyhow::Result<String> {
    let splits = open_data(args.data.as_ref(), &Config::default(), false)?;
    // Fashion-MNIST's 28 px items scaled to 112 px, so half-size copies stay pictures.
    let scale = if args.data.is_none() { 4 } else { 1 };
    let pictures = crate::bench::data_health::pictures_of(&splits.train, args.pictures, scale);
    let thresholds = [12, 16, 20, 24, 28, 32, 40, 48];
    let rows = crate::bench::data_health::bench_duplicates(&pictures, &thresholds);
    println!("{}", crate::bench::data_health::duplicates_table(&rows, pictures.len()));
    Ok(serde_json::to_string_pretty(&rows)?)
}

/// `vramfit bench label-errors`: [`crate::bench::data_health::bench_label_errors`] as a table;
/// returns the result as JSON.
fn bench_label_errors(args: &BenchArgs) -> anyhow::Result<String> {
    let device = select_device(args.device.choice()?)?;
    let config = super::load_config(args.configs.first().map_or("quickstart", String::as_str))?;
    let splits = open_data(args.data.as_ref(), &config, false)?;
    let r =
        crate::bench::data_health::bench_label_errors(&config, &splits, args.flip, args.seed, &device, &mut |line| {
            eprintln!("{line}")
        })?;
    println!(
        "{} epochs in {:.0} s on {}, validation accuracy {:.2}% against the flipped labels",
        config.train.epochs,
        r.train_secs,
        device.name,
        r.val_accuracy * 100.0
    );
    println!("| split | flipped | flagged | recall in the first `flipped` ranked | recall | precision |");
    println!("|---|---|---|---|---|---|");
    for (name, s) in [("train (in sample)", &r.train), ("validation", &r.val)] {
        println!(
            "| {name} | {} | {} | {:.3} | {:.3} | {:.3} |",
            s.flipped, s.flagged, s.recall_at_k, s.recall, s.precision
        );
    }
    Ok(serde_json::to_string_pretty(&r)?)
}

/// `vramfit bench train --compare BASELINE`: the baseline's configs on the baseline's backends,
/// measured now, compared row by row ([`crate::bench::baseline`]).
fn compare_with_baseline(args: &BenchArgs) -> anyhow::Result<ExitCode> {
    use crate::bench::baseline::{MAX_SLOWDOWN, backend_key, compare, table};
    let path = args.compare.as_ref().context("--compare names no file")?;
    let text = std::fs::read_to_string(path).with_context(|| {
        format!("cannot read the baseline {}: give the path of a `bench train --json` output", path.display())
    })?;
    let baseline: Vec<crate::bench::TrainBenchRow> = serde_json::from_str(&text).with_context(|| {
        format!("{} is not a `bench train --json` output (a list of rows): write one with `vramfit bench train --json FILE`", path.display())
    })?;
    // Only the rows the baseline has, each with its own micro-batch and precision (a preset's
    // may have changed since: the 224 px tiers went from batch 32 to their tier's choice), so
    // the guard measures the same work. One `bench_train` per backend, as a plain `bench train`
    // does: the device is selected once.
    let mut configs_by_backend: Vec<(&str, Vec<Config>)> = Vec::new();
    for row in &baseline {
        let mut config = super::load_config(&row.config)?;
        config.train.batch_size = row.batch_size;
        config.train.grad_accum_steps = 1;
        config.train.precision = crate::config::Precision::ALL
            .into_iter()
            .find(|p| p.name() == row.precision)
            .with_context(|| format!("{}: a row's precision {:?} is not f32 or f16", path.display(), row.precision))?;
        let backend = backend_key(&row.backend);
        let configs = match configs_by_backend.iter_mut().find(|(b, _)| *b == backend) {
            Some((_, configs)) => configs,
            None => &mut configs_by_backend.push_mut((backend, Vec::new())).1,
        };
        if !configs.contains(&config) {
            configs.push(config);
        }
    }
    let mut fresh = Vec::new();
    for (backend, configs) in configs_by_backend {
        let backends = [backend.to_string()];
        fresh.extend(crate::bench::bench_train(
            &configs,
            &backends,
            args.device.adapter,
            args.warmup,
            args.steps,
            &mut |line| eprintln!("{line}"),
        )?);
    }
    println!("{}", crate::bench::train_table(&fresh));
    let rows = compare(&baseline, &fresh, MAX_SLOWDOWN);
    println!("compared with {}:\n{}", path.display(), table(&rows, MAX_SLOWDOWN));
    if let Some(json) = &args.json {
        crate::atomic_file::write_atomic(json, serde_json::to_string_pretty(&fresh)?.as_bytes())?;
    }
    let slower = rows.iter().filter(|r| r.regressed).count();
    if slower > 0 {
        eprintln!("{slower} row(s) more than {:.0}% slower than the baseline, or not measured", MAX_SLOWDOWN * 100.0);
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `vramfit bench memory --cell` for `cell` in a child process; a child that fails or dies
/// (a driver out-of-memory kills the process) gives a skipped row naming its exit and stderr tail.
fn memory_cell_in_child(
    config_name: &str,
    base: &Config,
    cell: &crate::bench::memory::MemoryCell,
    steps: usize,
    device: crate::device::DeviceChoice,
    dry_run_only: bool,
) -> crate::bench::memory::MemoryBenchRow {
    let mut row = crate::bench::memory::MemoryBenchRow::planned(config_name, base, cell);
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            row.skipped = Some(format!("cannot find vramfit's own executable: {e}"));
            return row;
        }
    };
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["bench", "memory", "--config", config_name, "--cell", &cell.to_arg(), "--steps", &steps.to_string()]);
    cmd.args(super::device_flags(device));
    if dry_run_only {
        cmd.arg("--dry-run-only");
    }
    match cmd.stderr(std::process::Stdio::piped()).output() {
        Ok(out) if out.status.success() => {
            match String::from_utf8_lossy(&out.stdout).lines().rev().find_map(|l| serde_json::from_str(l).ok()) {
                Some(measured) => measured,
                None => {
                    row.skipped = Some("the cell's process printed no result".into());
                    row
                }
            }
        }
        Ok(out) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(2).collect();
            row.skipped = Some(format!("the cell's process failed ({}): {}", out.status, tail.join(" / ")));
            row
        }
        Err(e) => {
            row.skipped = Some(format!("cannot start the cell's process: {e}"));
            row
        }
    }
}

/// `bench memory`: one `--cell` (its row as one JSON line, `None` returned), or a grid in this
/// process or (`--fresh`) a process per cell; the JSON of the rows.
fn bench_memory(args: &BenchArgs) -> anyhow::Result<Option<String>> {
    let config_name = args.configs.first().map_or("quickstart", String::as_str);
    let base = super::load_config(config_name)?;
    let steps = args.steps.clamp(1, 3);
    // The pools it measures are a GPU adapter's: a CPU backend keeps none (its rows were 0 B,
    // "+3968757600%" over the plan).
    let choice = args.device.gpu_choice()?;
    let device = select_device(choice)?;
    if !device.is_gpu() {
        anyhow::bail!(
            "bench memory measures a GPU adapter's memory pools and {} has none: run it with a wgpu adapter \
             (`vramfit devices`; a software one such as lavapipe will do)",
            device.name
        );
    }
    if let Some(cell) = &args.cell {
        let cell = crate::bench::memory::MemoryCell::parse(cell)?;
        let row = crate::bench::memory::measure_cell(config_name, &base, &device, &cell, steps, !args.dry_run_only);
        println!("{}", serde_json::to_string(&row)?);
        return Ok(None);
    }
    if let Some(n) = args.random {
        return bench_memory_random(args, n, steps, choice, &device).map(Some);
    }
    let grid = crate::bench::memory::MemoryGrid::named(&args.grid)
        .ok_or_else(|| anyhow::anyhow!("--grid must be tiny, small, tiers or full"))?;
    let (rows, adapter) = if args.fresh {
        let rows = grid
            .cells()
            .iter()
            .map(|cell| {
                let row = memory_cell_in_child(config_name, &base, cell, steps, choice, args.dry_run_only);
                eprintln!("{row:?}");
                row
            })
            .collect::<Vec<_>>();
        (rows, format!("{} (each cell in a fresh process)", device.name))
    } else {
        let rows = crate::bench::memory::bench_memory(
            config_name,
            &base,
            &device,
            &grid,
            steps,
            !args.dry_run_only,
            &mut |line| eprintln!("{line}"),
        );
        (rows, device.name)
    };
    println!("adapter: {adapter}\n{}", crate::bench::memory::memory_table(&rows));
    Ok(Some(serde_json::to_string_pretty(&rows)?))
}

/// `bench memory --random N`: `n` cells drawn by [`crate::bench::memory::random_cells`], each
/// measured in a process of its own, then the table and the plan's error summary; the JSON of the
/// rows and the summary.
fn bench_memory_random(
    args: &BenchArgs,
    n: usize,
    steps: usize,
    choice: crate::device::DeviceChoice,
    device: &crate::device::SelectedDevice,
) -> anyhow::Result<String> {
    use crate::bench::memory::{ErrorSummary, SHIPPED_NETWORKS, random_cells};
    let networks = SHIPPED_NETWORKS
        .iter()
        .map(|name| Ok((name.to_string(), super::load_config(name)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let buffer_limit = device.buffer_limit();
    let max_plan = args.max_plan_mib.map(|mib| mib << 20);
    let (cells, redrawn) = random_cells(n, args.seed, &networks, |base, cell| {
        let est = crate::memory::estimate(&cell.config(base), cell.micro_batch, cell.num_classes);
        let step_mpx = (cell.micro_batch * cell.grad_accum_steps * cell.image_px * cell.image_px) as f64 / 1e6;
        buffer_limit.is_none_or(|l| est.largest_tensor <= l)
            && max_plan.is_none_or(|m| est.total <= m)
            && args.max_step_mpx.is_none_or(|m| step_mpx <= m)
    });
    eprintln!(
        "{} cells drawn with seed {} ({redrawn} drawn again: over the buffer limit, --max-plan-mib or --max-step-mpx)",
        cells.len(),
        args.seed
    );
    let mut rows = Vec::new();
    for (i, (name, cell)) in cells.iter().enumerate() {
        let base = &networks.iter().find(|(n, _)| n == name).expect("drawn from these").1;
        let row = memory_cell_in_child(name, base, cell, steps, choice, args.dry_run_only);
        eprintln!(
            "[{}/{}] {name} --cell {}: plan {:+.1}%, dry run {:+.1}%",
            i + 1,
            cells.len(),
            cell.to_arg(),
            row.error_percent,
            row.dry_run_error_percent
        );
        rows.push(row);
    }
    let summary = ErrorSummary::of(&rows);
    let (dry_run, exact) = (ErrorSummary::of_dry_run(&rows), ErrorSummary::of_exact(&rows));
    println!(
        "adapter: {} (each cell in a fresh process; seed {})\n{}\nthe plan: {}\nthe dry run: {}\nplan --exact (the smaller): {}",
        device.name,
        args.seed,
        crate::bench::memory::memory_table(&rows),
        summary.text(),
        dry_run.text(),
        exact.text()
    );
    Ok(serde_json::to_string_pretty(&serde_json::json!({
        "seed": args.seed,
        "rows": rows,
        "summary": summary,
        "dry_run_summary": dry_run,
        "exact_summary": exact,
    }))?)
}
