//! A run folder: the names of what it holds, its format version (`run.json`), and how its
//! config is read back by a later vramfit.
//!
//! ```text
//! runs/20261130-153012/
//!   .vramfit-run      marks a run folder, so no dataset scan reads it (data::dataset::RUN_MARKER)
//!   run.json          format and version of this folder (MANIFEST)
//!   config.toml       the run's config (CONFIG)
//!   data.txt          the data folder it trains on, for `--resume` (DATA_NOTE)
//!   data_files.json   its files and their split, applied again on resume (DATA_FILES)
//!   metrics.csv       one row per optimizer step (METRICS_CSV)
//!   epochs.csv        one row per epoch (EPOCHS_CSV)
//!   checkpoints/      the newest `train.keep_checkpoints` checkpoints (CHECKPOINTS)
//!   export/           weights for inference (EXPORT)
//!   .vramfit.lock     held while a process trains into it (LOCK)
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::{Config, one_line};
use crate::engine::error::{Error, Result};

/// The run's config.
pub const CONFIG: &str = "config.toml";
/// The data folder the run trains on (one line).
pub const DATA_NOTE: &str = "data.txt";
/// The dataset's files and their split ([`crate::data::split_record::SplitRecord`]).
pub const DATA_FILES: &str = "data_files.json";
/// Per-step metrics.
pub const METRICS_CSV: &str = "metrics.csv";
/// Per-epoch metrics.
pub const EPOCHS_CSV: &str = "epochs.csv";
/// Checkpoint folders.
pub const CHECKPOINTS: &str = "checkpoints";
/// Exported weights.
pub const EXPORT: &str = "export";
/// Held while a process trains into the folder.
pub const LOCK: &str = ".vramfit.lock";
/// The folder's format and version.
pub const MANIFEST: &str = "run.json";
/// The run-folder format this vramfit writes and reads. Version 1: the layout above, checkpoints
/// with `checksums.json`. Folders without a manifest were made before version 1 had one and use
/// the same layout.
pub const FORMAT_VERSION: u32 = 1;

/// Creates the run folder `out` (and its parents) marked as a run folder
/// ([`crate::data::dataset::RUN_MARKER`]), so no dataset scan takes it for data; refuses an
/// `out` that is the dataset folder `data` or holds it.
///
/// # Errors
/// [`Error::Dataset`] naming both folders when `data` is inside `out`; [`Error::Io`] naming
/// the folder when it cannot be created or marked.
pub fn create(out: &Path, data: &Path) -> Result<()> {
    let (out_abs, data_abs) = (absolute(out), absolute(data));
    if data_abs.starts_with(&out_abs) {
        return Err(Error::Dataset {
            path: data.to_path_buf(),
            message: format!(
                "the run folder {} is the dataset folder or holds it: its checkpoints and export would be \
                 scanned as classes; train into another --out (e.g. runs/ next to the dataset)",
                out.display()
            ),
        });
    }
    std::fs::create_dir_all(out).map_err(|e| Error::write(out, &e))?;
    // Created only if missing (two processes may start in one folder at once; the run lock
    // decides between them later): a marker needs no atomic write, any content marks.
    let marker = out.join(crate::data::dataset::RUN_MARKER);
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&marker) {
        Ok(mut file) => {
            use std::io::Write;
            let note = "a vramfit run folder: output, not data (dataset scans skip this folder)\n";
            file.write_all(note.as_bytes()).map_err(|e| Error::io(&marker, e))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(Error::write(&marker, &e)),
    }
}

/// `path` made absolute and resolved as far as it exists (a run folder may not exist yet).
pub fn absolute(path: &Path) -> std::path::PathBuf {
    if let Ok(p) = path.canonicalize() {
        return p;
    }
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) if !parent.as_os_str().is_empty() => absolute(parent).join(name),
        _ => std::env::current_dir().map_or_else(|_| path.to_path_buf(), |d| d.join(path)),
    }
}

/// `runs/<UTC date-time>` for a new run.
pub fn default_run_dir() -> std::path::PathBuf {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    std::path::PathBuf::from("runs").join(format!(
        "{y:04}-{m:02}-{d:02}_{:02}-{:02}-{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    ))
}

/// A new run folder in `parent`, named by the UTC date and time ([`default_run_dir`]), with
/// `-2`, `-3`, ... appended when a folder of that name exists (two runs in one second).
pub fn new_run_dir(parent: &Path) -> std::path::PathBuf {
    let name = default_run_dir().file_name().map(std::ffi::OsStr::to_os_string).unwrap_or_default();
    let mut path = parent.join(&name);
    let mut n = 2;
    while path.exists() {
        path = parent.join(format!("{}-{n}", name.to_string_lossy()));
        n += 1;
    }
    path
}

/// What `run.json` holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always "vramfit-run".
    pub format: String,
    /// The run-folder format version ([`FORMAT_VERSION`] when written by this vramfit).
    pub format_version: u32,
    /// The vramfit version that created the folder, e.g. "0.1.0".
    pub created_by: String,
}

/// Writes `run.json` into `run` unless it is there already (a resumed run keeps its own).
///
/// # Errors
/// [`Error::Io`] naming the file.
pub fn write_manifest(run: &Path) -> Result<()> {
    let path = run.join(MANIFEST);
    if path.exists() {
        return Ok(());
    }
    let manifest = Manifest {
        format: "vramfit-run".into(),
        format_version: FORMAT_VERSION,
        created_by: env!("CARGO_PKG_VERSION").into(),
    };
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| Error::io(&path, e))?;
    crate::atomic_file::write_atomic(&path, text.as_bytes())
}

/// Checks that this vramfit can read the run folder `run`. Returns a note for a folder made
/// before manifests existed (read as version 1).
///
/// # Errors
/// [`Error::Io`] naming `run.json` when it is unreadable, of another format, or of a newer
/// format version than this vramfit reads (the message names both versions and the fix).
pub fn check_manifest(run: &Path) -> Result<Option<String>> {
    let path = run.join(MANIFEST);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Some(format!(
                "{} has no {MANIFEST}: made before run folders had a format version; read as version {FORMAT_VERSION}",
                run.display()
            )));
        }
        Err(e) => return Err(Error::io(&path, format!("cannot read it ({e})"))),
    };
    let manifest: Manifest = serde_json::from_str(&text).map_err(|e| {
        Error::io(&path, format!("not a vramfit run manifest ({e}); restore it from a backup or delete it"))
    })?;
    if manifest.format != "vramfit-run" {
        return Err(Error::io(&path, format!("format {:?} is not a vramfit run folder", manifest.format)));
    }
    if manifest.format_version == 0 {
        return Err(Error::io(
            &path,
            "format version 0 does not exist (versions start at 1); restore run.json or delete it",
        ));
    }
    if manifest.format_version > FORMAT_VERSION {
        return Err(Error::io(
            &path,
            format!(
                "this run folder has format version {} (made by vramfit {}), newer than the version {FORMAT_VERSION} \
                 this vramfit {} reads; update vramfit to resume or export it",
                manifest.format_version,
                manifest.created_by,
                env!("CARGO_PKG_VERSION")
            ),
        ));
    }
    Ok(None)
}

/// Reads a run's `config.toml` leniently, so a run made by another vramfit version still
/// resumes and exports: keys this version added are filled with their defaults, keys it does
/// not know (renamed or removed since) are ignored; both are returned as notes to show.
/// Values are validated as for any config. Keys that shape the network or what it sees
/// ([`Config::FROZEN_ON_RESUME`]) are never defaulted: a default there would describe another
/// model than the checkpoint holds.
///
/// # Errors
/// [`Error::Config`] naming the file for unreadable TOML, a value out of range, or a missing
/// key of [`Config::FROZEN_ON_RESUME`]; [`check_manifest`]'s errors.
pub fn load_config(run: &Path) -> Result<(Config, Vec<String>)> {
    let mut notes: Vec<String> = check_manifest(run)?.into_iter().collect();
    let path = run.join(CONFIG);
    let source_name = path.display().to_string();
    let err = |message: String| Error::Config { source_name: source_name.clone(), message };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| err(format!("cannot read it ({e}); is {} a run folder (--out of a `train`)?", run.display())))?;
    let stored: toml::Table = toml::from_str(&text).map_err(|e| err(one_line(&e.to_string())))?;
    let mut merged = toml::Table::try_from(Config::default()).map_err(|e| err(e.to_string()))?;
    let (mut missing, mut unknown) = (Vec::new(), Vec::new());
    overlay(&mut merged, &stored, "", &mut missing, &mut unknown);
    let frozen: Vec<&String> = missing
        .iter()
        .filter(|m| {
            let key = m.split(" = ").next().unwrap_or(m);
            Config::FROZEN_ON_RESUME.iter().any(|f| key == *f || key.starts_with(&format!("{f}.")))
        })
        .collect();
    if !frozen.is_empty() {
        let keys: Vec<&str> = frozen.iter().map(|m| m.split(" = ").next().unwrap_or(m)).collect();
        return Err(err(format!(
            "lacks {}, which describe the trained network or its inputs and have no safe default; restore \
             them from a backup or from the export's model.json",
            keys.join(", ")
        )));
    }
    if !missing.is_empty() {
        notes.push(format!(
            "{source_name} lacks {} (added after this run was made): using the defaults",
            missing.join(", ")
        ));
    }
    if !unknown.is_empty() {
        notes.push(format!(
            "{source_name} has keys this vramfit does not know, ignored (renamed or removed since?): {}",
            unknown.join(", ")
        ));
    }
    let config: Config =
        toml::Value::Table(merged).try_into().map_err(|e: toml::de::Error| err(one_line(&e.to_string())))?;
    config.validate(&source_name)?;
    Ok((config, notes))
}

/// Keeps a copy of a run's `config.toml` as `config.previous.toml` when this version cannot
/// read it as is (keys it does not know, from another version), before the file is rewritten:
/// a resume never silently drops settings. Returns the copy's path when one was made.
///
/// # Errors
/// [`Error::Io`] naming the file when the copy cannot be written.
pub fn preserve_foreign_config(run: &Path) -> Result<Option<std::path::PathBuf>> {
    let path = run.join(CONFIG);
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(None) };
    if Config::from_toml(&text, CONFIG).is_ok() {
        return Ok(None);
    }
    let copy = run.join("config.previous.toml");
    crate::atomic_file::write_atomic(&copy, text.as_bytes())?;
    Ok(Some(copy))
}

/// Copies `stored`'s values over `base` (the defaults) where `base` has the key; records keys
/// only in `base` (`missing`, with their default) and only in `stored` (`unknown`), dotted.
fn overlay(
    base: &mut toml::Table,
    stored: &toml::Table,
    prefix: &str,
    missing: &mut Vec<String>,
    unknown: &mut Vec<String>,
) {
    let dotted = |k: &str| if prefix.is_empty() { k.to_string() } else { format!("{prefix}.{k}") };
    for (key, default) in base.iter_mut() {
        match (stored.get(key), default) {
            (None, d) => missing.push(format!("{} = {d}", dotted(key))),
            (Some(toml::Value::Table(s)), toml::Value::Table(b)) => overlay(b, s, &dotted(key), missing, unknown),
            (Some(v), d) => *d = v.clone(),
        }
    }
    unknown.extend(stored.keys().filter(|k| !base.contains_key(*k)).map(|k| dotted(k)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_run_dirs_are_dated_and_never_collide() {
        let dir = tempfile::tempdir().unwrap();
        let first = new_run_dir(dir.path());
        let name = first.file_name().unwrap().to_string_lossy().to_string();
        // 2026-11-30_15-42-07: date, underscore, time.
        assert_eq!(name.len(), 19, "{name}");
        assert_eq!((&name[4..5], &name[10..11], &name[13..14]), ("-", "_", "-"), "{name}");
        std::fs::create_dir_all(&first).unwrap();
        let second = new_run_dir(dir.path());
        assert_ne!(first, second);
        if second.file_name().unwrap().to_string_lossy().starts_with(&name) {
            assert!(second.to_string_lossy().ends_with("-2"), "{}", second.display());
        }
    }

    #[test]
    fn a_config_from_another_version_loads_with_defaults_and_notes() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = Config::default().to_toml();
        text = text.replace("keep_checkpoints = 2\n", "").replace("[train]\n", "[train]\nmax_grad_norm = 1.0\n");
        std::fs::write(dir.path().join(CONFIG), text).unwrap();
        write_manifest(dir.path()).unwrap();
        let (config, notes) = load_config(dir.path()).unwrap();
        assert_eq!(config, Config::default());
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].contains("lacks train.keep_checkpoints = 2"), "{notes:?}");
        assert!(notes[1].contains("train.max_grad_norm"), "{notes:?}");
    }

    #[test]
    fn a_missing_key_that_shapes_the_model_is_refused_not_defaulted() {
        let dir = tempfile::tempdir().unwrap();
        let text = Config::default().to_toml().replace("crop_size = 224\n", "");
        std::fs::write(dir.path().join(CONFIG), text).unwrap();
        let e = load_config(dir.path()).unwrap_err().to_string();
        assert!(e.contains("lacks data.preprocess.crop_size") && e.contains("no safe default"), "{e}");
        std::fs::write(dir.path().join(CONFIG), "").unwrap();
        let e = load_config(dir.path()).unwrap_err().to_string();
        assert!(e.contains("model") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn a_newer_format_is_refused_naming_both_versions_and_a_missing_manifest_is_noted() {
        let dir = tempfile::tempdir().unwrap();
        assert!(check_manifest(dir.path()).unwrap().unwrap().contains("no run.json"));
        let newer = Manifest { format: "vramfit-run".into(), format_version: 99, created_by: "9.0.0".into() };
        std::fs::write(dir.path().join(MANIFEST), serde_json::to_string(&newer).unwrap()).unwrap();
        let e = check_manifest(dir.path()).unwrap_err().to_string();
        assert!(e.contains("format version 99") && e.contains("vramfit 9.0.0") && e.contains("update vramfit"), "{e}");
        write_manifest(dir.path()).unwrap();
        assert!(check_manifest(dir.path()).is_err(), "an existing manifest is never overwritten");
    }
}
