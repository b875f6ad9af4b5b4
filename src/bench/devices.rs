//! `vramfit bench devices`: training throughput on one device, then on the first two, ... of a
//! `--devices` list (data parallelism, [`crate::train::TrainRequest::replicas`]), with the same
//! work per optimizer step in every row (one micro-batch per listed device), so the rows compare
//! what the extra devices add, or cost.

use serde::Serialize;

use crate::config::Config;
use crate::device::SelectedDevice;
use crate::engine::error::Result;

/// One row: the config on the first `devices.len()` devices.
#[derive(Clone, Debug, Serialize)]
pub struct DevicesRow {
    /// The devices by name, the main one first.
    pub devices: Vec<String>,
    /// Images per loader batch (one micro-batch).
    pub micro_batch: usize,
    /// Micro-batches per optimizer step (the same in every row).
    pub micro_batches_per_step: usize,
    /// Training images per second over the timed steps, all devices together.
    pub images_per_sec: f64,
}

impl DevicesRow {
    /// Images per second per device (the total divided by the devices).
    pub fn per_device(&self) -> f64 {
        self.images_per_sec / self.devices.len() as f64
    }
}

/// Measures `config` on `devices[..1]`, `devices[..2]`, ... `devices` in turn: `warmup` untimed
/// and `steps` timed optimizer steps of `devices.len()` micro-batches of
/// `config.train.batch_size` synthetic images each ([`crate::train::measure_data_parallel`]).
/// `log` gets a line per row as it starts.
///
/// # Errors
/// [`crate::Error::Device`] when a device fails.
pub fn bench_devices(
    config: &Config,
    devices: &[SelectedDevice],
    warmup: usize,
    steps: usize,
    log: &mut dyn FnMut(String),
) -> Result<Vec<DevicesRow>> {
    let mut config = config.clone();
    config.train.grad_accum_steps = devices.len();
    let mut rows = Vec::new();
    for k in 1..=devices.len() {
        let names: Vec<String> = devices[..k].iter().map(|d| d.name.clone()).collect();
        log(format!("bench {} on {}", config.name, names.join(" + ")));
        let images_per_sec =
            crate::train::measure_data_parallel(&config, &devices[..k], super::BENCH_CLASSES, warmup, steps)?;
        rows.push(DevicesRow {
            devices: names,
            micro_batch: config.train.batch_size,
            micro_batches_per_step: devices.len(),
            images_per_sec,
        });
    }
    Ok(rows)
}

/// The rows as a Markdown table, with each row's throughput against the first's.
pub fn table(rows: &[DevicesRow]) -> String {
    let mut s = String::from(
        "| devices | micro-batch x per step | train img/s | per device | vs one device |\n|---|---|---|---|---|\n",
    );
    let one = rows.first().map_or(f64::NAN, |r| r.images_per_sec);
    for r in rows {
        s.push_str(&format!(
            "| {} | {} x {} | {:.1} | {:.1} | {:.2}x |\n",
            r.devices.join(" + "),
            r.micro_batch,
            r.micro_batches_per_step,
            r.images_per_sec,
            r.per_device(),
            r.images_per_sec / one
        ));
    }
    s
}
