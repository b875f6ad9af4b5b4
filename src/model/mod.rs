//! The classifier: a GroupNorm + depthwise-separable convolutional network.
//!
//! ```text
//! input [B, 3, H, W]
//!   stem: conv 3x3 stride 2 -> GroupNorm -> act            [B, C0, H/2, W/2]
//!   stage i, block j: depthwise 3x3 (stride s on j = 0) -> GN -> act
//!                     pointwise 1x1 -> GN -> act (+ input when shapes match)
//!   global average pool                                     [B, C_last]
//!   linear head (normal init, std head_init_std)            [B, classes]
//! ```
//! Early downsampling (the stride-2 stem, then strided stages) keeps the high-resolution stages
//! narrow; channel counts are `stage.channels x width`, rounded to a multiple of `norm_groups`.
//! In f16 the convolutions and the head run in f16 on f16 casts of the f32 weights (master
//! weights); GroupNorm statistics and the logits are f32 ([`group_norm_f16`]). In f32,
//! GroupNorm + GELU runs as one op of vramfit's own ([`crate::kernels::group_norm_gelu`]: vectorized
//! kernels on the CPU backends, WGSL kernels on a native wgpu device); on the CPU backends the
//! depthwise convolutions ([`crate::kernels::depthwise_conv`]) run vramfit's own vectorized kernels too, and pointwise convolutions
//! run as matrix products where that measured faster ([`pointwise`]).

pub mod fused_block;
pub mod fused_stem;
mod pointwise;

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{GroupNorm, GroupNormConfig, Initializer, Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Device, FloatDType, Tensor};

use crate::config::{Activation, ModelConfig, Precision};
use pointwise::{PointwiseForm, pointwise_as_flat_matmul, pointwise_as_matmul, pointwise_form};

/// Kind of a layer in [`layer_plan`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Dense 3x3 convolution (the stem).
    Stem,
    /// Depthwise 3x3 convolution (groups = channels).
    Depthwise,
    /// Pointwise 1x1 convolution.
    Pointwise,
    /// Global average pool + linear head.
    Head,
}

/// Shape facts of one layer, used by the network builder, `vramfit info` and the memory estimator.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerShape {
    /// Parameter path prefix, e.g. `blocks.3.pw`.
    pub name: String,
    /// Which kind.
    pub kind: LayerKind,
    /// Stage index (0 = stem, 1.. = stages, stages + 1 = head).
    pub stage: usize,
    /// Input channels.
    pub in_channels: usize,
    /// Output channels (classes for the head).
    pub out_channels: usize,
    /// Stride.
    pub stride: usize,
    /// Input height and width in pixels.
    pub in_hw: (usize, usize),
    /// Output height and width in pixels (1x1 for the head).
    pub out_hw: (usize, usize),
    /// GroupNorm groups after the convolution (0 for the head).
    pub norm_groups: usize,
    /// Whether the block output adds its input (pointwise layers of shape-keeping blocks).
    pub residual: bool,
}

impl LayerShape {
    /// Elements of the layer's largest parameter tensor: its convolution or linear weight.
    pub fn largest_weight_elems(&self) -> usize {
        match self.kind {
            LayerKind::Stem => self.in_channels * self.out_channels * 9,
            LayerKind::Depthwise => self.out_channels * 9,
            LayerKind::Pointwise | LayerKind::Head => self.in_channels * self.out_channels,
        }
    }

    /// Parameters of the layer including its GroupNorm (gamma, beta).
    pub fn params(&self) -> usize {
        match self.kind {
            LayerKind::Stem => self.in_channels * self.out_channels * 9 + 2 * self.out_channels,
            LayerKind::Depthwise => self.out_channels * 9 + 2 * self.out_channels,
            LayerKind::Pointwise => self.in_channels * self.out_channels + 2 * self.out_channels,
            LayerKind::Head => self.in_channels * self.out_channels + self.out_channels,
        }
    }

    /// Multiply-accumulates of the forward pass for one image.
    pub fn macs(&self) -> u64 {
        let (oh, ow) = self.out_hw;
        let spatial = (oh * ow) as u64;
        match self.kind {
            LayerKind::Stem => spatial * (self.out_channels * self.in_channels * 9) as u64,
            LayerKind::Depthwise => spatial * (self.out_channels * 9) as u64,
            LayerKind::Pointwise => spatial * (self.out_channels * self.in_channels) as u64,
            LayerKind::Head => (self.in_channels * self.out_channels) as u64,
        }
    }

    /// Elements of the layer's output for one image.
    pub fn out_elems(&self) -> usize {
        self.out_channels * self.out_hw.0 * self.out_hw.1
    }
}

/// Output size of a 3x3 convolution with padding 1: `ceil(size / stride)`.
pub fn conv3x3_out(size: usize, stride: usize) -> usize {
    (size + 2 - 3) / stride + 1
}

/// Channels at `width`, rounded to a multiple of `groups` (at least `groups`).
pub fn scaled_channels(channels: usize, width: f64, groups: usize) -> usize {
    let c = (channels as f64 * width).round() as usize;
    (c.div_ceil(groups) * groups).max(groups)
}

fn gn_groups(channels: usize, wanted: usize) -> usize {
    let mut g = wanted.min(channels).max(1);
    while !channels.is_multiple_of(g) {
        g -= 1;
    }
    g
}

/// Every layer of the network for `num_classes` classes and `image_hw` input pixels.
pub fn layer_plan(cfg: &ModelConfig, num_classes: usize, image_hw: (usize, usize)) -> Vec<LayerShape> {
    let g = cfg.norm_groups;
    let mut layers = Vec::new();
    let stem_c = scaled_channels(cfg.stem_channels, cfg.width, g);
    let mut hw = (conv3x3_out(image_hw.0, 2), conv3x3_out(image_hw.1, 2));
    layers.push(LayerShape {
        name: "stem".into(),
        kind: LayerKind::Stem,
        stage: 0,
        in_channels: 3,
        out_channels: stem_c,
        stride: 2,
        in_hw: image_hw,
        out_hw: hw,
        norm_groups: gn_groups(stem_c, g),
        residual: false,
    });
    let mut c = stem_c;
    let mut block = 0;
    for (s, stage) in cfg.stages.iter().enumerate() {
        let out_c = scaled_channels(stage.channels, cfg.width, g);
        for j in 0..stage.blocks {
            let stride = if j == 0 { stage.stride } else { 1 };
            let out_hw = (conv3x3_out(hw.0, stride), conv3x3_out(hw.1, stride));
            layers.push(LayerShape {
                name: format!("blocks.{block}.dw"),
                kind: LayerKind::Depthwise,
                stage: s + 1,
                in_channels: c,
                out_channels: c,
                stride,
                in_hw: hw,
                out_hw,
                norm_groups: gn_groups(c, g),
                residual: false,
            });
            layers.push(LayerShape {
                name: format!("blocks.{block}.pw"),
                kind: LayerKind::Pointwise,
                stage: s + 1,
                in_channels: c,
                out_channels: out_c,
                stride: 1,
                in_hw: out_hw,
                out_hw,
                norm_groups: gn_groups(out_c, g),
                residual: stride == 1 && c == out_c,
            });
            hw = out_hw;
            c = out_c;
            block += 1;
        }
    }
    layers.push(LayerShape {
        name: "head".into(),
        kind: LayerKind::Head,
        stage: cfg.stages.len() + 1,
        in_channels: c,
        out_channels: num_classes,
        stride: 1,
        in_hw: hw,
        out_hw: (1, 1),
        norm_groups: 0,
        residual: false,
    });
    layers
}

/// Convolution -> GroupNorm -> activation.
#[derive(Module, Debug)]
pub struct ConvNormAct {
    /// The convolution, no bias (the norm's beta is the bias).
    pub conv: Conv2d,
    /// GroupNorm over the output channels.
    pub norm: GroupNorm,
    #[module(skip)]
    activation: Activation,
}

impl ConvNormAct {
    fn new(layer: &LayerShape, activation: Activation, device: &Device) -> Self {
        let (kernel, groups, padding) = match layer.kind {
            LayerKind::Pointwise => (1, 1, 0),
            LayerKind::Depthwise => (3, layer.in_channels, 1),
            _ => (3, 1, 1),
        };
        let conv = Conv2dConfig::new([layer.in_channels, layer.out_channels], [kernel, kernel])
            .with_stride([layer.stride, layer.stride])
            .with_groups(groups)
            .with_padding(PaddingConfig2d::Explicit(padding, padding, padding, padding))
            .with_bias(false)
            .init(device);
        let norm = GroupNormConfig::new(layer.norm_groups, layer.out_channels).init(device);
        Self { conv, norm, activation }
    }

    /// Zero padding on every side of the convolution's input, in pixels (1 for 3x3, 0 for 1x1).
    pub fn padding(&self) -> usize {
        match self.conv.padding {
            PaddingConfig2d::Explicit(p, ..) => p,
            _ => 0,
        }
    }

    /// Whether the convolution is depthwise 3x3 (one filter per channel of `in_channels`),
    /// padding 1 on every side, no dilation, the same stride both ways.
    fn is_depthwise3x3(&self, in_channels: usize) -> bool {
        let c = &self.conv;
        c.kernel_size == [3, 3]
            && c.groups > 1
            && c.groups == in_channels
            && c.padding == PaddingConfig2d::Explicit(1, 1, 1, 1)
            && c.dilation == [1, 1]
            && c.stride[0] == c.stride[1]
    }

    /// The norm's `(γ, β)` when this layer on `x` takes [`crate::model::fused_stem::stem_inference`]:
    /// a dense 3x3 convolution (padding 1, no dilation, the same stride both ways) with GELU,
    /// at f32 inference on a CPU backend with a batch of at least two samples per thread
    /// ([`crate::model::fused_block::input_suits`]).
    fn fused_stem_norm(&self, x: &Tensor<4>, precision: Precision) -> Option<(Tensor<1>, Tensor<1>)> {
        let [_, c_in, h, w] = x.dims();
        let c = &self.conv;
        let weight_dims = c.weight.dims();
        let applies = crate::model::fused_block::input_suits(x, precision)
            && self.activation == Activation::Gelu
            && c_in > 0
            && h > 0
            && w > 0
            && c.kernel_size == [3, 3]
            && c.groups == 1
            && c.padding == PaddingConfig2d::Explicit(1, 1, 1, 1)
            && c.dilation == [1, 1]
            && c.stride[0] == c.stride[1]
            && c.stride[0] > 0
            && weight_dims[1..] == [c_in, 3, 3]
            && c.weight.val().dtype() == DType::F32
            // Last: it reads the measuring switches' environment variables.
            && crate::model::fused_block::fused_inference_enabled();
        if !applies {
            return None;
        }
        let (gamma, beta) = crate::kernels::group_norm_gelu::cpu_affine_params(&self.norm, weight_dims[0])?;
        let devices = [x.device(), c.weight.device(), gamma.device(), beta.device()];
        crate::model::fused_block::none_tracked(&devices).then_some((gamma, beta))
    }

    /// # Shapes
    /// `[B, C_in, H, W]` -> `[B, C_out, H / stride, W / stride]`, in `dtype`.
    fn forward(&self, x: Tensor<4>, precision: Precision) -> Tensor<4> {
        let c = &self.conv;
        let p = self.padding();
        if let Some(norm) = self.fused_stem_norm(&x, precision) {
            // The stem at inference on a CPU backend: one pass per sample.
            let (groups, eps) = (self.norm.num_groups, self.norm.epsilon);
            return crate::model::fused_stem::stem_inference(x, c.weight.val(), norm, c.stride[0], groups, eps);
        }
        if precision == Precision::F32 && self.activation == Activation::Gelu && self.is_depthwise3x3(x.dims()[1]) {
            // One fused pass at inference on the CPU backends; the two ops elsewhere.
            return crate::kernels::depthwise_conv::depthwise_conv3x3_group_norm_gelu(
                x,
                c.weight.val(),
                c.stride[0],
                &self.norm,
            );
        }
        let options = ConvOptions::new(c.stride, [p, p], c.dilation, c.groups);
        let y = match precision {
            Precision::F32 if c.kernel_size == [1, 1] && c.stride == [1, 1] && c.groups == 1 && p == 0 => {
                match pointwise_form(&x.device(), x.dims()[2] * x.dims()[3]) {
                    PointwiseForm::Broadcast => pointwise_as_matmul(x, c.weight.val()),
                    PointwiseForm::Flat => pointwise_as_flat_matmul(x, c.weight.val()),
                    PointwiseForm::Conv => burn::tensor::module::conv2d(x, c.weight.val(), None, options),
                }
            }
            Precision::F32 if self.is_depthwise3x3(x.dims()[1]) => {
                crate::kernels::depthwise_conv::depthwise_conv3x3(x, c.weight.val(), c.stride[0])
            }
            Precision::F32 => burn::tensor::module::conv2d(x, c.weight.val(), None, options),
            Precision::F16 => burn::tensor::module::conv2d(x, c.weight.val().cast(FloatDType::F16), None, options),
        };
        match (precision, self.activation) {
            // One fused op on the CPU backends and native wgpu (burn-nn's GroupNorm + GELU in the
            // browser; `group_norm_gelu` decides).
            (Precision::F32, Activation::Gelu) => crate::kernels::group_norm_gelu::group_norm_gelu(y, &self.norm),
            (Precision::F32, Activation::Relu) => burn::tensor::activation::relu(self.norm.forward(y)),
            (Precision::F16, Activation::Gelu) => crate::kernels::gelu::gelu(group_norm_f16(y, &self.norm)),
            (Precision::F16, Activation::Relu) => burn::tensor::activation::relu(group_norm_f16(y, &self.norm)),
        }
    }
}

/// GroupNorm of f16 activations with f32 statistics that keeps a single f16 tensor for backward.
///
/// burn's composite GroupNorm run on an f32 cast keeps two f32 tensors per element (the centred
/// input and the normalized values, 8 bytes); this keeps only `z` below (2 bytes), which is what
/// brings f16 activation memory to about half of f32's (`vramfit bench memory`).
///
/// ```text
/// xc    = x - mean(x)                 mean summed in f32, differentiable
/// s     = 1 / sqrt(var(xc) + eps)     from a detached f32 copy: a constant for autodiff
/// z     = xc * s                      f16, about unit variance, so z * z cannot overflow
/// var_z = mean(z * z)                 squares summed in f32
/// y     = z * gamma / sqrt(var_z + eps s^2) + beta
/// ```
/// `s` cancels: `y = gamma (x - mean) / sqrt(var(x) + eps) + beta` exactly, gradients included,
/// because the only path from `x` to `y` that autodiff does not see is through the constant `s`.
///
/// # Shapes
/// `[B, C, H, W]` f16 -> `[B, C, H, W]` f16; `norm` has `C` channels in `G` groups.
pub fn group_norm_f16(x: Tensor<4>, norm: &GroupNorm) -> Tensor<4> {
    let [b, c, h, w] = x.dims();
    let g = norm.num_groups;
    let n = (c / g) * h * w;
    let eps = norm.epsilon as f32;
    let xg = x.reshape([b, g, n]); // [B, G, n] f16
    let mean = xg.clone().cast(FloatDType::F32).sum_dim(2) / n as f32; // [B, G, 1] f32
    let xc = xg - mean.cast(FloatDType::F16);
    let var_detached = xc.clone().detach().cast(FloatDType::F32).square().sum_dim(2) / n as f32;
    let s = (var_detached + eps).sqrt().recip(); // [B, G, 1], no gradient
    let z = xc * s.clone().cast(FloatDType::F16); // the one saved tensor
    let var_z = z.clone().square().cast(FloatDType::F32).sum_dim(2) / n as f32; // ~1
    let inv = (var_z + s.square() * eps).sqrt().recip(); // [B, G, 1] f32
    let inv = inv.repeat_dim(2, c / g).reshape([b, c, 1]); // per channel
    let (scale, shift) = match (&norm.gamma, &norm.beta) {
        (Some(gamma), Some(beta)) => (inv * gamma.val().reshape([1, c, 1]), Some(beta.val().reshape([1, c, 1]))),
        _ => (inv, None),
    };
    let y = z.reshape([b, c, h * w]) * scale.cast(FloatDType::F16);
    let y = match shift {
        Some(beta) => y + beta.cast(FloatDType::F16),
        None => y,
    };
    y.reshape([b, c, h, w])
}

/// Depthwise 3x3 + pointwise 1x1, with a residual when the shape is kept.
#[derive(Module, Debug)]
pub struct DsBlock {
    /// Depthwise 3x3 (carries the stride).
    pub dw: ConvNormAct,
    /// Pointwise 1x1 (changes the channels).
    pub pw: ConvNormAct,
    #[module(skip)]
    residual: bool,
}

impl DsBlock {
    /// Whether the block adds its input to its output (stride 1 and unchanged channels).
    pub fn residual(&self) -> bool {
        self.residual
    }

    /// # Shapes
    /// `[B, C_in, H, W]` -> `[B, C_out, H / stride, W / stride]`, in `precision`'s dtype.
    ///
    /// At f32 inference on a CPU backend with GELU, affine norms and a batch of at least two
    /// samples per thread ([`crate::model::fused_block::batch_fits`]), the whole block is one pass per
    /// sample ([`crate::model::fused_block::ds_block_inference`]); everywhere else layer by layer.
    pub fn forward(&self, x: Tensor<4>, precision: Precision) -> Tensor<4> {
        if let Some((settings, dw_norm, pw_norm)) = self.fused_inference_settings(&x, precision) {
            let (dw_weight, pw_weight) = (self.dw.conv.weight.val(), self.pw.conv.weight.val());
            let tensors = crate::model::fused_block::BlockTensors { x, dw_weight, dw_norm, pw_weight, pw_norm };
            return crate::model::fused_block::ds_block_inference(tensors, settings);
        }
        let y = self.pw.forward(self.dw.forward(x.clone(), precision), precision);
        if self.residual { y + x } else { y }
    }

    /// The fused inference pass's settings and both norms' `(γ, β)`, when the pass applies to
    /// `x` (see [`Self::forward`]).
    #[allow(clippy::type_complexity)] // the settings and two (γ, β) pairs, named in the docs
    fn fused_inference_settings(
        &self,
        x: &Tensor<4>,
        precision: Precision,
    ) -> Option<(crate::model::fused_block::BlockSettings, (Tensor<1>, Tensor<1>), (Tensor<1>, Tensor<1>))> {
        let c_in = x.dims()[1];
        let (dw, pw) = (&self.dw, &self.pw);
        let applies = crate::model::fused_block::input_suits(x, precision)
            && [dw.activation, pw.activation] == [Activation::Gelu, Activation::Gelu]
            && dw.is_depthwise3x3(c_in)
            && matches!(dw.conv.stride[0], 1 | 2)
            && crate::kernels::depthwise_conv::takes_cpu_kernel(x, &dw.conv.weight.val(), dw.conv.stride[0])
            && pw.conv.kernel_size == [1, 1]
            && pw.conv.stride == [1, 1]
            && pw.conv.groups == 1
            && pw.padding() == 0
            && pw.conv.weight.dims()[1] == c_in
            && pw.conv.weight.val().dtype() == DType::F32
            && dw.norm.epsilon == pw.norm.epsilon
            // Last: it reads the measuring switches' environment variables.
            && crate::model::fused_block::fused_inference_enabled();
        if !applies {
            return None;
        }
        let c_out = pw.conv.weight.dims()[0];
        let dw_norm = crate::kernels::group_norm_gelu::cpu_affine_params(&dw.norm, c_in)?;
        let pw_norm = crate::kernels::group_norm_gelu::cpu_affine_params(&pw.norm, c_out)?;
        let params = [&dw_norm.0, &dw_norm.1, &pw_norm.0, &pw_norm.1].map(|p| p.device());
        let weights = [dw.conv.weight.device(), pw.conv.weight.device()];
        if !crate::model::fused_block::none_tracked(&[&[x.device()][..], &weights, &params].concat()) {
            return None;
        }
        let settings = crate::model::fused_block::BlockSettings {
            stride: dw.conv.stride[0],
            dw_groups: dw.norm.num_groups,
            pw_groups: pw.norm.num_groups,
            epsilon: dw.norm.epsilon,
            residual: self.residual,
        };
        Some((settings, dw_norm, pw_norm))
    }
}

/// The classifier network.
#[derive(Module, Debug)]
pub struct Classifier {
    /// 3x3 stride-2 stem.
    pub stem: ConvNormAct,
    /// Depthwise-separable blocks, all stages in order.
    pub blocks: Vec<DsBlock>,
    /// Linear head after global average pooling.
    pub head: Linear,
}

impl Classifier {
    /// Builds the network with fresh weights on `device`.
    pub fn new(cfg: &ModelConfig, num_classes: usize, device: &Device) -> Self {
        let plan = layer_plan(cfg, num_classes, (224, 224));
        let stem = ConvNormAct::new(&plan[0], cfg.activation, device);
        let blocks = plan[1..plan.len() - 1]
            .chunks(2)
            .map(|pair| DsBlock {
                dw: ConvNormAct::new(&pair[0], cfg.activation, device),
                pw: ConvNormAct::new(&pair[1], cfg.activation, device),
                residual: pair[1].residual,
            })
            .collect();
        let last = &plan[plan.len() - 1];
        let head = LinearConfig::new(last.in_channels, num_classes)
            .with_initializer(Initializer::Normal { mean: 0.0, std: cfg.head_init_std })
            .init(device);
        // A zero bias that trains: `Param::map` would keep the value's (unset) gradient flag.
        let bias = burn::module::Param::from_tensor(Tensor::<1>::zeros([num_classes], device));
        let head = Linear { bias: Some(bias), ..head };
        Self { stem, blocks, head }
    }

    /// Logits for a batch of normalized images.
    ///
    /// # Shapes
    /// `images`: `[B, 3, H, W]` f32 -> logits `[B, classes]` f32.
    pub fn forward(&self, images: Tensor<4>, precision: Precision) -> Tensor<2> {
        let x = match precision {
            Precision::F32 => images,
            Precision::F16 => images.cast(FloatDType::F16),
        };
        let mut x = self.stem.forward(x, precision); // [B, C0, H/2, W/2]
        for block in &self.blocks {
            x = block.forward(x, precision);
        }
        let [b, c, _, _] = x.dims();
        let pooled = x.mean_dim(3).mean_dim(2).reshape([b, c]); // [B, C]
        let logits = match precision {
            Precision::F32 => self.head.forward(pooled),
            Precision::F16 => burn::tensor::module::linear(
                pooled,
                self.head.weight.val().cast(FloatDType::F16),
                self.head.bias.as_ref().map(|b| b.val().cast(FloatDType::F16)),
            ),
        };
        logits.cast(FloatDType::F32)
    }
}

/// Forward FLOPs for one image (2 x multiply-accumulates, convolutions and head).
pub fn forward_flops(plan: &[LayerShape]) -> u64 {
    plan.iter().map(|l| 2 * l.macs()).sum()
}

/// Parameters of the planned network.
pub fn param_count(plan: &[LayerShape]) -> usize {
    plan.iter().map(LayerShape::params).sum()
}

#[cfg(test)]
mod tests;
