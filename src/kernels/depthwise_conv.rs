//! Depthwise 3x3 convolution (padding 1, stride 1 or 2) on the CPU backends and on a wgpu device,
//! forward and backward.
//!
//! The network's depthwise layers run on small planes (14x14, 7x7 and 4x4 on the 28 px
//! quickstart), and burn flex's depthwise path walks each plane row by row, kernel position by
//! kernel position: runs of 4 to 14 elements that no vector unit fills. A `perf` profile of
//! quickstart inference on flex put 27% of the time there (README, "Against PyTorch"); its input
//! gradient (a generic transposed convolution) was 8% of training. Here every plane becomes one
//! long flat loop per kernel position:
//!
//! ```text
//! pad the H x W plane by 1 and split it into s x s phase planes of Hp x Wp (s = stride):
//!   phase[a][b][i][j] = padded[s i + a][s j + b],     Wp = ceil((W + 2) / s)
//! then for each kernel position (kh, kw), with phase P = phase[kh % s][kw % s] read flat:
//!   acc[oh Wp + ow] += w[kh][kw] P[(oh + kh / s) Wp + ow + kw / s]     for all oh Wp + ow
//! y[oh][ow] = acc[oh Wp + ow] for ow < W_out; the other Wp - W_out columns are discarded.
//! ```
//! Row `oh` of the accumulator reads row `oh + kh / s` of the phase plane, so a flat index is a
//! correct 2-D index for every kept column (`ow + kw / s < Wp`). The gradients use the same
//! phases: `dw[kh][kw] = Σ dy_wide · P` shifted (dot products). The input gradient at stride 1
//! is the forward pass run on `dy` with the kernel turned by 180 degrees; at stride 2 it scatters
//! `w[kh][kw] dy_wide` into zeroed phase planes that are then unpadded (`dy_wide` is `dy` with
//! zeroed extra columns, so they add nothing). The loops are flat and branch-free (the dot
//! products in 16 independent lanes), compiled for AVX-512 or AVX2 + FMA where the CPU has them. `depthwise_matches_burn_conv2d` checks values and
//! both gradients against burn's `conv2d` with `groups = C` on both CPU backends, strides 1 and 2,
//! odd and even sizes, with and without checkpointing.
//!
//! On a wgpu device the same convolution and gradients run as vramfit's WGSL kernels ([`wgsl`]);
//! other devices, other dtypes and other convolutions take burn's `conv2d`:
//! [`depthwise_conv3x3`] decides.
// burn-ndarray is deprecated upstream, but it is the CPU fallback users asked for.
#![allow(deprecated)]

use burn::backend::AutodiffBackend;
#[cfg(not(target_arch = "wasm32"))]
use burn::backend::NdArray;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::backend::tensor::FloatTensor;
use burn::backend::wgpu::CubeBackend;
use burn::backend::{Backend, Dispatch, Flex, TensorMetadata, backend_extension};
use burn::nn::GroupNorm;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Tensor};
use rayon::prelude::*;

use crate::kernels::cpu_tensor::flex;
#[cfg(not(target_arch = "wasm32"))]
use crate::kernels::cpu_tensor::nd;
use crate::kernels::gelu::{PORTABLE_FMA, VectorUnit, madd, runs_on_cpu_backend, vector_unit};
use crate::kernels::group_norm_gelu::{Groups, cpu_affine_params, forward_group_in_place, group_norm_gelu};

mod wgsl;

/// Depthwise 3x3 convolution without bias, padding 1, stride `stride` in both directions.
///
/// # Shapes
/// `x` `[B, C, H, W]`, `weight` `[C, 1, 3, 3]` ->
/// `[B, C, (H - 1) / stride + 1, (W - 1) / stride + 1]`, same dtype and device.
///
/// f32 tensors with stride 1 or 2 on a CPU backend (flex, ndarray, or autodiff over either) take
/// the CPU kernels here, and on a wgpu device compiling WGSL (native builds) the WGSL kernels
/// ([`wgsl`]); anything else, and every device with `VRAMFIT_DEPTHWISE=burn`, takes burn's
/// `conv2d` with `groups = C`.
pub fn depthwise_conv3x3(x: Tensor<4>, weight: Tensor<4>, stride: usize) -> Tensor<4> {
    if !takes_own_kernel(&x, &weight, stride) {
        let options = ConvOptions::new([stride, stride], [1, 1], [1, 1], x.dims()[1]);
        return burn::tensor::module::conv2d(x, weight, None, options);
    }
    Tensor::from_dispatch(<Dispatch as Depthwise3x3>::depthwise3x3(x.into_dispatch(), weight.into_dispatch(), stride))
}

/// Whether `x` (`[B, C, H, W]`, not empty) and `weight` (`[C, 1, 3, 3]`) are f32 and `stride`
/// is 1 or 2: the shapes and types vramfit's kernels take, on any device.
fn has_kernel_shape(x: &Tensor<4>, weight: &Tensor<4>, stride: usize) -> bool {
    let [_, c, h, w] = x.dims();
    x.dtype() == DType::F32
        && h > 0
        && w > 0
        && weight.dtype() == DType::F32
        && (stride == 1 || stride == 2)
        && weight.dims() == [c, 1, 3, 3]
}

/// Whether [`depthwise_conv3x3`] takes the CPU kernels: [`has_kernel_shape`] on a CPU backend.
pub(crate) fn takes_cpu_kernel(x: &Tensor<4>, weight: &Tensor<4>, stride: usize) -> bool {
    has_kernel_shape(x, weight, stride) && runs_on_cpu_backend(&x.device())
}

/// Whether [`depthwise_conv3x3`] takes vramfit's kernels: the CPU kernels
/// ([`takes_cpu_kernel`]), or [`has_kernel_shape`] on a wgpu device compiling WGSL in a native
/// build where the sizes fit [`wgsl::fits`]; neither with `VRAMFIT_DEPTHWISE=burn`.
fn takes_own_kernel(x: &Tensor<4>, weight: &Tensor<4>, stride: usize) -> bool {
    if !own_kernels_enabled() {
        return false;
    }
    takes_cpu_kernel(x, weight, stride)
        || (runs_own_kernel_on_gpu()
            && has_kernel_shape(x, weight, stride)
            && crate::kernels::device_augment::runs_wgsl(&x.device())
            && wgsl::fits(&Geometry::of(&x.dims(), stride)))
}

/// Whether vramfit's kernels may run at all: `false` only with `VRAMFIT_DEPTHWISE=burn` (burn's
/// `conv2d` everywhere, for measuring). Any value other than `burn` or `own` is ignored with a
/// warning.
pub(crate) fn own_kernels_enabled() -> bool {
    let own = crate::kernels::measuring_switch::measuring_switch("VRAMFIT_DEPTHWISE", "burn or own", |v| match v {
        "burn" => Some(false),
        "own" => Some(true),
        _ => None,
    });
    own.unwrap_or(true)
}

/// Whether f32 depthwise convolutions on a wgpu device compiling WGSL run the WGSL kernels in
/// this build: native builds, unless `VRAMFIT_DEPTHWISE=burn`. The browser build keeps burn's
/// `conv2d` (as it keeps burn's GroupNorm: not yet checked on Chromium's WGSL compiler).
pub fn runs_own_kernel_on_gpu() -> bool {
    !cfg!(target_family = "wasm") && own_kernels_enabled()
}

/// `gelu(group_norm(depthwise_conv3x3(x, weight, stride)))`, `norm`'s groups, epsilon and
/// affine parameters, the depthwise layer with its norm and activation as the network runs it.
///
/// # Shapes
/// As [`depthwise_conv3x3`]; `norm` has `C` channels.
///
/// At inference (a device without autodiff) on a CPU backend, where [`depthwise_conv3x3`] and
/// [`crate::kernels::group_norm_gelu::group_norm_gelu`] both take vramfit's kernels, this is one fused
/// pass: each task convolves the planes of one (sample, group) and normalizes them while they
/// are in cache, so the convolution's output is written once and read once, with one dispatch
/// to rayon instead of two. Everywhere else (training, GPUs, other dtypes) it is the two ops.
pub fn depthwise_conv3x3_group_norm_gelu(
    x: Tensor<4>,
    weight: Tensor<4>,
    stride: usize,
    norm: &GroupNorm,
) -> Tensor<4> {
    let params = cpu_affine_params(norm, x.dims()[1]);
    // No operand on an autodiff device: the extension has no autodiff form (a tracked weight
    // with an untracked input would reach it otherwise).
    let fused = params.filter(|(gamma, beta)| {
        [x.device(), weight.device(), gamma.device(), beta.device()].iter().all(|d| !d.is_autodiff())
            && takes_cpu_kernel(&x, &weight, stride)
    });
    let Some((gamma, beta)) = fused else {
        return group_norm_gelu(depthwise_conv3x3(x, weight, stride), norm);
    };
    Tensor::from_dispatch(<Dispatch as CpuDepthwiseGroupNormGelu>::cpu_depthwise3x3_group_norm_gelu(
        x.into_dispatch(),
        weight.into_dispatch(),
        gamma.into_dispatch(),
        beta.into_dispatch(),
        stride,
        norm.num_groups,
        norm.epsilon,
    ))
}

/// The fused inference op's backend extension (no autodiff: training takes the two ops).
#[backend_extension(Flex, NdArray: cfg(not(target_arch = "wasm32")))]
pub trait CpuDepthwiseGroupNormGelu: Backend {
    /// Shapes: `x` `[B, C, H, W]`, `weight` `[C, 1, 3, 3]`, `gamma` and `beta` `[C]` ->
    /// `[B, C, H', W']`.
    #[allow(clippy::too_many_arguments)] // the two ops' arguments
    fn cpu_depthwise3x3_group_norm_gelu(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        stride: usize,
        num_groups: usize,
        epsilon: f64,
    ) -> FloatTensor<Self>;
}

impl CpuDepthwiseGroupNormGelu for Flex {
    fn cpu_depthwise3x3_group_norm_gelu(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        stride: usize,
        num_groups: usize,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        let [x, weight, gamma, beta] = [&x, &weight, &gamma, &beta].map(flex::contiguous);
        let geom = Geometry::of(flex::dims(&x), stride);
        let groups = Groups::of(&geom.out_dims(), num_groups, epsilon);
        let params = (flex::f32s(&gamma), flex::f32s(&beta));
        let out = forward_group_norm_gelu(&geom, &groups, flex::f32s(&x), flex::f32s(&weight), params);
        flex::tensor_of_shape(out, geom.out_dims().to_vec())
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl CpuDepthwiseGroupNormGelu for NdArray {
    fn cpu_depthwise3x3_group_norm_gelu(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        stride: usize,
        num_groups: usize,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        let [x, weight, gamma, beta] = [&x, &weight, &gamma, &beta].map(nd::contiguous);
        let geom = Geometry::of(&x.1, stride);
        let groups = Groups::of(&geom.out_dims(), num_groups, epsilon);
        let out = forward_group_norm_gelu(&geom, &groups, &x.0, &weight.0, (&gamma.0, &beta.0));
        nd::tensor(out, &geom.out_dims())
    }
}

/// The backend extension: the CPU kernels here on flex and ndarray, the WGSL kernels ([`wgsl`])
/// on a wgpu device (f32 only; [`depthwise_conv3x3`] checks dtype, stride, shapes and device).
#[backend_extension(Flex, NdArray: cfg(not(target_arch = "wasm32")), Cube, Fusion, Autodiff)]
pub trait Depthwise3x3: Backend {
    /// The convolution. Shapes: `x` `[B, C, H, W]`, `weight` `[C, 1, 3, 3]` -> `[B, C, H', W']`.
    #[fusion(dtype = x, shape = burn::tensor::Shape::new(Geometry::of(x, *stride).out_dims()))]
    fn depthwise3x3(x: FloatTensor<Self>, weight: FloatTensor<Self>, stride: usize) -> FloatTensor<Self>;
    /// `(dx, dweight)` for the output gradient `grad` (`[B, C, H', W']`).
    #[fusion(meta = |x, weight, _grad, _stride| (x.clone(), weight.clone()))]
    fn depthwise3x3_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        stride: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

impl Depthwise3x3 for Flex {
    fn depthwise3x3(x: FloatTensor<Self>, weight: FloatTensor<Self>, stride: usize) -> FloatTensor<Self> {
        let [x, weight] = [&x, &weight].map(flex::contiguous);
        let geom = Geometry::of(flex::dims(&x), stride);
        flex::tensor_of_shape(forward(&geom, flex::f32s(&x), flex::f32s(&weight)), geom.out_dims().to_vec())
    }

    fn depthwise3x3_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        stride: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [x, weight, grad] = [&x, &weight, &grad].map(flex::contiguous);
        let geom = Geometry::of(flex::dims(&x), stride);
        let (dx, dw) = backward(&geom, flex::f32s(&x), flex::f32s(&weight), flex::f32s(&grad));
        (flex::tensor(dx, &x), flex::tensor(dw, &weight))
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl Depthwise3x3 for NdArray {
    fn depthwise3x3(x: FloatTensor<Self>, weight: FloatTensor<Self>, stride: usize) -> FloatTensor<Self> {
        let (x, weight) = (nd::contiguous(&x), nd::contiguous(&weight));
        let geom = Geometry::of(&x.1, stride);
        nd::tensor(forward(&geom, &x.0, &weight.0), &geom.out_dims())
    }

    fn depthwise3x3_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        stride: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (x, weight, grad) = (nd::contiguous(&x), nd::contiguous(&weight), nd::contiguous(&grad));
        let geom = Geometry::of(&x.1, stride);
        let (dx, dw) = backward(&geom, &x.0, &weight.0, &grad.0);
        (nd::tensor(dx, &x.1), nd::tensor(dw, &weight.1))
    }
}

impl Depthwise3x3 for CubeBackend {
    fn depthwise3x3(x: FloatTensor<Self>, weight: FloatTensor<Self>, stride: usize) -> FloatTensor<Self> {
        let geom = Geometry::of(&x.shape(), stride);
        wgsl::forward(x, weight, &geom)
    }

    fn depthwise3x3_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        stride: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let geom = Geometry::of(&x.shape(), stride);
        wgsl::backward(x, weight, grad, &geom)
    }
}

/// The backward step; the state is the input's and the weight's nodes and the stride.
#[derive(Debug)]
struct DepthwiseBackward;

impl<B: Backend + Depthwise3x3> Backward<B, 2> for DepthwiseBackward {
    type State = (NodeId, NodeId, usize);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (x, weight, stride) = ops.state;
        let x = checkpointer.retrieve_node_output::<B::FloatTensorPrimitive>(x);
        let weight = checkpointer.retrieve_node_output::<B::FloatTensorPrimitive>(weight);
        let (dx, dw) = B::depthwise3x3_backward(x, weight, grad, stride);
        for (parent, grad) in ops.parents.into_iter().zip([dx, dw]) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

impl<B: Backend + Depthwise3x3, C: CheckpointStrategy> Depthwise3x3 for Autodiff<B, C> {
    /// Compute-bound, like burn-autodiff's `conv2d`: the output is kept, the inputs checkpointed.
    fn depthwise3x3(x: FloatTensor<Self>, weight: FloatTensor<Self>, stride: usize) -> FloatTensor<Self> {
        match DepthwiseBackward.prepare::<C>([x.node(), weight.node()]).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                let state = (prep.checkpoint(&x), prep.checkpoint(&weight), stride);
                prep.finish(state, B::depthwise3x3(x.primitive().clone(), weight.primitive().clone(), stride))
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::depthwise3x3(x.into_primitive(), weight.into_primitive(), stride))
            }
        }
    }

    /// The inner backend's gradients as untracked tensors: training never calls this (the
    /// backward step above calls the inner kernel), and no second-order gradient flows through it.
    fn depthwise3x3_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        stride: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dx, dw) =
            B::depthwise3x3_backward(x.into_primitive(), weight.into_primitive(), grad.into_primitive(), stride);
        (Self::from_inner(dx), Self::from_inner(dw))
    }
}

/// Sizes of one convolution and of its phase planes.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    /// Samples, `B`.
    pub batch: usize,
    /// Channels, `C`.
    pub channels: usize,
    /// Input height and width.
    pub in_hw: (usize, usize),
    /// Output height and width, `(H - 1) / s + 1` each (kernel 3, padding 1).
    pub out_hw: (usize, usize),
    /// Stride `s`, 1 or 2.
    pub stride: usize,
    /// Phase plane width, `ceil((W + 2) / s)`.
    wp: usize,
    /// Elements per phase plane: `ceil((H + 2) / s) + 1` rows of `wp` (one spare row for the
    /// flat reads past the last kept column) and [`LANES`] more (for the reads of the wide
    /// accumulator's padding, [`Geometry::wide_len`]).
    phase_len: usize,
}

impl Geometry {
    /// # Panics
    /// If `dims` is not 4-D (the caller passes `[B, C, H, W]` tensors).
    pub fn of(dims: &[usize], stride: usize) -> Self {
        let [batch, channels, h, w] = dims.try_into().expect("depthwise_conv3x3 takes [B, C, H, W]");
        let wp = (w + 2).div_ceil(stride);
        let phase_len = ((h + 2).div_ceil(stride) + 1) * wp + LANES;
        let out_hw = ((h - 1) / stride + 1, (w - 1) / stride + 1);
        Self { batch, channels, in_hw: (h, w), out_hw, stride, wp, phase_len }
    }

    /// `[B, C, H', W']`.
    pub fn out_dims(&self) -> [usize; 4] {
        [self.batch, self.channels, self.out_hw.0, self.out_hw.1]
    }

    /// Planes per parallel task: enough work that rayon's scheduling stays small against it.
    fn planes_per_task(&self) -> usize {
        (8 * 1024usize).div_ceil((self.in_hw.0 * self.in_hw.1).max(1)).max(1)
    }

    /// Accumulator length: `H'` rows of `wp`, rounded up to whole [`LANES`] so that every flat
    /// loop runs in whole vectors (a 7x7 plane's 63 outputs had run 7 of them one lane at a
    /// time). The padding's outputs are discarded, and in the backward pass `dy` is zero there.
    fn wide_len(&self) -> usize {
        (self.out_hw.0 * self.wp).next_multiple_of(LANES)
    }

    /// `(phase, flat offset into it)` for kernel position `(kh, kw)` at stride `S`: phase
    /// `(kh % S, kw % S)`. `S` is a constant so that these are shifts, not divisions (a 4x4
    /// plane's integer divisions had cost more than its convolution).
    fn tap<const S: usize>(&self, kh: usize, kw: usize) -> (usize, usize) {
        ((kh % S) * S + kw % S, (kh / S) * self.wp + kw / S)
    }
}

/// The convolution of contiguous `x` (`[B, C, H, W]`) with `weight` (`[C, 1, 3, 3]`).
pub fn forward(geom: &Geometry, x: &[f32], weight: &[f32]) -> Vec<f32> {
    let (h, w) = geom.in_hw;
    let (oh, ow) = geom.out_hw;
    let mut out = vec![0f32; geom.batch * geom.channels * oh * ow];
    if out.is_empty() {
        return out;
    }
    let unit = vector_unit();
    out.par_chunks_mut(oh * ow)
        .zip(x.par_chunks(h * w))
        .enumerate()
        .with_min_len(geom.planes_per_task())
        .for_each_init(Scratch::default, |scratch, (i, (out, x))| {
            let c = i % geom.channels;
            dispatch(unit, Plane::Forward { x, weight: &weight[c * 9..c * 9 + 9], out }, geom, scratch);
        });
    out
}

/// `gelu(group_norm(forward(x, weight)))` with `groups` (over the output's dims) and `(γ, β)`:
/// one task per run of (sample, group)s, each group's planes convolved and then normalized in
/// place ([`crate::kernels::group_norm_gelu::forward_group_in_place`]) while they are in cache.
pub fn forward_group_norm_gelu(
    geom: &Geometry,
    groups: &Groups,
    x: &[f32],
    weight: &[f32],
    (gamma, beta): (&[f32], &[f32]),
) -> Vec<f32> {
    let (h, w) = geom.in_hw;
    let (oh, ow) = geom.out_hw;
    let mut out = vec![0f32; geom.batch * geom.channels * oh * ow];
    if out.is_empty() {
        return out;
    }
    let cpg = groups.channels_per_group();
    let unit = vector_unit();
    out.par_chunks_mut(cpg * oh * ow)
        .zip(x.par_chunks(cpg * h * w))
        .enumerate()
        .with_min_len(groups.groups_per_task())
        .for_each_init(Scratch::default, |scratch, (g, (out, x))| {
            let first = (g % groups.groups) * cpg;
            forward_group_norm_gelu_channels(unit, geom, groups, first, x, weight, (gamma, beta), out, scratch);
        });
    out
}

/// [`forward_group_norm_gelu`] for whole groups of one sample, channels `first..` of it: `x`
/// holds their `H x W` input planes and `out` their `H' x W'` outputs (the same number of
/// planes, a multiple of the channels per group, `first` the first channel of a group);
/// `weight`, `gamma` and `beta` are the full tensors' (`[C, 1, 3, 3]`, `[C]`, `[C]`). Each group
/// is convolved and then normalized while in cache. [`crate::model::fused_block`] calls it per sample.
#[allow(clippy::too_many_arguments)] // the fused op's operands, and the task's unit and scratch
pub(crate) fn forward_group_norm_gelu_channels(
    unit: VectorUnit,
    geom: &Geometry,
    groups: &Groups,
    first: usize,
    x: &[f32],
    weight: &[f32],
    (gamma, beta): (&[f32], &[f32]),
    out: &mut [f32],
    scratch: &mut Scratch,
) {
    let (h, w) = geom.in_hw;
    let (oh, ow) = geom.out_hw;
    let cpg = groups.channels_per_group();
    for (g, (out, x)) in out.chunks_exact_mut(cpg * oh * ow).zip(x.chunks_exact(cpg * h * w)).enumerate() {
        let first = first + g * cpg;
        for (k, (out, x)) in out.chunks_exact_mut(oh * ow).zip(x.chunks_exact(h * w)).enumerate() {
            let c = first + k;
            dispatch(unit, Plane::Forward { x, weight: &weight[c * 9..c * 9 + 9], out }, geom, scratch);
        }
        let params = (&gamma[first..first + cpg], &beta[first..first + cpg]);
        forward_group_in_place(unit, out, params, oh * ow, groups.epsilon);
    }
}

/// `(dx, dweight)` of `sum(forward(x, weight) * grad)`.
pub fn backward(geom: &Geometry, x: &[f32], weight: &[f32], grad: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let (h, w) = geom.in_hw;
    let (oh, ow) = geom.out_hw;
    let mut dx = vec![0f32; x.len()];
    let mut dw_per_plane = vec![0f32; geom.batch * geom.channels * 9];
    if !dx.is_empty() && oh * ow > 0 {
        let unit = vector_unit();
        dx.par_chunks_mut(h * w)
            .zip(dw_per_plane.par_chunks_mut(9))
            .zip(x.par_chunks(h * w).zip(grad.par_chunks(oh * ow)))
            .enumerate()
            .with_min_len(geom.planes_per_task())
            .for_each_init(Scratch::default, |scratch, (i, ((dx, dw), (x, dy)))| {
                let c = i % geom.channels;
                let plane = Plane::Backward { x, dy, weight: &weight[c * 9..c * 9 + 9], dx, dw };
                dispatch(unit, plane, geom, scratch);
            });
    }
    let mut dw = vec![0f32; geom.channels * 9];
    for (i, partial) in dw_per_plane.chunks_exact(9).enumerate() {
        let c = i % geom.channels;
        for (d, p) in dw[c * 9..c * 9 + 9].iter_mut().zip(partial) {
            *d += p;
        }
    }
    (dx, dw)
}

/// Elements per step of the flat loops: two AVX2 vectors or one AVX-512 vector, kept in
/// registers as independent sums.
const LANES: usize = 16;

/// One (sample, channel) plane's work.
enum Plane<'a> {
    /// `out` (`H' x W'`) = the convolution of `x` (`H x W`) with `weight` (9).
    Forward { x: &'a [f32], weight: &'a [f32], out: &'a mut [f32] },
    /// `dx` (`H x W`) and this plane's share of `dw` (9) for `dy` (`H' x W'`).
    Backward { x: &'a [f32], dy: &'a [f32], weight: &'a [f32], dx: &'a mut [f32], dw: &'a mut [f32] },
}

/// Per-task buffers (one convolution's geometry): phase planes and the wide accumulator.
#[derive(Default)]
pub(crate) struct Scratch {
    phases: Vec<f32>,
    wide: Vec<f32>,
    /// `(H, W, stride)` of the planes `phases` was last split for, while it is zero wherever
    /// [`split_into_phases`] does not write (its padding): the next plane of the same geometry
    /// then needs only its own values written. `None` after anything else wrote the padding.
    zero_padding_for: Option<(usize, usize, usize)>,
}

/// One plane, compiled for `unit`.
fn dispatch(unit: VectorUnit, plane: Plane<'_>, geom: &Geometry, scratch: &mut Scratch) {
    match unit {
        // SAFETY: vector_unit() answers Avx512 only when the CPU has AVX-512F.
        #[cfg(target_arch = "x86_64")]
        VectorUnit::Avx512 => unsafe { x86::plane_avx512(plane, geom, scratch) },
        // SAFETY: vector_unit() answers Avx2Fma only when the CPU has AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        VectorUnit::Avx2Fma => unsafe { x86::plane_avx2(plane, geom, scratch) },
        _ => run_plane::<PORTABLE_FMA>(plane, geom, scratch),
    }
}

/// [`run_plane`] compiled for wider vector units; chosen at run time above.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Geometry, Plane, Scratch};
    #[target_feature(enable = "avx512f")]
    pub fn plane_avx512(plane: Plane<'_>, geom: &Geometry, scratch: &mut Scratch) {
        super::run_plane::<true>(plane, geom, scratch);
    }
    #[target_feature(enable = "avx2,fma")]
    pub fn plane_avx2(plane: Plane<'_>, geom: &Geometry, scratch: &mut Scratch) {
        super::run_plane::<true>(plane, geom, scratch);
    }
}

#[inline(always)]
fn run_plane<const FMA: bool>(plane: Plane<'_>, geom: &Geometry, scratch: &mut Scratch) {
    match (plane, geom.stride) {
        (Plane::Forward { x, weight, out }, 1) => forward_plane::<FMA, 1>(x, weight, out, geom, scratch),
        (Plane::Forward { x, weight, out }, _) => forward_plane::<FMA, 2>(x, weight, out, geom, scratch),
        (Plane::Backward { x, dy, weight, dx, dw }, 1) => {
            backward_plane::<FMA, 1>(x, dy, weight, dx, dw, geom, scratch)
        }
        (Plane::Backward { x, dy, weight, dx, dw }, _) => {
            backward_plane::<FMA, 2>(x, dy, weight, dx, dw, geom, scratch)
        }
    }
}

/// Fills `scratch.phases` (`s²` planes of `phase_len`, zero in their padding) from the `H x W`
/// plane `x`.
#[inline(always)]
fn split_into_phases<const S: usize>(x: &[f32], geom: &Geometry, scratch: &mut Scratch) {
    let (s, wp, len) = (S, geom.wp, geom.phase_len);
    let (h, w) = geom.in_hw;
    let phases = &mut scratch.phases;
    if scratch.zero_padding_for != Some((h, w, s)) {
        phases.clear();
        phases.resize(s * s * len, 0.0);
        scratch.zero_padding_for = Some((h, w, s));
    }
    for (ih, row) in x.chunks_exact(w).take(h).enumerate() {
        let ph = ih + 1;
        let base = (ph % s) * s * len + (ph / s) * wp;
        if s == 1 {
            phases[base + 1..base + 1 + w].copy_from_slice(row);
        } else {
            // Padded column pw = iw + 1 goes to phase b = pw % 2 at pw / 2: even iw = 2j to
            // phase 1 at j, odd iw = 2j + 1 to phase 0 at j + 1 (two branch-free loops; one
            // loop choosing the phase per element went scalar).
            let odd = &mut phases[base + len..][..w.div_ceil(2)];
            for (d, &v) in odd.iter_mut().zip(row.iter().step_by(2)) {
                *d = v;
            }
            let even = &mut phases[base + 1..][..w / 2];
            for (d, &v) in even.iter_mut().zip(row.iter().skip(1).step_by(2)) {
                *d = v;
            }
        }
    }
}

/// Reads the `H x W` plane back out of phase planes laid out as [`split_into_phases`] writes.
#[inline(always)]
fn merge_from_phases<const S: usize>(phases: &[f32], geom: &Geometry, x: &mut [f32]) {
    let (s, wp, len) = (S, geom.wp, geom.phase_len);
    let w = geom.in_hw.1;
    for (ih, row) in x.chunks_exact_mut(w).enumerate() {
        let ph = ih + 1;
        let base = (ph % s) * s * len + (ph / s) * wp;
        if s == 1 {
            row.copy_from_slice(&phases[base + 1..base + 1 + w]);
        } else {
            for (iw, v) in row.iter_mut().enumerate() {
                let pw = iw + 1;
                *v = phases[base + (pw % 2) * len + pw / 2];
            }
        }
    }
}

#[inline(always)]
fn forward_plane<const FMA: bool, const S: usize>(
    x: &[f32],
    weight: &[f32],
    out: &mut [f32],
    geom: &Geometry,
    scratch: &mut Scratch,
) {
    split_into_phases::<S>(x, geom, scratch);
    let n = geom.wide_len();
    scratch.wide.resize(n, 0.0); // every element is written below
    // The nine shifted views, each exactly n long, summed in one pass: one store per output.
    let tap = |k: usize| {
        let (phase, offset) = geom.tap::<S>(k / 3, k % 3);
        &scratch.phases[phase * geom.phase_len + offset..][..n]
    };
    let taps: [&[f32]; 9] = std::array::from_fn(tap);
    let w: [f32; 9] = std::array::from_fn(|k| weight[k]);
    for (i, o) in scratch.wide.chunks_exact_mut(LANES).enumerate() {
        let mut acc = [0f32; LANES];
        for k in 0..9 {
            let t: &[f32; LANES] = taps[k][i * LANES..][..LANES].try_into().expect("n is whole LANES");
            for l in 0..LANES {
                acc[l] = madd::<FMA>(w[k], t[l], acc[l]);
            }
        }
        o.copy_from_slice(&acc);
    }
    let ow = geom.out_hw.1;
    for (row, wide) in out.chunks_exact_mut(ow).zip(scratch.wide.chunks_exact(geom.wp)) {
        row.copy_from_slice(&wide[..ow]);
    }
}

#[inline(always)]
fn backward_plane<const FMA: bool, const S: usize>(
    x: &[f32],
    dy: &[f32],
    weight: &[f32],
    dx: &mut [f32],
    dw: &mut [f32],
    geom: &Geometry,
    scratch: &mut Scratch,
) {
    let (n, ow) = (geom.wide_len(), geom.out_hw.1);
    // dy with zeroed extra columns, Wp wide.
    scratch.wide.clear();
    scratch.wide.resize(n, 0.0);
    for (wide, row) in scratch.wide.chunks_exact_mut(geom.wp).zip(dy.chunks_exact(ow)) {
        wide[..ow].copy_from_slice(row);
    }
    // Weight gradient: dw[k] = Σ dy_wide · phase, shifted.
    split_into_phases::<S>(x, geom, scratch);
    for kh in 0..3 {
        for kw in 0..3 {
            let (phase, offset) = geom.tap::<S>(kh, kw);
            let src = &scratch.phases[phase * geom.phase_len + offset..][..n];
            dw[kh * 3 + kw] = dot::<FMA>(&scratch.wide, src);
        }
    }
    if S == 1 {
        // Input gradient at stride 1: the same convolution of `dy` with the kernel turned by
        // 180 degrees (`dx[i] = Σ_k w[k] dy_pad[i + 2 - k]`), one gathering pass like the
        // forward's; the phases' padding is still zero, so no plane is cleared.
        let turned: [f32; 9] = std::array::from_fn(|k| weight[8 - k]);
        forward_plane::<FMA, 1>(dy, &turned, dx, geom, scratch);
        return;
    }
    // Input gradient at stride 2: scatter w dy_wide into zeroed phases, then unpad.
    scratch.phases.iter_mut().for_each(|v| *v = 0.0);
    scratch.zero_padding_for = None; // the scatter below writes the padding too
    for kh in 0..3 {
        for kw in 0..3 {
            let (phase, offset) = geom.tap::<S>(kh, kw);
            let dst = &mut scratch.phases[phase * geom.phase_len + offset..][..n];
            let wv = weight[kh * 3 + kw];
            for (d, g) in dst.chunks_exact_mut(LANES).zip(scratch.wide.chunks_exact(LANES)) {
                for l in 0..LANES {
                    d[l] = madd::<FMA>(wv, g[l], d[l]);
                }
            }
        }
    }
    merge_from_phases::<S>(&scratch.phases, geom, dx);
}

/// `Σ a_i b_i` in [`LANES`] independent partial sums (so the compiler vectorizes it).
#[inline(always)]
fn dot<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] = madd::<FMA>(x[l], y[l], acc[l]);
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests;
