//! Compute devices: the wgpu adapters on this machine and burn's CPU backends.
//!
//! `--adapter N` indexes [`list_adapters`]; `--device cpu` picks a CPU backend. The default,
//! [`DeviceChoice::Auto`], is the fastest kind of device here ([`default_device`]): a hardware
//! adapter where there is one, else the CPU backend, saying why.

mod choice;
pub mod remote;

use burn::tensor::{Device, DeviceKind, FloatDType};
use serde::Serialize;

use crate::engine::error::{Error, Result};

/// One wgpu adapter.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct AdapterInfo {
    /// Index for `--adapter`.
    pub index: usize,
    /// Adapter name, e.g. "llvmpipe (LLVM 15.0.6, 256 bits)".
    pub name: String,
    /// Graphics API: Vulkan, Metal, Dx12, Gl, BrowserWebGpu.
    pub backend: String,
    /// DiscreteGpu, IntegratedGpu, VirtualGpu, Cpu or Other.
    pub device_type: String,
    /// Driver name and version.
    pub driver: String,
    /// Largest buffer in bytes.
    pub max_buffer_size: u64,
    /// Largest storage-buffer binding in bytes (what one tensor may occupy).
    pub max_storage_buffer_binding_size: u64,
    /// Whether shaders can compute in f16.
    pub shader_f16: bool,
    /// Device-local memory in bytes (the largest device-local heap), where the platform exposes
    /// it: read from Vulkan's memory properties; `None` on other backends.
    pub device_local_bytes: Option<u64>,
    #[serde(skip)]
    kind: Option<DeviceKind>,
}

impl AdapterInfo {
    /// Bytes one tensor may occupy on this adapter: the smaller of its largest buffer and its
    /// largest storage-buffer binding.
    pub fn buffer_limit(&self) -> u64 {
        self.max_storage_buffer_binding_size.min(self.max_buffer_size)
    }
}

/// The largest device-local memory heap of a Vulkan adapter (Vulkan spec
/// `vkGetPhysicalDeviceMemoryProperties`, heap flag `DEVICE_LOCAL` = 0x1): the card's VRAM on a
/// discrete GPU, the share of system memory a driver offers on integrated and software adapters.
/// `None` on other backends, where wgpu exposes no memory size.
#[cfg(not(target_arch = "wasm32"))]
fn device_local_bytes(adapter: &wgpu::Adapter) -> Option<u64> {
    if adapter.get_info().backend != wgpu::Backend::Vulkan {
        return None;
    }
    // SAFETY: the Vulkan adapter is only read (memory properties), never destroyed or used for
    // work; the guard keeps it alive for the call.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let properties = unsafe {
        hal.shared_instance().raw_instance().get_physical_device_memory_properties(hal.raw_physical_device())
    };
    const DEVICE_LOCAL: u32 = 0x1;
    properties.memory_heaps_as_slice().iter().filter(|h| h.flags.as_raw() & DEVICE_LOCAL != 0).map(|h| h.size).max()
}

#[cfg(target_arch = "wasm32")]
fn device_local_bytes(_adapter: &wgpu::Adapter) -> Option<u64> {
    None
}

/// Every adapter wgpu sees, in its enumeration order.
pub fn list_adapters() -> Vec<AdapterInfo> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY));
    let mut seen: Vec<(wgpu::Backend, wgpu::DeviceType)> = Vec::new();
    adapters
        .iter()
        .enumerate()
        .map(|(index, a)| {
            let info = a.get_info();
            let nth = seen.iter().filter(|(b, t)| *b == info.backend && *t == info.device_type).count();
            seen.push((info.backend, info.device_type));
            adapter_info(a, index, nth)
        })
        .collect()
}

/// The adapter a browser page's WebGPU gives (`navigator.gpu.requestAdapter` with the
/// high-performance preference, as burn's device does), or `None` where it gives none. Its
/// limits are the page's device's: cubecl requests the adapter's own limits.
#[cfg(target_arch = "wasm32")]
pub async fn browser_adapter() -> Option<AdapterInfo> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let options =
        wgpu::RequestAdapterOptions { power_preference: wgpu::PowerPreference::HighPerformance, ..Default::default() };
    let adapter = instance.request_adapter(&options).await.ok()?;
    let mut info = adapter_info(&adapter, 0, 0);
    if info.name.is_empty() {
        // Browsers may withhold what the adapter is (WebGPU's `GPUAdapterInfo` fields are empty
        // unless the page is allowed to see them).
        info.name = "the browser's WebGPU adapter".into();
    }
    Some(info)
}

/// What vramfit shows and plans with of one adapter; `nth` counts the adapters of the same
/// backend and type before it (burn's device index).
fn adapter_info(a: &wgpu::Adapter, index: usize, nth: usize) -> AdapterInfo {
    let info = a.get_info();
    let limits = a.limits();
    let kind = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => Some(DeviceKind::DiscreteGpu(nth)),
        wgpu::DeviceType::IntegratedGpu => Some(DeviceKind::IntegratedGpu(nth)),
        wgpu::DeviceType::VirtualGpu => Some(DeviceKind::VirtualGpu(nth)),
        wgpu::DeviceType::Cpu => Some(DeviceKind::Cpu),
        wgpu::DeviceType::Other => None,
    };
    AdapterInfo {
        index,
        name: info.name.clone(),
        backend: format!("{:?}", info.backend),
        device_type: format!("{:?}", info.device_type),
        driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
        max_buffer_size: limits.max_buffer_size,
        max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
        shader_f16: a.features().contains(wgpu::Features::SHADER_F16),
        device_local_bytes: device_local_bytes(a),
        kind,
    }
}

/// Waits until `device` has run all queued work, as [`Device::sync`] does. In a browser, where a
/// blocking wait panics, it awaits the read of a one-element tensor instead: a read completes
/// only after everything queued before it on the device.
///
/// # Errors
/// The device's execution error.
pub async fn sync_async(device: &Device) -> std::result::Result<(), impl std::fmt::Debug> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        device.sync()
    }
    #[cfg(target_arch = "wasm32")]
    {
        burn::tensor::Tensor::<1>::zeros([1], device).into_data_async().await.map(|_| ())
    }
}

/// Index in `adapters` of the one `--device gpu` picks without `--adapter`: the first discrete
/// GPU, else integrated, virtual, then CPU adapter (wgpu's high-performance preference).
pub fn default_adapter(adapters: &[AdapterInfo]) -> Option<usize> {
    ["DiscreteGpu", "IntegratedGpu", "VirtualGpu", "Cpu", "Other"]
        .iter()
        .find_map(|t| adapters.iter().position(|a| a.device_type == *t))
}

/// Names (lower case) of software rasterizers that report a device type other than `Cpu`:
/// Mesa's llvmpipe/lavapipe, Google's SwiftShader (Chromium's WebGPU without a GPU) and
/// Microsoft's WARP ("Microsoft Basic Render Driver").
const SOFTWARE_ADAPTER_NAMES: [&str; 4] = ["llvmpipe", "lavapipe", "swiftshader", "microsoft basic render driver"];

impl AdapterInfo {
    /// Whether this adapter runs its shaders on the CPU: device type `Cpu`, or a known software
    /// rasterizer's name ([`SOFTWARE_ADAPTER_NAMES`]). On one, training is far slower than on
    /// burn's CPU backend on the same cores: 62 against 1022 img/s for the quickstart on two
    /// cores (lavapipe against flex, `vramfit bench train -c quickstart`, docs/performance.md).
    pub fn is_software(&self) -> bool {
        let name = self.name.to_lowercase();
        self.device_type == "Cpu" || SOFTWARE_ADAPTER_NAMES.iter().any(|n| name.contains(n))
    }
}

/// The note of a run that wanted a GPU on a machine with no adapter at all.
const NO_ADAPTER: &str = "no GPU adapter found: running on the CPU (install a Vulkan/Metal/DX12 driver, or mesa-vulkan-drivers for a software adapter)";

/// What [`DeviceChoice::Auto`] runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefaultDevice {
    /// The adapter at this index of the list: the first hardware one in [`default_adapter`]'s order.
    Adapter(usize),
    /// The default CPU backend, because the only adapters are software ones; the index of the
    /// first of them.
    CpuOverSoftware(usize),
    /// The default CPU backend, for want of any adapter.
    CpuForWantOfAdapter,
}

impl DefaultDevice {
    /// Why the CPU was chosen, in one line ending in `use_anyway` (how the client picks the
    /// software adapter regardless, e.g. "`--device gpu --adapter 0` uses it anyway"); `None`
    /// for an adapter.
    pub fn cpu_note(self, adapters: &[AdapterInfo], use_anyway: &str) -> Option<String> {
        match self {
            DefaultDevice::Adapter(_) => None,
            DefaultDevice::CpuOverSoftware(i) => Some(format!(
                "running on the CPU (burn {}): the only GPU adapter here, {}, is a software one, 16x or more slower on the same cores; {use_anyway}",
                CpuBackend::DEFAULT.name(),
                adapters.iter().find(|a| a.index == i).map_or("?", |a| a.name.as_str())
            )),
            DefaultDevice::CpuForWantOfAdapter => Some(NO_ADAPTER.into()),
        }
    }
}

/// The default device among `adapters`: the first hardware adapter in wgpu's high-performance
/// order; where there are only software adapters ([`AdapterInfo::is_software`]), the CPU
/// backend, faster on the same cores; where there is none, the CPU backend too.
pub fn default_device(adapters: &[AdapterInfo]) -> DefaultDevice {
    let hardware: Vec<AdapterInfo> = adapters.iter().filter(|a| !a.is_software()).cloned().collect();
    if let Some(i) = default_adapter(&hardware) {
        return DefaultDevice::Adapter(hardware[i].index);
    }
    match adapters.iter().find(|a| a.is_software()) {
        Some(a) => DefaultDevice::CpuOverSoftware(a.index),
        None => DefaultDevice::CpuForWantOfAdapter,
    }
}

pub use choice::{CpuBackend, DEVICE_FORMS, DeviceChoice, RemoteAddr};

/// A device ready for tensors, with what is known about it.
#[derive(Clone, Debug)]
pub struct SelectedDevice {
    /// The burn device (without autodiff).
    pub device: Device,
    /// Human name: adapter name and API, or the CPU backend.
    pub name: String,
    /// The adapter, for GPU devices.
    pub adapter: Option<AdapterInfo>,
    /// A note to show the user (e.g. why the CPU was chosen).
    pub note: Option<String>,
    /// The server and index, for a device of a `vramfit serve` server ([`remote`]).
    pub remote: Option<RemoteAddr>,
}

impl SelectedDevice {
    /// Whether this is a GPU adapter (memory pools, buffer limits).
    pub fn is_gpu(&self) -> bool {
        self.adapter.is_some()
    }

    /// Bytes one tensor may occupy on this device: the smaller of the adapter's largest buffer and
    /// largest storage-buffer binding; `None` on the CPU (no such limit).
    pub fn buffer_limit(&self) -> Option<u64> {
        self.adapter.as_ref().map(AdapterInfo::buffer_limit)
    }

    /// A device already made on `adapter` (a page's WebGPU device, made asynchronously; the
    /// app's device of an adapter it listed).
    pub fn on_adapter(device: Device, adapter: AdapterInfo) -> Self {
        let name = format!("{} ({}, {})", adapter.name, adapter.backend, adapter.device_type);
        Self { device, name, adapter: Some(adapter), note: None, remote: None }
    }

    /// The CPU backend `backend`.
    pub fn on_cpu(backend: CpuBackend) -> Self {
        cpu(backend, None)
    }

    /// The default CPU backend, for work that does not fit this device's buffers.
    pub fn cpu_fallback() -> Self {
        cpu(CpuBackend::DEFAULT, None)
    }

    /// Whether f16 compute is available.
    pub fn supports_f16(&self) -> bool {
        self.device.supports_dtype(FloatDType::F16) && self.adapter.as_ref().is_none_or(|a| a.shader_f16)
    }
}

/// Resolves a [`DeviceChoice`]. A GPU request on a machine with no adapter falls back to the
/// default CPU backend with a note, as [`DeviceChoice::Auto`] does where only software adapters
/// exist.
///
/// # Errors
/// [`Error::Device`] when `--adapter N` is out of range or of an unusable type.
pub fn select(choice: DeviceChoice) -> Result<SelectedDevice> {
    match choice {
        DeviceChoice::Cpu(b) => Ok(cpu(b, None)),
        DeviceChoice::Remote(r) => remote::open(r),
        DeviceChoice::Auto => {
            let adapters = list_adapters();
            let default = default_device(&adapters);
            match default {
                DefaultDevice::Adapter(i) => open_adapter(&adapters, i),
                DefaultDevice::CpuOverSoftware(i) => Ok(cpu(
                    CpuBackend::DEFAULT,
                    default.cpu_note(&adapters, &format!("`--device gpu --adapter {i}` uses it anyway")),
                )),
                DefaultDevice::CpuForWantOfAdapter => Ok(cpu(CpuBackend::DEFAULT, Some(NO_ADAPTER.into()))),
            }
        }
        DeviceChoice::Gpu(requested) => {
            let adapters = list_adapters();
            match requested {
                Some(i) if i < adapters.len() => open_adapter(&adapters, i),
                Some(i) => Err(Error::Device(format!(
                    "--adapter {i} does not exist: {} adapter(s) found; run `vramfit devices` to list them",
                    adapters.len()
                ))),
                None => match default_adapter(&adapters) {
                    Some(i) => open_adapter(&adapters, i),
                    None => Ok(cpu(CpuBackend::DEFAULT, Some(NO_ADAPTER.into()))),
                },
            }
        }
    }
}

/// burn's device on `adapters[index]`.
fn open_adapter(adapters: &[AdapterInfo], index: usize) -> Result<SelectedDevice> {
    let adapter = adapters[index].clone();
    let kind = adapter.kind.clone().ok_or_else(|| {
        Error::Device(format!(
            "adapter {index} ({}) has device type Other, which burn cannot select; pick another with --adapter",
            adapter.name
        ))
    })?;
    // `VRAMFIT_WGPU_POOLS=exclusive`: a browser's pools, for measuring them natively.
    #[cfg(target_arch = "wasm32")]
    let device = Device::wgpu(kind);
    #[cfg(not(target_arch = "wasm32"))]
    let device = if crate::memory::exclusive_pools_requested() {
        Device::wgpu_options()
            .device_kind(kind)
            .memory_config(burn::tensor::wgpu::MemoryConfiguration::ExclusivePages)
            .init()
            .map_err(|e| Error::Device(format!("wgpu with exclusive pools: {e:?}")))?
    } else {
        Device::wgpu(kind)
    };
    Ok(SelectedDevice {
        device,
        name: format!("{} ({}, {})", adapter.name, adapter.backend, adapter.device_type),
        adapter: Some(adapter),
        note: None,
        remote: None,
    })
}

fn cpu(backend: CpuBackend, note: Option<String>) -> SelectedDevice {
    SelectedDevice {
        device: backend.device(),
        name: format!("CPU (burn {})", backend.name()),
        adapter: None,
        note,
        remote: None,
    }
}

/// The cubecl device behind `device` (a wgpu adapter), `None` on a CPU backend.
#[cfg(not(target_arch = "wasm32"))]
fn cube_device(device: &Device) -> Option<burn::backend::CubeDevice> {
    match device.clone().inner().as_dispatch().clone() {
        burn::backend::DispatchDevice::Cube(cube) => Some(cube),
        _ => None,
    }
}

/// Runs `task` with every device allocation it makes on this thread's stream outside
/// cubecl's pools (each its own device buffer, returned to the driver once freed), and waits
/// for the work it queued before the window closes; on a CPU backend it runs `task` as is. A
/// panic in `task` closes the window and then continues.
///
/// For a run's first step, whose buffers (cubecl's autotuner's candidates among them) would
/// otherwise size the pools' pages for the rest of the run: cubecl 0.11's adaptive pool
/// carves pages sized to the largest allocation it has served, and the size never shrinks
/// (`PageSizing::fit`, cubecl-server's `dynamic/arena.rs`), so a cold autotune left batch 8
/// at 64 px, f32, reserving 40.3 MB in steady steps against 34.1 MB with the autotune cache
/// warm (`vramfit bench memory --grid tiny --fresh`, lavapipe, 2026-12-04), over the plan's
/// 39.7 MB; with the first step in this window, 31.0 MB cold and 31.1 warm. cubecl's
/// `memory_dedicated_allocation` exists for this: buffers that "stay out of the pools'
/// reservations and out of the statistics an adaptive pool sizes its pages from".
///
/// In a browser it runs `task` as is: the wait would be a synchronous `sync`, which a browser
/// refuses, and the web build has no autotuner.
///
/// # Errors
/// The device's error, on one line, when waiting for `task`'s work fails (`task`'s own result
/// is then dropped, though its work may have been applied: the caller must not repeat it).
pub fn outside_the_pools<T: Send>(device: &Device, task: impl FnOnce() -> T + Send) -> std::result::Result<T, String> {
    #[cfg(target_arch = "wasm32")]
    {
        let _ = device;
        Ok(task())
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        let Some(cube) = cube_device(device) else {
            return Ok(task());
        };
        // cubecl closes the window when the closure returns, not when it unwinds: a panic in
        // `task` is caught here, the window closed, and the panic resumed after it.
        let (result, synced) = cube.client().memory_dedicated_allocation(device, |device| {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(task));
            (result, device.sync())
        });
        let result = result.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        synced.map_err(|e| crate::engine::error::one_line_cause(&format!("{e:?}")))?;
        Ok(result)
    }
}

/// Hands `device`'s free pool pages back and sizes the pages of its adaptive pool for
/// allocations of up to `largest_allocation` bytes: one buffer of that size is reserved in the
/// pools and freed before the pages go back, so the next step carves every tensor from pages of
/// the final size (`page_size`, cubecl-server 0.11's `PageSizing::fit`) instead of growing
/// through smaller ones while its tensors still hold them. Without it the run's first step in
/// the pools held the outdated smaller pages and the final ones at once: 98.2 MiB reserved against
/// 84.2 MiB (quickstart, micro-batch 8 x 4, 145 px, f16, checkpointing,
/// lavapipe). On a CPU backend and in a browser, and with `largest_allocation` 0, it only hands
/// the free pages back (`memory_cleanup`).
pub fn size_the_pools(device: &Device, largest_allocation: u64) {
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(cube) = cube_device(device)
        && largest_allocation > 0
    {
        let client = cube.client();
        drop(client.empty(usize::try_from(largest_allocation).unwrap_or(usize::MAX)));
    }
    #[cfg(target_arch = "wasm32")]
    let _ = largest_allocation;
    device.memory_cleanup();
}

/// What `device` reserves outside its dynamic pools, by name: cubecl's persistent pool,
/// its dedicated buffers (a first step run [`outside_the_pools`]) and each memory the runtime
/// keeps for its own use (staging, uniforms), in bytes reserved over every stream; `None` on a
/// CPU backend and in a browser.
pub fn memory_outside_the_pools(device: &Device) -> Option<Vec<(String, u64)>> {
    #[cfg(target_arch = "wasm32")]
    {
        let _ = device;
        None
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        let cube = cube_device(device)?;
        let report = cube.client().memory_report(burn::cubecl::MemoryScope::Device);
        let mut named: Vec<(String, u64)> = Vec::new();
        let mut add = |name: &str, bytes: u64| match named.iter_mut().find(|(n, _)| n == name) {
            Some((_, b)) => *b += bytes,
            None => named.push((name.to_string(), bytes)),
        };
        for stream in &report.streams {
            add("persistent", stream.pools.persistent.usage.bytes_reserved);
            add("dedicated", stream.pools.dedicated.usage.bytes_reserved);
            for aux in &stream.auxiliary {
                add(&aux.name, aux.pools.usage().bytes_reserved);
            }
        }
        Some(named)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter(index: usize, name: &str, device_type: &str) -> AdapterInfo {
        AdapterInfo {
            index,
            name: name.into(),
            backend: "Vulkan".into(),
            device_type: device_type.into(),
            driver: String::new(),
            max_buffer_size: 1 << 30,
            max_storage_buffer_binding_size: 1 << 27,
            shader_f16: false,
            device_local_bytes: None,
            kind: None,
        }
    }

    #[test]
    fn software_adapters_are_known_by_type_or_by_name() {
        let software = [
            adapter(0, "llvmpipe (LLVM 15.0.6, 256 bits)", "Cpu"),
            adapter(0, "SwiftShader Device (Subzero)", "Cpu"),
            adapter(0, "Microsoft Basic Render Driver", "Other"),
            adapter(0, "Google SwiftShader", "IntegratedGpu"),
        ];
        assert!(software.iter().all(AdapterInfo::is_software));
        let hardware = [
            adapter(0, "NVIDIA GeForce RTX 3060", "DiscreteGpu"),
            adapter(0, "AMD Radeon Graphics (RADV RENOIR)", "IntegratedGpu"),
            adapter(0, "Apple M2", "IntegratedGpu"),
        ];
        assert!(!hardware.iter().any(AdapterInfo::is_software));
    }

    #[test]
    fn the_default_device_is_a_hardware_adapter_else_the_cpu_saying_why() {
        // Only a software adapter: the CPU backend, naming the adapter and how to use it anyway.
        let lavapipe = adapter(0, "llvmpipe (LLVM 15.0.6, 256 bits)", "Cpu");
        let only = std::slice::from_ref(&lavapipe);
        assert_eq!(default_device(only), DefaultDevice::CpuOverSoftware(0));
        let why = default_device(only).cpu_note(only, "`--device gpu --adapter 0` uses it anyway").unwrap();
        assert!(why.starts_with("running on the CPU (burn flex): the only GPU adapter here, llvmpipe"), "{why}");
        assert!(why.ends_with("`--device gpu --adapter 0` uses it anyway"), "{why}");
        // `--device gpu` alone still takes it.
        assert_eq!(default_adapter(only), Some(0));

        // A real card anywhere in the list wins, even listed after the software adapter, and a
        // discrete card beats an integrated one.
        let integrated = adapter(1, "Intel(R) UHD Graphics 620", "IntegratedGpu");
        let discrete = adapter(2, "NVIDIA GeForce RTX 3060", "DiscreteGpu");
        let two = [lavapipe.clone(), integrated.clone()];
        assert_eq!(default_device(&two), DefaultDevice::Adapter(1));
        assert_eq!(default_device(&two).cpu_note(&two, ""), None);
        assert_eq!(default_device(&[lavapipe.clone(), integrated, discrete]), DefaultDevice::Adapter(2));

        // SwiftShader typed as an integrated GPU is still software.
        let swiftshader = adapter(3, "SwiftShader Device", "IntegratedGpu");
        assert_eq!(default_device(&[swiftshader]), DefaultDevice::CpuOverSoftware(3));

        // No adapter at all: the CPU, saying how to get one.
        assert_eq!(default_device(&[]), DefaultDevice::CpuForWantOfAdapter);
        let why = DefaultDevice::CpuForWantOfAdapter.cpu_note(&[], "").unwrap();
        assert!(why.contains("no GPU adapter found"), "{why}");
    }
}
