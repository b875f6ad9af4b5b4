//! Image loading: the real-world image cases (C01-C09, C15, C29).

use super::*;

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
        let predictor = flex_predictor(32);
        let input = predictor.input(&img).unwrap();
        assert_eq!(input.dims(), [1, 3, 32, 32]);
        let top = predictor.predict_image(&img, 5).unwrap();
        assert_eq!(top.len(), 3);
        assert!((top.iter().map(|c| c.probability).sum::<f32>() - 1.0).abs() < 1e-4);
    }
}

/// An untrained 3-class predictor on burn flex whose inputs are resized and cropped to `crop_size`.
/// A file's bytes as a page hands them over, named `name`.
fn encoded(bytes: Vec<u8>, name: &str) -> SampleSource {
    SampleSource::Encoded { path: name.into(), bytes: bytes.into() }
}

fn flex_predictor(crop_size: usize) -> vramfit::inference::predict::Predictor {
    let (model, metadata) = flex_model(crop_size);
    vramfit::inference::predict::Predictor::from_model(model, metadata, burn::tensor::Device::flex())
}

/// An untrained 3-class model on burn flex and its metadata (inputs resized and cropped to
/// `crop_size`).
fn flex_model(crop_size: usize) -> (vramfit::model::Classifier, vramfit::export::ModelMetadata) {
    let mut config = Config::default();
    config.data.preprocess = PreprocessConfig { mode: PreprocessMode::ResizeAndCrop, load_size: crop_size, crop_size };
    let classes = ["a".to_string(), "b".into(), "c".into()];
    let metadata = vramfit::export::ModelMetadata::new(&config, &classes, 0, Default::default());
    (vramfit::model::Classifier::new(&config.model, 3, &burn::tensor::Device::flex()), metadata)
}

/// A file's bytes (what a page gets from a dropped file) decode to the pixels its path does,
/// through the same rules (EXIF orientation, alpha, truncation), and a bad file's error names it.
#[test]
fn prediction_from_dropped_bytes_matches_prediction_from_the_file() {
    let predictor = flex_predictor(32);
    // (case, file, decoded width x height): orientation 6 turns the 64x32 file upright; the
    // 64x64 JPEG decodes at half scale (the predictor needs 32 px: `decode_image_scaled`).
    for (case, file, dims) in [
        ("C01", "exif_orientation6.jpg", (32, 64)),
        ("C06", "rgba_hidden_blue_224.png", (224, 224)),
        ("C07", "ok_progressive.jpg", (32, 32)),
    ] {
        let path = cases().join(case).join(file);
        let from_file = predictor.decode(&SampleSource::File(path.clone())).unwrap();
        let from_bytes = predictor.decode(&encoded(std::fs::read(&path).unwrap(), file)).unwrap();
        assert_eq!(from_bytes.dimensions(), dims, "{file}");
        assert_eq!(from_bytes.as_raw(), from_file.as_raw(), "{file}");
        let (a, b) =
            (predictor.predict_image(&from_file, 3).unwrap(), predictor.predict_image(&from_bytes, 3).unwrap());
        assert_eq!(a, b, "{file}");
    }
    // An input over the device's per-buffer limit runs on the CPU with a notice, or, where there
    // is no CPU to spare (a page), is refused with the sizes before it is preprocessed.
    let img = predictor.decode(&SampleSource::File(cases().join("C06/rgba_hidden_blue.png"))).unwrap();
    let (model, metadata) = flex_model(32);
    let flex = burn::tensor::Device::flex;
    let capped = |m: &vramfit::model::Classifier| {
        vramfit::inference::predict::Predictor::from_model(m.clone(), metadata.clone(), flex())
            .with_buffer_limit(Some(1024))
    };
    let uncapped = vramfit::inference::predict::Predictor::from_model(model.clone(), metadata.clone(), flex());
    let fallback = capped(&model);
    assert_eq!(fallback.predict_image(&img, 3).unwrap(), uncapped.predict_image(&img, 3).unwrap());
    assert!(fallback.take_notices().iter().any(|n| n.contains("32x32 input") && n.ends_with("predicted on the CPU")));
    assert!(uncapped.take_notices().is_empty());
    let err = capped(&model).without_cpu_fallback().predict_image(&img, 3).unwrap_err();
    assert!(matches!(err, vramfit::Error::Memory(_)) && err.to_string().contains("32x32 input"), "{err}");
    // The C06 file's hidden blue becomes white through the bytes path too.
    let c06 = predictor.decode(&encoded(std::fs::read(cases().join("C06/rgba_hidden_blue_224.png")).unwrap(), "x.png"));
    assert_eq!(c06.unwrap().get_pixel(222, 112).0, [255, 255, 255]);
    for (bytes, name) in [
        (std::fs::read(cases().join("C07").join("truncated_half.png")).unwrap(), "truncated_half.png"),
        (b"not an image\n".to_vec(), "notes.txt"),
    ] {
        let err = predictor.decode(&encoded(bytes, name)).unwrap_err();
        assert!(matches!(err, vramfit::Error::Image { .. }) && err.to_string().contains(name), "{err}");
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
    // Bit flips: the baseline's size with pixels that differ from it, or a per-file error;
    // never a panic.
    match load("C07", "corrupt_bitflip.jpg") {
        Ok(img) => {
            assert_eq!(img.dimensions(), ok.dimensions());
            assert_ne!(img.as_raw(), ok.as_raw(), "a flipped bit changes some pixels");
        }
        Err(e) => assert!(e.to_string().contains("corrupt_bitflip.jpg"), "{e}"),
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
    // One class of one usable image: the whole report, then exit 1 (training would stop).
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "check-data: {stdout} {stderr}");
    assert!(stdout.contains("training would stop") && stderr.contains("would stop"), "{stdout} {stderr}");
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
                    assert!(matches!(e, vramfit::Error::Preprocess(_)), "{e}");
                    let e = e.to_string();
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
    let err = vramfit::data::loader::check_sizes_agree(&ds, &none).unwrap_err().to_string();
    assert!(err.contains("resize_and_crop") && err.contains("255x255 and "), "{err}");
    let fixed = PreprocessConfig { mode: PreprocessMode::ResizeAndCrop, ..none };
    assert_eq!(
        vramfit::data::loader::check_sizes_agree(&ds, &fixed).unwrap(),
        None,
        "a fixed output size needs no check"
    );
    let same =
        ds.samples.iter().filter(|s| matches!(&s.source, SampleSource::File(p) if p.ends_with("odd_255x255.png")));
    let one = dataset::Dataset { class_names: ds.class_names.clone(), samples: same.cloned().collect() };
    let (h, w) = vramfit::data::loader::check_sizes_agree(&one, &none).unwrap().unwrap();
    assert_eq!(h, w, "a square image trains square");
    assert!((252..=256).contains(&h), "255 px trains at its own (rounded) size, not {h}");
}

/// C42: every name of JPEG is a JPEG; formats no decoder here reads are named with the fix, by
/// extension in a scan and by content in predict (which exits 1 when an image is unreadable);
/// a class folder holding only HEIC photos says so instead of "no images".
#[test]
fn c42_every_jpeg_extension_is_an_image_and_unsupported_formats_are_named_with_the_fix() {
    let data = cases().join("C42/dataset");
    let opts = ScanOptions { val_fraction: 0.0, seed: 1, allow_empty_classes: false, csv_paths_outside: false };
    let splits = dataset::open(&data, &opts).unwrap();
    let names: Vec<String> =
        splits.train.samples.iter().map(|s| s.source.describe().rsplit('/').next().unwrap().to_string()).collect();
    for jpeg in ["camera.jpe", "saved_from_browser.jfif", "SCAN.JFIF", "old.jif", "print_cmyk.tif"] {
        assert!(names.iter().any(|n| n == jpeg), "{jpeg} not taken: {names:?}");
    }
    assert_eq!(splits.train.class_counts(), [9, 8]);
    let why = |file: &str| splits.report.ignored.iter().find(|(p, _)| p.ends_with(file)).map(|(_, w)| *w).unwrap();
    assert!(why("IMG_0001.HEIC").starts_with("HEIC/HEIF photo") && why("IMG_0002.heif").contains("convert it to JPEG"));
    assert!(why("modern.avif").starts_with("AVIF image") && why("future.jxl").starts_with("JPEG XL image"));
    assert_eq!(splits.report.ignored.len(), 4);
    // Decoded by content, whatever the name.
    for (file, format) in
        [("b/IMG_0001.HEIC", "HEIF/HEIC image"), ("b/modern.avif", "AVIF image"), ("b/future.jxl", "JPEG XL")]
    {
        let e = load_image(&data.join(file), &LoadOptions::default()).unwrap_err().to_string();
        assert!(e.contains(format) && e.contains("convert it to JPEG or PNG"), "{file}: {e}");
    }
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let (ok, log) = cli_train(&data, &run, &["--epochs", "1", "--batch-size", "4"]);
    assert!(ok && log.contains("4 images in formats vramfit cannot read"), "{log}");
    let (ok, log) = cli_predict(&run, &[&data.join("a/saved_from_browser.jfif"), &data.join("b/modern.avif")]);
    assert!(
        !ok && log.contains("saved_from_browser.jfif: a ") && log.contains("1 of 2 images could not be predicted"),
        "{log}"
    );
    let top0 = ["predict", "--device", "cpu", "--top-k", "0", "--model"].map(std::ffi::OsStr::new);
    let (ok, log) = vramfit_cli(&[&top0[..], &[run.as_os_str(), data.join("a/camera.jpe").as_os_str()]].concat());
    assert!(!ok && log.contains("0 classes would show nothing"), "{log}");
    // A folder given to predict: its HEIC photos are named one by one, not passed over.
    let iphone = cases().join("C42/dataset_iphone");
    let (ok, log) = cli_predict(&run, &[&iphone.join("iphone")]);
    assert!(!ok && log.matches("HEIF/HEIC image (brand").count() == 4, "{log}");
    let (ok, log) = cli_train(&iphone, &dir.path().join("iphone"), &["--epochs", "1"]);
    assert!(
        !ok && log.contains("class folders with no images: iphone (its 4 files cannot be read: HEIC/HEIF"),
        "{log}"
    );
}
