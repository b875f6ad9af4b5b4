//! Dataset folders: junk, extensions, empty classes, Unicode, links (C11-C13).

use super::*;

#[test]
fn c11_os_junk_is_ignored() {
    let (ds, report) = scan(&cases().join("C11/dataset"), false).unwrap();
    assert_eq!(ds.class_names, ["cat", "dog"]);
    assert_eq!(ds.samples.len(), 4);
    let reason = |name: &str| report.ignored.iter().find(|(p, _)| p.ends_with(name)).map(|(_, why)| *why);
    assert_eq!(reason(".DS_Store"), Some(dataset::IGNORED_JUNK));
    assert_eq!(reason("Thumbs.db"), Some(dataset::IGNORED_JUNK));
    assert!(report.ignored.iter().all(|(_, why)| [dataset::IGNORED_JUNK, dataset::IGNORED_EXTENSION].contains(why)));
    let pipe = SamplePipeline::from_config(&Config::default(), false);
    for s in &ds.samples {
        pipe.decode(&s.source).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn c12_extensions_are_case_insensitive() {
    let (ds, _) = scan(&cases().join("C12/dataset"), false).unwrap();
    assert_eq!(ds.samples.len(), 6);
    assert_eq!(ds.class_counts(), vec![4, 2]);
}

#[test]
fn c13_empty_classes_and_unicode_names() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("dataset");
    copy_tree(&cases().join("C13/dataset"), &root);
    std::fs::create_dir_all(root.join("empty_class")).unwrap();
    let err = scan(&root, false).unwrap_err().to_string();
    assert!(err.contains("empty_class") && err.contains("only_junk"), "{err}");
    let (ds, report) = scan(&root, true).unwrap();
    assert_eq!(ds.class_names, ["cat", "dog", "Äpfel und Birnen", "猫 neko"]);
    assert_eq!(ds.class_counts(), vec![2, 2, 2, 2]);
    assert_eq!(report.empty_classes, ["empty_class", "only_junk"]);
    // Byte-exact through export metadata and prediction output.
    let config = Config::default();
    let device = burn::tensor::Device::flex();
    let model = vramfit::model::Classifier::new(&config.model, 4, &device);
    let out = dir.path().join("export");
    vramfit::export::export(&model, &config, &ds.class_names, &Default::default(), &out).unwrap();
    let predictor = vramfit::inference::predict::Predictor::load(&out, device).unwrap();
    assert_eq!(predictor.metadata.class_names, ds.class_names);
    let img = load("C07", "ok_baseline.jpg").unwrap();
    let names: Vec<String> = predictor.predict_image(&img, 4).unwrap().into_iter().map(|c| c.name).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(sorted, ["cat", "dog", "Äpfel und Birnen", "猫 neko"]);
}

#[test]
fn images_in_the_root_are_a_layout_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(cases().join("C07/ok_baseline.jpg"), dir.path().join("a.jpg")).unwrap();
    let err = scan(dir.path(), false).unwrap_err().to_string();
    assert!(err.contains("images directly in it") && err.contains("<class_name>"), "{err}");
}

#[cfg(unix)]
#[test]
fn symlink_loops_are_followed_once() {
    let dir = tempfile::tempdir().unwrap();
    let cat = dir.path().join("cat");
    std::fs::create_dir_all(cat.join("sub")).unwrap();
    std::fs::copy(cases().join("C07/ok_baseline.jpg"), cat.join("sub/a.jpg")).unwrap();
    std::os::unix::fs::symlink(&cat, cat.join("sub/loop")).unwrap();
    let (ds, report) = scan(dir.path(), false).unwrap();
    assert_eq!(ds.samples.len(), 1);
    assert_eq!(report.symlink_loops.len(), 1);
}
