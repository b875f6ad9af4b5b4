use super::*;
use burn::nn::GroupNormConfig;
use burn::tensor::{Device, TensorData, Tolerance};

use crate::kernels::cpu_tensor::test_data::{cpu_training_devices, normal};

/// Values and the input, γ and β gradients of `sum(act(x) * w)` on `device`, `act` the fused
/// op or burn-nn's GroupNorm (3 groups) + burn's exact GELU.
/// With `strided`, `x` holds `[B, C, W, H]` and the op sees it transposed (non-contiguous).
fn run(device: &Device, [x, gamma, beta, w]: &[TensorData; 4], fused: bool, strided: bool) -> [TensorData; 4] {
    let mut norm = GroupNormConfig::new(3, gamma.num_elements()).init(device);
    let param = |t: &TensorData| Some(burn::module::Param::from_tensor(Tensor::<1>::from_data(t.clone(), device)));
    (norm.gamma, norm.beta) = (param(gamma), param(beta));
    let leaf = Tensor::<4>::from_data(x.clone(), device).require_grad();
    let xt = if strided { leaf.clone().swap_dims(2, 3) } else { leaf.clone() };
    let y = if fused {
        group_norm_gelu(xt.clone(), &norm)
    } else {
        burn::tensor::activation::gelu(norm.forward(xt.clone()))
    };
    // `w` is tracked, so the product keeps (or, checkpointing, recomputes) the op's output.
    let y = y * Tensor::<4>::from_data(w.clone(), device).require_grad();
    let grads = y.clone().sum().backward();
    let dx = leaf.grad(&grads).expect("input gradient").into_data();
    let params = burn::optim::GradientsParams::from_grads(grads, &norm);
    let grad_of = |p: &Option<burn::module::Param<Tensor<1>>>| {
        params.get::<1>(p.as_ref().expect("affine").id).expect("parameter gradient").into_data()
    };
    [y.into_data(), dx, grad_of(&norm.gamma), grad_of(&norm.beta)]
}

#[test]
fn group_norm_gelu_matches_burn_nn() {
    let flex = Device::flex();
    // 2 samples, 12 channels in 3 groups, 5 x 7 pixels: group runs of 140, not a multiple
    // of the 16 lanes, so the tails are exercised; a large mean checks the centred variance.
    for strided in [false, true] {
        let dims = if strided { [2, 12, 7, 5] } else { [2, 12, 5, 7] };
        let inputs = [
            normal(&dims, 3.0, 2.0, 1),
            normal(&[12], 1.0, 0.5, 2),
            normal(&[12], 0.0, 0.5, 3),
            normal(&[2, 12, 5, 7], 0.0, 1.0, 4),
        ];
        let want = run(&flex.clone().autodiff(), &inputs, false, strided);
        for (base, checkpointing, device) in cpu_training_devices() {
            let got = run(&device, &inputs, true, strided);
            for (what, (got, want)) in ["value", "dx", "dgamma", "dbeta"].iter().zip(got.iter().zip(&want)) {
                // Sums over 140 (dx) and 70 (dγ, dβ over the batch) f32 terms.
                eprintln!("{what} on {base:?}, checkpointing {checkpointing}, strided {strided}");
                got.assert_approx_eq::<f32>(want, Tolerance::absolute(2e-5).set_relative(1e-4));
            }
        }
    }
}

#[test]
fn at_inference_the_output_overwrites_an_input_nothing_else_holds_and_only_that() {
    // No autodiff: the op may write into its input's buffer when it is the only holder
    // (flex; ndarray copies). A shared input must come out unchanged, and both give
    // burn-nn's values.
    for device in [Device::flex(), Device::ndarray()] {
        let mut norm = GroupNormConfig::new(3, 12).init(&device);
        let param = |t: TensorData| Some(burn::module::Param::from_tensor(Tensor::<1>::from_data(t, &device)));
        (norm.gamma, norm.beta) = (param(normal(&[12], 1.0, 0.5, 7)), param(normal(&[12], 0.0, 0.5, 8)));
        let data = normal(&[2, 12, 5, 7], 3.0, 2.0, 9);
        let want = burn::tensor::activation::gelu(norm.forward(Tensor::<4>::from_data(data.clone(), &device)));
        let want = want.into_data();
        let tolerance = Tolerance::absolute(2e-5).set_relative(1e-4);
        let unique = group_norm_gelu(Tensor::<4>::from_data(data.clone(), &device), &norm);
        unique.into_data().assert_approx_eq::<f32>(&want, tolerance);
        let shared = Tensor::<4>::from_data(data.clone(), &device);
        let out = group_norm_gelu(shared.clone(), &norm);
        out.into_data().assert_approx_eq::<f32>(&want, tolerance);
        assert_eq!(shared.into_data(), data, "{device:?}: a shared input is left as it was");
    }
}

#[test]
fn falls_back_to_burn_nn_without_affine_parameters() {
    let device = Device::flex();
    let norm = GroupNormConfig::new(2, 4).with_affine(false).init(&device);
    let x = Tensor::<4>::from_data(normal(&[1, 4, 3, 3], 0.0, 1.0, 5), &device);
    let want = crate::kernels::gelu::gelu(norm.forward(x.clone())).into_data();
    group_norm_gelu(x, &norm).into_data().assert_approx_eq::<f32>(&want, Tolerance::absolute(1e-6));
}

#[test]
fn a_constant_group_gives_gelu_of_the_shift_and_an_input_gradient_summing_to_zero() {
    // var = 0: xhat = 0 exactly, so y = gelu(β) per channel. A normalization does not see a
    // shift of its whole group, so each group's input gradient sums to zero.
    let groups = Groups::of(&[1, 2, 4], 1, 1e-5);
    let x = [2.5f32; 8];
    let (gamma, beta) = ([1.5f32, 0.5], [0.25f32, -1.0]);
    let mut out = x;
    forward_in_place(&groups, &mut out, &gamma, &beta);
    let mut gelu_beta = [0f32; 2];
    crate::kernels::gelu::gelu_f32(&beta, &mut gelu_beta);
    assert_eq!(out, [[gelu_beta[0]; 4], [gelu_beta[1]; 4]].concat().as_slice());
    let dy = [0.5f32, -1.0, 2.0, 0.25, 1.0, 1.5, -0.5, 0.75];
    let grads = backward(&groups, &x, &gamma, &beta, &dy);
    let (sum, scale): (f32, f32) = (grads.x.iter().sum(), grads.x.iter().map(|d| d.abs()).sum());
    assert!(scale > 1.0 && sum.abs() < 1e-5 * scale, "dx {:?} sums to {sum}", grads.x);
    assert_eq!(grads.gamma, [0.0, 0.0], "xhat is zero");
}
