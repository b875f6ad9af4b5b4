// The depthwise 3x3 convolution's input gradient for the output gradient dy (formula and params:
// depthwise_conv3x3_common.wgsl), one thread per input value, gathering the outputs that read it:
//
//   dx[b, c, iy, ix] = sum over ky, kx of w[c, ky, kx] dy[b, c, oy, ox]
//                      where s oy = iy + 1 - ky and s ox = ix + 1 - kx (0 <= oy < H_out, likewise ox)
//
// Bindings (group 0, in the order the Rust side passes them; all read_write, shaders/README.md):
//   0: weight  [C, 1, 3, 3] f32, contiguous
//   1: dy      [B, C, H_out, W_out] f32, contiguous
//   2: params  u32 words
//   3: dx      [B, C, H, W] f32

@group(0) @binding(0) var<storage, read_write> weight: array<f32>;
@group(0) @binding(1) var<storage, read_write> dy: array<f32>;
@group(0) @binding(2) var<storage, read_write> params: array<u32>;
@group(0) @binding(3) var<storage, read_write> dx: array<f32>;

@compute @workgroup_size(WG, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = geometry();
    let in_len = u32(g.h * g.w);
    let i = workgroup_index(wg) * WG + lid;
    if i >= g.planes * in_len {
        return;
    }
    let plane = i / in_len;
    let iy = i32((i % in_len) / u32(g.w));
    let ix = i32((i % in_len) % u32(g.w));
    let dy_plane = plane * g.h_out * g.w_out;
    let w_base = (plane % g.channels) * 9u;
    var acc = 0.0;
    for (var ky = 0; ky < 3; ky = ky + 1) {
        let ty = iy + 1 - ky;
        let oy = ty / g.stride;
        if ty < 0 || oy * g.stride != ty || oy >= i32(g.h_out) {
            continue;
        }
        for (var kx = 0; kx < 3; kx = kx + 1) {
            let tx = ix + 1 - kx;
            let ox = tx / g.stride;
            if tx >= 0 && ox * g.stride == tx && ox < i32(g.w_out) {
                acc = acc + weight[w_base + u32(ky * 3 + kx)] * dy[dy_plane + u32(oy) * g.w_out + u32(ox)];
            }
        }
    }
    dx[i] = acc;
}
