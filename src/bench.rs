//! Benchmarks behind `vramfit bench`: training/inference throughput per backend, and predicted
//! vs measured memory over a grid of batch sizes, image sizes, precisions and checkpointing.

use std::time::Instant;

use serde::Serialize;

use crate::config::{Config, Precision};
use crate::device::{self, CpuBackend, DeviceChoice, SelectedDevice};
use crate::error::Result;
use crate::memory::{self, human_bytes};
use crate::model::{forward_flops, layer_plan};

/// Classes used by the synthetic benchmarks.
pub const BENCH_CLASSES: usize = 10;

/// One row of `bench train`.
#[derive(Clone, Debug, Serialize)]
pub struct TrainBenchRow {
    /// Config name.
    pub config: String,
    /// Device name.
    pub backend: String,
    /// Micro-batch.
    pub batch_size: usize,
    /// Input side in pixels.
    pub image_px: usize,
    /// Precision.
    pub precision: String,
    /// Training images per second.
    pub train_images_per_sec: f64,
    /// Inference images per second (same batch).
    pub infer_images_per_sec: f64,
    /// Achieved training GFLOP/s (3 x forward FLOPs per image).
    pub train_gflops: f64,
    /// Peak bytes_in_use sampled (GPU only).
    pub peak_bytes_in_use: Option<u64>,
    /// Median latency of one image at 224 px, milliseconds.
    pub latency_224_ms: f64,
    /// Error, when the row could not run.
    pub error: Option<String>,
}

fn devices_for(backends: &[String], adapter: Option<usize>) -> Vec<Result<SelectedDevice>> {
    backends
        .iter()
        .map(|b| match b.as_str() {
            "gpu" => device::select(DeviceChoice::Gpu(adapter))
                .and_then(|d| if d.is_gpu() { Ok(d) } else { Err(crate::Error::Device("no GPU adapter".into())) }),
            "ndarray" => device::select(DeviceChoice::Cpu(CpuBackend::Ndarray)),
            _ => device::select(DeviceChoice::Cpu(CpuBackend::Flex)),
        })
        .collect()
}

fn infer_rate(config: &Config, device: &SelectedDevice, repeats: usize) -> Result<f64> {
    let model = crate::model::Classifier::new(&config.model, BENCH_CLASSES, &device.device);
    let batch = crate::train::synthetic_batch(config, BENCH_CLASSES);
    let n = batch.len();
    let run = || -> Result<()> {
        let (x, _) = crate::eval::batch_tensors(batch.clone(), &device.device);
        model.forward(x, Precision::F32).try_into_data().map_err(|e| crate::Error::device(&e))?;
        Ok(())
    };
    run()?;
    let start = Instant::now();
    for _ in 0..repeats {
        run()?;
    }
    Ok((n * repeats) as f64 / start.elapsed().as_secs_f64())
}

/// Median milliseconds to predict one 224 px image with the default network.
pub fn latency_224_ms(device: &SelectedDevice, repeats: usize) -> Result<f64> {
    let mut config = Config::default();
    config.train.batch_size = 1;
    let model = crate::model::Classifier::new(&config.model, BENCH_CLASSES, &device.device);
    let batch = crate::train::synthetic_batch(&config, BENCH_CLASSES);
    let mut times = Vec::new();
    for i in 0..repeats + 1 {
        let start = Instant::now();
        let (x, _) = crate::eval::batch_tensors(batch.clone(), &device.device);
        model.forward(x, Precision::F32).try_into_data().map_err(|e| crate::Error::device(&e))?;
        if i > 0 {
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Runs `bench train` for every config on every backend. `log` receives progress lines.
///
/// # Errors
/// Only for unusable configs; device failures become rows with `error` set.
pub fn bench_train(
    configs: &[Config],
    backends: &[String],
    adapter: Option<usize>,
    warmup: usize,
    steps: usize,
    log: &mut dyn FnMut(String),
) -> Result<Vec<TrainBenchRow>> {
    let mut rows = Vec::new();
    for d in devices_for(backends, adapter) {
        let device = match d {
            Ok(d) => d,
            Err(e) => {
                log(format!("skipping a backend: {e}"));
                continue;
            }
        };
        let latency = latency_224_ms(&device, 5).unwrap_or(f64::NAN);
        for config in configs {
            log(format!("bench {} on {}", config.name, device.name));
            let px = config.image_size_px();
            let flops = forward_flops(&layer_plan(&config.model, BENCH_CLASSES, (px, px))) as f64;
            let mut row = TrainBenchRow {
                config: config.name.clone(),
                backend: device.name.clone(),
                batch_size: config.train.batch_size,
                image_px: px,
                precision: format!("{:?}", config.train.precision).to_lowercase(),
                train_images_per_sec: f64::NAN,
                infer_images_per_sec: f64::NAN,
                train_gflops: f64::NAN,
                peak_bytes_in_use: None,
                latency_224_ms: latency,
                error: None,
            };
            let mut one_step = config.clone();
            one_step.train.grad_accum_steps = 1;
            match crate::train::measure_training(&one_step, &device, BENCH_CLASSES, warmup, steps, true) {
                Ok((ips, mem)) => {
                    row.train_images_per_sec = ips;
                    row.train_gflops = ips * 3.0 * flops / 1e9;
                    row.peak_bytes_in_use = (mem.peak_bytes_in_use > 0).then_some(mem.peak_bytes_in_use);
                    row.infer_images_per_sec = infer_rate(config, &device, steps).unwrap_or(f64::NAN);
                }
                Err(e) => row.error = Some(e.to_string()),
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

/// `bench train` rows as a Markdown table.
pub fn train_table(rows: &[TrainBenchRow]) -> String {
    let mut s = String::from(
        "| config | backend | batch | px | precision | train img/s | infer img/s | train GFLOP/s | peak in use | 1-image 224 px latency |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        if let Some(e) = &r.error {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | failed: {e} | | | | |\n",
                r.config, r.backend, r.batch_size, r.image_px, r.precision
            ));
            continue;
        }
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.2} | {} | {:.1} ms |\n",
            r.config,
            r.backend,
            r.batch_size,
            r.image_px,
            r.precision,
            r.train_images_per_sec,
            r.infer_images_per_sec,
            r.train_gflops,
            r.peak_bytes_in_use.map_or("n/a (CPU)".into(), human_bytes),
            r.latency_224_ms
        ));
    }
    s
}

/// The cells of `bench memory`.
#[derive(Clone, Debug)]
pub struct MemoryGrid {
    /// Micro-batch sizes.
    pub batch_sizes: Vec<usize>,
    /// Image sides in pixels.
    pub image_px: Vec<usize>,
    /// Precisions.
    pub precisions: Vec<Precision>,
    /// Checkpointing settings.
    pub checkpointing: Vec<bool>,
}

impl MemoryGrid {
    /// `full`: batch {4, 8, 16, 32} x {64, 128, 224} px x {f32, f16} x checkpointing {off, on};
    /// `small`: batch {4, 8} x {32, 64} px x {f32, f16} x {off, on}; `tiny`: batch 8, 64 px, f32 and
    /// f16, checkpointing off and on (the CI test on a software adapter).
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "full" => Some(Self {
                batch_sizes: vec![4, 8, 16, 32],
                image_px: vec![64, 128, 224],
                precisions: vec![Precision::F32, Precision::F16],
                checkpointing: vec![false, true],
            }),
            "small" => Some(Self {
                batch_sizes: vec![4, 8],
                image_px: vec![32, 64],
                precisions: vec![Precision::F32, Precision::F16],
                checkpointing: vec![false, true],
            }),
            "tiny" => Some(Self {
                batch_sizes: vec![8],
                image_px: vec![64],
                precisions: vec![Precision::F32, Precision::F16],
                checkpointing: vec![false, true],
            }),
            _ => None,
        }
    }
}

/// One cell of `bench memory`.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryBenchRow {
    /// Micro-batch.
    pub batch_size: usize,
    /// Image side in pixels.
    pub image_px: usize,
    /// Precision.
    pub precision: String,
    /// Checkpointing on.
    pub checkpointing: bool,
    /// Predicted peak bytes (reserved, what the budget is checked against).
    pub predicted_bytes: u64,
    /// Predicted bytes_in_use at the end of the forward pass.
    pub predicted_in_use_bytes: u64,
    /// Measured peak bytes_reserved.
    pub measured_reserved_bytes: u64,
    /// Measured peak bytes_in_use (after forward).
    pub measured_in_use_bytes: u64,
    /// Predicted bytes of activations kept for backward.
    pub predicted_activation_bytes: u64,
    /// Measured activations: measured bytes_in_use after forward minus the terms that are not
    /// activations (parameters, AdamW state, f16 weight copies, input: exact sizes).
    pub measured_activation_bytes: u64,
    /// (predicted in use - measured in use) / measured in use, in percent: both at the end of the
    /// forward pass, where the training peak begins.
    pub error_percent: f64,
    /// Why the cell was skipped.
    pub skipped: Option<String>,
}

/// Runs the memory grid on `device` with `base`'s network.
///
/// # Errors
/// None of its own; failing cells are reported as skipped.
pub fn bench_memory(
    base: &Config,
    device: &SelectedDevice,
    grid: &MemoryGrid,
    steps: usize,
    log: &mut dyn FnMut(String),
) -> Result<Vec<MemoryBenchRow>> {
    let mut rows = Vec::new();
    for &precision in &grid.precisions {
        for &checkpointing in &grid.checkpointing {
            for &px in &grid.image_px {
                for &batch in &grid.batch_sizes {
                    let mut c = base.clone();
                    c.train.batch_size = batch;
                    c.train.grad_accum_steps = 1;
                    c.train.precision = precision;
                    c.train.checkpointing = checkpointing;
                    c.data.preprocess.crop_size = px;
                    c.data.preprocess.load_size = px;
                    let est = memory::estimate(&c, batch, BENCH_CLASSES);
                    let mut row = MemoryBenchRow {
                        batch_size: batch,
                        image_px: px,
                        precision: format!("{precision:?}").to_lowercase(),
                        checkpointing,
                        predicted_bytes: est.total,
                        predicted_in_use_bytes: est.in_use_after_forward,
                        measured_reserved_bytes: 0,
                        measured_in_use_bytes: 0,
                        predicted_activation_bytes: est.activations(),
                        measured_activation_bytes: 0,
                        error_percent: f64::NAN,
                        skipped: None,
                    };
                    if precision == Precision::F16 && !device.supports_f16() {
                        row.skipped = Some("adapter has no shader f16".into());
                    } else if let Some(a) =
                        device.adapter.as_ref().filter(|a| est.largest_tensor > a.max_storage_buffer_binding_size)
                    {
                        row.skipped = Some(format!(
                            "largest tensor {} over the adapter's {} buffer limit",
                            human_bytes(est.largest_tensor),
                            human_bytes(a.max_storage_buffer_binding_size)
                        ));
                    } else {
                        device.device.memory_cleanup();
                        match crate::train::measure_training(&c, device, BENCH_CLASSES, 1, steps, true) {
                            Ok((_, mem)) => {
                                row.measured_reserved_bytes = mem.peak_bytes_reserved;
                                row.measured_in_use_bytes = mem.peak_bytes_in_use;
                                let fixed = est.in_use_after_forward - est.activations();
                                row.measured_activation_bytes = mem.peak_bytes_in_use.saturating_sub(fixed);
                                row.error_percent = (est.in_use_after_forward as f64 - mem.peak_bytes_in_use as f64)
                                    / mem.peak_bytes_in_use.max(1) as f64
                                    * 100.0;
                            }
                            Err(e) => row.skipped = Some(e.to_string()),
                        }
                    }
                    log(format!("{:?}", row));
                    rows.push(row);
                }
            }
        }
    }
    Ok(rows)
}

/// `bench memory` rows as a Markdown table.
pub fn memory_table(rows: &[MemoryBenchRow]) -> String {
    let mut s = String::from(
        "| batch | px | precision | checkpointing | predicted in use | measured in use | error | predicted peak (budget) | measured reserved |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        match &r.skipped {
            Some(why) => s.push_str(&format!(
                "| {} | {} | {} | {} | {} | skipped: {why} | | {} | |\n",
                r.batch_size,
                r.image_px,
                r.precision,
                r.checkpointing,
                human_bytes(r.predicted_in_use_bytes),
                human_bytes(r.predicted_bytes)
            )),
            None => s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {:+.1}% | {} | {} |\n",
                r.batch_size,
                r.image_px,
                r.precision,
                r.checkpointing,
                human_bytes(r.predicted_in_use_bytes),
                human_bytes(r.measured_in_use_bytes),
                r.error_percent,
                human_bytes(r.predicted_bytes),
                human_bytes(r.measured_reserved_bytes)
            )),
        }
    }
    s
}

/// This process's peak resident set in KiB (Linux `VmHWM`), `None` elsewhere.
pub fn peak_rss_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
}
