//! `model.json`: what an export says about its weights (classes, preprocessing, the network's
//! shape, how it was trained), read by prediction, evaluation and the ONNX writer.

use serde::{Deserialize, Serialize};

use crate::config::{Config, ModelConfig};
use crate::data::image_io::AlphaPolicy;
use crate::data::preprocess::PreprocessConfig;

/// Version of the `model.json` layout.
pub const METADATA_VERSION: u32 = 1;

/// A short record of how the weights were trained.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainingInfo {
    /// Epochs completed.
    pub epochs: usize,
    /// Optimizer steps.
    pub steps: usize,
    /// Last validation top-1 accuracy, 0..1.
    pub val_accuracy: Option<f32>,
    /// Device trained on.
    pub device: String,
}

/// Contents of `model.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelMetadata {
    /// Layout version ([`METADATA_VERSION`]).
    pub format_version: u32,
    /// Class names, index = output logit (byte-exact as the dataset's folder names).
    pub class_names: Vec<String>,
    /// Input side in pixels (the crop size).
    pub image_size: usize,
    /// Normalization mean (RGB, after scaling to 0..1).
    pub mean: [f32; 3],
    /// Normalization std (RGB).
    pub std: [f32; 3],
    /// Geometry used for evaluation and prediction (center crops).
    pub preprocess: PreprocessConfig,
    /// Transparent-pixel rule.
    pub alpha: AlphaPolicy,
    /// Network shape.
    pub model: ModelConfig,
    /// Parameters.
    pub param_count: usize,
    /// How it was trained.
    pub training: TrainingInfo,
}

impl ModelMetadata {
    /// Metadata of weights trained with `config` on `classes`.
    pub fn new(config: &Config, classes: &[String], param_count: usize, training: TrainingInfo) -> Self {
        Self {
            format_version: METADATA_VERSION,
            class_names: classes.to_vec(),
            image_size: config.image_size_px(),
            mean: config.data.mean,
            std: config.data.std,
            preprocess: config.data.preprocess.clone(),
            alpha: config.data.alpha,
            model: config.model.clone(),
            param_count,
            training,
        }
    }

    /// A config that reproduces this model's preprocessing for evaluation and prediction.
    pub fn inference_config(&self) -> Config {
        let mut c = Config { model: self.model.clone(), ..Config::default() };
        c.data.preprocess = self.preprocess.clone();
        c.data.mean = self.mean;
        c.data.std = self.std;
        c.data.alpha = self.alpha;
        c
    }
}
