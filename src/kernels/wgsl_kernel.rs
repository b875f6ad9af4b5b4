//! Launching vramfit's own WGSL kernels (`shaders/`) on burn's `CubeBackend`: the source as a
//! cubecl kernel, the dispatch grid, output buffers and the launch itself, shared by the
//! GroupNorm + GELU kernels ([`crate::kernels::group_norm_gelu`]), the depthwise convolution's
//! ([`crate::kernels::depthwise_conv`]) and the augmentation kernel ([`crate::kernels::device_augment`]). The
//! rules every such kernel follows (entry point `main`, bindings in the order passed, all
//! `read_write`, params in a storage buffer) are in `shaders/README.md`.

use burn::backend::wgpu::{CubeTensor, KernelSource, SourceKernel, SourceTemplate};
use burn::cubecl::prelude::KernelId;
use burn::cubecl::server::KernelArguments;
use burn::cubecl::{CubeCount, CubeDim};
use burn::tensor::{DType, Shape};

/// The most workgroups in one dimension of a dispatch (WebGPU's and Vulkan's minimum limit);
/// past it a kernel's grid wraps into a second dimension.
pub const MAX_GRID_ROW: usize = 65_535;

/// A WGSL source (with its `WG` constant already in front, where it has one) as a cubecl kernel.
pub struct WgslSource(pub &'static str);

impl KernelSource for WgslSource {
    fn source(&self) -> SourceTemplate {
        SourceTemplate::new(self.0)
    }

    fn id(&self) -> KernelId {
        // The source is the id, so an edited shader (or another WG) compiles anew.
        KernelId::new::<Self>().info(self.0)
    }

    fn lang(&self) -> &'static str {
        "wgsl"
    }
}

/// Whether `x` lives on a software adapter: cubecl's device identity names no physical card
/// (lavapipe, SwiftShader). Kernels with workgroup barriers take fewer threads there (lavapipe
/// runs a workgroup as SIMD loops of 8 lanes and switches through all of them at each barrier).
pub fn on_software_adapter(x: &CubeTensor) -> bool {
    x.client.properties().identity.physical.is_none()
}

/// A grid of `workgroups` workgroups (at least 1): `(columns, grid)`, rows of at most
/// [`MAX_GRID_ROW`] columns. A kernel finds its workgroup's index as `wg.y * columns + wg.x`
/// and skips indices past `workgroups` (the last row may be short).
pub fn grid(workgroups: usize) -> (u32, CubeCount) {
    let workgroups = workgroups.max(1);
    let columns = workgroups.min(MAX_GRID_ROW);
    (columns as u32, CubeCount::Static(columns as u32, workgroups.div_ceil(columns) as u32, 1))
}

/// Whether a grid of `workgroups` fits the two dimensions [`grid`] uses.
pub fn grid_fits(workgroups: usize) -> bool {
    workgroups <= MAX_GRID_ROW * MAX_GRID_ROW
}

/// A new contiguous f32 tensor of `shape` on `like`'s device (contents undefined: the kernel
/// writes every value).
pub fn empty_f32(like: &CubeTensor, shape: Shape) -> CubeTensor {
    let handle = like.client.empty(shape.num_elements() * size_of::<f32>());
    CubeTensor::new_contiguous(like.client.clone(), like.device.clone(), shape, handle, DType::F32)
}

/// Launches `source` with `workgroup` threads per workgroup over `grid`, its bindings in the
/// shaders' order: `inputs`, then the `params` words as one u32 buffer, then `outputs` (all
/// tensors contiguous; `inputs` not empty).
pub fn launch(
    source: &'static str,
    workgroup: u32,
    grid: CubeCount,
    inputs: &[&CubeTensor],
    params: &[u32],
    outputs: &[&CubeTensor],
) {
    let client = &inputs[0].client;
    let params: Vec<u8> = params.iter().flat_map(|w| w.to_le_bytes()).collect();
    let params = client.create_from_slice(&params);
    let binding = |t: &&CubeTensor| t.handle.clone().binding();
    let buffers = inputs.iter().map(binding).chain([params.binding()]).chain(outputs.iter().map(binding));
    let arguments = KernelArguments::new().with_buffers(buffers.collect());
    client.launch(Box::new(SourceKernel::new(WgslSource(source), CubeDim::new_1d(workgroup))), grid, arguments);
}
