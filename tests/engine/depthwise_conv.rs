//! vramfit's depthwise 3x3 convolution kernels for wgpu (`shaders/depthwise_conv3x3_*.wgsl`,
//! `src/depthwise_conv/wgsl.rs`) against burn's `conv2d` with `groups = C` on flex and against
//! the CPU kernels: the output, the input gradient and the weight gradient.
//!
//! On lavapipe, a software adapter, the weight gradient's sums run 8 threads per workgroup; on a
//! card, 64. The comparison runs both: in this process, and in a child with
//! `VRAMFIT_DEPTHWISE_WORKGROUP=64`.

use super::*;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Device, Tensor, TensorData, Tolerance};
use rand::{Rng, SeedableRng};

/// `dims`-shaped values uniform in `[-1, 1)`, the same for the same `seed`.
fn values(dims: &[usize], seed: u64) -> TensorData {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let n = dims.iter().product::<usize>();
    TensorData::new((0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect::<Vec<f32>>(), dims.to_vec())
}

/// `[y, dx, dw]` of `sum(conv(x, w) * g)` on `device`, `conv` vramfit's op or (with
/// `burn_conv`) burn's `conv2d`; `g` a fixed output gradient. With `transposed`, `x` holds
/// `[B, C, W, H]` and the convolution sees it with H and W swapped (a non-contiguous input).
fn run(
    device: &Device,
    x: &TensorData,
    w: &TensorData,
    stride: usize,
    burn_conv: bool,
    transposed: bool,
) -> [TensorData; 3] {
    let leaf = Tensor::<4>::from_data(x.clone(), device).require_grad();
    let input = if transposed { leaf.clone().swap_dims(2, 3) } else { leaf.clone() };
    let weight = Tensor::<4>::from_data(w.clone(), device).require_grad();
    let y = if burn_conv {
        let options = ConvOptions::new([stride, stride], [1, 1], [1, 1], weight.dims()[0]);
        burn::tensor::module::conv2d(input, weight.clone(), None, options)
    } else {
        vramfit::kernels::depthwise_conv::depthwise_conv3x3(input, weight.clone(), stride)
    };
    let g = values(&y.dims(), 99);
    let y = y * Tensor::<4>::from_data(g, device);
    let grads = y.clone().sum().backward();
    [y.into_data(), leaf.grad(&grads).expect("dx").into_data(), weight.grad(&grads).expect("dw").into_data()]
}

#[test]
fn the_wgsl_kernels_match_burn_conv2d_and_the_cpu_kernels() {
    let Some(gpu) = gpu_or_skip() else { return };
    if std::env::var_os("VRAMFIT_TEST_CHILD").is_none() {
        let envs = [("VRAMFIT_DEPTHWISE_WORKGROUP", "64")];
        run_in_child("depthwise_conv::the_wgsl_kernels_match_burn_conv2d_and_the_cpu_kernels", &envs);
    }
    // (batch, channels, H, W): the quickstart network's planes (14, 7, 4) and odd ones, one
    // value per plane, a plane wider than tall, and more output positions per plane (17 x 17)
    // than the weight gradient's threads (64 or 8), so every thread sums several.
    let cases = [(2, 3, 7, 5), (3, 32, 14, 14), (2, 16, 4, 4), (4, 2, 1, 1), (1, 5, 3, 9), (2, 4, 33, 34)];
    for (i, (b, c, h, w)) in cases.into_iter().enumerate() {
        let weight = values(&[c, 1, 3, 3], 100 + i as u64);
        // dw sums B H W products, in another order than burn's: f32 rounding grows with it.
        let tolerance = Tolerance::absolute(2e-5).set_relative(1e-4);
        for transposed in [false, true] {
            let x = values(&if transposed { [b, c, w, h] } else { [b, c, h, w] }, i as u64);
            for stride in [1, 2] {
                let want = run(&Device::flex().autodiff(), &x, &weight, stride, true, transposed);
                let on_cpu = run(&Device::flex().autodiff(), &x, &weight, stride, false, transposed);
                for checkpointing in [false, true] {
                    let device = gpu.device.clone().autodiff();
                    let device = if checkpointing { device.gradient_checkpointing() } else { device };
                    let got = run(&device, &x, &weight, stride, false, transposed);
                    for (k, what) in ["y", "dx", "dw"].iter().enumerate() {
                        eprintln!(
                            "{what}: [{b}, {c}, {h}, {w}] (transposed {transposed}), stride {stride}, checkpointing {checkpointing}"
                        );
                        got[k].assert_approx_eq::<f32>(&want[k], tolerance);
                        got[k].assert_approx_eq::<f32>(&on_cpu[k], tolerance);
                    }
                }
            }
        }
    }
}

#[test]
fn grids_past_one_row_of_the_dispatch() {
    // [1, 1, 2050, 2050]: 4.2 M values, 65,666 workgroups of 64 for the output and the input
    // gradient (stride 1), past the 65,535 of one grid row, and 8,208 weight-gradient chunks of
    // one plane (lavapipe ends a shader's loops after 65,535 iterations: one workgroup summing
    // the whole plane gave a wrong weight gradient); [8200, 8, 2, 2]: 65,600 planes, one
    // weight-gradient workgroup each. The reference is the CPU kernel on flex, which sums in
    // another order: the 4.2 M-product weight gradient gets a looser relative bound.
    let Some(gpu) = gpu_or_skip() else { return };
    for (i, (dims, relative)) in [([1, 1, 2050, 2050], 1e-3), ([8200, 8, 2, 2], 1e-4)].into_iter().enumerate() {
        let x = values(&dims, 7 + i as u64);
        let weight = values(&[dims[1], 1, 3, 3], 8 + i as u64);
        let want = run(&Device::flex().autodiff(), &x, &weight, 1, false, false);
        let got = run(&gpu.device.clone().autodiff(), &x, &weight, 1, false, false);
        for (k, what) in ["y", "dx", "dw"].iter().enumerate() {
            eprintln!("{what}: {dims:?}");
            got[k].assert_approx_eq::<f32>(&want[k], Tolerance::absolute(2e-5).set_relative(relative));
        }
    }
}
