//! vramfit's own kernels, as burn backend extensions: GELU ([`gelu`]), GroupNorm + GELU fused
//! ([`group_norm_gelu`]) and the depthwise 3x3 convolution ([`depthwise_conv`]) on the CPU
//! backends and in WGSL, the augmentation kernel ([`device_augment`]), what launching a WGSL
//! kernel takes ([`wgsl_kernel`]), contiguous f32 access to CPU tensors ([`cpu_tensor`]) and
//! the environment switches that force one path for measuring ([`measuring_switch`]).

pub mod cpu_tensor;
pub mod depthwise_conv;
pub mod device_augment;
pub mod gelu;
pub mod group_norm_gelu;
pub mod measuring_switch;
pub mod wgsl_kernel;
