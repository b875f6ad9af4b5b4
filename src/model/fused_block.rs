//! One depthwise-separable block (depthwise 3x3 -> GroupNorm -> GELU -> pointwise 1x1 ->
//! GroupNorm -> GELU, plus the residual) as one pass per sample, for inference on the CPU
//! backends.
//!
//! At 28 px each of the block's ops is a few tens of microseconds of work, and run op by op
//! each one pays its own dispatch to rayon (threads waking each other), writes an output that
//! the next op reads back from memory, and the pointwise convolution goes through burn flex's
//! general convolution (an input copy before its matrix product). Here one task per sample runs
//! the whole block while the sample's activations are in cache: the depthwise convolution with
//! its norm ([`crate::kernels::depthwise_conv::cpu::forward_group_norm_gelu_channels`]), the pointwise
//! convolution as one single-threaded matrix product on the NCHW planes as they lie
//! (`[C_out, C_in] x [C_in, H'W']`, the `gemm` crate burn flex uses), its norm
//! ([`crate::kernels::group_norm_gelu::cpu::forward_group_in_place`]) and the residual. Measured in the
//! README ("Against PyTorch").
//!
//! Training (autodiff devices), GPUs, f16, ReLU, and batches too small to give every thread a
//! few samples take the layers op by op ([`crate::model::DsBlock::forward`]).
// burn-ndarray is deprecated upstream, but it is the CPU fallback users asked for.
#![allow(deprecated)]

use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, backend_extension};
use burn::tensor::Tensor;
use rayon::prelude::*;

use crate::kernels::cpu_tensor::{CpuTensors, LayerTensors};
use crate::kernels::depthwise_conv::cpu::{Geometry, Scratch, forward_group_norm_gelu_channels};
use crate::kernels::gelu::vector_unit;
use crate::kernels::group_norm_gelu::cpu::{Groups, forward_group_in_place};

/// The block's parameters as plain f32 slices: `dw_weight` `[C_in, 1, 3, 3]`, `pw_weight`
/// `[C_out, C_in, 1, 1]`, each norm's `(γ, β)` (`[C_in]`, then `[C_out]`).
pub struct BlockParams<'a> {
    /// Depthwise filters, 9 per input channel.
    pub dw_weight: &'a [f32],
    /// The depthwise layer's GroupNorm scale and shift.
    pub dw_norm: (&'a [f32], &'a [f32]),
    /// Pointwise weights, row-major `[C_out, C_in]`.
    pub pw_weight: &'a [f32],
    /// The pointwise layer's GroupNorm scale and shift.
    pub pw_norm: (&'a [f32], &'a [f32]),
}

/// The block's shapes: the depthwise convolution's geometry, each norm's groups, and whether
/// the input is added to the output.
pub struct BlockShape {
    /// Depthwise 3x3 over `[B, C_in, H, W]` with the block's stride.
    pub dw: Geometry,
    /// GroupNorm groups over the depthwise output `[B, C_in, H', W']`.
    pub dw_groups: Groups,
    /// GroupNorm groups over the block's output `[B, C_out, H', W']`.
    pub pw_groups: Groups,
    /// Adds the input to the output (stride 1, `C_in == C_out`).
    pub residual: bool,
}

impl BlockShape {
    /// `[B, C_out, H', W']`.
    pub fn out_dims(&self) -> [usize; 4] {
        let [b, _, oh, ow] = self.dw.out_dims();
        [b, self.pw_groups.channels, oh, ow]
    }
}

/// The block on contiguous `x` (`[B, C_in, H, W]`) -> `[B, C_out, H', W']`, one rayon task
/// per sample.
///
/// # Panics
/// If a slice's length does not match `shape`, or the residual is asked for where the input
/// and output shapes differ (the caller, [`ds_block_inference`], builds both from the tensors).
pub fn forward(shape: &BlockShape, x: &[f32], params: &BlockParams<'_>) -> Vec<f32> {
    let [b, c_in, h, w] = [shape.dw.batch, shape.dw.channels, shape.dw.in_hw.0, shape.dw.in_hw.1];
    let [_, c_out, oh, ow] = shape.out_dims();
    let (in_len, mid_len, out_len) = (c_in * h * w, c_in * oh * ow, c_out * oh * ow);
    assert!(x.len() == b * in_len && params.dw_weight.len() == c_in * 9 && params.pw_weight.len() == c_out * c_in);
    assert!(!shape.residual || in_len == out_len, "residual over differing shapes");
    let mut out = vec![0f32; b * out_len];
    if out.is_empty() {
        return out;
    }
    let unit = vector_unit();
    out.par_chunks_mut(out_len).zip(x.par_chunks(in_len)).for_each_init(
        || (Scratch::default(), vec![0f32; mid_len]),
        |(scratch, mid), (out, x)| {
            let dw = &shape.dw_groups;
            forward_group_norm_gelu_channels(unit, &shape.dw, dw, 0, x, params.dw_weight, params.dw_norm, mid, scratch);
            let norm = (&shape.pw_groups, params.pw_norm);
            product_group_norm_gelu(unit, params.pw_weight, mid, oh * ow, norm, out);
            if shape.residual {
                for (o, x) in out.iter_mut().zip(x) {
                    *o += x;
                }
            }
        },
    );
    out
}

/// `out` = `gelu(group_norm(weight x input))` for one sample: `weight` row-major
/// `[C_out, K]`, `input` `[K, hw]`, `out` `[C_out, hw]`; one single-threaded `gemm`, then each
/// of `groups`' groups (over `C_out` channels of `hw`) normalized in place with its `(γ, β)`.
/// The pointwise layer of [`forward`] and the stem ([`crate::model::fused_stem::forward`]) both end so.
///
/// # Panics
/// If the lengths disagree with `C_out = groups.channels`, `hw` and `K = input.len() / hw`.
pub(crate) fn product_group_norm_gelu(
    unit: crate::kernels::gelu::VectorUnit,
    weight: &[f32],
    input: &[f32],
    hw: usize,
    (groups, (gamma, beta)): (&Groups, (&[f32], &[f32])),
    out: &mut [f32],
) {
    if out.is_empty() {
        return;
    }
    let c_out = groups.channels;
    let k = input.len() / hw;
    assert!(out.len() == c_out * hw && input.len() == k * hw && weight.len() == c_out * k, "product shapes");
    // SAFETY: the three buffers are row-major matrices of the dims given (asserted just above);
    // `read_dst: false` makes gemm write `out` without reading it.
    unsafe {
        gemm::gemm(
            c_out,
            hw,
            k,
            out.as_mut_ptr(),
            1,
            hw as isize,
            false,
            weight.as_ptr(),
            1,
            k as isize,
            input.as_ptr(),
            1,
            hw as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
    let cpg = groups.channels_per_group();
    for (g, out) in out.chunks_exact_mut(cpg * hw).enumerate() {
        let first = g * cpg;
        let norm = (&gamma[first..first + cpg], &beta[first..first + cpg]);
        forward_group_in_place(unit, out, norm, hw, groups.epsilon);
    }
}

/// The block's tensors for [`ds_block_inference`]: the input and each layer's weight and norm.
pub struct BlockTensors {
    /// `[B, C_in, H, W]`.
    pub x: Tensor<4>,
    /// `[C_in, 1, 3, 3]`.
    pub dw_weight: Tensor<4>,
    /// `(γ, β)`, `[C_in]` each.
    pub dw_norm: (Tensor<1>, Tensor<1>),
    /// `[C_out, C_in, 1, 1]`.
    pub pw_weight: Tensor<4>,
    /// `(γ, β)`, `[C_out]` each.
    pub pw_norm: (Tensor<1>, Tensor<1>),
}

/// The fused block's settings besides its tensors.
#[derive(Clone, Copy, Debug)]
pub struct BlockSettings {
    /// The depthwise convolution's stride, 1 or 2.
    pub stride: usize,
    /// GroupNorm groups of the depthwise layer (dividing `C_in`).
    pub dw_groups: usize,
    /// GroupNorm groups of the pointwise layer (dividing `C_out`).
    pub pw_groups: usize,
    /// Both norms' epsilon.
    pub epsilon: f64,
    /// Adds the input to the output.
    pub residual: bool,
}

/// The block in one pass per sample ([`forward`]) on a flex or ndarray device without
/// autodiff; the caller ([`crate::model::DsBlock::forward`]) has checked the dtypes (f32), the
/// shapes (the weights' against `x`'s channels, the groups dividing the channels, the residual
/// only where shapes agree), the stride (1 or 2), and the device.
///
/// # Shapes
/// As [`BlockTensors`] -> `[B, C_out, (H - 1) / stride + 1, (W - 1) / stride + 1]`.
pub fn ds_block_inference(t: BlockTensors, settings: BlockSettings) -> Tensor<4> {
    let layer = |weight: Tensor<4>, (gamma, beta): (Tensor<1>, Tensor<1>)| LayerTensors {
        weight: weight.into_dispatch(),
        gamma: gamma.into_dispatch(),
        beta: beta.into_dispatch(),
    };
    let (dw, pw) = (layer(t.dw_weight, t.dw_norm), layer(t.pw_weight, t.pw_norm));
    Tensor::from_dispatch(<Dispatch as CpuFusedBlock>::cpu_ds_block(t.x.into_dispatch(), dw, pw, settings))
}

/// Whether a batch of `batch` samples is worth the per-sample fused pass: at least two
/// samples per rayon thread, so that every thread has work (a single image, as in the GUI's
/// prediction, parallelizes better op by op, over channels).
pub fn batch_fits(batch: usize) -> bool {
    batch >= 2 * rayon::current_num_threads()
}

/// Whether the input `x` (`[B, C, H, W]`) suits the per-sample passes (this module's and
/// [`crate::model::fused_stem`]'s): f32 inference (no autodiff) on a CPU backend, at a batch that
/// [`batch_fits`]. Each layer's own conditions, [`fused_inference_enabled`] and [`none_tracked`]
/// come on top.
pub fn input_suits(x: &Tensor<4>, precision: crate::config::Precision) -> bool {
    let device = x.device();
    precision == crate::config::Precision::F32
        && batch_fits(x.dims()[0])
        && !device.is_autodiff()
        && crate::kernels::gelu::runs_on_cpu_backend(&device)
        && x.dtype() == burn::tensor::DType::F32
}

/// Whether the per-sample passes (this module's and [`crate::model::fused_stem`]'s) may run: not with
/// `VRAMFIT_FUSED_INFERENCE=layers` (the layers one by one, for measuring), nor while another
/// measuring switch forces one of the layers' paths (`VRAMFIT_DEPTHWISE=burn`,
/// `VRAMFIT_GROUP_NORM_GELU=burn`, any `VRAMFIT_POINTWISE`), whose code the passes would
/// otherwise bypass. Any value other than `layers` or `fused` is ignored with a warning.
pub fn fused_inference_enabled() -> bool {
    crate::kernels::measuring_switch::unless_off("VRAMFIT_FUSED_INFERENCE", "layers", "fused")
        && crate::kernels::depthwise_conv::own_kernels_enabled()
        && crate::kernels::group_norm_gelu::fused_kernels_enabled()
        && std::env::var_os("VRAMFIT_POINTWISE").is_none()
}

/// Whether none of `devices` is an autodiff device: the passes have no autodiff form, and a
/// tracked weight beside an untracked input would reach the extension's autodiff dispatch.
pub fn none_tracked(devices: &[burn::tensor::Device]) -> bool {
    devices.iter().all(|d| !d.is_autodiff())
}

/// The backend extension (no autodiff: training takes the layers op by op).
#[backend_extension(Flex, NdArray: cfg(not(target_arch = "wasm32")))]
pub trait CpuFusedBlock: Backend {
    /// As [`BlockTensors`]' fields (`dw` the depthwise layer's weight and norm, `pw` the
    /// pointwise layer's) -> `[B, C_out, H', W']`.
    fn cpu_ds_block(
        x: FloatTensor<Self>,
        #[extension_type] dw: LayerTensors<Self>,
        #[extension_type] pw: LayerTensors<Self>,
        settings: BlockSettings,
    ) -> FloatTensor<Self>;
}

fn shape_of(x_dims: &[usize], c_out: usize, s: BlockSettings) -> BlockShape {
    let dw = Geometry::of(x_dims, s.stride);
    let dw_groups = Groups::of(&dw.out_dims(), s.dw_groups, s.epsilon);
    let [b, _, oh, ow] = dw.out_dims();
    let pw_groups = Groups::of(&[b, c_out, oh, ow], s.pw_groups, s.epsilon);
    BlockShape { dw, dw_groups, pw_groups, residual: s.residual }
}

/// The block ([`forward`]), written once for both CPU backends.
impl<B: CpuTensors> CpuFusedBlock for B {
    fn cpu_ds_block(
        x: FloatTensor<Self>,
        dw: LayerTensors<Self>,
        pw: LayerTensors<Self>,
        settings: BlockSettings,
    ) -> FloatTensor<Self> {
        let [x, dw_weight, pw_weight] = [&x, &dw.weight, &pw.weight].map(B::contiguous);
        let [dw_gamma, dw_beta, pw_gamma, pw_beta] = [&dw.gamma, &dw.beta, &pw.gamma, &pw.beta].map(B::contiguous);
        let shape = shape_of(B::dims(&x), B::dims(&pw_weight)[0], settings);
        let params = BlockParams {
            dw_weight: B::values(&dw_weight),
            dw_norm: (B::values(&dw_gamma), B::values(&dw_beta)),
            pw_weight: B::values(&pw_weight),
            pw_norm: (B::values(&pw_gamma), B::values(&pw_beta)),
        };
        let out = forward(&shape, B::values(&x), &params);
        B::tensor(out, &shape.out_dims())
    }
}
