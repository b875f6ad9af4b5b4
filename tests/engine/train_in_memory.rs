//! Training without a run folder (`vramfit::train_in_memory`), the browser's loop, run natively
//! on flex through the engine session and through the app, as the page runs it on WebGPU.

use std::sync::Arc;

use egui_kittest::Harness;
use vramfit::engine::session::{Job, JobOutput, Session};
use vramfit::gui::{AppOptions, Command, InMemoryTraining, Settings, VramfitApp};
use vramfit::train::InMemoryRequest;

use super::*;

/// Two epochs of quickstart on 640 bundled images through the session: the events come in the
/// run-folder loop's order (Started, a Step and a Memory sample per step, an EpochEnd per epoch,
/// Finished), the model learns (validation accuracy well over chance, the end's accuracy the
/// last epoch's), nothing is written to disk, and the returned model predicts as the
/// evaluation says.
#[test]
fn in_memory_training_learns_and_reports_as_the_run_folder_loop_does() {
    let mut splits = bundled();
    splits.train.samples.truncate(640);
    splits.val.samples.truncate(300);
    let val = splits.val.clone();
    let mut config = quickstart();
    config.train.epochs = 2;
    config.train.batch_size = 32;
    config.train.memory_sample_every = 1;
    let request = InMemoryRequest::new(config);
    let session = Session::start(|| {}).unwrap();
    let flex = SelectedDevice::on_cpu(CpuBackend::Flex);
    let job = Job::TrainInMemory { request: Box::new(request), splits: Box::new(splits), device: flex };
    let mut events = Vec::new();
    let output = session.run(job, &mut |e| events.push(e)).unwrap();
    let JobOutput::TrainedInMemory(trained) = output else { panic!("not a trained model: {output:?}") };
    let steps_per_epoch = 640 / 32;
    assert!(matches!(events.first(), Some(Event::Started { steps_per_epoch: 20, epochs: 2, samples: (640, 300), .. })));
    assert!(matches!(events.last(), Some(Event::Finished(end)) if *end == trained.end));
    let steps: Vec<usize> =
        events.iter().filter_map(|e| if let Event::Step { step, .. } = e { Some(*step) } else { None }).collect();
    assert_eq!(steps, (1..=2 * steps_per_epoch).collect::<Vec<_>>());
    // Memory is sampled where the device has pools to read; flex has none.
    let memory = events.iter().filter(|e| matches!(e, Event::Memory { .. })).count();
    assert!(CpuBackend::Flex.device().memory_pool_usage().is_none(), "flex has pools now: sample it");
    assert_eq!(memory, 0);
    let val_accuracy: Vec<f32> = events
        .iter()
        .filter_map(|e| if let Event::EpochEnd { val_accuracy, .. } = e { Some(*val_accuracy) } else { None })
        .collect();
    assert_eq!(val_accuracy.len(), 2);
    let end = &trained.end;
    assert!(!end.stopped && end.epochs_completed == 2 && end.global_step == 40 && end.export_dir.is_none());
    let top1 = end.val.as_ref().unwrap().top1;
    assert_eq!(top1, val_accuracy[1], "the end's accuracy is the last epoch's");
    assert!(top1 > 0.4, "2 epochs on 640 images: {top1} (chance 0.1)");
    let losses = &trained.losses;
    let mean = |xs: &[f32]| xs.iter().sum::<f32>() / xs.len() as f32;
    assert!(mean(&losses[30..]) < mean(&losses[..10]) - 0.3, "loss fell: {losses:?}");
    assert_eq!((trained.metadata.training.steps, trained.metadata.class_names.len()), (40, 10));
    // The model handed back is the one evaluated: the same top-1 on the same images.
    let config = quickstart();
    let settings = vramfit::inference::eval::EvalSettings {
        model: &config.model,
        batch_size: 32,
        precision: config.train.precision,
        workers: 0,
        buffer_limit: None,
        keep_probabilities: false,
    };
    let pipeline = Arc::new(SamplePipeline::from_config(&config, false));
    let device = CpuBackend::Flex.device();
    let again = vramfit::inference::eval::evaluate(&trained.model, Arc::new(val), pipeline, &device, &settings);
    let again = pollster::block_on(again).unwrap();
    assert!((again.top1 - top1).abs() < 1e-6, "{} against {top1}", again.top1);
}

/// A step cap ends the run inside its first epoch as stopped, evaluated at the cap; a stop set
/// before the run ends it at once; a cap on an epoch's last step still completes that epoch.
#[test]
fn in_memory_training_stops_at_the_step_cap_and_at_a_stop() {
    let mut splits = bundled();
    let mut config = quickstart();
    config.train.batch_size = 16;
    splits.val.samples.truncate(64);
    let device = SelectedDevice::on_cpu(CpuBackend::Flex);
    let mut request = InMemoryRequest::new(config);
    request.max_steps = Some(3);
    let mut sink = |_: Event| {};
    let no_stop = StopSignal::new();
    let run = vramfit::train::train_in_memory(&request, &splits, &device, &mut sink, &no_stop);
    let trained = pollster::block_on(run).unwrap();
    assert!(trained.end.stopped && trained.end.global_step == 3 && trained.end.epochs_completed == 0);
    assert_eq!(trained.end.val.as_ref().unwrap().samples, 64, "evaluated at the cap");
    let stop = StopSignal::new();
    stop.stop();
    let run = vramfit::train::train_in_memory(&request, &splits, &device, &mut sink, &stop);
    let trained = pollster::block_on(run).unwrap();
    assert!(trained.end.stopped && trained.end.global_step == 0);
    // A cap on an epoch's last step: that epoch ends (evaluated, completed), the run is stopped.
    let mut small = splits.clone();
    small.train.samples.truncate(64);
    request.config.train.epochs = 2;
    request.max_steps = Some(4); // 64 images / batch 16 = one epoch
    let mut epoch_ends = 0;
    let mut count = |e: Event| epoch_ends += usize::from(matches!(e, Event::EpochEnd { .. }));
    let run = vramfit::train::train_in_memory(&request, &small, &device, &mut count, &no_stop);
    let end = pollster::block_on(run).unwrap().end;
    assert_eq!((end.stopped, end.global_step, end.epochs_completed, epoch_ends), (true, 4, 1, 1));
}

/// The app predicts with the model its in-memory run kept: two files, a text file (refused,
/// named) and a browser drop's bytes.
fn predicts_files_and_dropped_bytes(harness: &mut egui_kittest::Harness<'_, VramfitApp>, dir: &Path) {
    // Images predicted with the model the run kept: files, and a browser drop's bytes.
    let pngs = bundled_test_pngs(&dir.join("images"), 2);
    let mut images: Vec<PathBuf> = pngs.read_dir().unwrap().map(|e| e.unwrap().path()).collect();
    let text = dir.join("notes.txt");
    std::fs::write(&text, "not an image\n").unwrap();
    images.push(text);
    let dropped = std::fs::read(&images[0]).unwrap();
    harness.state_mut().apply(Command::Predict(images));
    let input = vramfit::data::dataset::SampleSource::Encoded { path: "dropped.png".into(), bytes: dropped.into() };
    harness.state_mut().apply(Command::PredictImages(vec![input]));
    step_until(harness, "the predictions", |a| !a.busy() && a.predictions().len() == 4);
    for p in harness.state().predictions() {
        match (&p.result, p.path.ends_with("notes.txt")) {
            (Err(e), true) => assert!(e.contains("notes.txt"), "{e}"),
            (Ok(top), false) => assert!(top.len() == 5 && top[0].probability >= top[4].probability, "{top:?}"),
            other => panic!("{}: {other:?}", p.path.display()),
        }
    }
}

/// The app as the browser page runs it (`AppOptions::in_memory`), on the GPU as the page does
/// (lavapipe in CI; flex where there is no adapter): Train runs the capped run in memory, its
/// steps and memory samples reach the plots, the status says it stopped at the cap, Resume says
/// why it cannot, and no run folder appears. Export writes the model it kept into a folder
/// (what a page offers as downloads), and those files evaluate to the app's accuracy.
#[test]
fn gui_trains_in_memory_as_the_browser_app_does() {
    let dir = tempfile::tempdir().unwrap();
    let gpu = gpu();
    let adapter = gpu.as_ref().and_then(|g| g.adapter.as_ref()).map(|a| a.index);
    let options = AppOptions {
        runs_dir: dir.path().join("runs"),
        max_steps: Some(4),
        in_memory: Some(InMemoryTraining { gpu: gpu.as_ref().map(|g| g.device.clone()) }),
        ..AppOptions::default()
    };
    let settings = Settings { adapter, cpu_backend: CpuBackend::Flex, ..Settings::default() };
    let mut app = VramfitApp::with_options(settings, options);
    app.apply(Command::Train);
    assert!(app.training(), "{:?}", app.error());
    let mut harness =
        Harness::builder().with_size([1280.0, 820.0]).build_ui_state(|ui, app: &mut VramfitApp| app.ui(ui), app);
    step_until(&mut harness, "the in-memory run", |a| !a.training());
    let app = harness.state();
    assert_eq!(app.error(), None);
    let h = app.history();
    let samples = if gpu.is_some() { 4 } else { 0 }; // flex has no pools to read
    assert_eq!((h.last_step, h.loss.len(), h.reserved_mib.len()), (4, 4, samples));
    assert!(h.reserved_mib.iter().all(|p| p[1] > 0.0));
    // The run's own plan reached the app, and it is the plan of the settings it trained.
    assert_eq!(h.plan.as_ref(), Some(app.plan()));
    assert!(h.predicted_mib().is_some_and(|p| p > 0.0));
    assert!(app.status().starts_with("stopped at step 4"), "{}", app.status());
    assert!(app.evaluation().is_some_and(|e| e.samples == bundled().val.samples.len()));
    assert!(!dir.path().join("runs").exists(), "a run kept in memory writes no folder");
    predicts_files_and_dropped_bytes(&mut harness, dir.path());
    harness.state_mut().apply(Command::Resume);
    assert!(harness.state().error().is_some_and(|e| e.contains("Resume needs a run folder")));
    // Export: downloads exist in a browser only; a folder gets every file.
    harness.state_mut().apply(Command::Download);
    step_until(&mut harness, "the refused download", |a| !a.busy());
    assert!(
        harness.state().error().is_some_and(|e| e.contains("choose an export folder")),
        "{:?}",
        harness.state().error()
    );
    let export = dir.path().join("export");
    harness.state_mut().apply(Command::Export(export.clone()));
    step_until(&mut harness, "the export", |a| !a.busy());
    let app = harness.state();
    assert!(app.status().starts_with("exported 4 files"), "{} / {:?}", app.status(), app.error());
    let mut names: Vec<String> =
        export.read_dir().unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, ["model.bpk", "model.json", "model.onnx", "model.safetensors"]);
    // The exported weights give the app's evaluation on the same images and device (one
    // borderline image may round the other way: the export is re-read as f32 master weights).
    let device = match gpu {
        Some(g) => g,
        None => vramfit::device::select(DeviceChoice::Cpu(CpuBackend::Flex)).unwrap(),
    };
    let shown = app.evaluation().unwrap().clone();
    for weights in ["model.bpk", "model.safetensors"] {
        let again =
            vramfit::inference::eval::evaluate_export(&export.join(weights), bundled().val, &device, 32).unwrap();
        assert_eq!(again.samples, shown.samples);
        let one_image = 1.0 / shown.samples as f32;
        assert!(
            (again.top1 - shown.top1).abs() <= one_image + 1e-6,
            "{weights}: {} against {}",
            again.top1,
            shown.top1
        );
    }
}

/// A folder's files handed over in memory, as a page's folder dialog hands them
/// (`Command::UseFiles`): two classes of bundled images as PNG bytes, OS junk, a text file and
/// a file that is not an image. The scan takes the classes and ignores the junk; the run trains
/// on them in memory and learns to tell the two apart; the broken file is skipped, named.
/// Choosing the bundled data afterwards drops the files.
#[test]
fn gui_trains_in_memory_on_a_folders_files_handed_over() {
    let splits = bundled();
    let pipe = SamplePipeline::from_config(&quickstart(), false);
    let mut files: Vec<(PathBuf, Arc<[u8]>)> = Vec::new();
    for (class, label) in [("Trouser", 1), ("Bag", 8)] {
        for (i, s) in splits.train.samples.iter().filter(|s| s.label == label).take(50).enumerate() {
            let mut png = std::io::Cursor::new(Vec::new());
            pipe.decode(&s.source).unwrap().write_to(&mut png, image::ImageFormat::Png).unwrap();
            files.push((PathBuf::from(format!("{class}/{i:03}.png")), Arc::from(png.into_inner())));
        }
    }
    for (junk, bytes) in [("Bag/broken.png", "not a png"), ("Bag/.DS_Store", "junk"), ("notes.txt", "about")] {
        files.push((PathBuf::from(junk), Arc::from(bytes.as_bytes())));
    }
    let dir = tempfile::tempdir().unwrap();
    let options = AppOptions {
        runs_dir: dir.path().join("runs"),
        in_memory: Some(InMemoryTraining { gpu: None }),
        ..AppOptions::default()
    };
    let mut config = quickstart();
    config.train.epochs = 4;
    config.train.batch_size = 16;
    let settings = Settings { adapter: None, cpu_backend: CpuBackend::Flex, config, ..Settings::default() };
    let mut app = VramfitApp::with_options(settings, options);
    app.apply(Command::UseFiles { root: "my-photos".into(), files });
    let data = app.data().unwrap();
    assert_eq!(data.train.class_names, ["Bag", "Trouser"]);
    assert_eq!((data.train.samples.len() + data.val.samples.len(), data.val.samples.len()), (101, 10));
    let ignored: Vec<String> = data.report.ignored.iter().map(|(p, _)| p.display().to_string()).collect();
    assert_eq!(ignored, ["my-photos/Bag/.DS_Store", "my-photos/notes.txt"]);
    let broken_in_train = data.train.samples.iter().any(|s| s.source.describe().ends_with("broken.png"));
    assert_eq!((app.files_dataset(), app.status()), (Some("my-photos"), "dataset my-photos: 2 classes, 101 images"));
    app.apply(Command::Train);
    assert!(app.training(), "{:?}", app.error());
    let mut harness =
        Harness::builder().with_size([1280.0, 820.0]).build_ui_state(|ui, app: &mut VramfitApp| app.ui(ui), app);
    step_until(&mut harness, "the run on the handed-over files", |a| !a.training());
    let app = harness.state();
    assert_eq!(app.error(), None);
    assert!(app.status().starts_with("done"), "{}", app.status());
    let h = app.history();
    let mean = |xs: &[[f64; 2]]| xs.iter().map(|p| p[1]).sum::<f64>() / xs.len() as f64;
    assert!(mean(&h.loss[h.loss.len() - 4..]) < mean(&h.loss[..4]) - 0.2, "loss fell: {:?}", h.loss);
    let e = app.evaluation().unwrap();
    assert!(e.top1 >= 0.8, "trousers against bags after 4 epochs: top-1 {}", e.top1);
    // The seeded split puts the broken file among the training images, where the loader skips
    // it with its reason.
    assert!(broken_in_train, "the split moved broken.png into validation: pick another file name");
    let skipped = h.skipped_files.iter().any(|(f, why)| f.ends_with("broken.png") && why.contains("not an image"));
    assert!(skipped, "{:?}", h.skipped_files);
    // The bundled data replaces the files.
    harness.state_mut().apply(Command::SetDataDir(None));
    let app = harness.state();
    assert_eq!((app.files_dataset(), app.data().unwrap().train.class_names.len()), (None, 10));
}

/// The event kinds of a run, in order, without the run folder's own ([`Event::Checkpoint`]).
fn event_kinds(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter(|e| !matches!(e, Event::Checkpoint { .. }))
        .map(|e| format!("{e:?}").split([' ', '(', '{']).next().unwrap_or_default().to_string())
        .collect()
}

/// One tiny config through both stores of the one run loop: a run folder ([`train::train`])
/// and memory ([`vramfit::train::train_in_memory`]). The event streams match kind by kind (the
/// folder's checkpoints aside), with the same step numbers, and where the device computes
/// deterministically the same losses.
fn both_stores_report_the_same_run(device: &SelectedDevice) {
    let mut splits = bundled();
    splits.train.samples.truncate(96);
    splits.val.samples.truncate(48);
    let mut config = quickstart();
    config.train.epochs = 2;
    config.train.batch_size = 16;
    config.train.grad_accum_steps = 2;
    config.train.memory_sample_every = 2;
    let dir = tempfile::tempdir().unwrap();
    let mut folder_events = Vec::new();
    let req = TrainRequest::new(config.clone(), dir.path().join("run"));
    let summary = train::train(&req, device, &splits, &mut |e| folder_events.push(e), &StopSignal::new()).unwrap();
    let mut memory_events = Vec::new();
    let request = InMemoryRequest::new(config);
    let mut sink = |e| memory_events.push(e);
    let no_stop = StopSignal::new();
    let trained = pollster::block_on(train::train_in_memory(&request, &splits, device, &mut sink, &no_stop)).unwrap();
    assert_eq!(event_kinds(&folder_events), event_kinds(&memory_events));
    let kinds = event_kinds(&memory_events);
    assert_eq!(kinds.iter().filter(|k| *k == "Step").count(), 6, "96 images / (16 x 2) = 3 steps an epoch: {kinds:?}");
    assert_eq!(kinds.iter().filter(|k| *k == "EpochEnd").count(), 2);
    let samples = if device.is_gpu() { 3 } else { 0 }; // steps 1, 3, 5 (every 2nd, from 0)
    assert_eq!(kinds.iter().filter(|k| *k == "Memory").count(), samples, "{kinds:?}");
    assert!(folder_events.iter().any(|e| matches!(e, Event::Checkpoint { .. })), "the folder's checkpoints");
    let steps = |events: &[Event]| -> Vec<(usize, usize)> {
        events
            .iter()
            .filter_map(|e| if let Event::Step { step, epoch, .. } = e { Some((*step, *epoch)) } else { None })
            .collect()
    };
    assert_eq!(steps(&folder_events), steps(&memory_events));
    assert_eq!((summary.global_step, trained.end.global_step), (6, 6));
    assert_eq!((summary.epochs_completed, trained.end.epochs_completed), (2, 2));
    assert!(!summary.stopped && !trained.end.stopped && summary.export_dir.is_some());
    if !device.is_gpu() {
        let losses = |events: &[Event]| -> Vec<f32> {
            events.iter().filter_map(|e| if let Event::Step { loss, .. } = e { Some(*loss) } else { None }).collect()
        };
        let (a, b) = (losses(&folder_events), losses(&memory_events));
        assert!(a.iter().zip(&b).all(|(a, b)| (a - b).abs() <= 1e-4 * a.abs().max(1.0)), "{a:?} vs {b:?}");
    }
}

#[test]
fn both_stores_report_the_same_run_on_flex() {
    both_stores_report_the_same_run(&SelectedDevice::on_cpu(CpuBackend::Flex));
}

#[test]
fn gpu_both_stores_report_the_same_run_on_the_wgpu_adapter() {
    let Some(device) = gpu_or_skip() else { return };
    both_stores_report_the_same_run(&device);
}
