//! The desktop app, driven headless by egui_kittest.

use super::*;

/// The app trains in a worker process: an abort injected into it (as the GPU runtime aborts)
/// ends the job, not the window; the error names the cause, and Resume continues from the last
/// checkpoint with every step once.
#[test]
fn gui_survives_an_aborted_training_process_and_resume_continues_from_its_checkpoint() {
    use egui_kittest::kittest::Queryable;
    use vramfit::gui::{Settings, VramfitApp};
    let dir = tempfile::tempdir().unwrap();
    let mut app = VramfitApp::new(Settings::default());
    app.runs_dir = dir.path().join("runs");
    app.worker = app_worker(Some("abort@5"));
    app.settings.adapter = None; // the CPU: quick, and the same worker path as a GPU
    app.settings.config.train.checkpoint_every_steps = 3;
    let mut harness = egui_kittest::Harness::builder()
        .with_size([1280.0, 820.0])
        .build_ui_state(|ui, app: &mut VramfitApp| app.ui(ui), app);
    harness.step();
    harness.get_by_label("Train").click();
    step_until(&mut harness, "the worker's abort", |a| !a.training() && a.history.last_step > 0);
    let error = harness.state().error.clone().unwrap_or_default();
    assert!(error.contains("SIGABRT") && error.contains("after step 4"), "{error}");
    assert!(error.contains("the run folder is intact") && error.contains("3 steps"), "{error}");
    assert_eq!(harness.state().status, "failed");
    // The window lives on: it draws, and Resume continues from the checkpoint at step 3.
    harness.step();
    harness.state_mut().worker = app_worker(None);
    harness.state_mut().max_steps = Some(3);
    harness.get_by_label("Resume").click();
    step_until(&mut harness, "the resumed run", |a| !a.training() && a.history.last_step >= 7);
    let app = harness.state();
    assert!(app.error.is_none(), "{:?}", app.error);
    let run = app.last_run.clone().unwrap();
    assert_eq!(metric_steps(&run), (1..=7).collect::<Vec<_>>(), "every step once in metrics.csv");
    assert!(run.join("data.txt").exists(), "a run started in the app resumes from the CLI too");
}

#[test]
fn gui_tiers_estimate_train_stop_resume_export_and_drop_prediction() {
    use egui_kittest::kittest::Queryable;
    use vramfit::gui::{Settings, View, VramfitApp};
    if gpu().is_none() {
        return; // the app renders through wgpu
    }
    let dir = tempfile::tempdir().unwrap();
    let mut app = VramfitApp::new(Settings::default());
    app.runs_dir = dir.path().join("runs");
    app.worker = app_worker(None);
    app.settings.config.train.memory_sample_every = 1;
    let mut harness = egui_kittest::Harness::builder()
        .with_size([1280.0, 820.0])
        .wgpu()
        .build_ui_state(|ui, app: &mut VramfitApp| app.ui(ui), app);
    harness.step();
    // The window title names the device in use, and follows the picker.
    let adapter = harness.state().adapters[0].name.clone();
    assert!(harness.state().window_title().contains(&adapter), "{}", harness.state().window_title());
    harness.state_mut().settings.adapter = None;
    harness.step();
    assert_eq!(harness.state().window_title(), "vramfit — CPU (flex)");
    let commands = format!("{:?}", harness.output().viewport_output[&egui::ViewportId::ROOT].commands);
    assert!(commands.contains("vramfit — CPU (flex)"), "{commands}");
    harness.state_mut().settings.adapter = Some(0);
    harness.step();
    // The dataset panel lists what the scan left out, per file with the reason.
    harness.state_mut().settings.data_dir = Some(cases().join("C11/dataset"));
    harness.step();
    harness.get_by_label_contains("files ignored by the scan").click();
    harness.step();
    assert!(harness.query_all_by_label_contains(".DS_Store: hidden file or OS junk").count() >= 1);
    harness.state_mut().settings.data_dir = None;
    harness.step();
    // A tier preset changes the sliders and the estimate.
    let quick = harness.state().estimate_text();
    harness.get_by_label(&quick);
    harness.state_mut().select_preset("8gb");
    harness.step();
    assert_eq!(harness.state().settings.config.train.batch_size, 32);
    assert_eq!(harness.state().settings.config.data.preprocess.crop_size, 224);
    let tier = harness.state().estimate_text();
    assert_ne!(tier, quick);
    harness.get_by_label(&tier);
    snapshot(&mut harness, "setup-8gb");
    // Presets save to and load from configs/-style TOML.
    let preset_file = dir.path().join("mine.toml");
    harness.state_mut().save_preset_file(&preset_file);
    harness.state_mut().select_preset("quickstart");
    harness.state_mut().load_preset_file(&preset_file);
    assert_eq!(harness.state().settings.config.train.batch_size, 32);
    assert_eq!(harness.state().settings.preset, "mine");
    // Moving the batch size changes the estimate.
    harness.state_mut().settings.config.train.batch_size = 64;
    harness.step();
    let bigger = harness.state().estimate_text();
    assert_ne!(bigger, tier);
    harness.get_by_label(&bigger);
    // Train on the bundled data: the loss and memory plots get points.
    harness.state_mut().select_preset("quickstart");
    harness.state_mut().settings.config.train.memory_sample_every = 1;
    harness.step();
    harness.get_by_label("Train").click();
    step_until(&mut harness, "two training steps", |a| a.history.last_step >= 2);
    harness.get_by_label("Stop").click();
    step_until(&mut harness, "the stop", |a| !a.training());
    let stopped_at = harness.state().history.last_step;
    assert!(harness.state().status.contains("stopped"), "{}", harness.state().status);
    assert_eq!(harness.state().history.loss.len(), stopped_at);
    assert!(!harness.state().history.in_use_mib.is_empty(), "memory samples plotted");
    snapshot(&mut harness, "training");
    // Evaluation on demand: the stopped run's checkpoint on the validation data.
    harness.state_mut().view = View::Evaluation;
    harness.step();
    harness.get_by_label("Evaluate latest checkpoint").click();
    harness.step();
    assert!(harness.state().evaluating() || harness.state().evaluation.is_some());
    step_until(&mut harness, "the evaluation", |a| !a.evaluating());
    let eval = harness.state().evaluation.clone().unwrap_or_else(|| panic!("{:?}", harness.state().error));
    assert_eq!((eval.samples, eval.class_names.len()), (bundled().val.samples.len(), 10));
    assert!(harness.state().status.contains("evaluated"), "{}", harness.state().status);
    snapshot(&mut harness, "evaluation");
    harness.state_mut().view = View::Training;
    // Resume continues the step count.
    harness.state_mut().max_steps = Some(2);
    harness.get_by_label("Resume").click();
    step_until(&mut harness, "the resumed run", |a| !a.training() && a.history.last_step > stopped_at);
    let h = &harness.state().history;
    assert_eq!(h.loss[stopped_at][0] as usize, stopped_at + 1, "resume continues at the next step");
    assert_eq!(h.last_step, stopped_at + 2);
    // Export, then drop images on the window.
    let export = dir.path().join("export");
    harness.state().export_to(&export).unwrap();
    // The app's export opens in ONNX Runtime as the CLI's does, with the same probabilities.
    assert!(export.join("model.onnx").is_file());
    if let Some(python) = onnx_python() {
        let images = bundled_test_pngs(&dir.path().join("images"), 200);
        assert_eq!(ort_check(&python, &export, &images, &["--device", "cpu"])["images"], 200);
    }
    harness.state_mut().predict.model_path = Some(export);
    harness.input_mut().dropped_files.push(std::sync::Arc::new(TestDrop(cases().join("C07/ok_baseline.jpg"))));
    harness.step();
    harness.step();
    assert_eq!(harness.state().view, View::Predict);
    let top = harness.state().predict.predictions[0].result.as_ref().unwrap().clone();
    assert_eq!(top.len(), 5);
    assert!(top.windows(2).all(|w| w[0].probability >= w[1].probability));
    harness.get_by_label("ok_baseline.jpg");
    harness.input_mut().dropped_files.push(std::sync::Arc::new(TestDrop(cases().join("C08/text_renamed.jpg"))));
    harness.step();
    harness.step();
    assert!(harness.state().predict.predictions[0].result.is_err());
    harness.get_by_label_contains("not an image");
    snapshot(&mut harness, "predict");
}
