//! vramfit's GroupNorm + GELU kernels for wgpu (`shaders/group_norm_gelu_*.wgsl`,
//! `src/group_norm_gelu/wgsl.rs`) against burn-nn's GroupNorm + burn's exact GELU on flex and
//! against the CPU kernels: values and the input, scale and shift gradients.
//!
//! The reference runs on the CPU: burn's own GroupNorm + GELU gradients on lavapipe are off by
//! up to 1.2e-3 in `dx` and 4e-2 in `dγ` on these inputs (measured 2026-12-03), while the WGSL
//! kernels agree with burn on flex and with the CPU kernels within 1.3e-5.
//!
//! On lavapipe, a software adapter, the kernels run 8 threads per workgroup; on a card, 256.
//! The comparison runs both: in this process, and in a child with
//! `VRAMFIT_GROUP_NORM_GELU_WORKGROUP=256`.

use super::*;
use burn::module::Param;
use burn::nn::GroupNormConfig;
use burn::tensor::{Device, Tensor, TensorData, Tolerance};
use rand::{Rng, SeedableRng};

/// `dims`-shaped values of mean `mean`, spread `std` (uniform), the same for the same `seed`.
fn values(dims: &[usize], mean: f32, std: f32, seed: u64) -> TensorData {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let n = dims.iter().product::<usize>();
    TensorData::new((0..n).map(|_| mean + std * (rng.random::<f32>() * 2.0 - 1.0)).collect::<Vec<f32>>(), dims.to_vec())
}

/// `[y, dx, dγ, dβ]` of `sum(act(x) * w)` on `device`, `act` vramfit's op or (with `burn_ops`)
/// burn-nn's GroupNorm + burn's exact GELU.
fn run(device: &Device, dims: [usize; 4], groups: usize, burn_ops: bool, seed: u64) -> [TensorData; 4] {
    let channels = dims[1];
    let mut norm = GroupNormConfig::new(groups, channels).init(device);
    let param = |t: TensorData| Some(Param::from_tensor(Tensor::<1>::from_data(t, device)));
    (norm.gamma, norm.beta) =
        (param(values(&[channels], 1.0, 0.6, seed + 1)), param(values(&[channels], 0.0, 0.8, seed + 2)));
    // A large mean checks that the variance is centred.
    let leaf = Tensor::<4>::from_data(values(&dims, 3.0, 2.0, seed), device).require_grad();
    let y = if burn_ops {
        burn::tensor::activation::gelu(norm.forward(leaf.clone()))
    } else {
        vramfit::kernels::group_norm_gelu::group_norm_gelu(leaf.clone(), &norm)
    };
    let y = y * Tensor::<4>::from_data(values(&dims, 0.0, 1.0, seed + 3), device);
    let grads = y.clone().sum().backward();
    let dx = leaf.grad(&grads).expect("input gradient").into_data();
    let params = burn::optim::GradientsParams::from_grads(grads, &norm);
    let grad_of = |p: &Option<Param<Tensor<1>>>| params.get::<1>(p.as_ref().unwrap().id).unwrap().into_data();
    [y.into_data(), dx, grad_of(&norm.gamma), grad_of(&norm.beta)]
}

#[test]
fn the_wgsl_kernels_match_burn_and_the_cpu_kernels() {
    let Some(gpu) = gpu_or_skip() else { return };
    if std::env::var_os("VRAMFIT_TEST_CHILD").is_none() {
        let envs = [("VRAMFIT_GROUP_NORM_GELU_WORKGROUP", "256")];
        run_in_child("group_norm_gelu::the_wgsl_kernels_match_burn_and_the_cpu_kernels", &envs);
    }
    // (dims, groups): channels per group 4 (threads per channel in the backward pass's
    // per-channel sums: 64 of 256, 2 of 8), 32 (the quickstart network's last stage: 8 of 256,
    // one thread per channel in 4 rounds of 8), 512 (one thread per channel in 2 or 64 rounds);
    // 1600 values per channel (more than the threads); 7 x 5 (a tail in every thread's stride).
    // [1, 4, 300, 300] in one group: 360,000 values, 45,000 rounds of 8 threads per pass,
    // past what lavapipe runs of a shader's loops (65,535 iterations in all): 32 threads there.
    // Its dγ and dβ sum 90,000 terms to about 0.4, in another order than the CPU's (measured
    // 3.8e-4 apart): a looser bound there; a loop cut short is off by far more.
    let cases =
        [([2, 12, 7, 5], 3), ([8, 256, 4, 4], 8), ([3, 512, 2, 2], 1), ([2, 8, 40, 40], 2), ([1, 4, 300, 300], 1)];
    for (seed, (dims, groups)) in cases.into_iter().enumerate() {
        let large = dims[2] * dims[3] > 10_000;
        let tolerance = if large { Tolerance::absolute(2e-3) } else { Tolerance::absolute(5e-5) }.set_relative(2e-4);
        let seed = 10 * seed as u64;
        let want = run(&Device::flex().autodiff(), dims, groups, true, seed);
        let on_cpu = run(&Device::flex().autodiff(), dims, groups, false, seed);
        for checkpointing in [false, true] {
            let device = gpu.device.clone().autodiff();
            let device = if checkpointing { device.gradient_checkpointing() } else { device };
            let got = run(&device, dims, groups, false, seed);
            for (i, what) in ["y", "dx", "dgamma", "dbeta"].iter().enumerate() {
                eprintln!("{what}, {dims:?} in {groups} groups, checkpointing {checkpointing}");
                got[i].assert_approx_eq::<f32>(&want[i], tolerance);
                got[i].assert_approx_eq::<f32>(&on_cpu[i], tolerance);
            }
        }
    }
}

#[test]
fn more_groups_than_one_row_of_the_dispatch_grid() {
    // 8200 samples x 8 groups = 65,600 workgroups, past the 65,535 of one grid row; one value
    // per group (xhat = 0, so y = gelu(β)), inference (no autodiff).
    let Some(gpu) = gpu_or_skip() else { return };
    let device = gpu.device.clone();
    let mut norm = GroupNormConfig::new(8, 8).init(&device);
    norm.beta = Some(Param::from_tensor(Tensor::<1>::from_data(values(&[8], 0.0, 1.0, 5), &device)));
    let x = Tensor::<4>::from_data(values(&[8200, 8, 1, 1], 0.0, 1.0, 6), &device);
    let want = burn::tensor::activation::gelu(norm.forward(x.clone())).into_data();
    let got = vramfit::kernels::group_norm_gelu::group_norm_gelu(x, &norm).into_data();
    got.assert_approx_eq::<f32>(&want, Tolerance::absolute(1e-5));
}
