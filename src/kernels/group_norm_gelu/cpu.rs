//! GroupNorm + GELU on the CPU: the statistics of each group, then normalize + affine + GELU in
//! one vectorized pass ([`forward_in_place`]), and the hand-written backward in two
//! ([`backward`]). [`super`] wraps them as burn ops.

use rayon::prelude::*;

use crate::kernels::gelu::{VectorKernel, VectorUnit, cdf_and_density, madd, run_on, vector_unit};

/// How a `[B, C, ...]` tensor splits into groups: `B * G` contiguous runs of `n` elements, each
/// `C / G` channels of `hw` elements.
#[derive(Clone, Copy, Debug)]
pub struct Groups {
    /// Samples, `B`.
    pub batch: usize,
    /// Channels, `C`.
    pub channels: usize,
    /// Groups per sample, `G` (divides `C`).
    pub groups: usize,
    /// Elements per channel (the product of the spatial dims).
    pub hw: usize,
    /// Added to the variance, as burn-nn's `epsilon`.
    pub epsilon: f32,
}

impl Groups {
    /// # Panics
    /// If `dims` has fewer than two entries or `num_groups` does not divide `dims[1]` (the
    /// caller, [`group_norm_gelu`], checks both).
    pub fn of(dims: &[usize], num_groups: usize, epsilon: f64) -> Self {
        assert!(
            dims.len() >= 2 && dims[1].is_multiple_of(num_groups),
            "GroupNorm: {num_groups} groups for dims {dims:?}"
        );
        Self {
            batch: dims[0],
            channels: dims[1],
            groups: num_groups,
            hw: dims[2..].iter().product(),
            epsilon: epsilon as f32,
        }
    }

    /// Elements in the tensor.
    pub fn len(&self) -> usize {
        self.batch * self.channels * self.hw
    }

    /// Whether the tensor is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Channels per group.
    pub(crate) fn channels_per_group(&self) -> usize {
        self.channels / self.groups
    }

    /// Elements per group, `n`.
    pub(crate) fn group_len(&self) -> usize {
        self.channels_per_group() * self.hw
    }

    /// Groups per parallel task: at least [`TASK_ELEMS`] elements each, so that rayon's
    /// scheduling (microseconds) stays small against the work.
    pub(crate) fn groups_per_task(&self) -> usize {
        TASK_ELEMS.div_ceil(self.group_len().max(1)).max(1)
    }
}

/// Elements per parallel task, at least.
pub(super) const TASK_ELEMS: usize = 16 * 1024;

/// `xy = gelu(γ xhat + β)` in place, for contiguous `xy` (`groups.len()` elements), `gamma` and
/// `beta` (`C` each).
///
/// # Panics
/// If the slice lengths do not match `groups`.
pub fn forward_in_place(groups: &Groups, xy: &mut [f32], gamma: &[f32], beta: &[f32]) {
    assert!(xy.len() == groups.len() && gamma.len() == groups.channels && beta.len() == gamma.len());
    if groups.is_empty() {
        return;
    }
    let n = groups.group_len();
    let cpg = groups.channels_per_group();
    let unit = vector_unit();
    xy.par_chunks_mut(n).enumerate().with_min_len(groups.groups_per_task()).for_each(|(i, xy)| {
        let first = (i % groups.groups) * cpg;
        let params = (&gamma[first..first + cpg], &beta[first..first + cpg]);
        forward_group_in_place(unit, xy, params, groups.hw, groups.epsilon);
    });
}

/// The three gradients of [`forward_in_place`].
pub struct Gradients3 {
    /// Input gradient, `x`'s length.
    pub x: Vec<f32>,
    /// Scale gradient, `C`.
    pub gamma: Vec<f32>,
    /// Shift gradient, `C`.
    pub beta: Vec<f32>,
}

/// Gradients of `sum(gelu(γ xhat + β) * grad)` with respect to `x`, `gamma` and `beta`.
///
/// # Panics
/// If the slice lengths do not match `groups`.
pub fn backward(groups: &Groups, x: &[f32], gamma: &[f32], beta: &[f32], grad: &[f32]) -> Gradients3 {
    assert!(
        x.len() == groups.len() && grad.len() == x.len() && gamma.len() == groups.channels && beta.len() == gamma.len()
    );
    let n = groups.group_len();
    let cpg = groups.channels_per_group();
    let c = groups.channels;
    let mut dx = vec![0f32; x.len()];
    // Per sample and channel: Σ dp and Σ dp xhat, summed over the batch below.
    let (mut sum_dp, mut sum_dp_xhat) = (vec![0f32; groups.batch * c], vec![0f32; groups.batch * c]);
    if !groups.is_empty() {
        let unit = vector_unit();
        dx.par_chunks_mut(n)
            .zip(x.par_chunks(n))
            .zip(grad.par_chunks(n))
            .zip(sum_dp.par_chunks_mut(cpg).zip(sum_dp_xhat.par_chunks_mut(cpg)))
            .enumerate()
            .with_min_len(groups.groups_per_task())
            .for_each(|(i, (((dx, x), dy), (sum_dp, sum_dp_xhat)))| {
                let first = (i % groups.groups) * cpg;
                let params = (&gamma[first..first + cpg], &beta[first..first + cpg]);
                let (hw, eps) = (groups.hw, groups.epsilon);
                run_on(unit, GroupBackward { x, dy, params, hw, eps, dx, sums: (sum_dp, sum_dp_xhat) });
            });
    }
    let mut dgamma = vec![0f32; c];
    let mut dbeta = vec![0f32; c];
    for b in 0..groups.batch {
        for ch in 0..c {
            dgamma[ch] += sum_dp_xhat[b * c + ch];
            dbeta[ch] += sum_dp[b * c + ch];
        }
    }
    Gradients3 { x: dx, gamma: dgamma, beta: dbeta }
}

/// One group's forward in place (`cpg` channels of `hw` values, `params` their γ and β),
/// compiled for `unit`; the depthwise convolution's fused form calls it on each group it writes.
pub(crate) fn forward_group_in_place(unit: VectorUnit, xy: &mut [f32], params: (&[f32], &[f32]), hw: usize, eps: f32) {
    run_on(unit, ForwardGroup { xy, params, hw, eps });
}

/// [`forward_group`]'s operands, for [`run_on`].
struct ForwardGroup<'a> {
    xy: &'a mut [f32],
    params: (&'a [f32], &'a [f32]),
    hw: usize,
    eps: f32,
}

impl VectorKernel for ForwardGroup<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        forward_group::<FMA>(self.xy, self.params, self.hw, self.eps);
    }
}

/// One group's operands for the backward kernel ([`backward_group`], run by [`run_on`]): what
/// it reads, `x`, `dy` (`C/G * hw` each, channels of `hw` elements) and the group's channels'
/// `(γ, β)`, the norm's `eps`, and what it writes, `dx` (as `x`) and per channel
/// `(Σ dp, Σ dp xhat)`.
pub(super) struct GroupBackward<'a> {
    pub x: &'a [f32],
    pub dy: &'a [f32],
    pub params: (&'a [f32], &'a [f32]),
    pub hw: usize,
    pub eps: f32,
    pub dx: &'a mut [f32],
    pub sums: (&'a mut [f32], &'a mut [f32]),
}

impl VectorKernel for GroupBackward<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        backward_group::<FMA>(self);
    }
}

/// Independent accumulators per sum: the compiler keeps them in vector registers.
pub(super) const LANES: usize = 16;

/// `(mean, 1 / sqrt(var + eps))` of one group, two passes (the centred sum of squares, not
/// `E[x²] - mean²`, which cancels badly for large means).
#[inline(always)]
pub(super) fn mean_rstd(x: &[f32], eps: f32) -> (f32, f32) {
    let n = x.len() as f32;
    let mean = lane_sum(x, |v| v) / n;
    let var = lane_sum(x, |v| (v - mean) * (v - mean)) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// `Σ f(x_i)` in [`LANES`] independent partial sums.
#[inline(always)]
pub(super) fn lane_sum(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().map(|&v| f(v)).sum();
    for chunk in chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a += f(v);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// One group in place: `x = gelu(γ_c (x - mean) rstd + β_c)`, channel by channel (`hw`
/// elements each).
#[inline(always)]
pub(super) fn forward_group<const FMA: bool>(xy: &mut [f32], (gamma, beta): (&[f32], &[f32]), hw: usize, eps: f32) {
    let (mean, rstd) = mean_rstd(xy, eps);
    for (c, xy) in xy.chunks_exact_mut(hw).enumerate() {
        let (scale, shift) = (gamma[c] * rstd, beta[c]);
        for v in xy.iter_mut() {
            // Centred first: x = mean gives exactly β (a folded `x scale + (β - mean scale)`
            // cancels only to rounding, large when rstd is).
            let p = madd::<FMA>(*v - mean, scale, shift);
            *v = p * cdf_and_density::<FMA>(p).0;
        }
    }
}

/// One group's input gradient into `dx`, and per channel `Σ dp` and `Σ dp xhat` into `sums`.
#[inline(always)]
pub(super) fn backward_group<const FMA: bool>(group: GroupBackward<'_>) {
    let GroupBackward { x, dy, params: (gamma, beta), hw, eps, dx, sums: (sum_dp, sum_dp_xhat) } = group;
    let (mean, rstd) = mean_rstd(x, eps);
    let n = x.len() as f32;
    // Pass 1: dp = dy gelu'(p) into dx; per-channel sums.
    let (mut mean_dxhat, mut mean_dxhat_xhat) = (0f32, 0f32);
    for c in 0..gamma.len() {
        let range = c * hw..(c + 1) * hw;
        let (s, sx) =
            dp_channel::<FMA>(&x[range.clone()], &dy[range.clone()], (mean, rstd), (gamma[c], beta[c]), &mut dx[range]);
        sum_dp[c] = s;
        sum_dp_xhat[c] = sx;
        mean_dxhat += gamma[c] * s / n;
        mean_dxhat_xhat += gamma[c] * sx / n;
    }
    // Pass 2: dx = rstd (γ_c dp - mean(dxhat) - xhat mean(dxhat xhat)).
    for (c, (x, dx)) in x.chunks_exact(hw).zip(dx.chunks_exact_mut(hw)).enumerate() {
        let g = gamma[c];
        for (d, &v) in dx.iter_mut().zip(x) {
            let xhat = (v - mean) * rstd;
            *d = rstd * (g * *d - mean_dxhat - xhat * mean_dxhat_xhat);
        }
    }
}

/// One channel of pass 1: `dp = dy gelu'(γ xhat + β)` into `dp`; returns `(Σ dp, Σ dp xhat)`.
#[inline(always)]
pub(super) fn dp_channel<const FMA: bool>(
    x: &[f32],
    dy: &[f32],
    (mean, rstd): (f32, f32),
    (g, b): (f32, f32),
    dp: &mut [f32],
) -> (f32, f32) {
    let one = |v: f32, d: f32| {
        let xhat = (v - mean) * rstd;
        let p = madd::<FMA>(g, xhat, b);
        let (cdf, density) = cdf_and_density::<FMA>(p);
        let dp = d * madd::<FMA>(p, density, cdf);
        (dp, xhat)
    };
    let (mut acc, mut acc_x) = ([0f32; LANES], [0f32; LANES]);
    let mut chunks = x.chunks_exact(LANES).zip(dy.chunks_exact(LANES)).zip(dp.chunks_exact_mut(LANES));
    for ((x, dy), out) in &mut chunks {
        for l in 0..LANES {
            let (d, xhat) = one(x[l], dy[l]);
            out[l] = d;
            acc[l] += d;
            acc_x[l] += d * xhat;
        }
    }
    let done = x.len() / LANES * LANES;
    let (mut s, mut sx) = (acc.iter().sum::<f32>(), acc_x.iter().sum::<f32>());
    for i in done..x.len() {
        let (d, xhat) = one(x[i], dy[i]);
        dp[i] = d;
        s += d;
        sx += d * xhat;
    }
    (s, sx)
}
