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
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::retro_forward::RetroForward;
use burn::backend::autodiff::checkpoint::state::BackwardStates;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::backend::tensor::FloatTensor;
use burn::backend::wgpu::CubeBackend;
use burn::backend::{Backend, Dispatch, ExtensionType, TensorMetadata, backend_extension};
use burn::nn::GroupNorm;
use burn::tensor::{DType, Tensor};

use crate::kernels::cpu_tensor::CpuTensors;
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
    let t = NormOperands { x: x.into_dispatch(), gamma: gamma.into_dispatch(), beta: beta.into_dispatch() };
    let settings = NormSettings { num_groups: norm.num_groups, epsilon: norm.epsilon };
    Tensor::from_dispatch(<Dispatch as FusedGroupNormGelu>::fused_group_norm_gelu(t, settings))
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
    crate::kernels::measuring_switch::unless_off("VRAMFIT_GROUP_NORM_GELU", "burn", "fused")
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

/// GroupNorm + GELU's tensors: the input `x` (`[B, C, ...]`) and the affine parameters `gamma`
/// and `beta` (`[C]` each), as [`FusedGroupNormGelu`] takes them; its backward op returns their
/// gradients `(dx, dγ, dβ)` in the same form, with the same shapes.
#[derive(ExtensionType)]
#[extension_type(fusion)]
pub struct NormOperands<B: Backend> {
    /// The input (or its gradient), `[B, C, ...]`.
    pub x: FloatTensor<B>,
    /// The scale `γ` (or its gradient), `[C]`.
    pub gamma: FloatTensor<B>,
    /// The shift `β` (or its gradient), `[C]`.
    pub beta: FloatTensor<B>,
}

impl<B: Backend> NormOperands<B> {
    /// From `[x, gamma, beta]`.
    pub fn from_array([x, gamma, beta]: [FloatTensor<B>; 3]) -> Self {
        Self { x, gamma, beta }
    }

    /// `[x, gamma, beta]`.
    pub fn into_array(self) -> [FloatTensor<B>; 3] {
        [self.x, self.gamma, self.beta]
    }
}

/// A GroupNorm's settings besides its tensors.
#[derive(Clone, Copy, Debug)]
pub struct NormSettings {
    /// Groups per sample (dividing `C`).
    pub num_groups: usize,
    /// Added to the variance, as burn-nn's `epsilon`.
    pub epsilon: f64,
}

impl NormSettings {
    /// How a tensor of `dims` (`[B, C, ...]`) splits into this norm's groups.
    fn groups(self, dims: &[usize]) -> Groups {
        Groups::of(dims, self.num_groups, self.epsilon)
    }
}

/// The backend extension: the fused forward and its gradients on the CPU backends and on a wgpu
/// device ([`wgsl`]), f32 only ([`group_norm_gelu`] checks the dtype and the device).
#[backend_extension(Flex, NdArray: cfg(not(target_arch = "wasm32")), Cube, Fusion, Autodiff)]
pub trait FusedGroupNormGelu: Backend {
    /// `gelu(γ xhat + β)` of `t`'s tensors -> `x`'s shape.
    #[fusion(meta = |t, _norm| t.x.clone())]
    fn fused_group_norm_gelu(#[extension_type] t: NormOperands<Self>, norm: NormSettings) -> FloatTensor<Self>;
    /// `(dx, dγ, dβ)` for the output gradient `grad` (`x`'s shape), each shaped as its input.
    #[fusion(meta = |t, _grad, _norm| t.clone())]
    fn fused_group_norm_gelu_backward(
        #[extension_type] t: NormOperands<Self>,
        grad: FloatTensor<Self>,
        norm: NormSettings,
    ) -> NormOperands<Self>;
}

/// The CPU kernels ([`cpu`]), written once for both CPU backends.
impl<B: CpuTensors> FusedGroupNormGelu for B {
    fn fused_group_norm_gelu(t: NormOperands<Self>, norm: NormSettings) -> FloatTensor<Self> {
        let NormOperands { mut x, gamma, beta } = t;
        let [gamma, beta] = [&gamma, &beta].map(B::contiguous);
        let (gamma, beta) = (B::values(&gamma), B::values(&beta));
        let dims = x.shape();
        let groups = norm.groups(&dims);
        // At inference nothing else holds the convolution's output: normalize it where it lies
        // (no new buffer to allocate and fill; flex only). Training keeps its input for the
        // backward pass.
        if let Some(values) = B::unique_f32s_mut(&mut x) {
            forward_in_place(&groups, values, gamma, beta);
            return x;
        }
        let mut out = B::into_values(B::contiguous(&x));
        forward_in_place(&groups, &mut out, gamma, beta);
        B::tensor(out, &dims)
    }

    fn fused_group_norm_gelu_backward(
        t: NormOperands<Self>,
        grad: FloatTensor<Self>,
        norm: NormSettings,
    ) -> NormOperands<Self> {
        let [x, gamma, beta, grad] = [&t.x, &t.gamma, &t.beta, &grad].map(B::contiguous);
        let groups = norm.groups(B::dims(&x));
        let grads = backward(&groups, B::values(&x), B::values(&gamma), B::values(&beta), B::values(&grad));
        NormOperands {
            x: B::tensor(grads.x, B::dims(&x)),
            gamma: B::tensor(grads.gamma, B::dims(&gamma)),
            beta: B::tensor(grads.beta, B::dims(&beta)),
        }
    }
}

impl FusedGroupNormGelu for CubeBackend {
    fn fused_group_norm_gelu(t: NormOperands<Self>, norm: NormSettings) -> FloatTensor<Self> {
        let groups = norm.groups(&t.x.shape());
        wgsl::forward(t.x, t.gamma, t.beta, &groups)
    }

    fn fused_group_norm_gelu_backward(
        t: NormOperands<Self>,
        grad: FloatTensor<Self>,
        norm: NormSettings,
    ) -> NormOperands<Self> {
        let groups = norm.groups(&t.x.shape());
        let (x, gamma, beta) = wgsl::backward(t.x, t.gamma, t.beta, grad, &groups);
        NormOperands { x, gamma, beta }
    }
}

/// Recomputes the output from the input and the affine parameters when gradient checkpointing
/// dropped it.
#[derive(Debug)]
struct RetroGroupNormGelu<B> {
    inputs: [NodeId; 3],
    norm: NormSettings,
    backend: PhantomData<B>,
}

impl<B: Backend + FusedGroupNormGelu> RetroForward for RetroGroupNormGelu<B> {
    fn forward(&self, states: &mut BackwardStates, out_node: NodeId) {
        let inputs = self.inputs.map(|id| states.get_state::<B::FloatTensorPrimitive>(&id));
        states.save(out_node, B::fused_group_norm_gelu(NormOperands::from_array(inputs), self.norm));
    }
}

/// The backward step; the state is the three inputs' nodes.
#[derive(Debug)]
struct GroupNormGeluBackward {
    norm: NormSettings,
}

impl<B: Backend + FusedGroupNormGelu> Backward<B, 3> for GroupNormGeluBackward {
    type State = [NodeId; 3];

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let inputs = ops.state.map(|id| checkpointer.retrieve_node_output::<B::FloatTensorPrimitive>(id));
        let input_grads = B::fused_group_norm_gelu_backward(NormOperands::from_array(inputs), grad, self.norm);
        for (parent, grad) in ops.parents.into_iter().zip(input_grads.into_array()) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

impl<B: Backend + FusedGroupNormGelu, C: CheckpointStrategy> FusedGroupNormGelu for Autodiff<B, C> {
    /// Memory-bound, like burn-autodiff's elementwise ops: the inputs are checkpointed and the
    /// output is recomputed rather than kept when checkpointing asks for it.
    fn fused_group_norm_gelu(t: NormOperands<Self>, norm: NormSettings) -> FloatTensor<Self> {
        let inputs = t.into_array();
        let retro = RetroGroupNormGelu::<B> { inputs: inputs.each_ref().map(|t| t.id()), norm, backend: PhantomData };
        match (GroupNormGeluBackward { norm })
            .prepare::<C>(inputs.each_ref().map(|t| t.node()))
            .memory_bound()
            .retro_forward(retro)
            .parents(inputs.each_ref())
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let state = inputs.each_ref().map(|t| prep.checkpoint(t));
                let inner = inputs.each_ref().map(|t| t.primitive().clone());
                prep.finish(state, B::fused_group_norm_gelu(NormOperands::from_array(inner), norm))
            }
            OpsKind::UnTracked(prep) => {
                let inner = inputs.map(|t| t.into_primitive());
                prep.finish(B::fused_group_norm_gelu(NormOperands::from_array(inner), norm))
            }
        }
    }

    /// The inner backend's gradients as untracked tensors: training never calls this (the
    /// backward step above calls the inner kernel), and no second-order gradient flows through it.
    fn fused_group_norm_gelu_backward(
        t: NormOperands<Self>,
        grad: FloatTensor<Self>,
        norm: NormSettings,
    ) -> NormOperands<Self> {
        let inner = NormOperands::from_array(t.into_array().map(|t| t.into_primitive()));
        let grads = B::fused_group_norm_gelu_backward(inner, grad.into_primitive(), norm);
        NormOperands::from_array(grads.into_array().map(Self::from_inner))
    }
}

#[cfg(test)]
mod tests;
