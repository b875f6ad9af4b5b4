// The gradients of y = gelu(gamma_c xhat + beta_c), xhat = (x - mean) rstd per (sample, group),
// for the output gradient dy; one workgroup per group (layout and params:
// group_norm_gelu_common.wgsl). With p = gamma_c xhat + beta_c and dp = dy gelu'(p):
//   dbeta_c = sum dp, dgamma_c = sum dp xhat over the channel's hw values (written per sample;
//             the Rust side sums them over the batch),
//   dx = rstd (gamma_c dp - mean(gamma dp) - xhat mean(gamma dp xhat)), means over the group
//   (the normalization backward: Ioffe & Szegedy 2015, per group as in Wu & He 2018).
// The statistics are recomputed from x, as the CPU kernel does (src/kernels/group_norm_gelu.rs).
//
// Bindings (group 0, in the order the Rust side passes them; all read_write, shaders/README.md):
//   0: x       [B, C, H, W] f32, contiguous
//   1: gamma   [C] f32
//   2: beta    [C] f32
//   3: dy      [B, C, H, W] f32, contiguous
//   4: params  u32 words
//   5: dx      [B, C, H, W] f32
//   6: dgamma  [B, C] f32, per sample
//   7: dbeta   [B, C] f32, per sample

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> gamma: array<f32>;
@group(0) @binding(2) var<storage, read_write> beta: array<f32>;
@group(0) @binding(3) var<storage, read_write> dy: array<f32>;
@group(0) @binding(4) var<storage, read_write> params: array<u32>;
@group(0) @binding(5) var<storage, read_write> dx: array<f32>;
@group(0) @binding(6) var<storage, read_write> dgamma: array<f32>;
@group(0) @binding(7) var<storage, read_write> dbeta: array<f32>;

// (dp, dp xhat) at value i of the group, in channel c.
fn dp_terms(i: u32, c: u32, stats: vec2<f32>) -> vec2<f32> {
    let xhat = (x[i] - stats.x) * stats.y;
    let p = gamma[c] * xhat + beta[c];
    let cd = cdf_and_density(p);
    let dp = dy[i] * (cd.x + p * cd.y);
    return vec2<f32>(dp, dp * xhat);
}

@compute @workgroup_size(WG, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = this_group(wg, lid);
    if !g.live {
        return;
    }
    let stats = mean_rstd(lid, g);

    // Per-channel sums: `lanes` threads per channel (a power of two, all WG threads busy when
    // the group has fewer than WG channels), WG / lanes channels per round. `lanes` and the
    // rounds depend only on cpg: uniform.
    var lanes = WG;
    for (var k = 1u; k < g.cpg && lanes > 1u; k = k << 1u) {
        lanes = lanes >> 1u;
    }
    let per_round = WG / lanes;
    let lane = lid % lanes;
    var sums = vec2<f32>(0.0, 0.0);   // (sum gamma dp, sum gamma dp xhat): lane-0 threads' share
    for (var first = 0u; first < g.cpg; first = first + per_round) {
        let ci = first + lid / lanes;
        var acc = vec2<f32>(0.0, 0.0);
        if ci < g.cpg {
            for (var j = lane; j < g.hw; j = j + lanes) {
                acc = acc + dp_terms(g.base + ci * g.hw + j, g.c0 + ci, stats);
            }
        }
        let t = segment_sum(lid, lanes, acc);
        if lane == 0u && ci < g.cpg {
            let c = g.c0 + ci;
            dbeta[g.sample * params[1] + c] = t.x;
            dgamma[g.sample * params[1] + c] = t.y;
            sums = sums + gamma[c] * t;
        }
    }
    let m = workgroup_sum(lid, sums) / f32(g.n);

    for (var i = lid; i < g.n; i = i + WG) {
        let c = g.c0 + i / g.hw;
        let xhat = (x[g.base + i] - stats.x) * stats.y;
        let d = dp_terms(g.base + i, c, stats);
        dx[g.base + i] = stats.y * (gamma[c] * d.x - m.x - xhat * m.y);
    }
}
