//! GroupNorm followed by GELU in one pass over memory, forward and backward, on the CPU backends.
//!
//! burn-nn's GroupNorm is a composite of ten tensor ops (mean, subtract, square, mean, add,
//! sqrt, divide, reshape, scale, shift), each a full pass that allocates its output, and autodiff
//! records and replays each one; the GELU after it is one more pass. On the 28 px quickstart
//! network those elementwise passes, their allocations and their autodiff bookkeeping were most
//! of a `perf` profile of CPU training after the convolutions (README, "Against PyTorch"). This
//! module computes the same function per (sample, group) in three reads of the group (the mean,
//! the centred variance, then normalize + affine + GELU into the output), and its input, scale
//! and shift gradients in four (the statistics again, then `dp` with its sums, then `dx`):
//!
//! ```text
//! forward, per sample b and group g of n = (C / G) H W elements:
//!   mean = Σ x / n,  var = Σ (x - mean)² / n        biased, as burn-nn and PyTorch
//!   rstd = 1 / sqrt(var + eps)
//!   xhat = (x - mean) rstd,   p = γ_c xhat + β_c,   y = gelu(p)
//! backward, given dy:
//!   dp = dy gelu'(p)
//!   dβ_c = Σ_b Σ_hw dp,   dγ_c = Σ_b Σ_hw dp xhat
//!   dxhat = γ_c dp
//!   dx = rstd (dxhat - mean_g(dxhat) - xhat mean_g(dxhat xhat))      the standard
//!        normalization backward (Ioffe & Szegedy 2015, per group as in Wu & He 2018)
//! ```
//! The statistics are recomputed in the backward pass rather than kept (two floats per group,
//! but recomputing keeps the op memory-bound for gradient checkpointing, like the GELU: the
//! input is kept or recomputed, never the output). Sums run in 16 independent f32 lanes, so the
//! compiler vectorizes them. The GELU's value and derivative are [`crate::kernels::gelu`]'s (within
//! [`crate::kernels::gelu::MAX_ABS_ERROR`] of the exact form). `group_norm_gelu_matches_burn_nn` checks
//! values and all three gradients against burn-nn's GroupNorm + burn's exact GELU on both CPU
//! backends, with and without checkpointing.
//!
//! On a wgpu device the same formulas run as vramfit's WGSL kernels ([`wgsl`]; the browser build
//! keeps burn's ops for now). Other devices, other dtypes and GroupNorms without affine
//! parameters take burn-nn's GroupNorm and [`crate::kernels::gelu::gelu`]: [`group_norm_gelu`] decides.
//! `VRAMFIT_GROUP_NORM_GELU=burn` makes every device take burn's ops, for measuring.
// burn-ndarray is deprecated upstream, but it is the CPU fallback users asked for.
#![allow(deprecated)]

use std::marker::PhantomData;

use burn::backend::AutodiffBackend;
#[cfg(not(target_arch = "wasm32"))]
use burn::backend::NdArray;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::retro_forward::RetroForward;
use burn::backend::autodiff::checkpoint::state::BackwardStates;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::backend::tensor::FloatTensor;
use burn::backend::wgpu::CubeBackend;
use burn::backend::{Backend, Dispatch, Flex, TensorMetadata, backend_extension};
use burn::nn::GroupNorm;
use burn::tensor::{DType, Tensor};

use crate::kernels::cpu_tensor::flex;
#[cfg(not(target_arch = "wasm32"))]
use crate::kernels::cpu_tensor::nd;
use crate::kernels::gelu::runs_on_cpu_backend;

pub mod cpu;
use cpu::{Groups, backward, forward_in_place};
mod wgsl;

/// `gelu(group_norm(x))` with `norm`'s groups, epsilon and affine parameters.
///
/// # Shapes
/// `[B, C, H, W]` -> `[B, C, H, W]`, same dtype and device; `norm` has `C` channels.
///
/// f32 tensors with an affine `norm` on a CPU backend (flex, ndarray) or a native wgpu device
/// compiling WGSL, with or without autodiff, take the fused kernels here; anything else takes
/// burn-nn's `GroupNorm::forward` followed by [`crate::kernels::gelu::gelu`].
pub fn group_norm_gelu(x: Tensor<4>, norm: &GroupNorm) -> Tensor<4> {
    let params = cpu_affine_params(norm, x.dims()[1]);
    let fused = params.filter(|_| x.dtype() == DType::F32 && takes_fused_kernel(&x, norm));
    let Some((gamma, beta)) = fused else {
        return crate::kernels::gelu::gelu(norm.forward(x));
    };
    Tensor::from_dispatch(<Dispatch as FusedGroupNormGelu>::fused_group_norm_gelu(
        x.into_dispatch(),
        gamma.into_dispatch(),
        beta.into_dispatch(),
        norm.num_groups,
        norm.epsilon,
    ))
}

/// Whether `x` (f32, with `norm`'s affine parameters) runs the fused kernels: on a CPU backend,
/// or on a wgpu device compiling WGSL (native builds; the tensor's indices fit in u32), unless
/// `VRAMFIT_GROUP_NORM_GELU=burn` asks for burn's ops. Any other value of that variable is
/// ignored with a warning.
fn takes_fused_kernel(x: &Tensor<4>, norm: &GroupNorm) -> bool {
    if !fused_kernels_enabled() {
        return false;
    }
    let device = x.device();
    if runs_on_cpu_backend(&device) {
        return true;
    }
    runs_fused_on_gpu()
        && crate::kernels::device_augment::runs_wgsl(&device)
        && wgsl::fits(&Groups::of(&x.dims(), norm.num_groups, norm.epsilon))
}

/// Whether the fused kernels may run at all: `false` only with `VRAMFIT_GROUP_NORM_GELU=burn`
/// (burn's ops everywhere, for measuring). Any value other than `burn` or `fused` is ignored
/// with a warning.
pub(crate) fn fused_kernels_enabled() -> bool {
    let fused =
        crate::kernels::measuring_switch::measuring_switch("VRAMFIT_GROUP_NORM_GELU", "burn or fused", |v| match v {
            "burn" => Some(false),
            "fused" => Some(true),
            _ => None,
        });
    fused.unwrap_or(true)
}

/// Whether f32 GroupNorm + GELU on a wgpu device compiling WGSL runs the WGSL kernels in this
/// build: native builds, unless `VRAMFIT_GROUP_NORM_GELU=burn`. The browser build keeps burn's
/// ops. The memory plan ([`crate::memory::estimate`]) counts what each keeps for backward; it
/// assumes the GPU compiles WGSL, as every wgpu device of this build does (burn's `vulkan` and
/// `metal` compilers are not enabled; with one, [`crate::kernels::device_augment::runs_wgsl`] would be
/// false there and the plan would count too little).
pub fn runs_fused_on_gpu() -> bool {
    !cfg!(target_family = "wasm") && fused_kernels_enabled()
}

/// `norm`'s `(γ, β)` when the CPU kernels take them for `channels` channels: both present, f32,
/// `[channels]` each, and `channels` a multiple of the groups; `None` otherwise (burn-nn's
/// GroupNorm then runs).
pub(crate) fn cpu_affine_params(norm: &GroupNorm, channels: usize) -> Option<(Tensor<1>, Tensor<1>)> {
    let (Some(gamma), Some(beta)) = (&norm.gamma, &norm.beta) else {
        return None;
    };
    let (gamma, beta) = (gamma.val(), beta.val());
    let fits = gamma.dtype() == DType::F32
        && beta.dtype() == DType::F32
        && gamma.dims() == [channels]
        && beta.dims() == [channels]
        && channels.is_multiple_of(norm.num_groups);
    fits.then_some((gamma, beta))
}

/// The backend extension: the fused forward and its gradients on the CPU backends and on a wgpu
/// device ([`wgsl`]), f32 only ([`group_norm_gelu`] checks the dtype and the device).
#[backend_extension(Flex, NdArray: cfg(not(target_arch = "wasm32")), Cube, Fusion, Autodiff)]
pub trait FusedGroupNormGelu: Backend {
    /// `gelu(γ xhat + β)`. Shapes: `x` `[B, C, ...]`, `gamma` and `beta` `[C]` -> `x`'s.
    #[fusion(dtype = x, shape = x)]
    fn fused_group_norm_gelu(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        num_groups: usize,
        epsilon: f64,
    ) -> FloatTensor<Self>;
    /// `(dx, dγ, dβ)` for the output gradient `grad` (`x`'s shape); shapes as the inputs'.
    #[fusion(meta = |x, gamma, beta, _grad, _num_groups, _epsilon| (x.clone(), gamma.clone(), beta.clone()))]
    fn fused_group_norm_gelu_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        num_groups: usize,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

impl FusedGroupNormGelu for Flex {
    fn fused_group_norm_gelu(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        num_groups: usize,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        let mut x = x;
        let [gamma, beta] = [&gamma, &beta].map(flex::contiguous);
        let groups = Groups::of(flex::dims(&x), num_groups, epsilon);
        // At inference nothing else holds the convolution's output: normalize it where it lies
        // (no new buffer to allocate and fill). Training keeps its input for the backward pass.
        if let Some(values) = flex::unique_f32s_mut(&mut x) {
            forward_in_place(&groups, values, flex::f32s(&gamma), flex::f32s(&beta));
            return x;
        }
        let x = flex::contiguous(&x);
        let mut out = flex::f32s(&x).to_vec();
        forward_in_place(&groups, &mut out, flex::f32s(&gamma), flex::f32s(&beta));
        flex::tensor(out, &x)
    }

    fn fused_group_norm_gelu_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        num_groups: usize,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let [x, gamma, beta, grad] = [&x, &gamma, &beta, &grad].map(flex::contiguous);
        let groups = Groups::of(flex::dims(&x), num_groups, epsilon);
        let grads = backward(&groups, flex::f32s(&x), flex::f32s(&gamma), flex::f32s(&beta), flex::f32s(&grad));
        (flex::tensor(grads.x, &x), flex::tensor(grads.gamma, &gamma), flex::tensor(grads.beta, &beta))
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl FusedGroupNormGelu for NdArray {
    fn fused_group_norm_gelu(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        num_groups: usize,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        let (x, gamma, beta) = (nd::contiguous(&x), nd::contiguous(&gamma), nd::contiguous(&beta));
        let groups = Groups::of(&x.1, num_groups, epsilon);
        let mut out = x.0.into_owned();
        forward_in_place(&groups, &mut out, &gamma.0, &beta.0);
        nd::tensor(out, &x.1)
    }

    fn fused_group_norm_gelu_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        num_groups: usize,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (x, gamma, beta, grad) =
            (nd::contiguous(&x), nd::contiguous(&gamma), nd::contiguous(&beta), nd::contiguous(&grad));
        let groups = Groups::of(&x.1, num_groups, epsilon);
        let grads = backward(&groups, &x.0, &gamma.0, &beta.0, &grad.0);
        (nd::tensor(grads.x, &x.1), nd::tensor(grads.gamma, &gamma.1), nd::tensor(grads.beta, &beta.1))
    }
}

impl FusedGroupNormGelu for CubeBackend {
    fn fused_group_norm_gelu(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        num_groups: usize,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        let groups = Groups::of(&x.shape(), num_groups, epsilon);
        wgsl::forward(x, gamma, beta, &groups)
    }

    fn fused_group_norm_gelu_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        num_groups: usize,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let groups = Groups::of(&x.shape(), num_groups, epsilon);
        wgsl::backward(x, gamma, beta, grad, &groups)
    }
}

/// Recomputes the output from the input and the affine parameters when gradient checkpointing
/// dropped it.
#[derive(Debug)]
struct RetroGroupNormGelu<B> {
    inputs: [NodeId; 3],
    num_groups: usize,
    epsilon: f64,
    backend: PhantomData<B>,
}

impl<B: Backend + FusedGroupNormGelu> RetroForward for RetroGroupNormGelu<B> {
    fn forward(&self, states: &mut BackwardStates, out_node: NodeId) {
        let [x, gamma, beta] = self.inputs.map(|id| states.get_state::<B::FloatTensorPrimitive>(&id));
        states.save(out_node, B::fused_group_norm_gelu(x, gamma, beta, self.num_groups, self.epsilon));
    }
}

/// The backward step; the state is the three inputs' nodes.
#[derive(Debug)]
struct GroupNormGeluBackward {
    num_groups: usize,
    epsilon: f64,
}

impl<B: Backend + FusedGroupNormGelu> Backward<B, 3> for GroupNormGeluBackward {
    type State = [NodeId; 3];

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let [x, gamma, beta] = ops.state.map(|id| checkpointer.retrieve_node_output::<B::FloatTensorPrimitive>(id));
        let (dx, dgamma, dbeta) =
            B::fused_group_norm_gelu_backward(x, gamma, beta, grad, self.num_groups, self.epsilon);
        for (parent, grad) in ops.parents.into_iter().zip([dx, dgamma, dbeta]) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

impl<B: Backend + FusedGroupNormGelu, C: CheckpointStrategy> FusedGroupNormGelu for Autodiff<B, C> {
    /// Memory-bound, like burn-autodiff's elementwise ops: the inputs are checkpointed and the
    /// output is recomputed rather than kept when checkpointing asks for it.
    fn fused_group_norm_gelu(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        num_groups: usize,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        let retro = RetroGroupNormGelu::<B> {
            inputs: [x.id(), gamma.id(), beta.id()],
            num_groups,
            epsilon,
            backend: PhantomData,
        };
        match (GroupNormGeluBackward { num_groups, epsilon })
            .prepare::<C>([x.node(), gamma.node(), beta.node()])
            .memory_bound()
            .retro_forward(retro)
            .parents([&x, &gamma, &beta])
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let state = [prep.checkpoint(&x), prep.checkpoint(&gamma), prep.checkpoint(&beta)];
                let out = B::fused_group_norm_gelu(
                    x.primitive().clone(),
                    gamma.primitive().clone(),
                    beta.primitive().clone(),
                    num_groups,
                    epsilon,
                );
                prep.finish(state, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::fused_group_norm_gelu(
                x.into_primitive(),
                gamma.into_primitive(),
                beta.into_primitive(),
                num_groups,
                epsilon,
            )),
        }
    }

    /// The inner backend's gradients as untracked tensors: training never calls this (the
    /// backward step above calls the inner kernel), and no second-order gradient flows through it.
    fn fused_group_norm_gelu_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        num_groups: usize,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (dx, dgamma, dbeta) = B::fused_group_norm_gelu_backward(
            x.into_primitive(),
            gamma.into_primitive(),
            beta.into_primitive(),
            grad.into_primitive(),
            num_groups,
            epsilon,
        );
        (Self::from_inner(dx), Self::from_inner(dgamma), Self::from_inner(dbeta))
    }
}

#[cfg(test)]
mod tests;
