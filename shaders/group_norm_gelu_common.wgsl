// Shared by group_norm_gelu_forward.wgsl and group_norm_gelu_backward.wgsl (the Rust side puts
// this file in front of each): the launch layout, the workgroup reductions and the GELU.
//
// One workgroup of WG threads per (sample, group); workgroup w covers the group's n = cpg * hw
// contiguous values of a [B, C, H, W] tensor, cpg = C / G channels of hw = H * W values each.
// Params (u32 words; f32 as bits): 0 batch B, 1 channels C, 2 groups G, 3 hw, 4 epsilon (f32),
// 5 workgroups per row of the dispatch (the grid is 2-D past 65535 workgroups).

const WG: u32 = 256u;

var<workgroup> partial: array<vec2<f32>, 256>;
// Header values every thread must agree on (loop bounds around barriers), set by thread 0 and
// read back with workgroupUniformLoad, which WGSL's uniformity analysis accepts.
var<workgroup> shared_cpg: u32;
var<workgroup> shared_live: u32;

// Sums v over the workgroup (a tree in shared memory); every thread gets the sum.
fn workgroup_sum(lid: u32, v: vec2<f32>) -> vec2<f32> {
    partial[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if lid < s {
            partial[lid] = partial[lid] + partial[lid + s];
        }
        workgroupBarrier();
    }
    let total = partial[0];
    workgroupBarrier();
    return total;
}

// Phi(p) and phi(p), the standard normal CDF and density: the CDF from Abramowitz & Stegun
// 7.1.26 (erfc within 1.5e-7), as src/gelu.rs computes it on the CPU. gelu(p) = p Phi(p),
// gelu'(p) = Phi(p) + p phi(p).
fn cdf_and_density(p: f32) -> vec2<f32> {
    let z = abs(p) * 0.70710678;
    let t = 1.0 / (1.0 + 0.3275911 * z);
    let e = exp(-z * z);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    let half_erfc = 0.5 * poly * e;
    return vec2<f32>(select(half_erfc, 1.0 - half_erfc, p >= 0.0), e * 0.39894228);
}

// The group's mean and 1 / sqrt(var + eps), var biased and centred (two passes, as the CPU
// kernel and burn-nn's GroupNorm).
fn mean_rstd(lid: u32, base: u32, n: u32, eps: f32) -> vec2<f32> {
    var acc = 0.0;
    for (var i = lid; i < n; i = i + WG) {
        acc = acc + x[base + i];
    }
    let mean = workgroup_sum(lid, vec2<f32>(acc, 0.0)).x / f32(n);
    var sq = 0.0;
    for (var i = lid; i < n; i = i + WG) {
        let d = x[base + i] - mean;
        sq = sq + d * d;
    }
    let variance = workgroup_sum(lid, vec2<f32>(sq, 0.0)).x / f32(n);
    return vec2<f32>(mean, inverseSqrt(variance + eps));
}

// This workgroup's (sample, group) index, b * G + g: the dispatch is a grid of params[5] columns.
fn group_index(wg: vec3<u32>) -> u32 {
    return wg.y * params[5] + wg.x;
}

// Thread 0 publishes cpg and whether this workgroup has a group (the grid's last row may be
// short); every thread reads them back as uniform values.
fn load_uniform_header(lid: u32, group: u32) -> vec2<u32> {
    if lid == 0u {
        shared_cpg = params[1] / params[2];
        shared_live = select(0u, 1u, group < params[0] * params[2]);
    }
    let cpg = workgroupUniformLoad(&shared_cpg);
    let live = workgroupUniformLoad(&shared_live);
    return vec2<u32>(cpg, live);
}
