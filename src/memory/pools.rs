//! What cubecl's memory pools reserve beyond the bytes in use, by layout ([`PoolLayout`]).
//!
//! # Page rounding
//! What a card runs out of is reserved bytes. cubecl 0.11's default `Adaptive` memory
//! (`cubecl-server/src/memory_management/dynamic/`) serves allocations up to 64 KiB from one
//! sliced pool of 8 MiB pages ([`SMALL_POOL_PAGE`]; one page on every cell measured), and
//! carves everything larger first-fit from pages sized to the largest allocation served so far
//! plus 1 MiB, rounded up to the MiB ([`page_size`]). A growth leaves the smaller pages
//! outdated; they go back only once every tensor on them is freed. The pools' pages go back to
//! the driver only on an explicit cleanup. Tensors of a step's first moments (parameters, AdamW
//! moments) stay in the buffers they were made in ([`crate::device::outside_the_pools`]),
//! exact-fit.
//!
//! The largest allocation is f32 in either precision (an activation's gradient, the input
//! batch) or the f32 gradient of the largest weight (4 MiB for the tier network's 1024 x 1024
//! pointwise layer), which the adaptive pool's `largest_alloc` showed on every one of the 48
//! random cells below.
//!
//! ## What vramfit chooses
//! After a run's first step (outside the pools, with the autotuner's buffers) the loop sizes the
//! pools: one buffer of the planned largest allocation is reserved and freed, and the free pages
//! go back ([`crate::device::size_the_pools`]). The next step then carves every tensor from pages
//! of the final size. Before, that step grew through smaller pages while its tensors held them,
//! and its peak held both: 98.2 against 84.2 MiB reserved (quickstart, micro-batch 8 x 4,
//! 145 px, f16, checkpointing), 288.6 against 255.6 MiB (18 at 190 px, f16). Over the random
//! grid below the median cell reserved 3.7% less (32 cells less, up to 17%; 3 more, up to 8%). The layout itself stays cubecl's `Adaptive`: the only other,
//! `ExclusivePages`, reserved 2.5-2.8 times the bytes in use ([`exclusive_pages_factor`]).
//!
//! ## The slack
//! The plan counts the small-pool page plus [`pool_slack_pages`] pages of [`page_size`] beyond
//! the bytes in use. Measured on a seeded random grid (`vramfit bench memory --device gpu
//! --random 48 --seed 49 --max-plan-mib 1024 --max-step-mpx 0.8` on lavapipe, 2026-12-07, both
//! shipped networks, micro-batch 1-58, 64-318 px, accumulation 1-4, 3-978 classes), the slack
//! beyond that page was 0.3-3.2 pages: 0.7-1.6 in f16 without checkpointing, 0.9-3.2 in f32
//! without it, 0.4-2.8 with it. The most pages are on cells whose pages are small beside the
//! bytes in use (the tier network at 64-136 px: 5 MiB pages, 2.2-3.2 pages of slack). The plan's
//! pages are the fewest that keep every cell within 5% under, in eighths of a page. The plan is
//! then -4.9%..+22.0% from the measured reserved peak, median 3.7%, 88% of the cells within
//! -5%..+10% ([`ADAPTIVE_ERROR_BAND`], `tests::the_plan_holds_on_the_random_grid`). One page
//! is the limit of a slack counted in pages: which cell holds one page more depends on how the
//! step's allocations fall into first-fit holes, and one page of 2-6 MiB beside the 8 MiB small
//! page is 15-35% of the small cells' total.
//!
use crate::config::Precision;

/// Page size of cubecl's pool for allocations up to 64 KiB (kernel metadata, scalars, small
/// tensors): one page of it is always reserved.
pub const SMALL_POOL_PAGE: u64 = 8 << 20;

/// Partly used pages the pools hold beyond the bytes in use at the peak, by precision and
/// checkpointing (see "The slack": the fewest, in eighths, that keep every cell of the random
/// grid within 5% under).
/// Without checkpointing the slack is also capped at [`MAX_SLACK_WITHOUT_CHECKPOINTING`].
pub fn pool_slack_pages(precision: Precision, checkpointing: bool) -> f64 {
    match (precision, checkpointing) {
        (Precision::F32, false) => 2.625,
        (Precision::F16, false) => 1.25,
        (Precision::F32, true) => 2.0,
        (Precision::F16, true) => 1.5,
    }
}

/// Without checkpointing the pools' slack beyond the small-pool page stopped growing with the
/// page size: measured 10-84 MiB over the whole 224 px grid of the tier network (f32 and f16,
/// batch 4-32, before [`crate::device::size_the_pools`]; pages of 41-75 MiB the random grid
/// does not reach), so the plan counts [`pool_slack_pages`] pages up to this many bytes (96 MiB, the
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

/// The page size cubecl's adaptive pools carve once a tensor of `largest_tensor` bytes has been
/// allocated: the tensor plus 1 MiB of slack, rounded up to the MiB, at least 2 MiB
/// (`PageSizing::fit` in cubecl-server 0.11's `dynamic/arena.rs`).
pub fn page_size(largest_tensor: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    (largest_tensor + MIB).next_multiple_of(MIB).max(2 * MIB)
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

/// The pools' reservation beyond the bytes in use, and the slack pages it counts: under the
/// adaptive layout (native wgpu) one small-pool page plus [`pool_slack_pages`] pages of
/// `page_size` (capped without checkpointing, [`max_slack_without_checkpointing`]); under
/// exclusive pages (a browser) a share of `peak_in_use` ([`exclusive_pages_factor`]).
pub(crate) fn allocator_overhead(
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

/// How far a plan's predicted peak was from the reserved peak measured for it, in percent of
/// the measured peak (`100 (predicted - measured) / measured`; positive: the plan was over).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ErrorBand {
    /// The lowest error measured (the plan furthest under, or least over).
    pub low_percent: f64,
    /// The highest error measured.
    pub high_percent: f64,
    /// Median of the absolute errors.
    pub median_abs_percent: f64,
    /// Where it was measured, for the report.
    pub measured_on: &'static str,
}

impl ErrorBand {
    /// `the real peak of such plans measured -26%..+5% from <what> (median error 4.1%; <where>):
    /// 61.1 MiB..87.3 MiB` for a plan of `predicted` bytes: the band turned around, as the
    /// range of real peaks ([`Self::real_peak_range`]).
    pub fn describe(&self, what: &str, predicted: u64) -> String {
        let (low, high) = self.real_peak_range(predicted);
        format!(
            "the real peak of such plans measured {:+.0}%..{:+.0}% from {what} (median error {:.1}%; {}): {}..{}",
            -self.high_percent / (1.0 + self.high_percent / 100.0),
            -self.low_percent / (1.0 + self.low_percent / 100.0),
            self.median_abs_percent,
            self.measured_on,
            super::human_bytes(low),
            super::human_bytes(high),
        )
    }

    /// The range the real reserved peak of a plan of `predicted` bytes fell in on the cells
    /// measured: `predicted / (1 + high)` to `predicted / (1 + low)` (bytes).
    pub fn real_peak_range(&self, predicted: u64) -> (u64, u64) {
        let at = |percent: f64| (predicted as f64 / (1.0 + percent / 100.0)) as u64;
        (at(self.high_percent), at(self.low_percent))
    }
}

impl PoolLayout {
    /// The plan's error measured under this layout: for the adaptive pools, every cell of the
    /// recorded random grid (`tests::the_plan_holds_on_the_random_grid` checks it); for
    /// exclusive pages, the browser cells (`tests::the_browser_plan_holds_on_the_measured_cells`).
    pub fn error_band(self) -> ErrorBand {
        match self {
            PoolLayout::Adaptive => ADAPTIVE_ERROR_BAND,
            // -0.46% .. +28.25%, median 6.8%: the 14 cells of the browser test.
            PoolLayout::ExclusivePages { .. } => ErrorBand {
                low_percent: -0.5,
                high_percent: 28.3,
                median_abs_percent: 6.8,
                measured_on: "14 cells, lavapipe with a browser's pools and Chromium's SwiftShader",
            },
        }
    }
}

/// The plan's error under the adaptive pools on every cell of the recorded random grid
/// (`random_grid_lavapipe.tsv`: -4.9%..+22.0%, median 3.7%, 88% of the cells within
/// -5%..+10%). The wide top is small cells, where one page of 2-6 MiB beside the 8 MiB small
/// pool is 15-35% of the total.
pub const ADAPTIVE_ERROR_BAND: ErrorBand = ErrorBand {
    low_percent: -4.9,
    high_percent: 22.0,
    median_abs_percent: 3.7,
    measured_on: "48 random cells on lavapipe, 14-490 MiB",
};

/// The exact plan of a step's reserved peak (`vramfit plan --exact`), in bytes: the smaller of
/// the plan (`planned`, [`crate::memory::MemoryEstimate::total`]) and what the step's pools
/// reserved under cubecl's dry run (`dry_run`, [`crate::train::dry_run_step_memory`]; 0 when it
/// was not run, then the plan). Each was measured at most 4.9% under the real peak on the random
/// grid, and each is a page over where the other is not: the plan counts a fixed number of slack
/// pages where first-fit needed fewer, and the dry run carved one page more than the real step
/// on 5 of 48 cells (without kernels, buffers are released at other moments; run to run, 2 cells
/// differed by that page). The smaller: [`EXACT_ERROR_BAND`].
pub fn exact_peak(planned: u64, dry_run: u64) -> u64 {
    if dry_run == 0 { planned } else { planned.min(dry_run) }
}

/// The exact plan's error ([`exact_peak`]) on the recorded random grid
/// (`random_grid_lavapipe.tsv`, its dry-run column; `tests::the_exact_plan_holds_on_the_random_grid`):
/// -4.9%..+12.8%, median 1.5%, 98% of the cells within -5%..+10% (47 of 48).
pub const EXACT_ERROR_BAND: ErrorBand = ErrorBand {
    low_percent: -4.9,
    high_percent: 12.8,
    median_abs_percent: 1.5,
    measured_on: "48 random cells on lavapipe, 14-490 MiB",
};
