//! How far the plan (or the dry run) was from the measured reserved peak over a grid's rows.

use serde::{Deserialize, Serialize};

use super::MemoryBenchRow;

/// The plan's error over measured rows, the way memory-estimation papers report it (median and
/// tail of the relative error, the share of configurations over and under): percentages of
/// `(predicted - measured reserved) / measured reserved`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorSummary {
    /// Rows measured.
    pub measured: usize,
    /// Rows skipped (not counted below).
    pub skipped: usize,
    /// Median of the absolute error, percent.
    pub median_abs_percent: f64,
    /// 95th percentile (nearest rank) of the absolute error, percent.
    pub p95_abs_percent: f64,
    /// The lowest and highest error, percent (negative: the plan under the measured peak).
    pub band_percent: (f64, f64),
    /// Share of rows with the plan more than 10% over.
    pub over_10_share: f64,
    /// Share of rows with the plan more than 5% under.
    pub under_5_share: f64,
    /// Share of rows within -5%..+10%.
    pub within_share: f64,
    /// The cell with the largest absolute error (its `--cell` argument and network).
    pub worst: String,
}

impl ErrorSummary {
    /// Summarizes the plan's error on the measured rows of `rows`.
    pub fn of(rows: &[MemoryBenchRow]) -> Self {
        Self::of_errors(rows, |r| r.error_percent)
    }

    /// Summarizes the dry run's error ([`MemoryBenchRow::dry_run_error_percent`]) on the
    /// measured rows of `rows`.
    pub fn of_dry_run(rows: &[MemoryBenchRow]) -> Self {
        Self::of_errors(rows, |r| r.dry_run_error_percent)
    }

    /// Summarizes the exact plan's error (`vramfit plan --exact`: the smaller of the plan and
    /// the dry run, [`MemoryBenchRow::exact_bytes`]) on the measured rows of `rows`.
    pub fn of_exact(rows: &[MemoryBenchRow]) -> Self {
        Self::of_errors(rows, |r| {
            if r.measured_reserved_bytes == 0 || r.dry_run_reserved_bytes == 0 {
                return f64::NAN;
            }
            (r.exact_bytes() as f64 - r.measured_reserved_bytes as f64) / r.measured_reserved_bytes as f64 * 100.0
        })
    }

    fn of_errors(rows: &[MemoryBenchRow], error: fn(&MemoryBenchRow) -> f64) -> Self {
        // A row without the measurement this error needs (skipped, or a dry run only) is left out.
        let measured: Vec<&MemoryBenchRow> =
            rows.iter().filter(|r| r.skipped.is_none() && error(r).is_finite()).collect();
        if measured.is_empty() {
            return Self { skipped: rows.len(), worst: "no cell measured".into(), ..Self::default() };
        }
        let mut abs: Vec<f64> = measured.iter().map(|r| error(r).abs()).collect();
        abs.sort_by(f64::total_cmp);
        let n = measured.len();
        let share = |f: &dyn Fn(f64) -> bool| measured.iter().filter(|r| f(error(r))).count() as f64 / n.max(1) as f64;
        let nearest_rank = |q: f64| abs.get(((q * n as f64).ceil() as usize).max(1) - 1).copied().unwrap_or(f64::NAN);
        let worst = measured.iter().max_by(|a, b| error(a).abs().total_cmp(&error(b).abs()));
        let errors = measured.iter().map(|r| error(r));
        Self {
            measured: n,
            skipped: rows.len() - n,
            median_abs_percent: if n == 0 {
                f64::NAN
            } else if n % 2 == 1 {
                abs[n / 2]
            } else {
                (abs[n / 2 - 1] + abs[n / 2]) / 2.0
            },
            p95_abs_percent: nearest_rank(0.95),
            band_percent: (errors.clone().fold(f64::INFINITY, f64::min), errors.fold(f64::NEG_INFINITY, f64::max)),
            over_10_share: share(&|e| e > 10.0),
            under_5_share: share(&|e| e < -5.0),
            within_share: share(&|e| (-5.0..=10.0).contains(&e)),
            worst: worst.map_or_else(String::new, |r| {
                format!("{} --cell {} ({:+.1}%)", r.network, r.cell().to_arg(), error(r))
            }),
        }
    }

    /// The summary in a few lines of text.
    pub fn text(&self) -> String {
        format!(
            "{} cells measured ({} skipped): median |error| {:.1}%, 95th percentile {:.1}%, band {:+.1}%..{:+.1}%\n\
             within -5%..+10%: {:.0}%, over +10%: {:.0}%, under -5%: {:.0}%\nworst: {}",
            self.measured,
            self.skipped,
            self.median_abs_percent,
            self.p95_abs_percent,
            self.band_percent.0,
            self.band_percent.1,
            100.0 * self.within_share,
            100.0 * self.over_10_share,
            100.0 * self.under_5_share,
            self.worst,
        )
    }
}
