//! The presets shipped in `configs/` (embedded, so the binary works from any folder) and
//! loading a config by preset name or file path: what the CLI's `--config` and the app's preset
//! picker share.

use std::path::Path;

use crate::config::Config;

/// Presets shipped in `configs/`, embedded so the binary works from any folder.
pub const PRESETS: [(&str, &str); 6] = [
    ("quickstart", include_str!("../../configs/quickstart.toml")),
    ("fashion-mnist", include_str!("../../configs/fashion-mnist.toml")),
    ("4gb", include_str!("../../configs/4gb.toml")),
    ("6gb", include_str!("../../configs/6gb.toml")),
    ("8gb", include_str!("../../configs/8gb.toml")),
    ("12gb", include_str!("../../configs/12gb.toml")),
];

/// Loads a preset by name or a config file by path.
///
/// # Errors
/// [`crate::Error::Config`] when neither exists or the file is invalid.
pub fn load_config(name_or_path: &str) -> crate::Result<Config> {
    if let Some((name, text)) = PRESETS.iter().find(|(n, _)| *n == name_or_path) {
        return Config::from_toml(text, &format!("preset {name}"));
    }
    let path = &crate::data::user_path::normalize(Path::new(name_or_path));
    if !path.exists() {
        return Err(crate::Error::Config {
            source_name: name_or_path.into(),
            message: format!(
                "no such file or preset; presets: {}",
                PRESETS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
            ),
        });
    }
    Config::load(path)
}

/// The tier preset for a card with `device_local_bytes` of memory: the largest tier whose
/// budget it holds (a "4 GB" card reports a little under 4 GiB, so 5% of slack is allowed);
/// `None` under the smallest tier.
pub fn tier_for_memory(device_local_bytes: u64) -> Option<&'static str> {
    const TIERS: [(&str, u64); 4] = [("12gb", 12), ("8gb", 8), ("6gb", 6), ("4gb", 4)];
    TIERS.iter().find(|(_, gib)| device_local_bytes as f64 >= 0.95 * (*gib << 30) as f64).map(|(name, _)| *name)
}

/// The preset the app chooses for training on one's own images on a card with
/// `device_local_bytes` of memory: the card's tier ([`tier_for_memory`]) as shipped; on a card
/// under the smallest tier (lavapipe reports 2 GiB), the smallest tier with its budget lowered to
/// the card's memory and the train settings [`tier_settings`] finds for that budget (the same
/// search that made the shipped tiers; f16 only where the adapter has it). Returns the name to
/// show and the config.
///
/// # Errors
/// [`crate::Error::Memory`] when not even micro-batch 1 of the smallest tier fits the card.
pub fn preset_for_card(device_local_bytes: u64, num_classes: usize, f16: bool) -> crate::Result<(String, Config)> {
    if let Some(tier) = tier_for_memory(device_local_bytes) {
        return Ok((tier.into(), load_config(tier)?));
    }
    let mut config = load_config("4gb")?;
    config.memory.memory_budget_bytes = device_local_bytes;
    let Some(settings) = tier_settings(&config, num_classes, f16) else {
        return Err(crate::Error::Memory(format!(
            "this card's {} holds not even micro-batch 1 of the 4gb preset: train on the CPU, or lower \
             data.preprocess.crop_size",
            crate::memory::human_bytes(device_local_bytes)
        )));
    };
    settings.apply(&mut config);
    let name = format!("4gb fitted to {}", crate::memory::human_bytes(device_local_bytes));
    Ok((name, config))
}

/// Fraction of a tier's budget its preset may plan to use: the rest is left to the display,
/// the driver and other programs on the card.
pub const TIER_HEADROOM: f64 = 0.8;

/// The savings a tier preset turns on, as the plan chooses them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierSettings {
    /// Training precision.
    pub precision: crate::config::Precision,
    /// Activation checkpointing.
    pub checkpointing: bool,
    /// Micro-batch.
    pub batch_size: usize,
    /// Accumulation steps (`batch_size x grad_accum_steps` = the config's effective batch).
    pub grad_accum_steps: usize,
}

/// One configuration the tier search tried.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TierCandidate {
    /// The settings tried.
    pub settings: TierSettings,
    /// Their predicted reserved peak in bytes ([`crate::memory::estimate`]'s `total`).
    pub predicted_bytes: u64,
    /// Whether that is within [`TIER_HEADROOM`] of the budget.
    pub fits: bool,
}

/// The cheapest settings in compute that train `config`'s effective batch within
/// [`TIER_HEADROOM`] of its budget, by [`crate::memory::plan`]: f32 without checkpointing (no
/// recomputation, no loss scaling), then f16, then f16 with checkpointing, each first as one
/// micro-batch; when none holds the whole batch, the largest micro-batch with accumulation that
/// the last of them fits. Without `f16` (an adapter with no f16 shaders) the candidates are f32,
/// then f32 with checkpointing. `None` when not even micro-batch 1 fits.
pub fn tier_settings(config: &Config, num_classes: usize, f16: bool) -> Option<TierSettings> {
    tier_search(config, num_classes, f16).0
}

/// [`tier_settings`] with every candidate it tried, in order (what `vramfit plan --suggest`
/// prints).
pub fn tier_search(config: &Config, num_classes: usize, f16: bool) -> (Option<TierSettings>, Vec<TierCandidate>) {
    use crate::config::Precision;
    let effective = config.train.batch_size * config.train.grad_accum_steps;
    let mut room = config.clone();
    room.memory.memory_budget_bytes = (config.memory.memory_budget_bytes as f64 * TIER_HEADROOM) as u64;
    let plan_of = |settings: &TierSettings| {
        let mut c = room.clone();
        settings.apply(&mut c);
        crate::memory::plan(&c, num_classes)
    };
    let candidates: &[(Precision, bool)] = if f16 {
        &[(Precision::F32, false), (Precision::F16, false), (Precision::F16, true)]
    } else {
        &[(Precision::F32, false), (Precision::F32, true)]
    };
    let mut tried = Vec::new();
    let mut last = None;
    for &(precision, checkpointing) in candidates {
        let settings = TierSettings { precision, checkpointing, batch_size: effective, grad_accum_steps: 1 };
        let plan = plan_of(&settings);
        tried.push(TierCandidate { settings, predicted_bytes: plan.estimate.total, fits: plan.fits });
        if plan.fits {
            return (Some(settings), tried);
        }
        last = Some((settings, plan));
    }
    // The last candidate saves the most: its plan holds the split that fits.
    let Some((whole, plan)) = last else { return (None, tried) };
    if plan.fit_batch_size == 0 {
        return (None, tried);
    }
    let settings =
        TierSettings { batch_size: plan.fit_batch_size, grad_accum_steps: plan.fit_grad_accum_steps, ..whole };
    let split = plan_of(&settings);
    tried.push(TierCandidate { settings, predicted_bytes: split.estimate.total, fits: split.fits });
    (Some(settings), tried)
}

impl TierSettings {
    /// Writes these settings into `config`'s `train` section.
    pub fn apply(&self, config: &mut Config) {
        config.train.precision = self.precision;
        config.train.checkpointing = self.checkpointing;
        config.train.batch_size = self.batch_size;
        config.train.grad_accum_steps = self.grad_accum_steps;
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

    /// The tier presets' savings are the plan's choice (10 classes), not guesses: a preset that
    /// turns on more than its budget needs makes a user pay recomputation and small batches for
    /// nothing, and one that turns on less does not fit.
    #[test]
    fn tier_presets_hold_the_settings_their_plan_chooses() {
        for name in ["4gb", "6gb", "8gb", "12gb"] {
            let config = load_config(name).unwrap();
            let chosen = tier_settings(&config, 10, true).unwrap_or_else(|| panic!("{name}: nothing fits"));
            let t = &config.train;
            let shipped = TierSettings {
                precision: t.precision,
                checkpointing: t.checkpointing,
                batch_size: t.batch_size,
                grad_accum_steps: t.grad_accum_steps,
            };
            assert_eq!(shipped, chosen, "{name}: configs/{name}.toml should hold the plan's choice");
            let use_fraction =
                crate::memory::plan(&config, 10).estimate.total as f64 / config.memory.memory_budget_bytes as f64;
            assert!(use_fraction <= TIER_HEADROOM, "{name} plans {:.0}% of its budget", 100.0 * use_fraction);
        }
    }

    #[test]
    fn a_small_budget_turns_savings_on_in_order() {
        use crate::config::Precision::{self, F16, F32};
        let base = load_config("12gb").unwrap();
        let needs = |precision: Precision, checkpointing: bool| {
            let mut c = base.clone();
            (c.train.precision, c.train.checkpointing) = (precision, checkpointing);
            crate::memory::estimate(&c, 32, 10).total
        };
        let with_room_for = |bytes: u64| {
            let mut c = base.clone();
            c.memory.memory_budget_bytes = (bytes as f64 / TIER_HEADROOM).ceil() as u64;
            tier_settings(&c, 10, true).unwrap()
        };
        let pick = |s: TierSettings| (s.precision, s.checkpointing, s.batch_size, s.grad_accum_steps);
        assert_eq!(pick(with_room_for(needs(F32, false))), (F32, false, 32, 1));
        assert_eq!(pick(with_room_for(needs(F32, false) - 1)), (F16, false, 32, 1));
        assert_eq!(pick(with_room_for(needs(F16, false) - 1)), (F16, true, 32, 1));
        let s = with_room_for(needs(F16, true) - 1);
        assert_eq!((s.precision, s.checkpointing), (F16, true));
        assert!(s.batch_size < 32 && s.batch_size * s.grad_accum_steps == 32, "{s:?}");
        // The search reports what it tried: the three whole-batch savings, then the split.
        let mut c = base.clone();
        c.memory.memory_budget_bytes = ((needs(F16, true) - 1) as f64 / TIER_HEADROOM).ceil() as u64;
        let (chosen, tried) = tier_search(&c, 10, true);
        assert_eq!(tried.len(), 4);
        assert!(tried[..3].iter().all(|t| !t.fits) && tried[3].fits);
        assert_eq!(tried[0].predicted_bytes, needs(F32, false));
        assert_eq!(Some(tried[3].settings), chosen);
        assert_eq!(tried[0].settings.to_string(), "f32, checkpointing off, batch 32 x 1");
    }

    #[test]
    fn a_card_gets_the_largest_tier_it_holds() {
        assert_eq!(tier_for_memory(2 << 30), None); // lavapipe reports 2 GiB
        assert_eq!(tier_for_memory(4_096_000_000), Some("4gb")); // a "4 GB" card: 3.81 GiB
        assert_eq!(tier_for_memory(8 << 30), Some("8gb"));
        assert_eq!(tier_for_memory(11 << 30), Some("8gb"));
        assert_eq!(tier_for_memory(24 << 30), Some("12gb"));
    }

    #[test]
    fn a_card_under_the_smallest_tier_gets_it_fitted_to_its_memory() {
        use crate::config::Precision::{F16, F32};
        let (name, config) = preset_for_card(8 << 30, 10, true).unwrap();
        assert_eq!((name.as_str(), &config), ("8gb", &load_config("8gb").unwrap()));
        // A 1.2 GiB card: the 4gb preset's f32 batch 32 plans 1052 MiB with the fused GroupNorm +
        // GELU kernels (1.9 GiB with burn's ops), over 80% of 1.2 GiB; in f16 it plans 830 MiB.
        let card = (12u64 << 30) / 10;
        let fitted = |f16| {
            let (name, config) = preset_for_card(card, 10, f16).unwrap();
            assert_eq!(name, "4gb fitted to 1.2 GiB");
            assert_eq!(config.memory.memory_budget_bytes, card);
            let plan = crate::memory::plan(&config, 10);
            assert!(plan.fits && plan.estimate.total as f64 <= TIER_HEADROOM * card as f64, "{plan:?}");
            assert_eq!(config.train.batch_size * config.train.grad_accum_steps, 32);
            (config.train.precision, config.train.checkpointing)
        };
        assert_eq!(fitted(true), (F16, false));
        // An adapter without f16 shaders saves with checkpointing instead.
        assert_eq!(fitted(false), (F32, true));
        let tiny = preset_for_card(1 << 20, 10, true).unwrap_err().to_string();
        assert!(tiny.contains("1.0 MiB") && tiny.contains("not even micro-batch 1"), "{tiny}");
    }

    #[test]
    fn every_preset_parses_and_validates() {
        for (name, _) in PRESETS {
            let config = load_config(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(config.name, name);
        }
    }

    #[test]
    fn an_unknown_name_lists_the_presets() {
        let e = load_config("tiny").unwrap_err().to_string();
        assert!(e.contains("tiny") && e.contains("quickstart, fashion-mnist, 4gb"), "{e}");
    }
}
