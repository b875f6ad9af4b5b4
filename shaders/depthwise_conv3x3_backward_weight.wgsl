// The depthwise 3x3 convolution's weight gradient for the output gradient dy, in partial sums
// over chunks of each plane (formula and params: depthwise_conv3x3_common.wgsl; params word 8 is
// the chunks per plane, K); the Rust side sums the partial sums over the batch and the chunks:
//
//   dw[c, ky, kx] = sum over b, oy, ox of dy[b, c, oy, ox] x[b, c, s oy + ky - 1, s ox + kx - 1]
//
// One workgroup per chunk of CHUNK consecutive output positions of a plane (sample, channel):
// each thread sums the nine taps over every WG-th position of the chunk, then a tree in shared
// memory adds the threads' sums. A chunk bounds each thread's loop at CHUNK / WG = 64 rounds:
// lavapipe (llvmpipe) ends any shader loop after 65,535 iterations, counted over all its loops,
// without an error, so one workgroup looping over a whole large plane returned a wrong sum.
//
// Bindings (group 0, in the order the Rust side passes them; all read_write, shaders/README.md):
//   0: x       [B, C, H, W] f32, contiguous
//   1: dy      [B, C, H_out, W_out] f32, contiguous
//   2: params  u32 words
//   3: dw      [B, K, C, 9] f32, the partial sums of sample b's chunk k

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> dy: array<f32>;
@group(0) @binding(2) var<storage, read_write> params: array<u32>;
@group(0) @binding(3) var<storage, read_write> dw: array<f32>;

// Output positions per workgroup.
const CHUNK: u32 = WG * 64u;

var<workgroup> partial: array<array<f32, 9>, WG>;

@compute @workgroup_size(WG, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = geometry();
    let chunks = params[8];
    let index = workgroup_index(wg);
    let plane = index / chunks;
    let chunk = index % chunks;
    // The grid's last row may be short. No early return: the barriers below must be reached by
    // every thread (WGSL's uniformity rules), so a workgroup past the end only sums nothing.
    let live = plane < g.planes;
    let out_len = g.h_out * g.w_out;
    let end = min(out_len, (chunk + 1u) * CHUNK);
    let x_plane = plane * u32(g.h * g.w);
    var acc = array<f32, 9>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (var r = chunk * CHUNK + lid; live && r < end; r = r + WG) {
        let d = dy[plane * out_len + r];
        let oy = i32(r / g.w_out);
        let ox = i32(r % g.w_out);
        for (var ky = 0; ky < 3; ky = ky + 1) {
            let iy = oy * g.stride + ky - 1;
            if iy < 0 || iy >= g.h {
                continue;
            }
            for (var kx = 0; kx < 3; kx = kx + 1) {
                let ix = ox * g.stride + kx - 1;
                if ix >= 0 && ix < g.w {
                    acc[ky * 3 + kx] = acc[ky * 3 + kx] + d * x[x_plane + u32(iy * g.w + ix)];
                }
            }
        }
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if lid < s {
            for (var k = 0u; k < 9u; k = k + 1u) {
                partial[lid][k] = partial[lid][k] + partial[lid + s][k];
            }
        }
        workgroupBarrier();
    }
    if live && lid == 0u {
        // Sample b = plane / C, channel c = plane % C: dw[b, chunk, c, k].
        let first = ((plane / g.channels * chunks + chunk) * g.channels + plane % g.channels) * 9u;
        for (var k = 0u; k < 9u; k = k + 1u) {
            dw[first + k] = partial[0][k];
        }
    }
}
