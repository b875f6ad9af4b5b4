//! Integration tests: the real-world cases of `tests/data/cases` (copied from shared/cases),
//! IDX parsing, and training/export/predict/resume on the wgpu adapter (lavapipe in CI) and
//! burn's CPU backends.

use std::path::{Path, PathBuf};

use vramfit::config::Config;
use vramfit::dataset::{self, SampleSource, ScanOptions};
use vramfit::device::{self, CpuBackend, DeviceChoice, SelectedDevice};
use vramfit::events::{Event, StopSignal};
use vramfit::image_io::{LoadOptions, load_image};
use vramfit::loader::SamplePipeline;
use vramfit::preprocess::{PreprocessConfig, PreprocessMode};
use vramfit::train::{self, TrainRequest};
use vramfit::{Error, idx};

fn cases() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/cases")
}

fn load(case: &str, file: &str) -> vramfit::Result<image::RgbImage> {
    load_image(&cases().join(case).join(file), &LoadOptions::default())
}

fn close(px: [u8; 3], want: [u8; 3], tol: i32) -> bool {
    px.iter().zip(want).all(|(a, b)| (*a as i32 - b as i32).abs() <= tol)
}

// ---------------------------------------------------------------- images (C01-C09, C15)

#[test]
fn c01_exif_orientation_is_applied() {
    let red = [255, 0, 0];
    let control = load("C01", "control_no_exif.jpg").unwrap();
    assert_eq!(control.dimensions(), (64, 32));
    assert!(close(control.get_pixel(8, 8).0, red, 8));
    let o6 = load("C01", "exif_orientation6.jpg").unwrap();
    assert_eq!(o6.dimensions(), (32, 64));
    assert!(close(o6.get_pixel(24, 8).0, red, 8), "{:?}", o6.get_pixel(24, 8));
    assert!(close(o6.get_pixel(8, 8).0, [255, 255, 255], 8));
    let o8 = load("C01", "exif_orientation8.jpg").unwrap();
    assert_eq!(o8.dimensions(), (32, 64));
    assert!(close(o8.get_pixel(8, 56).0, red, 8), "{:?}", o8.get_pixel(8, 56));
    assert!(close(o8.get_pixel(8, 8).0, [255, 255, 255], 8));
}

#[test]
fn c04_gray_alpha_becomes_three_channels_over_white() {
    let img = load("C04", "gray_alpha_LA.png").unwrap();
    assert_eq!(img.dimensions(), (16, 16));
    assert_eq!(img.get_pixel(2, 8).0, [200, 200, 200]);
    assert_eq!(img.get_pixel(13, 8).0, [255, 255, 255]);
}

#[test]
fn c05_palette_transparency_is_composited() {
    let img = load("C05", "palette_trns.png").unwrap();
    let (w, h) = img.dimensions();
    assert_eq!(img.get_pixel(1, h / 2).0, [255, 255, 255], "hidden green must not show");
    assert_eq!(img.get_pixel(w - 2, h / 2).0, [255, 0, 0]);
    let semi = load("C05", "palette_trns_semi.png").unwrap();
    assert!(close(semi.get_pixel(1, h / 2).0, [128, 255, 128], 3), "{:?}", semi.get_pixel(1, h / 2));
}

#[test]
fn c06_rgba_prediction_input_is_white_not_blue() {
    for (file, side) in [("rgba_hidden_blue.png", 16u32), ("rgba_hidden_blue_224.png", 224)] {
        let img = load("C06", file).unwrap();
        assert_eq!(img.get_pixel(side - 2, side / 2).0, [255, 255, 255]);
        assert_eq!(img.get_pixel(1, side / 2).0, [255, 0, 0]);
        // The model input: [1, 3, H, W] through the prediction pipeline.
        let mut config = Config::default();
        config.data.preprocess = PreprocessConfig { mode: PreprocessMode::ResizeAndCrop, load_size: 32, crop_size: 32 };
        let loaded = vramfit::export::LoadedModel {
            model: vramfit::model::Classifier::new(&config.model, 3, &burn::tensor::Device::flex()),
            metadata: vramfit::export::ModelMetadata::new(
                &config,
                &["a".into(), "b".into(), "c".into()],
                0,
                Default::default(),
            ),
            weights_path: PathBuf::new(),
        };
        let predictor = vramfit::infer::Predictor::new(loaded, burn::tensor::Device::flex());
        let input = predictor.input(&img).unwrap();
        assert_eq!(input.dims(), [1, 3, 32, 32]);
        let top = predictor.predict_image(&img, 5).unwrap();
        assert_eq!(top.len(), 3);
        assert!((top.iter().map(|c| c.probability).sum::<f32>() - 1.0).abs() < 1e-4);
    }
}

#[test]
fn c07_truncated_and_corrupt_files() {
    let ok = load("C07", "ok_baseline.jpg").unwrap();
    assert_eq!(ok.dimensions(), (64, 64));
    assert_eq!(load("C07", "ok_progressive.jpg").unwrap().dimensions(), (64, 64));
    let no_eoi = load("C07", "truncated_no_EOI.jpg").unwrap();
    assert_eq!(no_eoi.as_raw(), ok.as_raw(), "missing end marker only: same pixels as the baseline");
    for bad in ["truncated_half.png", "truncated_60pct.jpg", "truncated_progressive_50pct.jpg"] {
        let err = load("C07", bad).err().unwrap_or_else(|| panic!("{bad} decoded without an error")).to_string();
        assert!(err.contains(bad), "{err}");
    }
    // Bit flips: Ok or a per-file error, never a panic.
    if let Err(e) = load("C07", "corrupt_bitflip.jpg") {
        assert!(e.to_string().contains("corrupt_bitflip.jpg"));
    }
}

#[test]
fn c08_format_from_content_not_extension() {
    for f in ["png_content.jpg", "jpeg_content.png", "webp_content.jpg"] {
        let img = load("C08", f).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(img.dimensions(), (24, 16), "{f}");
        assert!(close(img.get_pixel(12, 8).0, [10, 200, 30], 3), "{f}: {:?}", img.get_pixel(12, 8));
    }
    let reason = |f: &str| load("C08", f).unwrap_err().to_string();
    assert!(reason("zero_bytes.png").contains("empty file"));
    assert!(reason("text_renamed.jpg").contains("not an image"));
    assert!(reason("heic_brand_named.jpg").contains("HEIF"));
}

#[test]
fn c09_decompression_bombs_are_rejected_from_the_header() {
    for (f, dims) in [
        ("bomb_20000x20000_gray8.png", "20000x20000"),
        ("header_100000x100000_rgba.png", "100000x100000"),
        ("gif_screen_65535x65535.gif", "65535x65535"),
    ] {
        let err = load("C09", f).unwrap_err().to_string();
        assert!(err.contains(f) && err.contains(dims) && err.contains("max_image_pixels"), "{err}");
    }
}

#[test]
fn c09_checking_bombs_keeps_resident_memory_under_200_mb() {
    // `vramfit check-data` on a dataset of the bombs, in its own process: it reports its peak
    // resident set (VmHWM, which starts afresh at exec) and this test reads it.
    let dir = tempfile::tempdir().unwrap();
    let class = dir.path().join("bombs");
    std::fs::create_dir_all(&class).unwrap();
    for f in std::fs::read_dir(cases().join("C09")).unwrap().flatten() {
        std::fs::copy(f.path(), class.join(f.file_name())).unwrap();
    }
    std::fs::copy(cases().join("C07/ok_baseline.jpg"), class.join("ok.jpg")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramfit"))
        .args(["check-data", dir.path().to_str().unwrap(), "--set", "data.val_fraction=0"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "check-data failed: {stdout} {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("3 files would be skipped"), "{stdout}");
    let peak_mb: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("peak resident memory: "))
        .and_then(|v| v.trim_end_matches(" MB").parse().ok())
        .unwrap_or_else(|| panic!("no peak memory line in {stdout}"));
    assert!(peak_mb > 1.0 && peak_mb < 200.0, "peak RSS {peak_mb} MB");
}

#[test]
fn c15_every_mode_gives_one_training_size_or_names_the_file() {
    let files = [
        "wide_300x100.png",
        "tall_100x300.png",
        "tiny_37x23.png",
        "odd_255x255.png",
        "exact_256x256.png",
        "half_42x18.png",
        "one_pixel_1x1.png",
    ];
    let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(0);
    for mode in PreprocessMode::ALL {
        let mut config = Config::default();
        config.data.preprocess = PreprocessConfig { mode, load_size: 256, crop_size: 224 };
        let pipe = SamplePipeline::from_config(&config, true);
        for f in files {
            let path = cases().join("C15").join(f);
            match pipe.load(&SampleSource::File(path.clone()), &mut rng) {
                Ok((chw, h, w)) => {
                    assert!(h > 0 && w > 0 && chw.len() == 3 * h * w);
                    if mode == PreprocessMode::None {
                        assert_eq!((h % 4, w % 4), (0, 0), "{f}");
                    } else {
                        assert_eq!((w, h), (224, 224), "{} {f}", mode.name());
                    }
                }
                Err(e) => {
                    assert_eq!(mode, PreprocessMode::Crop, "{} {f}: {e}", mode.name());
                    assert!(e.contains(f) && e.contains("crop_size"), "{e}");
                }
            }
        }
    }
}

/// C15's mixed sizes as a dataset: mode `none` cannot batch them, so training refuses before it
/// starts, naming two files and the setting that fixes it; a fixed-size mode accepts them.
#[test]
fn c15_mixed_sizes_in_mode_none_are_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let class = dir.path().join("shapes");
    std::fs::create_dir_all(&class).unwrap();
    for f in ["wide_300x100.png", "tall_100x300.png", "odd_255x255.png"] {
        std::fs::copy(cases().join("C15").join(f), class.join(f)).unwrap();
    }
    let ds = scan(dir.path(), false).unwrap().0;
    let none = PreprocessConfig { mode: PreprocessMode::None, load_size: 256, crop_size: 224 };
    let err = vramfit::loader::check_sizes_agree(&ds, &none).unwrap_err().to_string();
    assert!(err.contains("resize_and_crop") && err.contains("255x255 and "), "{err}");
    let fixed = PreprocessConfig { mode: PreprocessMode::ResizeAndCrop, ..none };
    assert_eq!(vramfit::loader::check_sizes_agree(&ds, &fixed).unwrap(), None, "a fixed output size needs no check");
    let same =
        ds.samples.iter().filter(|s| matches!(&s.source, SampleSource::File(p) if p.ends_with("odd_255x255.png")));
    let one = dataset::Dataset { class_names: ds.class_names.clone(), samples: same.cloned().collect() };
    let (h, w) = vramfit::loader::check_sizes_agree(&one, &none).unwrap().unwrap();
    assert_eq!(h, w, "a square image trains square");
    assert!((252..=256).contains(&h), "255 px trains at its own (rounded) size, not {h}");
}

// ---------------------------------------------------------------- folders (C11-C13)

fn scan(dir: &Path, allow_empty: bool) -> vramfit::Result<(dataset::Dataset, dataset::ScanReport)> {
    dataset::scan_folder(dir, &ScanOptions { val_fraction: 0.0, seed: 0, allow_empty_classes: allow_empty })
}

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
    copy_dir(&cases().join("C13/dataset"), &root);
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
    let predictor = vramfit::infer::Predictor::load(&out, device).unwrap();
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

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

// ---------------------------------------------------------------- IDX (C17)

#[test]
fn c17_idx_variants() {
    let c17 = cases().join("C17");
    let pair = |d: &str| idx::find_split(&c17.join(d), "train").map(|(i, l)| idx::load_pair(&i, &l));
    let sums = [1020u64, 3920, 8460, 14400, 21500, 29520, 38220, 47360, 56700, 66000];
    for d in ["ok", "gzipped", "gzip_without_gz_extension", "dotted_names_7zip"] {
        let (imgs, labels) = pair(d).unwrap().unwrap_or_else(|e| panic!("{d}: {e}"));
        assert_eq!((imgs.count, imgs.rows, imgs.cols), (10, 28, 28), "{d}");
        assert_eq!(labels, (0..10).collect::<Vec<u8>>());
        let got: Vec<u64> = (0..10).map(|i| imgs.image(i).iter().map(|&v| v as u64).sum()).collect();
        assert_eq!(got, sums, "{d}");
    }
    let err = |d: &str| pair(d).unwrap().unwrap_err().to_string();
    assert!(err("wrong_magic").contains("expected 2051 got 2049 (a labels file?)"), "{}", err("wrong_magic"));
    assert!(
        err("truncated_payload").contains("expected 7840 payload bytes, found 7448"),
        "{}",
        err("truncated_payload")
    );
    assert!(err("count_mismatch").contains("10 images vs 9 labels"), "{}", err("count_mismatch"));
    assert!(err("empty_file").contains("too short for a header"), "{}", err("empty_file"));
    assert!(err("html_instead_of_gzip").contains("not IDX or gzip"), "{}", err("html_instead_of_gzip"));
    assert!(err("wrong_ndim").contains("images must be 3-D"), "{}", err("wrong_ndim"));
    assert!(err("little_endian_header").contains("little-endian"), "{}", err("little_endian_header"));
    // As a dataset folder: the same errors, naming the file.
    let opts = ScanOptions { val_fraction: 0.2, seed: 1, allow_empty_classes: false };
    let e = dataset::open(&c17.join("wrong_magic"), &opts).unwrap_err().to_string();
    assert!(e.contains("train-images-idx3-ubyte"), "{e}");
    let ok = dataset::open(&c17.join("gzipped"), &opts).unwrap();
    assert_eq!(ok.train.samples.len() + ok.val.samples.len(), 10);
}

// ---------------------------------------------------------------- training on devices

fn gpu() -> SelectedDevice {
    let d = device::select(DeviceChoice::Gpu(None)).unwrap();
    assert!(d.is_gpu(), "these tests need a wgpu adapter: install mesa-vulkan-drivers (lavapipe)");
    d
}

fn quickstart() -> Config {
    vramfit::cli::load_config("quickstart").unwrap()
}

fn bundled() -> dataset::Splits {
    dataset::open(
        &dataset::bundled_dataset_dir(),
        &ScanOptions { val_fraction: 0.1, seed: 42, allow_empty_classes: false },
    )
    .unwrap()
}

#[test]
fn overfit_check_passes_on_the_wgpu_adapter() {
    let device = gpu();
    let splits = bundled();
    let mut sink = |_e: Event| {};
    let r = train::overfit_check(&quickstart(), &device, &splits.train, 200, &mut sink).unwrap();
    assert!(r.passed, "accuracy on 64 images {:.3} after {} steps", r.accuracy, r.steps);
}

#[test]
fn train_export_predict_parity_and_resume() {
    let device = gpu();
    let splits = bundled();
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut config = quickstart();
    config.train.epochs = 1;
    // 1) Stop after 30 steps, then resume to the end of the epoch.
    let mut req = TrainRequest::new(config.clone(), &run);
    req.max_steps = Some(30);
    let mut events = Vec::new();
    let first = train::train(&req, &device, &splits, &mut |e| events.push(e), &StopSignal::new()).unwrap();
    assert!(first.stopped);
    assert_eq!(first.global_step, 30);
    let (_, state) = vramfit::checkpoint::latest(&run).unwrap();
    assert_eq!((state.global_step, state.batches_done_in_epoch), (30, 30));
    let mut req = TrainRequest::new(config.clone(), &run);
    req.resume = true;
    let mut steps = Vec::new();
    let done = train::train(
        &req,
        &device,
        &splits,
        &mut |e| {
            if let Event::Step { step, .. } = e {
                steps.push(step)
            }
        },
        &StopSignal::new(),
    )
    .unwrap();
    let per_epoch = 6000usize.div_ceil(64);
    assert_eq!(steps.first(), Some(&31), "resume continues the step count");
    assert_eq!(done.global_step, per_epoch);
    assert_eq!(done.epochs_completed, 1);
    let val = done.val.clone().unwrap();
    assert!(val.top1 >= 0.70, "test accuracy after one epoch {:.3}", val.top1);
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    assert_eq!(metrics.lines().count(), per_epoch + 1, "one metrics row per step across the resume");
    // 2) Export round trip: bpk and safetensors give identical logits.
    let export = done.export_dir.clone().unwrap();
    let cpu = burn::tensor::Device::flex();
    let a = vramfit::infer::Predictor::load(&export.join("model.bpk"), cpu.clone()).unwrap();
    let b = vramfit::infer::Predictor::load(&export.join("model.safetensors"), cpu).unwrap();
    let img = image::RgbImage::from_fn(28, 28, |x, y| image::Rgb([(x * 9) as u8, (y * 9) as u8, 100]));
    assert_eq!(
        a.probabilities(std::slice::from_ref(&img)).unwrap(),
        b.probabilities(std::slice::from_ref(&img)).unwrap()
    );
    // 3) GPU vs CPU (flex, ndarray) predictions on the 1000 bundled test images.
    let test: Vec<image::RgbImage> = {
        let pipe = SamplePipeline::from_config(&config, false);
        splits.val.samples.iter().map(|s| pipe.decode(&s.source).unwrap()).collect()
    };
    let probs = |backend: Option<CpuBackend>| -> Vec<Vec<f32>> {
        let dev = backend.map_or(device.device.clone(), CpuBackend::device);
        let p = vramfit::infer::Predictor::load(&export, dev).unwrap();
        test.chunks(100).flat_map(|c| p.probabilities(c).unwrap()).collect()
    };
    let on_gpu = probs(None);
    for backend in [CpuBackend::Flex, CpuBackend::Ndarray] {
        let on_cpu = probs(Some(backend));
        let argmax = |v: &[f32]| vramfit::eval::top_k(v, 1)[0].0;
        let agree = on_gpu.iter().zip(&on_cpu).filter(|(g, c)| argmax(g) == argmax(c)).count();
        assert!(agree as f64 >= 0.995 * test.len() as f64, "{backend:?}: top-1 agrees on {agree}/{}", test.len());
        let max_diff = on_gpu
            .iter()
            .zip(&on_cpu)
            .flat_map(|(g, c)| g.iter().zip(c).map(|(a, b)| (a - b).abs()))
            .fold(0f32, f32::max);
        assert!(max_diff <= 1e-3, "{backend:?}: probabilities differ by {max_diff}");
    }
}

// ---------------------------------------------------------------- ONNX export against ONNX Runtime

/// The Python that imports onnx, onnxruntime, numpy and PIL: `VRAMFIT_ONNX_PYTHON` (`.ci/run`
/// sets it to its virtual environment), else `python3`. Without one the ONNX Runtime checks print
/// why and skip, unless `VRAMFIT_REQUIRE_ONNX` is set (as in CI), where a missing runtime fails.
fn onnx_python() -> Option<PathBuf> {
    let python = std::env::var_os("VRAMFIT_ONNX_PYTHON").map_or_else(|| PathBuf::from("python3"), PathBuf::from);
    let imports = std::process::Command::new(&python)
        .args(["-c", "import onnx, onnxruntime, numpy, PIL"])
        .output()
        .is_ok_and(|o| o.status.success());
    if imports {
        return Some(python);
    }
    assert!(
        std::env::var_os("VRAMFIT_REQUIRE_ONNX").is_none(),
        "VRAMFIT_REQUIRE_ONNX is set but {} cannot import onnx, onnxruntime, numpy and PIL",
        python.display()
    );
    eprintln!("skipped: no Python with onnx and onnxruntime (set VRAMFIT_ONNX_PYTHON; .ci/run makes one)");
    None
}

/// The first `n` bundled test images as PNG files in `dir` (what a user would predict on).
fn bundled_test_pngs(dir: &Path, n: usize) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let pipe = SamplePipeline::from_config(&quickstart(), false);
    for (i, s) in bundled().val.samples.iter().take(n).enumerate() {
        pipe.decode(&s.source).unwrap().save(dir.join(format!("{i:04}.png"))).unwrap();
    }
    dir.to_path_buf()
}

/// `vramfit predict --json` with every class on `images`, then `tests/onnx/ort_check.py` (onnx
/// checker + ONNX Runtime on `export/model.onnx`, same files). Returns the checker's summary;
/// panics when it fails (top-1 agreement under 100% or probabilities more than 1e-4 apart).
fn ort_check(python: &Path, export: &Path, images: &Path, predict_device: &[&str]) -> serde_json::Value {
    let predict = std::process::Command::new(env!("CARGO_BIN_EXE_vramfit"))
        .args(["predict", "--json", "--top-k", "10", "--model"])
        .arg(export)
        .args(predict_device)
        .arg(images)
        .output()
        .unwrap();
    assert!(predict.status.success(), "predict: {}", String::from_utf8_lossy(&predict.stderr));
    let predictions = export.join("predict.jsonl");
    std::fs::write(&predictions, &predict.stdout).unwrap();
    let check = std::process::Command::new(python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/onnx/ort_check.py"))
        .arg("--model")
        .arg(export)
        .arg("--predictions")
        .arg(&predictions)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&check.stdout);
    eprintln!("ort_check {}: {stdout}", export.display());
    assert!(check.status.success(), "ort_check failed: {stdout}{}", String::from_utf8_lossy(&check.stderr));
    serde_json::from_str(stdout.trim()).unwrap()
}

#[test]
fn onnx_export_matches_onnx_runtime_for_both_precisions_and_inputs() {
    use vramfit::export::{ExportOptions, export_run_with};
    use vramfit::onnx::OnnxInput;
    let Some(python) = onnx_python() else { return };
    let splits = bundled();
    let dir = tempfile::tempdir().unwrap();
    let images = bundled_test_pngs(&dir.path().join("images"), 1000);
    // Both precisions train on burn flex: 30 steps take seconds there, minutes on lavapipe.
    let device = device::select(DeviceChoice::Cpu(CpuBackend::Flex)).unwrap();
    for precision in [vramfit::config::Precision::F32, vramfit::config::Precision::F16] {
        let mut config = quickstart();
        config.train.epochs = 1;
        config.train.precision = precision;
        let run = dir.path().join(format!("run-{precision:?}"));
        let mut req = TrainRequest::new(config, &run);
        req.max_steps = Some(30);
        train::train(&req, &device, &splits, &mut |_| {}, &StopSignal::new()).unwrap();
        for onnx_input in [OnnxInput::F32Nchw, OnnxInput::U8Nhwc] {
            let export = dir.path().join(format!("export-{precision:?}-{onnx_input:?}"));
            export_run_with(&run, &export, &ExportOptions { onnx_input, ..Default::default() }).unwrap();
            let summary = ort_check(&python, &export, &images, &["--device", "cpu"]);
            assert_eq!(summary["images"], 1000);
            assert_eq!(summary["input"], onnx_input.input_name());
        }
    }
}

#[test]
fn a_batch_of_only_undecodable_files_is_skipped_not_a_crash() {
    // C21: at batch size 1 a zero-byte file (or a HEIC named .jpg) is a whole batch of nothing.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for (class, shade) in [("dark", 40u8), ("light", 220u8)] {
        std::fs::create_dir_all(data.join(class)).unwrap();
        for i in 0..4u8 {
            image::GrayImage::from_pixel(28, 28, image::Luma([shade + i]))
                .save(data.join(class).join(format!("{i}.png")))
                .unwrap();
        }
    }
    std::fs::write(data.join("dark/empty.png"), b"").unwrap();
    std::fs::copy(cases().join("C08/heic_brand_named.jpg"), data.join("light/photo.jpg")).unwrap();
    let splits = dataset::open(&data, &ScanOptions { val_fraction: 0.0, seed: 1, allow_empty_classes: false }).unwrap();
    let mut config = quickstart();
    config.train.epochs = 1;
    config.train.batch_size = 1;
    let cpu = device::select(DeviceChoice::Cpu(CpuBackend::Flex)).unwrap();
    let req = TrainRequest::new(config, dir.path().join("run"));
    let mut skipped = Vec::new();
    let sink = &mut |e| {
        if let Event::SampleSkipped { source, .. } = e {
            skipped.push(source)
        }
    };
    let summary = train::train(&req, &cpu, &splits, sink, &StopSignal::new()).unwrap();
    assert_eq!(summary.global_step, 8, "one step per decodable image");
    assert_eq!(summary.skipped, 2);
    assert_eq!(skipped.len(), 2, "{skipped:?}");
}

#[test]
fn an_impossible_batch_is_refused_before_training_with_the_numbers() {
    let device = gpu();
    let splits = bundled();
    let mut config = quickstart();
    config.train.batch_size = 4096;
    config.memory.memory_budget_bytes = 64 << 20;
    let dir = tempfile::tempdir().unwrap();
    let req = TrainRequest::new(config.clone(), dir.path().join("run"));
    let err = train::train(&req, &device, &splits, &mut |_e| {}, &StopSignal::new()).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, Error::Memory(_)) && msg.contains("does not fit by") && msg.contains("train.batch_size ="),
        "{msg}"
    );
    assert!(!dir.path().join("run/checkpoints").exists(), "nothing ran");
    // With --auto-fit the same request trains at the largest fitting micro-batch.
    let plan = vramfit::memory::plan(&config, 10);
    assert!(plan.fit_batch_size >= 1 && plan.fit_batch_size < 4096);
    let mut req = TrainRequest::new(config, dir.path().join("fit"));
    req.auto_fit = true;
    req.max_steps = Some(1);
    let mut adapted = Vec::new();
    let s = train::train(
        &req,
        &device,
        &splits,
        &mut |e| {
            if let Event::BatchAdapted { batch_size, grad_accum_steps, .. } = e {
                adapted.push((batch_size, grad_accum_steps))
            }
        },
        &StopSignal::new(),
    )
    .unwrap();
    assert_eq!(adapted.first(), Some(&(plan.fit_batch_size, plan.fit_grad_accum_steps)));
    // A later adaptation (the measured peak crossing the budget) halves the micro-batch and
    // doubles accumulation, keeping the effective batch.
    for w in adapted.windows(2) {
        assert_eq!((w[1].0, w[1].1), (w[0].0.div_ceil(2), w[0].1 * 2));
    }
    assert_eq!(s.global_step, 1);
}

/// The f16 GroupNorm (one f16 tensor kept for backward) computes burn's f32 GroupNorm: values,
/// input gradients and gamma/beta gradients agree to f16 precision, also for inputs whose squares
/// overflow f16 (mean 300).
#[test]
fn f16_group_norm_matches_burns_group_norm_in_value_and_gradient() {
    use burn::nn::GroupNormConfig;
    use burn::tensor::{Distribution, FloatDType, Tensor};
    let device = gpu();
    assert!(device.supports_f16(), "lavapipe has shader f16");
    let ad = device.device.clone().autodiff();
    for (mean, std) in [(0.5, 1.0), (300.0, 40.0)] {
        let mut norm = GroupNormConfig::new(4, 8).init(&ad);
        let random = |mean: f64| Tensor::<1>::random([8], Distribution::Normal(mean, 0.5), &ad);
        norm.gamma = norm.gamma.map(|p| p.map(|_| random(1.0).require_grad()));
        norm.beta = norm.beta.map(|p| p.map(|_| random(0.0).require_grad()));
        let x = Tensor::<4>::random([2, 8, 5, 7], Distribution::Normal(mean, std), &ad);
        let w = Tensor::<4>::random([2, 8, 5, 7], Distribution::Normal(0.0, 1.0), &ad);
        let run = |f16: bool| {
            let x = x.clone().detach().require_grad();
            let y = if f16 {
                vramfit::model::group_norm_f16(x.clone().cast(FloatDType::F16), &norm).cast(FloatDType::F32)
            } else {
                norm.forward(x.clone())
            };
            let grads = (y.clone() * w.clone()).sum().backward();
            let gx = x.grad(&grads).unwrap();
            let gg = norm.gamma.as_ref().unwrap().val().grad(&grads).unwrap();
            let gb = norm.beta.as_ref().unwrap().val().grad(&grads).unwrap();
            let vec = |d: burn::tensor::TensorData| d.try_to_vec::<f32>().unwrap();
            [vec(y.into_data()), vec(gx.into_data()), vec(gg.into_data()), vec(gb.into_data())]
        };
        let (want, got) = (run(false), run(true));
        for (what, (a, b)) in
            ["output", "input gradient", "gamma gradient", "beta gradient"].iter().zip(want.iter().zip(&got))
        {
            let scale = a.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
            let worst = a.iter().zip(b).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst <= 0.02 * scale, "{what} at mean {mean}: worst |diff| {worst} vs scale {scale}");
        }
    }
}

#[test]
fn a_huge_learning_rate_gets_the_nan_diagnosis() {
    let device = device::select(DeviceChoice::Cpu(CpuBackend::Flex)).unwrap();
    let splits = bundled();
    let mut config = quickstart();
    config.optimizer.lr = 1e9;
    config.optimizer.warmup_epochs = 0.0;
    config.train.grad_clip_norm = 0.0;
    config.model.head_init_std = 1e3;
    let dir = tempfile::tempdir().unwrap();
    let mut req = TrainRequest::new(config, dir.path().join("run"));
    req.max_steps = Some(40);
    let err = train::train(&req, &device, &splits, &mut |_e| {}, &StopSignal::new()).unwrap_err().to_string();
    assert!(
        err.contains("non-finite") && err.contains("learning rate too high") && err.contains("optimizer.lr"),
        "{err}"
    );
}

/// A step whose largest tensor is over the adapter's buffer limit is refused before it runs,
/// also when resuming a run: the error names the limit and the fix, the process goes on, the
/// run's checkpoint still loads and the run resumes at a batch that fits.
#[test]
fn a_tensor_over_the_adapter_buffer_limit_is_refused_with_the_reason() {
    let device = gpu();
    let limit = device.adapter.as_ref().unwrap().max_storage_buffer_binding_size;
    let splits = bundled();
    let config = quickstart();
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut req = TrainRequest::new(config.clone(), &run);
    req.max_steps = Some(1);
    req.export = false;
    train::train(&req, &device, &splits, &mut |_e| {}, &StopSignal::new()).unwrap();
    // Resume with a batch whose stem output alone is over the adapter's buffer limit.
    let per_image = vramfit::memory::estimate(&config, 1, 10).largest_tensor;
    let mut huge = config.clone();
    huge.train.batch_size = (limit / per_image + 1) as usize;
    huge.memory.memory_budget_bytes = 1 << 40;
    let mut req_huge = TrainRequest::new(huge, &run);
    req_huge.resume = true;
    let err = train::train(&req_huge, &device, &splits, &mut |_e| {}, &StopSignal::new()).unwrap_err().to_string();
    assert!(err.contains("per buffer") && err.contains("train.batch_size <="), "{err}");
    let (_, _, state) = vramfit::checkpoint::load_latest_model(&run, &device.device).unwrap();
    assert_eq!(state.global_step, 1);
    req.resume = true;
    req.max_steps = Some(2);
    let s = train::train(&req, &device, &splits, &mut |_e| {}, &StopSignal::new()).unwrap();
    assert_eq!(s.global_step, 2);
}

/// The budget crossed mid-run (here: lowered under the measured peak after step 2, as the app's
/// slider does): the micro-batch halves with accumulation doubled, the effective batch and the
/// step count carry on.
#[test]
fn a_budget_crossed_mid_run_halves_the_micro_batch_and_the_steps_continue() {
    let device = gpu();
    let splits = bundled();
    let mut config = quickstart();
    config.train.memory_sample_every = 1;
    let (batch, accum) = (config.train.batch_size, config.train.grad_accum_steps);
    let dir = tempfile::tempdir().unwrap();
    let mut req = TrainRequest::new(config, dir.path().join("run"));
    req.max_steps = Some(5);
    req.export = false;
    let budget = vramfit::events::LiveBudget::new(1 << 40);
    req.live_budget = Some(budget.clone());
    let mut steps = Vec::new();
    let mut adapted = Vec::new();
    let mut sink = |e: Event| match e {
        Event::Step { step, .. } => {
            steps.push(step);
            if step == 2 {
                budget.set(1 << 20);
            }
        }
        Event::BatchAdapted { batch_size, grad_accum_steps, reason } => {
            adapted.push((steps.len(), batch_size, grad_accum_steps, reason))
        }
        _ => {}
    };
    let s = train::train(&req, &device, &splits, &mut sink, &StopSignal::new()).unwrap();
    assert_eq!(steps, [1, 2, 3, 4, 5], "no step lost or repeated");
    let (after, micro, steps_accum, reason) = adapted.first().expect("the crossing adapts the batch").clone();
    assert_eq!(after, 2, "adapted right after the step that crossed");
    assert_eq!((micro, steps_accum), (batch.div_ceil(2), accum * 2));
    assert!(reason.contains("crossed the 1.0 MiB budget"), "{reason}");
    assert!(
        s.batch_size < batch && s.batch_size * s.grad_accum_steps >= batch,
        "{} x {}",
        s.batch_size,
        s.grad_accum_steps
    );
    assert_eq!(s.global_step, 5);
}

// ---------------------------------------------------------------- property test of the loader

/// Seeded mutation fuzzing of the one image-loading path: truncations, bit flips, byte
/// overwrites and header-size tampering of every case image. Bounded (a few thousand inputs) so
/// it runs in CI; the property is "an image or an error, never a panic", and every decoded image
/// respects the pixel cap.
#[test]
fn fuzz_image_loading_never_panics() {
    use rand::{Rng, SeedableRng};
    let mut seeds = Vec::new();
    for case in ["C01", "C04", "C05", "C06", "C07", "C08", "C15"] {
        for f in std::fs::read_dir(cases().join(case)).unwrap().flatten() {
            seeds.push(std::fs::read(f.path()).unwrap());
        }
    }
    let opts = LoadOptions { max_pixels: 1 << 20, ..Default::default() };
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0xF022);
    let mut decoded = 0;
    for i in 0..20_000 {
        let mut bytes = seeds[i % seeds.len()].clone();
        if bytes.is_empty() {
            continue;
        }
        match rng.random_range(0..4) {
            0 => bytes.truncate(rng.random_range(0..bytes.len())),
            1 => {
                for _ in 0..rng.random_range(1..8) {
                    let at = rng.random_range(0..bytes.len());
                    bytes[at] ^= 1 << rng.random_range(0..8);
                }
            }
            2 => {
                let at = rng.random_range(0..bytes.len());
                let end = (at + rng.random_range(1..16)).min(bytes.len());
                rng.fill(&mut bytes[at..end]);
            }
            _ => {
                // Header fields sit in the first 32 bytes for PNG, GIF, BMP and WebP.
                let at = rng.random_range(0..bytes.len().min(32));
                bytes[at] = 0xFF;
            }
        }
        let result = std::panic::catch_unwind(|| vramfit::image_io::decode_image(&bytes, &opts));
        let result = result.unwrap_or_else(|_| panic!("decoding mutated input {i} panicked"));
        if let Ok(img) = result {
            decoded += 1;
            assert!(img.width() as u64 * img.height() as u64 <= opts.max_pixels);
        }
    }
    assert!(decoded > 100, "the mutations should leave many images decodable ({decoded})");
}

// ---------------------------------------------------------------- the desktop app (egui_kittest)

/// A file dropped on the window in the tests (the windowing layer's own type is private).
#[derive(Debug)]
struct TestDrop(PathBuf);

impl egui::DroppedFile for TestDrop {
    fn path(&self) -> &Path {
        &self.0
    }
    fn bytes(&self) -> Result<Vec<u8>, String> {
        std::fs::read(&self.0).map_err(|e| e.to_string())
    }
}

fn snapshot(harness: &mut egui_kittest::Harness<'_, vramfit::gui::VramfitApp>, name: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/snapshots");
    std::fs::create_dir_all(&dir).unwrap();
    let img = harness.render().expect("rendering through wgpu (lavapipe in CI)");
    img.save(dir.join(format!("{name}.png"))).unwrap();
}

fn step_until(
    harness: &mut egui_kittest::Harness<'_, vramfit::gui::VramfitApp>,
    what: &str,
    done: impl Fn(&vramfit::gui::VramfitApp) -> bool,
) {
    let start = std::time::Instant::now();
    while !done(harness.state()) {
        assert!(start.elapsed().as_secs() < 600, "timed out waiting for {what}; status {}", harness.state().status);
        harness.step();
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    harness.step();
}

/// The app's training worker: this build's vramfit binary, with `VRAMFIT_FAULT` when given.
fn app_worker(fault: Option<&str>) -> vramfit::gui::WorkerLaunch {
    vramfit::gui::WorkerLaunch {
        exe: PathBuf::from(env!("CARGO_BIN_EXE_vramfit")),
        env: fault.map(|f| ("VRAMFIT_FAULT".into(), f.into())).into_iter().collect(),
    }
}

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
    assert_eq!(harness.state().settings.config.train.batch_size, 16);
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
    assert_eq!(harness.state().settings.config.train.batch_size, 16);
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

#[test]
fn memory_predictions_hold_within_25_percent_on_the_adapter() {
    gpu();
    // In its own process: the device's pools are shared by every test of this one.
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("memory.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramfit"))
        .args(["bench", "memory", "--grid", "tiny", "--steps", "1", "--json", json.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    // f32 off, f32 on, f16 off, f16 on (lavapipe has shader f16).
    assert_eq!(rows.len(), 4);
    for r in &rows {
        assert!(r["skipped"].is_null(), "{r}");
        assert!(r["measured_in_use_bytes"].as_u64().unwrap() > 0);
        assert!(r["error_percent"].as_f64().unwrap().abs() <= 25.0, "{r}");
    }
    let activations = |i: usize| rows[i]["measured_activation_bytes"].as_u64().unwrap() as f64;
    // Checkpointing keeps less, in both precisions.
    assert!(activations(1) < activations(0) && activations(3) < activations(2));
    // f16 keeps at most 0.6x the activations of f32 on the same configuration.
    assert!(activations(2) <= 0.6 * activations(0), "f16 {} vs f32 {} bytes", activations(2), activations(0));
}

// ---------------------------------------------------------------- run folders, checkpoints, resume (C18-C20)

/// Runs the vramfit binary; returns (success, stdout + stderr).
fn vramfit_cli(args: &[&std::ffi::OsStr]) -> (bool, String) {
    let (code, text) = vramfit_cli_env(args, None);
    (code == Some(0), text)
}

/// Runs the vramfit binary with `VRAMFIT_FAULT` set to `fault` (when given); returns (exit
/// status code, stdout + stderr).
fn vramfit_cli_env(args: &[&std::ffi::OsStr], fault: Option<&str>) -> (Option<i32>, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_vramfit"));
    command.args(args);
    if let Some(fault) = fault {
        command.env("VRAMFIT_FAULT", fault);
    }
    let out = command.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text)
}

/// `vramfit train --device cpu --data DATA --out RUN` plus `extra`.
fn cli_train(data: &Path, run: &Path, extra: &[&str]) -> (bool, String) {
    let (code, text) = cli_train_with_fault(data, run, extra, None);
    (code == Some(0), text)
}

/// [`cli_train`] with `VRAMFIT_FAULT` set (when given); returns (exit status code, output).
fn cli_train_with_fault(data: &Path, run: &Path, extra: &[&str], fault: Option<&str>) -> (Option<i32>, String) {
    let mut args: Vec<&std::ffi::OsStr> = ["train", "--device", "cpu", "--data"].iter().map(|s| s.as_ref()).collect();
    args.extend([data.as_os_str(), "--out".as_ref(), run.as_os_str()]);
    args.extend(extra.iter().map(|s| std::ffi::OsStr::new(*s)));
    vramfit_cli_env(&args, fault)
}

/// The step column of a run's metrics.csv.
fn metric_steps(run: &Path) -> Vec<usize> {
    let text = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    text.lines().skip(1).map(|l| l.split(',').next().unwrap().parse().unwrap()).collect()
}

/// Every file under `dir` with its bytes (for byte-identity checks).
fn snapshot_files(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut files = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else {
                files.insert(e.path(), std::fs::read(e.path()).unwrap());
            }
        }
    }
    files
}

fn copy_tree(from: &Path, to: &Path) {
    for (path, bytes) in snapshot_files(from) {
        let dest = to.join(path.strip_prefix(from).unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::write(dest, bytes).unwrap();
    }
}

#[test]
fn c18_a_damaged_newest_checkpoint_falls_back_to_the_previous_one() {
    let data = cases().join("C18/dataset");
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // 10 training images at batch 2: 5 steps an epoch, a checkpoint after each epoch.
    let (ok, log) = cli_train(&data, &run, &["--epochs", "3", "--batch-size", "2"]);
    assert!(ok, "{log}");
    let mut kept: Vec<String> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("step-"))
        .collect();
    kept.sort();
    assert_eq!(kept, ["step-00000010", "step-00000015"], "the two newest are kept");
    assert!(vramfit::checkpoint::verify(&run.join("checkpoints/step-00000015"), false).is_ok());

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
    let mut kept: Vec<String> = std::fs::read_dir(emptied.join("checkpoints"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("step-"))
        .collect();
    kept.sort();
    assert_eq!(kept, ["step-00000010", "step-00000012"], "the damaged one goes, the intact fallback stays");
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
    let (ok, log) = cli_train(&data, &run, &["--resume", "--epochs", "3"]);
    assert!(ok, "{log}");
    assert!(log.contains("resume: train.epochs: 1 -> 3 (applied)"), "{log}");
    assert_eq!(metric_steps(&run), [1, 2, 3]);
    let epochs = std::fs::read_to_string(run.join("epochs.csv")).unwrap();
    assert_eq!(epochs.lines().count(), 1 + 3, "{epochs}");
    // Batch size and learning rate apply from the next step, announced.
    let (ok, log) = cli_train(&data, &run, &["--resume", "--batch-size", "2", "--lr", "0.5", "--epochs", "4"]);
    assert!(ok, "{log}");
    assert!(log.contains("resume: train.batch_size: 64 -> 2 (applied)"), "{log}");
    assert!(log.contains("resume: optimizer.lr: 0.003 -> 0.5 (applied)"), "{log}");
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
    let lock = vramfit::checkpoint::RunLock::acquire(&run).unwrap();
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
    assert!(log.contains("already holds a run") && log.contains(r#"classes ["a", "b"], 1 steps"#), "{log}");
    assert!(log.contains("--resume"), "{log}");
    assert!(snapshot_files(&run) == before, "the first run's files are byte-identical");
    // The engine refuses too, so the app (which calls it directly) gets the same answer.
    let splits = dataset::open(
        &cases().join("C20/dataset_xyz"),
        &ScanOptions { val_fraction: 0.1, seed: 1, allow_empty_classes: false },
    )
    .unwrap();
    let cpu = device::select(DeviceChoice::Cpu(CpuBackend::Flex)).unwrap();
    let err = train::train(&TrainRequest::new(quickstart(), &run), &cpu, &splits, &mut |_| {}, &StopSignal::new())
        .unwrap_err();
    assert!(err.to_string().contains("already holds a run"), "{err}");
    assert!(snapshot_files(&run) == before);
}

// ---------------------------------------------------------------- whole-dataset faults (C21, C31)

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

/// A `file://` URI for `path`, percent-encoded as file managers paste it.
fn file_uri(path: &Path) -> String {
    let mut uri = String::from("file://");
    for b in path.to_str().unwrap().bytes() {
        if b.is_ascii_alphanumeric() || b"/-_.".contains(&b) {
            uri.push(b as char);
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri
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
    assert!(ok && log.contains("2 classes, 12 files") && log.contains("my data/train set (10%"), "{log}");
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
        assert!(vramfit::checkpoint::find_latest(&run).unwrap().damaged.is_empty());
        let (ok, log) = cli_train(&data, &run, &["--resume"]);
        assert!(ok, "{fault}: {log}");
        assert_eq!(metric_steps(&run), (1..=15).collect::<Vec<_>>(), "{fault}: every step once");
    }
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
    let (ds, report) = scan(&root, false).unwrap();
    assert_eq!(ds.class_counts(), [6, 6], "no image of another class is counted under dog");
    assert_eq!(report.symlink_loops.len(), 2, "{:?}", report.symlink_loops);
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
        let resumed_from = vramfit::checkpoint::find_latest(&run).map_or(0, |l| l.state.global_step);
        let (ok, log) = cli_train(&data, &run, &["--resume"]);
        assert!(ok, "{point}: {log}");
        assert_eq!(metric_steps(&run), (1..=30).collect::<Vec<_>>(), "{point}: every step once");
        for e in std::fs::read_dir(run.join("checkpoints")).unwrap().flatten().filter(|e| e.path().is_dir()) {
            assert!(vramfit::checkpoint::verify(&e.path(), false).is_ok(), "{point}: {:?}", e.path());
        }
        outcomes.push(format!("kill@{point}: resumed from step {resumed_from}"));
    }
    eprintln!("{}", outcomes.join("\n"));
}

#[test]
fn when_one_image_is_over_the_buffer_limit_the_advice_is_not_a_smaller_batch() {
    let device = gpu();
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

#[test]
fn property_random_mixes_of_good_and_undecodable_files_train_or_are_refused_never_crash() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let good = std::fs::read(cases().join("C18/dataset/a/img_00.png")).unwrap();
    let bad: [&[u8]; 3] = [b"", b"plain text, not an image", &good[..good.len() / 2]];
    let cpu = device::select(DeviceChoice::Cpu(CpuBackend::Flex)).unwrap();
    for case in 0..25 {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let classes = rng.random_range(2..=3);
        let mut decodable = Vec::new();
        for c in 0..classes {
            let class_dir = data.join(format!("class{c}"));
            std::fs::create_dir_all(&class_dir).unwrap();
            let n_good = rng.random_range(0..=4);
            let n_bad = rng.random_range(usize::from(n_good == 0)..=3);
            for i in 0..n_good {
                std::fs::write(class_dir.join(format!("good{i}.png")), &good).unwrap();
            }
            for i in 0..n_bad {
                std::fs::write(class_dir.join(format!("bad{i}.png")), bad[rng.random_range(0..bad.len())]).unwrap();
            }
            decodable.push(n_good);
        }
        let splits =
            dataset::open(&data, &ScanOptions { val_fraction: 0.0, seed: 1, allow_empty_classes: false }).unwrap();
        let mut config = quickstart();
        config.train.epochs = 2;
        config.train.batch_size = rng.random_range(1..=4);
        let mut req = TrainRequest::new(config, dir.path().join("run"));
        req.max_steps = Some(3);
        let result = train::train(&req, &cpu, &splits, &mut |_| {}, &StopSignal::new());
        let trainable = decodable.iter().all(|&n| n > 0);
        match result {
            Ok(s) => assert!(trainable && s.global_step >= 1, "case {case} {decodable:?}: {s:?}"),
            Err(e) => {
                assert!(!trainable && e.to_string().contains("no decodable image"), "case {case} {decodable:?}: {e}")
            }
        }
    }
}

/// C30: a model trained in mode `none` (sizes kept) meets a 4000x3000 photo. On a wgpu adapter
/// (lavapipe in CI: 128 MiB per buffer) the input is checked before upload and predicted on the
/// CPU with a one-line notice, agreeing with `--device cpu`; evaluation of such photos is refused
/// naming the limit and the fix; training at that size is refused before its first step. Never a
/// panic or a backtrace.
#[test]
fn c30_inputs_over_the_adapters_buffer_limit_never_reach_the_device() {
    let c30 = cases().join("C30");
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let (ok, text) =
        cli_train(&c30.join("dataset"), &run, &["--preprocess", "none", "--epochs", "1", "--batch-size", "4"]);
    assert!(ok, "{text}");
    let photo = c30.join("photo_4000x3000.png");
    let predict = |device: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramfit"))
            .args(["predict", "--json", "--top-k", "2", "--device", device, "--model"])
            .arg(run.join("export"))
            .arg(&photo)
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
    };
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
    let eval: [&std::ffi::OsStr; 6] = [
        "eval".as_ref(),
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
        ["train", "--preprocess", "none", "--data"].iter().map(|s| s.as_ref()).collect();
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

/// Every numeric key of the config (found by walking the quickstart preset, so a key added later
/// is covered without editing this test), each with random values: special floats, extremes,
/// random magnitudes and signs, and values near the default. Each config is either refused at
/// load time with the key named, or trains 2 steps on the CPU with finite losses.
#[test]
fn property_random_values_for_every_numeric_config_key_are_refused_by_name_or_train() {
    use rand::{Rng, SeedableRng};
    fn numeric_keys(prefix: &str, v: &toml::Value, out: &mut Vec<(String, toml::Value)>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                    numeric_keys(&key, v, out);
                }
            }
            toml::Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    numeric_keys(&format!("{prefix}[{i}]"), v, out);
                }
            }
            toml::Value::Integer(_) | toml::Value::Float(_) => out.push((prefix.to_string(), v.clone())),
            _ => {}
        }
    }
    fn slot<'a>(root: &'a mut toml::Value, key: &str) -> &'a mut toml::Value {
        let mut node = root;
        for part in key.split('.') {
            let (name, index) = match part.split_once('[') {
                Some((n, i)) => (n, Some(i.trim_end_matches(']').parse::<usize>().unwrap())),
                None => (part, None),
            };
            node = node.get_mut(name).unwrap();
            if let Some(i) = index {
                node = node.get_mut(i).unwrap();
            }
        }
        node
    }
    let base = quickstart();
    let root: toml::Value = toml::from_str(&base.to_toml()).unwrap();
    let mut keys = Vec::new();
    numeric_keys("", &root, &mut keys);
    assert!(keys.len() >= 30, "{keys:?}");
    let splits = dataset::open(
        &cases().join("C30/dataset"),
        &ScanOptions { val_fraction: 0.2, seed: 1, allow_empty_classes: false },
    )
    .unwrap();
    let cpu = device::select(DeviceChoice::Cpu(CpuBackend::Flex)).unwrap();
    // CI runs seed 11; VRAMFIT_PROPERTY_SEED explores others.
    let seed = std::env::var("VRAMFIT_PROPERTY_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(11);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let (mut refused, mut trained) = (0, 0);
    for (key, default) in &keys {
        for _ in 0..6 {
            let special = [0.0, -1.0, 1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e-40, 1e40, 9.2e18, -9.2e18];
            let x: f64 = match rng.random_range(0..3) {
                0 => special[rng.random_range(0..special.len())],
                1 => {
                    let sign = if rng.random_bool(0.3) { -1.0 } else { 1.0 };
                    sign * 10f64.powf(rng.random_range(-12.0..12.0))
                }
                _ => {
                    default.as_float().or(default.as_integer().map(|i| i as f64)).unwrap()
                        * 10f64.powf(rng.random_range(-1.0..1.0))
                }
            };
            let value = match default {
                toml::Value::Integer(_) if x.is_finite() && x.abs() < 9.3e18 && rng.random_bool(0.8) => {
                    toml::Value::Integer(x.round() as i64)
                }
                _ => toml::Value::Float(x),
            };
            let mut doc = root.clone();
            *slot(&mut doc, key) = value.clone();
            let text = toml::to_string(&doc).unwrap();
            let leaf = key.rsplit('.').next().unwrap().split('[').next().unwrap();
            let config = match Config::from_toml(&text, "property.toml") {
                Err(e) => {
                    let e = e.to_string();
                    assert!(e.contains(leaf), "{key} = {value}: the refusal must name the key: {e}");
                    refused += 1;
                    continue;
                }
                Ok(c) => c,
            };
            let dir = tempfile::tempdir().unwrap();
            let mut req = TrainRequest::new(config, dir.path().join("run"));
            req.max_steps = Some(2);
            let mut losses = Vec::new();
            let result = train::train(
                &req,
                &cpu,
                &splits,
                &mut |e| {
                    if let Event::Step { loss, .. } = e {
                        losses.push(loss)
                    }
                },
                &StopSignal::new(),
            );
            match result {
                // Two steps, or one when the run is one step long (train.epochs = 1).
                Ok(s) => assert!(s.global_step >= 1 && s.global_step == losses.len(), "{key} = {value}"),
                // Values in range whose network does not fit the budget: the plan refuses before
                // training, naming the budget key and the fix.
                Err(Error::Memory(m)) if m.contains("memory.memory_budget_bytes") => {
                    refused += 1;
                    continue;
                }
                Err(e) => panic!("{key} = {value} was accepted at load time but training failed: {e}"),
            }
            assert!(losses.iter().all(|l| l.is_finite()), "{key} = {value}: losses {losses:?}");
            trained += 1;
        }
    }
    eprintln!("{} keys: {refused} values refused by name, {trained} trained", keys.len());
    assert!(refused > 0 && trained > 0);
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
    assert!(ok, "exit 0 with the report: {log}");
    for problem in [
        "not valid UTF-8",
        "class folders with no images: empty",
        "\"only_bad\": 0 of",
        "a/broken.jpg",
        "b/notes.png",
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
    assert_eq!(manifest["format_version"], vramfit::run_dir::FORMAT_VERSION);
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
    let (ok, log) = cli_train(&data, &run, &["--resume", "--epochs", "2"]);
    assert!(ok, "{log}");
    assert!(log.contains("lacks train.keep_checkpoints") && log.contains("validation accuracy"), "{log}");
    assert_eq!(metric_steps(&run).len(), *metric_steps(&run).last().unwrap(), "each step once");
    assert!(run.join("run.json").exists(), "a resumed old folder gets its manifest");

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
