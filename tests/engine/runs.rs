//! Run folders, checkpoints, resume and the worker process (C18-C20).

use super::*;
use vramfit::data::split_record::{Split, SplitRecord, held_out_by_hash};

#[test]
fn c18_a_damaged_newest_checkpoint_falls_back_to_the_previous_one() {
    let data = cases().join("C18/dataset");
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // 10 training images at batch 2: 5 steps an epoch, a checkpoint after each epoch.
    let (ok, log) = cli_train(&data, &run, &["--epochs", "3", "--batch-size", "2"]);
    assert!(ok, "{log}");
    assert_eq!(checkpoint_names(&run), ["step-00000010", "step-00000015"], "the two newest are kept");
    assert!(
        vramfit::train::checkpoint::verify(
            &run.join("checkpoints/step-00000015"),
            false,
            &vramfit::train::checkpoint::CHECKPOINT_FILES
        )
        .is_ok()
    );

    // The weights of the newest emptied (a full disk): resume names the file and uses step 10.
    let emptied = dir.path().join("emptied");
    copy_tree(&run, &emptied);
    std::fs::write(emptied.join("checkpoints/step-00000015/model.bpk"), b"").unwrap();
    let (ok, log) = vramfit_cli(&["export".as_ref(), "--run".as_ref(), emptied.as_os_str()]);
    assert!(ok, "{log}");
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(emptied.join("export/model.json")).unwrap()).unwrap();
    assert_eq!(meta["training"]["steps"], 10, "export falls back to the intact checkpoint");
    assert!(log.contains("step-00000015/model.bpk is damaged (0 bytes"), "{log}");
    let (ok, log) = cli_train(&data, &emptied, &["--resume", "--epochs", "4", "--max-steps", "12"]);
    assert!(ok, "{log}");
    assert!(log.contains("step-00000015/model.bpk is damaged (0 bytes"), "{log}");
    assert_eq!(
        checkpoint_names(&emptied),
        ["step-00000010", "step-00000012"],
        "the damaged one goes, the intact fallback stays"
    );
    let (ok, log) = cli_train(&data, &emptied, &["--resume", "--epochs", "4"]);
    assert!(ok, "{log}");
    assert_eq!(metric_steps(&emptied), (1..=20).collect::<Vec<_>>(), "each step exactly once");

    // The pointer emptied: every checkpoint is intact, so resume continues from the newest.
    let pointer = dir.path().join("pointer");
    copy_tree(&run, &pointer);
    std::fs::write(pointer.join("checkpoints/latest.json"), b"").unwrap();
    std::fs::write(pointer.join("checkpoints/step-00000015/.model.bpk.tmp"), b"half a save").unwrap();
    let (ok, log) = cli_train(&data, &pointer, &["--resume", "--epochs", "4"]);
    assert!(ok, "{log}");
    assert!(log.contains("latest.json is damaged"), "{log}");
    assert!(log.contains("removed 1 temporary files"), "{log}");
    assert!(!pointer.join("checkpoints/step-00000015/.model.bpk.tmp").exists());
    assert_eq!(metric_steps(&pointer), (1..=20).collect::<Vec<_>>());

    // Every checkpoint damaged: a clear error naming each file, nothing trained.
    std::fs::write(pointer.join("checkpoints/step-00000020/state.json"), b"{").unwrap();
    std::fs::write(pointer.join("checkpoints/step-00000015/optimizer.bpk"), b"").unwrap();
    let (ok, log) = cli_train(&data, &pointer, &["--resume", "--epochs", "5"]);
    assert!(!ok);
    assert!(log.contains("no intact checkpoint") && log.contains("step-00000020/state.json is damaged"), "{log}");
}

#[test]
fn c19_epochs_on_resume_extend_the_run_and_other_overrides_are_announced_or_refused() {
    let data = cases().join("C19/dataset");
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let (ok, log) = cli_train(&data, &run, &["--epochs", "1"]);
    assert!(ok, "{log}");
    assert_eq!(metric_steps(&run), [1], "10 images at batch 64: one step an epoch");
    // C36's kind: a batch over the training set is clamped to it, with a note.
    let clamped = log.split("train.batch_size = 64 is more than the ").nth(1).and_then(|t| t.split(' ').next());
    let train_images: usize = clamped.and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no clamp note: {log}"));
    let (ok, log) = cli_train(&data, &run, &["--resume", "--epochs", "3"]);
    assert!(ok, "{log}");
    assert!(log.contains("resume: train.epochs: 1 -> 3"), "{log}");
    assert_eq!(metric_steps(&run), [1, 2, 3]);
    let epochs = std::fs::read_to_string(run.join("epochs.csv")).unwrap();
    assert_eq!(epochs.lines().count(), 1 + 3, "{epochs}");
    // Batch size and learning rate apply from the next step, announced.
    let (ok, log) = cli_train(&data, &run, &["--resume", "--batch-size", "2", "--lr", "0.5", "--epochs", "4"]);
    assert!(ok, "{log}");
    assert!(log.contains(&format!("resume: train.batch_size: {train_images} -> 2")), "{log}");
    assert!(log.contains("resume: optimizer.lr: 0.003 -> 0.5"), "{log}");
    assert_eq!(metric_steps(&run), (1..=8).collect::<Vec<_>>(), "epoch 4 at batch 2 is 5 steps");
    // The schedule spans the 5 new steps: the lr decays from near the new peak, not from the floor.
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let lrs: Vec<f64> = metrics.lines().skip(4).map(|l| l.split(',').nth(4).unwrap().parse().unwrap()).collect();
    assert!(lrs[0] > 0.4 && lrs.windows(2).all(|w| w[1] < w[0]), "lr after the resume: {lrs:?}");
    let stored = vramfit::config::Config::load(&run.join("config.toml")).unwrap();
    assert_eq!((stored.train.batch_size, stored.train.epochs, stored.optimizer.lr), (2, 4, 0.5));
    // What would change the network or its inputs is refused, naming the key; nothing is written.
    let before = snapshot_files(&run);
    let (ok, log) = cli_train(&data, &run, &["--resume", "--crop-size", "32"]);
    assert!(!ok);
    assert!(log.contains("data.preprocess cannot change on resume"), "{log}");
    let whole_table = r#"data.preprocess={mode="resize_and_crop",load_size=32,crop_size=28}"#;
    let (ok, log) = cli_train(&data, &run, &["--resume", "--set", whole_table]);
    assert!(!ok && log.contains("data.preprocess cannot change on resume"), "{log}");
    let (ok, log) = cli_train(&data, &run, &["--resume", "--set", "data={mean=[0.1,0.2,0.3]}"]);
    assert!(!ok && log.contains("cannot change on resume"), "{log}");
    assert!(snapshot_files(&run) == before, "a refused resume changes no file");
    // One process at a time in a run folder.
    let lock = vramfit::train::checkpoint::RunLock::acquire(&run).unwrap();
    let (ok, log) = cli_train(&data, &run, &["--resume", "--epochs", "5"]);
    assert!(!ok && log.contains("is training in this folder"), "{log}");
    drop(lock);
}

#[test]
fn c20_training_into_a_folder_that_holds_a_run_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("exp1");
    let (ok, log) = cli_train(&cases().join("C20/dataset_ab"), &run, &["--epochs", "1"]);
    assert!(ok, "{log}");
    let before = snapshot_files(&run);
    assert!(before.keys().any(|p| p.ends_with("export/model.onnx")));
    let (ok, log) = cli_train(&cases().join("C20/dataset_xyz"), &run, &["--epochs", "1"]);
    assert!(!ok, "{log}");
    assert!(
        log.contains("already holds a run") && log.contains(r#"classes ["a", "b"], 1 step, 1 epoch done"#),
        "{log}"
    );
    assert!(log.contains("--resume"), "{log}");
    assert!(snapshot_files(&run) == before, "the first run's files are byte-identical");
    // The engine refuses too, so the app (which calls it directly) gets the same answer.
    let splits = dataset::open(
        &cases().join("C20/dataset_xyz"),
        &ScanOptions { val_fraction: 0.1, seed: 1, allow_empty_classes: false, csv_paths_outside: false },
    )
    .unwrap();
    let cpu = device::select(DeviceChoice::Cpu(CpuBackend::Flex)).unwrap();
    let err = train::train(&TrainRequest::new(quickstart(), &run), &cpu, &splits, &mut |_| {}, &StopSignal::new())
        .unwrap_err();
    assert!(err.to_string().contains("already holds a run"), "{err}");
    assert!(snapshot_files(&run) == before);
}

#[test]
fn the_cli_survives_a_crashed_training_process_and_the_run_resumes() {
    // `vramfit train` trains in a child process; VRAMFIT_FAULT makes that child die at step 7.
    let data = cases().join("C18/dataset");
    for (fault, cause, resume_hint) in [
        ("abort@7", "(SIGABRT", "--resume --out"),
        ("kill@7", "(SIGKILL", "--device cpu --batch-size 1"),
        ("panic@7", "(a panic (exit status 101)", "--resume --out"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let extra = ["--epochs", "3", "--batch-size", "2", "--set", "train.checkpoint_every_steps=2"];
        let (code, log) = cli_train_with_fault(&data, &run, &extra, Some(fault));
        assert_eq!(code, Some(1), "the parent exits normally with status 1: {log}");
        assert!(log.contains(&format!("the training process died {cause}")), "{fault}: {log}");
        assert!(log.contains("newest checkpoint") && log.contains(resume_hint), "{fault}: {log}");
        assert!(vramfit::train::checkpoint::find_latest(&run).unwrap().damaged.is_empty());
        let (ok, log) = cli_train(&data, &run, &["--resume"]);
        assert!(ok, "{fault}: {log}");
        assert_eq!(metric_steps(&run), (1..=15).collect::<Vec<_>>(), "{fault}: every step once");
    }
}

/// A run folder records its format version (run.json). A run whose config.toml lacks a key this
/// version added, or has one it does not know (renamed since), still exports and resumes, and
/// says so; a folder without run.json (made before it existed) resumes and gets one; a folder of
/// a newer format is refused by resume and export with both versions named, and left unchanged.
#[test]
fn run_folders_carry_a_format_version_and_configs_from_other_versions_still_resume_and_export() {
    let dir = tempfile::tempdir().unwrap();
    let (data, run) = (cases().join("C18/dataset"), dir.path().join("run"));
    let (ok, log) = cli_train(&data, &run, &["--epochs", "1"]);
    assert!(ok, "{log}");
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(manifest["format_version"], vramfit::train::run_dir::FORMAT_VERSION);
    assert_eq!(manifest["created_by"], env!("CARGO_PKG_VERSION"));

    let config_path = run.join("config.toml");
    let text = std::fs::read_to_string(&config_path).unwrap();
    assert!(text.contains("keep_checkpoints = 2"), "{text}");
    let text = text.replace("keep_checkpoints = 2\n", "").replace("[train]\n", "[train]\nmax_grad_norm = 1.0\n");
    std::fs::write(&config_path, text).unwrap();
    std::fs::remove_file(run.join("run.json")).unwrap();
    let (ok, log) = vramfit_cli(&["export".as_ref(), "--run".as_ref(), run.as_os_str()]);
    assert!(ok, "{log}");
    assert!(log.contains("lacks train.keep_checkpoints = 2") && log.contains("train.max_grad_norm"), "{log}");
    assert!(log.contains("no run.json"), "{log}");
    // A resume refused (other classes) changes nothing: no manifest written, no metrics row cut.
    let csv = run.join("metrics.csv");
    let with_extra_row = format!("{}999,0,1,1,1e-3,1,,\n", std::fs::read_to_string(&csv).unwrap());
    std::fs::write(&csv, with_extra_row).unwrap();
    let before = snapshot_files(&run);
    let (ok, log) = cli_train(&cases().join("C21/singleton_class"), &run, &["--resume", "--epochs", "2"]);
    assert!(
        !ok && log.contains("the run was trained on the classes `a`, `b` and this dataset has `c` besides"),
        "{log}"
    );
    assert_eq!(snapshot_files(&run), before, "a refused resume leaves the folder byte-identical");
    let (ok, log) = cli_train(&data, &run, &["--resume", "--epochs", "2"]);
    assert!(ok, "{log}");
    assert!(log.contains("lacks train.keep_checkpoints") && log.contains("validation accuracy"), "{log}");
    assert_eq!(metric_steps(&run).len(), *metric_steps(&run).last().unwrap(), "each step once");
    assert!(run.join("run.json").exists(), "a resumed old folder gets its manifest");
    let kept = std::fs::read_to_string(run.join("config.previous.toml")).unwrap();
    assert!(kept.contains("max_grad_norm = 1.0"), "keys this version does not know are kept: {kept}");

    let newer = r#"{"format": "vramfit-run", "format_version": 99, "created_by": "9.0.0"}"#;
    std::fs::write(run.join("run.json"), newer).unwrap();
    let before = std::fs::read(&config_path).unwrap();
    let steps = metric_steps(&run);
    for args in [vec!["export", "--run"], vec!["train", "--device", "cpu", "--resume", "--epochs", "3", "--out"]] {
        let mut args: Vec<&std::ffi::OsStr> = args.iter().map(|s| s.as_ref()).collect();
        args.push(run.as_os_str());
        let (ok, log) = vramfit_cli(&args);
        assert!(!ok, "{log}");
        assert!(log.contains("format version 99") && log.contains("update vramfit"), "{log}");
    }
    assert_eq!(std::fs::read(&config_path).unwrap(), before);
    assert_eq!(metric_steps(&run), steps);
}

#[test]
fn sigkill_at_20_points_then_resume_finishes_with_every_step_once() {
    // 10 training images at batch 1, 3 epochs: 30 steps, a checkpoint every 3 steps and at each
    // epoch end. The worker is SIGKILLed at 15 steps and in the middle of 5 checkpoint saves.
    let data = cases().join("C18/dataset");
    let points: Vec<String> = [1, 2, 4, 5, 7, 8, 10, 11, 13, 14, 16, 17, 19, 22, 25]
        .iter()
        .map(|s| s.to_string())
        .chain((1..=5).map(|n| format!("save:{n}")))
        .collect();
    let mut outcomes = Vec::new();
    for point in &points {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let extra = ["--epochs", "3", "--batch-size", "1", "--set", "train.checkpoint_every_steps=3"];
        let (_, log) = cli_train_with_fault(&data, &run, &extra, Some(&format!("kill@{point}")));
        assert!(log.contains("the training process died (SIGKILL"), "{point}: {log}");
        let resumed_from = vramfit::train::checkpoint::find_latest(&run).map_or(0, |l| l.state.global_step);
        let (ok, log) = cli_train(&data, &run, &["--resume"]);
        assert!(ok, "{point}: {log}");
        assert_eq!(metric_steps(&run), (1..=30).collect::<Vec<_>>(), "{point}: every step once");
        for e in std::fs::read_dir(run.join("checkpoints")).unwrap().flatten().filter(|e| e.path().is_dir()) {
            assert!(
                vramfit::train::checkpoint::verify(&e.path(), false, &vramfit::train::checkpoint::CHECKPOINT_FILES)
                    .is_ok(),
                "{point}: {:?}",
                e.path()
            );
        }
        outcomes.push(format!("kill@{point}: resumed from step {resumed_from}"));
    }
    eprintln!("{}", outcomes.join("\n"));
}

/// The checkpoint folders of a run, sorted (`step-00000010`, ...).
fn checkpoint_names(run: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("step-"))
        .collect();
    names.sort();
    names
}

/// Resuming a run that has done all its epochs trains nothing, says why, and leaves its export
/// byte for byte as the run wrote it (the one loop once re-exported it, without its accuracy).
#[test]
fn resuming_a_finished_run_keeps_its_export() {
    let cpu = device::select(DeviceChoice::Cpu(CpuBackend::Flex)).unwrap();
    let splits = bundled_slice(128, 64);
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut config = quickstart();
    config.train.epochs = 1;
    config.train.batch_size = 32;
    let first =
        train::train(&TrainRequest::new(config.clone(), &run), &cpu, &splits, &mut |_| {}, &StopSignal::new()).unwrap();
    let export = first.export_dir.expect("a finished run exports");
    let before = snapshot_files(&export);
    assert!(String::from_utf8_lossy(&before[&export.join("model.json")]).contains("val_accuracy"));
    let mut req = TrainRequest::new(config, &run);
    req.resume = true;
    let mut warnings = Vec::new();
    let again = train::train(
        &req,
        &cpu,
        &splits,
        &mut |e| {
            if let Event::Warning(w) = e {
                warnings.push(w)
            }
        },
        &StopSignal::new(),
    )
    .unwrap();
    assert!(warnings.iter().any(|w| w.starts_with("nothing to train")), "{warnings:?}");
    assert_eq!((again.global_step, again.epochs_completed, again.stopped), (4, 1, false));
    assert_eq!(again.export_dir, None, "nothing was exported in this call");
    assert!(snapshot_files(&export) == before, "the export changed");
}

/// A resume at another batch size converts the epoch's progress to the new batch; a stop before
/// its first step writes that converted state, so the checkpoint and the rewritten config.toml
/// agree and the next resume continues after the images already trained on.
#[test]
fn a_stop_right_after_a_resume_at_a_new_batch_size_saves_the_converted_progress() {
    let cpu = device::select(DeviceChoice::Cpu(CpuBackend::Flex)).unwrap();
    let splits = bundled_slice(128, 64);
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut config = quickstart();
    config.train.epochs = 1;
    config.train.batch_size = 16;
    let mut req = TrainRequest::new(config.clone(), &run);
    req.max_steps = Some(4); // 64 of the epoch's 128 images
    train::train(&req, &cpu, &splits, &mut |_| {}, &StopSignal::new()).unwrap();
    assert_eq!(vramfit::train::checkpoint::latest(&run).unwrap().1.batches_done_in_epoch, 4);
    config.train.batch_size = 32;
    let mut req = TrainRequest::new(config, &run);
    req.resume = true;
    let stop = StopSignal::new();
    stop.stop();
    let s = train::train(&req, &cpu, &splits, &mut |_| {}, &stop).unwrap();
    assert!(s.stopped && s.global_step == 4);
    let (_, state) = vramfit::train::checkpoint::latest(&run).unwrap();
    assert_eq!((state.global_step, state.batches_done_in_epoch), (4, 2), "64 images at batch 32");
    let (stored, _) = vramfit::train::run_dir::load_config(&run).unwrap();
    assert_eq!(stored.train.batch_size, 32);
}

/// Two resumes of one folder started together, 20 times: each round's epoch is trained once
/// (every step once in metrics.csv), never by both; the other process is refused naming the
/// holder, or (started after the first ended) finds nothing left to train. A lock file left with
/// another process's note (pid 1, as a container's init reads) blocks nothing: the kernel's lock
/// is what counts, and a dead process holds none.
#[test]
fn c38_two_resumes_started_together_never_both_train_and_no_lock_file_is_stale() {
    let data = cases().join("C19/dataset");
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let (ok, log) = cli_train(&data, &run, &["--epochs", "1"]);
    assert!(ok, "{log}");
    std::fs::write(run.join(".vramfit.lock"), "process 1 on elsewhere since 2026-01-01_00-00-00 UTC").unwrap();
    let mut refused = 0;
    for round in 0..20 {
        let epochs = (round + 2).to_string();
        let start = || {
            std::process::Command::new(env!("CARGO_BIN_EXE_vramfit"))
                .args(["train", "--device", "cpu", "--resume", "--epochs", &epochs, "--out"])
                .arg(&run)
                .output()
                .unwrap()
        };
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(start);
            let b = s.spawn(start);
            (a.join().unwrap(), b.join().unwrap())
        });
        for out in [a, b] {
            let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            // A driver's complaint about the environment is not vramfit's output (src/main.rs).
            assert!(!text.contains("XDG_RUNTIME_DIR"), "{text}");
            if text.contains("is training in this folder") {
                assert!(text.contains("process ") && !out.status.success(), "{text}");
                refused += 1;
            } else {
                assert!(out.status.success(), "round {round}: {text}");
            }
        }
        assert_eq!(metric_steps(&run), (1..=round + 2).collect::<Vec<_>>(), "round {round}");
    }
    eprintln!("c38 race: {refused} of 40 starts refused by the lock");
}

/// C44: a run folder inside the dataset (`--out photos/runs/first`) is output, not data: the
/// scans of that run, of its resume and of a second run skip it with a note, never "class
/// folders with no images: runs"; `--out` equal to the dataset folder is refused naming both
/// before anything is written into the dataset.
#[test]
fn c44_run_folders_are_never_scanned_as_data() {
    let dir = tempfile::tempdir().unwrap();
    let photos = dir.path().join("photos");
    copy_tree(&cases().join("C44/dataset"), &photos);
    let first = photos.join("runs/first");
    let (ok, log) = cli_train(&photos, &first, &["--epochs", "2", "--batch-size", "4", "--max-steps", "3"]);
    assert!(ok && log.contains("reached --max-steps 3; continue with: vramfit train --resume"), "{log}");
    assert!(log.lines().any(|l| l.starts_with("reached") && l.ends_with(" --device cpu")), "{log}");
    assert!(log.contains("is a vramfit run folder (output, not data): skipped by the scan"), "{log}");
    assert!(first.join(".vramfit-run").is_file());
    let resume =
        [std::ffi::OsStr::new("train"), "--resume".as_ref(), "--device".as_ref(), "cpu".as_ref(), "--out".as_ref()];
    let (code, log) = vramfit_cli_env(&[&resume[..], &[first.as_os_str()]].concat(), None);
    assert_eq!(code, Some(0), "{log}");
    let (ok, log) = cli_train(&photos, &photos.join("runs/second"), &["--epochs", "1", "--batch-size", "4"]);
    assert!(ok && !log.contains("no images"), "{log}");
    let splits = dataset::open(
        &photos,
        &ScanOptions { val_fraction: 0.2, seed: 1, allow_empty_classes: false, csv_paths_outside: false },
    );
    assert_eq!(splits.unwrap().train.class_names, ["a", "b"]);
    // The dataset folder itself as --out: refused, naming both; the dataset is untouched.
    let before = snapshot_files(&photos);
    let (ok, log) = cli_train(&photos, &photos, &["--epochs", "1"]);
    assert!(!ok, "{log}");
    assert!(log.contains("is the dataset folder or holds it") && log.contains("photos"), "{log}");
    assert!(snapshot_files(&photos) == before, "a refused run writes nothing into the dataset");
}

/// Export needs only the weights: with the newest checkpoint's `optimizer.bpk` cut short,
/// `export --run` exports that checkpoint (its step in model.json) without a word about the
/// optimizer, while a resume, which needs the optimizer state, passes over it naming the file.
#[test]
fn a_run_whose_optimizer_state_is_damaged_still_exports_its_newest_weights() {
    let data = cases().join("C19/dataset");
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let (ok, log) = cli_train(&data, &run, &["--epochs", "3"]);
    assert!(ok, "{log}");
    let newest = run.join("checkpoints/step-00000003");
    let optimizer = std::fs::read(newest.join("optimizer.bpk")).unwrap();
    std::fs::write(newest.join("optimizer.bpk"), &optimizer[..optimizer.len() / 2]).unwrap();
    let export = dir.path().join("export");
    let args =
        [std::ffi::OsStr::new("export"), "--run".as_ref(), run.as_os_str(), "--out".as_ref(), export.as_os_str()];
    let (code, log) = vramfit_cli_env(&args, None);
    assert_eq!(code, Some(0), "{log}");
    assert!(!log.contains("optimizer.bpk"), "{log}");
    assert!(log.contains("exporting the weights of step 3, after 3 epochs"), "{log}");
    let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(export.join("model.json")).unwrap()).unwrap();
    assert_eq!(meta["training"]["steps"], 3, "{meta}");
    // --fresh-optimizer: from step 3's intact weights, AdamW's moments reset, no step repeated.
    let fresh = dir.path().join("fresh");
    copy_tree(&run, &fresh);
    let original = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let (ok, log) = cli_train(&data, &run, &["--resume", "--epochs", "4"]);
    assert!(ok, "{log}");
    assert!(log.contains("step-00000003/optimizer.bpk is damaged"), "{log}");
    assert!(log.contains("the weights at step 3 are intact: --fresh-optimizer continues from them"), "{log}");
    assert_eq!(metric_steps(&run), [1, 2, 3, 4], "resumed from step 2, step 3 trained again");
    let (ok, log) = cli_train(&data, &fresh, &["--resume", "--epochs", "4", "--fresh-optimizer"]);
    assert!(ok, "{log}");
    assert!(log.contains("continuing from step 3") && log.contains("with fresh optimizer state"), "{log}");
    assert_eq!(metric_steps(&fresh), [1, 2, 3, 4], "step 3 kept, step 4 trained");
    let rows = std::fs::read_to_string(fresh.join("metrics.csv")).unwrap();
    assert_eq!(rows.lines().nth(3), original.lines().nth(3), "step 3's row is the original one");
}

/// C36: numbers typed for another dataset. On 12 images (10 train): batch 4096 trains, clamped to
/// the training set with a note (no memory figure); accumulating over 1024 batches is pointed
/// out; `--max-steps 0` is refused before anything is written.
#[test]
fn c36_numbers_out_of_proportion_to_the_dataset_are_clamped_or_refused() {
    let data = cases().join("C36/dataset");
    let dir = tempfile::tempdir().unwrap();
    let (ok, log) = cli_train(&data, &dir.path().join("b4096"), &["--epochs", "1", "--batch-size", "4096"]);
    assert!(ok, "{log}");
    assert!(log.contains("train.batch_size = 4096 is more than the 10 training images: batches of 10"), "{log}");
    let accum = dir.path().join("accum");
    let (ok, log) = cli_train(&data, &accum, &["--epochs", "2", "--batch-size", "4", "--grad-accum-steps", "1024"]);
    assert!(ok, "{log}");
    assert!(log.contains("train.grad_accum_steps = 1024 is more than the 3 batches of an epoch"), "{log}");
    assert!(log.contains("lower it to 3 or less (a dataset this small trains better with a small batch"), "{log}");
    assert_eq!(metric_steps(&accum), [1, 2], "one optimizer step per epoch");
    assert!(log.contains("optimizer.warmup_epochs = 0.3 is under one optimizer step here"), "{log}");
    let (ok, log) = cli_train(&data, &accum, &["--resume", "--epochs", "3"]);
    assert!(ok && !log.contains("under one optimizer step"), "a resume does not repeat the note: {log}");
    let steps0 = dir.path().join("steps0");
    let (ok, log) = cli_train(&data, &steps0, &["--epochs", "1", "--max-steps", "0"]);
    assert!(!ok && log.contains("0 steps would train nothing"), "{log}");
    assert!(!steps0.exists(), "a refused command writes no run folder");
    // lr 10: the loss explodes (41177 at step 2, 14018 at step 3, against ln 2 = 0.69): stopped
    // at step 3 with the divergence diagnosis, before training on.
    let lr10 = dir.path().join("lr10");
    let (ok, log) = cli_train(&data, &lr10, &["--epochs", "5", "--batch-size", "4", "--lr", "10"]);
    assert!(!ok, "{log}");
    assert!(log.contains("over 10 times the chance-level loss ln(2) = 0.69 for 2 steps in a row"), "{log}");
    assert!(log.contains("learning rate too high (optimizer.lr = 10"), "{log}");
    assert!(log.contains("at step 3, over"), "{log}");
    assert_eq!(metric_steps(&lr10), [1, 2], "the steps up to the explosion, and no more");
}

/// A checkpoint written before `state.json` had `split_factor`, `scaler` and
/// `best_val_accuracy` (its checksums made for that file): export and resume both read it,
/// taking the documented defaults, instead of failing with "missing field".
#[test]
fn a_checkpoint_from_before_later_state_fields_resumes_and_exports() {
    use vramfit::train::checkpoint::FileChecksum;
    let data = cases().join("C19/dataset");
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let (ok, log) = cli_train(&data, &run, &["--epochs", "2"]);
    assert!(ok, "{log}");
    for step in ["step-00000001", "step-00000002"] {
        let ckpt = run.join("checkpoints").join(step);
        let mut state: serde_json::Value =
            serde_json::from_slice(&std::fs::read(ckpt.join("state.json")).unwrap()).unwrap();
        for key in ["split_factor", "scaler", "best_val_accuracy"] {
            assert!(state.as_object_mut().unwrap().remove(key).is_some(), "{key} in {state}");
        }
        let bytes = serde_json::to_vec(&state).unwrap();
        std::fs::write(ckpt.join("state.json"), &bytes).unwrap();
        let sums_path = ckpt.join("checksums.json");
        let mut sums: serde_json::Value = serde_json::from_slice(&std::fs::read(&sums_path).unwrap()).unwrap();
        sums["state.json"] = serde_json::to_value(FileChecksum::of(&bytes)).unwrap();
        std::fs::write(&sums_path, serde_json::to_vec(&sums).unwrap()).unwrap();
    }
    let export = dir.path().join("export");
    let args =
        [std::ffi::OsStr::new("export"), "--run".as_ref(), run.as_os_str(), "--out".as_ref(), export.as_os_str()];
    let (code, log) = vramfit_cli_env(&args, None);
    assert_eq!(code, Some(0), "{log}");
    assert!(export.join("model.bpk").is_file());
    let (ok, log) = cli_train(&data, &run, &["--resume", "--epochs", "3"]);
    assert!(ok && !log.contains("damaged"), "{log}");
    assert_eq!(metric_steps(&run), [1, 2, 3]);
}

/// What a run was trained on: files added and deleted between a run and its resume. Every file
/// that was in validation stays there, the added ones follow the stable rule, the deleted ones
/// are named and left out, and no metric is written as NaN.
#[test]
fn a_resume_after_files_were_added_and_deleted_keeps_every_validation_file_and_names_the_changes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    copy_tree(&cases().join("C19/dataset"), &data);
    let run = dir.path().join("run");
    let (ok, log) = cli_train(&data, &run, &["--epochs", "1", "--batch-size", "4", "--set", "data.val_fraction=0.3"]);
    assert!(ok, "{log}");
    let record = |run: &Path| -> SplitRecord {
        serde_json::from_slice(&std::fs::read(run.join("data_files.json")).unwrap()).unwrap()
    };
    let before = record(&run);
    let in_split = |r: &SplitRecord, s: Split| -> Vec<String> {
        r.files.iter().filter(|f| f.split == s).map(|f| f.path.clone()).collect()
    };
    let (val_before, train_before) = (in_split(&before, Split::Val), in_split(&before, Split::Train));
    assert_eq!((val_before.len(), train_before.len()), (4, 8), "{before:?}");
    for gone in &train_before[..2] {
        std::fs::remove_file(data.join(gone)).unwrap();
    }
    for i in 0..10 {
        std::fs::copy(data.join("a/img_00.png"), data.join(format!("a/added_{i}.png"))).unwrap();
    }
    let (ok, log) = cli_train(&data, &run, &["--resume", "--epochs", "2"]);
    assert!(ok, "{log}");
    let after = record(&run);
    let val_after = in_split(&after, Split::Val);
    assert!(val_before.iter().all(|v| val_after.contains(v)), "{val_before:?} -> {val_after:?}");
    let added_to_val = (0..10).filter(|i| held_out_by_hash(&format!("a/added_{i}.png"), 0.3) == Split::Val).count();
    assert_eq!(val_after.len(), 4 + added_to_val);
    assert!(log.contains("the dataset changed since the run began: 10 added"), "{log}");
    assert!(log.contains(&format!("2 deleted (left out): {}, {}", train_before[0], train_before[1])), "{log}");
    let deleted: Vec<&str> = after.files.iter().filter(|f| f.deleted).map(|f| f.path.as_str()).collect();
    assert_eq!((after.files.len(), deleted), (12 + 10, vec![train_before[0].as_str(), train_before[1].as_str()]));
    let epochs = std::fs::read_to_string(run.join("epochs.csv")).unwrap();
    assert!(!epochs.to_lowercase().contains("nan") && epochs.lines().count() == 3, "{epochs}");
    // eval of the run evaluates its own validation images, not a fresh split of the folder.
    let csv = dir.path().join("confusion.csv");
    let args = ["eval", "--device", "cpu", "--model"].map(std::ffi::OsStr::new);
    let issues = dir.path().join("label_issues.csv");
    let tail = [
        run.as_os_str(),
        "--data".as_ref(),
        data.as_os_str(),
        "--csv".as_ref(),
        csv.as_os_str(),
        "--label-issues".as_ref(),
        issues.as_os_str(),
    ];
    let (ok, log) = vramfit_cli(&[&args[..], &tail].concat());
    assert!(ok && log.contains("the run's own split"), "{log}");
    assert!(log.contains(&format!("{} images on CPU", val_after.len())), "{log}");
    // The same files in another folder: the run goes on with it, says so, and data.txt follows;
    // every training image of class a gone: warned, the class cannot be learnt.
    let moved = dir.path().join("moved");
    copy_tree(&data, &moved);
    for f in in_split(&after, Split::Train).iter().filter(|f| f.starts_with("a/")) {
        let _ = std::fs::remove_file(moved.join(f));
    }
    let (ok, log) = cli_train(&moved, &run, &["--resume", "--epochs", "3"]);
    assert!(ok, "{log}");
    assert!(log.contains("the run was trained on the data in") && log.contains("data.txt now names it"), "{log}");
    assert!(log.contains("classes with no training image: [\"a\"]"), "{log}");
    let note = std::fs::read_to_string(run.join("data.txt")).unwrap();
    assert_eq!(Path::new(note.trim_end()), moved.canonicalize().unwrap());
}

/// C41: 1000 classes. check-data, train, eval and predict work; check-data lists the smallest
/// classes, not 1000 lines; eval prints the classes and confusions that matter and writes the
/// full matrix to its CSV file; the split printed is the real one (a class of 2 gives one image
/// to validation, so half is held out, not the 10% of data.val_fraction).
#[test]
fn c41_a_thousand_classes_print_a_summary_and_write_the_full_matrix_to_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for c in 0..1000 {
        let class = data.join(format!("class_{c:04}"));
        std::fs::create_dir_all(&class).unwrap();
        std::fs::copy(cases().join("C19/dataset/a/img_00.png"), class.join("img_0.png")).unwrap();
        std::fs::copy(cases().join("C19/dataset/b/img_01.png"), class.join("img_1.png")).unwrap();
    }
    let (ok, log) = vramfit_cli(&["check-data".as_ref(), data.as_os_str()]);
    assert!(ok && log.contains("1000 of 2000 images held out for validation: data.val_fraction 10%"), "{log}");
    assert!(log.contains("... and 990 more classes") && log.lines().count() < 40, "{log}");
    let run = dir.path().join("run");
    let (ok, log) = cli_train(&data, &run, &["--epochs", "1", "--batch-size", "64"]);
    assert!(ok, "{log}");
    let csv = dir.path().join("confusion.csv");
    let args = ["eval", "--device", "cpu", "--model"].map(std::ffi::OsStr::new);
    let issues = dir.path().join("label_issues.csv");
    let tail = [run.as_os_str(), "--data".as_ref(), data.as_os_str(), "--csv".as_ref(), csv.as_os_str()];
    let (ok, log) = vramfit_cli(&[&args[..], &tail, &["--label-issues".as_ref(), issues.as_os_str()]].concat());
    assert!(ok && log.contains("the 10 least accurate of 1000 classes"), "{log}");
    assert!(log.contains("the 10 largest confusions") && log.lines().count() < 40 && log.len() < 5000, "{log}");
    let matrix = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(matrix.lines().count(), 1001, "a header and one row per class");
    let (ok, log) = cli_predict(&run, &[&data.join("class_0999/img_0.png")]);
    assert!(ok && log.contains("class_"), "{log}");
}

/// Run folders of the previous format (a committed fixture, `tests/data/run_folders/README.md`): export
/// reads it as it is, taking the documented defaults for what it lacks and saying so, and a
/// resume continues it at its next step and brings it to the current format.
#[test]
fn fixture_run_folders_of_the_previous_format_export_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("v0");
    copy_tree(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/run_folders/v0-tiny"), &run);
    let export = dir.path().join("export");
    let args = ["export", "--run"].map(std::ffi::OsStr::new);
    let (ok, log) = vramfit_cli(&[&args[..], &[run.as_os_str(), "--out".as_ref(), export.as_os_str()]].concat());
    assert!(ok && log.contains("no run.json") && log.contains("train.keep_checkpoints = 2 (added after"), "{log}");
    let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(export.join("model.json")).unwrap()).unwrap();
    assert_eq!(
        (meta["training"]["steps"].as_u64(), meta["class_names"].as_array().map(Vec::len)),
        (Some(1), Some(2)),
        "{meta}"
    );
    let (ok, log) = cli_train(&cases().join("C19/dataset"), &run, &["--resume", "--epochs", "2"]);
    assert!(ok && log.contains("has no record of its files (made by an older vramfit)"), "{log}");
    assert_eq!(metric_steps(&run), [1, 2], "continued at step 2");
    for now in ["run.json", "data_files.json", "data.txt", ".vramfit-run", "export/model.onnx"] {
        assert!(run.join(now).exists(), "{now} after the resume");
    }
}

/// Ctrl-C, or a SIGINT to the `vramfit train` process alone (`kill -INT`, a process manager):
/// the worker, in a process group of its own, is asked to stop by its parent; it stops after its
/// step with a checkpoint, and the command says how to continue.
#[test]
fn a_sigint_to_the_train_command_alone_stops_its_worker_with_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_vramfit"))
        .args(["train", "--device", "cpu", "--epochs", "10000", "--batch-size", "2", "--data"])
        .arg(cases().join("C19/dataset"))
        .arg("--out")
        .arg(&run)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while std::fs::read_to_string(run.join("metrics.csv")).map_or(true, |t| t.lines().count() < 3) {
        assert!(started.elapsed().as_secs() < 120, "no step after 120 s");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let kill = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let stopping = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if stopping.elapsed().as_secs() > 60 {
            let _ = child.kill();
            panic!("the command was still training 60 s after its SIGINT");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("stopping after this step"), "{text}");
    assert!(text.contains("stopped; continue with: vramfit train --resume --out"), "{text}");
    assert!(!checkpoint_names(&run).is_empty(), "a checkpoint was saved: {text}");
}

/// `vramfit train --device cpu` with `VRAMFIT_FAULT=hang@started` (the training loop held
/// before its first step, as a first step compiling kernels for minutes is) and `extra`, once
/// its loop is held there: the child, its stderr lines and the text read so far.
fn train_held_before_its_first_step(
    run: &Path,
    extra: &[&str],
) -> (std::process::Child, std::sync::mpsc::Receiver<String>, String) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_vramfit"))
        .args(["train", "--device", "cpu", "--epochs", "1", "--batch-size", "2", "--data"])
        .arg(cases().join("C19/dataset"))
        .arg("--out")
        .arg(run)
        .args(extra)
        .env("VRAMFIT_FAULT", "hang@started")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut text = String::new();
    while !text.contains("VRAMFIT_FAULT: hang at started") {
        match lines.recv_timeout(std::time::Duration::from_secs(120)) {
            Ok(line) => text.push_str(&(line + "\n")),
            Err(e) => panic!("the run never reached its first step ({e}): {text}"),
        }
    }
    (child, lines, text)
}

/// Sends `signal` to `child` `times` times, 0.2 s apart, and waits up to 30 s for it to end;
/// returns its exit status and everything it wrote to stderr.
fn signal_and_wait(
    mut child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    mut text: String,
    signal: &str,
    times: usize,
) -> (std::process::ExitStatus, String) {
    for _ in 0..times {
        let kill = std::process::Command::new("kill").args([signal, &child.id().to_string()]).status().unwrap();
        assert!(kill.success());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let stopping = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if stopping.elapsed().as_secs() > 30 {
            let _ = child.kill();
            panic!("still running 30 s after {signal}: {text}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    text.extend(lines.try_iter().map(|l| l + "\n"));
    (status, text)
}

/// `vramfit train --resume --device cpu --max-steps STEPS --out RUN`, waiting up to 20 s for a
/// worker of an earlier command to let go of the folder; (exit code, output).
fn resume_when_free(run: &Path, steps: &str) -> (Option<i32>, String) {
    let args = ["train", "--resume", "--device", "cpu", "--max-steps", steps, "--out"].map(std::ffi::OsStr::new);
    let started = std::time::Instant::now();
    loop {
        let (code, text) = vramfit_cli_env(&[&args[..], &[run.as_os_str()]].concat(), None);
        if !text.contains("is training in this folder") || started.elapsed().as_secs() > 20 {
            return (code, text);
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

/// Stop while the first step is still being prepared (on a GPU it compiles every kernel, for
/// minutes on a software adapter, and cannot be interrupted): the worker is ended a few seconds
/// after the stop instead of the two minutes a stuck step gets, the command says nothing was
/// lost and how to start again, and the run folder resumes. A second Ctrl-C or a SIGTERM
/// (the parent quits at once) leaves no worker behind holding the folder; a resumed run
/// stopped so names the step it stands at.
#[test]
fn a_stop_before_the_first_step_ends_the_worker_in_seconds_and_the_run_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let (child, lines, text) = train_held_before_its_first_step(&run, &[]);
    let (status, text) = signal_and_wait(child, lines, text, "-INT", 1);
    assert!(status.success(), "{text}");
    assert!(text.contains("stopped before the first step ended (nothing to save)"), "{text}");
    let resume = format!("start it again with: vramfit train --resume --out {} --device cpu", run.display());
    assert!(text.contains(&resume), "{text}");
    let checkpoints = run.join("checkpoints");
    assert!(!checkpoints.exists() || checkpoint_names(&run).is_empty(), "no step, no checkpoint: {text}");
    // The folder resumes: from step 0, saying so.
    let (code, resumed) = resume_when_free(&run, "2");
    assert_eq!(code, Some(0), "{resumed}");
    assert!(resumed.contains("has no checkpoint yet: the run starts again from step 0"), "{resumed}");

    // A resumed run held before its next step, then quit at once (two Ctrl-C, or SIGTERM): no
    // worker is left holding the folder, which resumes from its step.
    for (signal, times, steps) in [("-INT", 2, 3), ("-TERM", 1, 4)] {
        let (child, lines, text) = train_held_before_its_first_step(&run, &["--resume"]);
        let (status, text) = signal_and_wait(child, lines, text, signal, times);
        assert!(!status.success(), "{signal} x{times}: {text}");
        let (code, resumed) = resume_when_free(&run, &steps.to_string());
        assert_eq!(code, Some(0), "{signal} x{times}: the folder is free: {resumed}");
        assert_eq!(metric_steps(&run), (1..=steps).collect::<Vec<_>>(), "{signal} x{times}: {resumed}");
    }
    // One stop of a resumed run held before its next step: the step it stands at.
    let (child, lines, text) = train_held_before_its_first_step(&run, &["--resume"]);
    let (status, text) = signal_and_wait(child, lines, text, "-INT", 1);
    assert!(status.success(), "{text}");
    assert!(text.contains("stopped before step 5 ended: the run stands at step 4 (its checkpoint kept)"), "{text}");
}
