//! Checkpoints: everything a stopped or crashed run needs to continue, written durably.
//!
//! A checkpoint is a folder `checkpoints/step-<N>/` holding `model.bpk`, `optimizer.bpk`,
//! `state.json` and, written last, `checksums.json` (size and CRC-32 of each of the three). The
//! file `checkpoints/latest.json` names the newest complete one. Every file is written to a
//! temporary name, synced, renamed, and its folder synced ([`write_atomic`]), so a crash or power
//! cut at any moment leaves complete checkpoints complete. The newest `train.keep_checkpoints`
//! (default 2) are kept. Reading ([`find_latest`]) verifies the checksums and falls back to the
//! newest intact checkpoint when the newest is damaged (emptied by a full disk, truncated),
//! naming the damaged file.

use std::path::{Path, PathBuf};

use burn::store::{BurnpackStore, ModuleSnapshot};
use serde::{Deserialize, Serialize};

use crate::atomic_file::{sync_dir, write_atomic};
use crate::engine::error::{Error, Result};
use crate::model::Classifier;
use crate::train::precision::LossScaler;

/// Where a run stands (`state.json` of each checkpoint). The fields a later version added have
/// defaults, so a checkpoint written before them still resumes and exports: no split (1), no
/// loss scaling (a resume in f16 starts a new scaler), no batch of the epoch done, no best
/// accuracy yet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Epoch in progress (0-based).
    pub epoch: usize,
    /// Loader batches of that epoch already trained on.
    #[serde(default)]
    pub batches_done_in_epoch: usize,
    /// Optimizer steps taken so far.
    pub global_step: usize,
    /// f16 loss-scale state.
    #[serde(default = "LossScaler::disabled")]
    pub scaler: LossScaler,
    /// How many pieces each loader batch is split into (grows when memory forces it).
    #[serde(default = "one")]
    pub split_factor: usize,
    /// Best validation accuracy so far, 0..1.
    #[serde(default)]
    pub best_val_accuracy: f32,
    /// Class names, label order.
    pub class_names: Vec<String>,
}

/// [`TrainState::split_factor`]'s default: batches not split.
fn one() -> usize {
    1
}

/// Deletes the `.NAME.tmp` files that an interrupted [`write_atomic`] left in a run folder, its
/// `checkpoints/` and `export/` and each checkpoint folder. Returns how many were removed.
pub fn remove_temporaries(run_dir: &Path) -> usize {
    let root = checkpoints_dir(run_dir);
    let mut dirs = vec![run_dir.to_path_buf(), run_dir.join(crate::train::run_dir::EXPORT), root.clone()];
    if let Ok(entries) = std::fs::read_dir(&root) {
        dirs.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    }
    let mut removed = 0;
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') && name.ends_with(".tmp") && std::fs::remove_file(e.path()).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

/// The model's weights as burnpack bytes.
///
/// # Errors
/// [`Error::Io`] if serialization fails.
pub fn model_bytes(model: &Classifier) -> Result<Vec<u8>> {
    let mut store = BurnpackStore::from_bytes(None);
    model.save_into(&mut store).map_err(|e| Error::io("model.bpk", e))?;
    let bytes = store.get_bytes().map_err(|e| Error::io("model.bpk", e))?;
    Ok(bytes.to_vec())
}

/// Loads burnpack bytes into `model` (all tensors must match).
///
/// # Errors
/// [`Error::Io`] naming `path` when the file does not fit the network.
pub fn load_model_bytes(model: &mut Classifier, bytes: Vec<u8>, path: &Path) -> Result<()> {
    let mut store = BurnpackStore::from_bytes(Some(burn::tensor::Bytes::from_bytes_vec(bytes)));
    let result = model.load_from(&mut store).map_err(|e| Error::io(path, format!("cannot load weights: {e}")))?;
    check_applied(&result, path)
}

/// Fails unless every tensor of the network was loaded without error.
///
/// # Errors
/// [`Error::Io`] naming `path` and the tensors that are missing or failed.
pub fn check_applied(result: &burn::store::ApplyResult, path: &Path) -> Result<()> {
    if !result.missing.is_empty() || !result.errors.is_empty() {
        let missing: Vec<&str> = result.missing.iter().map(|(name, _)| name.as_str()).take(5).collect();
        return Err(Error::io(
            path,
            format!(
                "weights do not fit this network (missing {missing:?}, {} errors); the file is for another model config",
                result.errors.len()
            ),
        ));
    }
    Ok(())
}

/// Checkpoint folder of a run.
pub fn checkpoints_dir(run_dir: &Path) -> PathBuf {
    run_dir.join(crate::train::run_dir::CHECKPOINTS)
}

/// Files of a checkpoint folder that `checksums.json` covers, in the order they are written:
/// what a resume needs.
pub const CHECKPOINT_FILES: [&str; 3] = ["model.bpk", "optimizer.bpk", "state.json"];

/// The files of a checkpoint that its weights need (export, evaluation): never the optimizer
/// state, so a damaged `optimizer.bpk` does not make intact weights unusable.
pub const WEIGHT_FILES: [&str; 2] = ["model.bpk", "state.json"];

/// Size and CRC-32 (IEEE, as zlib/PNG) of one checkpoint file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChecksum {
    /// Length in bytes.
    pub bytes: u64,
    /// CRC-32 of the contents.
    pub crc32: u32,
}

impl FileChecksum {
    /// The checksum of `data`.
    pub fn of(data: &[u8]) -> Self {
        Self { bytes: data.len() as u64, crc32: crc32fast::hash(data) }
    }
}

/// Writes a checkpoint durably, moves `latest.json` to it and deletes all but the newest `keep`
/// checkpoints (at least 1). Returns its folder.
///
/// # Errors
/// [`Error::Io`] naming the file that could not be written; the previous checkpoints stay valid.
pub fn save(
    run_dir: &Path,
    model: &Classifier,
    optimizer_bytes: &[u8],
    state: &TrainState,
    keep: usize,
) -> Result<PathBuf> {
    let root = checkpoints_dir(run_dir);
    let name = format!("step-{:08}", state.global_step);
    let dir = root.join(&name);
    std::fs::create_dir_all(&dir).map_err(|e| Error::write(&dir, &e))?;
    // A folder of the same step from an earlier, interrupted save must not look complete while
    // its files are replaced one by one.
    let checksums_path = dir.join("checksums.json");
    if checksums_path.exists() {
        std::fs::remove_file(&checksums_path).map_err(|e| Error::write(&checksums_path, &e))?;
    }
    let state_json = serde_json::to_vec_pretty(state).map_err(|e| Error::io(dir.join("state.json"), e))?;
    let files = [model_bytes(model)?, optimizer_bytes.to_vec(), state_json];
    let mut sums = std::collections::BTreeMap::new();
    for (file, bytes) in CHECKPOINT_FILES.iter().zip(&files) {
        write_atomic(&dir.join(file), bytes)?;
        sums.insert(file.to_string(), FileChecksum::of(bytes));
        if *file == "model.bpk" {
            crate::fault::in_save();
        }
    }
    let sums = serde_json::to_vec_pretty(&sums).map_err(|e| Error::io(&checksums_path, e))?;
    write_atomic(&checksums_path, &sums)?;
    sync_dir(&root)?;
    let pointer = serde_json::json!({ "checkpoint": name });
    write_atomic(&root.join("latest.json"), pointer.to_string().as_bytes())?;
    // Keep the newest `keep` intact checkpoints (this one included); damaged or incomplete ones
    // never count toward that, so a damaged newest one cannot push out the intact fallback.
    let mut kept = 1;
    for old in step_folders(&root).into_iter().filter(|n| *n != name) {
        if kept < keep.max(1) && verify(&root.join(&old), true, &CHECKPOINT_FILES).is_ok() {
            kept += 1;
        } else {
            let _ = std::fs::remove_dir_all(root.join(old));
        }
    }
    Ok(dir)
}

/// Names of the `step-*` folders under `root`, newest first.
fn step_folders(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.path().is_dir())
                .filter_map(|e| e.file_name().to_str().map(String::from))
                .filter(|n| is_step_name(n))
                .collect()
        })
        .unwrap_or_default();
    names.sort_unstable_by(|a, b| b.cmp(a)); // zero-padded step numbers: newest first
    names
}

/// Whether `name` is a checkpoint folder's name: `step-` and eight digits (other folders a user
/// puts under `checkpoints/` are left alone).
fn is_step_name(name: &str) -> bool {
    name.strip_prefix("step-").is_some_and(|d| d.len() == 8 && d.bytes().all(|b| b.is_ascii_digit()))
}

/// Checks `files` of a checkpoint folder ([`CHECKPOINT_FILES`] to resume, [`WEIGHT_FILES`] for
/// the weights alone) against its `checksums.json` and reads its state.
///
/// A folder without `checksums.json` (written by vramfit before checksums existed) is accepted
/// only when `legacy_ok`, i.e. when `latest.json` names it.
///
/// # Errors
/// [`Error::Checkpoint`] naming the damaged or missing file.
pub fn verify(dir: &Path, legacy_ok: bool, files: &[&str]) -> Result<TrainState> {
    let fault = |path: &Path, message: String| Error::Checkpoint { path: path.into(), message };
    let sums_path = dir.join("checksums.json");
    match std::fs::read(&sums_path) {
        Ok(text) => {
            let sums: std::collections::BTreeMap<String, FileChecksum> =
                serde_json::from_slice(&text).map_err(|e| fault(&sums_path, format!("is damaged ({e})")))?;
            for &file in files {
                let path = dir.join(file);
                let want = sums.get(file).ok_or_else(|| fault(&sums_path, format!("does not list {file}")))?;
                let data = std::fs::read(&path).map_err(|e| fault(&path, format!("cannot be read ({e})")))?;
                let got = FileChecksum::of(&data);
                if got != *want {
                    return Err(fault(
                        &path,
                        format!(
                            "is damaged ({} bytes, CRC-32 {:08x}; the checkpoint recorded {} bytes, {:08x})",
                            got.bytes, got.crc32, want.bytes, want.crc32
                        ),
                    ));
                }
            }
        }
        Err(_) if legacy_ok => {}
        Err(_) => return Err(fault(dir, "is incomplete (no checksums.json: its save was interrupted)".into())),
    }
    let state_path = dir.join("state.json");
    let bytes = std::fs::read(&state_path).map_err(|e| fault(&state_path, format!("cannot be read ({e})")))?;
    serde_json::from_slice(&bytes).map_err(|e| fault(&state_path, format!("is damaged ({e})")))
}

/// The checkpoint a run continues from.
#[derive(Clone, Debug)]
pub struct LatestCheckpoint {
    /// Its folder.
    pub dir: PathBuf,
    /// Its state.
    pub state: TrainState,
    /// Newer checkpoints (or a `latest.json`) that were passed over, each with the damaged file.
    pub damaged: Vec<String>,
}

/// The newest intact checkpoint of a run, for a resume (every file of [`CHECKPOINT_FILES`]):
/// the one `latest.json` names if it verifies, else the newest `step-*` folder that does
/// ([`verify`]); what was passed over is listed in `damaged`.
///
/// # Errors
/// [`Error::Io`] when the run has no checkpoint, or none is intact (naming each damaged file).
pub fn find_latest(run_dir: &Path) -> Result<LatestCheckpoint> {
    find_latest_with(run_dir, &CHECKPOINT_FILES)
}

/// The newest checkpoint whose weights are intact ([`WEIGHT_FILES`]), for export and
/// evaluation: a checkpoint whose optimizer state alone is damaged still counts.
///
/// # Errors
/// As [`find_latest`].
pub fn find_latest_weights(run_dir: &Path) -> Result<LatestCheckpoint> {
    find_latest_with(run_dir, &WEIGHT_FILES)
}

/// [`find_latest`] checking only `files` of each checkpoint.
///
/// # Errors
/// As [`find_latest`].
fn find_latest_with(run_dir: &Path, files: &[&str]) -> Result<LatestCheckpoint> {
    let root = checkpoints_dir(run_dir);
    let pointer_path = root.join("latest.json");
    let mut damaged = Vec::new();
    let pointed = match std::fs::read(&pointer_path) {
        Ok(text) => match serde_json::from_slice::<serde_json::Value>(&text) {
            Ok(v) if v["checkpoint"].as_str().is_some_and(is_step_name) => v["checkpoint"].as_str().map(String::from),
            _ => {
                damaged.push(format!(
                    "{} is damaged ({} bytes, no checkpoint name)",
                    pointer_path.display(),
                    text.len()
                ));
                None
            }
        },
        Err(_) => None,
    };
    // Checkpoints without checksums are accepted only from runs that predate checksums.
    let legacy_run = !step_folders(&root).iter().any(|n| root.join(n).join("checksums.json").exists());
    let mut candidates: Vec<(String, bool)> = pointed.iter().map(|n| (n.clone(), legacy_run)).collect();
    candidates.extend(step_folders(&root).into_iter().filter(|n| Some(n) != pointed.as_ref()).map(|n| (n, false)));
    for (name, legacy_ok) in candidates {
        let dir = root.join(&name);
        match verify(&dir, legacy_ok, files) {
            Ok(state) => return Ok(LatestCheckpoint { dir, state, damaged }),
            Err(reason) => damaged.push(reason.to_string()),
        }
    }
    let message = if damaged.is_empty() {
        "no checkpoint to resume; train without --resume first".to_string()
    } else {
        format!("no intact checkpoint: {}", damaged.join("; "))
    };
    Err(Error::io(&root, message))
}

/// Whether a run folder has a checkpoint that was completely written (intact or damaged since):
/// a `latest.json` or a `step-*` folder with its `checksums.json`. A folder whose first save was
/// interrupted has none, and its run starts over on resume.
pub fn any_checkpoint(run_dir: &Path) -> bool {
    let root = checkpoints_dir(run_dir);
    root.join("latest.json").exists()
        || step_folders(&root).iter().any(|n| root.join(n).join("checksums.json").exists())
}

/// The newest intact checkpoint of a run: (folder, state). See [`find_latest`].
///
/// # Errors
/// As [`find_latest`].
pub fn latest(run_dir: &Path) -> Result<(PathBuf, TrainState)> {
    find_latest(run_dir).map(|l| (l.dir, l.state))
}

/// What a folder holds if it already holds a run (a `config.toml`, checkpoints or metrics): its
/// classes, step and newest checkpoint, in words. `None` for a new or empty folder.
///
/// Training into a folder that holds a run without resuming would replace its checkpoints and
/// export and mix both runs in its CSV files, so the engine refuses it ([`crate::train::train`]).
pub fn describe_run(run_dir: &Path) -> Option<String> {
    use crate::train::run_dir::{CHECKPOINTS, CONFIG, EPOCHS_CSV, EXPORT, MANIFEST, METRICS_CSV};
    let markers = [MANIFEST, CONFIG, CHECKPOINTS, METRICS_CSV, EPOCHS_CSV, EXPORT];
    if !markers.iter().any(|m| run_dir.join(m).exists()) {
        return None;
    }
    Some(match find_latest(run_dir) {
        Ok(l) => format!(
            "{}, {}, {} done, newest checkpoint {}",
            crate::data::dataset::class_list(&l.state.class_names),
            crate::engine::words::count(l.state.global_step, "step"),
            crate::engine::words::count(l.state.epoch, "epoch"),
            l.dir.display()
        ),
        Err(_) => "a run's files (config.toml, metrics or export) but no intact checkpoint".to_string(),
    })
}

/// An exclusive claim on a run folder while a process trains in it: an OS lock (`flock` on
/// Unix, `LockFileEx` on Windows) on `.vramfit.lock`, which the kernel releases when the process
/// ends, however it ends: a lock can never be left behind by a killed process, and of two
/// processes that claim a folder at once exactly one gets it. The file's text (process id, host,
/// start time, UTC) only names the holder in the refusal; it is emptied on release and the file
/// is kept (deleting it would let a third process lock a new file while a second still waits on
/// the old one).
#[derive(Debug)]
pub struct RunLock {
    file: std::fs::File,
}

impl RunLock {
    /// Claims `run_dir` (which must exist).
    ///
    /// # Errors
    /// [`Error::Io`] naming the folder and the process that holds it, or the lock file's error.
    pub fn acquire(run_dir: &Path) -> Result<RunLock> {
        use std::io::Write;
        let path = run_dir.join(crate::train::run_dir::LOCK);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Error::write(&path, &e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                let holder = holder.trim();
                let holder =
                    if holder.is_empty() { "a process that is starting".to_string() } else { holder.to_string() };
                return Err(Error::io(
                    run_dir,
                    format!(
                        "another vramfit ({holder}) is training in this folder; wait for it, stop it, or train \
                         into another --out"
                    ),
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&path, e)),
        }
        let since = crate::train::run_dir::default_run_dir().file_name().map(|n| n.to_string_lossy().into_owned());
        let note = format!("process {} on {} since {} UTC", std::process::id(), host_name(), since.unwrap_or_default());
        let mut lock = RunLock { file };
        lock.file
            .set_len(0)
            .and_then(|()| lock.file.write_all(note.as_bytes()))
            .map_err(|e| Error::write(&path, &e))?;
        Ok(lock)
    }
}

impl Drop for RunLock {
    /// Empties the holder's note; the kernel releases the lock when the file closes.
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
    }
}

/// This machine's name, for the lock's note (Linux: the kernel's host name; elsewhere the
/// environment's).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map_or_else(|| "this machine".to_string(), |h| h.trim().to_string())
}

/// Refuses a folder that already holds a run ([`describe_run`]), for commands that would start a
/// new run in it.
///
/// # Errors
/// [`Error::Io`] naming the folder, what it holds and the two ways on.
pub fn refuse_existing_run(run_dir: &Path) -> Result<()> {
    match describe_run(run_dir) {
        None => Ok(()),
        Some(held) => Err(Error::io(
            run_dir,
            format!(
                "this folder already holds a run ({held}); nothing was changed. Continue it with \
                 `vramfit train --resume --out {}` (the app: Resume), or train into another folder (--out)",
                run_dir.display()
            ),
        )),
    }
}

/// The network of a run's newest checkpoint on `device`, with the run's configuration (its
/// `config.toml`) and state (epoch, step, class names).
///
/// # Errors
/// [`Error::Config`] / [`Error::Io`] naming the file when the run has no config or checkpoint or
/// the weights do not fit the configuration.
pub fn load_latest_model(
    run_dir: &Path,
    device: &burn::tensor::Device,
) -> Result<(Classifier, crate::config::Config, TrainState)> {
    let (config, _notes) = crate::train::run_dir::load_config(run_dir)?;
    // The weights alone: a damaged optimizer state does not matter here.
    let LatestCheckpoint { dir, state, .. } = find_latest_weights(run_dir)?;
    let mut model = Classifier::new(&config.model, state.class_names.len(), device);
    let path = dir.join("model.bpk");
    let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
    load_model_bytes(&mut model, bytes, &path)?;
    Ok((model, config, state))
}
