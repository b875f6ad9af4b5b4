//! Benchmarks behind `vramfit bench train`: training and inference throughput per backend
//! (`bench memory` is in [`crate::bench::memory`], `bench loader` in [`crate::bench::loader`]).

pub mod baseline;
pub mod data_health;
pub mod devices;
pub mod loader;
pub mod memory;

use web_time::Instant;

use serde::{Deserialize, Serialize};

use crate::config::{Config, Precision};
use crate::device::{self, CpuBackend, DeviceChoice, SelectedDevice};
use crate::engine::error::Result;
use crate::memory::human_bytes;
use crate::model::{forward_flops, layer_plan};

/// Classes used by the synthetic benchmarks.
pub const BENCH_CLASSES: usize = 10;

/// One row of `bench train`.
#[derive(Clone, Debug, Serialize, Deserialize)]
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
    #[serde(deserialize_with = "nan_from_null")]
    pub train_images_per_sec: f64,
    /// Inference images per second (same batch).
    #[serde(deserialize_with = "nan_from_null")]
    pub infer_images_per_sec: f64,
    /// Achieved training GFLOP/s (3 x forward FLOPs per image).
    #[serde(deserialize_with = "nan_from_null")]
    pub train_gflops: f64,
    /// Peak bytes_in_use sampled (GPU only).
    pub peak_bytes_in_use: Option<u64>,
    /// Seconds of the first training step ([`crate::train::TrainingRate::first_step_secs`]);
    /// for the first config of a bench nothing else ran on the device before it, so kernel
    /// compilation and autotuning are included unless an earlier run's caches hold them
    /// (cubecl's autotune cache, the driver's shader cache). Absent in older baselines.
    #[serde(default)]
    pub first_step_secs: Option<f64>,
    /// Median latency of one image at 224 px, milliseconds.
    #[serde(deserialize_with = "nan_from_null")]
    pub latency_224_ms: f64,
    /// Error, when the row could not run.
    pub error: Option<String>,
}

/// Reads a figure that JSON wrote as `null`: serde_json writes a NaN (a row that failed, a
/// latency that could not be measured) as `null`, which a plain `f64` field refuses.
fn nan_from_null<'de, D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
}

fn devices_for(backends: &[String], adapter: Option<usize>) -> Vec<Result<SelectedDevice>> {
    backends
        .iter()
        .map(|b| match b.as_str() {
            "gpu" => device::select(DeviceChoice::Gpu(adapter))
                .and_then(|d| if d.is_gpu() { Ok(d) } else { Err(crate::Error::Device("no GPU adapter".into())) }),
            #[cfg(not(target_arch = "wasm32"))]
            "ndarray" => device::select(DeviceChoice::Cpu(CpuBackend::Ndarray)),
            "flex" => device::select(DeviceChoice::Cpu(CpuBackend::Flex)),
            other => Err(crate::Error::Device(format!("unknown backend {other:?}: use gpu, flex or ndarray"))),
        })
        .collect()
}

fn infer_rate(config: &Config, device: &SelectedDevice, repeats: usize) -> Result<f64> {
    let model = crate::model::Classifier::new(&config.model, BENCH_CLASSES, &device.device);
    let batch = crate::train::synthetic_batch(config, BENCH_CLASSES);
    let n = batch.len();
    let run = || -> Result<()> {
        let (x, _) = batch.clone().into_tensors(&device.device);
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
        let (x, _) = batch.clone().into_tensors(&device.device);
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
        let first_row = rows.len();
        for config in configs {
            log(format!("bench {} on {}", config.name, device.name));
            let px = config.image_size_px();
            let flops = forward_flops(&layer_plan(&config.model, BENCH_CLASSES, (px, px))) as f64;
            let mut row = TrainBenchRow {
                config: config.name.clone(),
                backend: device.name.clone(),
                batch_size: config.train.batch_size,
                image_px: px,
                precision: config.train.precision.to_string(),
                train_images_per_sec: f64::NAN,
                infer_images_per_sec: f64::NAN,
                train_gflops: f64::NAN,
                peak_bytes_in_use: None,
                first_step_secs: None,
                latency_224_ms: f64::NAN,
                error: None,
            };
            let mut one_step = config.clone();
            one_step.train.grad_accum_steps = 1;
            match crate::train::measure_training(&one_step, &device, BENCH_CLASSES, warmup, steps, true) {
                Ok(rate) => {
                    let (ips, mem) = (rate.images_per_sec, rate.memory);
                    row.train_images_per_sec = ips;
                    row.train_gflops = ips * 3.0 * flops / 1e9;
                    row.peak_bytes_in_use = (mem.peak_bytes_in_use > 0).then_some(mem.peak_bytes_in_use);
                    row.first_step_secs = Some(rate.first_step_secs);
                    row.infer_images_per_sec = infer_rate(config, &device, steps).unwrap_or(f64::NAN);
                }
                Err(e) => row.error = Some(e.to_string()),
            }
            rows.push(row);
        }
        // After training, so that the first config's first step is the device's first work.
        let latency = latency_224_ms(&device, 5).unwrap_or(f64::NAN);
        rows[first_row..].iter_mut().for_each(|r| r.latency_224_ms = latency);
    }
    Ok(rows)
}

/// `bench train` rows as a Markdown table.
pub fn train_table(rows: &[TrainBenchRow]) -> String {
    let mut s = String::from(
        "| config | backend | batch | px | precision | train img/s | infer img/s | train GFLOP/s | peak in use | first step | 1-image 224 px latency |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        if let Some(e) = &r.error {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | failed: {e} | | | | | |\n",
                r.config, r.backend, r.batch_size, r.image_px, r.precision
            ));
            continue;
        }
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.2} | {} | {} | {:.1} ms |\n",
            r.config,
            r.backend,
            r.batch_size,
            r.image_px,
            r.precision,
            r.train_images_per_sec,
            r.infer_images_per_sec,
            r.train_gflops,
            r.peak_bytes_in_use.map_or("n/a (CPU)".into(), human_bytes),
            r.first_step_secs.map_or("n/a".into(), |s| format!("{s:.2} s")),
            r.latency_224_ms
        ));
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
