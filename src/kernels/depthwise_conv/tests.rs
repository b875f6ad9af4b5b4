use super::*;
use burn::tensor::{Device, TensorData, Tolerance};

use crate::kernels::cpu_tensor::test_data::{cpu_training_devices, normal};

/// Values and both gradients of `sum(conv(x, w) * g)` on `device`.
/// With `strided`, `x` holds `[B, C, W, H]` and the convolution sees it transposed (a
/// non-contiguous input, as after a permute).
fn run(device: &Device, x: &TensorData, w: &TensorData, stride: usize, fast: bool, strided: bool) -> [TensorData; 3] {
    let leaf = Tensor::<4>::from_data(x.clone(), device).require_grad();
    let xt = if strided { leaf.clone().swap_dims(2, 3) } else { leaf.clone() };
    let wt = Tensor::<4>::from_data(w.clone(), device).require_grad();
    let y = if fast {
        depthwise_conv3x3(xt.clone(), wt.clone(), stride)
    } else {
        let c = wt.dims()[0];
        burn::tensor::module::conv2d(
            xt.clone(),
            wt.clone(),
            None,
            ConvOptions::new([stride, stride], [1, 1], [1, 1], c),
        )
    };
    // A fixed, non-uniform output gradient.
    let n = y.shape().num_elements();
    let g = TensorData::new((0..n).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.1).collect::<Vec<_>>(), y.dims());
    let y = y * Tensor::<4>::from_data(g, device);
    let grads = y.clone().sum().backward();
    [y.into_data(), leaf.grad(&grads).expect("dx").into_data(), wt.grad(&grads).expect("dw").into_data()]
}

#[test]
fn depthwise_matches_burn_conv2d() {
    let flex = Device::flex();
    let sizes = [(7, 5), (8, 9), (14, 14), (4, 4), (1, 3), (3, 1), (2, 2), (1, 1), (33, 34)];
    for (i, (h, w)) in sizes.into_iter().enumerate() {
        // dw sums B H W products, in another order than burn's: f32 rounding grows with it.
        let tol = if h * w > 256 { 1e-4 } else { 1e-5 };
        let weight = normal(&[3, 1, 3, 3], 0.0, 1.0, 100 + i as u64);
        for strided in [false, true] {
            let dims = if strided { [2, 3, w, h] } else { [2, 3, h, w] };
            let x = normal(&dims, 0.0, 1.0, i as u64);
            for stride in [1, 2] {
                let want = run(&flex.clone().autodiff(), &x, &weight, stride, false, strided);
                for (base, checkpointing, device) in cpu_training_devices() {
                    let got = run(&device, &x, &weight, stride, true, strided);
                    for (what, (got, want)) in ["y", "dx", "dw"].iter().zip(got.iter().zip(&want)) {
                        eprintln!(
                            "{what}: {h}x{w} (strided {strided}), stride {stride}, {base:?}, checkpointing {checkpointing}"
                        );
                        got.assert_approx_eq::<f32>(want, Tolerance::absolute(tol).set_relative(tol));
                    }
                }
            }
        }
    }
}

#[test]
fn the_fused_inference_op_matches_burn_conv2d_group_norm_and_gelu() {
    // burn's own ops (conv2d with groups = C, burn-nn's GroupNorm, the exact GELU) on the
    // same device are the reference for the fused pass, on both CPU backends; 12 channels
    // in 3 groups (4 planes per group), strides 1 and 2, the network's plane sizes and odd
    // ones, a non-contiguous input, and a batch large enough that rayon splits the groups.
    use burn::nn::GroupNormConfig;
    for base in [Device::flex(), Device::ndarray()] {
        for (i, (b, h, w)) in [(2, 7, 5), (3, 14, 14), (64, 4, 4), (1, 1, 1), (40, 9, 8)].into_iter().enumerate() {
            let seed = 10 * i as u64;
            let weight = Tensor::<4>::from_data(normal(&[12, 1, 3, 3], 0.0, 1.0, seed), &base);
            let mut norm = GroupNormConfig::new(3, 12).init(&base);
            let param = |t: TensorData| Some(burn::module::Param::from_tensor(Tensor::<1>::from_data(t, &base)));
            (norm.gamma, norm.beta) =
                (param(normal(&[12], 1.0, 0.5, seed + 1)), param(normal(&[12], 0.0, 0.5, seed + 2)));
            for strided in [false, true] {
                let dims = if strided { [b, 12, w, h] } else { [b, 12, h, w] };
                let x = Tensor::<4>::from_data(normal(&dims, 0.5, 2.0, seed + 3), &base);
                let x = if strided { x.swap_dims(2, 3) } else { x };
                for stride in [1, 2] {
                    let options = ConvOptions::new([stride, stride], [1, 1], [1, 1], 12);
                    let conv = burn::tensor::module::conv2d(x.clone(), weight.clone(), None, options);
                    let want = burn::tensor::activation::gelu(norm.forward(conv)).into_data();
                    let got = depthwise_conv3x3_group_norm_gelu(x.clone(), weight.clone(), stride, &norm);
                    eprintln!("{base:?} [{b}, 12, {h}, {w}] strided {strided}, stride {stride}");
                    got.into_data().assert_approx_eq::<f32>(&want, Tolerance::absolute(2e-5).set_relative(1e-4));
                }
            }
        }
    }
}

#[test]
fn other_convolutions_fall_back_to_burn() {
    // Stride 3 is not a kernel here: burn's conv2d answers, with its own output size.
    let device = Device::flex();
    let x = Tensor::<4>::from_data(normal(&[1, 2, 7, 7], 0.0, 1.0, 1), &device);
    let w = Tensor::<4>::from_data(normal(&[2, 1, 3, 3], 0.0, 1.0, 2), &device);
    let want = burn::tensor::module::conv2d(x.clone(), w.clone(), None, ConvOptions::new([3, 3], [1, 1], [1, 1], 2));
    let got = depthwise_conv3x3(x, w, 3);
    assert_eq!(got.dims(), [1, 2, 3, 3]);
    got.into_data().assert_approx_eq::<f32>(&want.into_data(), Tolerance::absolute(1e-6));
}
