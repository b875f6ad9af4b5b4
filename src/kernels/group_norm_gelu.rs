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
use rayon::prelude::*;

use crate::kernels::cpu_tensor::flex;
#[cfg(not(target_arch = "wasm32"))]
use crate::kernels::cpu_tensor::nd;
use crate::kernels::gelu::{PORTABLE_FMA, cdf_and_density, madd};
use crate::kernels::gelu::{VectorUnit, runs_on_cpu_backend, vector_unit};

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

/// How a `[B, C, ...]` tensor splits into groups: `B * G` contiguous runs of `n` elements, each
/// `C / G` channels of `hw` elements.
#[derive(Clone, Copy, Debug)]
pub struct Groups {
    /// Samples, `B`.
    pub batch: usize,
    /// Channels, `C`.
    pub channels: usize,
    /// Groups per sample, `G` (divides `C`).
    pub groups: usize,
    /// Elements per channel (the product of the spatial dims).
    pub hw: usize,
    /// Added to the variance, as burn-nn's `epsilon`.
    pub epsilon: f32,
}

impl Groups {
    /// # Panics
    /// If `dims` has fewer than two entries or `num_groups` does not divide `dims[1]` (the
    /// caller, [`group_norm_gelu`], checks both).
    pub fn of(dims: &[usize], num_groups: usize, epsilon: f64) -> Self {
        assert!(
            dims.len() >= 2 && dims[1].is_multiple_of(num_groups),
            "GroupNorm: {num_groups} groups for dims {dims:?}"
        );
        Self {
            batch: dims[0],
            channels: dims[1],
            groups: num_groups,
            hw: dims[2..].iter().product(),
            epsilon: epsilon as f32,
        }
    }

    /// Elements in the tensor.
    pub fn len(&self) -> usize {
        self.batch * self.channels * self.hw
    }

    /// Whether the tensor is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Channels per group.
    pub(crate) fn channels_per_group(&self) -> usize {
        self.channels / self.groups
    }

    /// Elements per group, `n`.
    pub(crate) fn group_len(&self) -> usize {
        self.channels_per_group() * self.hw
    }

    /// Groups per parallel task: at least [`TASK_ELEMS`] elements each, so that rayon's
    /// scheduling (microseconds) stays small against the work.
    pub(crate) fn groups_per_task(&self) -> usize {
        TASK_ELEMS.div_ceil(self.group_len().max(1)).max(1)
    }
}

/// Elements per parallel task, at least.
const TASK_ELEMS: usize = 16 * 1024;

/// `xy = gelu(γ xhat + β)` in place, for contiguous `xy` (`groups.len()` elements), `gamma` and
/// `beta` (`C` each).
///
/// # Panics
/// If the slice lengths do not match `groups`.
pub fn forward_in_place(groups: &Groups, xy: &mut [f32], gamma: &[f32], beta: &[f32]) {
    assert!(xy.len() == groups.len() && gamma.len() == groups.channels && beta.len() == gamma.len());
    if groups.is_empty() {
        return;
    }
    let n = groups.group_len();
    let cpg = groups.channels_per_group();
    let unit = vector_unit();
    xy.par_chunks_mut(n).enumerate().with_min_len(groups.groups_per_task()).for_each(|(i, xy)| {
        let first = (i % groups.groups) * cpg;
        let params = (&gamma[first..first + cpg], &beta[first..first + cpg]);
        forward_group_in_place(unit, xy, params, groups.hw, groups.epsilon);
    });
}

/// The three gradients of [`forward_in_place`].
pub struct Gradients3 {
    /// Input gradient, `x`'s length.
    pub x: Vec<f32>,
    /// Scale gradient, `C`.
    pub gamma: Vec<f32>,
    /// Shift gradient, `C`.
    pub beta: Vec<f32>,
}

/// Gradients of `sum(gelu(γ xhat + β) * grad)` with respect to `x`, `gamma` and `beta`.
///
/// # Panics
/// If the slice lengths do not match `groups`.
pub fn backward(groups: &Groups, x: &[f32], gamma: &[f32], beta: &[f32], grad: &[f32]) -> Gradients3 {
    assert!(
        x.len() == groups.len() && grad.len() == x.len() && gamma.len() == groups.channels && beta.len() == gamma.len()
    );
    let n = groups.group_len();
    let cpg = groups.channels_per_group();
    let c = groups.channels;
    let mut dx = vec![0f32; x.len()];
    // Per sample and channel: Σ dp and Σ dp xhat, summed over the batch below.
    let (mut sum_dp, mut sum_dp_xhat) = (vec![0f32; groups.batch * c], vec![0f32; groups.batch * c]);
    if !groups.is_empty() {
        let unit = vector_unit();
        dx.par_chunks_mut(n)
            .zip(x.par_chunks(n))
            .zip(grad.par_chunks(n))
            .zip(sum_dp.par_chunks_mut(cpg).zip(sum_dp_xhat.par_chunks_mut(cpg)))
            .enumerate()
            .with_min_len(groups.groups_per_task())
            .for_each(|(i, (((dx, x), dy), (sum_dp, sum_dp_xhat)))| {
                let first = (i % groups.groups) * cpg;
                let params = (&gamma[first..first + cpg], &beta[first..first + cpg]);
                let sums = (sum_dp, sum_dp_xhat);
                dispatch_backward(unit, x, dy, params, groups.hw, groups.epsilon, dx, sums);
            });
    }
    let mut dgamma = vec![0f32; c];
    let mut dbeta = vec![0f32; c];
    for b in 0..groups.batch {
        for ch in 0..c {
            dgamma[ch] += sum_dp_xhat[b * c + ch];
            dbeta[ch] += sum_dp[b * c + ch];
        }
    }
    Gradients3 { x: dx, gamma: dgamma, beta: dbeta }
}

/// One group's forward in place (`cpg` channels of `hw` values, `params` their γ and β),
/// compiled for `unit`; the depthwise convolution's fused form calls it on each group it writes.
pub(crate) fn forward_group_in_place(unit: VectorUnit, xy: &mut [f32], params: (&[f32], &[f32]), hw: usize, eps: f32) {
    match unit {
        // SAFETY: vector_unit() answers Avx512 only when the CPU has AVX-512F.
        #[cfg(target_arch = "x86_64")]
        VectorUnit::Avx512 => unsafe { x86::forward_avx512(xy, params, hw, eps) },
        // SAFETY: vector_unit() answers Avx2Fma only when the CPU has AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        VectorUnit::Avx2Fma => unsafe { x86::forward_avx2(xy, params, hw, eps) },
        _ => forward_group::<PORTABLE_FMA>(xy, params, hw, eps),
    }
}

/// One group's backward, compiled for `unit`.
#[allow(clippy::too_many_arguments)] // the group's slices, as the kernel takes them
fn dispatch_backward(
    unit: VectorUnit,
    x: &[f32],
    dy: &[f32],
    params: (&[f32], &[f32]),
    hw: usize,
    eps: f32,
    dx: &mut [f32],
    sums: (&mut [f32], &mut [f32]),
) {
    match unit {
        // SAFETY: vector_unit() answers Avx512 only when the CPU has AVX-512F.
        #[cfg(target_arch = "x86_64")]
        VectorUnit::Avx512 => unsafe { x86::backward_avx512(x, dy, params, hw, eps, dx, sums) },
        // SAFETY: vector_unit() answers Avx2Fma only when the CPU has AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        VectorUnit::Avx2Fma => unsafe { x86::backward_avx2(x, dy, params, hw, eps, dx, sums) },
        _ => backward_group::<PORTABLE_FMA>(x, dy, params, hw, eps, dx, sums),
    }
}

/// The same group kernels compiled for wider vector units; chosen at run time above.
#[cfg(target_arch = "x86_64")]
mod x86 {
    #[target_feature(enable = "avx512f")]
    pub fn forward_avx512(xy: &mut [f32], params: (&[f32], &[f32]), hw: usize, eps: f32) {
        super::forward_group::<true>(xy, params, hw, eps);
    }
    #[target_feature(enable = "avx2,fma")]
    pub fn forward_avx2(xy: &mut [f32], params: (&[f32], &[f32]), hw: usize, eps: f32) {
        super::forward_group::<true>(xy, params, hw, eps);
    }
    #[target_feature(enable = "avx512f")]
    pub fn backward_avx512(
        x: &[f32],
        dy: &[f32],
        params: (&[f32], &[f32]),
        hw: usize,
        eps: f32,
        dx: &mut [f32],
        sums: (&mut [f32], &mut [f32]),
    ) {
        super::backward_group::<true>(x, dy, params, hw, eps, dx, sums);
    }
    #[target_feature(enable = "avx2,fma")]
    pub fn backward_avx2(
        x: &[f32],
        dy: &[f32],
        params: (&[f32], &[f32]),
        hw: usize,
        eps: f32,
        dx: &mut [f32],
        sums: (&mut [f32], &mut [f32]),
    ) {
        super::backward_group::<true>(x, dy, params, hw, eps, dx, sums);
    }
}

/// Independent accumulators per sum: the compiler keeps them in vector registers.
const LANES: usize = 16;

/// `(mean, 1 / sqrt(var + eps))` of one group, two passes (the centred sum of squares, not
/// `E[x²] - mean²`, which cancels badly for large means).
#[inline(always)]
fn mean_rstd(x: &[f32], eps: f32) -> (f32, f32) {
    let n = x.len() as f32;
    let mean = lane_sum(x, |v| v) / n;
    let var = lane_sum(x, |v| (v - mean) * (v - mean)) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// `Σ f(x_i)` in [`LANES`] independent partial sums.
#[inline(always)]
fn lane_sum(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().map(|&v| f(v)).sum();
    for chunk in chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a += f(v);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// One group in place: `x = gelu(γ_c (x - mean) rstd + β_c)`, channel by channel (`hw`
/// elements each).
#[inline(always)]
fn forward_group<const FMA: bool>(xy: &mut [f32], (gamma, beta): (&[f32], &[f32]), hw: usize, eps: f32) {
    let (mean, rstd) = mean_rstd(xy, eps);
    for (c, xy) in xy.chunks_exact_mut(hw).enumerate() {
        let (scale, shift) = (gamma[c] * rstd, beta[c]);
        for v in xy.iter_mut() {
            // Centred first: x = mean gives exactly β (a folded `x scale + (β - mean scale)`
            // cancels only to rounding, large when rstd is).
            let p = madd::<FMA>(*v - mean, scale, shift);
            *v = p * cdf_and_density::<FMA>(p).0;
        }
    }
}

/// One group's input gradient into `dx`, and per channel `Σ dp` and `Σ dp xhat` into `sums`.
#[inline(always)]
fn backward_group<const FMA: bool>(
    x: &[f32],
    dy: &[f32],
    (gamma, beta): (&[f32], &[f32]),
    hw: usize,
    eps: f32,
    dx: &mut [f32],
    (sum_dp, sum_dp_xhat): (&mut [f32], &mut [f32]),
) {
    let (mean, rstd) = mean_rstd(x, eps);
    let n = x.len() as f32;
    // Pass 1: dp = dy gelu'(p) into dx; per-channel sums.
    let (mut mean_dxhat, mut mean_dxhat_xhat) = (0f32, 0f32);
    for c in 0..gamma.len() {
        let range = c * hw..(c + 1) * hw;
        let (s, sx) =
            dp_channel::<FMA>(&x[range.clone()], &dy[range.clone()], (mean, rstd), (gamma[c], beta[c]), &mut dx[range]);
        sum_dp[c] = s;
        sum_dp_xhat[c] = sx;
        mean_dxhat += gamma[c] * s / n;
        mean_dxhat_xhat += gamma[c] * sx / n;
    }
    // Pass 2: dx = rstd (γ_c dp - mean(dxhat) - xhat mean(dxhat xhat)).
    for (c, (x, dx)) in x.chunks_exact(hw).zip(dx.chunks_exact_mut(hw)).enumerate() {
        let g = gamma[c];
        for (d, &v) in dx.iter_mut().zip(x) {
            let xhat = (v - mean) * rstd;
            *d = rstd * (g * *d - mean_dxhat - xhat * mean_dxhat_xhat);
        }
    }
}

/// One channel of pass 1: `dp = dy gelu'(γ xhat + β)` into `dp`; returns `(Σ dp, Σ dp xhat)`.
#[inline(always)]
fn dp_channel<const FMA: bool>(
    x: &[f32],
    dy: &[f32],
    (mean, rstd): (f32, f32),
    (g, b): (f32, f32),
    dp: &mut [f32],
) -> (f32, f32) {
    let one = |v: f32, d: f32| {
        let xhat = (v - mean) * rstd;
        let p = madd::<FMA>(g, xhat, b);
        let (cdf, density) = cdf_and_density::<FMA>(p);
        let dp = d * madd::<FMA>(p, density, cdf);
        (dp, xhat)
    };
    let (mut acc, mut acc_x) = ([0f32; LANES], [0f32; LANES]);
    let mut chunks = x.chunks_exact(LANES).zip(dy.chunks_exact(LANES)).zip(dp.chunks_exact_mut(LANES));
    for ((x, dy), out) in &mut chunks {
        for l in 0..LANES {
            let (d, xhat) = one(x[l], dy[l]);
            out[l] = d;
            acc[l] += d;
            acc_x[l] += d * xhat;
        }
    }
    let done = x.len() / LANES * LANES;
    let (mut s, mut sx) = (acc.iter().sum::<f32>(), acc_x.iter().sum::<f32>());
    for i in done..x.len() {
        let (d, xhat) = one(x[i], dy[i]);
        dp[i] = d;
        s += d;
        sx += d * xhat;
    }
    (s, sx)
}

#[cfg(test)]
mod tests;
