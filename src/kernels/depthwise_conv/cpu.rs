//! The depthwise 3x3 convolution on the CPU: each plane as stride x stride phase planes, nine
//! shifted flat views summed in one vectorized pass ([`forward`]), the gradients on the same
//! phases ([`backward`]), and the convolution fused with its GroupNorm + GELU
//! ([`forward_group_norm_gelu`]). [`super`] wraps them as burn ops.

use rayon::prelude::*;

use crate::kernels::gelu::{VectorKernel, VectorUnit, madd, run_on, vector_unit};
use crate::kernels::group_norm_gelu::cpu::{Groups, forward_group_in_place};

/// Sizes of one convolution and of its phase planes.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    /// Samples, `B`.
    pub batch: usize,
    /// Channels, `C`.
    pub channels: usize,
    /// Input height and width.
    pub in_hw: (usize, usize),
    /// Output height and width, `(H - 1) / s + 1` each (kernel 3, padding 1).
    pub out_hw: (usize, usize),
    /// Stride `s`, 1 or 2.
    pub stride: usize,
    /// Phase plane width, `ceil((W + 2) / s)`.
    wp: usize,
    /// Elements per phase plane: `ceil((H + 2) / s) + 1` rows of `wp` (one spare row for the
    /// flat reads past the last kept column) and [`LANES`] more (for the reads of the wide
    /// accumulator's padding, [`Geometry::wide_len`]).
    phase_len: usize,
}

impl Geometry {
    /// # Panics
    /// If `dims` is not 4-D (the caller passes `[B, C, H, W]` tensors).
    pub fn of(dims: &[usize], stride: usize) -> Self {
        let [batch, channels, h, w] = dims.try_into().expect("depthwise_conv3x3 takes [B, C, H, W]");
        let wp = (w + 2).div_ceil(stride);
        let phase_len = ((h + 2).div_ceil(stride) + 1) * wp + LANES;
        let out_hw = ((h - 1) / stride + 1, (w - 1) / stride + 1);
        Self { batch, channels, in_hw: (h, w), out_hw, stride, wp, phase_len }
    }

    /// `[B, C, H', W']`.
    pub fn out_dims(&self) -> [usize; 4] {
        [self.batch, self.channels, self.out_hw.0, self.out_hw.1]
    }

    /// Planes per parallel task: enough work that rayon's scheduling stays small against it.
    fn planes_per_task(&self) -> usize {
        (8 * 1024usize).div_ceil((self.in_hw.0 * self.in_hw.1).max(1)).max(1)
    }

    /// Accumulator length: `H'` rows of `wp`, rounded up to whole [`LANES`] so that every flat
    /// loop runs in whole vectors (a 7x7 plane's 63 outputs had run 7 of them one lane at a
    /// time). The padding's outputs are discarded, and in the backward pass `dy` is zero there.
    fn wide_len(&self) -> usize {
        (self.out_hw.0 * self.wp).next_multiple_of(LANES)
    }

    /// `(phase, flat offset into it)` for kernel position `(kh, kw)` at stride `S`: phase
    /// `(kh % S, kw % S)`. `S` is a constant so that these are shifts, not divisions (a 4x4
    /// plane's integer divisions had cost more than its convolution).
    fn tap<const S: usize>(&self, kh: usize, kw: usize) -> (usize, usize) {
        ((kh % S) * S + kw % S, (kh / S) * self.wp + kw / S)
    }
}

/// The convolution of contiguous `x` (`[B, C, H, W]`) with `weight` (`[C, 1, 3, 3]`).
pub fn forward(geom: &Geometry, x: &[f32], weight: &[f32]) -> Vec<f32> {
    let (h, w) = geom.in_hw;
    let (oh, ow) = geom.out_hw;
    let mut out = vec![0f32; geom.batch * geom.channels * oh * ow];
    if out.is_empty() {
        return out;
    }
    let unit = vector_unit();
    out.par_chunks_mut(oh * ow)
        .zip(x.par_chunks(h * w))
        .enumerate()
        .with_min_len(geom.planes_per_task())
        .for_each_init(Scratch::default, |scratch, (i, (out, x))| {
            let c = i % geom.channels;
            dispatch(unit, Plane::Forward { x, weight: &weight[c * 9..c * 9 + 9], out }, geom, scratch);
        });
    out
}

/// `gelu(group_norm(forward(x, weight)))` with `norm`'s groups (over the output's dims) and
/// `(γ, β)` (`[C]` each): one task per run of (sample, group)s, each group's planes convolved
/// and then normalized in place ([`crate::kernels::group_norm_gelu::cpu::forward_group_in_place`])
/// while they are in cache.
pub fn forward_group_norm_gelu(
    geom: &Geometry,
    x: &[f32],
    weight: &[f32],
    norm: (&Groups, (&[f32], &[f32])),
) -> Vec<f32> {
    let (groups, (gamma, beta)) = norm;
    let (h, w) = geom.in_hw;
    let (oh, ow) = geom.out_hw;
    let mut out = vec![0f32; geom.batch * geom.channels * oh * ow];
    if out.is_empty() {
        return out;
    }
    let cpg = groups.channels_per_group();
    let unit = vector_unit();
    out.par_chunks_mut(cpg * oh * ow)
        .zip(x.par_chunks(cpg * h * w))
        .enumerate()
        .with_min_len(groups.groups_per_task())
        .for_each_init(Scratch::default, |scratch, (g, (out, x))| {
            let first = (g % groups.groups) * cpg;
            forward_group_norm_gelu_channels(unit, geom, groups, first, x, weight, (gamma, beta), out, scratch);
        });
    out
}

/// [`forward_group_norm_gelu`] for whole groups of one sample, channels `first..` of it: `x`
/// holds their `H x W` input planes and `out` their `H' x W'` outputs (the same number of
/// planes, a multiple of the channels per group, `first` the first channel of a group);
/// `weight`, `gamma` and `beta` are the full tensors' (`[C, 1, 3, 3]`, `[C]`, `[C]`). Each group
/// is convolved and then normalized while in cache. [`crate::model::fused_block`] calls it per sample.
#[allow(clippy::too_many_arguments)] // the fused op's operands, and the task's unit and scratch
pub(crate) fn forward_group_norm_gelu_channels(
    unit: VectorUnit,
    geom: &Geometry,
    groups: &Groups,
    first: usize,
    x: &[f32],
    weight: &[f32],
    (gamma, beta): (&[f32], &[f32]),
    out: &mut [f32],
    scratch: &mut Scratch,
) {
    let (h, w) = geom.in_hw;
    let (oh, ow) = geom.out_hw;
    let cpg = groups.channels_per_group();
    for (g, (out, x)) in out.chunks_exact_mut(cpg * oh * ow).zip(x.chunks_exact(cpg * h * w)).enumerate() {
        let first = first + g * cpg;
        for (k, (out, x)) in out.chunks_exact_mut(oh * ow).zip(x.chunks_exact(h * w)).enumerate() {
            let c = first + k;
            dispatch(unit, Plane::Forward { x, weight: &weight[c * 9..c * 9 + 9], out }, geom, scratch);
        }
        let params = (&gamma[first..first + cpg], &beta[first..first + cpg]);
        forward_group_in_place(unit, out, params, oh * ow, groups.epsilon);
    }
}

/// `(dx, dweight)` of `sum(forward(x, weight) * grad)`.
pub fn backward(geom: &Geometry, x: &[f32], weight: &[f32], grad: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let (h, w) = geom.in_hw;
    let (oh, ow) = geom.out_hw;
    let mut dx = vec![0f32; x.len()];
    let mut dw_per_plane = vec![0f32; geom.batch * geom.channels * 9];
    if !dx.is_empty() && oh * ow > 0 {
        let unit = vector_unit();
        dx.par_chunks_mut(h * w)
            .zip(dw_per_plane.par_chunks_mut(9))
            .zip(x.par_chunks(h * w).zip(grad.par_chunks(oh * ow)))
            .enumerate()
            .with_min_len(geom.planes_per_task())
            .for_each_init(Scratch::default, |scratch, (i, ((dx, dw), (x, dy)))| {
                let c = i % geom.channels;
                let plane = Plane::Backward { x, dy, weight: &weight[c * 9..c * 9 + 9], dx, dw };
                dispatch(unit, plane, geom, scratch);
            });
    }
    let mut dw = vec![0f32; geom.channels * 9];
    for (i, partial) in dw_per_plane.chunks_exact(9).enumerate() {
        let c = i % geom.channels;
        for (d, p) in dw[c * 9..c * 9 + 9].iter_mut().zip(partial) {
            *d += p;
        }
    }
    (dx, dw)
}

/// Elements per step of the flat loops: two AVX2 vectors or one AVX-512 vector, kept in
/// registers as independent sums.
pub(super) const LANES: usize = 16;

/// One (sample, channel) plane's work.
pub(super) enum Plane<'a> {
    /// `out` (`H' x W'`) = the convolution of `x` (`H x W`) with `weight` (9).
    Forward { x: &'a [f32], weight: &'a [f32], out: &'a mut [f32] },
    /// `dx` (`H x W`) and this plane's share of `dw` (9) for `dy` (`H' x W'`).
    Backward { x: &'a [f32], dy: &'a [f32], weight: &'a [f32], dx: &'a mut [f32], dw: &'a mut [f32] },
}

/// Per-task buffers (one convolution's geometry): phase planes and the wide accumulator.
#[derive(Default)]
pub(crate) struct Scratch {
    phases: Vec<f32>,
    wide: Vec<f32>,
    /// `(H, W, stride)` of the planes `phases` was last split for, while it is zero wherever
    /// [`split_into_phases`] does not write (its padding): the next plane of the same geometry
    /// then needs only its own values written. `None` after anything else wrote the padding.
    zero_padding_for: Option<(usize, usize, usize)>,
}

/// One plane, compiled for `unit`.
pub(super) fn dispatch(unit: VectorUnit, plane: Plane<'_>, geom: &Geometry, scratch: &mut Scratch) {
    run_on(unit, PlaneTask { plane, geom, scratch });
}

/// One plane with its task's geometry and scratch, for [`run_on`].
struct PlaneTask<'a, 'p> {
    plane: Plane<'p>,
    geom: &'a Geometry,
    scratch: &'a mut Scratch,
}

impl VectorKernel for PlaneTask<'_, '_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        let (geom, scratch) = (self.geom, self.scratch);
        match (self.plane, geom.stride) {
            (Plane::Forward { x, weight, out }, 1) => forward_plane::<FMA, 1>(x, weight, out, geom, scratch),
            (Plane::Forward { x, weight, out }, _) => forward_plane::<FMA, 2>(x, weight, out, geom, scratch),
            (Plane::Backward { x, dy, weight, dx, dw }, 1) => {
                backward_plane::<FMA, 1>(x, dy, weight, dx, dw, geom, scratch)
            }
            (Plane::Backward { x, dy, weight, dx, dw }, _) => {
                backward_plane::<FMA, 2>(x, dy, weight, dx, dw, geom, scratch)
            }
        }
    }
}

/// Fills `scratch.phases` (`s²` planes of `phase_len`, zero in their padding) from the `H x W`
/// plane `x`.
#[inline(always)]
pub(super) fn split_into_phases<const S: usize>(x: &[f32], geom: &Geometry, scratch: &mut Scratch) {
    let (s, wp, len) = (S, geom.wp, geom.phase_len);
    let (h, w) = geom.in_hw;
    let phases = &mut scratch.phases;
    if scratch.zero_padding_for != Some((h, w, s)) {
        phases.clear();
        phases.resize(s * s * len, 0.0);
        scratch.zero_padding_for = Some((h, w, s));
    }
    for (ih, row) in x.chunks_exact(w).take(h).enumerate() {
        let ph = ih + 1;
        let base = (ph % s) * s * len + (ph / s) * wp;
        if s == 1 {
            phases[base + 1..base + 1 + w].copy_from_slice(row);
        } else {
            // Padded column pw = iw + 1 goes to phase b = pw % 2 at pw / 2: even iw = 2j to
            // phase 1 at j, odd iw = 2j + 1 to phase 0 at j + 1 (two branch-free loops; one
            // loop choosing the phase per element went scalar).
            let odd = &mut phases[base + len..][..w.div_ceil(2)];
            for (d, &v) in odd.iter_mut().zip(row.iter().step_by(2)) {
                *d = v;
            }
            let even = &mut phases[base + 1..][..w / 2];
            for (d, &v) in even.iter_mut().zip(row.iter().skip(1).step_by(2)) {
                *d = v;
            }
        }
    }
}

/// Reads the `H x W` plane back out of phase planes laid out as [`split_into_phases`] writes.
#[inline(always)]
pub(super) fn merge_from_phases<const S: usize>(phases: &[f32], geom: &Geometry, x: &mut [f32]) {
    let (s, wp, len) = (S, geom.wp, geom.phase_len);
    let w = geom.in_hw.1;
    for (ih, row) in x.chunks_exact_mut(w).enumerate() {
        let ph = ih + 1;
        let base = (ph % s) * s * len + (ph / s) * wp;
        if s == 1 {
            row.copy_from_slice(&phases[base + 1..base + 1 + w]);
        } else {
            for (iw, v) in row.iter_mut().enumerate() {
                let pw = iw + 1;
                *v = phases[base + (pw % 2) * len + pw / 2];
            }
        }
    }
}

#[inline(always)]
pub(super) fn forward_plane<const FMA: bool, const S: usize>(
    x: &[f32],
    weight: &[f32],
    out: &mut [f32],
    geom: &Geometry,
    scratch: &mut Scratch,
) {
    split_into_phases::<S>(x, geom, scratch);
    let n = geom.wide_len();
    scratch.wide.resize(n, 0.0); // every element is written below
    // The nine shifted views, each exactly n long, summed in one pass: one store per output.
    let tap = |k: usize| {
        let (phase, offset) = geom.tap::<S>(k / 3, k % 3);
        &scratch.phases[phase * geom.phase_len + offset..][..n]
    };
    let taps: [&[f32]; 9] = std::array::from_fn(tap);
    let w: [f32; 9] = std::array::from_fn(|k| weight[k]);
    for (i, o) in scratch.wide.chunks_exact_mut(LANES).enumerate() {
        let mut acc = [0f32; LANES];
        for k in 0..9 {
            let t: &[f32; LANES] = taps[k][i * LANES..][..LANES].try_into().expect("n is whole LANES");
            for l in 0..LANES {
                acc[l] = madd::<FMA>(w[k], t[l], acc[l]);
            }
        }
        o.copy_from_slice(&acc);
    }
    let ow = geom.out_hw.1;
    for (row, wide) in out.chunks_exact_mut(ow).zip(scratch.wide.chunks_exact(geom.wp)) {
        row.copy_from_slice(&wide[..ow]);
    }
}

#[inline(always)]
pub(super) fn backward_plane<const FMA: bool, const S: usize>(
    x: &[f32],
    dy: &[f32],
    weight: &[f32],
    dx: &mut [f32],
    dw: &mut [f32],
    geom: &Geometry,
    scratch: &mut Scratch,
) {
    let (n, ow) = (geom.wide_len(), geom.out_hw.1);
    // dy with zeroed extra columns, Wp wide.
    scratch.wide.clear();
    scratch.wide.resize(n, 0.0);
    for (wide, row) in scratch.wide.chunks_exact_mut(geom.wp).zip(dy.chunks_exact(ow)) {
        wide[..ow].copy_from_slice(row);
    }
    // Weight gradient: dw[k] = Σ dy_wide · phase, shifted.
    split_into_phases::<S>(x, geom, scratch);
    for kh in 0..3 {
        for kw in 0..3 {
            let (phase, offset) = geom.tap::<S>(kh, kw);
            let src = &scratch.phases[phase * geom.phase_len + offset..][..n];
            dw[kh * 3 + kw] = dot::<FMA>(&scratch.wide, src);
        }
    }
    if S == 1 {
        // Input gradient at stride 1: the same convolution of `dy` with the kernel turned by
        // 180 degrees (`dx[i] = Σ_k w[k] dy_pad[i + 2 - k]`), one gathering pass like the
        // forward's; the phases' padding is still zero, so no plane is cleared.
        let turned: [f32; 9] = std::array::from_fn(|k| weight[8 - k]);
        forward_plane::<FMA, 1>(dy, &turned, dx, geom, scratch);
        return;
    }
    // Input gradient at stride 2: scatter w dy_wide into zeroed phases, then unpad.
    scratch.phases.iter_mut().for_each(|v| *v = 0.0);
    scratch.zero_padding_for = None; // the scatter below writes the padding too
    for kh in 0..3 {
        for kw in 0..3 {
            let (phase, offset) = geom.tap::<S>(kh, kw);
            let dst = &mut scratch.phases[phase * geom.phase_len + offset..][..n];
            let wv = weight[kh * 3 + kw];
            for (d, g) in dst.chunks_exact_mut(LANES).zip(scratch.wide.chunks_exact(LANES)) {
                for l in 0..LANES {
                    d[l] = madd::<FMA>(wv, g[l], d[l]);
                }
            }
        }
    }
    merge_from_phases::<S>(&scratch.phases, geom, dx);
}

/// `Σ a_i b_i` in [`LANES`] independent partial sums (so the compiler vectorizes it).
#[inline(always)]
pub(super) fn dot<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] = madd::<FMA>(x[l], y[l], acc[l]);
        }
    }
    acc.iter().sum::<f32>() + tail
}
