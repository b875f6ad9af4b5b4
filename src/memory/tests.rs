use super::*;

#[test]
fn estimate_grows_with_batch_and_shrinks_with_savings() {
    let c = Config::default();
    let a = estimate(&c, 8, 10).total;
    let b = estimate(&c, 16, 10).total;
    assert!(b > a);
    let mut f16 = c.clone();
    f16.train.precision = Precision::F16;
    let e32 = estimate(&c, 16, 10);
    let e16 = estimate(&f16, 16, 10);
    assert!(e16.activations() as f64 <= 0.8 * e32.activations() as f64);
    let mut ck = c.clone();
    ck.train.checkpointing = true;
    // Checkpointing halves the activations of burn's ops and still saves with the fused op.
    let burn_ops = estimate_with(&c, 16, 10, false).activations();
    assert!(estimate_with(&ck, 16, 10, false).activations() < burn_ops / 2);
    let fused = estimate_with(&c, 16, 10, true).activations();
    assert!(estimate_with(&ck, 16, 10, true).activations() < fused && fused < burn_ops / 2 + burn_ops / 20);
}

/// The plan with a browser's pools (exclusive pages) against every measured cell (README,
/// "The plan in a browser"): never more than 5% under, at most 10% over without
/// checkpointing and 30% with it.
#[test]
fn the_browser_plan_holds_on_the_measured_cells() {
    // (batch, px, checkpointing, largest page, measured reserved MiB): lavapipe with a browser's pools
    // (`VRAMFIT_WGPU_POOLS=exclusive VRAMFIT_GROUP_NORM_GELU=burn vramfit bench memory -c
    // quickstart --cell B,28,f32,off --steps 2`) and Chromium 156's SwiftShader WebGPU (the
    // pages' 10-step tests, the highest and lowest readings after the first step), all
    // 2026-12-03; quickstart in f32 without checkpointing, as a page trains it.
    // With checkpointing (lavapipe only), the plan may be up to 30% over.
    let measured = [
        (16, 28, false, 128 << 20, 41.2),
        (32, 28, false, 128 << 20, 80.1),
        (64, 28, false, 128 << 20, 159.3),
        (128, 28, false, 128 << 20, 317.0),
        (16, 64, false, 128 << 20, 190.7),
        (64, 28, false, BROWSER_MAX_PAGE_SIZE, 161.0),
        (64, 28, false, BROWSER_MAX_PAGE_SIZE, 172.0),
        (16, 28, true, 128 << 20, 28.0),
        (32, 28, true, 128 << 20, 53.6),
        (64, 28, true, 128 << 20, 102.7),
        (64, 28, true, 128 << 20, 104.2),
        (128, 28, true, 128 << 20, 208.0),
        (128, 28, true, 128 << 20, 211.5),
        (8, 64, true, 128 << 20, 67.4),
    ];
    let mut c = crate::config::presets::load_config("quickstart").unwrap();
    c.train.precision = Precision::F32;
    for (batch, px, checkpointing, max_page_size, reserved_mib) in measured {
        c.train.checkpointing = checkpointing;
        c.data.preprocess.crop_size = px;
        c.data.preprocess.load_size = px;
        assert_eq!(c.image_size_px(), px);
        let pools = PoolLayout::ExclusivePages { max_page_size };
        let predicted_mib = estimate_for_pools(&c, batch, 10, false, pools).total as f64 / (1 << 20) as f64;
        let error = predicted_mib / reserved_mib - 1.0;
        let band = pools.error_band();
        assert!((band.low_percent..=band.high_percent).contains(&(100.0 * error)), "{band:?}");
        let over = if checkpointing { 0.30 } else { 0.10 };
        assert!(
            (-0.05..=over).contains(&error),
            "batch {batch}, pages up to {max_page_size}: predicted {predicted_mib:.1} MiB, measured {reserved_mib} MiB ({:+.1}%)",
            100.0 * error
        );
    }
    // The same step with sub-sliced pools plans about half of that.
    c.train.checkpointing = false;
    (c.data.preprocess.crop_size, c.data.preprocess.load_size) = (28, 28);
    let adaptive = estimate_for_pools(&c, 64, 10, false, PoolLayout::Adaptive).total;
    let pools = PoolLayout::ExclusivePages { max_page_size: BROWSER_MAX_PAGE_SIZE };
    let browser = estimate_for_pools(&c, 64, 10, false, pools).total;
    assert!(browser as f64 > 1.8 * adaptive as f64, "{browser} against {adaptive}");
}

/// With small images a large network's gradients outweigh its activations: the peak is then
/// the end of the backward pass, and the plan counts the gradients there.
#[test]
fn gradients_count_where_they_outweigh_the_activations() {
    let mut c = crate::config::presets::load_config("12gb").unwrap();
    c.data.preprocess.load_size = 32;
    c.data.preprocess.crop_size = 32;
    let e = estimate(&c, 4, 10);
    assert!(e.activations() < e.parameters, "{e:?}");
    assert_eq!(e.gradients, e.parameters);
    assert!(e.peak_in_use >= e.in_use_after_forward - e.activations() + e.parameters);
    // At 224 px the activations dwarf them: the peak is the end of the forward pass.
    c.data.preprocess.load_size = 256;
    c.data.preprocess.crop_size = 224;
    let e = estimate(&c, 4, 10);
    assert_eq!((e.gradients, e.peak_in_use), (0, e.in_use_after_forward));
}

fn with_accum(c: &Config, accum: usize) -> Config {
    let mut c = c.clone();
    c.train.grad_accum_steps = accum;
    c
}

/// The smallest budget whose [`fit_budget`] holds `bytes`.
fn budget_keeping(bytes: u64) -> u64 {
    let layout = PoolLayout::this_build();
    let mut budget = (bytes as f64 / (1.0 + layout.error_band().low_percent / 100.0)) as u64;
    while fit_budget(budget, layout) < bytes {
        budget += 1;
    }
    budget
}

#[test]
fn plan_finds_the_largest_fitting_batch() {
    let mut c = Config::default();
    c.memory.memory_budget_bytes = budget_keeping(estimate(&c, 37, 10).total);
    c.train.batch_size = 64;
    let p = plan(&c, 10);
    assert!(!p.fits);
    assert_eq!(p.max_batch_size, 37);
    // Accumulation adds a gradient buffer, so the pair is searched with it: 32 x 2 = 64.
    assert_eq!((p.fit_batch_size, p.fit_grad_accum_steps), (32, 2));
    let mut fitted = c.clone();
    fitted.train.batch_size = p.fit_batch_size;
    fitted.train.grad_accum_steps = p.fit_grad_accum_steps;
    assert!(plan(&fitted, 10).fits);
    assert!(p.verdict().starts_with("does not fit by"));
    // The product is the effective batch exactly when a divisor near the fit exists: 32 with
    // room for 3 is 2 x 16, not 3 x 11 = 33.
    c.train.batch_size = 32;
    c.memory.memory_budget_bytes = budget_keeping(estimate(&with_accum(&c, 2), 3, 10).total);
    let p = plan(&c, 10);
    assert_eq!((p.fit_batch_size, p.fit_grad_accum_steps), (2, 16));
    // An effective batch that fits whole needs no accumulation.
    c.memory.memory_budget_bytes = budget_keeping(estimate(&c, 64, 10).total);
    c.train.batch_size = 32;
    c.train.grad_accum_steps = 2;
    let p = plan(&c, 10);
    assert_eq!((p.fit_batch_size, p.fit_grad_accum_steps), (64, 1));
}

#[test]
fn a_chosen_batch_keeps_the_measured_margin() {
    // A budget exactly the plan of batch 64: the config fits, but a batch the plan chooses
    // leaves the 4.9% the plan was measured under the real peak (adaptive pools).
    let mut c = Config::default();
    c.train.batch_size = 64;
    let planned = estimate(&c, 64, 10).total;
    c.memory.memory_budget_bytes = planned;
    let p = plan(&c, 10);
    assert!(p.fits);
    assert!(p.max_batch_size < 64, "{}", p.max_batch_size);
    let kept = fit_budget(planned, PoolLayout::this_build());
    assert!(kept.abs_diff((planned as f64 * 0.951) as u64) <= 1, "{kept} of {planned}");
    assert!(estimate(&c, p.max_batch_size, 10).total <= kept);
    assert!(estimate(&c, p.max_batch_size + 1, 10).total > kept);
    // The browser's layout, measured at most 0.5% under, keeps 99.5%.
    assert_eq!(
        fit_budget(1 << 30, PoolLayout::ExclusivePages { max_page_size: 1 << 30 }),
        ((1u64 << 30) as f64 * 0.995) as u64
    );
}

#[test]
fn human_units() {
    assert_eq!(human_bytes(512), "512 B");
    assert_eq!(human_bytes(310 << 20), "310 MiB");
    assert_eq!(human_bytes(1288490188), "1.2 GiB");
}

/// The cells of a seeded random grid measured on lavapipe, one fresh process per cell
/// (`random_grid_lavapipe.tsv`; README, "Memory"): network, `--cell` argument, whether the step
/// ran the fused GroupNorm + GELU, measured reserved peak and peak in use, and the dry run's
/// reservation (bytes).
const RANDOM_GRID: &str = include_str!("random_grid_lavapipe.tsv");

/// One recorded cell of the random grid: its network and cell, the plan the code makes for it
/// now, the measured reserved peak and the dry run's reservation (bytes).
struct RecordedCell {
    name: String,
    planned: u64,
    reserved: u64,
    dry_run: u64,
}

fn random_grid() -> Vec<RecordedCell> {
    RANDOM_GRID
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            let [network, cell, fused, reserved, _peak_in_use, dry_run] = fields[..] else {
                panic!("bad row {line:?}")
            };
            let base = crate::config::presets::load_config(network).unwrap();
            let cell = crate::bench::memory::MemoryCell::parse(cell).unwrap();
            let c = cell.config(&base);
            let planned =
                estimate_for_pools(&c, cell.micro_batch, cell.num_classes, fused == "1", PoolLayout::Adaptive).total;
            RecordedCell {
                name: format!("{network} --cell {}", cell.to_arg()),
                planned,
                reserved: reserved.parse().unwrap(),
                dry_run: dry_run.parse().unwrap(),
            }
        })
        .collect()
}

/// Percent errors of `predicted` against each cell's measured reserved peak, checked never more
/// than 5% under and inside `band`; returns the share within -5%..+10% and the median |error|.
fn check_errors(cells: &[RecordedCell], predicted: impl Fn(&RecordedCell) -> u64, band: ErrorBand) -> (f64, f64) {
    let errors: Vec<f64> = cells.iter().map(|c| 100.0 * (predicted(c) as f64 / c.reserved as f64 - 1.0)).collect();
    for (c, e) in cells.iter().zip(&errors) {
        assert!(*e >= -5.0, "{}: {e:+.1}%", c.name);
        assert!((band.low_percent..=band.high_percent).contains(e), "{}: {e:+.1}% outside the band {band:?}", c.name);
    }
    assert!(errors.len() >= 40, "{} cells", errors.len());
    let within = errors.iter().filter(|e| (-5.0..=10.0).contains(*e)).count() as f64 / errors.len() as f64;
    let mut abs: Vec<f64> = errors.iter().map(|e| e.abs()).collect();
    abs.sort_by(f64::total_cmp);
    let median = (abs[(abs.len() - 1) / 2] + abs[abs.len() / 2]) / 2.0;
    println!("{:.0}% within -5%..+10%, median |error| {median:.2}%", 100.0 * within);
    (within, median)
}

/// The plan against every cell of the recorded random grid, on the terms issue 49 set: no cell
/// more than 5% under; at least 85% within -5%..+10% and a median absolute error under 4%
/// (the bar is 95% and 4%: the share is not met by the plan alone, see below); and the error band
/// `plan` prints ([`PoolLayout::error_band`]) holds every cell.
#[test]
fn the_plan_holds_on_the_random_grid() {
    let (within, median) = check_errors(&random_grid(), |c| c.planned, PoolLayout::Adaptive.error_band());
    // Issue 49 asks for 95% within and a median under 4%; the plan's page slack reaches 88%
    // and 3.7% (one page is 15-35% of the small cells: see "The slack" in `pools.rs`).
    assert!(within >= 0.85, "{:.0}% within -5%..+10%", 100.0 * within);
    assert!(median < 4.0, "median |error| {median:.1}%");
    assert!((median - PoolLayout::Adaptive.error_band().median_abs_percent).abs() < 0.05, "median {median:.2}%");
}

/// `plan --exact`, the smaller of the plan and the recorded dry run ([`exact_peak`]): never more
/// than 5% under the measured reserved peak, a median |error| under 4% (issue 49's bar), inside
/// [`EXACT_ERROR_BAND`], and at least 95% of the cells within -5%..+10% (issue 49's bar): 98%
/// with the recorded dry runs (47 of 48). The dry run alone is never 5% under either, but a
/// page over on 3 cells (94% within).
#[test]
fn the_exact_plan_holds_on_the_random_grid() {
    let cells = random_grid();
    assert!(cells.iter().all(|c| c.dry_run > 0), "a cell without its dry run");
    let (within, median) = check_errors(&cells, |c| exact_peak(c.planned, c.dry_run), EXACT_ERROR_BAND);
    assert!(within >= 0.95, "{:.0}% within -5%..+10%", 100.0 * within);
    assert!(median < 4.0, "median |error| {median:.2}%");
    assert!((median - EXACT_ERROR_BAND.median_abs_percent).abs() < 0.05, "band says {EXACT_ERROR_BAND:?}");
    let dry_run_band = ErrorBand { low_percent: -5.0, high_percent: 15.0, ..EXACT_ERROR_BAND };
    let (dry_within, dry_median) = check_errors(&cells, |c| c.dry_run, dry_run_band);
    // docs/memory.md's row for the dry run alone: 94% within, median 1.3%.
    assert!((dry_within - 45.0 / 48.0).abs() < 1e-9, "the dry run alone: {:.0}% within", 100.0 * dry_within);
    assert!((dry_median - 1.3).abs() < 0.05, "the dry run alone: median {dry_median:.2}%");
}

/// A data-parallel run's plan per device: with 3 micro-batches on 2 devices the main one runs
/// two (it holds the accumulation buffer) and the AdamW moments, the replica one micro-batch's
/// activations and its copy of the weights; a third device with 2 micro-batches holds nothing.
/// One device is the one-device plan.
#[test]
fn each_device_of_a_data_parallel_run_has_its_own_plan() {
    let mut config = crate::config::presets::load_config("12gb").unwrap();
    config.train.grad_accum_steps = 3;
    let one = estimate(&config, config.train.batch_size, 10);
    assert_eq!(data_parallel_estimates(&config, 10, 1), vec![one.clone()]);
    let [main, replica] = <[MemoryEstimate; 2]>::try_from(data_parallel_estimates(&config, 10, 2)).unwrap();
    assert_eq!(main, one, "the main device runs 2 of 3 micro-batches: the buffer and the moments, as on one");
    let p = one.parameters;
    assert_eq!((replica.parameters, replica.optimizer_state), (p, 0));
    assert_eq!(replica.activations(), one.activations());
    assert_eq!(main.peak_in_use - replica.peak_in_use, 2 * p + p, "AdamW (2 x 4P) and the buffer (4P)");
    config.train.grad_accum_steps = 2;
    let three = data_parallel_estimates(&config, 10, 3);
    assert_eq!(three[2], MemoryEstimate::default());
    assert_eq!(three[0].optimizer_state, 2 * p);
    assert!(three[1].total > 0 && three[1].optimizer_state == 0);
}
