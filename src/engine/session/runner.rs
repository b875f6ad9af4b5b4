//! The engine thread's side of a [`super::Session`]: [`Engine`] runs each job on the thread its
//! tensors live on, [`run_async`] the jobs that also run as a page's tasks, and the predictions
//! a job returns file by file.

#[cfg(not(target_arch = "wasm32"))]
use std::panic::AssertUnwindSafe;
#[cfg(not(target_arch = "wasm32"))]
use std::path::PathBuf;
#[cfg(not(target_arch = "wasm32"))]
use std::sync::Arc;
#[cfg(not(target_arch = "wasm32"))]
use std::time::SystemTime;

use super::{Job, JobOutput, PredictedFile, THUMBNAIL_SIZE};
#[cfg(not(target_arch = "wasm32"))]
use super::{Report, ReportQueue};
use crate::data::dataset::SampleSource;
#[cfg(not(target_arch = "wasm32"))]
use crate::device::DeviceChoice;
use crate::engine::error::{Error, Result};
#[cfg(not(target_arch = "wasm32"))]
use crate::engine::events::{Event, LiveBudget};
use crate::engine::events::{EventSink, StopSignal};
use crate::inference::predict::Predictor;

/// `job`'s result, or [`Error::Crashed`] with the message of its panic.
#[cfg(not(target_arch = "wasm32"))]
pub(super) fn catch_panic(job: impl FnOnce() -> Result<JobOutput>) -> Result<JobOutput> {
    std::panic::catch_unwind(AssertUnwindSafe(job))
        .unwrap_or_else(|panic| Err(Error::Crashed(crate::engine::events::panic_message(panic.as_ref()))))
}

/// The engine thread's state: the queue it reports to, the controls, and the cached predictor.
#[cfg(not(target_arch = "wasm32"))]
pub(super) struct Engine {
    pub(super) queue: Arc<ReportQueue>,
    pub(super) stop: StopSignal,
    pub(super) budget: LiveBudget,
    pub(super) predictor: Option<CachedPredictor>,
}

/// A predictor with what it was loaded from; reused while all three stay the same.
#[cfg(not(target_arch = "wasm32"))]
pub(super) struct CachedPredictor {
    model: PathBuf,
    device: DeviceChoice,
    modified: Option<SystemTime>,
    predictor: Predictor,
}

#[cfg(not(target_arch = "wasm32"))]
impl Engine {
    pub(super) fn run(&mut self, job: Job, notify: &(dyn Fn() + Send + Sync)) -> Result<JobOutput> {
        let queue = self.queue.clone();
        let mut sink = |e: Event| {
            queue.push(Report::Event(e));
            notify();
        };
        match job {
            Job::Train { mut request, splits, device } => {
                request.live_budget = Some(self.budget.clone());
                let summary = crate::train::train(&request, &device, &splits, &mut sink, &self.stop)?;
                Ok(JobOutput::Trained(Box::new(summary)))
            }
            job @ (Job::TrainInMemory { .. }
            | Job::PredictWith { .. }
            | Job::ExportModel { .. }
            | Job::DataHealth { .. }
            | Job::Thumbnails { .. }) => pollster::block_on(run_async(job, &mut sink, &self.stop)),
            Job::TrainInWorker(job) => {
                // Normally started on a supervisor thread by `Session::submit`.
                let end = crate::engine::worker::supervise(&job, &mut sink, &self.stop, &self.budget)?;
                Ok(JobOutput::TrainedInWorker(Box::new(end)))
            }
            Job::OverfitCheck { config, train, device, steps } => Ok(JobOutput::OverfitChecked(
                crate::train::overfit_check(&config, &device, &train, steps, &mut sink, &self.stop)?,
            )),
            Job::Evaluate { run, data, device } => {
                Ok(JobOutput::Evaluated(Box::new(crate::inference::eval::evaluate_run(&run, data, &device)?)))
            }
            Job::EvaluateExport { model, data, device, batch_size } => {
                let r = crate::inference::eval::evaluate_export(&model, data, &device, batch_size)?;
                Ok(JobOutput::Evaluated(Box::new(r)))
            }
            Job::Export { run, dir, options } => {
                Ok(JobOutput::Exported(crate::export::export_run_with(&run, &dir, &options)?))
            }
            Job::Predict { model, paths, top_k, device, thumbnails } => {
                let predictor = self.predictor_for(model, device)?;
                let files = paths.into_iter().map(|p| predict_file(predictor, p, top_k, thumbnails)).collect();
                Ok(JobOutput::Predicted(files))
            }
        }
    }

    /// The cached predictor of `model` on `device`, loaded when it is not the cached one or its
    /// weights file changed since (a new export).
    fn predictor_for(&mut self, model: PathBuf, device: DeviceChoice) -> Result<&Predictor> {
        let modified = crate::export::resolve_paths(&model)
            .ok()
            .and_then(|(weights, _)| weights.metadata().and_then(|m| m.modified()).ok());
        let fresh =
            self.predictor.as_ref().is_some_and(|c| c.model == model && c.device == device && c.modified == modified);
        if !fresh {
            self.predictor = None;
            let selected = crate::device::select(device)?;
            let predictor =
                Predictor::load(&model, selected.device.clone())?.with_buffer_limit(selected.buffer_limit());
            self.predictor = Some(CachedPredictor { model, device, modified, predictor });
        }
        match &self.predictor {
            Some(c) => Ok(&c.predictor),
            None => Err(Error::Crashed("the predictor cache is empty after loading".into())),
        }
    }
}

/// The jobs that run the same way on the engine thread (driven by `pollster::block_on`) and
/// in a page (awaited between the page's work): [`Job::TrainInMemory`], [`Job::PredictWith`],
/// [`Job::ExportModel`], [`Job::DataHealth`] and [`Job::Thumbnails`]. Every other job finishes with an error saying it is not available
/// in a browser (only a page hands it here).
pub(super) async fn run_async(job: Job, sink: EventSink<'_>, stop: &StopSignal) -> Result<JobOutput> {
    match job {
        Job::TrainInMemory { request, splits, device } => {
            let trained = crate::train::train_in_memory(&request, &splits, &device, sink, stop).await?;
            Ok(JobOutput::TrainedInMemory(Box::new(trained)))
        }
        Job::PredictWith { predictor, images, top_k, thumbnails } => {
            let mut files = Vec::with_capacity(images.len());
            for image in images {
                files.push(predict_image(&predictor, image, top_k, thumbnails).await);
            }
            Ok(JobOutput::Predicted(files))
        }
        Job::ExportModel { predictor, dir, options } => {
            let files = crate::export::model_files_async(predictor.model(), &predictor.metadata, &options).await?;
            match dir {
                // In a page, writing fails with an error naming the folder (wasm has no files).
                Some(dir) => Ok(JobOutput::Exported(crate::export::write_files(&dir, files)?)),
                None => Ok(JobOutput::ExportFiles(files)),
            }
        }
        Job::DataHealth { splits, data } => {
            Ok(JobOutput::DataHealth(Box::new(crate::data::health::scan(&splits, &data))))
        }
        Job::Thumbnails { sources } => {
            let load = crate::data::image_io::LoadOptions::default();
            let thumbnail = |source: &SampleSource| {
                let img = match source {
                    SampleSource::File(path) => {
                        crate::data::image_io::load_image_scaled(path, &load, THUMBNAIL_SIZE).ok()
                    }
                    SampleSource::Encoded { bytes, .. } => {
                        crate::data::image_io::decode_image_scaled(bytes, &load, THUMBNAIL_SIZE).ok()
                    }
                    SampleSource::Idx { images, index } => Some(images.rgb_image(*index)),
                }?;
                Some(image::imageops::thumbnail(&img, THUMBNAIL_SIZE, THUMBNAIL_SIZE))
            };
            Ok(JobOutput::Thumbnails(sources.iter().map(thumbnail).collect()))
        }
        other => Err(Error::Crashed(format!(
            "{:?} needs a disk, threads or processes: not available in a browser",
            other.kind()
        ))),
    }
}

/// Decodes, predicts and (when asked) thumbnails one file; a bad file gets its reason, not an
/// error.
#[cfg(not(target_arch = "wasm32"))]
fn predict_file(predictor: &Predictor, path: PathBuf, top_k: usize, thumbnails: bool) -> PredictedFile {
    pollster::block_on(predict_image(predictor, SampleSource::File(path), top_k, thumbnails))
}

/// Decodes (from its file or its bytes), predicts and (when asked) thumbnails one image; a bad
/// image gets its reason, not an error. The device read is awaited (a page runs meanwhile).
async fn predict_image(predictor: &Predictor, source: SampleSource, top_k: usize, thumbnails: bool) -> PredictedFile {
    let loaded = predictor.decode(&source);
    let path = match source {
        SampleSource::File(path) | SampleSource::Encoded { path, .. } => path,
        SampleSource::Idx { index, .. } => format!("idx image #{index}").into(),
    };
    let thumbnail = loaded
        .as_ref()
        .ok()
        .filter(|_| thumbnails)
        .map(|img| image::imageops::thumbnail(img, THUMBNAIL_SIZE, THUMBNAIL_SIZE));
    let result = match loaded {
        Ok(img) => predictor.probabilities_async(std::slice::from_ref(&img)).await.map(|p| predictor.top(&p[0], top_k)),
        Err(e) => Err(e),
    }
    .map_err(|e| match e {
        // The file is named: a preprocess failure is this image's fault.
        Error::Preprocess(m) => {
            Error::Image { path: path.clone(), fault: crate::data::image_io::ImageFault::Unusable(m) }.to_string()
        }
        other => other.to_string(),
    });
    PredictedFile { path, result, notices: predictor.take_notices(), thumbnail }
}
