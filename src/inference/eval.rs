//! Evaluation: loss, top-1/top-5 accuracy, per-class accuracy and the confusion matrix.

use std::sync::Arc;

use burn::tensor::Device;

use crate::config::{ModelConfig, Precision};
use crate::data::batch::Batch;
use crate::data::dataset::Dataset;
use crate::data::loader;
use crate::data::pipeline::SamplePipeline;
use crate::engine::error::{Error, Result};
use crate::model::Classifier;

/// Results over a dataset. With no image evaluated (`samples == 0`) the loss and accuracies are
/// NaN, which every output shows as "n/a" ([`percent_or_na`]) and CSV files as an empty cell.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EvalResult {
    /// Mean cross-entropy (no smoothing); NaN without images.
    #[serde(deserialize_with = "crate::engine::events::f32_or_nan")]
    pub loss: f32,
    /// Top-1 accuracy, 0..1; NaN without images.
    #[serde(deserialize_with = "crate::engine::events::f32_or_nan")]
    pub top1: f32,
    /// Top-5 accuracy, 0..1 (top-k with k = classes when fewer than 5); NaN without images.
    #[serde(deserialize_with = "crate::engine::events::f32_or_nan")]
    pub top5: f32,
    /// Class names, label order.
    pub class_names: Vec<String>,
    /// `confusion[true][predicted]` counts.
    pub confusion: Vec<Vec<u64>>,
    /// Samples evaluated.
    pub samples: usize,
    /// Samples skipped (undecodable): (source, reason).
    pub skipped: Vec<(String, String)>,
    /// Each evaluated image's softmax probabilities `[samples * classes]`, row-major, where
    /// [`EvalSettings::keep_probabilities`] asked for them (else empty); not serialized.
    #[serde(skip)]
    pub probabilities: Vec<f32>,
    /// `[samples]` the index in the evaluated dataset of each row of `probabilities`.
    #[serde(skip)]
    pub sample_indices: Vec<usize>,
    /// `[samples]` the given label of each row of `probabilities`.
    #[serde(skip)]
    pub sample_labels: Vec<usize>,
}

impl EvalResult {
    /// Accuracy of each class, 0..1 (NaN for a class without samples): its recall.
    pub fn per_class_accuracy(&self) -> Vec<f32> {
        self.confusion.iter().enumerate().map(|(i, row)| row[i] as f32 / row.iter().sum::<u64>() as f32).collect()
    }

    /// Precision of each class, 0..1: of the images predicted as it, the share that are (NaN
    /// for a class never predicted).
    pub fn per_class_precision(&self) -> Vec<f32> {
        (0..self.confusion.len())
            .map(|c| self.confusion[c][c] as f32 / self.confusion.iter().map(|row| row[c]).sum::<u64>() as f32)
            .collect()
    }

    /// Balanced accuracy, 0..1: the mean recall over the classes that have images (scikit-learn's
    /// `balanced_accuracy_score`); NaN without images. A model that ignores a small class loses
    /// that class's whole share here, however few images it has.
    pub fn balanced_accuracy(&self) -> f32 {
        mean_finite(self.per_class_accuracy())
    }

    /// Macro-F1, 0..1: the mean over the classes that have images of `2 P R / (P + R)` (0 where
    /// a class is never predicted correctly), as scikit-learn's `f1_score(average="macro")`
    /// over the classes present; NaN without images.
    pub fn macro_f1(&self) -> f32 {
        let (precision, recall) = (self.per_class_precision(), self.per_class_accuracy());
        let f1 = precision.iter().zip(&recall).map(|(&p, &r)| match (p, r) {
            (_, r) if r.is_nan() => f32::NAN,
            (p, r) if p.is_nan() || p + r == 0.0 => 0.0,
            (p, r) => 2.0 * p * r / (p + r),
        });
        mean_finite(f1.collect())
    }

    /// The images whose given label the model doubts, most doubtful first
    /// ([`crate::data::health::label_issues::rank`]); each issue's `index` is a row of
    /// [`Self::sample_indices`]. Empty unless the probabilities were kept.
    pub fn label_issues(&self) -> Vec<crate::data::health::label_issues::LabelIssue> {
        if self.probabilities.is_empty() {
            return vec![];
        }
        crate::data::health::label_issues::rank(&self.probabilities, &self.sample_labels, self.class_names.len())
    }

    /// The confusion matrix as CSV: header `true\predicted,<classes>`, one row per true class.
    pub fn confusion_csv(&self) -> String {
        let quote = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
        let mut out = String::from("true\\predicted");
        for c in &self.class_names {
            out.push(',');
            out.push_str(&quote(c));
        }
        out.push('\n');
        for (name, row) in self.class_names.iter().zip(&self.confusion) {
            out.push_str(&quote(name));
            for v in row {
                out.push_str(&format!(",{v}"));
            }
            out.push('\n');
        }
        out
    }
}

/// The mean of the finite values (NaN when there is none).
fn mean_finite(values: Vec<f32>) -> f32 {
    let finite: Vec<f32> = values.into_iter().filter(|v| v.is_finite()).collect();
    if finite.is_empty() { f32::NAN } else { finite.iter().sum::<f32>() / finite.len() as f32 }
}

/// How [`evaluate`] batches, computes and checks its uploads.
#[derive(Clone, Debug)]
pub struct EvalSettings<'a> {
    /// The network's config (its layer shapes size the buffer check).
    pub model: &'a ModelConfig,
    /// Images per batch read from the loader.
    pub batch_size: usize,
    /// Compute precision of the forward pass.
    pub precision: Precision,
    /// Decoding threads (0: automatic, [`crate::data::loader::worker_count`]).
    pub workers: usize,
    /// Bytes one tensor may occupy on the device
    /// ([`crate::device::SelectedDevice::buffer_limit`]); `None` on the CPU.
    pub buffer_limit: Option<u64>,
    /// Keep each image's probabilities ([`EvalResult::probabilities`], `4 * classes` bytes an
    /// image) for the label-issue ranking.
    pub keep_probabilities: bool,
}

/// Evaluates `model` (a validation snapshot, no autodiff) on `dataset`. Every batch is checked
/// against the device's buffer limit before it is uploaded and split into chunks that fit; each
/// chunk's results are read back in one awaited transfer ([`batch_log_probs`]). Where no thread
/// can be started (a browser) the batches are decoded on the awaiting thread. Native callers
/// block on it (`pollster::block_on`); a browser awaits it.
///
/// # Errors
/// [`Error::Memory`] when one image alone is larger than the device's buffer limit (naming the
/// limit and the fix), [`Error::Device`] when the device fails to return results.
pub async fn evaluate(
    model: &Classifier,
    dataset: Arc<Dataset>,
    pipeline: Arc<SamplePipeline>,
    device: &Device,
    settings: &EvalSettings<'_>,
) -> Result<EvalResult> {
    let EvalSettings { batch_size, precision, workers, buffer_limit, .. } = *settings;
    let pipeline_keeps_size = pipeline.preprocess.output_size().is_none();
    let classes = dataset.class_names.len();
    let mut result = EvalResult {
        class_names: dataset.class_names.clone(),
        confusion: vec![vec![0; classes]; classes],
        ..Default::default()
    };
    let (mut loss_sum, mut top5_hits) = (0f64, 0usize);
    for batch in loader::batches(
        dataset.clone(),
        pipeline,
        loader::Pass::in_order(dataset.samples.len(), batch_size, 0),
        workers,
        2,
    ) {
        result.skipped.extend(batch.skipped.iter().cloned());
        if batch.is_empty() {
            continue;
        }
        let per_image = crate::memory::inference_bytes_per_image(settings.model, classes, (batch.height, batch.width));
        let fit = crate::memory::images_per_buffer(buffer_limit, per_image);
        if fit == 0 {
            return Err(Error::Memory(format!(
                "one {}x{} evaluation image needs a {} tensor but the device allows {} per buffer; evaluate on the \
                 CPU (--device cpu){}",
                batch.width,
                batch.height,
                crate::memory::human_bytes(per_image),
                crate::memory::human_bytes(buffer_limit.unwrap_or(0)),
                // Mode `none` keeps each image's size: only a crop-based mode bounds it.
                if pipeline_keeps_size {
                    ", or train with a crop-based preprocess mode"
                } else {
                    " or use a smaller data.preprocess.crop_size"
                },
            )));
        }
        for chunk in batch.split(batch.len().div_ceil(fit)) {
            let (labels, indices) = (chunk.labels.clone(), chunk.indices.clone());
            let log_probs = batch_log_probs(model, chunk, device, precision).await?;
            count_batch(&log_probs, &labels, &mut result, &mut loss_sum, &mut top5_hits);
            if settings.keep_probabilities {
                result.probabilities.extend(log_probs.iter().map(|v| v.exp()));
                result.sample_indices.extend(indices);
                result.sample_labels.extend(labels.iter().map(|&l| l as usize));
            }
        }
    }
    finish(&mut result, loss_sum, top5_hits);
    Ok(result)
}

/// The loss, top-1 and top-5 of the batches [`count_batch`] added to `result`.
pub(crate) fn finish(result: &mut EvalResult, loss_sum: f64, top5_hits: usize) {
    let classes = result.class_names.len();
    let n = if result.samples == 0 { f64::NAN } else { result.samples as f64 };
    let correct: u64 = (0..classes).map(|i| result.confusion[i][i]).sum();
    result.loss = (loss_sum / n) as f32;
    result.top1 = (correct as f64 / n) as f32;
    result.top5 = (top5_hits as f64 / n) as f32;
}

/// The log-probabilities `[B * C]` (row-major, `C` classes) of one batch, read from the device
/// in one awaited transfer (in a browser the page runs meanwhile).
///
/// # Errors
/// [`Error::Device`] when the device fails to return them.
pub(crate) async fn batch_log_probs(
    model: &Classifier,
    batch: Batch,
    device: &Device,
    precision: Precision,
) -> Result<Vec<f32>> {
    let (images, _) = batch.into_tensors(device);
    let logits = model.forward(images, precision);
    let logp = burn::tensor::activation::log_softmax(logits, 1); // [B, C]
    let data = logp.into_data_async().await.map_err(|e| Error::device(&e))?;
    data.try_to_vec::<f32>().map_err(|e| Error::device(&e))
}

/// Adds one batch's loss sum (the negative log-probability of each true class), confusion counts
/// and top-k hits to the running totals. `log_probs` is `[labels.len() * C]`.
pub(crate) fn count_batch(
    log_probs: &[f32],
    labels: &[i64],
    result: &mut EvalResult,
    loss_sum: &mut f64,
    top5_hits: &mut usize,
) {
    let classes = result.class_names.len();
    let k = classes.min(5);
    for (i, &label) in labels.iter().enumerate() {
        let row = &log_probs[i * classes..(i + 1) * classes];
        *loss_sum -= f64::from(row[label as usize]);
        let ranked = top_k(row, k);
        result.confusion[label as usize][ranked[0].0] += 1;
        if ranked.iter().any(|(c, _)| *c == label as usize) {
            *top5_hits += 1;
        }
    }
    result.samples += labels.len();
}

/// An accuracy (0..1) as a percentage with two decimals, or "n/a" when it was not measured (NaN).
pub fn percent_or_na(value: f32) -> String {
    if value.is_finite() { format!("{:.2}%", value * 100.0) } else { "n/a".to_string() }
}

/// A loss with four decimals, or "n/a" when it was not measured (NaN).
pub fn loss_or_na(value: f32) -> String {
    if value.is_finite() { format!("{value:.4}") } else { "n/a".to_string() }
}

/// A metric for a CSV cell: the number, or an empty cell when it was not measured (NaN).
pub fn csv_cell(value: f32) -> String {
    if value.is_finite() { value.to_string() } else { String::new() }
}

/// Indices and values of the `k` largest entries, largest first (ties: lower index first).
pub fn top_k(values: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut idx: Vec<(usize, f32)> = values.iter().copied().enumerate().collect();
    idx.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    idx.truncate(k);
    idx
}

/// Evaluates the newest intact checkpoint of the run folder `run` on `data` (the app's
/// Evaluate button): batches of at least 32, f32, the run's decoding threads.
///
/// # Errors
/// [`Error::Dataset`] when `data`'s classes are not the run's; as
/// [`crate::train::checkpoint::load_latest_model`] and [`evaluate`].
pub fn evaluate_run(
    run: &std::path::Path,
    data: Dataset,
    device: &crate::device::SelectedDevice,
) -> Result<EvalResult> {
    let (model, config, state) = crate::train::checkpoint::load_latest_model(run, &device.device)?;
    if state.class_names != data.class_names {
        return Err(Error::Dataset {
            path: run.into(),
            message: "the dataset's classes differ from the run's; choose the dataset it was trained on".into(),
        });
    }
    let pipe = Arc::new(SamplePipeline::from_config(&config, false));
    let settings = EvalSettings {
        model: &config.model,
        batch_size: config.train.batch_size.max(32),
        precision: Precision::F32,
        workers: config.data.workers,
        buffer_limit: device.buffer_limit(),
        keep_probabilities: true,
    };
    pollster::block_on(evaluate(&model, Arc::new(data), pipe, &device.device, &settings))
}

/// Evaluates exported weights (an export folder or weights file, see
/// [`crate::export::resolve_paths`]) on `data` with the export's own preprocessing, in batches
/// of `batch_size`, f32.
///
/// # Errors
/// [`Error::Io`] naming the model when `data`'s classes are not its own; as
/// [`crate::export::load`] and [`evaluate`].
pub fn evaluate_export(
    model: &std::path::Path,
    data: Dataset,
    device: &crate::device::SelectedDevice,
    batch_size: usize,
) -> Result<EvalResult> {
    let loaded = crate::export::load(model, &device.device)?;
    if data.class_names != loaded.metadata.class_names {
        return Err(Error::io(
            model,
            format!(
                "the model's classes {:?} differ from the dataset's {:?}; evaluate it on the dataset it was trained on",
                loaded.metadata.class_names, data.class_names
            ),
        ));
    }
    let config = loaded.metadata.inference_config();
    let pipe = Arc::new(SamplePipeline::from_config(&config, false));
    let settings = EvalSettings {
        model: &loaded.metadata.model,
        batch_size,
        precision: Precision::F32,
        workers: 0,
        buffer_limit: device.buffer_limit(),
        keep_probabilities: true,
    };
    pollster::block_on(evaluate(&loaded.model, Arc::new(data), pipe, &device.device, &settings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_neglected_small_class_shows_in_balanced_accuracy_and_macro_f1() {
        // C34's eval: 6 `common` right, the 1 `rare` image called `common`.
        let r = EvalResult {
            class_names: vec!["common".into(), "rare".into(), "absent".into()],
            confusion: vec![vec![6, 0, 0], vec![1, 0, 0], vec![0, 0, 0]],
            ..Default::default()
        };
        assert_eq!(r.balanced_accuracy(), 0.5, "the absent class is not averaged");
        assert!(r.per_class_precision()[1].is_nan());
        assert!((r.macro_f1() - (2.0 * (6.0 / 7.0) / (1.0 + 6.0 / 7.0)) / 2.0).abs() < 1e-6);
        assert!(EvalResult::default().balanced_accuracy().is_nan());
    }

    #[test]
    fn top_k_orders_by_value() {
        assert_eq!(top_k(&[0.1, 0.5, 0.2, 0.9], 2), vec![(3, 0.9), (1, 0.5)]);
    }

    #[test]
    fn per_class_and_csv() {
        let r = EvalResult {
            class_names: vec!["a".into(), "b \"x\"".into()],
            confusion: vec![vec![3, 1], vec![0, 2]],
            ..Default::default()
        };
        assert_eq!(r.per_class_accuracy(), vec![0.75, 1.0]);
        assert_eq!(r.per_class_precision(), vec![1.0, 2.0 / 3.0]);
        assert_eq!(r.balanced_accuracy(), 0.875);
        // F1: a 2*1*0.75/1.75 = 6/7, b 2*(2/3)*1/(5/3) = 4/5.
        assert!((r.macro_f1() - (6.0 / 7.0 + 0.8) / 2.0).abs() < 1e-6);
        assert_eq!(r.confusion_csv(), "true\\predicted,\"a\",\"b \"\"x\"\"\"\n\"a\",3,1\n\"b \"\"x\"\"\",0,2\n");
    }
}
