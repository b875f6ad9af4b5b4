//! Prediction: top-k classes with probabilities for images, using the preprocessing stored with
//! the model (center crops, no augmentation) and the same image-loading path as training.

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Tensor, TensorData};
use image::RgbImage;
use rand::SeedableRng;
use serde::Serialize;

use crate::config::Precision;
use crate::error::{Error, Result};
use crate::eval::top_k;
use crate::export::{LoadedModel, ModelMetadata};
use crate::image_io;
use crate::loader::SamplePipeline;
use crate::model::Classifier;

/// One class and its probability.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClassProb {
    /// Class index.
    pub index: usize,
    /// Class name (byte-exact).
    pub name: String,
    /// Softmax probability, 0..1.
    pub probability: f32,
}

/// A model ready to predict on a device.
pub struct Predictor {
    model: Classifier,
    /// The model's metadata.
    pub metadata: ModelMetadata,
    device: Device,
    pipeline: SamplePipeline,
}

impl Predictor {
    /// Wraps loaded weights (already on `device`).
    pub fn new(loaded: LoadedModel, device: Device) -> Self {
        let pipeline = SamplePipeline::from_config(&loaded.metadata.inference_config(), false);
        Self { model: loaded.model, metadata: loaded.metadata, device, pipeline }
    }

    /// Loads an export (folder or weights file) onto `device`.
    ///
    /// # Errors
    /// As [`crate::export::load`].
    pub fn load(path: &Path, device: Device) -> Result<Self> {
        let loaded = crate::export::load(path, &device)?;
        Ok(Self::new(loaded, device))
    }

    /// The model input for one decoded image.
    ///
    /// # Shapes
    /// `[1, 3, H, W]` with H = W = the model's crop size (mode `none`: the rounded image size).
    ///
    /// # Errors
    /// The preprocess reason for images it cannot use.
    pub fn input(&self, img: &RgbImage) -> std::result::Result<Tensor<4>, String> {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(0);
        let (chw, h, w) = self.pipeline.tensor_from_image(img, &mut rng)?;
        Ok(Tensor::<4>::from_data(TensorData::new(chw, [1, 3, h, w]), &self.device))
    }

    /// Softmax probabilities for a batch of decoded images of one shape, `[B][classes]`.
    ///
    /// # Errors
    /// [`Error::Preprocess`] for an unusable image, [`Error::Device`] when the device fails.
    pub fn probabilities(&self, images: &[RgbImage]) -> Result<Vec<Vec<f32>>> {
        let inputs = images
            .iter()
            .map(|i| self.input(i))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(Error::Preprocess)?;
        if inputs.is_empty() {
            return Ok(vec![]);
        }
        let x = Tensor::cat(inputs, 0);
        let probs = burn::tensor::activation::softmax(self.model.forward(x, Precision::F32), 1);
        let classes = self.metadata.class_names.len();
        let data = probs.try_into_data().map_err(|e| Error::Device(format!("{e:?}")))?;
        let values = data.try_to_vec::<f32>().map_err(|e| Error::Device(format!("{e:?}")))?;
        Ok(values.chunks(classes).map(<[f32]>::to_vec).collect())
    }

    /// Top-`k` classes of one decoded image.
    ///
    /// # Errors
    /// As [`Self::probabilities`].
    pub fn predict_image(&self, img: &RgbImage, k: usize) -> Result<Vec<ClassProb>> {
        let probs = self.probabilities(std::slice::from_ref(img))?;
        Ok(self.top(&probs[0], k))
    }

    /// Top-`k` of one probability vector.
    pub fn top(&self, probs: &[f32], k: usize) -> Vec<ClassProb> {
        top_k(probs, k.min(probs.len()))
            .into_iter()
            .map(|(index, probability)| ClassProb {
                index,
                name: self.metadata.class_names[index].clone(),
                probability,
            })
            .collect()
    }

    /// Loads an image file with the model's decoding rules.
    ///
    /// # Errors
    /// [`Error::Image`] naming the file.
    pub fn load_image(&self, path: &Path) -> Result<RgbImage> {
        image_io::load_image(path, &self.pipeline.load)
    }

    /// Predicts every file; each gets its own result so one bad file does not stop the others.
    pub fn predict_files(&self, paths: &[PathBuf], k: usize) -> Vec<(PathBuf, Result<Vec<ClassProb>>)> {
        paths
            .iter()
            .map(|p| {
                let r = self.load_image(p).and_then(|img| {
                    self.predict_image(&img, k).map_err(|e| Error::Image { path: p.clone(), message: e.to_string() })
                });
                (p.clone(), r)
            })
            .collect()
    }
}

/// Image files to predict from arguments: files as given, folders expanded by the dataset scan
/// rules ([`crate::dataset::image_files`]), sorted.
pub fn expand_inputs(inputs: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in inputs {
        if p.is_dir() {
            out.extend(crate::dataset::image_files(p));
        } else {
            out.push(p.clone());
        }
    }
    out.sort();
    out
}
