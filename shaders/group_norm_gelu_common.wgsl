// Shared by group_norm_gelu_forward.wgsl and group_norm_gelu_backward.wgsl (the Rust side puts
// this file in front of each): the launch layout, the workgroup reductions and the GELU.
//
// One workgroup of WG threads per (sample, group); workgroup w covers the group's n = cpg * hw
// contiguous values of a [B, C, H, W] tensor, cpg = C / G channels of hw = H * W values each.
// Params (u32 words; f32 as bits): 0 batch B, 1 channels C, 2 groups G, 3 hw, 4 epsilon (f32),
// 5 workgroups per row of the dispatch (the grid is 2-D past 65535 workgroups).

// WG, the threads per workgroup (a power of two, 8 to 256), is a `const` the Rust side puts in
// front of this file (src/group_norm_gelu/wgsl.rs: fewer on CPU adapters, where each barrier of
// the tree sums costs a switch through every thread).

var<workgroup> partial: array<vec2<f32>, WG>;
// The group's layout, which every thread must agree on (loop bounds around barriers): set by
// thread 0 from the params and read back with workgroupUniformLoad, which WGSL's uniformity
// analysis accepts as uniform (a storage buffer read is not): (group index, cpg, hw, G, live).
var<workgroup> shared_header: array<u32, 5>;

// Sums v over each run of `lanes` consecutive threads (a power of two dividing WG, the same in
// every thread: a tree in shared memory); every thread gets its run's sum.
fn segment_sum(lid: u32, lanes: u32, v: vec2<f32>) -> vec2<f32> {
    let lane = lid % lanes;
    partial[lid] = v;
    workgroupBarrier();
    for (var s = lanes / 2u; s > 0u; s = s >> 1u) {
        if lane < s {
            partial[lid] = partial[lid] + partial[lid + s];
        }
        workgroupBarrier();
    }
    let total = partial[lid - lane];
    workgroupBarrier();
    return total;
}

// Sums v over the workgroup; every thread gets the sum.
fn workgroup_sum(lid: u32, v: vec2<f32>) -> vec2<f32> {
    return segment_sum(lid, WG, v);
}

// Phi(p) and phi(p), the standard normal CDF and density: the CDF from Abramowitz & Stegun
// 7.1.26 (erfc within 1.5e-7), as src/kernels/gelu.rs computes it on the CPU. gelu(p) = p Phi(p),
// gelu'(p) = Phi(p) + p phi(p).
fn cdf_and_density(p: f32) -> vec2<f32> {
    let z = abs(p) * 0.70710678;
    let t = 1.0 / (1.0 + 0.3275911 * z);
    let e = exp(-z * z);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    let half_erfc = 0.5 * poly * e;
    return vec2<f32>(select(half_erfc, 1.0 - half_erfc, p >= 0.0), e * 0.39894228);
}

// The group's mean and 1 / sqrt(var + eps) (eps: params word 4), var biased and centred (two
// passes, as the CPU kernel and burn-nn's GroupNorm).
fn mean_rstd(lid: u32, g: Group) -> vec2<f32> {
    var acc = 0.0;
    for (var i = lid; i < g.n; i = i + WG) {
        acc = acc + x[g.base + i];
    }
    let mean = workgroup_sum(lid, vec2<f32>(acc, 0.0)).x / f32(g.n);
    var sq = 0.0;
    for (var i = lid; i < g.n; i = i + WG) {
        let d = x[g.base + i] - mean;
        sq = sq + d * d;
    }
    let variance = workgroup_sum(lid, vec2<f32>(sq, 0.0)).x / f32(g.n);
    return vec2<f32>(mean, inverseSqrt(variance + bitcast<f32>(params[4])));
}

// This workgroup's (sample, group) index, b * G + g: the dispatch is a grid of params[5] columns.
fn group_index(wg: vec3<u32>) -> u32 {
    return wg.y * params[5] + wg.x;
}

// This workgroup's group of the [B, C, H, W] tensor; every field is uniform.
struct Group {
    live: bool,    // the grid's last row may be short: no group for this workgroup
    sample: u32,   // b, of the group b * G + g
    cpg: u32,      // channels per group, C / G
    hw: u32,       // values per channel
    n: u32,        // values in the group, cpg * hw
    base: u32,     // the group's first value
    c0: u32,       // the group's first channel
}

fn this_group(wg: vec3<u32>, lid: u32) -> Group {
    if lid == 0u {
        let index = group_index(wg);
        let live = select(0u, 1u, index < params[0] * params[2]);
        shared_header = array<u32, 5>(index, params[1] / params[2], params[3], params[2], live);
    }
    let h = workgroupUniformLoad(&shared_header);
    let index = h[0];
    let cpg = h[1];
    let hw = h[2];
    let groups = h[3];
    return Group(h[4] == 1u, index / groups, cpg, hw, cpg * hw, index * cpg * hw, (index % groups) * cpg);
}
