//! The presets shipped in `configs/` (embedded, so the binary works from any folder) and
//! loading a config by preset name or file path: what the CLI's `--config` and the app's preset
//! picker share.

use std::path::Path;

use crate::config::Config;
use crate::config::tiers::tier_settings;

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
/// `device_local_bytes` of memory: the card's tier ([`tier_for_memory`]) as shipped, or with its
/// four chosen keys searched again where the shipped tier trains in f16 and the adapter has no
/// f16 shaders; on a card under the smallest tier (lavapipe reports 2 GiB), the smallest tier
/// with its budget lowered to the card's memory and the settings [`tier_settings`] finds for it
/// (the search that made the shipped tiers). Returns the name to show and the config.
///
/// # Errors
/// [`crate::Error::Memory`] when not even micro-batch 1 of the smallest tier fits the card.
pub fn preset_for_card(device_local_bytes: u64, num_classes: usize, f16: bool) -> crate::Result<(String, Config)> {
    let (name, mut config) = match tier_for_memory(device_local_bytes) {
        Some(tier) => {
            let config = load_config(tier)?;
            if f16 || config.train.precision == crate::config::Precision::F32 {
                return Ok((tier.into(), config));
            }
            (format!("{tier} without f16"), config)
        }
        None => {
            let mut config = load_config("4gb")?;
            config.memory.memory_budget_bytes = device_local_bytes;
            (format!("4gb fitted to {}", crate::memory::human_bytes(device_local_bytes)), config)
        }
    };
    let Some(settings) = tier_settings(&config, num_classes, f16) else {
        return Err(crate::Error::Memory(format!(
            "this card's {} holds not even micro-batch 1 of the 4gb preset: train on the CPU, or lower \
             data.preprocess.crop_size",
            crate::memory::human_bytes(device_local_bytes)
        )));
    };
    settings.apply(&mut config);
    Ok((name, config))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        use crate::config::Precision::F16;
        use crate::config::tiers::TIER_BAND;
        let (name, config) = preset_for_card(8 << 30, 10, true).unwrap();
        assert_eq!((name.as_str(), &config), ("8gb", &load_config("8gb").unwrap()));
        // A 1.2 GiB card: the 4gb recipe, its budget the card's, settings searched for it.
        let card = (12u64 << 30) / 10;
        let fitted = |f16| {
            let (name, config) = preset_for_card(card, 10, f16).unwrap();
            assert_eq!(name, "4gb fitted to 1.2 GiB");
            assert_eq!(config.memory.memory_budget_bytes, card);
            let plan = crate::memory::plan(&config, 10);
            assert!(plan.fits && plan.estimate.total as f64 <= TIER_BAND.1 * card as f64, "{plan:?}");
            let four = load_config("4gb").unwrap();
            let effective = |c: &Config| c.train.batch_size * c.train.grad_accum_steps;
            assert_eq!(effective(&config), effective(&four));
            assert_eq!(config.optimizer, four.optimizer);
            config.train.precision
        };
        assert_eq!(fitted(true), F16);
        // An adapter without f16 shaders gets f32 settings, also for a shipped tier in f16.
        assert_eq!(fitted(false), crate::config::Precision::F32);
        let shipped_f16 = ["4gb", "6gb", "8gb", "12gb"]
            .into_iter()
            .find(|t| load_config(t).unwrap().train.precision == F16)
            .expect("a tier in f16");
        let card = load_config(shipped_f16).unwrap().memory.memory_budget_bytes;
        let (name, config) = preset_for_card(card, 10, false).unwrap();
        assert_eq!(name, format!("{shipped_f16} without f16"));
        assert_eq!(config.train.precision, crate::config::Precision::F32);
        assert!(crate::memory::plan(&config, 10).fits);
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
