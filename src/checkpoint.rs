//! Checkpoints: everything a stopped or crashed run needs to continue, written atomically.
//!
//! A checkpoint is a folder `checkpoints/step-<N>/` holding `model.bpk`, `optimizer.bpk` and
//! `state.json`; the file `checkpoints/latest.json` names the newest complete one and is replaced
//! by rename after the folder is fully written, so a crash at any moment leaves the previous
//! checkpoint in force. Older folders are removed after the pointer moves.

use std::path::{Path, PathBuf};

use burn::store::{BurnpackStore, ModuleSnapshot};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::Classifier;
use crate::precision::LossScaler;

/// Where a run stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Epoch in progress (0-based).
    pub epoch: usize,
    /// Loader batches of that epoch already trained on.
    pub batches_done_in_epoch: usize,
    /// Optimizer steps taken so far.
    pub global_step: usize,
    /// f16 loss-scale state.
    pub scaler: LossScaler,
    /// How many pieces each loader batch is split into (grows when memory forces it).
    pub split_factor: usize,
    /// Best validation accuracy so far, 0..1.
    pub best_val_accuracy: f32,
    /// Class names, label order.
    pub class_names: Vec<String>,
}

/// Writes `bytes` to `path` atomically: a temporary file in the same folder, then rename.
///
/// # Errors
/// [`Error::Io`] naming the path.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let tmp = dir.join(format!(".{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("file")));
    std::fs::write(&tmp, bytes).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
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
    run_dir.join("checkpoints")
}

/// Writes a checkpoint and moves `latest.json` to it. Returns its folder.
///
/// # Errors
/// [`Error::Io`] naming the file that could not be written; the previous checkpoint stays valid.
pub fn save(run_dir: &Path, model: &Classifier, optimizer_bytes: &[u8], state: &TrainState) -> Result<PathBuf> {
    let root = checkpoints_dir(run_dir);
    let name = format!("step-{:08}", state.global_step);
    let dir = root.join(&name);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    write_atomic(&dir.join("model.bpk"), &model_bytes(model)?)?;
    write_atomic(&dir.join("optimizer.bpk"), optimizer_bytes)?;
    let json = serde_json::to_vec_pretty(state).map_err(|e| Error::io(dir.join("state.json"), e))?;
    write_atomic(&dir.join("state.json"), &json)?;
    let pointer = serde_json::json!({ "checkpoint": name });
    write_atomic(&root.join("latest.json"), pointer.to_string().as_bytes())?;
    if let Ok(entries) = std::fs::read_dir(&root) {
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().to_string();
            if n.starts_with("step-") && n != name {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    Ok(dir)
}

/// The newest complete checkpoint of a run: (folder, state).
///
/// # Errors
/// [`Error::Io`] when the run has no checkpoint or it is unreadable.
pub fn latest(run_dir: &Path) -> Result<(PathBuf, TrainState)> {
    let root = checkpoints_dir(run_dir);
    let pointer_path = root.join("latest.json");
    let text = std::fs::read_to_string(&pointer_path).map_err(|e| {
        Error::io(&pointer_path, format!("no checkpoint to resume ({e}); train without --resume first"))
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::io(&pointer_path, e))?;
    let name = v["checkpoint"].as_str().ok_or_else(|| Error::io(&pointer_path, "no `checkpoint` field"))?;
    let dir = root.join(name);
    let state_path = dir.join("state.json");
    let state: TrainState = serde_json::from_slice(&std::fs::read(&state_path).map_err(|e| Error::io(&state_path, e))?)
        .map_err(|e| Error::io(&state_path, e))?;
    Ok((dir, state))
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
    let config = crate::config::Config::load(&run_dir.join("config.toml"))?;
    let (dir, state) = latest(run_dir)?;
    let mut model = Classifier::new(&config.model, state.class_names.len(), device);
    let path = dir.join("model.bpk");
    let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
    load_model_bytes(&mut model, bytes, &path)?;
    Ok((model, config, state))
}
