//! The tier presets (`configs/4gb.toml` .. `12gb.toml`): one shared recipe, and for each card
//! size the fastest way to train it that uses the card.
//!
//! The recipe is everything but four keys: the network, the data and augmentation, the
//! effective batch (`batch_size x grad_accum_steps`), the learning rate and its schedule, so
//! every tier trains to the same result up to noise and a run moves between cards unchanged.
//! The four keys (micro-batch, accumulation, precision, checkpointing) are [`tier_search`]'s
//! choice: the fastest settings whose planned peak ([`crate::memory::estimate`]'s `total`,
//! reserved bytes) is within [`TIER_BAND`] of the tier's budget. Under the band's floor a tier
//! would leave its card idle (the four tiers were one configuration using 8-25% of their cards);
//! over its ceiling the display, the driver and other programs have no room.

use crate::config::{Config, Precision};

/// The tier presets, smallest card first.
pub const TIERS: [&str; 4] = ["4gb", "6gb", "8gb", "12gb"];

/// The share of a tier's budget its planned peak may use: at least the floor (a bigger card
/// buys a faster configuration), at most the ceiling (the rest stays free for the display, the
/// driver and other programs on the card).
pub const TIER_BAND: (f64, f64) = (0.6, 0.9);

/// The four keys a tier chooses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierSettings {
    /// Training precision.
    pub precision: Precision,
    /// Activation checkpointing.
    pub checkpointing: bool,
    /// Micro-batch: images on the device at once (`train.batch_size`).
    pub batch_size: usize,
    /// Accumulation steps (`batch_size x grad_accum_steps` = the recipe's effective batch).
    pub grad_accum_steps: usize,
}

/// One configuration the tier search planned.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TierCandidate {
    /// The settings.
    pub settings: TierSettings,
    /// Their predicted reserved peak in bytes ([`crate::memory::estimate`]'s `total`).
    pub predicted_bytes: u64,
    /// That peak over the budget (0.76 = 76%).
    pub share: f64,
}

impl TierCandidate {
    /// Whether the share is within [`TIER_BAND`].
    pub fn in_band(&self) -> bool {
        (TIER_BAND.0..=TIER_BAND.1).contains(&self.share)
    }

    /// Whether the peak is at most the band's ceiling.
    pub fn fits(&self) -> bool {
        self.share <= TIER_BAND.1
    }
}

/// Every way to train `effective` images per optimizer step, fastest first: without
/// checkpointing before with it (recomputing the forward pass costs about a third more
/// compute), then fewer micro-batches before more (each micro-batch pays its kernels' launches
/// and a smaller grid), then f16 before f32 where the adapter has f16 shaders (half the
/// activation traffic). An ordering, not a measurement: no real card was measured with it yet.
fn candidates(effective: usize, f16: bool) -> Vec<TierSettings> {
    let precisions: &[Precision] = if f16 { &[Precision::F16, Precision::F32] } else { &[Precision::F32] };
    let mut out = Vec::new();
    for checkpointing in [false, true] {
        for grad_accum_steps in (1..=effective).filter(|a| effective.is_multiple_of(*a)) {
            for &precision in precisions {
                let batch_size = effective / grad_accum_steps;
                out.push(TierSettings { precision, checkpointing, batch_size, grad_accum_steps });
            }
        }
    }
    out
}

/// The fastest settings ([`candidates`]' order) that train `config`'s effective batch with a
/// planned peak within [`TIER_BAND`] of its budget; where none lands in the band (a budget too
/// small or too large for the recipe), the fastest whose peak is under the band's ceiling.
/// `f16`: whether the adapter has f16 shaders. `None` when not even one image per micro-batch
/// fits under the ceiling.
pub fn tier_settings(config: &Config, num_classes: usize, f16: bool) -> Option<TierSettings> {
    tier_search(config, num_classes, f16).0.map(|c| c.settings)
}

/// [`tier_settings`] with the candidates it planned, in order, up to the choice (all of them
/// when none lands in the band): what `vramfit plan --suggest` prints.
pub fn tier_search(config: &Config, num_classes: usize, f16: bool) -> (Option<TierCandidate>, Vec<TierCandidate>) {
    let effective = config.train.batch_size * config.train.grad_accum_steps;
    let budget = config.memory.memory_budget_bytes.max(1) as f64;
    let mut tried = Vec::new();
    for settings in candidates(effective, f16) {
        let mut c = config.clone();
        settings.apply(&mut c);
        let predicted_bytes = crate::memory::estimate(&c, settings.batch_size, num_classes).total;
        let candidate = TierCandidate { settings, predicted_bytes, share: predicted_bytes as f64 / budget };
        tried.push(candidate);
        if candidate.in_band() {
            return (Some(candidate), tried);
        }
    }
    let fastest_fitting = tried.iter().find(|c| c.fits()).copied();
    (fastest_fitting, tried)
}

/// Why a tier has the settings `chosen`, in one line: e.g. "the fastest settings for the
/// recipe's effective batch 256 that plan 60-90% of 8.0 GiB (faster ones that plan less are
/// passed over: a tier uses its card): f16, checkpointing off, batch 256 x 1, 5.9 GiB (73%)".
pub fn tier_reason(chosen: &TierCandidate, budget_bytes: u64) -> String {
    let s = &chosen.settings;
    let budget = crate::memory::human_bytes(budget_bytes);
    let band = format!("{:.0}-{:.0}%", 100.0 * TIER_BAND.0, 100.0 * TIER_BAND.1);
    let what = if chosen.in_band() {
        format!("plan {band} of {budget} (faster ones that plan less are passed over: a tier uses its card)")
    } else {
        format!("fit {:.0}% of {budget} (none plans {band})", 100.0 * TIER_BAND.1)
    };
    format!(
        "the fastest settings for the recipe's effective batch {} that {what}: {s}, {} ({:.0}%)",
        s.batch_size * s.grad_accum_steps,
        crate::memory::human_bytes(chosen.predicted_bytes),
        100.0 * chosen.share
    )
}

impl TierSettings {
    /// Writes these settings into `config`'s `train` section.
    pub fn apply(&self, config: &mut Config) {
        config.train.precision = self.precision;
        config.train.checkpointing = self.checkpointing;
        config.train.batch_size = self.batch_size;
        config.train.grad_accum_steps = self.grad_accum_steps;
    }

    /// The settings `config` trains with.
    pub fn of(config: &Config) -> Self {
        let t = &config.train;
        Self {
            precision: t.precision,
            checkpointing: t.checkpointing,
            batch_size: t.batch_size,
            grad_accum_steps: t.grad_accum_steps,
        }
    }
}

impl std::fmt::Display for TierSettings {
    /// `f32, checkpointing off, batch 32 x 1`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}, checkpointing {}, batch {} x {}",
            self.precision,
            if self.checkpointing { "on" } else { "off" },
            self.batch_size,
            self.grad_accum_steps
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Precision::{F16, F32};
    use crate::config::presets::load_config;

    /// Each shipped tier holds the search's choice for its budget (10 classes, an adapter with
    /// f16), its plan is within the band, no two tiers are the same configuration, and all four
    /// share the recipe: the configs differ in the four chosen keys, the budget and the name only.
    #[test]
    fn the_tiers_differ_fill_their_band_and_share_one_recipe() {
        let recipe = |name: &str| {
            let mut c = load_config(name).unwrap();
            TierSettings { precision: F32, checkpointing: false, batch_size: 1, grad_accum_steps: 1 }.apply(&mut c);
            c.name.clear();
            c.memory.memory_budget_bytes = 0;
            c
        };
        let effective = |c: &Config| c.train.batch_size * c.train.grad_accum_steps;
        let first = load_config(TIERS[0]).unwrap();
        let mut seen = Vec::new();
        for name in TIERS {
            let config = load_config(name).unwrap();
            let (chosen, _) = tier_search(&config, 10, true);
            let chosen = chosen.unwrap_or_else(|| panic!("{name}: nothing fits"));
            assert_eq!(
                TierSettings::of(&config),
                chosen.settings,
                "{name}: configs/{name}.toml should hold the search's choice"
            );
            assert!(chosen.in_band(), "{name} plans {:.0}% of its budget", 100.0 * chosen.share);
            let plan = crate::memory::plan(&config, 10);
            assert_eq!(plan.estimate.total, chosen.predicted_bytes, "{name}");
            assert!(plan.fits, "{name}");
            assert_eq!(recipe(name), recipe(TIERS[0]), "{name} changes the recipe");
            assert_eq!(effective(&config), effective(&first), "{name}");
            assert!(!seen.contains(&chosen.settings), "{name} repeats another tier: {}", chosen.settings);
            seen.push(chosen.settings);
        }
    }

    /// The search's order on the 12gb recipe's effective batch of 256: with room for everything
    /// the fastest (f16, one micro-batch) is only taken where it lands in the band; each budget
    /// below gets the next way in the order; a budget the band cannot be met for takes the
    /// fastest that fits; none fits a budget under one image.
    #[test]
    fn the_search_takes_the_fastest_settings_in_the_band() {
        let base = load_config("12gb").unwrap();
        let needs = |settings: TierSettings| {
            let mut c = base.clone();
            settings.apply(&mut c);
            crate::memory::estimate(&c, settings.batch_size, 10).total
        };
        let set = |precision, checkpointing, batch_size, grad_accum_steps| TierSettings {
            precision,
            checkpointing,
            batch_size,
            grad_accum_steps,
        };
        let on_budget = |budget: u64, f16: bool| {
            let mut c = base.clone();
            c.memory.memory_budget_bytes = budget;
            tier_search(&c, 10, f16)
        };
        // A budget the f16 single micro-batch fills to 80%: it is taken, and it was tried first.
        let f16_whole = set(F16, false, 256, 1);
        let (chosen, tried) = on_budget((needs(f16_whole) as f64 / 0.8) as u64, true);
        assert_eq!(chosen.unwrap().settings, f16_whole);
        assert_eq!(tried.len(), 1);
        // A budget f32 fills to 75%: f16 uses under 60% of it, and f32 is next in the order.
        let f32_whole = set(F32, false, 256, 1);
        let (chosen, tried) = on_budget((needs(f32_whole) as f64 / 0.75) as u64, true);
        let chosen = chosen.unwrap();
        assert_eq!((tried[0].settings, chosen.settings), (f16_whole, f32_whole));
        assert!(!tried[0].in_band() && tried[0].fits() && chosen.in_band(), "{tried:?}");
        // Without f16 shaders f16 is never tried.
        let (chosen, tried) = on_budget((needs(f16_whole) as f64 / 0.8) as u64, false);
        assert!(tried.iter().all(|t| t.settings.precision == F32), "{tried:?}");
        let chosen = chosen.unwrap();
        assert!(chosen.in_band() && chosen.settings != set(F32, false, 256, 1), "{chosen:?}");
        // A huge budget: nothing lands in the band; the fastest fitting settings are taken.
        let (chosen, tried) = on_budget(1 << 50, true);
        assert_eq!(chosen.unwrap().settings, f16_whole);
        assert_eq!(tried.len(), candidates(256, true).len());
        // Under one image in f16 with checkpointing: nothing.
        let least = needs(set(F16, true, 1, 256));
        assert_eq!(on_budget(least / 2, true).0, None);
        // Every candidate has the effective batch, and checkpointing comes after every way without.
        let all = candidates(256, true);
        assert!(all.iter().all(|s| s.batch_size * s.grad_accum_steps == 256));
        let first_checkpointed = all.iter().position(|s| s.checkpointing).unwrap();
        assert!(all[first_checkpointed..].iter().all(|s| s.checkpointing));
        assert_eq!(all[0].to_string(), "f16, checkpointing off, batch 256 x 1");
    }

    #[test]
    fn the_reason_names_the_band_the_settings_and_the_share() {
        let config = load_config("8gb").unwrap();
        let (chosen, _) = tier_search(&config, 10, true);
        let reason = tier_reason(&chosen.unwrap(), config.memory.memory_budget_bytes);
        assert!(
            reason.starts_with(
                "the fastest settings for the recipe's effective batch 256 that plan 60-90% of 8.0 GiB (faster ones "
            ),
            "{reason}"
        );
        assert!(reason.contains(&TierSettings::of(&config).to_string()), "{reason}");
    }
}
