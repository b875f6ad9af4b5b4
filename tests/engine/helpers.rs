//! The helpers the test modules share: data and devices, child processes, the app harness,
//! the CLI, and run-folder files.

use super::*;

pub(crate) fn cases() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/cases")
}

pub(crate) fn load(case: &str, file: &str) -> vramfit::Result<image::RgbImage> {
    load_image(&cases().join(case).join(file), &LoadOptions::default())
}

pub(crate) fn close(px: [u8; 3], want: [u8; 3], tol: i32) -> bool {
    px.iter().zip(want).all(|(a, b)| (*a as i32 - b as i32).abs() <= tol)
}

pub(crate) fn scan(dir: &Path, allow_empty: bool) -> vramfit::Result<(dataset::Dataset, dataset::ScanReport)> {
    dataset::scan_folder(
        dir,
        &ScanOptions { val_fraction: 0.0, seed: 0, allow_empty_classes: allow_empty, csv_paths_outside: false },
    )
}

/// The default wgpu adapter, or `None` when the machine has none, unless `VRAMFIT_REQUIRE_GPU`
/// is set (as in CI, where lavapipe is installed): then a missing adapter fails the test. For
/// tests that fall back to the CPU without one; a test that needs the adapter calls
/// [`gpu_or_skip`].
pub(crate) fn gpu() -> Option<SelectedDevice> {
    let d = device::select(DeviceChoice::Gpu(None)).unwrap();
    if d.is_gpu() {
        return Some(d);
    }
    let why = "no wgpu adapter: install mesa-vulkan-drivers (lavapipe) to run this test";
    assert!(std::env::var_os("VRAMFIT_REQUIRE_GPU").is_none(), "{why}");
    None
}

/// GPU tests skipped in this run so far.
pub(crate) static GPU_SKIPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// [`gpu`] for a test that needs the adapter: without one the test is skipped (the caller
/// returns), and a line naming it, why, and how many GPU tests were skipped so far is written to
/// the terminal past the test harness's output capture, so a run without an adapter shows what
/// it did not test.
pub(crate) fn gpu_or_skip() -> Option<SelectedDevice> {
    let found = gpu();
    if found.is_none() {
        use std::io::Write;
        let n = GPU_SKIPS.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let test = std::thread::current().name().unwrap_or("a test").to_string();
        let _ = writeln!(
            std::io::stderr().lock(),
            "SKIPPED {test} (GPU test {n} skipped in this run): no wgpu adapter; install mesa-vulkan-drivers (lavapipe), or set VRAMFIT_REQUIRE_GPU=1 to fail instead"
        );
    }
    found
}

/// Runs the calling test again, alone, in a child process of this test binary, and returns true
/// there (the caller then returns); returns false inside that child, where the test's body runs.
/// For tests that read the device's pools: every test of one process shares them.
pub(crate) fn in_own_process(test_path: &str) -> bool {
    if std::env::var_os("VRAMFIT_TEST_CHILD").is_some() {
        return false;
    }
    run_in_child(test_path, &[]);
    true
}

/// Runs the test `test_path` alone in a child process of this test binary with `envs` set,
/// and asserts that it ran and passed.
pub(crate) fn run_in_child(test_path: &str, envs: &[(&str, &str)]) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        // --include-ignored: an ignored test run on purpose (`-- --ignored NAME`) runs in the child too.
        .args(["--exact", test_path, "--include-ignored", "--nocapture", "--test-threads", "1"])
        .env("VRAMFIT_TEST_CHILD", "1")
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{test_path} in its own process ({envs:?}):\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 passed"), "{test_path} did not run in its own process:\n{stdout}");
}

pub(crate) fn quickstart() -> Config {
    vramfit::cli::load_config("quickstart").unwrap()
}

pub(crate) fn bundled() -> dataset::Splits {
    dataset::open(
        &dataset::bundled_dataset_dir(),
        &ScanOptions { val_fraction: 0.1, seed: 42, allow_empty_classes: false, csv_paths_outside: false },
    )
    .unwrap()
}

/// The first `train` training and `val` validation images of [`bundled`].
pub(crate) fn bundled_slice(train: usize, val: usize) -> dataset::Splits {
    let mut splits = bundled();
    splits.train.samples.truncate(train);
    splits.val.samples.truncate(val);
    splits
}

/// The Python that imports onnx, onnxruntime, numpy and PIL: `VRAMFIT_ONNX_PYTHON` (`.ci/run`
/// sets it to its virtual environment), else `python3`. Without one the ONNX Runtime checks print
/// why and skip, unless `VRAMFIT_REQUIRE_ONNX` is set (as in CI), where a missing runtime fails.
pub(crate) fn onnx_python() -> Option<PathBuf> {
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
pub(crate) fn bundled_test_pngs(dir: &Path, n: usize) -> PathBuf {
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
pub(crate) fn ort_check(python: &Path, export: &Path, images: &Path, predict_device: &[&str]) -> serde_json::Value {
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

/// A file dropped on the window in the tests (the windowing layer's own type is private).
#[derive(Debug)]
pub(crate) struct TestDrop(pub(crate) PathBuf);

impl egui::DroppedFile for TestDrop {
    fn path(&self) -> &Path {
        &self.0
    }
    fn bytes(&self) -> Result<Vec<u8>, String> {
        std::fs::read(&self.0).map_err(|e| e.to_string())
    }
}

/// Saves the window as `target/screenshots/NAME.png` for a person to look at (the compared
/// snapshots are the setup panel's, in `tests/snapshots/`). Harnesses without wgpu save nothing.
pub(crate) fn save_screenshot(harness: &mut egui_kittest::Harness<'_, vramfit::gui::VramfitApp>, name: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    if let Ok(img) = harness.render() {
        img.save(dir.join(format!("{name}.png"))).unwrap();
    }
}

/// A guard against a hung app, not a speed target. A cold CI run on 2 cores once took over
/// 600 s to reach the app's second training step on lavapipe: the first step compiles and
/// autotunes every kernel (172 s alone with empty caches, README) while the capped-pool tests
/// autotune in processes of their own on the same cores.
pub(crate) const STEP_UNTIL_TIMEOUT_SECS: u64 = 1800;

/// Steps the app until `done`; after [`STEP_UNTIL_TIMEOUT_SECS`] the test fails, leaving a
/// screenshot named after what it waited for.
pub(crate) fn step_until(
    harness: &mut egui_kittest::Harness<'_, vramfit::gui::VramfitApp>,
    what: &str,
    done: impl Fn(&vramfit::gui::VramfitApp) -> bool,
) {
    let start = std::time::Instant::now();
    while !done(harness.state()) {
        if start.elapsed().as_secs() >= STEP_UNTIL_TIMEOUT_SECS {
            let name = format!("timeout-{}", what.replace(|c: char| !c.is_ascii_alphanumeric(), "-"));
            save_screenshot(harness, &name);
            panic!(
                "timed out waiting for {what}; status {}, error {:?}; screenshot target/screenshots/{name}.png",
                harness.state().status(),
                harness.state().error()
            );
        }
        harness.step();
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    harness.step();
}

/// The app's training worker: this build's vramfit binary, with `VRAMFIT_FAULT` when given.
pub(crate) fn app_worker(fault: Option<&str>) -> vramfit::gui::WorkerLaunch {
    vramfit::gui::WorkerLaunch {
        exe: PathBuf::from(env!("CARGO_BIN_EXE_vramfit")),
        env: fault.map(|f| ("VRAMFIT_FAULT".into(), f.into())).into_iter().collect(),
    }
}

/// Runs the vramfit binary; returns (success, stdout + stderr).
pub(crate) fn vramfit_cli(args: &[&std::ffi::OsStr]) -> (bool, String) {
    let (code, text) = vramfit_cli_env(args, None);
    (code == Some(0), text)
}

/// Runs the vramfit binary with `VRAMFIT_FAULT` set to `fault` (when given); returns (exit
/// status code, stdout + stderr).
pub(crate) fn vramfit_cli_env(args: &[&std::ffi::OsStr], fault: Option<&str>) -> (Option<i32>, String) {
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
pub(crate) fn cli_train(data: &Path, run: &Path, extra: &[&str]) -> (bool, String) {
    let (code, text) = cli_train_with_fault(data, run, extra, None);
    (code == Some(0), text)
}

/// [`cli_train`] with `VRAMFIT_FAULT` set (when given); returns (exit status code, output).
pub(crate) fn cli_train_with_fault(
    data: &Path,
    run: &Path,
    extra: &[&str],
    fault: Option<&str>,
) -> (Option<i32>, String) {
    let mut args: Vec<&std::ffi::OsStr> = ["train", "--device", "cpu", "--data"].iter().map(|s| s.as_ref()).collect();
    args.extend([data.as_os_str(), "--out".as_ref(), run.as_os_str()]);
    args.extend(extra.iter().map(|s| std::ffi::OsStr::new(*s)));
    vramfit_cli_env(&args, fault)
}

/// The step column of a run's metrics.csv.
pub(crate) fn metric_steps(run: &Path) -> Vec<usize> {
    let text = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    text.lines().skip(1).map(|l| l.split(',').next().unwrap().parse().unwrap()).collect()
}

/// Every file under `dir` with its bytes (for byte-identity checks).
pub(crate) fn snapshot_files(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
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

pub(crate) fn copy_tree(from: &Path, to: &Path) {
    for (path, bytes) in snapshot_files(from) {
        let dest = to.join(path.strip_prefix(from).unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::write(dest, bytes).unwrap();
    }
}

/// A `file://` URI for `path`, percent-encoded as file managers paste it.
pub(crate) fn file_uri(path: &Path) -> String {
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

/// `vramfit predict --device cpu --model MODEL FILES...`; returns (success, output).
pub(crate) fn cli_predict(model: &Path, files: &[&Path]) -> (bool, String) {
    let mut args: Vec<&std::ffi::OsStr> = ["predict", "--device", "cpu", "--model"].map(std::ffi::OsStr::new).to_vec();
    args.push(model.as_os_str());
    args.extend(files.iter().map(|f| f.as_os_str()));
    vramfit_cli(&args)
}
