//! The memory plan against the device: predicted against measured peaks (each cell in its own
//! process), and the capped pool (`memory.cap_to_budget`) that makes the adapter behave like a
//! card of the budget's size, tested with the budget refusal, `--auto-fit` and the mid-run halving.

use super::*;

#[test]
fn the_plan_covers_the_measured_reserved_peak_in_fresh_processes() {
    if gpu().is_none() {
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
    }
    let activations = |i: usize| bytes(&rows[i], "measured_activation_bytes") as f64;
    // Checkpointing keeps less, in both precisions.
    assert!(activations(1) < activations(0) && activations(3) < activations(2));
    // f16 keeps at most 0.6x the activations of f32 on the same configuration.
    assert!(activations(2) <= 0.6 * activations(0), "f16 {} vs f32 {} bytes", activations(2), activations(0));
}

/// A capped run whose budget is lowered under its reserved bytes after step 2 fails step 3 as out
/// of memory, exactly as a card of that size would, does not apply it, and retries it at half
/// the micro-batch: no step lost or repeated.
#[test]
fn a_capped_pool_fails_the_step_over_the_budget_and_it_is_retried_at_half() {
    let Some(device) = gpu() else { return };
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
    req.max_steps = Some(5);
    req.export = false;
    let budget = vramfit::events::LiveBudget::new(1 << 40);
    req.live_budget = Some(budget.clone());
    let (mut steps, mut adapted, mut lowered_to) = (Vec::new(), Vec::new(), 0u64);
    let mut sink = |e: Event| match e {
        Event::Memory { step: 2, bytes_reserved, .. } => {
            lowered_to = bytes_reserved * 9 / 10;
            budget.set(lowered_to);
        }
        Event::Step { step, .. } => steps.push(step),
        Event::BatchAdapted { batch_size, reason, .. } => adapted.push((steps.len(), batch_size, reason)),
        _ => {}
    };
    let s = train::train(&req, &device, &splits, &mut sink, &StopSignal::new()).unwrap();
    assert_eq!(steps, [1, 2, 3, 4, 5], "no step lost or repeated");
    let (after, micro, reason) = adapted.first().expect("the cap fails the step").clone();
    assert_eq!((after, micro), (2, batch / 2), "{reason}");
    assert!(reason.contains("out of memory") && reason.contains("cap"), "{reason}");
    assert!(lowered_to > 0);
    assert!(s.memory.peak_bytes_reserved > lowered_to, "the step that failed was measured over the cap");
    let rows = std::fs::read_to_string(dir.path().join("run/metrics.csv")).unwrap();
    let logged: Vec<&str> = rows.lines().skip(1).map(|l| l.split(',').next().unwrap()).collect();
    assert_eq!(logged, ["1", "2", "3", "4", "5"]);
}

/// The budget refusal and `--auto-fit` against a capped pool: the plan refuses a batch that
/// does not fit, and the batch `--auto-fit` picks from the plan trains under the cap without
/// a single out-of-memory retry.
#[test]
fn auto_fit_picks_a_batch_that_trains_under_the_capped_pool() {
    let Some(device) = gpu() else { return };
    if in_own_process("memory::auto_fit_picks_a_batch_that_trains_under_the_capped_pool") {
        return;
    }
    let splits = bundled();
    let mut config = quickstart();
    config.train.batch_size = 1024;
    config.train.memory_sample_every = 1;
    config.memory.cap_to_budget = true;
    config.memory.memory_budget_bytes = vramfit::memory::estimate(&config, 256, 10).total;
    let dir = tempfile::tempdir().unwrap();
    let refused = train::train(
        &TrainRequest::new(config.clone(), dir.path().join("refused")),
        &device,
        &splits,
        &mut |_e| {},
        &StopSignal::new(),
    )
    .unwrap_err();
    assert!(matches!(refused, Error::Memory(_)) && refused.to_string().contains("--auto-fit"), "{refused}");
    let mut req = TrainRequest::new(config.clone(), dir.path().join("fit"));
    req.auto_fit = true;
    req.max_steps = Some(2);
    req.export = false;
    let mut reasons = Vec::new();
    let s = train::train(
        &req,
        &device,
        &splits,
        &mut |e| {
            if let Event::BatchAdapted { reason, .. } = e {
                reasons.push(reason)
            }
        },
        &StopSignal::new(),
    )
    .unwrap();
    assert!(reasons[0].starts_with("--auto-fit"), "{reasons:?}");
    assert_eq!(reasons.len(), 1, "no out-of-memory retry under the cap: {reasons:?}");
    assert!(
        s.batch_size <= 256 && s.batch_size * s.grad_accum_steps == 1024,
        "{} x {}",
        s.batch_size,
        s.grad_accum_steps
    );
    assert!(s.memory.peak_bytes_reserved <= config.memory.memory_budget_bytes);
    assert_eq!(s.global_step, 2);
}
