// y = gelu(gamma_c (x - mean) rstd + beta_c) per (sample, group): GroupNorm and GELU in one
// kernel, one workgroup per group (layout and params: group_norm_gelu_common.wgsl).
//
// Bindings (group 0, in the order the Rust side passes them; all read_write, shaders/README.md):
//   0: x      [B, C, H, W] f32, contiguous
//   1: gamma  [C] f32
//   2: beta   [C] f32
//   3: params u32 words
//   4: y      [B, C, H, W] f32

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> gamma: array<f32>;
@group(0) @binding(2) var<storage, read_write> beta: array<f32>;
@group(0) @binding(3) var<storage, read_write> params: array<u32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(WG, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = this_group(wg, lid);
    if !g.live {
        return;
    }
    let stats = mean_rstd(lid, g);
    for (var i = lid; i < g.n; i = i + WG) {
        let c = g.c0 + i / g.hw;
        let p = gamma[c] * ((x[g.base + i] - stats.x) * stats.y) + beta[c];
        y[g.base + i] = p * cdf_and_density(p).x;
    }
}
