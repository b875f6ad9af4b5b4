//! `vramfit plan`: the memory plan of a config, term by term, against its budget; `--suggest`
//! searches the fastest settings that plan within the tier band.

use std::process::ExitCode;

use clap::Args;

use super::ConfigArgs;
use crate::config::Config;
use crate::memory::{self, human_bytes};

/// `vramfit plan`: exit status 0 when the configuration fits its budget, 2 when it does not.
#[derive(Args, Debug)]
pub struct PlanArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Number of classes of the head.
    #[arg(long, default_value_t = 10)]
    classes: usize,
    /// Search the fastest settings (precision, checkpointing, micro-batch x accumulation for the
    /// config's effective batch) whose plan is 60-90% of the budget, as the tier presets are
    /// made, and print each candidate and the choice.
    #[arg(long)]
    suggest: bool,
    /// Also measure the plan on a GPU adapter: run a first step and two steps of the config
    /// under cubecl's dry run (kernels compiled, not dispatched; the pools' pages carved without
    /// device memory) and print what the pools reserved and the exact plan, the smaller of that
    /// and the plan. 2-11 s on lavapipe built without autotune; with the default features the
    /// first step also autotunes its kernels for real. The adapter is `--device gpu`'s unless
    /// `--adapter` names one.
    #[arg(long)]
    exact: bool,
    #[command(flatten)]
    device: super::DeviceArgs,
    #[command(flatten)]
    devices: super::DevicesArgs,
}

/// The plan as printed by `vramfit plan`.
pub fn plan_report(config: &Config, p: &memory::Plan) -> String {
    let e = &p.estimate;
    let mut s = format!(
        "config {}: batch {} x accumulation {}, {} px, {}, checkpointing {}\n",
        config.name,
        config.train.batch_size,
        config.train.grad_accum_steps,
        config.image_size_px(),
        config.train.precision,
        if config.train.checkpointing { "on" } else { "off" }
    );
    let mut row = |name: &str, v: u64| s.push_str(&format!("  {name:<54}{:>12}\n", human_bytes(v)));
    row("parameters", e.parameters);
    row("gradients (live at the peak)", e.gradients);
    row("optimizer state (AdamW)", e.optimizer_state);
    row("f16 weight copies", e.weight_casts);
    row("input batch", e.input_batch);
    for (i, a) in e.activations_per_stage.iter().enumerate() {
        let name = if i == 0 {
            "activations: stem".to_string()
        } else if i == e.activations_per_stage.len() - 1 {
            "activations: head".into()
        } else {
            format!("activations: stage {i}")
        };
        row(&name, *a);
    }
    row("workspace (backward pass)", e.workspace);
    row("peak in use", e.peak_in_use);
    let layout = memory::PoolLayout::this_build();
    let pools = match layout {
        memory::PoolLayout::Adaptive => {
            let uncapped = memory::SMALL_POOL_PAGE + (e.pool_slack_pages * e.page_size as f64) as u64;
            let capped = if e.allocator_overhead < uncapped {
                format!(", capped at {}", human_bytes(memory::max_slack_without_checkpointing(e.page_size)))
            } else {
                String::new()
            };
            format!("pool pages (8 MiB + {} x {} pages{capped})", e.pool_slack_pages, human_bytes(e.page_size))
        }
        memory::PoolLayout::ExclusivePages { .. } => "pool pages (one per tensor, in size buckets)".to_string(),
    };
    row(&pools, e.allocator_overhead);
    s.push_str(&format!("  {:<54}{:>12}\n", "predicted peak (reserved)", human_bytes(e.total)));
    s.push_str(&format!("  {}\n", layout.error_band().describe("the plan", e.total)));
    s.push_str(&format!("budget {}: {}\n", human_bytes(p.budget_bytes), p.verdict()));
    let effective = config.train.batch_size * config.train.grad_accum_steps;
    if p.fit_batch_size == 0 {
        s.push_str("not even batch 1 fits: lower crop_size or turn on f16/checkpointing\n");
    } else {
        s.push_str(&format!(
            "largest batch that fits without accumulation, keeping the plan's {:.1}% measured shortfall: {}\n",
            memory::fit_margin_percent(memory::PoolLayout::this_build()),
            p.max_batch_size
        ));
        if !p.fits {
            let (b, a) = (p.fit_batch_size, p.fit_grad_accum_steps);
            let keep = if b * a == effective { "to keep" } else { "closest to" };
            s.push_str(&format!(
                "{keep} the effective batch of {effective}: batch_size {b} x grad_accum_steps {a} (or pass --auto-fit)\n"
            ));
        }
    }
    s
}

pub fn plan(args: PlanArgs) -> anyhow::Result<ExitCode> {
    // `--budget` is the config flag every command shares (`ConfigArgs`).
    let mut config = args.config.load()?;
    if args.suggest {
        print!("{}", suggest_report(&mut config, args.classes));
    }
    let p = memory::plan(&config, args.classes);
    print!("{}", plan_report(&config, &p));
    if let Some(line) = tier_line(&config, args.classes) {
        print!("{line}");
    }
    if !args.devices.devices.is_empty() {
        print!("{}", data_parallel_report(&config, args.classes, &args.devices.devices));
    }
    if args.exact {
        // The main device of `--devices`, else `--device` / `--adapter`.
        let choice = match args.devices.devices.first() {
            Some(crate::device::DeviceChoice::Auto) => crate::device::DeviceChoice::Gpu(None),
            Some(&first) => first,
            None => args.device.gpu_choice()?,
        };
        let device = super::commands::select_device(choice)?;
        if !device.is_gpu() {
            anyhow::bail!(
                "plan --exact measures a GPU adapter's memory pools and {} has none: pass --device gpu \
                 (`vramfit devices` lists the adapters)",
                device.name
            );
        }
        let dry = crate::train::dry_run_step_memory(&config, &device, args.classes, 2)?;
        let exact = memory::exact_peak(p.estimate.total, dry.bytes_reserved);
        println!(
            "dry run: a first step and two steps under cubecl's dry run on {} ({:.1} s) reserved {}\n\
             exact plan (the smaller of the plan and the dry run): {}; {}",
            device.name,
            dry.secs,
            human_bytes(dry.bytes_reserved),
            human_bytes(exact),
            memory::EXACT_ERROR_BAND.describe("it", exact),
        );
    }
    // Exit status 2 when the configuration does not fit, for scripts (`plan && train`).
    Ok(if p.fits { ExitCode::SUCCESS } else { ExitCode::from(2) })
}

/// `vramfit plan --devices A,B,...`: each device's plan in a data-parallel run
/// ([`memory::data_parallel_estimates`]) against the budget, which each device has to itself.
fn data_parallel_report(config: &Config, classes: usize, devices: &[crate::device::DeviceChoice]) -> String {
    let estimates = memory::data_parallel_estimates(config, classes, devices.len());
    let budget = config.memory.memory_budget_bytes;
    let mut s = format!(
        "on {} devices, {} micro-batch(es) of {} a step dealt round robin (the budget is each device's):\n",
        devices.len(),
        config.train.grad_accum_steps,
        config.train.batch_size
    );
    for (d, (device, e)) in devices.iter().zip(&estimates).enumerate() {
        let role = if d == 0 { "main: weights, gradients, AdamW" } else { "replica: weights, gradients" };
        let verdict = if e.total <= budget { "fits" } else { "over the budget" };
        let state = e.parameters + e.gradients + e.optimizer_state + e.weight_casts;
        s.push_str(&format!(
            "  {:<10} {role:<34} state {:>10}  activations {:>10}  predicted peak {:>10}  {verdict}\n",
            device.token(),
            human_bytes(state),
            human_bytes(e.activations()),
            human_bytes(e.total)
        ));
    }
    s
}

/// `vramfit plan --suggest`: the tier search's candidates and choice; applies the choice to
/// `config` so the plan printed after it is the suggested one.
fn suggest_report(config: &mut Config, classes: usize) -> String {
    use crate::config::tiers::{TIER_BAND, tier_reason, tier_search};
    let effective = config.train.batch_size * config.train.grad_accum_steps;
    let mut s = format!(
        "fastest settings for an effective batch of {effective} planned at {:.0}-{:.0}% of {}, fastest first:\n",
        TIER_BAND.0 * 100.0,
        TIER_BAND.1 * 100.0,
        human_bytes(config.memory.memory_budget_bytes),
    );
    let (chosen, tried) = tier_search(config, classes, true);
    for t in &tried {
        let verdict = if t.in_band() {
            "in the band"
        } else if t.fits() {
            "under"
        } else {
            "over"
        };
        s.push_str(&format!(
            "  {:<40}{:>12} {:>5.0}%  {verdict}\n",
            t.settings.to_string(),
            human_bytes(t.predicted_bytes),
            100.0 * t.share
        ));
    }
    match chosen {
        Some(c) => {
            let t = c.settings;
            s.push_str(&format!(
                "suggested, {}: --set train.precision={} --set train.checkpointing={} --batch-size {} --grad-accum-steps {}\n\n",
                tier_reason(&c, config.memory.memory_budget_bytes),
                t.precision,
                t.checkpointing,
                t.batch_size,
                t.grad_accum_steps
            ));
            t.apply(config);
            config.name = format!("{} with the suggested settings", config.name);
        }
        None => s.push_str(&format!(
            "nothing plans under {:.0}% of the budget, not even micro-batch 1 with f16 and checkpointing: raise the budget or lower crop_size\n\n",
            100.0 * TIER_BAND.1
        )),
    }
    s
}

/// For a config whose train settings are the tier search's choice for its budget (a shipped
/// tier preset, or one `--suggest` made), the line saying why: `tier 8gb: the fastest ...`.
fn tier_line(config: &Config, classes: usize) -> Option<String> {
    use crate::config::tiers::{TIERS, TierSettings, tier_reason, tier_search};
    if !TIERS.contains(&config.name.as_str()) {
        return None;
    }
    let chosen = tier_search(config, classes, true).0?;
    (chosen.settings == TierSettings::of(config))
        .then(|| format!("tier {}: {}\n", config.name, tier_reason(&chosen, config.memory.memory_budget_bytes)))
}
