// Packed RGB8 images -> augmented, normalized f32 [N, 3, H, W]. One workgroup per image.
//
// Bindings (group 0, in the order the Rust side passes buffers to KernelArguments):
//   0: pixels  [N, SRC_H, SRC_W] u32, each r | g << 8 | b << 16
//   1: params  u32 words (f32 values stored as bit patterns, read with bitcast)
//   2: output  [N, 3, OUT_H, OUT_W] f32
// Params: header of HEADER words, then PER_SAMPLE words per image:
//   header: 0 n, 1 src_h, 2 src_w, 3 out_h, 4 out_w, 5 per-sample stride,
//           6..8 mean rgb (f32), 9..11 1/std rgb (f32), 12..15 unused
//   sample: 0 crop x, 1 crop y, 2 flip (0/1), 3 brightness (f32), 4 contrast (f32),
//           5 saturation (f32), 6 erase x | y << 16, 7 erase w | h << 16 (w == 0: none)
// wgpu's bounds checks are off under cubecl: the host validates crops against the source size.
// Every binding is read_write although the kernel only reads the first two: cubecl carves
// tensors from shared buffers, and wgpu refuses one buffer bound both read-only and read-write
// in one dispatch.

@group(0) @binding(0) var<storage, read_write> pixels: array<u32>;
@group(0) @binding(1) var<storage, read_write> params: array<u32>;
@group(0) @binding(2) var<storage, read_write> output: array<f32>;

const WG: u32 = 256u;
const HEADER: u32 = 16u;

var<workgroup> partial: array<f32, 256>;

fn pf(i: u32) -> f32 {
    return bitcast<f32>(params[i]);
}

fn gray(c: vec3<f32>) -> f32 {
    return dot(c, vec3<f32>(0.299, 0.587, 0.114));
}

// Brightness-adjusted RGB (0..1) of output pixel (y, x) of image `img`.
fn load(img: u32, y: u32, x: u32, base: u32) -> vec3<f32> {
    let src_h = params[1];
    let src_w = params[2];
    let out_w = params[4];
    var sx = x;
    if params[base + 2u] != 0u {
        sx = out_w - 1u - x;
    }
    let p = pixels[(img * src_h + params[base + 1u] + y) * src_w + params[base] + sx];
    return clamp(unpack4x8unorm(p).xyz * pf(base + 3u), vec3<f32>(0.0), vec3<f32>(1.0));
}

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let img = wg.x;
    let out_h = params[3];
    let out_w = params[4];
    let total = out_h * out_w;
    let base = HEADER + img * params[5];

    // Mean grey of the brightness-adjusted crop, for contrast (a workgroup tree reduction).
    var acc = 0.0;
    for (var i = lid; i < total; i = i + WG) {
        acc = acc + gray(load(img, i / out_w, i % out_w, base));
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if lid < s {
            partial[lid] = partial[lid] + partial[lid + s];
        }
        workgroupBarrier();
    }
    let mean_gray = vec3<f32>(partial[0] / f32(max(total, 1u)));

    let contrast = pf(base + 4u);
    let saturation = pf(base + 5u);
    let e0 = params[base + 6u];
    let e1 = params[base + 7u];
    let ex = e0 & 0xffffu;
    let ey = e0 >> 16u;
    let ew = e1 & 0xffffu;
    let eh = e1 >> 16u;
    let mean = vec3<f32>(pf(6u), pf(7u), pf(8u));
    let inv_std = vec3<f32>(pf(9u), pf(10u), pf(11u));
    let out_base = img * 3u * total;
    for (var i = lid; i < total; i = i + WG) {
        let y = i / out_w;
        let x = i % out_w;
        var c = load(img, y, x, base);
        c = clamp((c - mean_gray) * contrast + mean_gray, vec3<f32>(0.0), vec3<f32>(1.0));
        let g = vec3<f32>(gray(c));
        c = clamp((c - g) * saturation + g, vec3<f32>(0.0), vec3<f32>(1.0));
        var v = (c - mean) * inv_std;
        if x >= ex && x < ex + ew && y >= ey && y < ey + eh {
            v = vec3<f32>(0.0);
        }
        output[out_base + i] = v.x;
        output[out_base + total + i] = v.y;
        output[out_base + 2u * total + i] = v.z;
    }
}
