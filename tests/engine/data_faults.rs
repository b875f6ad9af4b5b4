//! Whole-dataset faults and the second set of cases (C21, C24, C26, C29-C32, layout).

use super::*;

#[test]
fn c21_empty_validation_is_warned_shown_as_na_and_fewer_than_two_classes_refused() {
    let dir = tempfile::tempdir().unwrap();
    // a: 1 image, b: 1 image: both train; the validation split is empty.
    let run = dir.path().join("one");
    let (ok, log) = cli_train(&cases().join("C21/one_per_class"), &run, &["--epochs", "1"]);
    assert!(ok, "{log}");
    assert!(log.contains("validation split") && log.contains("is empty"), "{log}");
    assert!(log.contains("val loss n/a acc n/a"), "{log}");
    assert!(log.contains("validation accuracy n/a (top-5 n/a) on 0 images"), "{log}");
    assert!(!log.contains("NaN") && !log.contains(" 0.00%"), "{log}");
    let epochs = std::fs::read_to_string(run.join("epochs.csv")).unwrap();
    let row: Vec<&str> = epochs.lines().nth(1).unwrap().split(',').collect();
    assert_eq!(&row[3..6], ["", "", ""], "no validation metrics: empty cells, not zeros ({epochs})");
    // `eval` on zero images is an error.
    let (ok, log) = vramfit_cli(&[
        "eval".as_ref(),
        "--device".as_ref(),
        "cpu".as_ref(),
        "--model".as_ref(),
        run.as_os_str(),
        "--data".as_ref(),
        cases().join("C21/one_per_class").as_os_str(),
    ]);
    assert!(!ok && log.contains("nothing to measure"), "{log}");
    // a: 6, b: 6, c: 1: c has no validation image, named before training.
    let (ok, log) = cli_train(&cases().join("C21/singleton_class"), &dir.path().join("single"), &["--epochs", "1"]);
    assert!(ok, "{log}");
    assert!(log.contains(r#"classes with no validation image: ["c"]"#), "{log}");
    // One class: refused before training.
    let one = dir.path().join("one_class");
    copy_tree(&cases().join("C21/singleton_class/a"), &one.join("a"));
    let (ok, log) = cli_train(&one, &dir.path().join("run1"), &["--epochs", "1"]);
    assert!(!ok, "{log}");
    assert!(log.contains("1 class") && log.contains("at least 2 class folders"), "{log}");
}

#[test]
fn c31_undecodable_classes_are_refused_before_training_and_bad_files_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    // One zero-byte file at batch size 1: skipped and counted every epoch, training goes on.
    let run = dir.path().join("one_bad");
    let (ok, log) = cli_train(&cases().join("C31/one_bad_file"), &run, &["--epochs", "2", "--batch-size", "1"]);
    assert!(ok, "{log}");
    assert!(log.contains("img_99_zero_bytes.jpg"), "the skipped file is named: {log}");
    let epochs = std::fs::read_to_string(run.join("epochs.csv")).unwrap();
    let skipped: Vec<&str> = epochs.lines().skip(1).map(|l| l.rsplit(',').next().unwrap()).collect();
    let trained_with_it = skipped.iter().filter(|s| **s == "1").count();
    assert!(trained_with_it >= 1 && skipped.iter().all(|s| *s == "0" || *s == "1"), "{epochs}");
    // Only undecodable files: refused before training with per-class counts.
    let (ok, log) = cli_train(&cases().join("C31/all_bad"), &dir.path().join("all_bad"), &["--epochs", "1"]);
    assert!(!ok, "{log}");
    assert!(log.contains("classes with no decodable image") && log.contains("0 of"), "{log}");
    assert!(!dir.path().join("all_bad/checkpoints").exists());
}

#[test]
fn c32_paths_with_spaces_and_file_uris_work_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let data = cases().join("C32/my data/train set");
    let run = dir.path().join("runs with spaces/März run");
    // Plain paths with spaces and non-ASCII.
    let (ok, log) = cli_train(&data, &run, &["--epochs", "1"]);
    assert!(ok, "{log}");
    // The same as file:// URIs, for every path argument.
    let uri_run = dir.path().join("uri run");
    let (ok, log) = cli_train(Path::new(&file_uri(&data)), Path::new(&file_uri(&uri_run)), &["--epochs", "1"]);
    assert!(ok, "{log}");
    assert!(uri_run.join("export/model.onnx").is_file(), "the URI named the folder: {log}");
    let dropped = cases().join("C32/dropped folder");
    let (ok, log) = vramfit_cli(&[
        "predict".as_ref(),
        "--json".as_ref(),
        "--device".as_ref(),
        "cpu".as_ref(),
        "--model".as_ref(),
        file_uri(&run).as_ref(),
        file_uri(&dropped).as_ref(),
        file_uri(&dropped.join("Foto März 1.png")).as_ref(),
    ]);
    assert!(ok, "{log}");
    let files: Vec<String> = log
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["file"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(files.len(), 3, "the folder's two images (nested included) and the file: {log}");
    assert!(files.iter().all(|f| !f.contains("file:") && !f.contains('%')), "{files:?}");
    assert!(files.iter().filter(|f| f.ends_with("Foto März 1.png")).count() == 2, "{files:?}");
    let (ok, log) = vramfit_cli(&["check-data".as_ref(), file_uri(&data).as_ref()]);
    assert!(
        ok && log.contains("2 classes, 12 files")
            && log.contains("my data/train set (2 of 12 images held out for validation: data.val_fraction 10%"),
        "{log}"
    );
}

#[test]
fn c26_out_of_range_config_values_are_refused_at_load_time_naming_key_value_and_range() {
    let configs = cases().join("C26/configs");
    for (file, key, value) in [
        ("warmup_inf.toml", "optimizer.warmup_epochs", "inf"),
        ("epsilon_zero.toml", "optimizer.epsilon", "0"),
        ("max_pixels_tiny.toml", "data.max_image_pixels", "100"),
    ] {
        let err = vramfit::config::Config::load(&configs.join(file)).unwrap_err().to_string();
        assert!(err.contains(file) && err.contains(&format!("{key} = {value}")), "{err}");
        assert!(err.contains("range") || err.contains("at least"), "the message gives the valid range: {err}");
    }
    // The same through overrides, for every kind of bad number.
    for bad in [
        "optimizer.lr=nan",
        "optimizer.lr=-1",
        "optimizer.epsilon=-1e-8",
        "model.head_init_std=-0.01",
        "data.mean=[nan, 0.5, 0.5]",
        "data.std=[0.3, 0.0, 0.3]",
        "optimizer.warmup_epochs=5",
        "train.label_smoothing=inf",
    ] {
        let mut config = quickstart();
        let err = config.set(bad).unwrap_err().to_string();
        let key = bad.split('=').next().unwrap();
        assert!(err.contains(key), "{bad}: {err}");
    }
    // A config that loads trains: the dataset with the fixed values runs 2 steps to finite losses.
    let (ok, log) = cli_train(
        &cases().join("C26/dataset"),
        &tempfile::tempdir().unwrap().path().join("r"),
        &["--epochs", "1", "--batch-size", "2", "--max-steps", "2"],
    );
    assert!(ok && !log.contains("NaN"), "{log}");
}

#[test]
fn eval_of_a_read_only_model_folder_succeeds_and_says_where_the_csv_went() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let data = cases().join("C18/dataset");
    let (ok, log) = cli_train(&data, &run, &["--epochs", "1", "--batch-size", "2"]);
    assert!(ok, "{log}");
    let export = run.join("export");
    let mut perms = std::fs::metadata(&export).unwrap().permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(&export, perms.clone()).unwrap();
    let cwd = dir.path().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramfit"))
        .args(["eval", "--device", "cpu", "--model"])
        .arg(&export)
        .arg("--data")
        .arg(&data)
        .current_dir(&cwd)
        .output()
        .unwrap();
    #[allow(clippy::permissions_set_readonly_false)] // restores the temp folder's write bit for its removal
    perms.set_readonly(false);
    std::fs::set_permissions(&export, perms).unwrap();
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{log}");
    assert!(log.contains("confusion matrix written to confusion.csv") && cwd.join("confusion.csv").is_file(), "{log}");
    assert!(!export.join("confusion.csv").exists());
}

#[cfg(unix)]
#[test]
fn layout_links_to_an_ancestor_dangling_links_and_stray_root_images_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    for class in ["cat", "dog"] {
        copy_tree(&cases().join("C18/dataset/a"), &root.join(class));
    }
    std::os::unix::fs::symlink("..", root.join("dog/loop")).unwrap(); // dog/loop -> the root
    std::os::unix::fs::symlink("../cat", root.join("dog/cats")).unwrap(); // into another class
    std::os::unix::fs::symlink("missing.png", root.join("dog/x.jpg")).unwrap();
    std::fs::copy(cases().join("C18/dataset/a/img_00.png"), root.join("stray.png")).unwrap();
    // Class folders that are links into the dataset: the root itself, and another class.
    std::os::unix::fs::symlink(".", root.join("self")).unwrap();
    std::os::unix::fs::symlink("cat", root.join("kitty")).unwrap();
    let (ds, report) = scan(&root, false).unwrap();
    assert_eq!(ds.class_names, ["cat", "dog"], "links into the dataset are not classes");
    assert_eq!(ds.class_counts(), [6, 6], "no image of another class is counted under dog");
    assert_eq!(report.symlink_loops.len(), 4, "{:?}", report.symlink_loops);
    let dangling: Vec<_> =
        report.ignored.iter().filter(|(_, why)| *why == dataset::IGNORED_DANGLING).map(|(p, _)| p.clone()).collect();
    assert_eq!(dangling, [root.join("dog/x.jpg")]);
    assert_eq!(report.stray_root_images, [root.join("stray.png")]);
    let (ok, log) = vramfit_cli(&["check-data".as_ref(), root.as_os_str()]);
    assert!(ok, "{log}");
    assert!(log.contains("stray.png is directly in the dataset root"), "{log}");
    assert!(log.contains("x.jpg: dangling symbolic link"), "{log}");
    assert!(log.contains("dog/loop is a symbolic link back into the dataset"), "{log}");
}

#[test]
fn c29_a_bmp_with_an_all_zero_alpha_is_opaque_and_flat_images_are_named() {
    let bmp32 = load("C29", "bmp32_v4_alpha_mask_all_zero.bmp").unwrap();
    let bmp24 = load("C29", "bmp24_bottomup_control.bmp").unwrap();
    assert_eq!(bmp32, bmp24, "the same picture as the 24-bit control");
    assert_eq!(
        (bmp32.get_pixel(14, 2).0, bmp32.get_pixel(14, 25).0),
        ([220, 30, 30], [30, 30, 220]),
        "red top, blue bottom"
    );
    // A flat image in a dataset: check-data names it, and training warns about it.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    copy_tree(&cases().join("C18/dataset"), &data);
    image::RgbImage::from_pixel(28, 28, image::Rgb([255, 255, 255])).save(data.join("a/blank.png")).unwrap();
    let (ok, log) = vramfit_cli(&["check-data".as_ref(), data.as_os_str()]);
    assert!(ok && log.contains("blank.png is one flat colour"), "{log}");
    let (ok, log) = cli_train(&data, &dir.path().join("run"), &["--epochs", "1", "--set", "data.val_fraction=0.0"]);
    assert!(ok && log.contains("blank.png is one flat colour"), "{log}");
}

#[cfg(unix)]
#[test]
fn c24_class_names_that_are_not_utf8_are_refused_and_such_file_names_never_panic() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for name in [&b"caf\xe9"[..], &b"caf\xe8"[..]] {
        copy_tree(&cases().join("C18/dataset/a"), &data.join(std::ffi::OsStr::from_bytes(name)));
    }
    let (ok, log) = cli_train(&data, &dir.path().join("run"), &["--epochs", "1"]);
    assert!(!ok, "{log}");
    assert!(log.contains("not valid UTF-8") && log.contains("caf\u{FFFD}") && log.contains("convmv"), "{log}");
    // A file whose own name is not UTF-8: trained on, and predict --json writes it lossily.
    let good = dir.path().join("good");
    copy_tree(&cases().join("C18/dataset"), &good);
    let odd = good.join("a").join(std::ffi::OsStr::from_bytes(b"img_\xff.png"));
    std::fs::copy(good.join("a/img_00.png"), &odd).unwrap();
    let run = dir.path().join("run2");
    let (ok, log) = cli_train(&good, &run, &["--epochs", "1"]);
    assert!(ok, "{log}");
    let (ok, log) = vramfit_cli(&[
        "predict".as_ref(),
        "--json".as_ref(),
        "--device".as_ref(),
        "cpu".as_ref(),
        "--model".as_ref(),
        run.as_os_str(),
        odd.as_os_str(),
    ]);
    assert!(ok && log.contains("img_\u{FFFD}.png"), "{log}");
}

#[test]
fn when_one_image_is_over_the_buffer_limit_the_advice_is_not_a_smaller_batch() {
    let Some(device) = gpu_or_skip() else { return };
    let mut config = quickstart();
    config.data.preprocess = PreprocessConfig { mode: PreprocessMode::ResizeAndCrop, load_size: 4096, crop_size: 4096 };
    config.train.batch_size = 1;
    config.memory.memory_budget_bytes = 1 << 50;
    let dir = tempfile::tempdir().unwrap();
    let req = TrainRequest::new(config, dir.path().join("run"));
    let err = train::train(&req, &device, &bundled(), &mut |_| {}, &StopSignal::new()).unwrap_err().to_string();
    assert!(err.contains("even one image does not fit") && err.contains("--device cpu"), "{err}");
    assert!(!err.contains("batch_size <="), "{err}");
}

/// `vramfit predict --json --top-k 2` of `photo` with the model in `export` on `device`: the
/// top classes with their probabilities, and stderr (checked free of panics).
fn predict_json(export: &Path, photo: &Path, device: &str) -> (Vec<(String, f64)>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramfit"))
        .args(["predict", "--json", "--top-k", "2", "--device", device, "--model"])
        .arg(export)
        .arg(photo)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"), "{stderr}");
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let top: Vec<(String, f64)> = line["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap().to_string(), c["probability"].as_f64().unwrap()))
        .collect();
    (top, stderr)
}

/// C30: a model trained in mode `none` (sizes kept) meets a 4000x3000 photo. On a wgpu adapter
/// (lavapipe in CI: 128 MiB per buffer) the input is checked before upload and predicted on the
/// CPU with a one-line notice, agreeing with `--device cpu`; evaluation of such photos is refused
/// naming the limit and the fix; training at that size is refused before its first step. Never a
/// panic or a backtrace.
#[test]
fn c30_inputs_over_the_adapters_buffer_limit_never_reach_the_device() {
    if gpu_or_skip().is_none() {
        return;
    }
    let c30 = cases().join("C30");
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let (ok, text) =
        cli_train(&c30.join("dataset"), &run, &["--preprocess", "none", "--epochs", "1", "--batch-size", "4"]);
    assert!(ok, "{text}");
    let photo = c30.join("photo_4000x3000.png");
    let predict = |device: &str| predict_json(&run.join("export"), &photo, device);
    let (on_cpu, _) = predict("cpu");
    let (on_gpu, notice) = predict("gpu");
    assert_eq!(on_gpu.len(), 2);
    for ((a, pa), (b, pb)) in on_gpu.iter().zip(&on_cpu) {
        assert_eq!(a, b);
        assert!((pa - pb).abs() < 1e-5, "{on_gpu:?} vs {on_cpu:?}");
    }
    assert!(
        notice.contains("4000x3000 input needs a") && notice.contains("predicted on the CPU"),
        "the fallback is announced: {notice}"
    );
    assert_eq!(notice.lines().filter(|l| l.contains("predicted on the CPU")).count(), 1, "{notice}");

    // Evaluation and training on a dataset of such photos: refused before upload, naming the limit.
    let big = dir.path().join("big");
    for class in ["a", "b"] {
        std::fs::create_dir_all(big.join(class)).unwrap();
        std::fs::copy(&photo, big.join(class).join("photo.png")).unwrap();
    }
    let export = run.join("export");
    let eval: [&std::ffi::OsStr; 8] = [
        "eval".as_ref(),
        "--device".as_ref(),
        "gpu".as_ref(),
        "--train-split".as_ref(),
        "--model".as_ref(),
        export.as_os_str(),
        "--data".as_ref(),
        big.as_os_str(),
    ];
    let (code, text) = vramfit_cli_env(&eval, None);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("per buffer") && text.contains("--device cpu"), "{text}");
    assert!(!text.contains("panicked"), "{text}");
    let mut args: Vec<&std::ffi::OsStr> =
        ["train", "--device", "gpu", "--preprocess", "none", "--data"].iter().map(|s| s.as_ref()).collect();
    let run2 = dir.path().join("run2");
    args.extend([
        big.as_os_str(),
        "--out".as_ref(),
        run2.as_os_str(),
        "--set".as_ref(),
        "data.val_fraction=0.5".as_ref(),
    ]);
    let (code, text) = vramfit_cli_env(&args, None);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("even one image does not fit") && text.contains("--device cpu"), "{text}");
}

/// `vramfit check-data` on one folder mixing the second set's cases (under a path with a space,
/// given as a `file://` URI): it prints the whole report, exits 0, and names every problem,
/// including those that would stop training (a class name that is not UTF-8, an empty class, a
/// class with no decodable file, a photo whose size differs in mode `none`).
#[cfg(unix)]
#[test]
fn check_data_on_a_folder_mixing_the_second_set_names_every_problem_and_exits_0() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mixed data");
    for class in ["a", "b", "dog"] {
        copy_tree(&cases().join("C18/dataset/a"), &root.join(class));
    }
    let single = root.join("c");
    std::fs::create_dir_all(&single).unwrap();
    std::fs::copy(cases().join("C18/dataset/a/img_00.png"), single.join("only.png")).unwrap(); // C21
    std::fs::write(root.join("a/broken.jpg"), b"").unwrap(); // C31
    std::fs::write(root.join("b/notes.png"), b"text, not an image").unwrap();
    copy_tree(&cases().join("C31/all_bad/a"), &root.join("only_bad")); // C31: nothing decodes
    std::fs::create_dir_all(root.join("empty")).unwrap();
    std::fs::copy(cases().join("C29/bmp32_v4_alpha_mask_all_zero.bmp"), root.join("a/bmp32.bmp")).unwrap();
    image::RgbImage::from_pixel(28, 28, image::Rgb([255, 255, 255])).save(root.join("a/blank.png")).unwrap(); // C29
    copy_tree(&cases().join("C18/dataset/a"), &root.join(std::ffi::OsStr::from_bytes(b"caf\xe9"))); // C24
    std::fs::copy(cases().join("C30/photo_4000x3000.png"), root.join("dog/photo.png")).unwrap(); // C30 / C15
    std::os::unix::fs::symlink("..", root.join("dog/loop")).unwrap(); // layout
    std::os::unix::fs::symlink("missing.png", root.join("dog/x.jpg")).unwrap();
    std::fs::copy(cases().join("C18/dataset/a/img_00.png"), root.join("stray.png")).unwrap();
    let (ok, log) = vramfit_cli(&["check-data".as_ref(), file_uri(&root).as_ref()]); // C32
    // The whole report, and a failure exit: training on it would stop.
    assert!(!ok && log.contains("error: training on this dataset would stop"), "{log}");
    for problem in [
        "not valid UTF-8",
        "class folders with no images: empty",
        "\"only_bad\": 0 of",
        "a/broken.jpg",
        "b/notes.png",
        // Skipped files grouped by the typed fault (image_io::ImageFault::kind), with counts.
        "\n  empty file: 1\n",
        "\n  not an image: 4\n",
        "a/blank.png is one flat colour",
        "classes with no validation image: [\"c\"]",
        "mode `none` trains each image at its own size",
        "dog/loop is a symbolic link back into the dataset",
        "x.jpg: dangling symbolic link",
        "stray.png is directly in the dataset root",
    ] {
        assert!(log.contains(problem), "check-data must name `{problem}`:\n{log}");
    }
    assert!(!log.contains("bmp32.bmp is one flat colour"), "an all-zero alpha is opaque, not blank: {log}");
    // Training on it is refused before any step, with the first of those problems.
    let (ok, log) = cli_train(&root, &dir.path().join("run"), &["--epochs", "1"]);
    assert!(!ok && log.contains("not valid UTF-8"), "{log}");
}

/// C35: configs as people save them. A BOM, CRLF line ends and UTF-16 (with its BOM) read as the
/// same config; Latin-1 is refused naming the byte, its line and the fix; a misspelt key or
/// section gets "did you mean", in files and in `--set`; a budget is written with a unit in a
/// file exactly as on the command line.
#[test]
fn c35_configs_as_people_save_them_load_or_say_how_to_fix_them() {
    let configs = cases().join("C35/configs");
    let load = |f: &str| Config::load(&configs.join(f));
    let reference = load("utf8_bom.toml").unwrap();
    assert_eq!(load("crlf.toml").unwrap(), reference);
    assert_eq!(load("utf16le_bom.toml").unwrap(), reference);
    let e = load("latin1_comment.toml").unwrap_err().to_string();
    assert!(e.contains("byte 0xF6 at line 3, column 5 is not UTF-8") && e.contains("save it as UTF-8"), "{e}");
    for (file, hint) in
        [("typo_key.toml", "`lr`"), ("typo_section.toml", "`train`"), ("typo_case.toml", "`batch_size`")]
    {
        let e = load(file).unwrap_err().to_string();
        assert!(e.ends_with(&format!("did you mean {hint}?")), "{file}: {e}");
    }
    let mut config = Config::default();
    let e = config.set("train.epoch=3").unwrap_err().to_string();
    assert!(e.contains("unknown key `train.epoch`; did you mean `train.epochs`?"), "{e}");
    let e = config.set("optimizer.learning_rate=0.001").unwrap_err().to_string();
    assert!(e.contains("did you mean `optimizer.lr`?"), "{e}");
    assert!(!config.set("train.zzqx_wvj=1").unwrap_err().to_string().contains("did you mean"));
    assert!(config.set("optimiser.lr=0.1").unwrap_err().to_string().contains("did you mean `optimizer.lr`?"));
    assert!(config.set("epochs=3").unwrap_err().to_string().contains("did you mean `train.epochs`?"));
    let budget = |value: &str| {
        Config::from_toml(&format!("[memory]\nmemory_budget_bytes = {value}\n"), "t.toml")
            .map(|c| c.memory.memory_budget_bytes)
            .map_err(|e| e.to_string())
    };
    assert_eq!(budget("\"6GiB\""), Ok(6 << 30));
    assert_eq!(budget("\"6144MiB\""), Ok(6 << 30));
    assert_eq!(budget("\"6 GB\""), Ok(6_000_000_000));
    assert_eq!(budget("6442450944"), Ok(6 << 30));
    assert!(budget("\"6,5GiB\"").unwrap_err().contains("write decimals with a dot"));
    assert!(budget("-1").unwrap_err().contains("is negative"));
    assert_eq!(budget("6e9"), Ok(6_000_000_000));
    assert!(budget("1.5").unwrap_err().contains("not a whole"));
    config.set("memory.memory_budget_bytes=1.5GiB").unwrap();
    assert_eq!(config.memory.memory_budget_bytes, 3 << 29);
}

/// Output piped into a reader that stops early (`vramfit check-data D | head -1`): the command
/// ends as Unix tools do (SIGPIPE), never with a panic and a backtrace.
#[test]
fn a_reader_that_stops_early_ends_the_command_quietly() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_vramfit"))
        .args(["check-data"])
        .arg(cases().join("C42/dataset"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader is gone before the first line
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{stderr}");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(13), "ended by SIGPIPE: {:?} {stderr}", out.status);
}
