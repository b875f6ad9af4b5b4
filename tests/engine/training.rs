//! Training, export, prediction and memory on the wgpu adapter (lavapipe in CI) and the CPU.

use super::*;

#[test]
fn overfit_check_passes_on_the_wgpu_adapter() {
    let Some(device) = gpu_or_skip() else { return };
    let splits = bundled();
    let mut sink = |_e: Event| {};
    let r = train::overfit_check(&quickstart(), &device, &splits.train, 200, &mut sink, &StopSignal::new()).unwrap();
    assert!(r.passed, "accuracy on 64 images {:.3} after {} steps", r.accuracy, r.steps);
}

#[test]
fn train_export_predict_parity_and_resume() {
    // Trained on the CPU (burn flex: the epoch takes seconds; on lavapipe with burn's default
    // kernels, as the tests build, it took over a quarter of an hour of a CI run). Training on
    // the adapter, stop and resume included, is the app's test and the overfit check's; here the
    // exported weights predict on the adapter (where there is one) and on both CPU backends.
    let device = device::select(DeviceChoice::Cpu(CpuBackend::Flex)).unwrap();
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
    let (_, state) = vramfit::train::checkpoint::latest(&run).unwrap();
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
    let a = vramfit::inference::predict::Predictor::load(&export.join("model.bpk"), cpu.clone()).unwrap();
    let b = vramfit::inference::predict::Predictor::load(&export.join("model.safetensors"), cpu).unwrap();
    let img = image::RgbImage::from_fn(28, 28, |x, y| image::Rgb([(x * 9) as u8, (y * 9) as u8, 100]));
    assert_eq!(
        a.probabilities(std::slice::from_ref(&img)).unwrap(),
        b.probabilities(std::slice::from_ref(&img)).unwrap()
    );
    // 3) GPU vs CPU (flex, ndarray) predictions on the 1000 bundled test images; without an
    // adapter, ndarray against flex.
    let test: Vec<image::RgbImage> = {
        let pipe = SamplePipeline::from_config(&config, false);
        splits.val.samples.iter().map(|s| pipe.decode(&s.source).unwrap()).collect()
    };
    let probs = |dev: burn::tensor::Device| -> Vec<Vec<f32>> {
        let p = vramfit::inference::predict::Predictor::load(&export, dev).unwrap();
        test.chunks(100).flat_map(|c| p.probabilities(c).unwrap()).collect()
    };
    let (on_gpu, backends) = match gpu() {
        Some(gpu) => (probs(gpu.device.clone()), vec![CpuBackend::Flex, CpuBackend::Ndarray]),
        None => (probs(CpuBackend::Flex.device()), vec![CpuBackend::Ndarray]),
    };
    for backend in backends {
        let on_cpu = probs(backend.device());
        let argmax = |v: &[f32]| vramfit::inference::eval::top_k(v, 1)[0].0;
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
    let splits = dataset::open(
        &data,
        &ScanOptions { val_fraction: 0.0, seed: 1, allow_empty_classes: false, csv_paths_outside: false },
    )
    .unwrap();
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
    let Some(device) = gpu_or_skip() else { return };
    let splits = bundled();
    let mut config = quickstart();
    // 569 MiB predicted against a 64 MiB budget; --auto-fit then accumulates 12 micro-batches
    // of 44 (a batch of 4096 made the same point with 94 of them, 2 more minutes of CI).
    config.train.batch_size = 512;
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
    assert!(plan.fit_batch_size >= 1 && plan.fit_batch_size < 512);
    let mut req = TrainRequest::new(config, dir.path().join("fit"));
    req.auto_fit = true;
    req.max_steps = Some(1);
    let mut adapted = Vec::new();
    let s = train::train(
        &req,
        &device,
        &splits,
        &mut |e| {
            if let Event::BatchAdapted { micro_batch, grad_accum_steps, .. } = e {
                adapted.push((micro_batch, grad_accum_steps))
            }
        },
        &StopSignal::new(),
    )
    .unwrap();
    assert_eq!(adapted.first(), Some(&(plan.fit_batch_size, plan.fit_grad_accum_steps)));
    // One step at the fitted batch: its readings are the first shape's, handed back after it,
    // so nothing adapts it again (halvings after a crossing are
    // a_budget_crossed_mid_run_halves_the_micro_batch_and_the_steps_continue's).
    assert_eq!(adapted.len(), 1, "{adapted:?}");
    assert_eq!(s.global_step, 1);
}

/// The f16 GroupNorm (one f16 tensor kept for backward) computes burn's f32 GroupNorm: values,
/// input gradients and gamma/beta gradients agree to f16 precision, also for inputs whose squares
/// overflow f16 (mean 300).
#[test]
fn f16_group_norm_matches_burns_group_norm_in_value_and_gradient() {
    use burn::nn::GroupNormConfig;
    use burn::tensor::{Distribution, FloatDType, Tensor};
    let Some(device) = gpu_or_skip() else { return };
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
fn a_huge_learning_rate_gets_the_divergence_diagnosis() {
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
    // An exploding loss (over 10x the chance level twice in a row) or a non-finite one, whichever
    // comes first, gets the same diagnosis.
    assert!(err.starts_with("training diverged: "), "{err}");
    assert!(err.contains("chance-level") || err.contains("non-finite"), "{err}");
    assert!(err.contains("learning rate too high") && err.contains("optimizer.lr"), "{err}");
}

/// A step whose largest tensor is over the adapter's buffer limit is refused before it runs,
/// also when resuming a run: the error names the limit and the fix, the process goes on, the
/// run's checkpoint still loads and the run resumes at a batch that fits.
#[test]
fn a_tensor_over_the_adapter_buffer_limit_is_refused_with_the_reason() {
    let Some(device) = gpu_or_skip() else { return };
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
    let (_, _, state) = vramfit::train::checkpoint::load_latest_model(&run, &device.device).unwrap();
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
    let Some(device) = gpu_or_skip() else { return };
    let splits = bundled();
    let mut config = quickstart();
    config.train.memory_sample_every = 1;
    let (batch, accum) = (config.train.batch_size, config.train.grad_accum_steps);
    let dir = tempfile::tempdir().unwrap();
    let mut req = TrainRequest::new(config, dir.path().join("run"));
    req.max_steps = Some(5);
    req.export = false;
    let budget = vramfit::engine::events::LiveBudget::new(1 << 40);
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
        Event::BatchAdapted { micro_batch, grad_accum_steps, reason } => {
            adapted.push((steps.len(), micro_batch, grad_accum_steps, reason))
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
        s.micro_batch < batch && s.micro_batch * s.grad_accum_steps >= batch,
        "{} x {}",
        s.micro_batch,
        s.grad_accum_steps
    );
    assert_eq!(s.global_step, 5);
}
