//! Reading a device's memory: one sample ([`sample`]), the peaks a run tracks over its samples
//! ([`MemoryTracker`]), and a probe thread that reads the device while another computes
//! ([`MemoryProbe`]). What the plan in [`crate::memory`] is measured against.

use serde::Serialize;

/// Running record of measured device memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct MemoryTracker {
    /// Largest `bytes_in_use` sampled (taken after the forward pass, where the peak sits).
    pub peak_bytes_in_use: u64,
    /// Largest `bytes_reserved` sampled.
    pub peak_bytes_reserved: u64,
    /// Pools' reserved high-water mark: sum of `page_size x pages_peak` (an upper bound).
    pub pools_high_water: u64,
}

/// One reading of a device's memory, `None` on backends without pools (CPU).
pub fn sample(device: &burn::tensor::Device) -> Option<(u64, u64)> {
    device.memory_pool_usage().map(|u| (u.bytes_in_use, u.bytes_reserved))
}

impl MemoryTracker {
    /// Samples `device`, updates the peaks, and returns `(bytes_in_use, bytes_reserved)`.
    /// This synchronizes the device: call it every few steps, not every step.
    pub fn sample(&mut self, device: &burn::tensor::Device) -> Option<(u64, u64)> {
        let (in_use, reserved) = sample(device)?;
        self.peak_bytes_in_use = self.peak_bytes_in_use.max(in_use);
        self.peak_bytes_reserved = self.peak_bytes_reserved.max(reserved);
        if let Some(pools) = device.memory_pool_report() {
            let hw: u64 = pools.iter().map(|p| p.page_size * p.pages_peak).sum();
            self.pools_high_water = self.pools_high_water.max(hw);
        }
        Some((in_use, reserved))
    }
}

/// Samples a device's memory from a thread of its own while the caller's thread computes, so
/// the peaks inside the backward pass (where recomputed checkpoint segments live) are seen, not
/// only the state between steps. Each reading drains the device's queue, so a probe slows the
/// work it watches: it is for benchmarks and the memory cap, not for every run.
pub struct MemoryProbe {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<ProbePeaks>>,
}

/// The largest values a [`MemoryProbe`] saw (bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ProbePeaks {
    /// Largest `bytes_in_use` read.
    pub bytes_in_use: u64,
    /// Largest `bytes_reserved` read.
    pub bytes_reserved: u64,
    /// Readings taken.
    pub samples: u64,
}

impl MemoryProbe {
    /// Starts reading `device` every `interval` (a reading takes as long as the device's queue
    /// takes to drain). Returns `None` on backends without pools (CPU).
    pub fn start(device: &burn::tensor::Device, interval: std::time::Duration) -> Option<Self> {
        sample(device)?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (device, flag) = (device.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut peaks = ProbePeaks::default();
            loop {
                let done = flag.load(std::sync::atomic::Ordering::Relaxed);
                if let Some((in_use, reserved)) = sample(&device) {
                    peaks.bytes_in_use = peaks.bytes_in_use.max(in_use);
                    peaks.bytes_reserved = peaks.bytes_reserved.max(reserved);
                    peaks.samples += 1;
                }
                if done {
                    return peaks;
                }
                std::thread::sleep(interval);
            }
        });
        Some(Self { stop, thread: Some(thread) })
    }

    /// Stops the probe after one last reading and returns its peaks.
    pub fn finish(mut self) -> ProbePeaks {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default()
    }
}

impl Drop for MemoryProbe {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
