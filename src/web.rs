//! The browser entry points (wasm32 only; issue "vramfit in the browser"). Two pages use them:
//!
//! - `web/app.html`: the egui app itself ([`start_app`]), the desktop app's panels and plots
//!   on a canvas, a thin client of one engine [`crate::engine::session::Session`] whose jobs run as
//!   tasks of the page ([`crate::engine::session::Job::TrainInMemory`]); its settings persist in the
//!   browser's local storage (eframe's storage, as the desktop app's in a file). [`app_train`],
//!   [`app_predict`], [`app_export`], [`app_select_preset`] and [`app_state`] are the hooks the headless test
//!   drives it with.
//! - `web/index.html`: a plain page around [`train_quickstart`] (train, evaluate, export as
//!   downloads) and [`predict`] (images picked or dropped on the page), the CI test's
//!   comparison with native `vramfit eval` / `predict`.
//!
//! Both train through [`train_in_memory`], the engine's loop without a run folder, whose device
//! reads are awaited, so the page keeps running while the device works.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

use burn::tensor::Device;
use wasm_bindgen::prelude::*;

use crate::config::{Config, Precision};
use crate::data::dataset::{self, SampleSource};
use crate::data::image_io::ImageFault;
use crate::device::{AdapterInfo, SelectedDevice};
use crate::engine::error::Error;
use crate::engine::events::{Event, StopSignal};
use crate::export;
use crate::gui::{AppOptions, InMemoryTraining, Settings, VramfitApp};
use crate::inference::predict::Predictor;
use crate::memory;
use crate::train::{InMemoryRequest, train_in_memory};

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
    let device = Device::wgpu_options().init_async().await.map_err(|e| js_error(format!("WebGPU: {e:?}")))?;
    let splits = dataset::open_bundled(&dataset::ScanOptions::of(&config, false)).map_err(js_error)?;
    // The epochs the steps span: the schedule spans whole epochs (as a native run capped with
    // --max-steps), so it decays to its end only when `steps` is a whole number of epochs.
    let mut config = config;
    let steps_per_epoch = crate::train::schedule::steps_per_epoch(splits.train.samples.len(), &config.train);
    config.train.epochs = (steps as usize).div_ceil(steps_per_epoch.max(1)).max(1);
    // The page plots every step's memory.
    config.train.memory_sample_every = 1;
    let mut request = InMemoryRequest::new(config.clone());
    request.max_steps = Some(steps as usize);
    let selected = SelectedDevice::on_adapter(device.clone(), adapter);
    // A step's memory is sampled after its first forward pass, before the step ends: the
    // callback goes with the step's own Step event.
    let mut memory = None;
    let mut sink = |e: Event| match e {
        Event::Memory { step, bytes_in_use, bytes_reserved, .. } => memory = Some((step, bytes_in_use, bytes_reserved)),
        Event::Step { step, loss, .. } => {
            if let Some((_, bytes_in_use, bytes_reserved)) = memory.filter(|m| m.0 == step) {
                let _ = on_step.call4(
                    &JsValue::NULL,
                    &JsValue::from(step as u32),
                    &JsValue::from(loss),
                    &JsValue::from(bytes_in_use as f64),
                    &JsValue::from(bytes_reserved as f64),
                );
            }
        }
        _ => {}
    };
    let trained =
        train_in_memory(&request, &splits, &selected, &mut sink, &StopSignal::new()).await.map_err(js_error)?;
    let val = trained.end.val.clone().ok_or_else(|| js_error("the run ended without an evaluation"))?;
    let files =
        export::model_files_async(&trained.model, &trained.metadata, &Default::default()).await.map_err(js_error)?;
    let files = files_object(files)?;
    // An image the adapter's buffers cannot hold is refused: a page has no memory for the CPU
    // copy native prediction would run it on (wasm's 4 GiB).
    let predictor =
        Predictor::from_model(trained.model, trained.metadata, device.clone()).with_buffer_limit(Some(limit));
    PREDICTOR.with(|p| *p.borrow_mut() = Some(Rc::new(predictor.without_cpu_fallback())));
    let json = serde_json::json!({
        "adapter": format!("{device:?}"),
        "losses": trained.losses,
        "top1": val.top1,
        "eval_images": val.samples,
    });
    let out = js_sys::Object::new();
    js_sys::Reflect::set(&out, &"result".into(), &json.to_string().into())?;
    js_sys::Reflect::set(&out, &"files".into(), &files)?;
    Ok(out)
}

/// The quickstart preset as the page trains it: f32 (browsers' WebGPU may lack f16), no
/// activation checkpointing.
fn quickstart_config() -> Result<Config, JsValue> {
    let mut config = crate::config::presets::load_config("quickstart").map_err(js_error)?;
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
    let image =
        predictor.decode(&SampleSource::Encoded { path: path.into(), bytes: bytes.into() }).map_err(js_error)?;
    // The file is named: a preprocess failure is this image's fault (as `vramfit predict` says).
    let named = |e: Error| match e {
        Error::Preprocess(m) => js_error(Error::Image { path: path.into(), fault: ImageFault::Unusable(m) }),
        other => js_error(format!("{name}: {other}")),
    };
    let probs = predictor.probabilities_async(std::slice::from_ref(&image)).await.map_err(named)?;
    let top = predictor.top(&probs[0], k as usize);
    serde_json::to_string(&top).map_err(js_error)
}

/// An export's files as a JS object `{ name: Uint8Array }`.
fn files_object(files: Vec<(&'static str, Vec<u8>)>) -> Result<js_sys::Object, JsValue> {
    let object = js_sys::Object::new();
    for (name, bytes) in files {
        js_sys::Reflect::set(&object, &name.into(), &js_sys::Uint8Array::from(bytes.as_slice()))?;
    }
    Ok(object)
}

thread_local! {
    /// The app [`start_app`] runs (a page has one thread), for [`app_train`] and [`app_state`].
    static APP: RefCell<Option<eframe::WebRunner>> = const { RefCell::new(None) };
}

/// Starts the egui app on the canvas with id `canvas_id`, training on the page's WebGPU
/// adapter: the adapter is asked for and its device made first (asynchronously, which the app's
/// constructor cannot), then the app opens with that adapter
/// as its one GPU and the bundled subset as its dataset. Settings come from and go to the browser's local storage.
///
/// # Errors
/// Rejects when there is no canvas of that id, the browser gives no WebGPU adapter, the device
/// cannot be made, or eframe cannot start (no WebGPU/WebGL context for the canvas).
#[wasm_bindgen]
pub async fn start_app(canvas_id: String) -> Result<(), JsValue> {
    log_panics();
    let adapter = browser_adapter().await?;
    let device = Device::wgpu_options().init_async().await.map_err(|e| js_error(format!("WebGPU: {e:?}")))?;
    // The app draws with WebGL and computes on WebGPU: Chromium's software WebGPU (SwiftShader,
    // headless) cannot present a WebGPU canvas ("Could not find SharedImageBackingFactory ...
    // WebgpuSwapChainTexture") and loses every WebGPU device of the page when asked to. egui's
    // few triangles do not miss WebGPU.
    let mut web_options = eframe::WebOptions::default();
    if let eframe::egui_wgpu::WgpuSetup::CreateNew(create) = &mut web_options.wgpu_options.wgpu_setup {
        create.instance_descriptor.backends = eframe::wgpu::Backends::GL;
    }
    let canvas = eframe::web_sys::window()
        .and_then(|w| w.document())
        .and_then(|d| d.get_element_by_id(&canvas_id))
        .and_then(|e| e.dyn_into::<eframe::web_sys::HtmlCanvasElement>().ok())
        .ok_or_else(|| js_error(format!("the page has no canvas with id `{canvas_id}`")))?;
    let runner = eframe::WebRunner::new();
    APP.with(|a| *a.borrow_mut() = Some(runner.clone()));
    let options = AppOptions { in_memory: Some(InMemoryTraining { gpu: Some(device) }), ..AppOptions::default() };
    runner
        .start(
            canvas,
            web_options,
            Box::new(move |cc| {
                let mut settings: Settings =
                    cc.storage.and_then(|s| eframe::get_value(s, eframe::APP_KEY)).unwrap_or_default();
                // A page has one adapter (index 0) and no folders: a stored folder is dropped.
                settings.data_dir = None;
                if settings.adapter.is_some() {
                    settings.adapter = Some(0);
                }
                let app = VramfitApp::with_adapters(settings, options, vec![adapter])
                    .map_err(|e| format!("cannot start the engine session: {e}"))?;
                Ok(Box::new(app))
            }),
        )
        .await
}

/// Runs `f` on the app [`start_app`] started.
fn with_app<T>(f: impl FnOnce(&mut VramfitApp) -> T) -> Result<T, JsValue> {
    APP.with(|a| {
        let runner = a.borrow();
        let runner = runner.as_ref().ok_or_else(|| js_error("the app has not started: call start_app first"))?;
        let mut app = runner.app_mut::<VramfitApp>().ok_or_else(|| js_error("the app is not running"))?;
        Ok(f(&mut app))
    })
}

/// Presses Train in the app with a cap of `max_steps` optimizer steps (0: no cap), as the
/// button does (the headless test's hook; the app must have started).
///
/// # Errors
/// Rejects when the app has not started.
#[wasm_bindgen]
pub fn app_train(max_steps: u32) -> Result<(), JsValue> {
    with_app(|app| {
        app.options_mut().max_steps = (max_steps > 0).then_some(max_steps as usize);
        app.apply(crate::gui::Command::Train);
    })
}

/// Picks the preset `name` (`configs/<name>.toml`, built in) in the app, as the preset picker
/// does (the headless test's hook; the settings then persist in local storage).
///
/// # Errors
/// Rejects when the app has not started; an unknown name shows in the app's error line.
#[wasm_bindgen]
pub fn app_select_preset(name: String) -> Result<(), JsValue> {
    with_app(|app| app.apply(crate::gui::Command::SelectPreset(name)))
}

/// Presses Export in the app, as the button does in a page: the model the last run trained
/// is offered as downloads (`model.bpk`, `model.safetensors`, `model.onnx`, `model.json`;
/// the headless test's hook).
///
/// # Errors
/// Rejects when the app has not started; the app shows "train a model first" when there is
/// no model.
#[wasm_bindgen]
pub fn app_export() -> Result<(), JsValue> {
    with_app(|app| app.apply(crate::gui::Command::Download))
}

/// Presses Choose folder in the app, as the button does in a page: the browser's folder dialog
/// opens (browsers show it within a user's click; a test driver intercepts it), and the picked
/// folder's files become the dataset ([`crate::data::dataset::from_files`]; the headless test's hook).
///
/// # Errors
/// Rejects when the app has not started.
#[wasm_bindgen]
pub fn app_choose_folder() -> Result<(), JsValue> {
    with_app(VramfitApp::choose_folder_in_page)
}

/// Drops an image file's bytes on the app (`name` is the file's name), as a browser's drop
/// does: the model the last run trained predicts it, and [`app_state`]'s `predictions` shows
/// the result (the headless test's hook).
///
/// # Errors
/// Rejects when the app has not started; the app shows "train first" when there is no model.
#[wasm_bindgen]
pub fn app_predict(name: String, bytes: Vec<u8>) -> Result<(), JsValue> {
    let image = SampleSource::Encoded { path: name.into(), bytes: bytes.into() };
    with_app(|app| app.apply(crate::gui::Command::PredictImages(vec![image])))
}

/// What the app shows, as a JSON string: `{"status", "error", "training", "device", "steps",
/// "losses": [..], "memory_points", "reserved_mib", "predicted_mib", "val_accuracy",
/// "eval_images", "preset", "dataset", "classes", "train_images", "val_images", "data_error",
/// "batch_size", "predicting", "predictions": [{"file", "top",
/// "error"}, ..]}` (newest prediction first; `losses` per step, `reserved_mib` the last
/// reserved-bytes sample, `val_accuracy` of the last evaluation, 0..1, or null, on
/// `eval_images` images).
///
/// # Errors
/// Rejects when the app has not started.
#[wasm_bindgen]
pub fn app_state() -> Result<String, JsValue> {
    with_app(|app| {
        let h = app.history();
        serde_json::json!({
            "status": app.status(),
            "error": app.error(),
            "training": app.training(),
            "device": app.device_label(),
            "steps": h.last_step,
            "losses": h.loss.iter().map(|p| p[1]).collect::<Vec<_>>(),
            "memory_points": h.reserved_mib.len(),
            "reserved_mib": h.reserved_mib.last().map(|p| p[1]),
            "predicted_mib": h.predicted_mib(),
            "val_accuracy": app.evaluation().map(|e| e.top1),
            "eval_images": app.evaluation().map(|e| e.samples),
            "preset": app.settings().preset,
            "dataset": app.files_dataset().unwrap_or("bundled"),
            "classes": app.data().ok().map(|d| d.train.class_names.clone()),
            "train_images": app.data().ok().map(|d| d.train.samples.len()),
            "val_images": app.data().ok().map(|d| d.val.samples.len()),
            "data_error": app.data().err(),
            "batch_size": app.settings().config.train.batch_size,
            "predicting": app.busy() && !app.training(),
            "predictions": app.predictions().iter().map(|p| serde_json::json!({
                "file": p.path.display().to_string(),
                "top": p.result.as_ref().ok(),
                "error": p.result.as_ref().err(),
            })).collect::<Vec<_>>(),
        })
        .to_string()
    })
}
