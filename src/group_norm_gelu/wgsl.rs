//! GroupNorm + GELU on a wgpu device: vramfit's WGSL kernels (`shaders/group_norm_gelu_*.wgsl`),
//! forward and backward, launched through the [`super::FusedGroupNormGelu`] backend extension on
//! burn's `CubeBackend`.
//!
//! burn runs GroupNorm + GELU on a GPU as a chain of reductions and fused elementwise kernels,
//! forward and backward: on lavapipe about 45% of a quickstart training step's kernel time and
//! most of its ~3,000 launches (README, "Where a lavapipe step goes"). Here the forward pass is
//! one launch (one workgroup per (sample, group): the statistics, then normalize + affine + GELU),
//! and the backward pass three (the same workgroups recompute the statistics, sum `dp` and
//! `dp xhat` per channel and write the input gradient; then two burn reductions sum the
//! per-sample scale and shift gradients over the batch). The formulas are the CPU kernel's (module docs of
//! [`super`]); `tests/engine/group_norm_gelu.rs` compares the two and burn-nn.

use burn::backend::TensorMetadata;
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::wgpu::{CubeBackend, CubeTensor, KernelSource, SourceKernel, SourceTemplate, into_contiguous};
use burn::cubecl::prelude::KernelId;
use burn::cubecl::server::KernelArguments;
use burn::cubecl::{CubeCount, CubeDim};
use burn::tensor::{DType, Shape};
use std::sync::LazyLock;

use super::Groups;

/// Threads per workgroup (`WG` in the WGSL) on a GPU; one workgroup per (sample, group).
const GPU_WORKGROUP: u32 = 256;
/// Threads per workgroup on a CPU adapter (lavapipe): its SIMD width (8 f32 lanes of 256 bits),
/// so that a workgroup is one SIMD loop and the tree sums' barriers switch through no other
/// threads. On lavapipe (`vramfit bench train -c quickstart --backends gpu --steps 5 --warmup 2`,
/// 2 runs per size, 2026-12-03, AMD EPYC, 2 cores) training ran at 18.3-18.8 img/s with 256
/// threads, 22.3 with 128, 21.6-22.8 with 64, 22.0-24.0 with 32, 24.1-25.3 with 16 and
/// 25.0-26.3 with 8; inference at 79-81 img/s with 256 and 98-114 with 8.
const CPU_WORKGROUP: u32 = 8;
/// The workgroup sizes the kernels are built for: powers of two (the tree sums halve).
const WORKGROUP_SIZES: [u32; 6] = [8, 16, 32, 64, 128, 256];
/// The most workgroups in one dimension of a dispatch (WebGPU's and Vulkan's minimum limit).
const MAX_GRID_ROW: usize = 65_535;

const COMMON: &str = include_str!("../../shaders/group_norm_gelu_common.wgsl");
const FORWARD: &str = include_str!("../../shaders/group_norm_gelu_forward.wgsl");
const BACKWARD: &str = include_str!("../../shaders/group_norm_gelu_backward.wgsl");

/// The kernels' sources per size of [`WORKGROUP_SIZES`], forward then backward: the `WG`
/// constant, the common part, then each kernel's bindings and entry point.
static SOURCES: LazyLock<Vec<[String; 2]>> = LazyLock::new(|| {
    let source = |wg: u32, own: &str| format!("const WG: u32 = {wg}u;\n{COMMON}\n{own}");
    WORKGROUP_SIZES.iter().map(|&wg| [source(wg, FORWARD), source(wg, BACKWARD)]).collect()
});

/// Threads per workgroup on `x`'s device: [`CPU_WORKGROUP`] on a software adapter (cubecl's
/// device identity names no physical card: lavapipe, SwiftShader), [`GPU_WORKGROUP`] on a card,
/// unless `VRAMFIT_GROUP_NORM_GELU_WORKGROUP` names one of [`WORKGROUP_SIZES`] (for
/// measuring; any other value is ignored with a warning).
fn workgroup_for(x: &CubeTensor) -> u32 {
    let choices = format!("one of {WORKGROUP_SIZES:?}");
    let forced = crate::measuring_switch::measuring_switch("VRAMFIT_GROUP_NORM_GELU_WORKGROUP", &choices, |v| {
        v.parse().ok().filter(|wg| WORKGROUP_SIZES.contains(wg))
    });
    if let Some(wg) = forced {
        return wg;
    }
    match x.client.properties().identity.physical {
        None => CPU_WORKGROUP,
        Some(_) => GPU_WORKGROUP,
    }
}

/// One of the two kernels, for one workgroup size.
struct GroupNormGeluWgsl {
    backward: bool,
    /// One of [`WORKGROUP_SIZES`].
    workgroup: u32,
}

impl GroupNormGeluWgsl {
    fn new(backward: bool, x: &CubeTensor) -> Self {
        Self { backward, workgroup: workgroup_for(x) }
    }

    fn source(&self) -> &'static str {
        let size = WORKGROUP_SIZES.iter().position(|&wg| wg == self.workgroup);
        &SOURCES[size.expect("workgroup sizes come from WORKGROUP_SIZES")][usize::from(self.backward)]
    }
}

impl KernelSource for GroupNormGeluWgsl {
    fn source(&self) -> SourceTemplate {
        SourceTemplate::new(GroupNormGeluWgsl::source(self))
    }

    fn id(&self) -> KernelId {
        // The source is part of the id, so an edited shader compiles anew.
        KernelId::new::<Self>().info(GroupNormGeluWgsl::source(self))
    }

    fn lang(&self) -> &'static str {
        "wgsl"
    }
}

/// Whether the WGSL kernels take a tensor of `groups`' size: not empty, every index fits the
/// kernels' u32 arithmetic (a thread's last stride step included), and the (sample, group)
/// count fits the 2-D grid (the callers fall back to burn's ops otherwise).
pub(super) fn fits(groups: &Groups) -> bool {
    let count = groups.batch * groups.groups;
    !groups.is_empty() && groups.len() < (u32::MAX - GPU_WORKGROUP) as usize && count <= MAX_GRID_ROW * MAX_GRID_ROW
}

/// The params words (`shaders/group_norm_gelu_common.wgsl`) and the dispatch grid.
fn launch_shape(groups: &Groups) -> (Vec<u8>, CubeCount) {
    let count = groups.batch * groups.groups;
    let row = count.min(MAX_GRID_ROW);
    let words = [
        groups.batch as u32,
        groups.channels as u32,
        groups.groups as u32,
        groups.hw as u32,
        groups.epsilon.to_bits(),
        row as u32,
    ];
    let bytes = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    (bytes, CubeCount::Static(row as u32, count.div_ceil(row) as u32, 1))
}

fn empty_like(like: &CubeTensor, shape: Shape) -> CubeTensor {
    let handle = like.client.empty(shape.num_elements() * size_of::<f32>());
    CubeTensor::new_contiguous(like.client.clone(), like.device.clone(), shape, handle, DType::F32)
}

/// Launches `kernel` over `groups`' grid with its bindings in the shaders' order: `inputs`, the
/// params words, `outputs` (all contiguous f32).
fn launch(kernel: GroupNormGeluWgsl, groups: &Groups, inputs: &[&CubeTensor], outputs: &[&CubeTensor]) {
    let (params, grid) = launch_shape(groups);
    let client = &inputs[0].client;
    let params = client.create_from_slice(&params);
    let binding = |t: &&CubeTensor| t.handle.clone().binding();
    let buffers = inputs.iter().map(binding).chain([params.binding()]).chain(outputs.iter().map(binding));
    let arguments = KernelArguments::new().with_buffers(buffers.collect());
    let wg = kernel.workgroup;
    client.launch(Box::new(SourceKernel::new(kernel, CubeDim::new_1d(wg))), grid, arguments);
}

/// `gelu(γ xhat + β)` for a `[B, C, ...]` f32 tensor; `gamma`, `beta` `[C]`.
pub(super) fn forward(x: CubeTensor, gamma: CubeTensor, beta: CubeTensor, groups: &Groups) -> CubeTensor {
    let [x, gamma, beta] = [x, gamma, beta].map(into_contiguous);
    let y = empty_like(&x, x.shape());
    launch(GroupNormGeluWgsl::new(false, &x), groups, &[&x, &gamma, &beta], &[&y]);
    y
}

/// `(dx, dγ, dβ)` for the output gradient `grad` (`x`'s shape).
pub(super) fn backward(
    x: CubeTensor,
    gamma: CubeTensor,
    beta: CubeTensor,
    grad: CubeTensor,
    groups: &Groups,
) -> (CubeTensor, CubeTensor, CubeTensor) {
    let [x, gamma, beta, grad] = [x, gamma, beta, grad].map(into_contiguous);
    let dx = empty_like(&x, x.shape());
    let per_sample = Shape::new([groups.batch, groups.channels]);
    let (dgamma, dbeta) = (empty_like(&x, per_sample.clone()), empty_like(&x, per_sample));
    launch(GroupNormGeluWgsl::new(true, &x), groups, &[&x, &gamma, &beta, &grad], &[&dx, &dgamma, &dbeta]);
    let over_batch = |t: CubeTensor| -> FloatTensor<CubeBackend> {
        CubeBackend::float_reshape(CubeBackend::float_sum_dim(t, 0), Shape::new([groups.channels]))
    };
    (dx, over_batch(dgamma), over_batch(dbeta))
}
