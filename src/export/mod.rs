//! Export: the trained weights as burnpack (`model.bpk`), as safetensors with PyTorch-style
//! parameter names (`model.safetensors`: GroupNorm `weight`/`bias`, linear weights `[out, in]`)
//! and as an ONNX graph (`model.onnx`, [`crate::export::onnx`]), plus `model.json` with everything needed
//! to use them (classes, preprocessing, model config). All files are written atomically. Loading
//! either weights file gives identical logits; ONNX Runtime on `model.onnx` gives the same
//! probabilities within 1e-4 (tested in CI).

pub mod metadata;
pub mod onnx;

use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::store::{BurnToPyTorchAdapter, ModuleSnapshot, PyTorchToBurnAdapter, SafetensorsStore};
use burn::tensor::{Device, Tensor, TensorData, Transaction};

use crate::atomic_file::write_atomic;
use crate::config::Config;
use crate::engine::error::{Error, Result};
use crate::export::onnx::OnnxInput;
use crate::model::Classifier;
use crate::train::checkpoint;

pub use crate::export::metadata::{METADATA_VERSION, ModelMetadata, TrainingInfo};

/// Which weight files an export writes; `model.json` is always written beside them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExportFormat {
    /// `model.bpk`, `model.safetensors` and `model.onnx` (the default).
    #[default]
    All,
    /// `model.bpk` only (what vramfit loads fastest).
    Bpk,
    /// `model.safetensors` only (PyTorch parameter names).
    Safetensors,
    /// `model.onnx` only.
    Onnx,
}

impl std::str::FromStr for ExportFormat {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "all" => Ok(Self::All),
            "bpk" => Ok(Self::Bpk),
            "safetensors" => Ok(Self::Safetensors),
            "onnx" => Ok(Self::Onnx),
            _ => Err(format!("unknown export format {s:?}; use all, bpk, safetensors or onnx")),
        }
    }
}

/// What to export and how.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportOptions {
    /// Which weight files.
    pub format: ExportFormat,
    /// The input the ONNX graph takes (normalized f32 NCHW by default, or u8 NHWC pixels).
    pub onnx_input: OnnxInput,
}

impl ExportOptions {
    fn writes(&self, format: ExportFormat) -> bool {
        self.format == ExportFormat::All || self.format == format
    }
}

/// Writes `model.bpk`, `model.safetensors`, `model.onnx` and `model.json` into `dir` (all
/// formats, f32 NCHW ONNX input). Returns the paths.
///
/// # Errors
/// [`Error::Io`] naming the file that could not be written.
pub fn export(
    model: &Classifier,
    config: &Config,
    classes: &[String],
    training: &TrainingInfo,
    dir: &Path,
) -> Result<Vec<PathBuf>> {
    export_with(model, config, classes, training, dir, &ExportOptions::default())
}

/// Writes the weight files `options` asks for and `model.json` into `dir` ([`export_files`]).
/// Returns the paths.
///
/// # Errors
/// [`Error::Io`] naming the file that could not be written; [`Error::Device`] when a weight
/// cannot be read back from the device.
pub fn export_with(
    model: &Classifier,
    config: &Config,
    classes: &[String],
    training: &TrainingInfo,
    dir: &Path,
    options: &ExportOptions,
) -> Result<Vec<PathBuf>> {
    let files = export_files(model, config, classes, training, options).map_err(|e| match e {
        Error::Io { path, message } => Error::Io { path: dir.join(path), message },
        other => other,
    })?;
    write_files(dir, files)
}

/// Writes an export's `files` (`(file name, bytes)`, from [`export_files`] or
/// [`model_files_async`]) into `dir`, each atomically, and removes weight files of an earlier
/// export there that this one does not have (they would disagree with the new `model.json`).
/// Returns the paths written.
///
/// # Errors
/// [`Error::Io`] naming the folder or file that could not be made, written or removed.
pub fn write_files(dir: &Path, files: Vec<(&'static str, Vec<u8>)>) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut written = Vec::new();
    for (name, bytes) in files {
        let path = dir.join(name);
        write_atomic(&path, &bytes)?;
        written.push(path);
    }
    for stale in WEIGHT_FILES.map(|f| dir.join(f)) {
        if !written.contains(&stale) && stale.exists() {
            std::fs::remove_file(&stale).map_err(|e| Error::io(&stale, e))?;
        }
    }
    Ok(written)
}

/// The weight files an export can hold.
const WEIGHT_FILES: [&str; 3] = ["model.bpk", "model.safetensors", "model.onnx"];

/// The files of an export, `(file name, bytes)`: the weight files `options` asks for, then
/// `model.json` ([`model_files`] with the metadata of `config` and `classes`). What
/// [`export_with`] writes into a folder. The weights are read from `model`'s device
/// synchronously: in a browser, use [`model_files_async`].
///
/// # Errors
/// As [`model_files`].
pub fn export_files(
    model: &Classifier,
    config: &Config,
    classes: &[String],
    training: &TrainingInfo,
    options: &ExportOptions,
) -> Result<Vec<(&'static str, Vec<u8>)>> {
    let meta = ModelMetadata::new(config, classes, model.num_params(), training.clone());
    model_files(model, &meta, options)
}

/// The files of an export of `model` described by `meta`, `(file name, bytes)`: the weight
/// files `options` asks for, then `model.json` (`meta`). The weights are read from `model`'s
/// device synchronously.
///
/// # Errors
/// [`Error::Io`] naming the file (by its bare name) whose bytes could not be made;
/// [`Error::Device`] when a weight cannot be read back from the device.
pub fn model_files(
    model: &Classifier,
    meta: &ModelMetadata,
    options: &ExportOptions,
) -> Result<Vec<(&'static str, Vec<u8>)>> {
    let mut files = Vec::new();
    if options.writes(ExportFormat::Bpk) {
        files.push(("model.bpk", checkpoint::model_bytes(model)?));
    }
    if options.writes(ExportFormat::Safetensors) {
        let st = Path::new("model.safetensors");
        let classes = serde_json::to_string(&meta.class_names).unwrap_or_default();
        let mut store = SafetensorsStore::from_bytes(None)
            .with_to_adapter(BurnToPyTorchAdapter)
            .metadata("format", "pt")
            .metadata("vramfit_classes", classes);
        model.save_into(&mut store).map_err(|e| Error::io(st, e))?;
        files.push(("model.safetensors", store.get_bytes().map_err(|e| Error::io(st, e))?));
    }
    if options.writes(ExportFormat::Onnx) {
        files.push(("model.onnx", crate::export::onnx::to_onnx_bytes(model, meta, options.onnx_input)?));
    }
    let json = serde_json::to_vec_pretty(meta).map_err(|e| Error::io("model.json", e))?;
    files.push(("model.json", json));
    Ok(files)
}

/// [`model_files`] of a model on any device, a browser's included: the weights are read back
/// in one awaited transfer into a copy on the CPU ([`host_copy_async`]), which is then
/// serialized. What the app's export of a model trained in memory writes (natively into a
/// folder, in a page as downloads).
///
/// # Errors
/// As [`host_copy_async`] and [`model_files`].
pub async fn model_files_async(
    model: &Classifier,
    meta: &ModelMetadata,
    options: &ExportOptions,
) -> Result<Vec<(&'static str, Vec<u8>)>> {
    let host = host_copy_async(model, &Device::flex()).await?;
    model_files(&host, meta, options)
}

/// A copy of `model` on `host` (a CPU device: [`Device::flex`]), its weights read back from the
/// model's device in one asynchronous transfer. Exporting reads every weight synchronously,
/// which panics in a browser; the page exports this copy instead. The copy computes what the
/// model does (same parameters, same ids). The classifier's parameters are all float tensors
/// (convolutions, GroupNorm, the linear head; no running statistics), kept in f32 (the
/// training's master weights), which is the dtype the host creates them in.
///
/// # Errors
/// [`Error::Device`] when the weights cannot be read back, or their count does not match the
/// model's parameters.
pub async fn host_copy_async(model: &Classifier, host: &Device) -> Result<Classifier> {
    /// Registers every float parameter, in the module's visiting order, for one transfer.
    struct Register(Option<Transaction>);
    impl ModuleVisitor for Register {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0 = self.0.take().map(|t| t.register(param.val()));
        }
    }
    /// Replaces every float parameter, in the same order, with its data on the host; notes a
    /// parameter left without data.
    struct Replace<'a> {
        data: std::vec::IntoIter<TensorData>,
        host: &'a Device,
        missing: bool,
    }
    impl ModuleMapper for Replace<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            match self.data.next() {
                Some(data) => param.map(|_| Tensor::from_data(data, self.host)),
                None => {
                    self.missing = true;
                    param
                }
            }
        }
    }
    let mut register = Register(Some(Transaction::default()));
    model.visit(&mut register);
    let transaction = register.0.expect("the visitor keeps its transaction");
    let data = transaction
        .execute_async()
        .await
        .map_err(|e| Error::Device(format!("reading the weights back from the device: {e:?}")))?;
    let read = data.len();
    let mut replace = Replace { data: data.into_iter(), host, missing: false };
    let copy = model.clone().map(&mut replace);
    if replace.missing || replace.data.next().is_some() {
        return Err(Error::Device(format!(
            "read {read} weight tensors back, which do not match the model's parameters"
        )));
    }
    Ok(copy)
}

/// Exports a run's latest checkpoint (its `config.toml` and `checkpoints/`) into `out`, every
/// format (what the app's Export and the end of training write).
///
/// # Errors
/// As [`export_run_with`].
pub fn export_run(run: &Path, out: &Path) -> Result<Vec<PathBuf>> {
    export_run_with(run, out, &ExportOptions::default())
}

/// Exports a run's latest checkpoint into `out` as `options` asks.
///
/// # Errors
/// [`Error::Config`] / [`Error::Io`] naming the file when the run has no config or checkpoint,
/// or the files cannot be written.
pub fn export_run_with(run: &Path, out: &Path, options: &ExportOptions) -> Result<Vec<PathBuf>> {
    let (model, config, state) = checkpoint::load_latest_model(run, &Device::flex())?;
    let info = TrainingInfo {
        epochs: state.epoch,
        steps: state.global_step,
        val_accuracy: (state.epoch > 0).then_some(state.best_val_accuracy), // no epoch: never validated
        // The checkpoint does not record the device; the run's own export (written at the end of
        // training) does.
        device: std::fs::read(run.join("export/model.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<ModelMetadata>(&b).ok())
            .map(|m| m.training.device)
            .unwrap_or_default(),
    };
    export_with(&model, &config, &state.class_names, &info, out, options)
}

/// Weights and metadata loaded back.
#[derive(Debug)]
pub struct LoadedModel {
    /// The network.
    pub model: Classifier,
    /// Its metadata.
    pub metadata: ModelMetadata,
    /// The weights file read.
    pub weights_path: PathBuf,
}

/// Resolves a user-given model path: an export folder, a run folder (its `export/`), or a
/// `.bpk` / `.safetensors` file. Returns `(weights file, metadata file)`.
///
/// # Errors
/// [`Error::Io`] when no weights or no `model.json` can be found, naming what was looked for.
pub fn resolve_paths(path: &Path) -> Result<(PathBuf, PathBuf)> {
    let dir_weights = |d: &Path| {
        let bpk = d.join("model.bpk");
        bpk.is_file().then_some(bpk)
    };
    let weights = if path.is_dir() {
        dir_weights(path).or_else(|| dir_weights(&path.join("export"))).ok_or_else(|| {
            Error::io(
                path,
                "no model.bpk here or in export/; pass a run folder, an export folder or a .bpk/.safetensors file \
                 (a run stopped before its end has only checkpoints: `vramfit export --run RUN` writes RUN/export)",
            )
        })?
    } else if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("onnx")) {
        return Err(Error::io(
            path,
            "vramfit loads model.bpk or model.safetensors (with model.json); model.onnx is for ONNX Runtime and \
             other tools: pass the export folder instead",
        ));
    } else if path.is_file() {
        path.to_path_buf()
    } else {
        return Err(Error::io(path, "no such file or folder; pass the export folder of a run (runs/<name>/export)"));
    };
    let dir = weights.parent().unwrap_or(Path::new("."));
    let stem_json = weights.with_extension("json");
    let meta = if stem_json.is_file() { stem_json } else { dir.join("model.json") };
    if !meta.is_file() {
        return Err(Error::io(
            &meta,
            "metadata not found: model.json must sit beside the weights (it holds classes and preprocessing)",
        ));
    }
    Ok((weights, meta))
}

/// Reads the `model.json` of exported weights (an export folder, a run folder or a weights
/// file, as [`resolve_paths`]) without loading the weights.
///
/// # Errors
/// [`Error::Io`] when it cannot be found, read or parsed.
pub fn load_metadata(path: &Path) -> Result<ModelMetadata> {
    let (_, meta_path) = resolve_paths(path)?;
    let meta_bytes = std::fs::read(&meta_path).map_err(|e| Error::io(&meta_path, e))?;
    serde_json::from_slice(&meta_bytes).map_err(|e| Error::io(&meta_path, format!("invalid metadata: {e}")))
}

/// Loads exported weights onto `device`.
///
/// # Errors
/// [`Error::Io`] for missing files, bad metadata, or weights that do not fit the metadata's model.
pub fn load(path: &Path, device: &Device) -> Result<LoadedModel> {
    let (weights_path, _) = resolve_paths(path)?;
    let metadata = load_metadata(path)?;
    let mut model = Classifier::new(&metadata.model, metadata.class_names.len(), device);
    let bytes = std::fs::read(&weights_path).map_err(|e| Error::io(&weights_path, e))?;
    let is_safetensors = weights_path.extension().is_some_and(|e| e.eq_ignore_ascii_case("safetensors"));
    if is_safetensors {
        let mut store = SafetensorsStore::from_bytes(Some(bytes)).with_from_adapter(PyTorchToBurnAdapter);
        let result =
            model.load_from(&mut store).map_err(|e| Error::io(&weights_path, format!("cannot load weights: {e}")))?;
        checkpoint::check_applied(&result, &weights_path)?;
    } else {
        checkpoint::load_model_bytes(&mut model, bytes, &weights_path)?;
    }
    Ok(LoadedModel { model, metadata, weights_path })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Precision;
    use crate::device::{DeviceChoice, select};
    use burn::tensor::Distribution;

    /// The host copy of a model on the adapter (lavapipe in CI; the CPU without one) computes
    /// the same logits on the CPU, and its export is byte for byte the original's.
    #[test]
    fn a_host_copy_computes_and_exports_what_the_model_does() {
        let config = crate::config::presets::load_config("quickstart").expect("the bundled preset parses");
        let selected = select(DeviceChoice::Gpu(None)).expect("a device");
        // Without an adapter the copy goes CPU to CPU; CI (VRAMFIT_REQUIRE_GPU) has lavapipe.
        assert!(selected.is_gpu() || std::env::var_os("VRAMFIT_REQUIRE_GPU").is_none(), "no wgpu adapter");
        let source = selected.device;
        let host = Device::flex();
        let model = Classifier::new(&config.model, 10, &source);
        let copy = pollster::block_on(host_copy_async(&model, &host)).expect("the weights read back");
        assert_eq!(copy.num_params(), model.num_params());
        let px = config.image_size_px();
        let images = Tensor::<4>::random([2, 3, px, px], Distribution::Normal(0.0, 1.0), &host);
        let on_host = copy.forward(images.clone(), Precision::F32).into_data().try_to_vec::<f32>().expect("f32 logits");
        let on_source = model
            .forward(images.to_device(&source), Precision::F32)
            .into_data()
            .try_to_vec::<f32>()
            .expect("f32 logits");
        assert_eq!(on_host.len(), 20);
        for (a, b) in on_host.iter().zip(&on_source) {
            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "host {a} vs device {b}");
        }
        let classes: Vec<String> = (0..10).map(|i| format!("class {i}")).collect();
        let files = |m: &Classifier| export_files(m, &config, &classes, &TrainingInfo::default(), &Default::default());
        let (original, copied) = (files(&model).expect("export"), files(&copy).expect("export of the copy"));
        let names: Vec<&str> = copied.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["model.bpk", "model.safetensors", "model.onnx", "model.json"]);
        for ((name, a), (_, b)) in original.iter().zip(&copied) {
            if *name == "model.safetensors" {
                // Its JSON header holds the metadata map in no fixed order: compare it parsed.
                assert_eq!(safetensors_parts(a), safetensors_parts(b), "{name}");
            } else {
                assert!(a == b, "{name} differs between the model and its host copy");
            }
        }
    }

    /// A safetensors file as (parsed JSON header, tensor bytes): an 8-byte little-endian header
    /// length, the header, then the data.
    fn safetensors_parts(bytes: &[u8]) -> (serde_json::Value, &[u8]) {
        let len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
        let header = serde_json::from_slice(&bytes[8..8 + len]).expect("a JSON header");
        (header, &bytes[8 + len..])
    }
}
