//! The stem (a dense 3x3 convolution, padding 1 -> GroupNorm -> GELU) as one pass per sample,
//! for inference on the CPU backends.
//!
//! burn flex runs the stem's convolution through its general path (the input copied to NHWC,
//! then an im2col tile copy before each matrix product, 8% of a quickstart inference profile
//! in scalar copies), then the norm as a second op. Here one task per sample lays the sample's
//! 3x3 windows out as columns straight from NCHW (`[C_in * 9, H'W']`, a few thousand values at
//! 28 px), multiplies them by the weight (`[C_out, C_in * 9] x [C_in * 9, H'W']`, one
//! single-threaded `gemm`) and normalizes the result in place while it is in cache. The same
//! conditions as [`crate::model::fused_block`] decide where it runs ([`crate::model`]).
// burn-ndarray is deprecated upstream, but it is the CPU fallback users asked for.
#![allow(deprecated)]

use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, backend_extension};
use burn::tensor::Tensor;
use rayon::prelude::*;

use crate::kernels::cpu_tensor::{ConvNormSettings, CpuTensors, LayerTensors};
use crate::kernels::gelu::vector_unit;
use crate::kernels::group_norm_gelu::cpu::Groups;
use crate::model::fused_block::product_group_norm_gelu;

/// Sizes of the stem's convolution: `[B, C_in, H, W]` -> `[B, C_out, H', W']`, kernel 3x3,
/// padding 1, `H' = (H - 1) / stride + 1` (as `W'`).
#[derive(Clone, Copy, Debug)]
pub struct StemShape {
    /// `[B, C_in, H, W]`.
    pub in_dims: [usize; 4],
    /// Output channels, `C_out`.
    pub out_channels: usize,
    /// Stride both ways (1 or more).
    pub stride: usize,
}

impl StemShape {
    /// `[B, C_out, H', W']`.
    pub fn out_dims(&self) -> [usize; 4] {
        let [b, _, h, w] = self.in_dims;
        let s = self.stride;
        [b, self.out_channels, (h - 1) / s + 1, (w - 1) / s + 1]
    }
}

/// `gelu(group_norm(conv3x3(x, weight)))` for contiguous `x` (`[B, C_in, H, W]`), `weight`
/// (`[C_out, C_in, 3, 3]`) and `norm`'s `(γ, β)` (`[C_out]` each), its groups over the output;
/// one rayon task per sample.
///
/// # Panics
/// If a slice's length does not match `shape`, or the shape has an empty dim (the caller,
/// [`stem_inference`], builds it from the tensors and checks them).
pub fn forward(shape: &StemShape, x: &[f32], weight: &[f32], norm: (&Groups, (&[f32], &[f32]))) -> Vec<f32> {
    let (_, (gamma, beta)) = norm;
    let [b, c_in, h, w] = shape.in_dims;
    let [_, c_out, oh, ow] = shape.out_dims();
    let (k, ohw) = (c_in * 9, oh * ow);
    assert!(h > 0 && w > 0 && shape.stride > 0, "empty stem input {:?}", shape.in_dims);
    assert!(x.len() == b * c_in * h * w && weight.len() == c_out * k && gamma.len() == c_out && beta.len() == c_out);
    let mut out = vec![0f32; b * c_out * ohw];
    if out.is_empty() {
        return out;
    }
    let unit = vector_unit();
    out.par_chunks_mut(c_out * ohw).zip(x.par_chunks(c_in * h * w)).for_each_init(
        || vec![0f32; k * ohw],
        |columns, (out, x)| {
            windows_as_columns(x, shape, columns);
            product_group_norm_gelu(unit, weight, columns, ohw, norm, out);
        },
    );
    out
}

/// Writes one sample's (`x`: `[C_in, H, W]`) 3x3 windows as `columns` (`[C_in * 9, H'W']`):
/// row `(c, kh, kw)` holds `x[c][y * s + kh - 1][x * s + kw - 1]` for every output position,
/// zero where that falls in the padding.
fn windows_as_columns(x: &[f32], shape: &StemShape, columns: &mut [f32]) {
    let [_, _, h, w] = shape.in_dims;
    let [_, _, oh, ow] = shape.out_dims();
    let s = shape.stride;
    for (r, row) in columns.chunks_exact_mut(oh * ow).enumerate() {
        let (c, kh, kw) = (r / 9, r % 9 / 3, r % 3);
        let plane = &x[c * h * w..(c + 1) * h * w];
        for (oy, out) in row.chunks_exact_mut(ow).enumerate() {
            let Some(iy) = (oy * s + kh).checked_sub(1).filter(|&iy| iy < h) else {
                out.fill(0.0);
                continue;
            };
            let line = &plane[iy * w..(iy + 1) * w];
            for (ox, v) in out.iter_mut().enumerate() {
                *v = (ox * s + kw).checked_sub(1).and_then(|ix| line.get(ix)).copied().unwrap_or(0.0);
            }
        }
    }
}

/// The stem in one pass per sample ([`forward`]) on a flex or ndarray device without
/// autodiff. The caller ([`crate::model`]) has checked the dtypes (f32), the weight's shape
/// (`[C_out, C_in, 3, 3]` for `x`'s `C_in`), the padding (1), the groups (dividing `C_out`) and
/// the device.
///
/// # Shapes
/// `x` `[B, C_in, H, W]`, `weight` `[C_out, C_in, 3, 3]`, `gamma` and `beta` `[C_out]` ->
/// `[B, C_out, (H - 1) / stride + 1, (W - 1) / stride + 1]`.
pub fn stem_inference(
    x: Tensor<4>,
    weight: Tensor<4>,
    (gamma, beta): (Tensor<1>, Tensor<1>),
    stride: usize,
    num_groups: usize,
    epsilon: f64,
) -> Tensor<4> {
    let layer =
        LayerTensors { weight: weight.into_dispatch(), gamma: gamma.into_dispatch(), beta: beta.into_dispatch() };
    let settings = ConvNormSettings { stride, num_groups, epsilon };
    Tensor::from_dispatch(<Dispatch as CpuFusedStem>::cpu_stem(x.into_dispatch(), layer, settings))
}

/// The backend extension (no autodiff: training takes the layers op by op).
#[backend_extension(Flex, NdArray: cfg(not(target_arch = "wasm32")))]
pub trait CpuFusedStem: Backend {
    /// As [`stem_inference`].
    fn cpu_stem(
        x: FloatTensor<Self>,
        #[extension_type] layer: LayerTensors<Self>,
        settings: ConvNormSettings,
    ) -> FloatTensor<Self>;
}

fn shape_of(x_dims: &[usize], out_channels: usize, s: ConvNormSettings) -> (StemShape, Groups) {
    let in_dims: [usize; 4] = x_dims.try_into().expect("the stem takes [B, C, H, W]");
    let shape = StemShape { in_dims, out_channels, stride: s.stride };
    let groups = Groups::of(&shape.out_dims(), s.num_groups, s.epsilon);
    (shape, groups)
}

/// The stem ([`forward`]), written once for both CPU backends.
impl<B: CpuTensors> CpuFusedStem for B {
    fn cpu_stem(x: FloatTensor<Self>, layer: LayerTensors<Self>, settings: ConvNormSettings) -> FloatTensor<Self> {
        let [x, weight, gamma, beta] = [&x, &layer.weight, &layer.gamma, &layer.beta].map(B::contiguous);
        let (shape, groups) = shape_of(B::dims(&x), B::dims(&weight)[0], settings);
        let norm = (&groups, (B::values(&gamma), B::values(&beta)));
        let out = forward(&shape, B::values(&x), B::values(&weight), norm);
        B::tensor(out, &shape.out_dims())
    }
}
