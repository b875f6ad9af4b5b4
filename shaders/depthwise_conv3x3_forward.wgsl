// The depthwise 3x3 convolution's output (formula and params: depthwise_conv3x3_common.wgsl),
// one thread per output value.
//
// Bindings (group 0, in the order the Rust side passes them; all read_write, shaders/README.md):
//   0: x       [B, C, H, W] f32, contiguous
//   1: weight  [C, 1, 3, 3] f32, contiguous
//   2: params  u32 words
//   3: y       [B, C, H_out, W_out] f32

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> weight: array<f32>;
@group(0) @binding(2) var<storage, read_write> params: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(WG, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = geometry();
    let out_len = g.h_out * g.w_out;
    let i = workgroup_index(wg) * WG + lid;
    if i >= g.planes * out_len {
        return;
    }
    let plane = i / out_len;
    let oy = i32((i % out_len) / g.w_out);
    let ox = i32((i % out_len) % g.w_out);
    let x_plane = plane * u32(g.h * g.w);
    let w_base = (plane % g.channels) * 9u;
    var acc = 0.0;
    for (var ky = 0; ky < 3; ky = ky + 1) {
        let iy = oy * g.stride + ky - 1;
        if iy < 0 || iy >= g.h {
            continue;
        }
        for (var kx = 0; kx < 3; kx = kx + 1) {
            let ix = ox * g.stride + kx - 1;
            if ix >= 0 && ix < g.w {
                acc = acc + weight[w_base + u32(ky * 3 + kx)] * x[x_plane + u32(iy * g.w + ix)];
            }
        }
    }
    y[i] = acc;
}
