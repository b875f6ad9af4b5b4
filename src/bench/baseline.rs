//! The speed regression guard: `vramfit bench train --compare benches/baseline/FILE.json` measures
//! the baseline's rows again and compares throughput as ratios, fresh / baseline.
//!
//! A baseline is the `--json` output of an earlier `bench train` on the same machine class
//! (`benches/baseline/README.md` says which file fits which machine). Rows are matched by
//! config, backend, batch size, image side and precision. A row whose training or inference
//! throughput fell below `1 - max_slowdown` of the baseline's is a regression, and so is a
//! baseline row that failed or was not measured this time (an out-of-memory, a backend that no
//! longer starts, a changed preset): the guard passes only when every baseline row was measured
//! and kept its speed. Times are never compared against fixed numbers: only the ratio to the
//! same row measured before.

use crate::bench::TrainBenchRow;

/// The slowdown `bench train --compare` flags: 20% fewer images per second than the baseline.
pub const MAX_SLOWDOWN: f64 = 0.20;

/// One baseline row next to its fresh measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct RowComparison {
    /// `config / backend / batch x px / precision`, as the table prints it.
    pub label: String,
    /// Fresh training img/s divided by the baseline's; `None` when the row was not measured
    /// again or failed.
    pub train_ratio: Option<f64>,
    /// Fresh inference img/s divided by the baseline's; `None` as for `train_ratio`.
    pub infer_ratio: Option<f64>,
    /// Whether either ratio is below `1 - max_slowdown`, or the row was not measured again.
    pub regressed: bool,
}

/// The backend key (`gpu`, `flex` or `ndarray`) that measures a row whose backend reads
/// `backend` (a row names its device: "CPU (burn flex)", "CPU (burn ndarray)" or the adapter).
pub fn backend_key(backend: &str) -> &'static str {
    if backend.contains("burn flex") {
        "flex"
    } else if backend.contains("burn ndarray") {
        "ndarray"
    } else {
        "gpu"
    }
}

fn same_row(a: &TrainBenchRow, b: &TrainBenchRow) -> bool {
    a.config == b.config
        && a.backend == b.backend
        && a.batch_size == b.batch_size
        && a.image_px == b.image_px
        && a.precision == b.precision
}

/// Compares every baseline row with the fresh row that matches it.
///
/// `max_slowdown` is a fraction (0.2 = 20%). A baseline row with no fresh match (a backend this
/// machine lacks, a changed batch size) or whose fresh row failed gets `None` ratios and counts
/// as a regression: a guard that passes what it could not measure would pass the worst case.
pub fn compare(baseline: &[TrainBenchRow], fresh: &[TrainBenchRow], max_slowdown: f64) -> Vec<RowComparison> {
    let ratio = |now: f64, before: f64| (now.is_finite() && before > 0.0).then(|| now / before);
    baseline
        .iter()
        .map(|base| {
            let label = format!(
                "{} / {} / {} x {} px / {}",
                base.config, base.backend, base.batch_size, base.image_px, base.precision
            );
            let now = fresh.iter().find(|f| same_row(base, f) && f.error.is_none());
            let train_ratio = now.and_then(|f| ratio(f.train_images_per_sec, base.train_images_per_sec));
            let infer_ratio = now.and_then(|f| ratio(f.infer_images_per_sec, base.infer_images_per_sec));
            let floor = 1.0 - max_slowdown;
            let regressed = !train_ratio.is_some_and(|r| r >= floor) || !infer_ratio.is_some_and(|r| r >= floor);
            RowComparison { label, train_ratio, infer_ratio, regressed }
        })
        .collect()
}

/// The comparison as a Markdown table, one line per baseline row.
pub fn table(rows: &[RowComparison], max_slowdown: f64) -> String {
    let cell = |r: Option<f64>| r.map_or("not measured".to_string(), |r| format!("{r:.2}x"));
    let mut s =
        String::from("| row | train fresh / baseline | infer fresh / baseline | verdict |\n|---|---|---|---|\n");
    for r in rows {
        let verdict = if r.train_ratio.is_none() || r.infer_ratio.is_none() {
            "NOT MEASURED (failed or no matching row)".to_string()
        } else if r.regressed {
            format!("SLOWER by more than {:.0}%", max_slowdown * 100.0)
        } else {
            "ok".to_string()
        };
        s.push_str(&format!("| {} | {} | {} | {verdict} |\n", r.label, cell(r.train_ratio), cell(r.infer_ratio)));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(config: &str, backend: &str, train: f64, infer: f64) -> TrainBenchRow {
        TrainBenchRow {
            config: config.into(),
            backend: backend.into(),
            batch_size: 64,
            image_px: 28,
            precision: "f32".into(),
            train_images_per_sec: train,
            infer_images_per_sec: infer,
            train_gflops: 1.0,
            peak_bytes_in_use: None,
            first_step_secs: None,
            latency_224_ms: 1.0,
            error: None,
        }
    }

    #[test]
    fn flags_only_slowdowns_beyond_the_bound() {
        let flex = "CPU (burn flex)";
        let baseline = [
            row("quickstart", flex, 600.0, 3000.0),
            row("12gb", flex, 8.0, 40.0),
            row("quickstart", "Vulkan GPU", 60.0, 300.0),
        ];
        // quickstart: train 10% slower, inference 50% faster; 12gb: inference 25% slower;
        // the GPU row was not measured.
        let fresh = [row("quickstart", flex, 540.0, 4500.0), row("12gb", flex, 8.8, 30.0)];
        let got = compare(&baseline, &fresh, MAX_SLOWDOWN);
        assert_eq!(got[0].train_ratio, Some(0.9));
        assert_eq!(got[0].infer_ratio, Some(1.5));
        assert!(!got[0].regressed);
        assert_eq!(got[1].infer_ratio, Some(0.75));
        assert!(got[1].regressed);
        assert_eq!((got[2].train_ratio, got[2].regressed), (None, true));
        let t = table(&got, MAX_SLOWDOWN);
        assert!(
            t.contains("| 12gb / CPU (burn flex) / 64 x 28 px / f32 | 1.10x | 0.75x | SLOWER by more than 20% |"),
            "{t}"
        );
        assert!(t.contains("| not measured | not measured | NOT MEASURED (failed or no matching row) |"), "{t}");
    }

    #[test]
    fn a_failed_fresh_row_is_a_regression() {
        let flex = "CPU (burn flex)";
        let mut failed = row("quickstart", flex, f64::NAN, f64::NAN);
        failed.error = Some("out of memory".into());
        let got = compare(&[row("quickstart", flex, 600.0, 3000.0)], &[failed], MAX_SLOWDOWN);
        assert_eq!((got[0].train_ratio, got[0].regressed), (None, true));
    }

    /// A failed row's NaN figures are written as JSON `null`; the file must still read back.
    #[test]
    fn a_baseline_with_a_failed_row_reads_back() {
        let mut failed = row("12gb", "CPU (burn flex)", f64::NAN, f64::NAN);
        failed.error = Some("out of memory".into());
        let json = serde_json::to_string(&[row("quickstart", "CPU (burn flex)", 600.0, 3000.0), failed]).expect("json");
        assert!(json.contains("null"), "{json}");
        let back: Vec<TrainBenchRow> = serde_json::from_str(&json).expect("reads back");
        assert!(back[1].train_images_per_sec.is_nan() && back[1].error.is_some());
        assert_eq!(back[0].train_images_per_sec, 600.0);
    }

    #[test]
    fn backend_keys_from_row_names() {
        assert_eq!(backend_key("CPU (burn flex)"), "flex");
        assert_eq!(backend_key("CPU (burn ndarray)"), "ndarray");
        assert_eq!(backend_key("llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan)"), "gpu");
    }
}
