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
//! The sum of all terms but the allocator is the peak of bytes in use. Measured with a [`MemoryProbe`] reading during whole steps (`vramfit bench memory
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
//! # Page rounding
//! What a card runs out of is reserved bytes. cubecl 0.11's default `Adaptive` memory
//! (`cubecl-server/src/memory_management/dynamic/`) serves allocations up to 64 KiB from one
//! sliced pool of 8 MiB pages ([`SMALL_POOL_PAGE`]), and carves everything larger from pages
//! sized to the largest allocation served so far plus 1 MiB, rounded up to the MiB
//! ([`page_size`]). Freed slices leave holes that a later, larger tensor cannot use, so the pools
//! hold some partly used pages beyond the bytes in use. Measured over `vramfit bench memory -c
//! 12gb --grid tiers --fresh` on lavapipe (`reserved - peak in use`, steady steps, 224 px,
//! batch 4-32), that slack is 8 MiB plus, in pages of the largest tensor of the run's precision:
//!
//! | precision | checkpointing | slack pages measured | [`pool_slack_pages`] |
//! |---|---|---|---|
//! | f32 | off | 3.2, 4.2, 2.0, 1.1 at batch 4, 8, 16, 32 (35, 84, 75, 84 MiB) | 3.25, at most 96 MiB |
//! | f16 | off | 1.6, 3.2, 4.1, 1.1 (10, 35, 82, 41 MiB) | 3.25, at most 96 MiB |
//! | f32 | on | 4.5, 3.9, 3.1, 3.3 (recomputed segments free and re-allocate inside the backward pass) | 3.75 |
//! | f16 | on | 1.6, 2.1, 2.6, 2.7 | 2.5 |
//!
//! Without checkpointing the slack grows with the page up to batch 8-16 and then stays flat in
//! MiB (so fewer pages as pages grow): the plan counts 3.25 pages up to
//! [`MAX_SLACK_WITHOUT_CHECKPOINTING`]. With checkpointing it keeps growing with the page. These
//! put every measured cell between 3.5% under and 8.4% over its measured reserved peak (README,
//! "Memory"; `tests::the_plan_holds_on_the_measured_grid` checks the bound, within 10% and never
//! more than 5% under, on the recorded cells). A flat percentage cannot fit both ends, since the
//! slack grows with the largest tensor, not with the total.
//!
//! The first step at a new shape autotunes its kernels with buffers of its own (the same cell
//! reserved 702 MiB in a first run and 538 MiB once cubecl's autotune cache held its kernels).
//! A run's first step therefore runs outside the pools ([`crate::device::outside_the_pools`]:
//! cubecl sizes pages to the largest allocation it has served and never shrinks them, so the
//! autotuner's buffers would otherwise set the page size for the whole run: 40.3 MB reserved
//! in steady steps after a cold autotune against 34.1 MB warm, batch 8 at 64 px, f32,
//! lavapipe; 31.0 MB cold and 31.1 MB warm with the first step outside), and the loop hands
//! the pools' free pages back after it (`memory_cleanup`), so the run holds the steady state
//! the plan predicts; `bench memory` reports the first step's peak apart, and a capped run (`memory.cap_to_budget`) retries a
//! first step over the budget at half.
//!
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

/// Page size of cubecl's pool for allocations up to 64 KiB (kernel metadata, scalars, small
/// tensors): one page of it is always reserved.
pub const SMALL_POOL_PAGE: u64 = 8 << 20;

/// Partly used pages the pools hold beyond the bytes in use at the peak, by precision and
/// checkpointing (see "Page rounding": fitted to the measured grid, rounded to a quarter page).
/// Without checkpointing the slack is also capped at [`MAX_SLACK_WITHOUT_CHECKPOINTING`].
pub fn pool_slack_pages(precision: Precision, checkpointing: bool) -> f64 {
    match (precision, checkpointing) {
        (Precision::F32, false) | (Precision::F16, false) => 3.25,
        (Precision::F32, true) => 3.75,
        (Precision::F16, true) => 2.5,
    }
}

/// Without checkpointing the pools' slack beyond the small-pool page stopped growing with the
/// page size: measured 10-84 MiB over the whole 224 px grid (f32 and f16, batch 4-32; see "Page
/// rounding"), so the plan counts [`pool_slack_pages`] pages up to this many bytes (96 MiB, the
/// largest measured slack plus 12 MiB), and never less than 1.25 pages (at batch 32, the largest
/// pages measured, 75 MiB, the slack was 1.1 pages: the cap is not extrapolated to pages larger
/// than it).
pub const MAX_SLACK_WITHOUT_CHECKPOINTING: u64 = 96 << 20;

/// The most slack (bytes beyond the small-pool page) the plan counts without checkpointing for
/// pages of `page_size` bytes: [`MAX_SLACK_WITHOUT_CHECKPOINTING`], or 1.25 pages when that is
/// more.
pub fn max_slack_without_checkpointing(page_size: u64) -> u64 {
    MAX_SLACK_WITHOUT_CHECKPOINTING.max(page_size + page_size / 4)
}

/// f32 tensors of the largest layer's size that the backward pass holds above the end of the
/// forward pass and the parameter gradients when checkpointing recomputes a segment in f32
/// (measured 1.0-1.07 at batch 4-32, 224 px; see "The estimate").
pub const RECOMPUTE_TENSORS: f64 = 1.1;

/// The page size cubecl's adaptive pools carve once a tensor of `largest_tensor` bytes has been
/// allocated: the tensor plus 1 MiB of slack, rounded up to the MiB, at least 2 MiB
/// (`PageSizing::fit` in cubecl-server 0.11's `dynamic/arena.rs`).
pub fn page_size(largest_tensor: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    (largest_tensor + MIB).next_multiple_of(MIB).max(2 * MIB)
}

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
    /// The pools' page size for this run ([`page_size`] of the largest activation-sized tensor
    /// in the training precision, or of the f32 input batch when that is larger).
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

/// How cubecl lays out a wgpu device's memory pools, which decides what the device reserves
/// beyond the bytes in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolLayout {
    /// Pages sub-sliced among tensors, sized to the largest tensor (cubecl's `Adaptive`, the
    /// native default): the small-pool page plus [`pool_slack_pages`] pages beyond the peak.
    Adaptive,
    /// One page per allocation, rounded up to one of 24 exponentially spaced size buckets from
    /// 32 KiB to `max_page_size`, a page reused only by allocations of its bucket (cubecl's
    /// `ExclusivePages`, which cubecl-runtime 0.11 compiles in for every wasm build: a browser
    /// page never has sub-slicing). Reserved bytes are the peak in use times
    /// [`exclusive_pages_factor`].
    ExclusivePages {
        /// The device's largest page: the smaller of its `max_storage_buffer_binding_size` and
        /// `max_buffer_size`, in bytes.
        max_page_size: u64,
    },
}

impl PoolLayout {
    /// The layout a device of this build gets: in a browser (wasm) exclusive pages up to
    /// [`BROWSER_MAX_PAGE_SIZE`]; natively the adaptive pools, or exclusive pages up to 128 MiB
    /// (lavapipe's binding limit) with `VRAMFIT_WGPU_POOLS=exclusive`, the switch that lays out
    /// a native device's pools as a browser's for measuring ([`crate::device::select`]).
    pub fn this_build() -> Self {
        if cfg!(target_arch = "wasm32") {
            PoolLayout::ExclusivePages { max_page_size: BROWSER_MAX_PAGE_SIZE }
        } else if exclusive_pools_requested() {
            PoolLayout::ExclusivePages { max_page_size: 128 << 20 }
        } else {
            PoolLayout::Adaptive
        }
    }
}

/// Whether `VRAMFIT_WGPU_POOLS=exclusive` asks native wgpu devices for a browser's pools.
pub fn exclusive_pools_requested() -> bool {
    std::env::var("VRAMFIT_WGPU_POOLS").is_ok_and(|v| v == "exclusive")
}

/// The largest page a browser's WebGPU device gives cubecl's pools: Chromium 156 reports 1 GiB
/// `max_storage_buffer_binding_size` and `max_buffer_size` on its SwiftShader adapter, and
/// cubecl asks for the adapter's limits. A browser with smaller limits gets finer buckets and
/// reserves less than planned.
pub const BROWSER_MAX_PAGE_SIZE: u64 = 1 << 30;

/// Pages cubecl's exclusive pools hold per byte in use at the peak, after rounding each
/// allocation up to its bucket: every bucket keeps as many pages as it ever held at once, and
/// the buckets' peaks come at different moments of the step. Fitted with `max_page_size`'s
/// rounding (see [`exclusive_pages_factor`]), without checkpointing: reserved / planned peak in
/// use measured 2.48-2.60 on lavapipe with 128 MiB pages (`VRAMFIT_WGPU_POOLS=exclusive
/// VRAMFIT_GROUP_NORM_GELU=burn vramfit bench memory -c quickstart --cell B,28,f32,off --steps
/// 2`, batch 16-128; 2.52 at batch 16, 64 px) and 2.61-2.79 in Chromium's SwiftShader with
/// 1 GiB pages (batch 64, the browser tests), 2026-12-03;
/// `the_browser_plan_holds_on_the_measured_cells` checks them.
pub const EXCLUSIVE_SHARING: f64 = 2.24;

/// [`EXCLUSIVE_SHARING`] with activation checkpointing, whose recomputed segments allocate and
/// free many more tensors of every size within the backward pass: reserved / planned peak in use
/// measured 4.1-5.3 on lavapipe with 128 MiB pages (`--cell B,28,f32,on`, batch 16-128, growing
/// with the batch; 4.8 at batch 8, 64 px), fitted to the largest, so the plan is up to 29% over
/// at the smallest batches.
pub const EXCLUSIVE_SHARING_CHECKPOINTING: f64 = 4.36;

/// Reserved bytes per byte in use at the peak with exclusive pages up to `max_page_size`:
/// [`EXCLUSIVE_SHARING`] (or [`EXCLUSIVE_SHARING_CHECKPOINTING`]) times the mean rounding of an
/// allocation up to its bucket, `(r - 1) / ln r` for buckets `r` apart (sizes spread evenly in
/// log scale within a bucket), `r = (max_page_size / 32 KiB)^(1/23)` (cubecl-server 0.11's
/// `dynamic/exclusive.rs`: 24 buckets from 32 KiB). Without checkpointing 2.70 for 128 MiB
/// pages, 2.83 for 1 GiB.
pub fn exclusive_pages_factor(max_page_size: u64, checkpointing: bool) -> f64 {
    const MIN_BUCKET: f64 = 32.0 * 1024.0;
    let r = (max_page_size.max(1 << 16) as f64 / MIN_BUCKET).powf(1.0 / 23.0);
    let sharing = if checkpointing { EXCLUSIVE_SHARING_CHECKPOINTING } else { EXCLUSIVE_SHARING };
    sharing * (r - 1.0) / r.ln()
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
    let optimizer_state = 8 * p;
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
    let activation_bytes = if precision == Precision::F16 { 2 } else { 4 };
    let page_size = page_size((activation_bytes * b * largest_out).max(input_batch));
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

/// The pools' reservation beyond the bytes in use, and the slack pages it counts: under the
/// adaptive layout (native wgpu) one small-pool page plus [`pool_slack_pages`] pages of
/// `page_size` (capped without checkpointing, [`max_slack_without_checkpointing`]); under
/// exclusive pages (a browser) a share of `peak_in_use` ([`exclusive_pages_factor`]).
fn allocator_overhead(
    pools: PoolLayout,
    page_size: u64,
    peak_in_use: u64,
    precision: Precision,
    checkpointing: bool,
) -> (u64, f64) {
    match pools {
        PoolLayout::Adaptive => {
            let slack_pages = pool_slack_pages(precision, checkpointing);
            let mut slack = (slack_pages * page_size as f64) as u64;
            if !checkpointing {
                slack = slack.min(max_slack_without_checkpointing(page_size));
            }
            (SMALL_POOL_PAGE + slack, slack_pages)
        }
        PoolLayout::ExclusivePages { max_page_size } => {
            let factor = exclusive_pages_factor(max_page_size, checkpointing);
            ((peak_in_use as f64 * (factor - 1.0)) as u64, 0.0)
        }
    }
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
    /// Largest micro-batch that fits without accumulation (0 if not even 1 does).
    pub max_batch_size: usize,
    /// The micro-batch to train with so that the configured effective batch
    /// (`batch_size x grad_accum_steps`) fits: the effective batch itself when it fits, else the
    /// largest divisor of it that fits, so the product is exactly the effective batch (0 if not
    /// even 1 fits). Only when every divisor is under half the largest fitting micro-batch (an
    /// effective batch with no suitable divisor, e.g. a prime) is the split
    /// `ceil(effective / fit_grad_accum_steps)`, whose product exceeds it by less than one
    /// micro-batch.
    pub fit_batch_size: usize,
    /// Accumulation steps that go with `fit_batch_size`.
    pub fit_grad_accum_steps: usize,
}

/// Estimates `config` and finds the largest micro-batch within its budget, and the
/// (micro-batch, accumulation) pair that keeps the configured effective batch within it.
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
    let max_batch_size = largest_fitting(|b| estimate_total(&single, b, num_classes) <= budget);
    let effective = config.train.batch_size * config.train.grad_accum_steps;
    let (fit_batch_size, fit_grad_accum_steps) = if max_batch_size >= effective {
        (effective, 1)
    } else {
        match largest_fitting(|b| estimate_total(&accumulating, b, num_classes) <= budget) {
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
