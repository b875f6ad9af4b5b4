//! The browser entry point (wasm32 only; issue "vramfit in the browser"): trains the quickstart
//! preset on the bundled Fashion-MNIST subset on the page's WebGPU adapter, evaluates it and
//! exports it, through the same [`Trainer::step_async`], [`eval::evaluate_async`] and
//! [`export::export_files`] the native engine uses. Here the device reads are awaited, so the
//! page keeps running while the device works.
//!
//! After training, [`predict`] classifies images dropped on the page with the trained model
//! through the same decoding and preprocessing as native `vramfit predict`
//! ([`Predictor::decode_image`], [`Predictor::probabilities_async`]).
//!
//! This is the first slice of the web build: functions the page calls (`web/index.html`),
//! not yet the egui app nor the engine session (no run folder: the export is the result).

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

use burn::module::Module;
use burn::tensor::Device;
use wasm_bindgen::prelude::*;

use crate::config::{Config, Precision};
use crate::dataset::{self, Dataset};
use crate::device::AdapterInfo;
use crate::error::Error;
use crate::eval;
use crate::events::Event;
use crate::export::{self, ModelMetadata, TrainingInfo};
use crate::image_io::ImageFault;
use crate::infer::Predictor;
use crate::loader::{self, Pass, SamplePipeline};
use crate::memory;
use crate::model::Classifier;
use crate::trainer::Trainer;

const TRAIN_IMAGES: &[u8] = include_bytes!("../assets/fashion-mnist-subset/train-images-idx3-ubyte.gz");
const TRAIN_LABELS: &[u8] = include_bytes!("../assets/fashion-mnist-subset/train-labels-idx1-ubyte.gz");
const TEST_IMAGES: &[u8] = include_bytes!("../assets/fashion-mnist-subset/t10k-images-idx3-ubyte.gz");
const TEST_LABELS: &[u8] = include_bytes!("../assets/fashion-mnist-subset/t10k-labels-idx1-ubyte.gz");
/// Classes of the bundled data (Fashion-MNIST).
const CLASSES: usize = dataset::FASHION_MNIST_CLASSES.len();

thread_local! {
    /// The model [`train_quickstart`] trained last, for [`predict`] (a page has one thread).
    static PREDICTOR: RefCell<Option<Rc<Predictor>>> = const { RefCell::new(None) };
}

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(message: &str);
    #[wasm_bindgen(js_namespace = console, js_name = warn)]
    fn console_warn(message: &str);
}

/// Warnings and errors of the `log` crate, to the page's console: cubecl reports a shader the
/// browser refused only there (cubecl issue 1641).
struct ConsoleLog;

impl log::Log for ConsoleLog {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::Level::Warn
    }
    fn log(&self, record: &log::Record) {
        let message = format!("{} {}: {}", record.level(), record.target(), record.args());
        match record.level() {
            log::Level::Error => console_error(&message),
            log::Level::Warn => console_warn(&message),
            _ => {}
        }
    }
    fn flush(&self) {}
}

/// Panics and `log` warnings show in the page's console with their message (a panic in wasm is
/// otherwise only an `unreachable` trap).
fn log_panics() {
    std::panic::set_hook(Box::new(|info| console_error(&format!("vramfit panicked: {info}"))));
    if log::set_logger(&ConsoleLog).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
}

fn js_error(e: impl std::fmt::Display) -> JsValue {
    JsValue::from_str(&e.to_string())
}

/// One split of the bundled subset from the bytes built into the page.
fn bundled(images: &[u8], labels: &[u8], name: &str) -> crate::Result<Dataset> {
    let dir = Path::new("assets/fashion-mnist-subset");
    let (imgs, labs) = crate::idx::parse_pair(
        images.to_vec(),
        labels.to_vec(),
        &dir.join(format!("{name}-images-idx3-ubyte.gz")),
        &dir.join(format!("{name}-labels-idx1-ubyte.gz")),
    )?;
    let classes = dataset::FASHION_MNIST_CLASSES.iter().map(|s| s.to_string()).collect();
    dataset::idx_dataset(imgs, &labs, classes, dir)
}

/// Trains quickstart for `steps` optimizer steps (f32: browsers' WebGPU may lack f16) on the
/// page's WebGPU adapter, calling `on_step(step, loss, bytes_in_use, bytes_reserved)` after each,
/// then evaluates on the bundled test images and exports the weights. Resolves to an object
/// `{ result, files }`: `result` a JSON string `{"adapter", "losses": [..], "top1",
/// "eval_images"}`, `files` the export's files by name (`model.bpk`, `model.safetensors`,
/// `model.onnx`, `model.json`) as `Uint8Array`s, what native `vramfit export` writes.
///
/// # Errors
/// Rejects with a message when WebGPU cannot start, one micro-batch's largest tensor does not
/// fit the adapter's buffer limit ([`memory::check_buffer_limit`], before anything is
/// allocated), the data does not parse, a step fails or the weights cannot be read back.
#[wasm_bindgen]
pub async fn train_quickstart(steps: u32, on_step: js_sys::Function) -> Result<js_sys::Object, JsValue> {
    log_panics();
    let config = quickstart_config()?;
    let adapter = browser_adapter().await?;
    let limit = adapter.buffer_limit();
    let px = config.image_size_px();
    memory::check_buffer_limit(&config.model, CLASSES, (px, px), config.train.batch_size, limit, &adapter.name)
        .map_err(js_error)?;
    let device = Device::wgpu_options().init_async().await.map_err(|e| js_error(format!("WebGPU: {e:?}")))?;
    let train = Arc::new(bundled(TRAIN_IMAGES, TRAIN_LABELS, "train").map_err(js_error)?);
    let test = Arc::new(bundled(TEST_IMAGES, TEST_LABELS, "t10k").map_err(js_error)?);
    let batch_size = config.train.batch_size;
    let steps_per_epoch = train.samples.len().div_ceil(batch_size);
    let mut trainer =
        Trainer::new(&config, Precision::F32, &device, train.class_names.clone(), steps as usize, steps_per_epoch);
    let pipeline = Arc::new(SamplePipeline::from_config(&config, true).with_device_augment(false));
    let mut losses = Vec::new();
    let mut sink = |_e: Event| {};
    let (mut epoch, mut batches, mut steps_at_epoch_start) = (0u64, None, 0);
    while trainer.state.global_step < steps as usize {
        let batch = match batches.as_mut().and_then(Iterator::next) {
            Some(batch) => batch,
            None => {
                if epoch > 0 && trainer.state.global_step == steps_at_epoch_start {
                    return Err(js_error("a whole epoch gave no trainable batch"));
                }
                steps_at_epoch_start = trainer.state.global_step;
                let pass = Pass::training_epoch(train.samples.len(), batch_size, config.seed, epoch, 0);
                batches = Some(loader::batches_on_this_thread(train.clone(), pipeline.clone(), pass));
                epoch += 1;
                continue;
            }
        };
        let stats = trainer
            .step_async(std::slice::from_ref(&batch), false, &mut sink)
            .await
            .map_err(|e| js_error(step_error(e)))?;
        if !stats.applied || stats.images == 0 {
            continue;
        }
        trainer.state.global_step += 1;
        let step = trainer.state.global_step;
        if step == 1 {
            // As the native loop does after its first step: the pages that step's first use of
            // each kernel held go back, so the page holds the plan's steady state.
            device.memory_cleanup();
        }
        let (in_use, reserved) = device.memory_pool_usage().map_or((0, 0), |u| (u.bytes_in_use, u.bytes_reserved));
        losses.push(stats.loss);
        let _ = on_step.call4(
            &JsValue::NULL,
            &JsValue::from(step as u32),
            &JsValue::from(stats.loss),
            &JsValue::from(in_use as f64),
            &JsValue::from(reserved as f64),
        );
    }
    evaluate_and_export(&trainer, &config, &device, test, limit, steps_per_epoch, losses).await
}

/// After training: evaluates the model on `test`, makes the export's files, and keeps the
/// model for [`predict`]. Resolves to what [`train_quickstart`] resolves to.
async fn evaluate_and_export(
    trainer: &Trainer,
    config: &Config,
    device: &Device,
    test: Arc<Dataset>,
    limit: u64,
    steps_per_epoch: usize,
    losses: Vec<f32>,
) -> Result<js_sys::Object, JsValue> {
    let settings = eval::EvalSettings {
        model: &config.model,
        batch_size: config.train.batch_size,
        precision: Precision::F32,
        workers: 0,
        buffer_limit: Some(limit),
    };
    let eval_pipe = Arc::new(SamplePipeline::from_config(config, false));
    let valid = trainer.model().valid();
    let result = eval::evaluate_async(&valid, test, eval_pipe, device, &settings).await.map_err(js_error)?;
    let training = TrainingInfo {
        // Completed epochs: a pass cut short by the step count does not count.
        epochs: trainer.state.global_step / steps_per_epoch.max(1),
        steps: trainer.state.global_step,
        val_accuracy: Some(result.top1),
        device: format!("{device:?}"),
    };
    let files = export_files(&valid, config, &trainer.state.class_names, &training).await?;
    let metadata = ModelMetadata::new(config, &trainer.state.class_names, valid.num_params(), training);
    // An image the adapter's buffers cannot hold is refused: a page has no memory for the CPU
    // copy native prediction would run it on (wasm's 4 GiB).
    let predictor = Predictor::from_model(valid, metadata, device.clone()).with_buffer_limit(Some(limit));
    PREDICTOR.with(|p| *p.borrow_mut() = Some(Rc::new(predictor.without_cpu_fallback())));
    let json = serde_json::json!({
        "adapter": format!("{device:?}"),
        "losses": losses,
        "top1": result.top1,
        "eval_images": result.samples,
    });
    let out = js_sys::Object::new();
    js_sys::Reflect::set(&out, &"result".into(), &json.to_string().into())?;
    js_sys::Reflect::set(&out, &"files".into(), &files)?;
    Ok(out)
}

/// The quickstart preset as the page trains it: f32 (browsers' WebGPU may lack f16), no
/// activation checkpointing.
fn quickstart_config() -> Result<Config, JsValue> {
    let mut config = crate::presets::load_config("quickstart").map_err(js_error)?;
    config.train.precision = Precision::F32;
    config.train.checkpointing = false;
    Ok(config)
}

/// The page's WebGPU adapter, or why there is none.
async fn browser_adapter() -> Result<AdapterInfo, JsValue> {
    crate::device::browser_adapter().await.ok_or_else(|| js_error("WebGPU: this browser gives no adapter"))
}

/// What the page will train with, before it trains: the adapter (`max_buffer_size`,
/// `max_storage_buffer_binding_size` and `shader_f16` as the browser reports them) and the
/// memory plan of the quickstart preset as [`train_quickstart`] runs it. Resolves to a JSON
/// string `{"adapter": {..}, "batch_size", "image_px", "precision", "predicted_peak_bytes",
/// "peak_in_use_bytes", "largest_tensor_bytes", "buffer_limit_bytes", "buffer_check"}`, where
/// `buffer_check` is `"ok"` or the refusal [`train_quickstart`] would give.
///
/// # Errors
/// Rejects when the browser gives no WebGPU adapter or the preset does not load.
#[wasm_bindgen]
pub async fn quickstart_plan() -> Result<String, JsValue> {
    log_panics();
    let config = quickstart_config()?;
    let adapter = browser_adapter().await?;
    let limit = adapter.buffer_limit();
    let px = config.image_size_px();
    let batch_size = config.train.batch_size;
    let estimate = memory::estimate(&config, batch_size, CLASSES);
    let check = memory::check_buffer_limit(&config.model, CLASSES, (px, px), batch_size, limit, &adapter.name);
    let json = serde_json::json!({
        "adapter": adapter,
        "batch_size": batch_size,
        "image_px": px,
        "precision": "f32",
        "predicted_peak_bytes": estimate.total,
        "peak_in_use_bytes": estimate.peak_in_use,
        "largest_tensor_bytes": memory::inference_bytes_per_image(&config.model, CLASSES, (px, px)) * batch_size as u64,
        "buffer_limit_bytes": limit,
        "buffer_check": check.map_or_else(|e| e.to_string(), |()| "ok".to_string()),
    });
    Ok(json.to_string())
}

/// The top-`k` classes of an image file's bytes (`name` is the file's name, for errors) under
/// the model [`train_quickstart`] trained last, on the page's WebGPU device: decoded, resized and
/// cropped as `vramfit predict` does with that model's export. Resolves to a JSON string
/// `[{"index", "name", "probability"}, ...]`, most probable first, the `top` of `vramfit predict
/// --json`.
///
/// # Errors
/// Rejects with a message when nothing has been trained yet, and with one naming the file when
/// the bytes are not an image vramfit reads (with the fault), the image's input tensor exceeds the adapter's
/// per-buffer limit (mode `none` runs an image at its own size), or the device fails.
#[wasm_bindgen]
pub async fn predict(bytes: Vec<u8>, name: String, k: u32) -> Result<String, JsValue> {
    let predictor =
        PREDICTOR.with(|p| p.borrow().clone()).ok_or_else(|| js_error("nothing to predict with yet: train first"))?;
    let path = Path::new(&name);
    let image = predictor.decode_image(&bytes, path).map_err(js_error)?;
    // The file is named: a preprocess failure is this image's fault (as `vramfit predict` says).
    let named = |e: Error| match e {
        Error::Preprocess(m) => js_error(Error::Image { path: path.into(), fault: ImageFault::Unusable(m) }),
        other => js_error(format!("{name}: {other}")),
    };
    let probs = predictor.probabilities_async(std::slice::from_ref(&image)).await.map_err(named)?;
    let top = predictor.top(&probs[0], k as usize);
    serde_json::to_string(&top).map_err(js_error)
}

/// `model`'s export files (`{ name: Uint8Array }`), made from a copy of it on the CPU: the
/// weights are read back in one awaited transfer ([`export::host_copy_async`]), then serialized
/// as native export does.
async fn export_files(
    model: &Classifier,
    config: &Config,
    classes: &[String],
    training: &TrainingInfo,
) -> Result<js_sys::Object, JsValue> {
    let host = export::host_copy_async(model, &Device::flex()).await.map_err(js_error)?;
    let files = js_sys::Object::new();
    for (name, bytes) in
        export::export_files(&host, config, classes, training, &Default::default()).map_err(js_error)?
    {
        js_sys::Reflect::set(&files, &name.into(), &js_sys::Uint8Array::from(bytes.as_slice()))?;
    }
    Ok(files)
}

fn step_error(e: crate::trainer::StepError) -> String {
    match e {
        crate::trainer::StepError::Device(m) => format!("device: {m}"),
        crate::trainer::StepError::Fatal(e) => e.to_string(),
    }
}
