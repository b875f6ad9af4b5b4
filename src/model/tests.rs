use super::*;
use crate::config::StageConfig;

#[test]
fn both_pointwise_products_match_conv2d_in_value_and_gradients_on_both_cpu_backends() {
    use burn::tensor::Distribution;
    let cpus = [crate::device::CpuBackend::Ndarray, crate::device::CpuBackend::Flex];
    for device in cpus.map(|b| b.device().autodiff()) {
        let x = Tensor::<4>::random([3, 5, 4, 6], Distribution::Normal(0.0, 1.0), &device).require_grad();
        let w = Tensor::<4>::random([7, 5, 1, 1], Distribution::Normal(0.0, 1.0), &device).require_grad();
        let options = ConvOptions::new([1, 1], [0, 0], [1, 1], 1);
        let by_conv = burn::tensor::module::conv2d(x.clone(), w.clone(), None, options);
        // Relative to the largest value: the paths sum the same products in another order.
        let close = |a: Tensor<4>, b: Tensor<4>, what: &str| {
            let scale = a.clone().abs().max().into_scalar::<f32>().max(1.0);
            let diff = (a - b).abs().max().into_scalar::<f32>();
            assert!(diff < 1e-6 * scale.max(10.0), "{what}: largest difference {diff} (largest value {scale})");
        };
        // A loss that weights each output element differently, so every gradient entry counts.
        let weights = Tensor::<4>::random([3, 7, 4, 6], Distribution::Normal(0.0, 1.0), &device);
        let g_conv = (by_conv.clone() * weights.clone()).sum().backward();
        for (form, by_matmul) in [
            ("broadcast", pointwise_as_matmul(x.clone(), w.clone())),
            ("flat", pointwise_as_flat_matmul(x.clone(), w.clone())),
        ] {
            assert_eq!(by_matmul.dims(), [3, 7, 4, 6], "{form}");
            close(by_conv.clone(), by_matmul.clone(), &format!("{form} output"));
            let g_matmul = (by_matmul * weights.clone()).sum().backward();
            close(x.grad(&g_conv).unwrap(), x.grad(&g_matmul).unwrap(), &format!("{form} input gradient"));
            close(w.grad(&g_conv).unwrap(), w.grad(&g_matmul).unwrap(), &format!("{form} weight gradient"));
        }
    }
}

#[test]
fn flex_trains_small_planes_with_the_flat_product_and_large_ones_broadcast() {
    if std::env::var_os("VRAMFIT_POINTWISE").is_some() {
        return; // a measuring switch forces one form everywhere
    }
    let flex = crate::device::CpuBackend::Flex.device();
    let ndarray = crate::device::CpuBackend::Ndarray.device();
    let largest = super::pointwise::FLAT_PRODUCT_MAX_PLANE;
    assert_eq!(pointwise_form(&flex.clone().autodiff(), largest), PointwiseForm::Flat);
    assert_eq!(pointwise_form(&flex.clone().autodiff(), largest + 1), PointwiseForm::Broadcast);
    // Inference on flex keeps the convolution; ndarray takes the broadcast product either way.
    assert_eq!(pointwise_form(&flex, 16), PointwiseForm::Conv);
    assert_eq!(pointwise_form(&ndarray.clone().autodiff(), 16), PointwiseForm::Broadcast);
    assert_eq!(pointwise_form(&ndarray, 16), PointwiseForm::Broadcast);
}

#[test]
fn a_block_fused_for_cpu_inference_matches_its_layers_run_one_by_one() {
    use burn::module::Param;
    use burn::tensor::Distribution;
    // Stride 1 and 2, channels changing and kept (the residual), on both CPU backends.
    let cfg = ModelConfig {
        width: 1.0,
        stem_channels: 16,
        stages: vec![
            StageConfig { channels: 24, stride: 1, blocks: 1 },
            StageConfig { channels: 32, stride: 2, blocks: 2 },
        ],
        ..ModelConfig::default()
    };
    let cpus = [crate::device::CpuBackend::Ndarray, crate::device::CpuBackend::Flex];
    for device in cpus.map(|b| b.device()) {
        let mut model = Classifier::new(&cfg, 3, &device);
        // Norm parameters away from (1, 0), so that each channel's own γ and β count.
        for block in &mut model.blocks {
            for norm in [&mut block.dw.norm, &mut block.pw.norm] {
                let c = norm.num_channels;
                norm.gamma = Some(Param::from_tensor(Tensor::random([c], Distribution::Normal(1.0, 0.5), &device)));
                norm.beta = Some(Param::from_tensor(Tensor::random([c], Distribution::Normal(0.0, 0.5), &device)));
            }
        }
        let residuals: Vec<bool> = model.blocks.iter().map(DsBlock::residual).collect();
        assert_eq!(residuals, [false, false, true]);
        // An odd plane (9 px: the stride-2 edge) and a batch with samples for every thread.
        let batch = 2 * rayon::current_num_threads() + 1;
        let mut x = Tensor::<4>::random([batch, 16, 9, 9], Distribution::Normal(0.0, 1.0), &device);
        for (i, block) in model.blocks.iter().enumerate() {
            assert!(block.fused_inference_settings(&x, Precision::F32).is_some(), "block {i} takes the fused pass");
            let fused = block.forward(x.clone(), Precision::F32);
            let layers = block.pw.forward(block.dw.forward(x.clone(), Precision::F32), Precision::F32);
            let layers = if block.residual { layers + x.clone() } else { layers };
            assert_eq!(fused.dims(), layers.dims(), "block {i}");
            let diff = (fused.clone() - layers).abs().max().into_scalar::<f32>();
            assert!(diff < 1e-4, "block {i} on {device:?}: largest difference {diff}");
            x = fused;
        }
        // A batch too small for every thread takes the layers (and so do autodiff devices).
        let one = Tensor::<4>::zeros([1, 16, 9, 9], &device);
        assert!(model.blocks[0].fused_inference_settings(&one, Precision::F32).is_none());
        let tracked = Tensor::<4>::zeros([batch, 16, 9, 9], &device.clone().autodiff());
        assert!(model.blocks[0].fused_inference_settings(&tracked, Precision::F32).is_none());
        // Tracked weights with an untracked input (the extensions have no autodiff form):
        // the layers run, and so the forward works.
        let tracked_model = Classifier::new(&cfg, 3, &device.clone().autodiff());
        let untracked = Tensor::<4>::zeros([batch, 16, 9, 9], &device);
        assert!(tracked_model.blocks[0].fused_inference_settings(&untracked, Precision::F32).is_none());
        let images = Tensor::<4>::zeros([batch, 3, 18, 18], &device);
        assert!(tracked_model.stem.fused_stem_norm(&images, Precision::F32).is_none());
        assert_eq!(tracked_model.forward(images, Precision::F32).dims(), [batch, 3]);
    }
}

#[test]
fn the_stem_fused_for_cpu_inference_matches_it_run_sample_by_sample_as_two_ops() {
    use burn::module::Param;
    use burn::tensor::Distribution;
    let cpus = [crate::device::CpuBackend::Ndarray, crate::device::CpuBackend::Flex];
    for device in cpus.map(|b| b.device()) {
        let cfg = ModelConfig { stem_channels: 16, ..ModelConfig::default() };
        let mut stem = Classifier::new(&cfg, 3, &device).stem;
        stem.norm.gamma = Some(Param::from_tensor(Tensor::random([16], Distribution::Normal(1.0, 0.5), &device)));
        stem.norm.beta = Some(Param::from_tensor(Tensor::random([16], Distribution::Normal(0.0, 0.5), &device)));
        // Odd and even sides (the stride-2 edge), and a batch with samples for every thread.
        let batch = 2 * rayon::current_num_threads() + 1;
        let x = Tensor::<4>::random([batch, 3, 9, 12], Distribution::Normal(0.0, 1.0), &device);
        assert!(stem.fused_stem_norm(&x, Precision::F32).is_some(), "the batch takes the fused pass");
        let fused = stem.forward(x.clone(), Precision::F32);
        assert_eq!(fused.dims(), [batch, 16, 5, 6]);
        for i in 0..batch {
            // One sample is too small a batch for the fused pass: conv2d, then GroupNorm + GELU.
            let one = x.clone().narrow(0, i, 1);
            assert!(stem.fused_stem_norm(&one, Precision::F32).is_none());
            let layers = stem.forward(one, Precision::F32);
            let diff = (fused.clone().narrow(0, i, 1) - layers).abs().max().into_scalar::<f32>();
            assert!(diff < 1e-4, "sample {i} on {device:?}: largest difference {diff}");
        }
    }
}

#[test]
fn default_network_has_about_3m_parameters_for_1000_classes() {
    let plan = layer_plan(&ModelConfig::default(), 1000, (224, 224));
    let n = param_count(&plan);
    assert!((2_700_000..=3_300_000).contains(&n), "{n} parameters");
    assert_eq!(plan.last().unwrap().in_hw, (7, 7));
}

#[test]
fn every_parameter_gets_a_gradient_the_head_bias_included() {
    let cfg = ModelConfig { width: 0.25, ..ModelConfig::default() };
    let device = Device::flex().autodiff();
    let model = Classifier::new(&cfg, 3, &device);
    let loss = model.forward(Tensor::<4>::ones([2, 3, 32, 32], &device), Precision::F32).sum();
    let grads = burn::optim::GradientsParams::from_grads(loss.backward(), &model);
    let bias = model.head.bias.as_ref().unwrap();
    assert!(grads.get::<1>(bias.id).is_some(), "head.bias is trained");
    assert!(grads.get::<2>(model.head.weight.id).is_some());
    assert!(grads.get::<4>(model.stem.conv.weight.id).is_some());
    // 3 tensors per conv layer (weight, gamma, beta) plus the head's weight and bias.
    assert_eq!(grads.len(), 3 * (1 + 2 * model.blocks.len()) + 2);
}

#[test]
fn plan_matches_the_built_module() {
    let cfg = ModelConfig { width: 0.25, ..ModelConfig::default() };
    let device = Device::flex();
    let model = Classifier::new(&cfg, 10, &device);
    assert_eq!(model.num_params(), param_count(&layer_plan(&cfg, 10, (32, 32))));
}
