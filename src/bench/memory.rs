//! `vramfit bench memory`: the plan ([`crate::memory::estimate`]) against the device, cell by
//! cell over batch size x image size x precision x checkpointing.
//!
//! A cell trains a few steps on synthetic images and reads the device's memory three ways: the
//! tracker's samples at the end of each forward pass (bytes in use there, what the activation
//! terms are fitted to), a [`MemoryProbe`] reading from its own thread during the whole step
//! (the backward pass and its recomputed checkpoint segments included), and the pools' high-water
//! mark. The plan's `total` is compared with the largest bytes reserved: reserved bytes, not bytes
//! in use, are what a card runs out of.
//!
//! A device's pools keep their pages between cells, so a cell measured after a larger one reads
//! the larger one's reservation. `--fresh` runs every cell in a process of its own (the client
//! spawns them; see `vramfit bench memory --cell`), which is what the README's table uses.

use serde::{Deserialize, Serialize};

use crate::bench::BENCH_CLASSES;
use crate::config::{Config, Precision};
use crate::device::SelectedDevice;
use crate::engine::error::{Error, Result};
use crate::memory::{self, human_bytes};

/// One configuration to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryCell {
    /// Micro-batch (no accumulation).
    pub batch_size: usize,
    /// Input side in pixels (crop size = load size).
    pub image_px: usize,
    /// Training precision.
    pub precision: Precision,
    /// Activation checkpointing.
    pub checkpointing: bool,
}

impl MemoryCell {
    /// `32,224,f32,on`: the form [`MemoryCell::parse`] reads, for a cell's own process.
    pub fn to_arg(&self) -> String {
        format!(
            "{},{},{},{}",
            self.batch_size,
            self.image_px,
            self.precision.name(),
            if self.checkpointing { "on" } else { "off" }
        )
    }

    /// Reads `BATCH,PX,f32|f16,on|off`.
    ///
    /// # Errors
    /// [`Error::Config`] naming the part that does not parse.
    pub fn parse(arg: &str) -> Result<Self> {
        let bad = |what: &str| Error::Config {
            source_name: "--cell".into(),
            message: format!("{arg:?}: {what}; expected BATCH,PX,f32|f16,on|off"),
        };
        let parts: Vec<&str> = arg.split(',').map(str::trim).collect();
        let [batch, px, precision, checkpointing] = parts[..] else {
            return Err(bad("four parts needed"));
        };
        Ok(Self {
            batch_size: batch.parse().ok().filter(|&b| b > 0).ok_or_else(|| bad("batch is not a positive integer"))?,
            image_px: px.parse().ok().filter(|&p| p >= 8).ok_or_else(|| bad("px is not an integer >= 8"))?,
            precision: match precision {
                "f32" => Precision::F32,
                "f16" => Precision::F16,
                _ => return Err(bad("precision is not f32 or f16")),
            },
            checkpointing: match checkpointing {
                "on" => true,
                "off" => false,
                _ => return Err(bad("checkpointing is not on or off")),
            },
        })
    }

    /// `base` with this cell's batch, size, precision and checkpointing.
    pub fn config(&self, base: &Config) -> Config {
        let mut c = base.clone();
        c.train.batch_size = self.batch_size;
        c.train.grad_accum_steps = 1;
        c.train.precision = self.precision;
        c.train.checkpointing = self.checkpointing;
        c.data.preprocess.crop_size = self.image_px;
        c.data.preprocess.load_size = self.image_px;
        c
    }
}

/// The cells of `bench memory`: every combination of the four lists.
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
    /// `full`: batch {4, 8, 16, 32} x {64, 128, 224} px; `tiers`: batch {4, 8, 16, 32} at 224 px
    /// (the tier presets' input size and batch sizes); `small`: batch {4, 8} x {32, 64} px;
    /// `tiny`: batch 8 at 64 px (the CI test on a software adapter). Each: f32 and f16 x
    /// checkpointing off and on.
    pub fn named(name: &str) -> Option<Self> {
        let (batch_sizes, image_px) = match name {
            "full" => (vec![4, 8, 16, 32], vec![64, 128, 224]),
            "tiers" => (vec![4, 8, 16, 32], vec![224]),
            "small" => (vec![4, 8], vec![32, 64]),
            "tiny" => (vec![8], vec![64]),
            _ => return None,
        };
        Some(Self {
            batch_sizes,
            image_px,
            precisions: vec![Precision::F32, Precision::F16],
            checkpointing: vec![false, true],
        })
    }

    /// The cells in the order they are measured: precision, checkpointing, size, batch.
    pub fn cells(&self) -> Vec<MemoryCell> {
        let mut cells = Vec::new();
        for &precision in &self.precisions {
            for &checkpointing in &self.checkpointing {
                for &image_px in &self.image_px {
                    for &batch_size in &self.batch_sizes {
                        cells.push(MemoryCell { batch_size, image_px, precision, checkpointing });
                    }
                }
            }
        }
        cells
    }
}

/// One cell of `bench memory` (bytes unless named otherwise).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemoryBenchRow {
    /// Micro-batch.
    pub batch_size: usize,
    /// Image side in pixels.
    pub image_px: usize,
    /// Precision, `f32` or `f16`.
    pub precision: String,
    /// Checkpointing on.
    pub checkpointing: bool,
    /// The plan's peak of bytes reserved (what the budget is checked against).
    pub predicted_bytes: u64,
    /// The plan's bytes in use at the end of the forward pass.
    pub predicted_in_use_bytes: u64,
    /// The plan's activations kept for backward.
    pub predicted_activation_bytes: u64,
    /// Largest bytes reserved read during the steps (tracker and probe): the measured peak.
    pub measured_reserved_bytes: u64,
    /// Largest bytes in use at the end of a forward pass.
    pub measured_in_use_bytes: u64,
    /// Largest bytes reserved a probe read during the first step, before the pools' free pages
    /// were handed back (the first step at a new shape autotunes with buffers of its own). The
    /// probe reads between the device's operations and misses peaks inside the first step (747
    /// MiB read for a batch-32 step holding 1.81 GiB): a lower bound only.
    #[serde(default)]
    pub first_step_reserved_bytes: u64,
    /// Largest bytes in use read by the probe during the steps (backward included).
    pub measured_peak_in_use_bytes: u64,
    /// The pools' high-water mark: sum of page size x peak pages over the pools (an upper bound,
    /// counting pages that were never held at the same time; the first step included, as the
    /// pools keep their peak counts through a cleanup).
    pub pools_high_water_bytes: u64,
    /// Measured activations: bytes in use after forward minus the terms that are not activations
    /// (parameters, AdamW state, f16 weight copies, input: exact sizes).
    pub measured_activation_bytes: u64,
    /// (predicted peak - measured reserved) / measured reserved, in percent: positive when the plan
    /// is on the safe side.
    pub error_percent: f64,
    /// (predicted in use - measured in use) / measured in use at the end of forward, in percent.
    pub in_use_error_percent: f64,
    /// Why the cell was not measured.
    pub skipped: Option<String>,
}

impl MemoryBenchRow {
    /// The row of `cell` with the plan's figures and nothing measured yet.
    pub fn planned(base: &Config, cell: &MemoryCell) -> Self {
        Self::with_estimate(cell, &memory::estimate(&cell.config(base), cell.batch_size, BENCH_CLASSES))
    }

    fn with_estimate(cell: &MemoryCell, est: &memory::MemoryEstimate) -> Self {
        Self {
            batch_size: cell.batch_size,
            image_px: cell.image_px,
            precision: cell.precision.name().into(),
            checkpointing: cell.checkpointing,
            predicted_bytes: est.total,
            predicted_in_use_bytes: est.in_use_after_forward,
            predicted_activation_bytes: est.activations(),
            measured_reserved_bytes: 0,
            first_step_reserved_bytes: 0,
            measured_in_use_bytes: 0,
            measured_peak_in_use_bytes: 0,
            pools_high_water_bytes: 0,
            measured_activation_bytes: 0,
            error_percent: f64::NAN,
            in_use_error_percent: f64::NAN,
            skipped: None,
        }
    }
}

/// Measures one cell on `device` over `steps` steps after one warm-up step; a cell the adapter
/// cannot hold (no shader f16, a tensor over its buffer limit, a device error) comes back with
/// `skipped` set.
pub fn measure_cell(base: &Config, device: &SelectedDevice, cell: &MemoryCell, steps: usize) -> MemoryBenchRow {
    let c = cell.config(base);
    let est = memory::estimate(&c, cell.batch_size, BENCH_CLASSES);
    let mut row = MemoryBenchRow::with_estimate(cell, &est);
    if cell.precision == Precision::F16 && !device.supports_f16() {
        row.skipped = Some("adapter has no shader f16".into());
        return row;
    }
    if let Some(limit) = device.buffer_limit().filter(|&l| est.largest_tensor > l) {
        row.skipped = Some(format!(
            "largest tensor {} over the adapter's {} buffer limit",
            human_bytes(est.largest_tensor),
            human_bytes(limit)
        ));
        return row;
    }
    device.device.memory_cleanup();
    match crate::train::measure_step_memory(&c, device, BENCH_CLASSES, steps.max(1)) {
        Ok(mem) => {
            row.measured_in_use_bytes = mem.tracker.peak_bytes_in_use;
            row.measured_peak_in_use_bytes = mem.probe.bytes_in_use.max(mem.tracker.peak_bytes_in_use);
            row.measured_reserved_bytes = mem.probe.bytes_reserved.max(mem.tracker.peak_bytes_reserved);
            row.pools_high_water_bytes = mem.tracker.pools_high_water;
            row.first_step_reserved_bytes = mem.first_step_reserved_bytes;
            let fixed = est.in_use_after_forward - est.activations();
            row.measured_activation_bytes = mem.tracker.peak_bytes_in_use.saturating_sub(fixed);
            row.in_use_error_percent = percent_error(est.in_use_after_forward, mem.tracker.peak_bytes_in_use);
            row.error_percent = percent_error(est.total, row.measured_reserved_bytes);
        }
        Err(e) => row.skipped = Some(e.to_string()),
    }
    row
}

fn percent_error(predicted: u64, measured: u64) -> f64 {
    (predicted as f64 - measured as f64) / measured.max(1) as f64 * 100.0
}

/// Measures every cell of `grid` on `device` in this process, in order (see the module docs for
/// why `--fresh` exists).
pub fn bench_memory(
    base: &Config,
    device: &SelectedDevice,
    grid: &MemoryGrid,
    steps: usize,
    log: &mut dyn FnMut(String),
) -> Vec<MemoryBenchRow> {
    grid.cells()
        .iter()
        .map(|cell| {
            let row = measure_cell(base, device, cell, steps);
            log(format!("{row:?}"));
            row
        })
        .collect()
}

/// `bench memory` rows as a Markdown table.
pub fn memory_table(rows: &[MemoryBenchRow]) -> String {
    let mut s = String::from(
        "| batch | px | precision | checkpointing | predicted peak | measured reserved | error | pools high-water | in use after forward (predicted / measured) | peak in use | first step reserved |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let head = format!(
            "| {} | {} | {} | {} | {} ",
            r.batch_size,
            r.image_px,
            r.precision,
            on_off(r.checkpointing),
            human_bytes(r.predicted_bytes)
        );
        match &r.skipped {
            Some(why) => s.push_str(&format!("{head}| skipped: {why} | | | | | |\n")),
            None => s.push_str(&format!(
                "{head}| {} | {:+.1}% | {} | {} / {} | {} | {} |\n",
                human_bytes(r.measured_reserved_bytes),
                r.error_percent,
                human_bytes(r.pools_high_water_bytes),
                human_bytes(r.predicted_in_use_bytes),
                human_bytes(r.measured_in_use_bytes),
                human_bytes(r.measured_peak_in_use_bytes),
                human_bytes(r.first_step_reserved_bytes),
            )),
        }
    }
    s
}

fn on_off(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_round_trip_through_their_argument_and_bad_ones_name_the_part() {
        for cell in MemoryGrid::named("full").unwrap().cells() {
            assert_eq!(MemoryCell::parse(&cell.to_arg()).unwrap(), cell);
        }
        assert_eq!(MemoryGrid::named("full").unwrap().cells().len(), 4 * 3 * 2 * 2);
        let err = MemoryCell::parse("32,224,bf16,on").unwrap_err().to_string();
        assert!(err.contains("precision is not f32 or f16"), "{err}");
        assert!(MemoryCell::parse("0,224,f32,on").unwrap_err().to_string().contains("batch"));
        assert!(MemoryCell::parse("32,224,f32").unwrap_err().to_string().contains("four parts"));
    }
}
