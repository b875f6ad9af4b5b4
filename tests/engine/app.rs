//! The desktop app, driven headless by egui_kittest: one feature per test. Widgets are clicked
//! where the feature is a widget; state changes that a file dialog or a slider would make go
//! through the app's `Command`s, as the panels record them.

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use vramfit::gui::{AppOptions, Command, DataCommand, Settings, View, VramfitApp};

use super::*;

/// An app writing its runs under `dir`, training through `worker`.
fn app_in(dir: &Path, worker: vramfit::gui::WorkerLaunch) -> VramfitApp {
    let options = AppOptions { runs_dir: dir.join("runs"), worker, max_steps: None, in_memory: None };
    VramfitApp::with_options(Settings::default(), options)
}

/// A harness drawing the whole window (`wgpu`: able to render screenshots).
fn window(app: VramfitApp, wgpu: bool) -> Harness<'static, VramfitApp> {
    let builder = Harness::builder().with_size([1280.0, 820.0]);
    let builder = if wgpu { builder.wgpu() } else { builder };
    let mut harness = builder.build_ui_state(|ui, app: &mut VramfitApp| app.ui(ui), app);
    harness.step();
    harness
}

/// The app trains in a worker process: an abort injected into it (as the GPU runtime aborts)
/// ends the job, not the window; the error names the cause, and Resume continues from the last
/// checkpoint with every step once. The run folder then resumes from the CLI on the same data.
#[test]
fn gui_survives_an_aborted_training_process_and_its_run_resumes_in_the_app_and_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    // A dataset of its own (not the bundled one), so "the same data" can be checked.
    let data = dir.path().join("data");
    for (i, s) in bundled().train.samples.iter().take(400).enumerate() {
        let class = dir.path().join("data").join(format!("c{}", s.label % 3));
        std::fs::create_dir_all(&class).unwrap();
        let pipe = SamplePipeline::from_config(&quickstart(), false);
        pipe.decode(&s.source).unwrap().save(class.join(format!("{i:04}.png"))).unwrap();
    }
    let mut app = app_in(dir.path(), app_worker(Some("abort@5")));
    app.apply(Command::SelectAdapter(None)); // the CPU: quick, and the same worker path as a GPU
    app.apply(Command::SetDataDir(Some(data.clone())));
    let mut config = app.settings().config.clone();
    config.train.checkpoint_every_steps = 3;
    app.apply(Command::SetConfig(Box::new(config)));
    let mut harness = window(app, false);
    harness.get_by_label("Train").click();
    step_until(&mut harness, "the worker's abort", |a| !a.training() && a.history().last_step > 0);
    let error = harness.state().error().unwrap_or_default().to_string();
    assert!(error.contains("SIGABRT") && error.contains("after step 4"), "{error}");
    assert!(error.contains("the run folder is intact") && error.contains("3 steps"), "{error}");
    assert_eq!(harness.state().status(), "failed");
    // The window lives on: it draws, and Resume continues from the checkpoint at step 3.
    harness.step();
    harness.state_mut().options_mut().worker = app_worker(None);
    harness.state_mut().options_mut().max_steps = Some(3);
    harness.get_by_label("Resume").click();
    step_until(&mut harness, "the resumed run", |a| !a.training() && a.history().last_step >= 7);
    let app = harness.state();
    assert!(app.error().is_none(), "{:?}", app.error());
    let run = app.last_run().unwrap().to_path_buf();
    assert_eq!(metric_steps(&run), (1..=7).collect::<Vec<_>>(), "every step once in metrics.csv");
    // The CLI resumes the app's run with only --out: same data folder, steps continue.
    let (ok, log) = vramfit_cli(&[
        "train".as_ref(),
        "--resume".as_ref(),
        "--out".as_ref(),
        run.as_os_str(),
        "--device".as_ref(),
        "cpu".as_ref(),
        "--max-steps".as_ref(),
        "9".as_ref(),
    ]);
    assert!(ok, "{log}");
    let canonical = data.canonicalize().unwrap();
    assert!(log.contains(&canonical.display().to_string()), "the app's data folder: {log}");
    assert_eq!(metric_steps(&run), (1..=9).collect::<Vec<_>>(), "the CLI continued at step 8");
}

/// The window title names the device in use and follows the device picker.
#[test]
fn gui_window_title_follows_the_device_picker() {
    if gpu_or_skip().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut harness = window(app_in(dir.path(), app_worker(None)), false);
    let adapter = harness.state().adapters()[0].name.clone();
    assert!(harness.state().window_title().contains(&adapter), "{}", harness.state().window_title());
    harness.state_mut().apply(Command::SelectAdapter(None));
    harness.step();
    assert_eq!(harness.state().window_title(), "vramfit — CPU (flex)");
    let commands = format!("{:?}", harness.output().viewport_output[&egui::ViewportId::ROOT].commands);
    assert!(commands.contains("vramfit — CPU (flex)"), "{commands}");
}

/// The dataset panel lists what the scan left out, per file with the reason.
#[test]
fn gui_dataset_panel_lists_the_files_the_scan_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = app_in(dir.path(), app_worker(None));
    app.apply(Command::SetDataDir(Some(cases().join("C11/dataset"))));
    let mut harness = window(app, false);
    harness.get_by_label_contains("files ignored by the scan").click();
    harness.step();
    assert!(harness.query_all_by_label_contains(".DS_Store: hidden file or OS junk").count() >= 1);
}

/// A folder of one's own images chosen on a card that reports its memory switches the
/// quickstart preset (made for the bundled 28 px data) to the card's tier: on lavapipe's 2 GiB,
/// the smallest tier fitted to it (its budget lowered to the card's size). An IDX dataset, the CPU or a preset the user chose keep theirs.
#[test]
fn gui_preselects_the_cards_tier_for_a_folder_of_images() {
    if gpu_or_skip().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let folder = cases().join("C11/dataset");
    let mut app = app_in(dir.path(), app_worker(None));
    let card = app.card_bytes().expect("lavapipe reports its memory");
    app.apply(Command::SetDataDir(Some(folder.clone())));
    let scan = ScanOptions { val_fraction: 0.1, seed: 42, allow_empty_classes: false, csv_paths_outside: false };
    let classes = dataset::open(&folder, &scan).unwrap().train.class_names.len();
    let (name, config) = vramfit::config::presets::preset_for_card(card, classes, app.f16_available()).unwrap();
    assert_eq!(app.settings().preset, name);
    assert_eq!(app.settings().config, config);
    assert!(app.status().starts_with(&format!("preset {name} for this card")), "{}", app.status());
    assert!(app.plan().fits, "{:?}", app.plan());
    // The bundled IDX data keeps quickstart; so do the CPU and a preset chosen by hand.
    let mut idx = app_in(dir.path(), app_worker(None));
    idx.apply(Command::SetDataDir(Some(dataset::bundled_dataset_dir())));
    let mut cpu = app_in(dir.path(), app_worker(None));
    cpu.apply(Command::SelectAdapter(None));
    cpu.apply(Command::SetDataDir(Some(folder.clone())));
    let mut chosen = app_in(dir.path(), app_worker(None));
    chosen.apply(Command::SelectPreset("8gb".into()));
    chosen.apply(Command::SetDataDir(Some(folder)));
    let presets = [&idx, &cpu, &chosen].map(|a| a.settings().preset.clone());
    assert_eq!(presets, ["quickstart", "quickstart", "8gb"]);
}

/// A tier preset changes the knobs and the estimate; presets save to and load from TOML; a
/// knob moves the estimate.
#[test]
fn gui_presets_and_knobs_move_the_estimate_and_presets_round_trip_through_toml() {
    let dir = tempfile::tempdir().unwrap();
    let mut harness = window(app_in(dir.path(), app_worker(None)), false);
    let quick = harness.state().estimate_text();
    harness.get_by_label(&quick);
    harness.state_mut().apply(Command::SelectPreset("8gb".into()));
    harness.step();
    let config = &harness.state().settings().config;
    let eight = vramfit::config::presets::load_config("8gb").unwrap();
    assert_eq!((config.train.batch_size, config.data.preprocess.crop_size), (eight.train.batch_size, 224));
    // The tier says why it trains as it does, where the device can (8gb trains in f16).
    let reason = harness.state().shown_tier_reason().map(str::to_string);
    assert_eq!(reason.is_some(), harness.state().f16_available(), "{reason:?}");
    if let Some(reason) = reason {
        assert!(reason.contains("that plan 60-90% of 8.0 GiB"), "{reason}");
        harness.get_by_label(&format!("This tier trains with {reason}."));
    }
    let tier = harness.state().estimate_text();
    assert_ne!(tier, quick);
    harness.get_by_label(&tier);
    let preset_file = dir.path().join("mine.toml");
    harness.state_mut().apply(Command::SavePresetFile(preset_file.clone()));
    harness.state_mut().apply(Command::SelectPreset("quickstart".into()));
    harness.state_mut().apply(Command::LoadPresetFile(preset_file));
    assert_eq!(harness.state().settings().config.train.batch_size, eight.train.batch_size);
    assert_eq!(harness.state().settings().preset, "mine");
    assert_eq!(harness.state().shown_tier_reason(), None, "a preset file of one's own is no tier");
    let mut bigger = harness.state().settings().config.clone();
    bigger.train.batch_size = 64;
    harness.state_mut().apply(Command::SetConfig(Box::new(bigger)));
    harness.step();
    assert_eq!(harness.state().settings().preset, "custom");
    let text = harness.state().estimate_text();
    assert_ne!(text, tier);
    harness.get_by_label(&text);
}

/// The setup panel is compared with its stored snapshot (tests/snapshots/, rendered by
/// lavapipe): a change of layout, label or estimate fails here. `UPDATE_SNAPSHOTS=1` rewrites
/// the stored images after a deliberate change.
#[test]
fn gui_setup_panel_matches_its_snapshots() {
    if gpu_or_skip().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let app = app_in(dir.path(), app_worker(None));
    let mut harness = Harness::builder()
        .with_size([340.0, 900.0])
        .wgpu()
        .build_ui_state(|ui, app: &mut VramfitApp| app.setup_panel(ui), app);
    harness.step();
    harness.snapshot("setup-quickstart");
    harness.state_mut().apply(Command::SelectPreset("8gb".into()));
    harness.step();
    harness.snapshot("setup-8gb");
}

/// The whole window before Train, compared with its snapshot: the plots panel says what will
/// appear and the plan's figures, not empty axes.
#[test]
fn gui_window_before_train_explains_the_plots_and_matches_its_snapshot() {
    if gpu_or_skip().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut harness = window(app_in(dir.path(), app_worker(None)), true);
    harness.get_by_label("No run yet");
    let plan = harness.state().plan().clone();
    let planned = format!(
        "Planned peak of device memory: {} of the {} budget",
        vramfit::memory::human_bytes(plan.estimate.total),
        vramfit::memory::human_bytes(plan.budget_bytes)
    );
    assert!(harness.query_by_label_contains(&planned).is_some(), "{planned}");
    harness.snapshot("window-before-train");
}

/// Train on the bundled data on the GPU: the loss and memory plots get points; Stop stops with
/// a checkpoint; Evaluate evaluates it; Resume continues the step count; the export opens in
/// ONNX Runtime with the CLI's probabilities.
#[test]
fn gui_trains_stops_evaluates_resumes_and_exports() {
    if gpu_or_skip().is_none() {
        return; // the app renders through wgpu
    }
    let dir = tempfile::tempdir().unwrap();
    let mut app = app_in(dir.path(), app_worker(None));
    let mut config = app.settings().config.clone();
    config.train.memory_sample_every = 1;
    app.apply(Command::SetConfig(Box::new(config)));
    let mut harness = window(app, true);
    harness.get_by_label("Train").click();
    step_until(&mut harness, "two training steps", |a| a.history().last_step >= 2);
    harness.get_by_label("Stop").click();
    step_until(&mut harness, "the stop", |a| !a.training());
    let stopped_at = harness.state().history().last_step;
    assert!(harness.state().status().contains("stopped"), "{}", harness.state().status());
    assert_eq!(harness.state().history().loss.len(), stopped_at);
    assert!(!harness.state().history().in_use_mib.is_empty(), "memory samples plotted");
    save_screenshot(&mut harness, "training");
    // Evaluation on demand: the stopped run's checkpoint on the validation data.
    harness.get_by_label("Evaluation").click();
    harness.step(); // the click records the command, applied after this frame
    harness.step();
    assert!(harness.state().evaluation().is_none(), "no evaluation before the click");
    harness.get_by_label("Evaluate latest checkpoint").click();
    harness.step();
    step_until(&mut harness, "the evaluation", |a| !a.evaluating());
    let eval = harness.state().evaluation().cloned().unwrap_or_else(|| panic!("{:?}", harness.state().error()));
    assert_eq!((eval.samples, eval.class_names.len()), (bundled().val.samples.len(), 10));
    assert!(harness.state().status().contains("evaluated"), "{}", harness.state().status());
    save_screenshot(&mut harness, "evaluation");
    harness.get_by_label("Training").click();
    harness.step();
    assert_eq!(harness.state().view(), View::Training);
    // Resume continues the step count.
    harness.state_mut().options_mut().max_steps = Some(2);
    harness.get_by_label("Resume").click();
    step_until(&mut harness, "the resumed run", |a| !a.training() && a.history().last_step > stopped_at);
    let h = harness.state().history();
    assert_eq!(h.loss[stopped_at][0] as usize, stopped_at + 1, "resume continues at the next step");
    assert_eq!(h.last_step, stopped_at + 2);
    // Export on the session; it opens in ONNX Runtime as the CLI's does.
    let export = dir.path().join("export");
    harness.state_mut().apply(Command::Export(export.clone()));
    step_until(&mut harness, "the export", |a| !a.busy());
    assert!(harness.state().status().starts_with("exported"), "{}", harness.state().status());
    assert!(export.join("model.onnx").is_file() && export.join("model.bpk").is_file());
    if let Some(python) = onnx_python() {
        let images = bundled_test_pngs(&dir.path().join("images"), 200);
        assert_eq!(ort_check(&python, &export, &images, &["--device", "cpu"])["images"], 200);
    }
}

/// Images dropped on the window are predicted on the session with the chosen weights: top-5
/// sorted, a file that is not an image gets its reason, and the view switches to Predict.
#[test]
fn gui_predicts_dropped_images_and_names_a_file_that_is_not_an_image() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("cli-run");
    let (ok, log) = cli_train(&dataset::bundled_dataset_dir(), &run, &["--epochs", "1", "--max-steps", "2"]);
    assert!(ok, "{log}");
    vramfit::export::export_run(&run, &run.join("export")).unwrap();
    let mut app = app_in(dir.path(), app_worker(None));
    app.apply(Command::SelectAdapter(None));
    app.apply(Command::ChooseModel(run.join("export")));
    let mut harness = window(app, false);
    harness.input_mut().dropped_files.push(std::sync::Arc::new(TestDrop(cases().join("C07/ok_baseline.jpg"))));
    harness.step();
    step_until(&mut harness, "the prediction", |a| !a.busy() && !a.predictions().is_empty());
    assert_eq!(harness.state().view(), View::Predict);
    let top = harness.state().predictions()[0].result.as_ref().unwrap().clone();
    assert_eq!(top.len(), 5);
    assert!(top.windows(2).all(|w| w[0].probability >= w[1].probability));
    harness.get_by_label("ok_baseline.jpg");
    harness.input_mut().dropped_files.push(std::sync::Arc::new(TestDrop(cases().join("C08/text_renamed.jpg"))));
    harness.step();
    step_until(&mut harness, "the second prediction", |a| !a.busy() && a.predictions().len() == 2);
    assert!(harness.state().predictions()[0].result.is_err());
    harness.get_by_label_contains("not an image");
    // The same weights again: the same probabilities (the cached predictor).
    harness.state_mut().apply(Command::Predict(vec![cases().join("C07/ok_baseline.jpg")]));
    step_until(&mut harness, "the third prediction", |a| !a.busy() && a.predictions().len() == 3);
    assert_eq!(harness.state().predictions()[0].result.as_ref().unwrap(), &top);
}

/// C43: the app's saved settings as real use leaves them. Each file starts the app with its
/// defaults or its valid parts, and a notice in the window says what was dropped or reset and
/// why; what the settings point at that is gone (an adapter, a dataset folder) is named.
#[test]
fn c43_saved_settings_that_are_damaged_old_or_out_of_range_start_the_app_with_a_notice() {
    use vramfit::gui::saved_settings::{read_storage_file, restore};
    let dir = tempfile::tempdir().unwrap();
    let start = |name: &str| {
        let file = dir.path().join(format!("{name}.ron"));
        std::fs::copy(cases().join(format!("C43/settings/{name}.ron")), &file).unwrap();
        let (saved, mut notices) = read_storage_file(&file, "app");
        let (settings, restored) = restore(saved.as_deref());
        notices.extend(restored);
        let mut app = VramfitApp::with_adapters(settings, AppOptions::default(), Vec::new()).unwrap();
        app.add_notices(notices);
        let all = app.notices().join("\n");
        (app, all)
    };
    let quickstart = vramfit::config::presets::load_config("quickstart").unwrap();
    let (_, n) = start("adapter_7");
    assert!(n.contains("the saved adapter 7 is not on this machine (0 adapters found): using CPU"), "{n}");
    let (app, n) = start("bad_values");
    assert!(n.contains("the saved config was out of range") && n.contains("train.batch_size"), "{n}");
    assert_eq!(app.settings().config.train, quickstart.train);
    let (_, n) = start("data_dir_gone");
    assert!(n.contains("the saved dataset folder /nonexistent/photos no longer exists"), "{n}");
    let (app, n) = start("newer_version");
    assert!(n.contains("ignored saved settings this version does not know") && n.contains("future_field"), "{n}");
    assert_eq!(app.settings().preset, "quickstart");
    let (app, n) = start("older_config_key");
    assert!(n.contains("dropped the saved config") && n.contains("label_smooth"), "{n}");
    assert_eq!(app.settings().data_dir.as_deref(), Some(Path::new("/srv/photos")), "the valid fields are kept");
    for damaged in ["not_ron", "truncated", "zero_bytes"] {
        let (app, n) = start(damaged);
        assert!(n.contains("could not be read") && n.contains("started with the defaults"), "{damaged}: {n}");
        assert!(dir.path().join(format!("{damaged}.ron.unreadable")).is_file(), "{damaged}: a copy is kept");
        assert_eq!(app.settings().preset, "quickstart");
    }
    assert!(restore(None).1.is_empty(), "a first start has nothing to say");
}

/// While the first step is being prepared (held there by `VRAMFIT_FAULT=hang@started`, as a
/// first step compiling its kernels for minutes is), the plots panel counts its seconds; Stop
/// ends the worker within seconds, the run stopped at step 0, and Resume trains it.
#[test]
fn gui_shows_the_first_step_being_prepared_and_stop_ends_it_in_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = app_in(dir.path(), app_worker(Some("hang@started")));
    app.apply(Command::SelectAdapter(None));
    let mut harness = window(app, false);
    harness.get_by_label("Train").click();
    step_until(&mut harness, "the run's start", |a| a.history().plan.is_some());
    assert!(harness.query_by_label_contains("Preparing the first step").is_some());
    assert_eq!(harness.state().history().last_step, 0);
    harness.get_by_label("Stop").click();
    let stopping = std::time::Instant::now();
    step_until(&mut harness, "the stop", |a| !a.training());
    assert!(stopping.elapsed().as_secs() < 30, "{} s", stopping.elapsed().as_secs());
    assert!(harness.state().error().is_none(), "{:?}", harness.state().error());
    assert_eq!(harness.state().status(), "stopped at step 0; press Resume to continue");
    harness.state_mut().options_mut().worker = app_worker(None);
    harness.state_mut().options_mut().max_steps = Some(2);
    harness.get_by_label("Resume").click();
    step_until(&mut harness, "the resumed run", |a| !a.training() && a.history().last_step > 0);
    let app = harness.state();
    assert!(app.error().is_none(), "{:?}", app.error());
    assert_eq!(app.history().last_step, 2, "{}: {:?}", app.status(), app.history().log);
}

/// The overfit check from the app: the button trains 64 of the dataset's images, its loss
/// curve goes to the plots, and the verdict to the status line (the CPU: a pass in seconds).
#[test]
fn gui_overfit_check_plots_its_loss_and_passes_on_the_bundled_data() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = app_in(dir.path(), app_worker(None));
    app.apply(Command::SelectAdapter(None));
    let mut harness = window(app, false);
    harness.get_by_label("Overfit check").click();
    step_until(&mut harness, "the overfit check", |a| !a.training() && a.status().starts_with("overfit check "));
    let app = harness.state();
    assert!(app.status().starts_with("overfit check PASSED: "), "{} {:?}", app.status(), app.error());
    let loss = &app.history().loss;
    assert!(loss.len() >= 2 && loss.len() <= 200, "{} steps", loss.len());
    let (first, last) = (loss[0][1], loss[loss.len() - 1][1]);
    assert!(last < first / 4.0, "the loss fell from {first} to {last}");
    assert!(app.status().contains(&format!("after {} steps", loss.len())), "{}", app.status());
    assert!(app.last_run().is_none(), "no run folder");
    assert!(!dir.path().join("runs").exists());
}

/// A run folder dropped on the window (the committed fixture `tests/data/run_folders/v1-small`:
/// 36 steps over 12 epochs on C19's two classes) opens as the last run: its plots, its config
/// and data folder; Evaluate evaluates its checkpoint and its export predicts. The plots, the
/// evaluation and the prediction are each compared with their snapshot (the values come from
/// the fixture's files and a CPU evaluation, so they are the same on every run).
#[test]
fn gui_opens_a_run_folder_and_its_plots_evaluation_and_prediction_match_their_snapshots() {
    if gpu_or_skip().is_none() {
        return; // snapshots render through wgpu
    }
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("v1-small");
    copy_tree(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/run_folders/v1-small"), &run);
    let data = cases().join("C19/dataset");
    std::fs::write(run.join("data.txt"), format!("{}\n", data.display())).unwrap();
    let mut app = app_in(dir.path(), app_worker(None));
    app.apply(Command::SelectAdapter(None));
    // The central views alone: the setup panel and the status bar show this machine's paths.
    let mut harness = Harness::builder()
        .with_size([960.0, 760.0])
        .wgpu()
        .build_ui_state(|ui, app: &mut VramfitApp| app.central_view(ui), app);
    harness.step();
    harness.state_mut().apply(Command::Drop(vec![run.clone()]));
    harness.step();
    let app = harness.state();
    assert_eq!(app.status(), format!("opened run {}: step 36, epoch 12", run.display()), "{:?}", app.error());
    assert_eq!(app.last_run(), Some(run.as_path()));
    assert_eq!((app.history().loss.len(), app.history().val_accuracy.len()), (36, 12));
    assert_eq!(app.settings().data_dir.as_deref(), Some(data.as_path()));
    assert_eq!((app.settings().preset.as_str(), app.settings().config.train.batch_size), ("small", 2));
    harness.snapshot("run-plots");

    harness.state_mut().apply(Command::Evaluate);
    step_until(&mut harness, "the evaluation", |a| !a.evaluating() && a.evaluation().is_some());
    assert_eq!(harness.state().evaluation().unwrap().samples, 6);
    harness.state_mut().apply(Command::ShowView(View::Evaluation));
    // The images behind a cell (true a, predicted a), as thumbnails loaded on the session.
    harness.state_mut().apply(Command::Data(DataCommand::SelectCell(Some((0, 0)))));
    harness.step();
    step_until(&mut harness, "the cell's thumbnails", |a| !a.data_busy());
    harness.snapshot("run-evaluation");

    let image = std::fs::read_dir(data.join("a")).unwrap().flatten().map(|e| e.path()).min().unwrap();
    harness.state_mut().apply(Command::Predict(vec![image]));
    step_until(&mut harness, "the prediction", |a| !a.busy() && !a.predictions().is_empty());
    let top = harness.state().predictions()[0].result.as_ref().unwrap().clone();
    assert_eq!(top[0].name, "a", "{top:?}");
    harness.state_mut().apply(Command::ShowView(View::Predict));
    harness.step();
    harness.snapshot("run-prediction");
}

/// The Data view on C33 (held-out validation): the picture under two labels, the validation
/// copy of a training image and the copies inside a class, each with its thumbnails, compared
/// with its snapshot.
#[test]
fn gui_data_view_shows_copies_conflicts_and_leaks_with_thumbnails() {
    if gpu_or_skip().is_none() {
        return; // snapshots render through wgpu
    }
    let dir = tempfile::tempdir().unwrap();
    let mut app = app_in(dir.path(), app_worker(None));
    app.apply(Command::SetDataDir(Some(cases().join("C33/dataset"))));
    app.apply(Command::ShowView(View::Data));
    let mut harness = Harness::builder()
        .with_size([960.0, 760.0])
        .wgpu()
        .build_ui_state(|ui, app: &mut VramfitApp| app.central_view(ui), app);
    harness.step();
    step_until(&mut harness, "the data check", |a| a.data_health().is_some() && !a.data_busy());
    let health = harness.state().data_health().unwrap().unwrap().clone();
    let counts =
        (health.duplicates.groups.len(), health.duplicates.conflicts().count(), health.leaked_val_indices().len());
    assert_eq!(counts, (4, 1, 1));
    harness.step();
    step_until(&mut harness, "the thumbnails", |a| !a.data_busy());
    assert!(
        harness.query_by_label_contains("The same picture under two labels (one label is wrong): 1").is_some(),
        "The same picture und"
    );
    assert!(
        harness
            .query_by_label_contains("Validation images that copy training images (validation accuracy is inflated): 1")
            .is_some(),
        "Validation images th"
    );
    assert!(
        harness.query_by_label_contains("Copies inside one class (harmless, but the picture weighs more): 3").is_some(),
        "Copies inside one cl"
    );
    harness.snapshot("data-view");
}
