//! The app's settings as a previous launch saved them (eframe's `app.ron`), read so that nothing
//! is dropped without a word: a file that is not the app's format, truncated or empty, a field
//! of a newer version, a config key renamed since, values out of range. Each gives a notice the
//! window shows, and the valid parts are kept. What the settings point at (the dataset folder,
//! the adapter) is checked by the app once it knows the adapters ([`super::VramfitApp`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ron::value::RawValue;
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::device::{AdapterInfo, CpuBackend};

/// Settings kept between launches (eframe persistence).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// Preset the sliders started from, or "custom" once edited.
    pub preset: String,
    /// The configuration the sliders edit.
    pub config: Config,
    /// Dataset folder; `None` = the bundled subset.
    pub data_dir: Option<PathBuf>,
    /// Adapter index, or `None` for CPU.
    pub adapter: Option<usize>,
    /// CPU backend when `adapter` is `None`.
    pub cpu_backend: CpuBackend,
}

impl Default for Settings {
    fn default() -> Self {
        let config = crate::config::presets::load_config("quickstart").unwrap_or_default();
        Self { preset: "quickstart".into(), config, data_dir: None, adapter: Some(0), cpu_backend: CpuBackend::DEFAULT }
    }
}

/// Notices about what `settings` point at that is gone: an adapter index this machine does not
/// have among `adapters` (the app falls back to `device_label`, the CPU), a dataset folder that
/// no longer exists.
pub fn target_notices(settings: &Settings, adapters: &[AdapterInfo], device_label: &str) -> Vec<String> {
    let mut notices = Vec::new();
    if let Some(i) = settings.adapter.filter(|&i| i >= adapters.len()) {
        notices.push(format!(
            "the saved adapter {i} is not on this machine ({} adapters found): using {device_label}",
            adapters.len()
        ));
    }
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(dir) = settings.data_dir.as_ref().filter(|d| !d.exists()) {
        notices.push(format!(
            "the saved dataset folder {} no longer exists: choose another, or clear it for the bundled data",
            dir.display()
        ));
    }
    notices
}

/// The fields [`Settings`] has.
const FIELDS: [&str; 5] = ["preset", "config", "data_dir", "adapter", "cpu_backend"];

/// The settings text eframe keeps in `file` (its `app.ron`) under `key`, read as eframe reads
/// it; when the file exists but cannot be read as eframe's format, the notice says so and a
/// copy is kept beside it (`app.ron.unreadable`), since eframe overwrites the file on exit.
pub fn read_storage_file(file: &Path, key: &str) -> (Option<String>, Vec<String>) {
    let Ok(bytes) = std::fs::read(file) else { return (None, Vec::new()) };
    let parsed = std::str::from_utf8(&bytes)
        .map_err(|e| e.to_string())
        .and_then(|text| ron::from_str::<BTreeMap<String, String>>(text).map_err(|e| e.to_string()));
    match parsed {
        Ok(mut map) => (map.remove(key), Vec::new()),
        Err(e) => {
            let kept = file.with_extension("ron.unreadable");
            let copy = match std::fs::write(&kept, &bytes) {
                Ok(()) => format!("; a copy is kept as {}", kept.display()),
                Err(_) => String::new(),
            };
            let what = if bytes.iter().all(u8::is_ascii_whitespace) { "empty".to_string() } else { e };
            (
                None,
                vec![format!(
                    "the saved settings in {} could not be read ({what}): started with the defaults{copy}",
                    file.display()
                )],
            )
        }
    }
}

/// Settings from the text a previous launch saved (`None`: none saved), with a notice for each
/// thing dropped or reset and why. The valid fields are kept one by one; a config that does not
/// load (a key renamed since) or holds values out of range is replaced by its preset's.
pub fn restore(saved: Option<&str>) -> (Settings, Vec<String>) {
    let Some(text) = saved else { return (Settings::default(), Vec::new()) };
    let mut notices = Vec::new();
    let value = match ron::from_str::<ron::Value>(text) {
        Ok(ron::Value::Map(map)) => map,
        Ok(_) | Err(_) => {
            notices.push("the saved settings are not this app's (or are cut short): started with the defaults".into());
            return (Settings::default(), notices);
        }
    };
    // The fields' own text: `ron::Value` holds no enum variant (`flex`, `white` read back as
    // a unit), so each field is read from its text, as the app wrote it.
    let Ok(raw) = ron::from_str::<RawFields>(text) else {
        notices.push("the saved settings are not this app's (or are cut short): started with the defaults".into());
        return (Settings::default(), notices);
    };
    let mut settings = Settings::default();
    let mut unknown = Vec::new();
    for key in value.keys() {
        let name = match key {
            ron::Value::String(s) => s.clone(),
            other => format!("{other:?}"),
        };
        if !FIELDS.contains(&name.as_str()) {
            unknown.push(name);
            continue;
        }
        if let Err(e) = set_field(&mut settings, &name, &raw) {
            notices.push(format!("dropped the saved {name} ({e}): {}", reset_note(&name, &settings)));
        }
    }
    if !unknown.is_empty() {
        notices.push(format!("ignored saved settings this version does not know: {}", unknown.join(", ")));
    }
    if let Err(e) = settings.config.validate("the saved settings") {
        let preset = preset_config(&settings.preset);
        notices
            .push(format!("the saved config was out of range ({e}): the {} preset's values are used", settings.preset));
        settings.config = preset;
    }
    (settings, notices)
}

/// The saved text of each of [`Settings`]' fields ([`FIELDS`]); `None` where it is absent.
#[derive(Deserialize)]
struct RawFields {
    #[serde(default, deserialize_with = "present")]
    preset: Option<Box<RawValue>>,
    #[serde(default, deserialize_with = "present")]
    config: Option<Box<RawValue>>,
    #[serde(default, deserialize_with = "present")]
    data_dir: Option<Box<RawValue>>,
    #[serde(default, deserialize_with = "present")]
    adapter: Option<Box<RawValue>>,
    #[serde(default, deserialize_with = "present")]
    cpu_backend: Option<Box<RawValue>>,
}

/// A field's text, whatever it holds (`None` included: RON writes an `Option` as `None` or
/// `Some(..)`, which the field's own type reads).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

/// Reads the field `name` from its text in `raw` into `settings` (an absent field keeps its
/// default).
fn set_field(settings: &mut Settings, name: &str, raw: &RawFields) -> Result<(), String> {
    fn read<T: serde::de::DeserializeOwned>(raw: &Option<Box<RawValue>>, into: &mut T) -> Result<(), String> {
        if let Some(r) = raw {
            *into = r.into_rust::<T>().map_err(|e| e.to_string())?;
        }
        Ok(())
    }
    match name {
        "preset" => read(&raw.preset, &mut settings.preset),
        "config" => read(&raw.config, &mut settings.config),
        "data_dir" => read(&raw.data_dir, &mut settings.data_dir),
        "adapter" => read(&raw.adapter, &mut settings.adapter),
        _ => read(&raw.cpu_backend, &mut settings.cpu_backend),
    }
}

/// What a dropped field falls back to, in words.
fn reset_note(name: &str, settings: &Settings) -> String {
    match name {
        "config" => {
            let preset = if settings.preset == "custom" { "quickstart" } else { settings.preset.as_str() };
            format!("the {preset} preset is used")
        }
        _ => "its default is used".into(),
    }
}

/// The config of a preset name (quickstart for "custom" or a name no longer shipped).
fn preset_config(name: &str) -> Config {
    crate::config::presets::load_config(name)
        .or_else(|_| crate::config::presets::load_config("quickstart"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the app saves (eframe writes `ron::to_string` of the settings) reads back whole and
    /// without a notice: enums (`flex`, `white`), `None` and `Some` fields included.
    #[test]
    fn the_settings_the_app_saves_read_back_unchanged() {
        let mut config = crate::config::presets::load_config("8gb").unwrap();
        config.data.alpha = crate::data::image_io::AlphaPolicy::Black;
        let cases = [
            Settings::default(),
            Settings { adapter: None, cpu_backend: CpuBackend::Ndarray, ..Settings::default() },
            Settings {
                preset: "8gb".into(),
                config,
                data_dir: Some("/srv/photos".into()),
                adapter: Some(1),
                ..Settings::default()
            },
        ];
        for settings in cases {
            let text = ron::to_string(&settings).unwrap();
            let (back, notices) = restore(Some(&text));
            assert!(notices.is_empty(), "{notices:?} for {text}");
            assert_eq!(
                (&back.preset, &back.config, &back.data_dir, back.adapter, back.cpu_backend),
                (&settings.preset, &settings.config, &settings.data_dir, settings.adapter, settings.cpu_backend),
                "{text}"
            );
        }
    }
}
