//! Depthwise 3x3 convolution on a wgpu device: vramfit's WGSL kernels
//! (`shaders/depthwise_conv3x3_*.wgsl`), forward and backward, launched through the
//! [`super::Depthwise3x3`] backend extension on burn's `CubeBackend`.
//!
//! burn runs a depthwise convolution on a GPU as its generic grouped convolution on NHWC copies
//! of the operands: the forward pass a `DepthwiseKernel` plus layout copies, the input gradient a
//! generic transposed convolution (`ConvTranspose2dDirectNhwc`, 15% of a quickstart training
//! step's kernel time on lavapipe at 110-125 ms a launch, README "Where a lavapipe step goes"),
//! the weight gradient another convolution. Here all three read and write the NCHW tensors as
//! they are, with the direct formulas (`shaders/depthwise_conv3x3_common.wgsl`):
//!
//! - forward: one thread per output value, its nine taps;
//! - input gradient: one thread per input value, gathering the (at most nine) outputs that read
//!   it, so no two threads write one value and nothing is zeroed first;
//! - weight gradient: one workgroup per chunk of a plane (sample, channel) sums the nine products
//!   over it (a tree in shared memory), then burn sums the `[B, chunks, C, 9]` partial sums over
//!   the batch and the chunks. A chunk bounds each thread's loop: lavapipe (llvmpipe) silently
//!   ends a shader's loops after 65,535 iterations in all, and a whole 2050 x 2050 plane per
//!   workgroup of 8 threads gave a wrong sum (`grids_past_one_row_of_the_dispatch`).
//!
//! `tests/engine/depthwise_conv.rs` compares all three with the CPU kernels ([`super::cpu::forward`],
//! [`super::cpu::backward`]) and with burn's `conv2d`.

use burn::backend::TensorMetadata;
use burn::backend::ops::FloatTensorOps;
use burn::backend::wgpu::{CubeBackend, CubeTensor, into_contiguous};
use burn::tensor::Shape;
use std::sync::LazyLock;

use super::cpu::Geometry;
use crate::kernels::wgsl_kernel::{self, empty_f32, grid_fits, on_software_adapter};

/// Threads per workgroup of the two one-value-per-thread kernels (no barriers).
const ELEMENTWISE_WORKGROUP: u32 = 64;
/// Threads per workgroup of the weight gradient's per-plane sums on a card.
const GPU_SUM_WORKGROUP: u32 = 64;
/// The same on a software adapter (lavapipe): its SIMD width, so that the tree's barriers switch
/// through no other threads (as the GroupNorm + GELU kernels, `src/group_norm_gelu/wgsl.rs`).
const CPU_SUM_WORKGROUP: u32 = 8;

const COMMON: &str = include_str!("../../../shaders/depthwise_conv3x3_common.wgsl");
const FORWARD: &str = include_str!("../../../shaders/depthwise_conv3x3_forward.wgsl");
const BACKWARD_INPUT: &str = include_str!("../../../shaders/depthwise_conv3x3_backward_input.wgsl");
const BACKWARD_WEIGHT: &str = include_str!("../../../shaders/depthwise_conv3x3_backward_weight.wgsl");

/// The four sources with their `WG` constant in front: forward, input gradient, weight gradient
/// with [`CPU_SUM_WORKGROUP`], weight gradient with [`GPU_SUM_WORKGROUP`].
static SOURCES: LazyLock<[String; 4]> = LazyLock::new(|| {
    let source = |wg: u32, own: &str| format!("const WG: u32 = {wg}u;\n{COMMON}\n{own}");
    [
        source(ELEMENTWISE_WORKGROUP, FORWARD),
        source(ELEMENTWISE_WORKGROUP, BACKWARD_INPUT),
        source(CPU_SUM_WORKGROUP, BACKWARD_WEIGHT),
        source(GPU_SUM_WORKGROUP, BACKWARD_WEIGHT),
    ]
});

/// The weight gradient's source and threads per workgroup on `x`'s device: [`CPU_SUM_WORKGROUP`]
/// on a software adapter ([`on_software_adapter`]), [`GPU_SUM_WORKGROUP`] on a card, unless
/// `VRAMFIT_DEPTHWISE_WORKGROUP` names one of the two (for measuring and for testing both on one
/// adapter; any other value is ignored with a warning).
fn sum_workgroup_for(x: &CubeTensor) -> (&'static str, u32) {
    let choices = format!("{CPU_SUM_WORKGROUP} or {GPU_SUM_WORKGROUP}");
    let forced = crate::kernels::measuring_switch::measuring_switch("VRAMFIT_DEPTHWISE_WORKGROUP", &choices, |v| {
        v.parse().ok().filter(|wg| [CPU_SUM_WORKGROUP, GPU_SUM_WORKGROUP].contains(wg))
    });
    match forced.unwrap_or(if on_software_adapter(x) { CPU_SUM_WORKGROUP } else { GPU_SUM_WORKGROUP }) {
        CPU_SUM_WORKGROUP => (&SOURCES[2], CPU_SUM_WORKGROUP),
        _ => (&SOURCES[3], GPU_SUM_WORKGROUP),
    }
}

/// Whether the kernels take a convolution of `geom`'s size: not empty, every value index of the
/// input and output (and of a grid's last workgroup) fits u32, and the grids fit two dimensions
/// (the caller falls back to burn's `conv2d` otherwise).
pub(super) fn fits(geom: &Geometry) -> bool {
    let planes = geom.batch * geom.channels;
    let values = planes * (geom.in_hw.0 * geom.in_hw.1).max(geom.out_hw.0 * geom.out_hw.1);
    values > 0
        && values < (u32::MAX - ELEMENTWISE_WORKGROUP) as usize
        && grid_fits(values.div_ceil(ELEMENTWISE_WORKGROUP as usize))
        && grid_fits(planes * chunks_per_plane(geom, CPU_SUM_WORKGROUP))
}

/// Output positions per workgroup of the weight gradient, per thread of it (`CHUNK / WG` in the
/// WGSL): bounds every thread's loop (lavapipe ends a shader's loops after 65,535 iterations).
const POSITIONS_PER_THREAD: usize = 64;

/// The params words (`shaders/depthwise_conv3x3_common.wgsl`) with `columns` workgroups per row
/// and `chunks` weight-gradient chunks per plane.
fn params(geom: &Geometry, columns: u32, chunks: usize) -> [u32; 9] {
    let (h, w) = geom.in_hw;
    let (h_out, w_out) = geom.out_hw;
    let words = [geom.batch, geom.channels, h, w, h_out, w_out, geom.stride, chunks];
    let [b, c, h, w, h_out, w_out, s, chunks] = words.map(|v| v as u32);
    [b, c, h, w, h_out, w_out, s, columns, chunks]
}

/// The weight gradient's chunks per plane with `wg` threads per workgroup.
fn chunks_per_plane(geom: &Geometry, wg: u32) -> usize {
    (geom.out_hw.0 * geom.out_hw.1).div_ceil(wg as usize * POSITIONS_PER_THREAD).max(1)
}

/// Launches one of the one-value-per-thread kernels (`source` 0 or 1 of [`SOURCES`]) over
/// `values` threads.
fn launch_per_value(source: usize, geom: &Geometry, values: usize, inputs: &[&CubeTensor], out: &CubeTensor) {
    let (columns, grid) = wgsl_kernel::grid(values.div_ceil(ELEMENTWISE_WORKGROUP as usize));
    let params = params(geom, columns, 1);
    wgsl_kernel::launch(&SOURCES[source], ELEMENTWISE_WORKGROUP, grid, inputs, &params, &[out]);
}

/// The convolution: `x` `[B, C, H, W]`, `weight` `[C, 1, 3, 3]` -> `[B, C, H_out, W_out]`.
pub(super) fn forward(x: CubeTensor, weight: CubeTensor, geom: &Geometry) -> CubeTensor {
    let [x, weight] = [x, weight].map(into_contiguous);
    let y = empty_f32(&x, Shape::new(geom.out_dims()));
    let values = y.shape().num_elements();
    launch_per_value(0, geom, values, &[&x, &weight], &y);
    y
}

/// `(dx, dweight)` for the output gradient `grad` (`[B, C, H_out, W_out]`).
pub(super) fn backward(
    x: CubeTensor,
    weight: CubeTensor,
    grad: CubeTensor,
    geom: &Geometry,
) -> (CubeTensor, CubeTensor) {
    let [x, weight, grad] = [x, weight, grad].map(into_contiguous);
    let dx = empty_f32(&x, x.shape());
    launch_per_value(1, geom, dx.shape().num_elements(), &[&weight, &grad], &dx);

    let (source, wg) = sum_workgroup_for(&x);
    let chunks = chunks_per_plane(geom, wg);
    let partial = empty_f32(&x, Shape::new([geom.batch * chunks, geom.channels * 9]));
    let (columns, grid) = wgsl_kernel::grid(geom.batch * geom.channels * chunks);
    let params = params(geom, columns, chunks);
    wgsl_kernel::launch(source, wg, grid, &[&x, &grad], &params, &[&partial]);
    let dweight = CubeBackend::float_sum_dim(partial, 0);
    (dx, CubeBackend::float_reshape(dweight, weight.shape()))
}
