//! The presets shipped in `configs/` (embedded, so the binary works from any folder) and
//! loading a config by preset name or file path: what the CLI's `--config` and the app's preset
//! picker share.

use std::path::Path;

use crate::config::Config;

/// Presets shipped in `configs/`, embedded so the binary works from any folder.
pub const PRESETS: [(&str, &str); 6] = [
    ("quickstart", include_str!("../configs/quickstart.toml")),
    ("fashion-mnist", include_str!("../configs/fashion-mnist.toml")),
    ("4gb", include_str!("../configs/4gb.toml")),
    ("6gb", include_str!("../configs/6gb.toml")),
    ("8gb", include_str!("../configs/8gb.toml")),
    ("12gb", include_str!("../configs/12gb.toml")),
];

/// Loads a preset by name or a config file by path.
///
/// # Errors
/// [`crate::Error::Config`] when neither exists or the file is invalid.
pub fn load_config(name_or_path: &str) -> crate::Result<Config> {
    if let Some((name, text)) = PRESETS.iter().find(|(n, _)| *n == name_or_path) {
        return Config::from_toml(text, &format!("preset {name}"));
    }
    let path = &crate::user_path::normalize(Path::new(name_or_path));
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

#[cfg(test)]
mod tests {
    use super::*;

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
