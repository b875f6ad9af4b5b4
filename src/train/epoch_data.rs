//! What every epoch of a run reads ([`EpochData`]: the datasets and their pipelines) and what
//! one epoch sums ([`EpochTotals`]).

use std::path::PathBuf;
use std::sync::Arc;

use super::store::Store;
use crate::config::Config;
use crate::data::dataset::{Dataset, Splits};
use crate::data::loader;
use crate::data::pipeline::SamplePipeline;

/// The data of every epoch: datasets and their pipelines (augmented for training).
pub(super) struct EpochData {
    pub(super) train: Arc<Dataset>,
    pub(super) val: Arc<Dataset>,
    pub(super) train_pipe: Arc<SamplePipeline>,
    pub(super) eval_pipe: Arc<SamplePipeline>,
    /// The dataset folder, for errors about the data.
    pub(super) root: PathBuf,
    /// Batches are built on loader threads (a run folder) or on the calling thread (memory).
    threads: bool,
}

impl EpochData {
    /// The run's datasets and pipelines. In a run folder, training and evaluation share one
    /// decoded-image cache (their resized images are the same) and training batches go to the
    /// device's augmentation kernel when `augment_on_device`
    /// ([`crate::kernels::device_augment::augments_on_device`]); in memory, neither (see
    /// [`Store::Memory`]). Validation leaves out `drop_val` (indices into `splits.val`).
    pub(super) fn new(
        splits: &Splits,
        config: &Config,
        augment_on_device: bool,
        store: Store<'_>,
        drop_val: &[usize],
    ) -> Self {
        let threads = matches!(store, Store::Folder { .. });
        let cache =
            if threads { crate::data::image_cache::ImageCache::from_config(&config.data).map(Arc::new) } else { None };
        Self {
            train: Arc::new(splits.train.clone()),
            val: Arc::new(without(&splits.val, drop_val)),
            train_pipe: Arc::new(
                SamplePipeline::from_config(config, true)
                    .with_cache(cache.clone())
                    .with_device_augment(augment_on_device),
            ),
            eval_pipe: Arc::new(SamplePipeline::from_config(config, false).with_cache(cache)),
            root: splits.root.clone(),
            threads,
        }
    }

    /// The batches of one training pass.
    pub(super) fn batches(&self, pass: loader::Pass, config: &Config) -> loader::BatchIter {
        if self.threads {
            loader::batches(
                self.train.clone(),
                self.train_pipe.clone(),
                pass,
                config.data.workers,
                config.data.prefetch_batches,
            )
        } else {
            loader::batches_on_this_thread(self.train.clone(), self.train_pipe.clone(), pass)
        }
    }
}

/// `dataset` without the samples at `drop` (sorted indices).
fn without(dataset: &Dataset, drop: &[usize]) -> Dataset {
    let samples = dataset
        .samples
        .iter()
        .enumerate()
        .filter(|(i, _)| drop.binary_search(i).is_err())
        .map(|(_, s)| s.clone())
        .collect();
    Dataset { class_names: dataset.class_names.clone(), samples }
}

/// Sums over one epoch's steps, for its summary.
#[derive(Default)]
pub(super) struct EpochTotals {
    /// Sum over applied steps of loss x images, and of accuracy x images.
    pub(super) loss: f64,
    pub(super) correct: f64,
    /// Images of the applied steps.
    pub(super) images: usize,
    /// Images of every step that ran, applied or skipped by the f16 loss scaler.
    pub(super) stepped_images: usize,
    /// Loader batches this invocation trained on (0 for an epoch resumed at its end).
    pub(super) batches: usize,
    pub(super) skipped: usize,
    /// Seconds the loop waited for the loader's next batch (the device idle for want of data).
    pub(super) data_wait_secs: f64,
}

impl EpochTotals {
    /// The epoch's mean training loss and accuracy; `None` when this invocation trained no image
    /// of it (an epoch resumed at its end): never a NaN.
    pub(super) fn means(&self) -> (Option<f32>, Option<f32>) {
        if self.images == 0 {
            return (None, None);
        }
        let n = self.images as f64;
        (Some((self.loss / n) as f32), Some((self.correct / n) as f32))
    }
}
