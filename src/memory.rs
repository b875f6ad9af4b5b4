//! Device memory: predict a run's peak before it starts, and measure it while it runs.
//!
//! # The estimate
//! With `P` parameters, micro-batch `B`, and the layer shapes of [`crate::model::layer_plan`]:
//!
//! | term | bytes | why |
//! |---|---|---|
//! | parameters | `4 P` | f32 master weights |
//! | gradients | `4 P` with f32 checkpointing, else 0; `+ 4 P` with accumulation | the step's f32 gradients exist at the peak only when the peak is inside the backward pass (f32 checkpointing); the running sum of `grad_accum_steps > 1` lives all step |
//! | optimizer state | `8 P` | AdamW's two f32 moments |
//! | f16 weight copies | `2 P` in f16 | the casts the forward pass computes with |
//! | input batch | `4 B 3 H W` | f32 normalized images on the device |
//! | activations | `B x sum(out_elems x saved_bytes_per_elem)` per layer | what autodiff keeps for backward (below) |
//! | workspace | `1.1 x 4 B x largest layer output` with f32 checkpointing, else 0 | what the backward pass holds above the end of the forward pass: the segment recomputed from a kept convolution output ([`RECOMPUTE_TENSORS`]) |
//! | allocator | `SMALL_POOL_PAGE + pool_slack_pages x page_size`, the pages at most [`MAX_SLACK_WITHOUT_CHECKPOINTING`] without checkpointing | the pools' reserved pages beyond the bytes in use (below) |
//!
//! The sum of all terms but the allocator is the peak of bytes in use. Measured with a [`probe::MemoryProbe`] reading during whole steps (`vramfit bench memory
//! --fresh`, 12gb network at 224 px, batch 4-32): without checkpointing the peak in use *is* the
//! end of the forward pass (gradients are allocated as activations are freed), so neither the
//! step's gradients nor a workspace count (the plan's bytes in use there were within 1.3%, 0-9
//! MiB, of the measured peak in use on all eight cells, f32 and f16), unless the gradients
//! outweigh the activations (small images, many parameters: then they count); with f32 checkpointing it
//! sits above it by the parameter gradients plus 1.0-1.07
//! f32 tensors of the largest layer (142 -> 168 MiB at batch 8, 496 -> 582 MiB at batch 32), the
//! recomputed segment; with f16 checkpointing the recomputed segment is f16 and the rise stayed
//! at 1 MiB, so there too the peak is the end of the forward pass (within 1 MiB on all four
//! cells).
//!
//! What the pools reserve beyond the bytes in use (the allocator row) is [`pools`]' to say.
//!
//! # Saved bytes per element
//! Saved bytes per output element of a conv -> GroupNorm -> activation layer (`s` below) are what
//! burn 0.22's autodiff keeps for backward: the convolution's input, GroupNorm's centred input
//! and normalized values, the activation's input. Counting those tensors gives 16 bytes in f32;
//! burn shares one of them partly, and the measured value (bytes_in_use after forward, minus the
//! other terms, divided by the activation elements: `vramfit bench memory`, identical at every
//! batch and size of the grid) is 15.2. A residual add keeps its f32 operand (+4 bytes per
//! element of that layer) unless checkpointing recomputes it.
//!
//! | precision | checkpointing | s (bytes) | residual (bytes) | why |
//! |---|---|---|---|---|
//! | f32 | off | 15.2 | 4 | the four tensors above, one partly shared |
//! | f32, fused GroupNorm + GELU | off | 7.2 ([`FUSED_SAVED_BYTES_PER_ELEM`]) | 4 | the convolution's input and the fused op's input: vramfit's WGSL kernel recomputes the statistics in backward |
//! | f16 | off | 5.6 | 2 | three f16 tensors: conv input, GroupNorm's rescaled input `z`, activation input ([`crate::model::group_norm_f16`]) |
//! | f32 | on | 4.0 | 0 | only the convolution outputs (compute-bound ops) are kept |
//! | f16 | on | 3.95 | 0 | the f16 convolution outputs plus GroupNorm's small f32 statistics |
//!
//! Activation memory in f16 is 5.6 / 15.2 = 0.37 of f32's per layer with burn's ops (0.41 with
//! the residual terms, `vramfit bench memory`), 0.78 of f32's per layer with the fused op that
//! native builds run on a GPU (5.6 / 7.2; 0.75 measured with the residual terms; [`estimate`]
//! picks the row); with checkpointing both precisions keep
//! about 4 bytes.

use serde::{Deserialize, Serialize};

use crate::config::{Config, Precision};
use crate::model::{LayerKind, LayerShape, layer_plan, param_count};

pub mod pools;
pub use pools::*;

/// f32 tensors of the largest layer's size that the backward pass holds above the end of the
/// forward pass and the parameter gradients when checkpointing recomputes a segment in f32
/// (measured 1.0-1.07 at batch 4-32, 224 px; see "The estimate").
pub const RECOMPUTE_TENSORS: f64 = 1.1;

/// The predicted peak, term by term (bytes).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryEstimate {
    /// f32 parameters.
    pub parameters: u64,
    /// Gradient bytes live at the peak: the accumulation buffer (`4 P` when
    /// `grad_accum_steps > 1`), plus the step's own gradients (`4 P`) only where the peak sits
    /// inside the backward pass (f32 checkpointing); elsewhere the peak is the end of the forward
    /// pass, before any gradient exists.
    pub gradients: u64,
    /// AdamW moments.
    pub optimizer_state: u64,
    /// f16 copies of the weights (0 in f32).
    pub weight_casts: u64,
    /// The input batch.
    pub input_batch: u64,
    /// Activations kept for backward, per stage (index 0 = stem; the head is last).
    pub activations_per_stage: Vec<u64>,
    /// What the backward pass holds above the end of the forward pass and the parameter
    /// gradients: the recomputed segment with f32 checkpointing, else 0.
    pub workspace: u64,
    /// Reserved bytes beyond the peak in use: one small-pool page plus
    /// [`pool_slack_pages`] pages of [`page_size`] (at most [`MAX_SLACK_WITHOUT_CHECKPOINTING`]
    /// without checkpointing); with exclusive pages (a browser) the peak in use times
    /// [`exclusive_pages_factor`] minus one ([`PoolLayout`]).
    pub allocator_overhead: u64,
    /// The pages counted in `allocator_overhead` ([`pool_slack_pages`]; 0 with exclusive pages).
    pub pool_slack_pages: f64,
    /// The pools' page size for this run: [`page_size`] of `largest_allocation` (f32 in either
    /// precision; see `pools`).
    pub page_size: u64,
    /// Bytes in use at the peak (the end of the forward pass, or inside the backward pass with
    /// f32 checkpointing): every term but the allocator's.
    pub peak_in_use: u64,
    /// Bytes held by live tensors at the end of the forward pass (parameters, AdamW state, the
    /// accumulation buffer, f16 casts, input and saved activations): what `bytes_in_use`
    /// sampled there measures, the lower bracket of the peak (see `shared/MEASURING.md`).
    pub in_use_after_forward: u64,
    /// The predicted peak of bytes reserved on the device (`peak_in_use + allocator_overhead`),
    /// compared with the budget.
    pub total: u64,
    /// Bytes of the largest single tensor (checked against the adapter's buffer limit).
    pub largest_tensor: u64,
    /// Bytes of the largest allocation a step makes in the pools: `largest_tensor` or, where
    /// larger, the f32 gradient of the largest weight; it sets [`page_size`], and
    /// [`crate::device::size_the_pools`] sizes the pages with it before the steady steps.
    #[serde(default)]
    pub largest_allocation: u64,
}

impl MemoryEstimate {
    /// Sum of the activation terms.
    pub fn activations(&self) -> u64 {
        self.activations_per_stage.iter().sum()
    }
}

/// Bytes autodiff keeps per output element of one conv-norm-act layer, and per element of a
/// residual add (see the module docs for where they come from). `fused_group_norm_gelu`: the
/// layer's GroupNorm + GELU is vramfit's fused op ([`crate::kernels::group_norm_gelu`]), which keeps only
/// its input; it changes the f32 row without checkpointing.
pub fn saved_bytes_per_elem(precision: Precision, checkpointing: bool, fused_group_norm_gelu: bool) -> (f64, f64) {
    match (precision, checkpointing) {
        (Precision::F32, false) if fused_group_norm_gelu => (FUSED_SAVED_BYTES_PER_ELEM, 4.0),
        (Precision::F32, false) => (15.2, 4.0),
        (Precision::F16, false) => (5.6, 2.0),
        (Precision::F32, true) => (4.0, 0.0),
        (Precision::F16, true) => (3.95, 0.0),
    }
}

/// f32 bytes kept per output element of a conv -> fused GroupNorm + GELU layer without
/// checkpointing: the convolution's input and the fused op's input, nominally 8, measured 7.14
/// (`VRAMFIT_GROUP_NORM_GELU=fused vramfit bench memory --grid tiny --fresh --steps 1` on
/// lavapipe: 18.0 MiB of activations at the end of the forward pass against 36.5 MiB with burn's
/// ops, 2026-12-03), rounded up.
pub const FUSED_SAVED_BYTES_PER_ELEM: f64 = 7.2;

/// Predicts the peak device memory of a training step of `config` with micro-batch
/// `batch_size` and `num_classes` classes on a GPU, with the GroupNorm + GELU kernels this build
/// runs there ([`crate::kernels::group_norm_gelu::runs_fused_on_gpu`]). See the module docs for the
/// formula.
pub fn estimate(config: &Config, batch_size: usize, num_classes: usize) -> MemoryEstimate {
    estimate_with(config, batch_size, num_classes, crate::kernels::group_norm_gelu::runs_fused_on_gpu())
}

/// [`estimate`] with the GroupNorm + GELU kernels named: `fused_group_norm_gelu` for vramfit's
/// fused op (f32 GELU layers only), `false` for burn's ops; the pools are this build's
/// ([`PoolLayout::this_build`]).
pub fn estimate_with(
    config: &Config,
    batch_size: usize,
    num_classes: usize,
    fused_group_norm_gelu: bool,
) -> MemoryEstimate {
    estimate_for_pools(config, batch_size, num_classes, fused_group_norm_gelu, PoolLayout::this_build())
}

/// [`estimate_with`] for pools laid out as `pools`: the bytes in use are the same; the
/// reserved bytes beyond them follow the layout ([`PoolLayout`]).
pub fn estimate_for_pools(
    config: &Config,
    batch_size: usize,
    num_classes: usize,
    fused_group_norm_gelu: bool,
    pools: PoolLayout,
) -> MemoryEstimate {
    estimate_terms(config, batch_size, num_classes, fused_group_norm_gelu, pools, true)
}

/// The estimate of one device of a data-parallel run ([`crate::train::TrainRequest::replicas`]),
/// for each of `devices` devices (index 0 the main one): a step's `grad_accum_steps`
/// micro-batches are dealt round robin, so device `d` runs `m / n` of them, plus one when
/// `d < m mod n`. Every device holds the weights (a replica a copy taken each step), its
/// gradients and one micro-batch's activations, and the accumulation buffer (4 bytes per
/// parameter) where it runs more than one micro-batch; the main device, which also receives
/// the replicas' gradients, is planned with the buffer whatever it runs, as one device
/// accumulating two micro-batches. Only the main device holds the AdamW moments. A device
/// dealt no micro-batch (more devices than micro-batches) holds nothing. Derived from the
/// one-device estimate, whose terms are measured; not measured on two cards (none here).
pub fn data_parallel_estimates(config: &Config, num_classes: usize, devices: usize) -> Vec<MemoryEstimate> {
    let (m, n) = (config.train.grad_accum_steps.max(1), devices.max(1));
    let fused = crate::kernels::group_norm_gelu::runs_fused_on_gpu();
    (0..n)
        .map(|d| {
            let mut c = config.clone();
            c.train.grad_accum_steps = m / n + usize::from(d < m % n);
            if c.train.grad_accum_steps == 0 {
                return MemoryEstimate::default();
            }
            if d == 0 && n > 1 {
                c.train.grad_accum_steps = c.train.grad_accum_steps.max(2);
            }
            estimate_terms(&c, config.train.batch_size, num_classes, fused, PoolLayout::this_build(), d == 0)
        })
        .collect()
}

/// [`estimate_for_pools`], with the AdamW moments counted when `holds_optimizer`.
fn estimate_terms(
    config: &Config,
    batch_size: usize,
    num_classes: usize,
    fused_group_norm_gelu: bool,
    pools: PoolLayout,
    holds_optimizer: bool,
) -> MemoryEstimate {
    let px = config.image_size_px();
    let plan = layer_plan(&config.model, num_classes, (px, px));
    let p = param_count(&plan) as u64;
    let b = batch_size as u64;
    let precision = config.train.precision;
    let fused = fused_group_norm_gelu && config.model.activation == crate::config::Activation::Gelu;
    let (per_elem, per_residual_elem) = saved_bytes_per_elem(precision, config.train.checkpointing, fused);
    let (activations_per_stage, largest_out) =
        activations_per_stage(&plan, config.model.stages.len() + 2, b, per_elem, per_residual_elem);
    let input_batch = b * 3 * (px * px) as u64 * 4;
    let parameters = 4 * p;
    let accumulation_buffer = if config.train.grad_accum_steps > 1 { 4 * p } else { 0 };
    let optimizer_state = if holds_optimizer { 8 * p } else { 0 };
    let weight_casts = if precision == Precision::F16 { 2 * p } else { 0 };
    let largest_tensor = (4 * b * largest_out).max(input_batch);
    let workspace = if config.train.checkpointing && precision == Precision::F32 {
        (RECOMPUTE_TENSORS * (4 * b * largest_out) as f64) as u64
    } else {
        0
    };
    let activations: u64 = activations_per_stage.iter().sum();
    let in_use_after_forward =
        parameters + optimizer_state + accumulation_buffer + weight_casts + input_batch + activations;
    // The peak sits inside the backward pass, with the parameter gradients allocated, only when
    // f32 checkpointing recomputes a segment; otherwise it is the end of the forward pass.
    // The gradients also count where they outweigh the activations the backward pass frees for
    // them (small images, many parameters): then the peak is at the end of the backward pass,
    // which this counts with the activations still in, on the safe side.
    let peak_in_backward = (config.train.checkpointing && precision == Precision::F32) || activations < 4 * p;
    let gradients = if peak_in_backward { accumulation_buffer + 4 * p } else { accumulation_buffer };
    let peak_in_use = in_use_after_forward + (gradients - accumulation_buffer) + workspace;
    // The largest allocation the pools serve is f32 in either precision (an f32 activation or
    // its gradient, the f32 input batch), or a parameter-sized tensor (a gradient or update of
    // the largest weight) where that is larger: measured as the adaptive pool's `largest_alloc`
    // on all 48 cells of `bench memory --random 48 --seed 49` (lavapipe, 2026-12-07).
    let largest_weight = 4 * plan.iter().map(LayerShape::largest_weight_elems).max().unwrap_or(0) as u64;
    let largest_allocation = largest_tensor.max(largest_weight);
    let page_size = page_size(largest_allocation);
    let (allocator_overhead, slack_pages) =
        allocator_overhead(pools, page_size, peak_in_use, precision, config.train.checkpointing);
    MemoryEstimate {
        in_use_after_forward,
        parameters,
        gradients,
        optimizer_state,
        weight_casts,
        input_batch,
        activations_per_stage,
        workspace,
        allocator_overhead,
        pool_slack_pages: slack_pages,
        page_size,
        peak_in_use,
        total: peak_in_use + allocator_overhead,
        largest_tensor,
        largest_allocation,
    }
}

/// The bytes each stage keeps for the backward pass (`stages` entries: stem, the stages, the
/// head) for a micro-batch of `b`, at `per_elem` bytes per output element (and
/// `per_residual_elem` more for a residual block's input), the head's logits and their softmax
/// in f32; and the largest layer output in elements for one image.
fn activations_per_stage(
    plan: &[LayerShape],
    stages: usize,
    b: u64,
    per_elem: f64,
    per_residual_elem: f64,
) -> (Vec<u64>, u64) {
    let mut per_stage = vec![0u64; stages];
    let mut largest_out = 0u64;
    for layer in plan {
        let elems = layer.out_elems() as u64;
        largest_out = largest_out.max(elems);
        let bytes = match layer.kind {
            LayerKind::Head => b * (layer.in_channels as u64 + 3 * layer.out_channels as u64) * 4,
            _ => {
                let residual = if layer.residual { elems as f64 * per_residual_elem } else { 0.0 };
                (b as f64 * (elems as f64 * per_elem + residual)) as u64
            }
        };
        per_stage[layer.stage] += bytes;
    }
    (per_stage, largest_out)
}

/// Bytes of the largest tensor one image of `image_hw` pixels makes in an f32 forward pass
/// (no autodiff): the input `[1, 3, H, W]` or the largest layer output, 4 bytes per element.
/// A batch of `n` such images needs `n` times this in one buffer, which must fit the adapter's
/// buffer limit ([`crate::device::SelectedDevice::buffer_limit`]).
pub fn inference_bytes_per_image(
    model: &crate::config::ModelConfig,
    num_classes: usize,
    image_hw: (usize, usize),
) -> u64 {
    let input = 3 * (image_hw.0 * image_hw.1) as u64;
    let largest = layer_plan(model, num_classes, image_hw).iter().map(|l| l.out_elems() as u64).max().unwrap_or(0);
    4 * input.max(largest)
}

/// How many images of `bytes_per_image` fit one buffer of `limit` bytes (0 when not even one
/// does); unbounded (`usize::MAX`) without a limit.
pub fn images_per_buffer(limit: Option<u64>, bytes_per_image: u64) -> usize {
    limit.map_or(usize::MAX, |l| usize::try_from(l / bytes_per_image.max(1)).unwrap_or(usize::MAX))
}

/// Checks that one micro-batch's largest tensor (the input or a layer output,
/// [`inference_bytes_per_image`] of `image_hw` = (height, width) in pixels, x `batch_size`)
/// fits one buffer of `limit` bytes, the adapter's
/// buffer limit ([`crate::device::SelectedDevice::buffer_limit`]; a browser's WebGPU gives
/// 128 MiB storage bindings unless the page asks for more). Training, where the same tensors
/// exist, checks this before allocating anything.
///
/// # Errors
/// [`crate::Error::Memory`] naming the tensor's size, `device_name`'s limit and the fix: the
/// largest batch that fits, or (when not even one image does) a smaller crop or the CPU.
pub fn check_buffer_limit(
    model: &crate::config::ModelConfig,
    num_classes: usize,
    image_hw: (usize, usize),
    batch_size: usize,
    limit: u64,
    device_name: &str,
) -> crate::Result<()> {
    let per_image = inference_bytes_per_image(model, num_classes, image_hw);
    let largest = per_image * batch_size as u64;
    if largest <= limit {
        return Ok(());
    }
    let fitting_batch = images_per_buffer(Some(limit), per_image);
    // Never circular: when even one image does not fit, a smaller batch is no answer.
    let fix = if fitting_batch == 0 {
        "even one image does not fit: lower data.preprocess.crop_size (or use mode resize_and_crop for \
         large images), or train on the CPU (--device cpu)"
            .to_string()
    } else {
        format!(
            "use train.batch_size <= {fitting_batch} (with grad_accum_steps to keep the effective batch) or a \
             smaller crop_size"
        )
    };
    Err(crate::Error::Memory(format!(
        "the largest tensor of a step is {} but {device_name} allows {} per buffer; {fix}",
        human_bytes(largest),
        human_bytes(limit),
    )))
}

/// Verdict of an estimate against a budget.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The estimate at the configured batch size.
    pub estimate: MemoryEstimate,
    /// The budget in bytes.
    pub budget_bytes: u64,
    /// Whether the estimate fits.
    pub fits: bool,
    /// Largest micro-batch that fits without accumulation (0 if not even 1 does), within
    /// [`fit_budget`]: the budget less the plan's measured shortfall.
    pub max_batch_size: usize,
    /// The micro-batch to train with so that the configured effective batch
    /// (`batch_size x grad_accum_steps`) fits within [`fit_budget`] (the margin of the plan's
    /// error band kept): the effective batch itself when it fits, else the
    /// largest divisor of it that fits, so the product is exactly the effective batch (0 if not
    /// even 1 fits). Only when every divisor is under half the largest fitting micro-batch (an
    /// effective batch with no suitable divisor, e.g. a prime) is the split
    /// `ceil(effective / fit_grad_accum_steps)`, whose product exceeds it by less than one
    /// micro-batch.
    pub fit_batch_size: usize,
    /// Accumulation steps that go with `fit_batch_size`.
    pub fit_grad_accum_steps: usize,
}

/// Estimates `config` against its budget (`fits`), and finds the largest micro-batch and the
/// (micro-batch, accumulation) pair that keeps the configured effective batch within
/// [`fit_budget`] (the budget less the plan's measured shortfall: a batch the plan chooses keeps
/// that margin; one the user chose is only checked against the budget).
/// Accumulating costs one more f32 copy of the gradients, which the pair's search counts.
pub fn plan(config: &Config, num_classes: usize) -> Plan {
    let budget = config.memory.memory_budget_bytes;
    let estimate = estimate(config, config.train.batch_size, num_classes);
    let with_accum = |accum: usize| {
        let mut c = config.clone();
        c.train.grad_accum_steps = accum;
        c
    };
    let (single, accumulating) = (with_accum(1), with_accum(2));
    let kept = fit_budget(budget, PoolLayout::this_build());
    let max_batch_size = largest_fitting(|b| estimate_total(&single, b, num_classes) <= kept);
    let effective = config.train.batch_size * config.train.grad_accum_steps;
    let (fit_batch_size, fit_grad_accum_steps) = if max_batch_size >= effective {
        (effective, 1)
    } else {
        match largest_fitting(|b| estimate_total(&accumulating, b, num_classes) <= kept) {
            0 => (0, 0),
            micro => match (1..=micro.min(effective)).rev().find(|d| effective.is_multiple_of(*d)) {
                Some(d) if 2 * d >= micro => (d, effective / d),
                _ => {
                    let accum = effective.div_ceil(micro.min(effective));
                    (effective.div_ceil(accum), accum)
                }
            },
        }
    };
    Plan {
        fits: estimate.total <= budget,
        estimate,
        budget_bytes: budget,
        max_batch_size,
        fit_batch_size,
        fit_grad_accum_steps,
    }
}

/// The part of `budget` (bytes) a plan may fill when the batch is chosen for it (`--auto-fit`,
/// the largest fitting batch): the budget less the plan's largest measured shortfall under
/// `layout` ([`PoolLayout::error_band`]'s low end: 4.9% on the adaptive pools), so a batch chosen
/// to fit still fits where the plan was furthest under the measured reserved peak.
pub fn fit_budget(budget: u64, layout: PoolLayout) -> u64 {
    (budget as f64 * (1.0 - fit_margin_percent(layout) / 100.0)) as u64
}

/// The margin [`fit_budget`] keeps under `layout`, in percent of the budget: the plan's largest
/// measured shortfall ([`PoolLayout::error_band`]'s low end, 0 where the plan was never under).
pub fn fit_margin_percent(layout: PoolLayout) -> f64 {
    -layout.error_band().low_percent.min(0.0)
}

/// The largest batch in 1..=65536 for which `fits` holds (0 if none); `fits` must be monotonic
/// (the estimate grows with the batch): doubling, then binary search.
fn largest_fitting(fits: impl Fn(usize) -> bool) -> usize {
    if !fits(1) {
        return 0;
    }
    let mut lo = 1usize;
    while lo < 65536 && fits(lo * 2) {
        lo *= 2;
    }
    let mut high = (lo * 2).min(65537);
    while lo + 1 < high {
        let mid = (lo + high) / 2;
        if fits(mid) { lo = mid } else { high = mid }
    }
    lo
}

fn estimate_total(config: &Config, batch_size: usize, num_classes: usize) -> u64 {
    estimate(config, batch_size, num_classes).total
}

/// `1.2 GiB`, `310 MiB`, `512 B`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64;
    let mut unit = "B";
    for u in UNITS {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    if v >= 100.0 { format!("{v:.0} {unit}") } else { format!("{v:.1} {unit}") }
}

impl Plan {
    /// "fits, 1.2 GiB spare" / "does not fit by 310 MiB".
    pub fn verdict(&self) -> String {
        if self.fits {
            format!("fits, {} spare", human_bytes(self.budget_bytes - self.estimate.total))
        } else {
            format!("does not fit by {}", human_bytes(self.estimate.total - self.budget_bytes))
        }
    }
}

pub mod probe;

#[cfg(test)]
mod tests;
