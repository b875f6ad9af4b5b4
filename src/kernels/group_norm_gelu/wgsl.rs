//! GroupNorm + GELU on a wgpu device: vramfit's WGSL kernels (`shaders/group_norm_gelu_*.wgsl`),
//! forward and backward, launched through the [`super::FusedGroupNormGelu`] backend extension on
//! burn's `CubeBackend`.
//!
//! burn runs GroupNorm + GELU on a GPU as a chain of reductions and fused elementwise kernels,
//! forward and backward: on lavapipe about 45% of a quickstart training step's kernel time and
//! most of its ~3,000 launches (README, "Where a lavapipe step goes"). Here the forward pass is
//! one launch (one workgroup per (sample, group): the statistics, then normalize + affine + GELU),
//! and the backward pass three (the same workgroups recompute the statistics, sum `dp` and
//! `dp xhat` per channel and write the input gradient; then two burn reductions sum the
//! per-sample scale and shift gradients over the batch). The formulas are the CPU kernel's (module docs of
//! [`super`]); `tests/engine/group_norm_gelu.rs` compares the two and burn-nn.

use burn::backend::TensorMetadata;
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::wgpu::{CubeBackend, CubeTensor, into_contiguous};
use burn::tensor::Shape;
use std::sync::LazyLock;

use super::cpu::Groups;
use crate::kernels::wgsl_kernel::{self, empty_f32, grid_fits, on_software_adapter};

/// Threads per workgroup (`WG` in the WGSL) on a GPU; one workgroup per (sample, group).
const GPU_WORKGROUP: u32 = 256;
/// Threads per workgroup on a CPU adapter (lavapipe): its SIMD width (8 f32 lanes of 256 bits),
/// so that a workgroup is one SIMD loop and the tree sums' barriers switch through no other
/// threads. On lavapipe (`vramfit bench train -c quickstart --backends gpu --steps 5 --warmup 2`,
/// 2 runs per size, 2026-12-03, AMD EPYC, 2 cores) training ran at 18.3-18.8 img/s with 256
/// threads, 22.3 with 128, 21.6-22.8 with 64, 22.0-24.0 with 32, 24.1-25.3 with 16 and
/// 25.0-26.3 with 8; inference at 79-81 img/s with 256 and 98-114 with 8.
const CPU_WORKGROUP: u32 = 8;
/// The workgroup sizes the kernels are built for: powers of two (the tree sums halve).
const WORKGROUP_SIZES: [u32; 6] = [8, 16, 32, 64, 128, 256];

const COMMON: &str = include_str!("../../../shaders/group_norm_gelu_common.wgsl");
const FORWARD: &str = include_str!("../../../shaders/group_norm_gelu_forward.wgsl");
const BACKWARD: &str = include_str!("../../../shaders/group_norm_gelu_backward.wgsl");

/// The kernels' sources per size of [`WORKGROUP_SIZES`], forward then backward: the `WG`
/// constant, the common part, then each kernel's bindings and entry point.
static SOURCES: LazyLock<Vec<[String; 2]>> = LazyLock::new(|| {
    let source = |wg: u32, own: &str| format!("const WG: u32 = {wg}u;\n{COMMON}\n{own}");
    WORKGROUP_SIZES.iter().map(|&wg| [source(wg, FORWARD), source(wg, BACKWARD)]).collect()
});

/// The most rounds of a thread's loop over its group (`n / WG`, rounded up). lavapipe
/// (llvmpipe) silently ends a shader's loops after 65,535 iterations, counted over all of them;
/// the backward kernel makes four passes over the group (mean, variance, channel sums, `dx`)
/// plus the tree sums, so 16,000 rounds per pass stay under it.
const MAX_ROUNDS: usize = 16_000;

/// Threads per workgroup for `groups` on `x`'s device: [`CPU_WORKGROUP`] on a software adapter
/// ([`on_software_adapter`]), [`GPU_WORKGROUP`] on a card, unless
/// `VRAMFIT_GROUP_NORM_GELU_WORKGROUP` names one of [`WORKGROUP_SIZES`] (for measuring; any
/// other value is ignored with a warning); then raised to the smallest size of
/// [`WORKGROUP_SIZES`] whose rounds stay within [`MAX_ROUNDS`] ([`fits`] refused groups no size
/// covers).
fn workgroup_for(x: &CubeTensor, groups: &Groups) -> u32 {
    let choices = format!("one of {WORKGROUP_SIZES:?}");
    let forced =
        crate::kernels::measuring_switch::measuring_switch("VRAMFIT_GROUP_NORM_GELU_WORKGROUP", &choices, |v| {
            v.parse().ok().filter(|wg| WORKGROUP_SIZES.contains(wg))
        });
    let wanted = match forced {
        Some(wg) => wg,
        None if on_software_adapter(x) => CPU_WORKGROUP,
        None => GPU_WORKGROUP,
    };
    let within_rounds = |wg: u32| groups.group_len().div_ceil(wg as usize) <= MAX_ROUNDS;
    WORKGROUP_SIZES.into_iter().find(|&wg| wg >= wanted && within_rounds(wg)).unwrap_or(GPU_WORKGROUP)
}

/// Whether the WGSL kernels take a tensor of `groups`' size: not empty, every index fits the
/// kernels' u32 arithmetic (a thread's last stride step included), a group takes at most
/// [`MAX_ROUNDS`] rounds of the largest workgroup (4.1 M values), and the (sample, group)
/// count fits the 2-D grid (the callers fall back to burn's ops otherwise).
pub(super) fn fits(groups: &Groups) -> bool {
    !groups.is_empty()
        && groups.len() < (u32::MAX - GPU_WORKGROUP) as usize
        && groups.group_len().div_ceil(GPU_WORKGROUP as usize) <= MAX_ROUNDS
        && grid_fits(groups.batch * groups.groups)
}

/// Launches the forward (`backward` false) or backward kernel over one workgroup per (sample,
/// group), with its bindings in the shaders' order: `inputs`, the params words
/// (`shaders/group_norm_gelu_common.wgsl`), `outputs` (all contiguous f32).
fn launch(backward: bool, groups: &Groups, inputs: &[&CubeTensor], outputs: &[&CubeTensor]) {
    let wg = workgroup_for(inputs[0], groups);
    let size = WORKGROUP_SIZES.iter().position(|&size| size == wg);
    let source = &SOURCES[size.expect("workgroup sizes come from WORKGROUP_SIZES")][usize::from(backward)];
    let (columns, grid) = wgsl_kernel::grid(groups.batch * groups.groups);
    let params = [
        groups.batch as u32,
        groups.channels as u32,
        groups.groups as u32,
        groups.hw as u32,
        groups.epsilon.to_bits(),
        columns,
    ];
    wgsl_kernel::launch(source, wg, grid, inputs, &params, outputs);
}

/// `gelu(γ xhat + β)` for a `[B, C, ...]` f32 tensor; `gamma`, `beta` `[C]`.
pub(super) fn forward(x: CubeTensor, gamma: CubeTensor, beta: CubeTensor, groups: &Groups) -> CubeTensor {
    let [x, gamma, beta] = [x, gamma, beta].map(into_contiguous);
    let y = empty_f32(&x, x.shape());
    launch(false, groups, &[&x, &gamma, &beta], &[&y]);
    y
}

/// `(dx, dγ, dβ)` for the output gradient `grad` (`x`'s shape).
pub(super) fn backward(
    x: CubeTensor,
    gamma: CubeTensor,
    beta: CubeTensor,
    grad: CubeTensor,
    groups: &Groups,
) -> (CubeTensor, CubeTensor, CubeTensor) {
    let [x, gamma, beta, grad] = [x, gamma, beta, grad].map(into_contiguous);
    let dx = empty_f32(&x, x.shape());
    let per_sample = Shape::new([groups.batch, groups.channels]);
    let (dgamma, dbeta) = (empty_f32(&x, per_sample.clone()), empty_f32(&x, per_sample));
    launch(true, groups, &[&x, &gamma, &beta, &grad], &[&dx, &dgamma, &dbeta]);
    let over_batch = |t: CubeTensor| -> FloatTensor<CubeBackend> {
        CubeBackend::float_reshape(CubeBackend::float_sum_dim(t, 0), Shape::new([groups.channels]))
    };
    (dx, over_batch(dgamma), over_batch(dbeta))
}
