// Shared by depthwise_conv3x3_forward.wgsl, _backward_input.wgsl and _backward_weight.wgsl (the
// Rust side, src/depthwise_conv/wgsl.rs, puts this file in front of each): the params words and
// the geometry of a depthwise 3x3 convolution without bias, padding 1, stride s (1 or 2):
//
//   y[b, c, oy, ox] = sum over ky, kx in 0..3 of w[c, ky, kx] x[b, c, s oy + ky - 1, s ox + kx - 1]
//
// (taps outside the input read 0), on contiguous NCHW f32 tensors: x [B, C, H, W], weight
// [C, 1, 3, 3], y [B, C, H_out, W_out] with H_out = (H - 1) / s + 1, W_out likewise.
// Params (u32 words): 0 B, 1 C, 2 H, 3 W, 4 H_out, 5 W_out, 6 s, 7 workgroups per row of the
// dispatch (past 65535 workgroups the grid wraps into a second dimension), 8 the weight
// gradient's chunks per plane (depthwise_conv3x3_backward_weight.wgsl; unused by the others).
//
// WG, the threads per workgroup, is a `const` the Rust side puts in front of this file.

struct Geometry {
    planes: u32,  // B * C, one plane per (sample, channel)
    channels: u32,
    h: i32,
    w: i32,
    h_out: u32,
    w_out: u32,
    stride: i32,
}

fn geometry() -> Geometry {
    return Geometry(params[0] * params[1], params[1], i32(params[2]), i32(params[3]), params[4], params[5], i32(params[6]));
}

// This workgroup's index in the dispatch: a grid of params[7] columns.
fn workgroup_index(wg: vec3<u32>) -> u32 {
    return wg.y * params[7] + wg.x;
}
