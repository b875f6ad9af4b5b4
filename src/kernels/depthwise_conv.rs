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
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::backend::tensor::FloatTensor;
use burn::backend::wgpu::CubeBackend;
use burn::backend::{Backend, Dispatch, ExtensionType, TensorMetadata, backend_extension};
use burn::nn::GroupNorm;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Tensor};

use crate::kernels::cpu_tensor::{ConvNormSettings, CpuTensors, LayerTensors};
use crate::kernels::gelu::runs_on_cpu_backend;
use crate::kernels::group_norm_gelu::cpu::Groups;
use crate::kernels::group_norm_gelu::{cpu_affine_params, group_norm_gelu};

pub mod cpu;
use cpu::{Geometry, backward, forward, forward_group_norm_gelu};
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
    crate::kernels::measuring_switch::unless_off("VRAMFIT_DEPTHWISE", "burn", "own")
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
    let layer =
        LayerTensors { weight: weight.into_dispatch(), gamma: gamma.into_dispatch(), beta: beta.into_dispatch() };
    let settings = ConvNormSettings { stride, num_groups: norm.num_groups, epsilon: norm.epsilon };
    Tensor::from_dispatch(<Dispatch as CpuDepthwiseGroupNormGelu>::cpu_depthwise3x3_group_norm_gelu(
        x.into_dispatch(),
        layer,
        settings,
    ))
}

/// The fused inference op's backend extension (no autodiff: training takes the two ops).
#[backend_extension(Flex, NdArray: cfg(not(target_arch = "wasm32")))]
pub trait CpuDepthwiseGroupNormGelu: Backend {
    /// Shapes: `x` `[B, C, H, W]`, `layer`'s weight `[C, 1, 3, 3]`, its `gamma` and `beta` `[C]`
    /// -> `[B, C, H', W']`.
    fn cpu_depthwise3x3_group_norm_gelu(
        x: FloatTensor<Self>,
        #[extension_type] layer: LayerTensors<Self>,
        settings: ConvNormSettings,
    ) -> FloatTensor<Self>;
}

/// The CPU kernel ([`cpu::forward_group_norm_gelu`]), written once for both CPU backends.
impl<B: CpuTensors> CpuDepthwiseGroupNormGelu for B {
    fn cpu_depthwise3x3_group_norm_gelu(
        x: FloatTensor<Self>,
        layer: LayerTensors<Self>,
        s: ConvNormSettings,
    ) -> FloatTensor<Self> {
        let [x, weight, gamma, beta] = [&x, &layer.weight, &layer.gamma, &layer.beta].map(B::contiguous);
        let geom = Geometry::of(B::dims(&x), s.stride);
        let groups = Groups::of(&geom.out_dims(), s.num_groups, s.epsilon);
        let norm = (&groups, (B::values(&gamma), B::values(&beta)));
        let out = forward_group_norm_gelu(&geom, B::values(&x), B::values(&weight), norm);
        B::tensor(out, &geom.out_dims())
    }
}

/// The depthwise convolution's tensors: the input `x` (`[B, C, H, W]`) and the `weight`
/// (`[C, 1, 3, 3]`), as [`Depthwise3x3::depthwise3x3_backward`] takes them and returns their
/// gradients `(dx, dweight)`, with the same shapes.
#[derive(ExtensionType)]
#[extension_type(fusion)]
pub struct ConvOperands<B: Backend> {
    /// The input (or its gradient), `[B, C, H, W]`.
    pub x: FloatTensor<B>,
    /// The filters (or their gradient), `[C, 1, 3, 3]`.
    pub weight: FloatTensor<B>,
}

/// The backend extension: the CPU kernels here on flex and ndarray, the WGSL kernels ([`wgsl`])
/// on a wgpu device (f32 only; [`depthwise_conv3x3`] checks dtype, stride, shapes and device).
#[backend_extension(Flex, NdArray: cfg(not(target_arch = "wasm32")), Cube, Fusion, Autodiff)]
pub trait Depthwise3x3: Backend {
    /// The convolution. Shapes: `x` `[B, C, H, W]`, `weight` `[C, 1, 3, 3]` -> `[B, C, H', W']`.
    #[fusion(dtype = x, shape = burn::tensor::Shape::new(Geometry::of(x, *stride).out_dims()))]
    fn depthwise3x3(x: FloatTensor<Self>, weight: FloatTensor<Self>, stride: usize) -> FloatTensor<Self>;
    /// `(dx, dweight)` for the output gradient `grad` (`[B, C, H', W']`), shaped as `t`'s.
    #[fusion(meta = |t, _grad, _stride| t.clone())]
    fn depthwise3x3_backward(
        #[extension_type] t: ConvOperands<Self>,
        grad: FloatTensor<Self>,
        stride: usize,
    ) -> ConvOperands<Self>;
}

/// The CPU kernels ([`cpu`]), written once for both CPU backends.
impl<B: CpuTensors> Depthwise3x3 for B {
    fn depthwise3x3(x: FloatTensor<Self>, weight: FloatTensor<Self>, stride: usize) -> FloatTensor<Self> {
        let [x, weight] = [&x, &weight].map(B::contiguous);
        let geom = Geometry::of(B::dims(&x), stride);
        B::tensor(forward(&geom, B::values(&x), B::values(&weight)), &geom.out_dims())
    }

    fn depthwise3x3_backward(t: ConvOperands<Self>, grad: FloatTensor<Self>, stride: usize) -> ConvOperands<Self> {
        let [x, weight, grad] = [&t.x, &t.weight, &grad].map(B::contiguous);
        let geom = Geometry::of(B::dims(&x), stride);
        let (dx, dw) = backward(&geom, B::values(&x), B::values(&weight), B::values(&grad));
        ConvOperands { x: B::tensor(dx, B::dims(&x)), weight: B::tensor(dw, B::dims(&weight)) }
    }
}

impl Depthwise3x3 for CubeBackend {
    fn depthwise3x3(x: FloatTensor<Self>, weight: FloatTensor<Self>, stride: usize) -> FloatTensor<Self> {
        let geom = Geometry::of(&x.shape(), stride);
        wgsl::forward(x, weight, &geom)
    }

    fn depthwise3x3_backward(t: ConvOperands<Self>, grad: FloatTensor<Self>, stride: usize) -> ConvOperands<Self> {
        let geom = Geometry::of(&t.x.shape(), stride);
        let (x, weight) = wgsl::backward(t.x, t.weight, grad, &geom);
        ConvOperands { x, weight }
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
        let d = B::depthwise3x3_backward(ConvOperands { x, weight }, grad, stride);
        for (parent, grad) in ops.parents.into_iter().zip([d.x, d.weight]) {
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
    fn depthwise3x3_backward(t: ConvOperands<Self>, grad: FloatTensor<Self>, stride: usize) -> ConvOperands<Self> {
        let inner = ConvOperands { x: t.x.into_primitive(), weight: t.weight.into_primitive() };
        let d = B::depthwise3x3_backward(inner, grad.into_primitive(), stride);
        ConvOperands { x: Self::from_inner(d.x), weight: Self::from_inner(d.weight) }
    }
}

#[cfg(test)]
mod tests;
