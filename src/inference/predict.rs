//! Prediction: top-k classes with probabilities for images, using the preprocessing stored with
//! the model (center crops, no augmentation) and the same image-loading path as training.

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Tensor};
use image::RgbImage;
use rand::SeedableRng;
use serde::Serialize;

use crate::config::Precision;
use crate::data::batch::image_tensor;
use crate::data::dataset::SampleSource;
use crate::data::pipeline::SamplePipeline;
use crate::engine::error::{Error, Result};
use crate::export::{LoadedModel, ModelMetadata};
use crate::inference::eval::top_k;
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
///
/// Inputs too large for the device's buffers (a 12 MP photo through a model with preprocess
/// mode `none`, on an adapter with a 128 MiB binding limit) are checked before upload: a batch is
/// split into chunks that fit, and an image that does not fit alone runs on the CPU, with a
/// one-line notice ([`Self::take_notices`]), or is refused where there is no CPU to spare
/// ([`Self::without_cpu_fallback`]).
pub struct Predictor {
    model: Classifier,
    /// The model's metadata.
    pub metadata: ModelMetadata,
    device: Device,
    pipeline: SamplePipeline,
    buffer_limit: Option<u64>,
    cpu_fallback: bool,
    cpu_model: std::sync::OnceLock<(Classifier, Device)>,
    notices: std::sync::Mutex<Vec<String>>,
}

impl Predictor {
    /// Wraps loaded weights (already on `device`).
    pub fn new(loaded: LoadedModel, device: Device) -> Self {
        Self::from_model(loaded.model, loaded.metadata, device)
    }

    /// Wraps a model already on `device` (e.g. the one just trained, in a browser where there is
    /// no export folder to load) with the metadata that says how to preprocess its inputs. It
    /// has no buffer limit until [`Self::with_buffer_limit`] sets one.
    pub fn from_model(model: Classifier, metadata: ModelMetadata, device: Device) -> Self {
        let pipeline = SamplePipeline::from_config(&metadata.inference_config(), false);
        Self {
            model,
            metadata,
            device,
            pipeline,
            buffer_limit: None,
            cpu_fallback: true,
            cpu_model: std::sync::OnceLock::new(),
            notices: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The model, on the predictor's device (e.g. to export it: [`crate::export::model_files_async`]).
    pub fn model(&self) -> &Classifier {
        &self.model
    }

    /// Sets the largest tensor, in bytes, the device accepts
    /// ([`crate::device::SelectedDevice::buffer_limit`]; `None`: no limit, as on the CPU).
    #[must_use]
    pub fn with_buffer_limit(mut self, limit: Option<u64>) -> Self {
        self.buffer_limit = limit;
        self
    }

    /// Refuses an image that does not fit the device's buffers instead of running it on the CPU:
    /// for a browser page, where wasm's 4 GiB cannot hold a CPU copy of a large photo's
    /// activations.
    #[must_use]
    pub fn without_cpu_fallback(mut self) -> Self {
        self.cpu_fallback = false;
        self
    }

    /// Notices since the last call, e.g. that an image ran on the CPU because it does not fit
    /// the device's buffers.
    pub fn take_notices(&self) -> Vec<String> {
        std::mem::take(&mut *self.notices.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
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
    /// [`Error::Preprocess`] for images it cannot use.
    pub fn input(&self, img: &RgbImage) -> Result<Tensor<4>> {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(0);
        let (chw, h, w) = self.pipeline.tensor_from_image(img, &mut rng)?;
        Ok(image_tensor(chw, 1, (h, w), &self.device))
    }

    /// Softmax probabilities for a batch of decoded images of one shape, `[B][classes]`, blocking
    /// on [`Self::probabilities_async`] (native code; in a browser a blocking wait panics, so a
    /// page awaits that instead).
    ///
    /// # Errors
    /// As [`Self::probabilities_async`].
    pub fn probabilities(&self, images: &[RgbImage]) -> Result<Vec<Vec<f32>>> {
        pollster::block_on(self.probabilities_async(images))
    }

    /// Softmax probabilities for a batch of decoded images of one shape, `[B][classes]`, each
    /// chunk read back from the device in one awaited transfer.
    ///
    /// Each chunk uploaded is checked against the device's buffer limit first: the batch is split
    /// to fit, and images that do not fit alone run on the CPU (default backend) with a notice,
    /// or, [`Self::without_cpu_fallback`], are refused before they are preprocessed.
    ///
    /// # Errors
    /// [`Error::Preprocess`] for an unusable image, [`Error::Memory`] for an image that does not
    /// fit the device's buffers without a CPU fallback, [`Error::Device`] when the device fails.
    pub async fn probabilities_async(&self, images: &[RgbImage]) -> Result<Vec<Vec<f32>>> {
        let Some(first) = images.first() else { return Ok(vec![]) };
        // The batch's input size (one shape), before the images become f32 tensors.
        let (w, h) = self.metadata.preprocess.output_size_for(first.dimensions())?;
        let classes = self.metadata.class_names.len();
        let per_image =
            crate::memory::inference_bytes_per_image(&self.metadata.model, classes, (h as usize, w as usize));
        let fit = crate::memory::images_per_buffer(self.buffer_limit, per_image);
        let too_large = || {
            format!(
                "a {w}x{h} input needs a {} tensor but the device allows {} per buffer",
                crate::memory::human_bytes(per_image),
                crate::memory::human_bytes(self.buffer_limit.unwrap_or(0)),
            )
        };
        if fit == 0 && !self.cpu_fallback {
            return Err(Error::Memory(format!("{}; use a smaller image", too_large())));
        }
        let mut rng = rand::rngs::SmallRng::seed_from_u64(0);
        let inputs = images.iter().map(|i| self.pipeline.tensor_from_image(i, &mut rng)).collect::<Result<Vec<_>>>()?;
        if fit == 0 {
            self.notices
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(format!("{}: predicted on the CPU", too_large()));
            let (model, device) = self.cpu_model.get_or_init(|| {
                let cpu = crate::device::SelectedDevice::cpu_fallback().device;
                (burn::module::Module::to_device(self.model.clone(), &cpu), cpu)
            });
            return forward_probabilities(model, device, &inputs, classes).await;
        }
        let mut out = Vec::with_capacity(inputs.len());
        for chunk in inputs.chunks(fit) {
            out.extend(forward_probabilities(&self.model, &self.device, chunk, classes).await?);
        }
        Ok(out)
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

    /// Decodes an image (a file, or a file's bytes: a file dropped on a page has no path) with
    /// the model's decoding rules, as training decodes it ([`SamplePipeline::decode_scaled`]).
    ///
    /// # Errors
    /// [`Error::Image`] naming the file.
    pub fn decode(&self, source: &SampleSource) -> Result<RgbImage> {
        self.pipeline.decode_scaled(source)
    }
}

/// Softmax probabilities of `model` on `device` for preprocessed CHW images of one shape, read
/// back in one awaited transfer.
async fn forward_probabilities(
    model: &Classifier,
    device: &Device,
    inputs: &[(Vec<f32>, usize, usize)],
    classes: usize,
) -> Result<Vec<Vec<f32>>> {
    let (h, w) = (inputs[0].1, inputs[0].2);
    let flat: Vec<f32> = inputs.iter().flat_map(|(chw, _, _)| chw.iter().copied()).collect();
    let x = image_tensor(flat, inputs.len(), (h, w), device);
    let probs = burn::tensor::activation::softmax(model.forward(x, Precision::F32), 1);
    let data = probs.into_data_async().await.map_err(|e| Error::device(&e))?;
    let values = data.try_to_vec::<f32>().map_err(|e| Error::device(&e))?;
    Ok(values.chunks(classes).map(<[f32]>::to_vec).collect())
}

/// Image files to predict from arguments: files as given, folders expanded by the dataset scan
/// rules ([`crate::data::dataset::image_files`]), sorted. Files of a folder in image formats
/// the decoders do not read are included, so that each gets its error and the fix.
pub fn expand_inputs(inputs: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in inputs {
        if p.is_dir() {
            let (images, unsupported) = crate::data::dataset::image_files(p);
            out.extend(images);
            out.extend(unsupported);
        } else {
            out.push(p.clone());
        }
    }
    out.sort();
    out
}
