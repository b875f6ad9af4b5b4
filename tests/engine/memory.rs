//! The memory plan against the device: predicted against measured peaks (each cell in its own
//! process), and the capped pool (`memory.cap_to_budget`) that makes the adapter behave like a
//! card of the budget's size, tested with the budget refusal, `--auto-fit` and the mid-run halving.

use super::*;

#[test]
fn the_plan_covers_the_measured_reserved_peak_in_fresh_processes() {
    if gpu_or_skip().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("memory.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramfit"))
        .args(["bench", "memory", "--grid", "tiny", "--fresh", "--steps", "1", "--json", json.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    // f32 off, f32 on, f16 off, f16 on (lavapipe has shader f16).
    assert_eq!(rows.len(), 4);
    let bytes = |r: &serde_json::Value, key: &str| r[key].as_u64().unwrap();
    for r in &rows {
        assert!(r["skipped"].is_null(), "{r}");
        // The plan is on the safe side of the reserved peak (backward pass included), by less
        // than the pools' slack pages plus the workspace it counts at this size.
        let (predicted, reserved) = (bytes(r, "predicted_bytes"), bytes(r, "measured_reserved_bytes"));
        assert!(predicted >= reserved, "plan under the reserved peak: {r}");
        assert!(predicted <= reserved + (24 << 20), "plan more than 24 MiB over: {r}");
        // The activation terms hold at the end of the forward pass.
        assert!(r["in_use_error_percent"].as_f64().unwrap().abs() <= 10.0, "{r}");
        assert!(bytes(r, "measured_peak_in_use_bytes") >= bytes(r, "measured_in_use_bytes"));
        // The same steps under cubecl's dry run (after a cleanup, in the same process) carve the
        // pages the real steps carved, give or take one page of the adaptive pool (the pools'
        // smallest page size: the small pool's is 8 MiB), and miss little else (the launches'
        // uniform buffers).
        assert!(r["dry_run_skipped"].is_null(), "{r}");
        let dry_run = bytes(r, "dry_run_reserved_bytes");
        let page = r["pools"].as_array().unwrap().iter().map(|p| bytes(p, "page_size")).min().unwrap();
        assert!(dry_run as f64 >= 0.95 * reserved as f64, "dry run 5% under: {r}");
        assert!(dry_run <= reserved + page + reserved / 20, "dry run more than a page over: {r}");
    }
    let activations = |i: usize| bytes(&rows[i], "measured_activation_bytes") as f64;
    // Checkpointing keeps less, in both precisions.
    assert!(activations(1) < activations(0) && activations(3) < activations(2));
    // f16 keeps less than f32 on the same configuration: 0.75x against f32 with the fused
    // GroupNorm + GELU kernels (measured 2026-12-03; 0.37x against burn's ops).
    assert!(activations(2) <= 0.8 * activations(0), "f16 {} vs f32 {} bytes", activations(2), activations(0));
}

/// `vramfit plan --exact` runs two steps under cubecl's dry run on the adapter and prints what
/// they reserved and the exact plan (the smaller of it and the plan), in seconds: no kernel runs.
#[test]
fn plan_exact_prints_the_dry_runs_reservation_and_the_smaller_of_the_two() {
    if gpu_or_skip().is_none() {
        return;
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramfit"))
        .args(["plan", "--config", "quickstart", "--exact", "--device", "gpu", "--batch-size", "16"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let mib = |after: &str| -> f64 {
        let rest = &stdout[stdout.find(after).unwrap_or_else(|| panic!("no {after:?} in {stdout}")) + after.len()..];
        let number: String = rest.trim_start().chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
        let value: f64 = number.parse().unwrap_or_else(|_| panic!("no number after {after:?} in {stdout}"));
        if rest.trim_start()[number.len()..].trim_start().starts_with("KiB") { value / 1024.0 } else { value }
    };
    let (planned, in_use) = (mib("predicted peak (reserved)"), mib("peak in use"));
    let (dry_run, exact) = (mib(") reserved"), mib("the smaller of the plan and the dry run):"));
    // The pools hold at least the bytes in use and the 8 MiB small page, and the exact plan is
    // the smaller figure.
    assert!(dry_run >= in_use + 8.0 && dry_run <= 1.5 * planned, "{stdout}");
    assert!((exact - dry_run.min(planned)).abs() < 0.15, "{stdout}");
}

/// A capped run whose budget is lowered under its reserved bytes once its pools are in their
/// steady state (after step 3: step 1 runs outside the pools, step 2 is the first in them and
/// leaves its parameters spread over its pages, step 3 gathers them) fails step 4 as out of
/// memory, exactly as a card of that size would, does not apply it, and retries it at half the
/// micro-batch: no step lost or repeated.
#[test]
fn a_capped_pool_fails_the_step_over_the_budget_and_it_is_retried_at_half() {
    let Some(device) = gpu_or_skip() else { return };
    if in_own_process("memory::a_capped_pool_fails_the_step_over_the_budget_and_it_is_retried_at_half") {
        return;
    }
    let splits = bundled();
    let mut config = quickstart();
    config.train.memory_sample_every = 1;
    config.memory.cap_to_budget = true;
    let batch = config.train.batch_size;
    let dir = tempfile::tempdir().unwrap();
    let mut req = TrainRequest::new(config, dir.path().join("run"));
    req.max_steps = Some(6);
    req.export = false;
    let budget = vramfit::engine::events::LiveBudget::new(1 << 40);
    req.live_budget = Some(budget.clone());
    let (mut steps, mut adapted, mut lowered_to) = (Vec::new(), Vec::new(), 0u64);
    let mut sink = |e: Event| match e {
        Event::Memory { step: 3, bytes_reserved, .. } => {
            lowered_to = bytes_reserved * 9 / 10;
            budget.set(lowered_to);
        }
        Event::Step { step, .. } => steps.push(step),
        Event::BatchAdapted { micro_batch, reason, .. } => adapted.push((steps.len(), micro_batch, reason)),
        _ => {}
    };
    let s = train::train(&req, &device, &splits, &mut sink, &StopSignal::new()).unwrap();
    assert_eq!(steps, [1, 2, 3, 4, 5, 6], "no step lost or repeated");
    let (after, micro, reason) = adapted.first().expect("the cap fails the step").clone();
    assert_eq!((after, micro), (3, batch / 2), "{reason}");
    assert!(reason.contains("out of memory") && reason.contains("cap"), "{reason}");
    assert!(lowered_to > 0);
    // The refused shape's readings are dropped with its pages: what the run reports is the
    // half micro-batch's, under the lowered cap (each of its steps was checked against it).
    assert!(
        s.memory.peak_bytes_reserved > 0 && s.memory.peak_bytes_reserved <= lowered_to,
        "{} after the halving, cap {lowered_to}",
        s.memory.peak_bytes_reserved
    );
    let rows = std::fs::read_to_string(dir.path().join("run/metrics.csv")).unwrap();
    let logged: Vec<&str> = rows.lines().skip(1).map(|l| l.split(',').next().unwrap()).collect();
    assert_eq!(logged, ["1", "2", "3", "4", "5", "6"]);
}

/// A 128 MiB card emulated on the adapter (`memory.cap_to_budget`): see [`card_of`]. The same
/// check at 1 GiB, the size, is `a_one_gib_card_...` (ignored in CI: over 30 minutes on
/// lavapipe).
#[test]
fn a_capped_card_refuses_the_plan_over_it_and_trains_the_plans_under_it() {
    if gpu_or_skip().is_none()
        || in_own_process("memory::a_capped_card_refuses_the_plan_over_it_and_trains_the_plans_under_it")
    {
        return;
    }
    card_of(128 << 20);
}

/// [`card_of`] at 1 GiB. Run it with `cargo test --release -- --ignored a_one_gib_card`.
#[test]
#[ignore = "over 30 minutes on lavapipe (autotuning at new shapes); the 128 MiB card runs in CI"]
fn a_one_gib_card_refuses_the_plan_over_it_and_trains_the_plans_under_it() {
    if gpu_or_skip().is_none()
        || in_own_process("memory::a_one_gib_card_refuses_the_plan_over_it_and_trains_the_plans_under_it")
    {
        return;
    }
    card_of(1 << 30);
}

/// A card of `budget` bytes emulated on the adapter (`memory.cap_to_budget`): the plan refuses
/// a configuration it puts at 1.3x the budget; one it puts at 0.9x with checkpointing on trains
/// to the end; and `--auto-fit` turns the refused one into a micro-batch that trains to the end
/// under the cap. One out-of-memory retry is allowed, in the first two steps: the first step at
/// a shape autotunes its kernels with buffers the plan does not count, and the second (the first
/// with AdamW's moments) can too; autotuning on a loaded machine (the rest of the test suite)
/// picked kernels whose step-2 reservation was 1.27x the plan once (README, "A capped pool"). Every
/// step after the retry holds its reservation under the cap.
fn card_of(budget: u64) {
    let device = gpu().unwrap();
    let splits = bundled();
    let mut config = quickstart();
    config.train.memory_sample_every = 1;
    config.memory.cap_to_budget = true;
    config.memory.memory_budget_bytes = budget;
    let total = |c: &Config, b: usize| vramfit::memory::estimate(c, b, 10).total;
    // The smallest batch the plan puts at 1.3x the budget or more, checkpointing off.
    let over = (1..8192).find(|&b| total(&config, b) >= budget * 13 / 10).unwrap();
    config.train.batch_size = over;
    let dir = tempfile::tempdir().unwrap();
    // Trains 3 steps; returns the summary and the retries, each with the steps done before it.
    let run = |config: &Config, name: &str, auto_fit: bool| {
        let mut req = TrainRequest::new(config.clone(), dir.path().join(name));
        req.auto_fit = auto_fit;
        req.max_steps = Some(3);
        req.export = false;
        let (mut steps, mut retries) = (0, Vec::new());
        let result = train::train(
            &req,
            &device,
            &splits,
            &mut |e| match e {
                Event::Step { .. } => steps += 1,
                Event::BatchAdapted { reason, .. } if !reason.starts_with("--auto-fit") => {
                    retries.push((steps, reason))
                }
                _ => {}
            },
            &StopSignal::new(),
        );
        // Reserved bytes of the steps after the first (metrics.csv column 8: the peak since the
        // first step, whose readings the run drops with the pages it autotuned with).
        let rows = std::fs::read_to_string(dir.path().join(name).join("metrics.csv")).unwrap_or_default();
        let reserved_after_first: Vec<u64> =
            rows.lines().skip(2).map(|l| l.split(',').nth(7).unwrap().parse().unwrap()).collect();
        (result, retries, reserved_after_first)
    };
    let (refused, _, _) = run(&config, "refused", false);
    let refused = refused.unwrap_err();
    assert!(matches!(refused, Error::Memory(_)) && refused.to_string().contains("--auto-fit"), "{refused}");

    // The largest batch the plan puts at 0.9x the budget or less with checkpointing on.
    let mut checkpointed = config.clone();
    checkpointed.train.checkpointing = true;
    let under = (1..8192).take_while(|&b| total(&checkpointed, b) <= budget * 9 / 10).last().unwrap();
    checkpointed.train.batch_size = under;
    for (name, config, auto_fit) in [("checkpointed", &checkpointed, false), ("fit", &config, true)] {
        let (s, retries, reserved) = run(config, name, auto_fit);
        let s = s.unwrap();
        assert_eq!(s.global_step, 3, "{name}");
        // At most one retry, in the first two steps (autotuning at a new shape).
        assert!(retries.len() <= 1 && retries.iter().all(|(steps, _)| *steps <= 1), "{name}: {retries:?}");
        assert!(!reserved.is_empty() && reserved.iter().all(|&r| r <= budget), "{name}: reserved {reserved:?}");
        // The effective batch is kept, or exceeded by less than one micro-batch when it has no
        // divisor near the fit (a prime: `memory::Plan::fit_batch_size`).
        let (effective, trained) = (config.train.batch_size, s.micro_batch * s.grad_accum_steps);
        assert!(
            trained >= effective && trained < effective + s.micro_batch,
            "{name}: {} x {}",
            s.micro_batch,
            s.grad_accum_steps
        );
        if auto_fit {
            assert!(s.micro_batch < over, "{name}: {} x {}", s.micro_batch, s.grad_accum_steps);
        }
    }
}

/// `device::outside_the_pools` keeps a step's allocations out of cubecl's pools, and a panic
/// inside it closes that window: a tensor made after the panic lands in the pools' pages again.
#[test]
fn outside_the_pools_allocates_no_pool_page_and_a_panic_closes_the_window() {
    let Some(selected) = gpu_or_skip() else { return };
    if in_own_process("memory::outside_the_pools_allocates_no_pool_page_and_a_panic_closes_the_window") {
        return;
    }
    let device = selected.device;
    // Pages of the pools that carve pages (the small-allocation pool and the sized ones).
    let pages = |device: &burn::tensor::Device| -> usize {
        device.memory_pool_report().unwrap().iter().map(|p| p.pages as usize).sum()
    };
    let make = |device: &burn::tensor::Device| {
        let t = burn::tensor::Tensor::<1>::ones([1 << 20], device); // 4 MiB
        device.sync().unwrap();
        t
    };
    let before = pages(&device);
    let inside = device::outside_the_pools(&device, || make(&device)).unwrap();
    assert_eq!(pages(&device), before, "a 4 MiB tensor made in the window took a pool page");
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        device::outside_the_pools(&device, || -> () { panic!("inside the window") })
    }));
    assert!(panicked.is_err());
    let after = make(&device);
    assert!(pages(&device) > before, "after the panic a 4 MiB tensor still took no pool page");
    // Both hold their values wherever they live.
    let sum = |t: burn::tensor::Tensor<1>| t.sum().into_scalar::<f32>();
    assert_eq!((sum(inside), sum(after)), ((1 << 20) as f32, (1 << 20) as f32));
}
