//! 1x1 convolutions as matrix products: which form a device computes them in
//! ([`pointwise_form`]) and the two products ([`pointwise_as_matmul`],
//! [`pointwise_as_flat_matmul`]), each measured against burn's `conv2d` where it is chosen.

use burn::tensor::{Device, Tensor};

/// How a 1x1, stride-1, ungrouped convolution computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PointwiseForm {
    /// burn's `conv2d`.
    Conv,
    /// [`pointwise_as_matmul`]: one batched product, the weight broadcast over the batch.
    Broadcast,
    /// [`pointwise_as_flat_matmul`]: one 2-D product over the whole batch.
    Flat,
}

/// The largest plane (H * W pixels) at which flex trains a 1x1 convolution as one flat product
/// over the batch ([`pointwise_as_flat_matmul`]) rather than the broadcast one. Measured on a
/// 2-core AVX2 machine, 2026-12-04, `bench train --device cpu --backends flex`, all layers
/// broadcast against flat up to this size, alternated: quickstart (planes of 196, 49 and 16
/// pixels) 1064-1262 -> 1235-1341 img/s, 4 runs each, 1.04-1.16x per pair; 12gb (planes of 12544
/// down to 49) 24.4-26.0 -> 26.7-30.0, 3 runs; every layer flat made 12gb slower (26.9-27.1 ->
/// 24.8-25.0), the copies to and from channel-major order outweighing the product at large planes.
/// burn ndarray trains slower flat (quickstart 1010-1036 -> 867-875), so it keeps the broadcast.
pub(super) const FLAT_PRODUCT_MAX_PLANE: usize = 196;

/// How 1x1 convolutions on `device` compute: as a matrix product ([`pointwise_as_matmul`])
/// on burn ndarray, whose `conv2d` is a direct loop even for 1x1 kernels (`bench train -c 12gb
/// --backends ndarray`: training 0.7 -> 5.2 img/s, inference 17.5 -> 33.2 img/s), and on flex
/// when training (an autodiff device), where the product's backward (two products) beats flex's
/// convolution backward (`bench train --backends flex`, 3 runs alternated: quickstart training
/// 977-1084 vs 926-958 img/s, 12gb 16.7-21.8 vs 13.9-14.4) while inference measured the same or
/// slightly slower (quickstart 4090-4645 vs 4272-4733), so flex inference keeps the convolution;
/// and on a wgpu device in a native build, where burn's `conv2d` copies both operands to NHWC
/// and the product reads NCHW as it is (lavapipe, `bench train -c quickstart --backends gpu
/// --steps 5 --warmup 2`, a build without the autotuner, 2 runs alternated: inference
/// 43.4-45.9 -> 63.1-64.6 img/s, 1-image 224 px latency 2.0-2.1 -> 0.79-0.85 s; unmeasured on a
/// card; the browser build keeps the convolution). Training there takes
/// [`pointwise_as_flat_matmul`] (same bench, 3 runs alternated, 2026-12-04: training 10.5-11.6
/// -> 21.9-24.0 img/s against `VRAMFIT_POINTWISE=conv`, the same 31.2 MiB peak in use). The
/// broadcast product trained faster than the convolution too (12.0-12.9 -> 18.2-19.3 img/s) but
/// burn computes the broadcast weight's gradient as a `[B, C_out, C_in]` product summed over the
/// batch, a transient the memory plan does not hold (a checkpointed batch of 208 the plan put at
/// 115 MiB reserved 169 MiB on lavapipe); the flat product's weight gradient is one 2-D product.
/// Training on flex takes the flat product too where a plane has at most
/// [`FLAT_PRODUCT_MAX_PLANE`] pixels (`plane_len` = H * W): there each sample's share of the
/// broadcast form's weight gradient is a product with an inner dimension of 16-196, which gemm
/// runs far below its speed, while the flat form's is one product over the batch.
///
/// `VRAMFIT_POINTWISE=matmul` (the device's product), `=flat` or `=conv` forces one form on
/// every device, for measuring. Any other value is ignored with a warning naming the three.
pub(super) fn pointwise_form(device: &Device, plane_len: usize) -> PointwiseForm {
    use burn::backend::DispatchDevice;
    let inner = device.clone().inner();
    let dispatch = inner.as_dispatch();
    let flat = match dispatch {
        DispatchDevice::Cube(_) => device.is_autodiff(),
        DispatchDevice::Flex(_) => device.is_autodiff() && plane_len <= FLAT_PRODUCT_MAX_PLANE,
        _ => false,
    };
    let product = if flat { PointwiseForm::Flat } else { PointwiseForm::Broadcast };
    let forced =
        crate::kernels::measuring_switch::measuring_switch("VRAMFIT_POINTWISE", "matmul, flat or conv", |v| match v {
            "matmul" => Some(product),
            "flat" => Some(PointwiseForm::Flat),
            "conv" => Some(PointwiseForm::Conv),
            _ => None,
        });
    forced.unwrap_or(match dispatch {
        #[cfg(not(target_arch = "wasm32"))]
        DispatchDevice::NdArray(_) => product,
        DispatchDevice::Flex(_) if device.is_autodiff() => product,
        DispatchDevice::Cube(_) if !cfg!(target_family = "wasm") => product,
        _ => PointwiseForm::Conv,
    })
}

/// A 1x1, stride-1, ungrouped convolution without bias as one batched matrix product:
/// `y[b] = W x[b]` with `W` the `[C_out, C_in]` weight and `x[b]` the `[C_in, H * W]` image.
///
/// # Shapes
/// `x` `[B, C_in, H, W]`, `weight` `[C_out, C_in, 1, 1]` -> `[B, C_out, H, W]`.
pub(super) fn pointwise_as_matmul(x: Tensor<4>, weight: Tensor<4>) -> Tensor<4> {
    let [b, c_in, h, w] = x.dims();
    let [c_out, ..] = weight.dims();
    // Broadcast, not expanded: an expanded weight is copied once per sample before the product
    // (B x C_out x C_in floats; 15% of an ndarray quickstart inference profile).
    let y = weight.reshape([1, c_out, c_in]).matmul(x.reshape([b, c_in, h * w]));
    y.reshape([b, c_out, h, w])
}

/// [`pointwise_as_matmul`] for training on wgpu, and on flex at planes of at most
/// [`FLAT_PRODUCT_MAX_PLANE`] pixels: one 2-D product over the whole batch,
/// `y' = W x'` with `x'` the `[C_in, B * H * W]` channel-major copy of `x`, so that the weight's
/// gradient is one `[C_out, B H W] x [B H W, C_in]` product (the broadcast form's is a
/// `[B, C_out, C_in]` product summed over the batch: 54 MB at batch 208 of the quickstart
/// network's 256-channel layers, a transient the memory plan does not count). The copies of `x`
/// and `y` are activation-sized, as the NHWC copies burn's `conv2d` makes; autodiff keeps `x'`
/// in place of `x`, the bytes the plan counts for a convolution's input.
///
/// # Shapes
/// `x` `[B, C_in, H, W]`, `weight` `[C_out, C_in, 1, 1]` -> `[B, C_out, H, W]`.
pub(super) fn pointwise_as_flat_matmul(x: Tensor<4>, weight: Tensor<4>) -> Tensor<4> {
    let [b, c_in, h, w] = x.dims();
    let [c_out, ..] = weight.dims();
    let channel_major = x.reshape([b, c_in, h * w]).swap_dims(0, 1).reshape([c_in, b * h * w]);
    let y = weight.reshape([c_out, c_in]).matmul(channel_major);
    y.reshape([c_out, b, h * w]).swap_dims(0, 1).reshape([b, c_out, h, w])
}
