//! Data health (cases C33 and C34): copies found and named by kind, label conflicts, validation
//! copies of training images, the imbalance warning, the balanced metrics, and the two
//! class-balance options changing what a model learns.

use super::*;

/// A config whose caches live in `dir` (the hash cache is asserted on).
fn config_caching_in(dir: &Path) -> Config {
    let mut config = quickstart();
    config.data.cache_dir = dir.to_string_lossy().into_owned();
    config
}

#[test]
fn c33_check_data_names_each_copy_by_kind_the_label_conflict_and_reads_hashes_back() {
    let cache = tempfile::tempdir().unwrap();
    let config = config_caching_in(cache.path());
    let data = cases().join("C33/dataset");
    let r = vramfit::data::check_data::report(&data, &config, false).unwrap().text;
    for line in [
        "duplicates among 24 images",
        "the same picture under two labels (one label is wrong): 1",
        "  cat/img_01.png [cat] = dog/from_cat_img_01.png [dog] (byte-identical)",
        "copies inside one class (harmless, but the picture weighs more): 3",
        "  cat/img_03 (1).png = cat/img_03.png (byte-identical)",
        "  cat/img_05.png = cat/img_05_resaved.png (pixel-identical)",
        "  cat/img_07 - Copy.png = cat/img_07.png (byte-identical)",
    ] {
        assert!(r.contains(line), "missing {line:?} in\n{r}");
    }
    assert!(!r.contains("from the cache"), "the first scan decodes: {r}");
    let again = vramfit::data::check_data::report(&data, &config, false).unwrap().text;
    assert!(again.contains("24 hashes from the cache"), "{again}");
    assert_eq!(again.lines().filter(|l| l.starts_with("  cat/")).count(), 4, "the same groups from the cache");
}

#[test]
fn c33_validation_copies_of_training_images_are_counted_and_can_be_left_out() {
    let cache = tempfile::tempdir().unwrap();
    let data = cases().join("C33/dataset_trainval");
    let r = vramfit::data::check_data::report(&data, &config_caching_in(cache.path()), false).unwrap().text;
    assert!(r.contains("validation images that copy training images: 2 (validation accuracy is inflated"), "{r}");
    assert!(r.contains("  val/cat/img_02_again.png = train/cat/img_02.png (byte-identical)"), "{r}");
    assert!(r.contains("  val/dog/img_04.png = train/dog/img_04.png (byte-identical)"), "{r}");
    assert!(!r.contains("copies inside one class"), "leaked copies are leakage only: {r}");

    let dir = tempfile::tempdir().unwrap();
    let cache_flag = format!("data.cache_dir=\"{}\"", cache.path().display());
    let common = ["--epochs", "1", "--batch-size", "4", "--set", &cache_flag];
    let (ok, out) = cli_train(&data, &dir.path().join("kept"), &common);
    assert!(ok, "{out}");
    assert!(
        out.contains("warning: data health: 2 validation copies of training images (validation accuracy inflated)"),
        "{out}"
    );
    assert!(out.contains("on 6 images"), "{out}");
    let report = std::fs::read_to_string(dir.path().join("kept").join(vramfit::data::health::REPORT_FILE)).unwrap();
    assert!(report.contains("val/dog/img_04.png = train/dog/img_04.png"), "{report}");
    // A run trained to its end ranks every image's label: 22 images (16 train + 6 val).
    assert!(out.contains("label issues: ") && out.contains(" of 22 images look mislabelled"), "{out}");
    let issues = std::fs::read_to_string(dir.path().join("kept/label_issues.csv")).unwrap();
    let header = "path,split,given_label,predicted_label,given_probability,predicted_probability";
    assert_eq!(issues.lines().next(), Some(header));
    assert!(issues.lines().skip(1).all(|l| l.contains(",train,") || l.contains(",val,")), "{issues}");

    let dropped = [&common[..], &["--set", "data.drop_leaked_val=true"]].concat();
    let (ok, out) = cli_train(&data, &dir.path().join("dropped"), &dropped);
    assert!(ok, "{out}");
    assert!(out.contains("validation leaves out its 2 images that copy training images (4 evaluated)"), "{out}");
    assert!(out.contains("on 4 images"), "{out}");
}

#[test]
fn c34_imbalance_is_warned_with_what_to_do() {
    let r = vramfit::data::check_data::report(&cases().join("C34/dataset"), &quickstart(), false).unwrap().text;
    assert!(
        r.contains(
            "warning: class imbalance 20.0:1 (largest `common` 60 images, smallest `rare` 3): a model trained for \
             accuracy learns to neglect small classes"
        ),
        "{r}"
    );
    assert!(r.contains("train.class_weights = \"balanced\"") && r.contains("data.sampler = \"balanced\""), "{r}");
}

/// Trains C34 for 20 epochs on the CPU with `set` applied; returns the run's mean probability of
/// `rare` over the three `rare` images and its validation result.
fn c34_rare_probability(set: &[&str], dir: &Path) -> (f32, vramfit::inference::eval::EvalResult) {
    let cpu = device::select(DeviceChoice::Cpu(CpuBackend::Flex)).unwrap();
    let mut config = quickstart();
    config.train.epochs = 20;
    config.train.batch_size = 8;
    config.data.find_duplicates = false;
    config.set_all(&set.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    let splits = dataset::open(
        &cases().join("C34/dataset"),
        &ScanOptions { val_fraction: 0.1, seed: 42, allow_empty_classes: false, csv_paths_outside: false },
    )
    .unwrap();
    let run = dir.join(set.join("_").replace(['"', '='], ""));
    let summary =
        train::train(&TrainRequest::new(config, &run), &cpu, &splits, &mut |_| {}, &StopSignal::new()).unwrap();
    let mut rare = splits.train.clone();
    rare.samples.extend(splits.val.samples.iter().cloned());
    rare.samples.retain(|s| s.label == 1);
    let r = vramfit::inference::eval::evaluate_export(&run.join("export"), rare, &cpu, 8).unwrap();
    let p: Vec<f32> = r.probabilities.chunks(2).map(|row| row[1]).collect();
    assert_eq!(p.len(), 3);
    (p.iter().sum::<f32>() / 3.0, summary.val.unwrap())
}

#[test]
fn c34_balanced_metrics_show_the_neglected_class_and_both_balance_options_change_what_is_learned() {
    let dir = tempfile::tempdir().unwrap();
    let (plain, val) = c34_rare_probability(&[], dir.path());
    // The case's outcome: the headline accuracy high, the rare class never recalled.
    assert_eq!(val.per_class_accuracy()[1], 0.0, "{val:?}");
    assert_eq!(val.top1, 6.0 / 7.0);
    assert_eq!(val.balanced_accuracy(), 0.5);
    assert!((val.macro_f1() - (12.0 / 13.0) / 2.0).abs() < 1e-6, "F1 common 2*(6/7)/(1+6/7), rare 0");
    let (weighted, _) = c34_rare_probability(&["train.class_weights=\"balanced\""], dir.path());
    let (sampled, _) = c34_rare_probability(&["data.sampler=\"balanced\""], dir.path());
    // Measured: 0.15 plain, 0.30 weighted, 0.65 sampled (20 epochs, seed 42).
    assert!(weighted > plain + 0.05, "class weights: p(rare) {weighted} against {plain}");
    assert!(sampled > plain + 0.05, "balanced sampler: p(rare) {sampled} against {plain}");
}

/// A labels CSV beside copies of C34's images, with `rows` (after the header).
fn labels_csv(dir: &Path, header: &str, rows: &[String]) -> PathBuf {
    let images = dir.join("images");
    std::fs::create_dir_all(&images).unwrap();
    for class in ["common", "rare"] {
        for i in 0..3 {
            let from = cases().join(format!("C34/dataset/{class}/img_{i:02}.png"));
            std::fs::copy(from, images.join(format!("{class}_{i}.png"))).unwrap();
        }
    }
    let csv = dir.join("labels.csv");
    std::fs::write(&csv, format!("\u{feff}{header}\r\n{}\r\n", rows.join("\r\n"))).unwrap();
    csv
}

#[test]
fn a_labels_csv_trains_evaluates_and_exports_like_a_folder() {
    let dir = tempfile::tempdir().unwrap();
    let mut rows: Vec<String> = Vec::new();
    for class in ["common", "rare"] {
        for i in 0..3 {
            let split = if i == 2 { "val" } else { "train" };
            // Labels with a comma, quoted; the split column first, the path column by name.
            let label = if class == "rare" { "\"rare, red\"".to_string() } else { class.to_string() };
            rows.push(format!("{split},images\\{class}_{i}.png,{label}"));
        }
    }
    let csv = labels_csv(dir.path(), "Split,Image_Path,Label", &rows);
    let splits = dataset::open(
        &csv,
        &ScanOptions { val_fraction: 0.1, seed: 1, allow_empty_classes: false, csv_paths_outside: false },
    )
    .unwrap();
    assert_eq!(splits.train.class_names, ["common", "rare, red"]);
    assert_eq!((splits.train.samples.len(), splits.val.samples.len(), splits.held_out), (4, 2, false));
    assert!(splits.description.contains("labels CSV, 6 rows; 4 train / 2 validation rows"), "{}", splits.description);

    let run = dir.path().join("run");
    let (ok, out) = cli_train(&csv, &run, &["--epochs", "1", "--batch-size", "2"]);
    assert!(ok, "{out}");
    assert!(run.join("export/model.bpk").is_file() && run.join("export/model.onnx").is_file(), "{out}");
    let args = ["eval", "--device", "cpu", "--model"].map(std::ffi::OsStr::new);
    let (ok, out) = vramfit_cli(
        &[
            &args[..],
            &[
                run.as_os_str(),
                "--data".as_ref(),
                csv.as_os_str(),
                "--csv".as_ref(),
                dir.path().join("c.csv").as_os_str(),
            ],
            &["--label-issues".as_ref(), dir.path().join("issues.csv").as_os_str()],
        ]
        .concat(),
    );
    assert!(ok && out.contains("2 images on CPU"), "{out}");
    let issues = std::fs::read_to_string(dir.path().join("issues.csv")).unwrap();
    assert!(issues.starts_with("path,split,given_label,predicted_label,given_probability,predicted_probability\n"));
}

#[test]
fn a_labels_csv_names_each_bad_row_and_refuses_paths_outside_its_folder() {
    let dir = tempfile::tempdir().unwrap();
    let rows = [
        "images/common_0.png,common",
        "images/missing.png,common",
        "images/rare_0.png,",
        "\"images/rare_1.png,rare",
        "images/rare_2.png,rare,holdout",
        "../outside.png,rare",
    ]
    .map(String::from);
    let csv = labels_csv(dir.path(), "path,label,split", &rows);
    let opts = ScanOptions { val_fraction: 0.0, seed: 1, allow_empty_classes: false, csv_paths_outside: false };
    let e = dataset::open(&csv, &opts).unwrap_err().to_string();
    for want in [
        "5 rows that cannot be used",
        "line 3: images/missing.png does not exist",
        "line 4: images/rare_0.png has an empty label",
        "line 5: a quoted field is not closed",
        "line 6: split \"holdout\" is not train, val or test",
        "line 7: ../outside.png is outside the CSV file's folder",
        "data.csv_paths_outside = true",
    ] {
        assert!(e.contains(want), "missing {want:?} in {e}");
    }
    assert!(e.contains("labels.csv"), "the error names the file: {e}");
    // Allowed, the outside path is looked for (and is missing here).
    let allowed = ScanOptions { csv_paths_outside: true, ..opts };
    let e = dataset::open(&csv, &allowed).unwrap_err().to_string();
    assert!(e.contains("line 7: ../outside.png does not exist"), "{e}");
}

#[cfg(unix)]
#[test]
fn a_labels_csv_cannot_reach_outside_its_folder_by_link_backslash_or_absolute_dots() {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::copy(cases().join("C34/dataset/rare/img_00.png"), outside.join("secret.png")).unwrap();
    let data = dir.path().join("data");
    let csv = labels_csv(&data, "path,label", &["images/common_0.png,common".to_string()]);
    std::os::unix::fs::symlink(outside.join("secret.png"), data.join("images/link.png")).unwrap();
    std::os::unix::fs::symlink(&outside, data.join("linked_dir")).unwrap();
    let secret = outside.join("secret.png");
    let rows = [
        "images/common_0.png,common".to_string(),
        "images/link.png,rare".to_string(),
        "linked_dir/secret.png,rare".to_string(),
        format!("{},rare", secret.display().to_string().replace('/', "\\")),
        format!("{}/../outside/secret.png,rare", data.display()),
    ];
    std::fs::write(&csv, format!("path,label\n{}\n", rows.join("\n"))).unwrap();
    let opts = ScanOptions { val_fraction: 0.0, seed: 1, allow_empty_classes: false, csv_paths_outside: false };
    let e = dataset::open(&csv, &opts).unwrap_err().to_string();
    assert!(e.contains("4 rows that cannot be used"), "{e}");
    for line in 3..=6 {
        assert!(e.contains(&format!("line {line}: ")), "line {line}: {e}");
    }
    assert_eq!(e.matches("is outside the CSV file's folder").count(), 4, "{e}");
}

#[test]
fn a_labels_csv_row_repeating_a_file_is_named_with_both_lines() {
    let dir = tempfile::tempdir().unwrap();
    let rows = ["images/common_0.png,common", "images/rare_0.png,rare", "images\\common_0.png,rare"].map(String::from);
    let csv = labels_csv(dir.path(), "path,label", &rows);
    let opts = ScanOptions { val_fraction: 0.0, seed: 1, allow_empty_classes: false, csv_paths_outside: false };
    let e = dataset::open(&csv, &opts).unwrap_err().to_string();
    assert!(e.contains("line 4: images\\common_0.png is already on line 2; keep one row per image"), "{e}");
}
