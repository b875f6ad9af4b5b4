//! Run configuration: the TOML presets in `configs/` and the overrides given on the command line.
//!
//! Every knob a preset sets lives here, grouped as the file is: `[model]`, `[data]`,
//! `[augment]`, `[train]`, `[optimizer]`, `[memory]`. Unknown keys are errors (a typo must not
//! silently fall back to a default) and every value is range-checked by [`Config::validate`].

pub mod byte_size;
pub mod class_balance;
pub mod presets;
pub mod tiers;
pub mod user_text;

use serde::{Deserialize, Serialize};
use std::path::Path;

use crate::data::preprocess::PreprocessConfig;
use crate::engine::error::{Error, Result};

mod resume;
mod validate;

pub use class_balance::{ClassWeights, Sampler};

/// A complete run configuration (one `configs/*.toml` file).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Preset name shown in logs and the app ("quickstart", "8gb", or "custom").
    #[serde(default = "default_name")]
    pub name: String,
    /// Seed for weight init, shuffling, the validation split and augmentation.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Network shape.
    #[serde(default)]
    pub model: ModelConfig,
    /// Image loading and preprocessing.
    #[serde(default)]
    pub data: DataConfig,
    /// Training-time augmentation switches.
    #[serde(default)]
    pub augment: AugmentConfig,
    /// Loop settings: batch, accumulation, precision, checkpointing, loss.
    #[serde(default)]
    pub train: TrainConfig,
    /// AdamW and its learning-rate schedule.
    #[serde(default)]
    pub optimizer: OptimizerConfig,
    /// The device-memory budget the run must hold.
    #[serde(default)]
    pub memory: MemoryConfig,
}

fn default_name() -> String {
    "custom".into()
}
fn default_seed() -> u64 {
    42
}

/// Activation function used after every normalization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// Gaussian error linear unit (tanh-free exact form).
    Gelu,
    /// Rectified linear unit.
    Relu,
}

/// One stage of depthwise-separable blocks: `blocks` blocks, the first with `stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageConfig {
    /// Output channels at width 1.0.
    pub channels: usize,
    /// Stride of the first block's depthwise convolution (1 or 2).
    pub stride: usize,
    /// Number of blocks in the stage (at least 1).
    pub blocks: usize,
}

/// Network shape. The network is built by [`crate::model::Classifier`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Width multiplier applied to every channel count (rounded to a multiple of `norm_groups`).
    pub width: f64,
    /// Stem output channels at width 1.0 (the stem is a 3x3 stride-2 convolution).
    pub stem_channels: usize,
    /// The stages after the stem, in order.
    pub stages: Vec<StageConfig>,
    /// GroupNorm groups (channels per group = channels / norm_groups).
    pub norm_groups: usize,
    /// Activation after each normalization.
    pub activation: Activation,
    /// Standard deviation of the head's normal init (small, so the first logits are near zero).
    pub head_init_std: f64,
}

impl Default for ModelConfig {
    /// The full-size network: about 3M parameters for 1000 classes at width 1.0.
    fn default() -> Self {
        let s = |channels, stride, blocks| StageConfig { channels, stride, blocks };
        Self {
            width: 1.0,
            stem_channels: 32,
            stages: vec![s(48, 1, 1), s(96, 2, 2), s(192, 2, 2), s(384, 2, 4), s(1024, 2, 2)],
            norm_groups: 8,
            activation: Activation::Gelu,
            head_init_std: 0.01,
        }
    }
}

/// How pixels become the model's input.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// Geometry: mode, load_size, crop_size (pixels).
    pub preprocess: PreprocessConfig,
    /// Fraction of a folder dataset without `val/` held out for validation, 0 to 0.5.
    pub val_fraction: f64,
    /// Per-channel mean subtracted after scaling pixels to 0..1 (RGB order).
    #[serde(serialize_with = "f32_array_shortest")]
    pub mean: [f32; 3],
    /// Per-channel standard deviation divided by after the mean (RGB order).
    #[serde(serialize_with = "f32_array_shortest")]
    pub std: [f32; 3],
    /// Images whose header claims more pixels than this are rejected before decoding.
    pub max_image_pixels: u64,
    /// Colour that transparent pixels are composited over.
    pub alpha: crate::data::image_io::AlphaPolicy,
    /// Decode/augment worker threads (0 = one per core, at most 4).
    pub workers: usize,
    /// Batches decoded ahead of the training step (bounded host memory).
    pub prefetch_batches: usize,
    /// Accept class folders with no usable images (warn and skip them) instead of failing.
    pub allow_empty_classes: bool,
    /// MiB of RAM for decoded images scaled to `load_size` (0 = none): epochs after the first
    /// skip decoding ([`crate::data::image_cache`]).
    pub cache_ram_mib: u64,
    /// MiB of disk for decoded images scaled to `load_size` (0 = none), kept between runs.
    pub cache_disk_mib: u64,
    /// Folder of the disk cache ("" = `$XDG_CACHE_HOME/vramfit/images`, else
    /// `~/.cache/vramfit/images`).
    pub cache_dir: String,
    /// Look for copies of one picture before training (inside a class, under two labels, in
    /// validation and training at once: [`crate::data::health`]).
    pub find_duplicates: bool,
    /// Evaluate without the validation images that copy a training image (they inflate
    /// validation accuracy); the split itself is kept.
    pub drop_leaked_val: bool,
    /// Which images an epoch draws ([`Sampler`]).
    pub sampler: Sampler,
    /// A labels CSV may name images outside its own folder (`..`, absolute paths elsewhere):
    /// off, since such a file may come from anywhere.
    pub csv_paths_outside: bool,
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            preprocess: PreprocessConfig::default(),
            val_fraction: 0.1,
            mean: [0.485, 0.456, 0.406],
            std: [0.229, 0.224, 0.225],
            max_image_pixels: 64_000_000,
            alpha: crate::data::image_io::AlphaPolicy::White,
            workers: 0,
            prefetch_batches: 4,
            allow_empty_classes: false,
            cache_ram_mib: 1024,
            cache_disk_mib: 4096,
            cache_dir: String::new(),
            find_duplicates: true,
            drop_leaked_val: false,
            sampler: Sampler::Shuffle,
            csv_paths_outside: false,
        }
    }
}

/// Training-time augmentation switches (evaluation and prediction never augment).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AugmentConfig {
    /// Random crop position (center crop when off) in the crop modes.
    pub random_crop: bool,
    /// Horizontal flip with probability 0.5.
    pub hflip: bool,
    /// Brightness/contrast/saturation jitter strength (0 = off, 0.4 = torchvision's usual).
    #[serde(serialize_with = "f32_shortest")]
    pub color_jitter: f32,
    /// Probability of erasing one random rectangle (Zhong et al. 2017), 0 = off.
    #[serde(serialize_with = "f32_shortest")]
    pub random_erasing: f32,
    /// On a wgpu device that compiles WGSL, flip, jitter, normalize and erase in vramfit's
    /// kernel (`shaders/augment_rgb8.wgsl`) from 8-bit uploads of the loader's crops; off, or on
    /// any other device, the loader's CPU workers do it. Both paths draw the same augmentation
    /// from the same seed.
    pub on_device: bool,
}

impl Default for AugmentConfig {
    fn default() -> Self {
        Self { random_crop: true, hflip: true, color_jitter: 0.2, random_erasing: 0.25, on_device: true }
    }
}

/// Numeric precision of the forward and backward passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// Everything in f32.
    F32,
    /// Convolutions and head in f16, master weights, optimizer state, norms and loss in f32,
    /// with dynamic loss scaling.
    F16,
}

impl Precision {
    /// Both precisions.
    pub const ALL: [Precision; 2] = [Precision::F32, Precision::F16];

    /// The config value: `f32` or `f16`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
        }
    }
}

impl std::fmt::Display for Precision {
    /// [`Precision::name`].
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Loop settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Number of passes over the training set.
    pub epochs: usize,
    /// Images per micro-batch (what is on the device at once).
    pub batch_size: usize,
    /// Micro-batches whose gradients are summed before one optimizer step
    /// (effective batch = batch_size x grad_accum_steps).
    pub grad_accum_steps: usize,
    /// Forward/backward precision.
    pub precision: Precision,
    /// Recompute memory-bound activations in backward instead of keeping them.
    pub checkpointing: bool,
    /// Label smoothing epsilon of the cross-entropy (Szegedy et al. 2016), 0 to 0.5.
    #[serde(serialize_with = "f32_shortest")]
    pub label_smoothing: f32,
    /// Global L2 norm the whole gradient is clipped to (0 = off), as `torch.nn.utils.clip_grad_norm_`.
    #[serde(serialize_with = "f32_shortest")]
    pub grad_clip_norm: f32,
    /// Sample device memory every this many optimizer steps (sampling synchronizes the device).
    pub memory_sample_every: usize,
    /// In f16, stop after this many consecutive skipped (overflowing) steps.
    pub max_skipped_steps: usize,
    /// Newest checkpoints kept in the run folder (at least 1); resume falls back to an older one
    /// when the newest is damaged.
    pub keep_checkpoints: usize,
    /// Also write a checkpoint every this many optimizer steps within an epoch (0: only at the
    /// end of each epoch and on Stop), bounding the work a crash or kill can cost.
    pub checkpoint_every_steps: usize,
    /// How each image's loss is weighted by its class ([`ClassWeights`]).
    pub class_weights: ClassWeights,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            epochs: 10,
            batch_size: 16,
            grad_accum_steps: 1,
            precision: Precision::F32,
            checkpointing: false,
            label_smoothing: 0.1,
            grad_clip_norm: 1.0,
            memory_sample_every: 10,
            max_skipped_steps: 20,
            keep_checkpoints: 2,
            checkpoint_every_steps: 500,
            class_weights: ClassWeights::None,
        }
    }
}

/// AdamW (Loshchilov & Hutter 2019) with linear warmup then cosine decay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerConfig {
    /// Peak learning rate, reached at the end of warmup.
    pub lr: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Epochs of linear warmup from 0 to `lr` (fractions allowed).
    pub warmup_epochs: f64,
    /// Learning rate at the end of the cosine, as a fraction of `lr`.
    pub min_lr_ratio: f64,
    /// Adam's first-moment decay.
    #[serde(serialize_with = "f32_shortest")]
    pub beta1: f32,
    /// Adam's second-moment decay.
    #[serde(serialize_with = "f32_shortest")]
    pub beta2: f32,
    /// Adam's epsilon.
    #[serde(serialize_with = "f32_shortest")]
    pub epsilon: f32,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self {
            lr: 2e-3,
            weight_decay: 0.05,
            warmup_epochs: 1.0,
            min_lr_ratio: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
        }
    }
}

/// The memory budget a run must fit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// Device bytes the run may use at its peak (the tier: 4, 6, 8 or 12 GiB). A file may write
    /// it with a unit, as the command line does (`"6GiB"`, [`byte_size::parse_bytes`]).
    #[serde(deserialize_with = "byte_size::deserialize")]
    pub memory_budget_bytes: u64,
    /// Emulate a card of exactly `memory_budget_bytes` (a tier on a larger card or a software
    /// adapter): a step after which the device's reserved bytes exceed the budget fails as out of
    /// memory, is not applied, and is retried at half the micro-batch, as on such a card. Costs
    /// one device synchronization per step.
    pub cap_to_budget: bool,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self { memory_budget_bytes: 8 << 30, cap_to_budget: false }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            name: default_name(),
            seed: default_seed(),
            model: ModelConfig::default(),
            data: DataConfig::default(),
            augment: AugmentConfig::default(),
            train: TrainConfig::default(),
            optimizer: OptimizerConfig::default(),
            memory: MemoryConfig::default(),
        }
    }
}

impl Config {
    /// Reads and validates a TOML config file.
    ///
    /// # Errors
    /// [`Error::Config`] naming the file for unreadable files, TOML syntax, unknown keys
    /// and out-of-range values.
    pub fn load(path: &Path) -> Result<Self> {
        let err = |message: String| Error::Config { source_name: path.display().to_string(), message };
        let bytes = std::fs::read(path)
            .map_err(|e| err(format!("cannot read it ({e}); pass an existing file such as configs/quickstart.toml")))?;
        let text = user_text::decode(&bytes).map_err(err)?;
        if text.trim().is_empty() {
            return Err(err("the file is empty: copy configs/quickstart.toml and edit it, or name a preset".into()));
        }
        Self::from_toml(&text, &path.display().to_string())
    }

    /// Parses and validates TOML text; `source_name` names it in errors.
    ///
    /// # Errors
    /// [`Error::Config`] for syntax, unknown keys and out-of-range values.
    pub fn from_toml(text: &str, source_name: &str) -> Result<Self> {
        let config: Config = toml::from_str(text).map_err(|e| Error::Config {
            source_name: source_name.to_string(),
            message: user_text::with_suggestion(&one_line(&e.to_string())),
        })?;
        config.validate(source_name)?;
        Ok(config)
    }

    /// This config as TOML text (what `configs/*.toml` hold).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot serialize config: {e}\n"))
    }

    /// Applies one `key=value` override such as `train.batch_size=32` or
    /// `data.preprocess.mode="crop"`. The value is parsed as TOML; a bare word becomes a string.
    ///
    /// # Errors
    /// [`Error::Config`] naming the key when it does not exist or the value is out of range.
    pub fn set(&mut self, assignment: &str) -> Result<()> {
        let updated = self.assigned(assignment)?;
        updated.validate(&format!("--set {assignment}"))?;
        *self = updated;
        Ok(())
    }

    /// This config with one `KEY=VALUE` applied, its type checked but not its range.
    fn assigned(&self, assignment: &str) -> Result<Config> {
        let err = |message: String| Error::Config { source_name: format!("--set {assignment}"), message };
        let (key, raw) =
            assignment.split_once('=').ok_or_else(|| err("expected KEY=VALUE, e.g. train.batch_size=32".into()))?;
        let key = key.trim();
        let value: toml::Value = match toml::from_str::<toml::Table>(&format!("v = {}", raw.trim())) {
            Ok(mut t) => t.remove("v").unwrap_or(toml::Value::String(raw.trim().into())),
            Err(_) => toml::Value::String(raw.trim().to_string()),
        };
        let mut root = toml::Value::try_from(self).map_err(|e| err(e.to_string()))?;
        let mut node = &mut root;
        let parts: Vec<&str> = key.split('.').collect();
        for (i, part) in parts.iter().enumerate() {
            let table = node.as_table_mut().ok_or_else(|| err(format!("`{key}` is not a config key")))?;
            let known: Vec<String> = table.keys().cloned().collect();
            let Some(next) = table.get_mut(*part) else {
                let hint = match self.closest_key(&parts, i, &known) {
                    Some(close) => format!("did you mean `{close}`?"),
                    None => "see configs/quickstart.toml for every key".into(),
                };
                return Err(err(format!("unknown key `{key}`; {hint}")));
            };
            if i + 1 == parts.len() {
                *next = value.clone();
                break;
            }
            node = next;
        }
        root.try_into().map_err(|e: toml::de::Error| err(one_line(&e.to_string())))
    }

    /// The key that `parts` (unknown from `parts[i]`, whose table holds `known`) most likely
    /// meant: `parts[i]` respelt at its level with the rest kept (`optimiser.lr` ->
    /// `optimizer.lr`), else the key whose last part is closest to the last of `parts`
    /// anywhere in the config (`epochs` -> `train.epochs`).
    fn closest_key(&self, parts: &[&str], i: usize, known: &[String]) -> Option<String> {
        let known: Vec<&str> = known.iter().map(String::as_str).collect();
        if let Some(close) = user_text::did_you_mean(parts[i], &known) {
            return Some([&parts[..i], &[close], &parts[i + 1..]].concat().join("."));
        }
        let mut leaves = Vec::new();
        collect_leaves(&toml::Value::try_from(self).ok()?, String::new(), &mut leaves);
        let last: Vec<&str> = leaves.iter().map(|k| k.rsplit('.').next().unwrap_or(k)).collect();
        let close = user_text::did_you_mean(parts[parts.len() - 1], &last)?;
        leaves.iter().find(|k| k.rsplit('.').next() == Some(close)).cloned()
    }

    /// Applies several `KEY=VALUE` overrides and validates once at the end, so overrides that
    /// only agree together (`load_size` and `crop_size` both shrunk) are accepted in any order.
    ///
    /// # Errors
    /// As [`Self::set`]; the config is unchanged on error.
    pub fn set_all(&mut self, assignments: &[String]) -> Result<()> {
        let mut updated = self.clone();
        for a in assignments {
            updated = updated.assigned(a)?;
        }
        let source_name = format!("--set {}", assignments.join(" --set "));
        updated.validate(&source_name)?;
        *self = updated;
        Ok(())
    }

    /// Side length in pixels of the square images the network is trained on.
    pub fn image_size_px(&self) -> usize {
        self.data.preprocess.crop_size
    }
}

/// The dotted paths of every value under `value` that is not a table, into `out`.
fn collect_leaves(value: &toml::Value, prefix: String, out: &mut Vec<String>) {
    match value.as_table() {
        Some(table) => {
            for (k, v) in table {
                let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                collect_leaves(v, path, out);
            }
        }
        None => out.push(prefix),
    }
}

/// Writes an f32 as the f64 of its shortest decimal form, so `config.toml` says `0.1`, not the
/// `0.10000000149011612` that widening the f32 gives.
fn f32_shortest<S: serde::Serializer>(v: &f32, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(shortest_f64(*v))
}

/// [`f32_shortest`] for each of three values.
fn f32_array_shortest<S: serde::Serializer>(v: &[f32; 3], s: S) -> std::result::Result<S::Ok, S::Error> {
    use serde::ser::SerializeTuple;
    let mut t = s.serialize_tuple(3)?;
    for x in v {
        t.serialize_element(&shortest_f64(*x))?;
    }
    t.end()
}

/// The f64 whose decimal form is the f32's shortest one (0.1f32 -> 0.1).
fn shortest_f64(v: f32) -> f64 {
    v.to_string().parse().unwrap_or(f64::from(v))
}

/// One line from a multi-line parser message (TOML errors span several lines), control
/// characters (a NUL from a damaged file) shown escaped.
pub(crate) fn one_line(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    joined.chars().flat_map(|c| if c.is_control() { c.escape_default().collect() } else { vec![c] }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::preprocess::PreprocessMode;

    #[test]
    fn unknown_key_is_an_error_naming_it() {
        let err = Config::from_toml("[train]\nbatch_sise = 3\n", "x.toml").unwrap_err().to_string();
        assert!(err.contains("x.toml") && err.contains("batch_sise"), "{err}");
    }

    #[test]
    fn out_of_range_value_names_the_key() {
        let err = Config::from_toml("[train]\nbatch_size = 0\n", "y.toml").unwrap_err().to_string();
        assert!(err.contains("train.batch_size"), "{err}");
    }

    #[test]
    fn set_overrides_nested_keys_and_rejects_unknown_ones() {
        let mut c = Config::default();
        c.set("train.batch_size=32").unwrap();
        c.set("data.preprocess.mode=crop").unwrap();
        c.set("optimizer.lr=0.01").unwrap();
        assert_eq!(c.train.batch_size, 32);
        assert_eq!(c.data.preprocess.mode, PreprocessMode::Crop);
        assert_eq!(c.optimizer.lr, 0.01);
        assert!(c.set("train.nope=1").unwrap_err().to_string().contains("train.nope"));
        assert!(c.set("train.batch_size=-1").is_err());
        assert_eq!(c.train.batch_size, 32, "a failed override leaves the config unchanged");
    }

    #[test]
    fn toml_round_trip() {
        let c = Config::default();
        assert_eq!(Config::from_toml(&c.to_toml(), "rt").unwrap(), c);
        // f32 keys are written in their shortest form, and still round-trip exactly.
        let q = crate::config::presets::load_config("quickstart").unwrap();
        let text = q.to_toml();
        assert!(text.contains("label_smoothing = 0.1\n") && text.contains("epsilon = 0.00000001"), "{text}");
        assert!(text.contains("mean = [\n    0.286,") || text.contains("mean = [0.286, "), "{text}");
        assert_eq!(Config::from_toml(&text, "rt").unwrap(), q);
    }
}
