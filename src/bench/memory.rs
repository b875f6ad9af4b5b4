//! `vramfit bench memory`: the plan ([`crate::memory::estimate`]) against the device, cell by
//! cell over micro-batch x image size x precision x checkpointing (x accumulation x classes x
//! network for `--random`).
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

mod error_summary;
pub use error_summary::ErrorSummary;

use serde::{Deserialize, Serialize};

use crate::bench::BENCH_CLASSES;
use crate::config::{Config, Precision};
use crate::device::SelectedDevice;
use crate::engine::error::{Error, Result};
use crate::memory::{self, human_bytes};

/// One configuration to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryCell {
    /// Micro-batch.
    pub micro_batch: usize,
    /// Input side in pixels (crop size = load size).
    pub image_px: usize,
    /// Training precision.
    pub precision: Precision,
    /// Activation checkpointing.
    pub checkpointing: bool,
    /// Micro-batches per optimizer step (1: no accumulation buffer).
    pub grad_accum_steps: usize,
    /// Classes of the head.
    pub num_classes: usize,
}

impl MemoryCell {
    /// A cell without accumulation and with [`BENCH_CLASSES`] classes.
    pub fn new(micro_batch: usize, image_px: usize, precision: Precision, checkpointing: bool) -> Self {
        Self { micro_batch, image_px, precision, checkpointing, grad_accum_steps: 1, num_classes: BENCH_CLASSES }
    }

    /// `32,224,f32,on,1,10`: the form [`MemoryCell::parse`] reads, for a cell's own process.
    pub fn to_arg(&self) -> String {
        format!(
            "{},{},{},{},{},{}",
            self.micro_batch,
            self.image_px,
            self.precision.name(),
            if self.checkpointing { "on" } else { "off" },
            self.grad_accum_steps,
            self.num_classes,
        )
    }

    /// Reads `MICRO_BATCH,PX,f32|f16,on|off[,ACCUM,CLASSES]` (accumulation 1 and
    /// [`BENCH_CLASSES`] classes when the last two are left out).
    ///
    /// # Errors
    /// [`Error::Config`] naming the part that does not parse.
    pub fn parse(arg: &str) -> Result<Self> {
        let bad = |what: &str| Error::Config {
            source_name: "--cell".into(),
            message: format!("{arg:?}: {what}; expected MICRO_BATCH,PX,f32|f16,on|off[,ACCUM,CLASSES]"),
        };
        let parts: Vec<&str> = arg.split(',').map(str::trim).collect();
        let (batch, px, precision, checkpointing, accum, classes) = match parts[..] {
            [b, p, pr, c] => (b, p, pr, c, "1", ""),
            [b, p, pr, c, a, k] => (b, p, pr, c, a, k),
            _ => return Err(bad("four or six parts needed")),
        };
        Ok(Self {
            grad_accum_steps: accum
                .parse()
                .ok()
                .filter(|a| (1..=1024).contains(a))
                .ok_or_else(|| bad("accumulation is not an integer in 1..=1024"))?,
            num_classes: if classes.is_empty() { Ok(BENCH_CLASSES) } else { classes.parse() }
                .ok()
                .filter(|&k| k >= 2)
                .ok_or_else(|| bad("classes is not an integer >= 2"))?,
            micro_batch: batch
                .parse()
                .ok()
                .filter(|&b| b > 0)
                .ok_or_else(|| bad("micro-batch is not a positive integer"))?,
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

    /// `base` with this cell's batch, size, precision, checkpointing and accumulation.
    pub fn config(&self, base: &Config) -> Config {
        let mut c = base.clone();
        c.train.batch_size = self.micro_batch;
        c.train.grad_accum_steps = self.grad_accum_steps;
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
    pub micro_batches: Vec<usize>,
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
        let (micro_batches, image_px) = match name {
            "full" => (vec![4, 8, 16, 32], vec![64, 128, 224]),
            "tiers" => (vec![4, 8, 16, 32], vec![224]),
            "small" => (vec![4, 8], vec![32, 64]),
            "tiny" => (vec![8], vec![64]),
            _ => return None,
        };
        Some(Self {
            micro_batches,
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
                    for &micro_batch in &self.micro_batches {
                        cells.push(MemoryCell::new(micro_batch, image_px, precision, checkpointing));
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
    /// The config whose network was measured (a preset's name or a file), when the row says.
    #[serde(default, alias = "config")]
    pub network: String,
    /// Micro-batch.
    #[serde(alias = "batch_size")]
    pub micro_batch: usize,
    /// Image side in pixels.
    pub image_px: usize,
    /// Precision, `f32` or `f16`.
    pub precision: String,
    /// Checkpointing on.
    pub checkpointing: bool,
    /// Micro-batches per optimizer step.
    #[serde(default = "one")]
    pub grad_accum_steps: usize,
    /// Classes of the head.
    #[serde(default = "bench_classes")]
    pub num_classes: usize,
    /// Whether the step ran vramfit's fused GroupNorm + GELU (the plan is made for the same).
    #[serde(default)]
    pub fused_group_norm_gelu: bool,
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
    /// is on the safe side. NaN (JSON `null`) when not measured.
    #[serde(deserialize_with = "nan_if_null")]
    pub error_percent: f64,
    /// (predicted in use - measured in use) / measured in use at the end of forward, in percent.
    #[serde(deserialize_with = "nan_if_null")]
    pub in_use_error_percent: f64,
    /// The pools' pages after the last step (before any cleanup), in the order allocations are
    /// routed through them: cubecl's small pool, then the adaptive pool of the current page size,
    /// then any outdated ones. Bytes reserved beyond them are buffers outside the pools.
    #[serde(default)]
    pub pools: Vec<PoolPages>,
    /// Bytes reserved outside the dynamic pools after the last step, by what holds them
    /// ([`crate::device::memory_outside_the_pools`]).
    #[serde(default)]
    pub reserved_outside_the_pools: Vec<(String, u64)>,
    /// The bytes reserved by the same steps run under cubecl's dry run, in the same process
    /// after the measured steps and a cleanup ([`crate::train::dry_run_step_memory`], what
    /// `vramfit plan --exact` prints); 0 when the dry run did not run.
    #[serde(default)]
    pub dry_run_reserved_bytes: u64,
    /// (dry-run reserved - measured reserved) / measured reserved, in percent; NaN when either
    /// was not measured.
    #[serde(default = "not_measured", deserialize_with = "nan_if_null")]
    pub dry_run_error_percent: f64,
    /// Seconds the dry run took.
    #[serde(default)]
    pub dry_run_secs: f64,
    /// Why the cell was not measured.
    pub skipped: Option<String>,
    /// Why the dry run failed, where the real steps were measured.
    #[serde(default)]
    pub dry_run_skipped: Option<String>,
}

fn not_measured() -> f64 {
    f64::NAN
}

/// serde_json writes a NaN as `null`: read it back as NaN, so a row of a cell that was not
/// measured (skipped, or a dry run only) survives the trip from the child process.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
}

/// One pool's pages as the device reports them (`Device::memory_pool_report`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolPages {
    /// Bytes per page.
    pub page_size: u64,
    /// Pages held.
    pub pages: u64,
    /// The most pages held at once.
    pub pages_peak: u64,
    /// The largest allocation the pool served (bytes requested; burn's `largest_alloc`).
    pub largest_allocation: u64,
}

fn one() -> usize {
    1
}

fn bench_classes() -> usize {
    BENCH_CLASSES
}

impl MemoryBenchRow {
    /// What `vramfit plan --exact` would print for the cell: the smaller of the plan and the
    /// dry run ([`crate::memory::exact_peak`]; the plan when the dry run did not run).
    pub fn exact_bytes(&self) -> u64 {
        memory::exact_peak(self.predicted_bytes, self.dry_run_reserved_bytes)
    }

    /// The row of `cell` of the network of `base` (named `config`) with the plan's figures and
    /// nothing measured yet.
    pub fn planned(config: &str, base: &Config, cell: &MemoryCell) -> Self {
        let est = memory::estimate(&cell.config(base), cell.micro_batch, cell.num_classes);
        Self::with_estimate(config, cell, &est)
    }

    /// The cell this row measured.
    pub fn cell(&self) -> MemoryCell {
        MemoryCell {
            micro_batch: self.micro_batch,
            image_px: self.image_px,
            precision: if self.precision == "f16" { Precision::F16 } else { Precision::F32 },
            checkpointing: self.checkpointing,
            grad_accum_steps: self.grad_accum_steps,
            num_classes: self.num_classes,
        }
    }

    fn with_estimate(config: &str, cell: &MemoryCell, est: &memory::MemoryEstimate) -> Self {
        Self {
            network: config.into(),
            micro_batch: cell.micro_batch,
            image_px: cell.image_px,
            precision: cell.precision.name().into(),
            checkpointing: cell.checkpointing,
            grad_accum_steps: cell.grad_accum_steps,
            num_classes: cell.num_classes,
            fused_group_norm_gelu: crate::kernels::group_norm_gelu::runs_fused_on_gpu(),
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
            pools: Vec::new(),
            reserved_outside_the_pools: Vec::new(),
            dry_run_reserved_bytes: 0,
            dry_run_error_percent: f64::NAN,
            dry_run_secs: 0.0,
            skipped: None,
            dry_run_skipped: None,
        }
    }
}

/// Measures one cell on `device` over `steps` steps after one warm-up step, then (after a
/// cleanup) runs the same steps under cubecl's dry run ([`crate::train::dry_run_step_memory`]);
/// with `real_steps` false, only the dry run. A cell the adapter cannot hold (no shader f16, a
/// tensor over its buffer limit, a device error) comes back with `skipped` set.
pub fn measure_cell(
    config: &str,
    base: &Config,
    device: &SelectedDevice,
    cell: &MemoryCell,
    steps: usize,
    real_steps: bool,
) -> MemoryBenchRow {
    let c = cell.config(base);
    let est = memory::estimate(&c, cell.micro_batch, cell.num_classes);
    let mut row = MemoryBenchRow::with_estimate(config, cell, &est);
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
    if real_steps {
        measure_steps(&mut row, &c, &est, device, cell, steps);
    }
    if row.skipped.is_none() {
        device.device.memory_cleanup();
        match crate::train::dry_run_step_memory(&c, device, cell.num_classes, steps.max(1)) {
            Ok(dry) => {
                row.dry_run_reserved_bytes = dry.bytes_reserved;
                row.dry_run_secs = dry.secs;
                if real_steps {
                    row.dry_run_error_percent = percent_error(dry.bytes_reserved, row.measured_reserved_bytes);
                }
            }
            Err(e) if real_steps => row.dry_run_skipped = Some(e.to_string()),
            Err(e) => row.skipped = Some(format!("dry run: {e}")),
        }
    }
    row
}

/// The measured columns of `row`: `steps` real steps of `c` after a first one.
fn measure_steps(
    row: &mut MemoryBenchRow,
    c: &Config,
    est: &memory::MemoryEstimate,
    device: &SelectedDevice,
    cell: &MemoryCell,
    steps: usize,
) {
    match crate::train::measure_step_memory(c, device, cell.num_classes, steps.max(1)) {
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
            row.pools = device
                .device
                .memory_pool_report()
                .unwrap_or_default()
                .iter()
                .map(|p| PoolPages {
                    page_size: p.page_size,
                    pages: p.pages,
                    pages_peak: p.pages_peak,
                    largest_allocation: p.largest_alloc,
                })
                .collect();
            row.reserved_outside_the_pools =
                crate::device::memory_outside_the_pools(&device.device).unwrap_or_default();
        }
        Err(e) => row.skipped = Some(e.to_string()),
    }
}

fn percent_error(predicted: u64, measured: u64) -> f64 {
    (predicted as f64 - measured as f64) / measured.max(1) as f64 * 100.0
}

/// Measures every cell of `grid` on `device` in this process, in order (see the module docs for
/// why `--fresh` exists).
pub fn bench_memory(
    config: &str,
    base: &Config,
    device: &SelectedDevice,
    grid: &MemoryGrid,
    steps: usize,
    real_steps: bool,
    log: &mut dyn FnMut(String),
) -> Vec<MemoryBenchRow> {
    grid.cells()
        .iter()
        .map(|cell| {
            let row = measure_cell(config, base, device, cell, steps, real_steps);
            log(format!("{row:?}"));
            row
        })
        .collect()
}

/// `bench memory` rows as a Markdown table.
pub fn memory_table(rows: &[MemoryBenchRow]) -> String {
    let mut s = String::from(
        "| network | micro-batch | px | precision | checkpointing | accumulation | classes | predicted peak | measured reserved | error | pools high-water | in use after forward (predicted / measured) | peak in use | first step reserved |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let head = format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} ",
            r.network,
            r.micro_batch,
            r.image_px,
            r.precision,
            on_off(r.checkpointing),
            r.grad_accum_steps,
            r.num_classes,
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

/// The networks vramfit ships: quickstart's (three stages; `fashion-mnist` has the same) and the
/// tiers' (five stages; `4gb` to `12gb` share it), by a preset that has each.
pub const SHIPPED_NETWORKS: [&str; 2] = ["quickstart", "12gb"];

/// Draws `n` cells at random, seeded by `seed` (the same `seed` and `networks` give the same
/// cells): a network of `networks` (name, config), micro-batch 1-64 and classes 2-1000
/// (log-uniform, so small values are drawn as often as large ones), image side 64-320 px
/// (uniform), f32 or f16, checkpointing on or off, accumulation 1-4. A cell `runs` refuses (a
/// tensor over the adapter's buffer limit, a plan over what the bench may spend) is drawn again;
/// returns the cells and how many were drawn again. The same `seed` gives the same cells only
/// with the same `runs` (same adapter limits, `--max-plan-mib`, `--max-step-mpx` and plan).
pub fn random_cells(
    n: usize,
    seed: u64,
    networks: &[(String, Config)],
    runs: impl Fn(&Config, &MemoryCell) -> bool,
) -> (Vec<(String, MemoryCell)>, usize) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let log_uniform = |rng: &mut rand::rngs::SmallRng, lo: f64, hi: f64| {
        (lo.ln() + rng.random::<f64>() * (hi.ln() - lo.ln())).exp().round() as usize
    };
    let (mut cells, mut redrawn) = (Vec::new(), 0);
    while cells.len() < n && !networks.is_empty() && redrawn < 1000 * n.max(1) {
        let (name, base) = &networks[rng.random_range(0..networks.len())];
        let cell = MemoryCell {
            micro_batch: log_uniform(&mut rng, 1.0, 64.0),
            image_px: rng.random_range(64..=320),
            precision: if rng.random_bool(0.5) { Precision::F32 } else { Precision::F16 },
            checkpointing: rng.random_bool(0.5),
            grad_accum_steps: rng.random_range(1..=4),
            num_classes: log_uniform(&mut rng, 2.0, 1000.0),
        };
        if runs(base, &cell) {
            cells.push((name.clone(), cell));
        } else {
            redrawn += 1;
        }
    }
    (cells, redrawn)
}

fn on_off(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row the child process prints for a cell it ran only under the dry run (its measured
    /// errors NaN, written `null`) reads back in the parent, and the summaries leave it out.
    #[test]
    fn an_unmeasured_row_survives_the_json_trip_and_is_left_out_of_the_summaries() {
        let base = crate::config::presets::load_config("quickstart").unwrap();
        let mut row = MemoryBenchRow::planned("quickstart", &base, &MemoryCell::new(4, 64, Precision::F32, false));
        row.dry_run_reserved_bytes = 30 << 20;
        let json = serde_json::to_string(&row).unwrap();
        assert!(json.contains("\"error_percent\":null") && json.contains("\"dry_run_error_percent\":null"), "{json}");
        let back: MemoryBenchRow = serde_json::from_str(&json).unwrap();
        assert!(back.error_percent.is_nan() && back.dry_run_error_percent.is_nan());
        assert_eq!((back.dry_run_reserved_bytes, back.exact_bytes()), (30 << 20, row.predicted_bytes.min(30 << 20)));
        let rows = [back];
        for summary in [ErrorSummary::of(&rows), ErrorSummary::of_dry_run(&rows), ErrorSummary::of_exact(&rows)] {
            assert_eq!((summary.measured, summary.skipped), (0, 1), "{summary:?}");
        }
    }

    #[test]
    fn cells_round_trip_through_their_argument_and_bad_ones_name_the_part() {
        for cell in MemoryGrid::named("full").unwrap().cells() {
            assert_eq!(MemoryCell::parse(&cell.to_arg()).unwrap(), cell);
        }
        assert_eq!(MemoryGrid::named("full").unwrap().cells().len(), 4 * 3 * 2 * 2);
        let err = MemoryCell::parse("32,224,bf16,on").unwrap_err().to_string();
        assert!(err.contains("precision is not f32 or f16"), "{err}");
        assert!(MemoryCell::parse("0,224,f32,on").unwrap_err().to_string().contains("batch"));
        assert!(MemoryCell::parse("32,224,f32").unwrap_err().to_string().contains("four or six parts"));
        let cell = MemoryCell::parse("12,161,f16,off,3,1000").unwrap();
        assert_eq!((cell.grad_accum_steps, cell.num_classes), (3, 1000));
        assert_eq!(MemoryCell::parse(&cell.to_arg()).unwrap(), cell);
        assert!(MemoryCell::parse("12,161,f16,off,0,10").unwrap_err().to_string().contains("accumulation"));
        assert!(MemoryCell::parse("12,161,f16,off,1,1").unwrap_err().to_string().contains("classes"));
    }
}
