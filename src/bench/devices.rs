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
    /// Training images per second over the timed steps, all devices together: the median of
    /// the rounds.
    pub images_per_sec: f64,
    /// Each round's images per second, in round order.
    pub rounds: Vec<f64>,
}

impl DevicesRow {
    /// Images per second per device (the total divided by the devices).
    pub fn per_device(&self) -> f64 {
        self.images_per_sec / self.devices.len() as f64
    }
}

/// Measures `config` on `devices[..1]`, `devices[..2]`, ... `devices`: `warmup` untimed and
/// `steps` timed optimizer steps of `devices.len()` micro-batches of `config.train.batch_size`
/// synthetic images each ([`crate::train::measure_data_parallel`]), in `rounds` rounds that take
/// the rows in turn, every other round in reverse order, so that a machine whose speed drifts
/// favours no row. `log` gets a line per measurement as it starts.
///
/// # Errors
/// [`crate::Error::Device`] when a device fails.
pub fn bench_devices(
    config: &Config,
    devices: &[SelectedDevice],
    warmup: usize,
    steps: usize,
    rounds: usize,
    log: &mut dyn FnMut(String),
) -> Result<Vec<DevicesRow>> {
    let mut config = config.clone();
    config.train.grad_accum_steps = devices.len();
    let mut rows: Vec<DevicesRow> = (1..=devices.len())
        .map(|k| DevicesRow {
            devices: devices[..k].iter().map(|d| d.name.clone()).collect(),
            micro_batch: config.train.batch_size,
            micro_batches_per_step: devices.len(),
            images_per_sec: f64::NAN,
            rounds: Vec::new(),
        })
        .collect();
    for round in 0..rounds.max(1) {
        let order: Vec<usize> =
            if round % 2 == 0 { (0..rows.len()).collect() } else { (0..rows.len()).rev().collect() };
        for k in order {
            log(format!("round {}: bench {} on {}", round + 1, config.name, rows[k].devices.join(" + ")));
            let on = &devices[..=k];
            let rate = crate::train::measure_data_parallel(&config, on, super::BENCH_CLASSES, warmup, steps)?;
            rows[k].rounds.push(rate);
        }
    }
    for row in &mut rows {
        let mut sorted = row.rounds.clone();
        sorted.sort_by(f64::total_cmp);
        row.images_per_sec = sorted[sorted.len() / 2];
    }
    Ok(rows)
}

/// The rows as a Markdown table: each row's median, its rounds, and its rounds against the
/// first row's same rounds (min-max of the ratios).
pub fn table(rows: &[DevicesRow]) -> String {
    let mut s = String::from(
        "| devices | micro-batch x per step | train img/s (median) | rounds | per device | vs one device, per round |\n|---|---|---|---|---|---|\n",
    );
    let one = rows.first().map_or(&[][..], |r| r.rounds.as_slice());
    for r in rows {
        let ratios: Vec<f64> = r.rounds.iter().zip(one).map(|(x, o)| x / o).collect();
        let (low, high) = ratios.iter().fold((f64::INFINITY, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
        let rounds: Vec<String> = r.rounds.iter().map(|x| format!("{x:.0}")).collect();
        s.push_str(&format!(
            "| {} | {} x {} | {:.1} | {} | {:.1} | {low:.2}-{high:.2}x |\n",
            r.devices.join(" + "),
            r.micro_batch,
            r.micro_batches_per_step,
            r.images_per_sec,
            rounds.join(", "),
            r.per_device(),
        ));
    }
    s
}
