//! Data parallelism (`--devices`): one run over several devices, through the engine and the CLI.

use super::*;

/// A run on three devices (flex, ndarray and the wgpu adapter, lavapipe in CI; flex again
/// without an adapter) stops at its step cap with a checkpoint, resumes on flex alone, finishes
/// with every step once, learns (its validation loss falls from the chance level) and exports
/// weights that name the three devices' run.
#[test]
fn a_run_on_three_devices_resumes_on_one_and_exports() {
    let flex = device::select(DeviceChoice::Cpu(CpuBackend::Flex)).unwrap();
    let ndarray = device::select(DeviceChoice::Cpu(CpuBackend::Ndarray)).unwrap();
    let third = gpu().unwrap_or_else(|| flex.clone());
    let splits = bundled_slice(256, 64);
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut config = quickstart();
    config.train.epochs = 2;
    config.train.batch_size = 16;
    config.train.grad_accum_steps = 3;
    let mut req = TrainRequest::new(config.clone(), &run);
    req.replicas = vec![ndarray, third.clone()];
    req.max_steps = Some(3);
    let mut started = String::new();
    let first = train::train(
        &req,
        &flex,
        &splits,
        &mut |e| {
            if let Event::Started { device, .. } = e {
                started = device
            }
        },
        &StopSignal::new(),
    )
    .unwrap();
    assert!(first.stopped && first.global_step == 3, "{first:?}");
    assert_eq!(started, format!("CPU (burn flex) + CPU (burn ndarray) + {}", third.name));
    let mut resume = TrainRequest::new(config, &run);
    resume.resume = true;
    let end = train::train(&resume, &flex, &splits, &mut |_| {}, &StopSignal::new()).unwrap();
    // 256 images in loader batches of 16, 3 a step: 6 steps an epoch (the last takes the 16th).
    assert_eq!((end.global_step, end.epochs_completed, end.stopped), (12, 2, false));
    assert_eq!(metric_steps(&run), (1..=12).collect::<Vec<_>>());
    let val = end.val.unwrap();
    assert!(val.loss < (10f32).ln() - 0.2, "validation loss {} after 12 steps", val.loss);
    assert!(end.export_dir.unwrap().join("model.safetensors").is_file());
}

/// `vramfit train --devices cpu,cpu:ndarray` trains in the worker process on both, says so, and
/// its resume hint names both again; a bad entry is refused before anything runs, naming it.
#[test]
fn the_cli_trains_on_the_devices_listed_and_refuses_an_unknown_one() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let data = dataset::bundled_dataset_dir();
    let args = ["train", "--devices", "cpu,cpu:ndarray", "--batch-size", "16", "--grad-accum-steps", "2"];
    let mut args: Vec<&std::ffi::OsStr> = args.iter().map(|s| s.as_ref()).collect();
    args.extend(["--max-steps".as_ref(), "2".as_ref(), "--data".as_ref(), data.as_os_str()]);
    args.extend(["--out".as_ref(), run.as_os_str()]);
    let (ok, text) = vramfit_cli(&args);
    assert!(ok, "{text}");
    assert!(text.contains("training on CPU (burn flex) + CPU (burn ndarray):"), "{text}");
    assert!(text.contains("--devices cpu,cpu:ndarray"), "{text}");
    assert_eq!(metric_steps(&run), vec![1, 2]);
    let bad = ["train", "--devices", "cpu,cuda:0", "--out"].map(std::ffi::OsStr::new);
    let mut bad = bad.to_vec();
    bad.push(dir.path().join("bad").into_os_string().leak());
    let (ok, text) = vramfit_cli(&bad);
    assert!(!ok && text.contains("`cuda:0` is not a device"), "{text}");
    assert!(!dir.path().join("bad").exists(), "a refused command made its run folder");
}
