//! What the user asks to run on ([`DeviceChoice`]): the default, a wgpu adapter or one of
//! burn's CPU backends ([`CpuBackend`]); as flags and as the entries of `--devices`.

use burn::tensor::Device;
use serde::Serialize;

/// burn's CPU backends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CpuBackend {
    /// burn-ndarray (deprecated in burn 0.22, the fallback users know). Native builds only: in a
    /// browser flex is the CPU backend (the web build leaves burn-ndarray out).
    #[cfg(not(target_arch = "wasm32"))]
    Ndarray,
    /// burn-flex, ndarray's successor.
    Flex,
}

impl CpuBackend {
    /// The faster of the two on the machines measured (see README, "CPU inference").
    pub const DEFAULT: CpuBackend = CpuBackend::Flex;

    /// Its short name: `flex` or `ndarray`.
    pub fn name(self) -> &'static str {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            CpuBackend::Ndarray => "ndarray",
            CpuBackend::Flex => "flex",
        }
    }

    /// The burn device.
    pub fn device(self) -> Device {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            #[allow(deprecated)] // ndarray is deprecated upstream but is the fallback users asked for
            CpuBackend::Ndarray => Device::ndarray(),
            CpuBackend::Flex => Device::flex(),
        }
    }
}

/// What the user asked to run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum DeviceChoice {
    /// The fastest kind of device here ([`default_device`]): the first hardware adapter, else
    /// the default CPU backend (a software adapter is left out: the CPU backend beats it).
    Auto,
    /// A wgpu adapter, software ones included: `Some(index)` into [`list_adapters`], `None` for
    /// [`default_adapter`].
    Gpu(Option<usize>),
    /// A CPU backend.
    Cpu(CpuBackend),
}

impl DeviceChoice {
    /// The flags of a `vramfit` command line that choose this device again, each after a
    /// space: none for [`DeviceChoice::Auto`] (it picks the same device on the same machine),
    /// ` --device gpu`, ` --adapter N`, ` --device cpu` and ` --cpu-backend ndarray` where it is
    /// not the default. For the resume commands vramfit prints.
    pub fn flags(self) -> String {
        match self {
            DeviceChoice::Auto => String::new(),
            DeviceChoice::Gpu(None) => " --device gpu".into(),
            DeviceChoice::Gpu(Some(i)) => format!(" --adapter {i}"),
            DeviceChoice::Cpu(b) if b == CpuBackend::DEFAULT => " --device cpu".into(),
            DeviceChoice::Cpu(b) => format!(" --device cpu --cpu-backend {}", b.name()),
        }
    }
}

/// The forms of one entry of `--devices` ([`DeviceChoice::from_str`]).
pub const DEVICE_FORMS: &str = "auto, gpu, gpu:N (adapter N of `vramfit devices`), cpu, cpu:flex or cpu:ndarray";

impl DeviceChoice {
    /// This device as an entry of `--devices`: `auto`, `gpu`, `gpu:N`, `cpu` (the default CPU
    /// backend) or `cpu:ndarray`; [`DeviceChoice::from_str`] reads it back.
    pub fn token(self) -> String {
        match self {
            DeviceChoice::Auto => "auto".into(),
            DeviceChoice::Gpu(None) => "gpu".into(),
            DeviceChoice::Gpu(Some(i)) => format!("gpu:{i}"),
            DeviceChoice::Cpu(b) if b == CpuBackend::DEFAULT => "cpu".into(),
            DeviceChoice::Cpu(b) => format!("cpu:{}", b.name()),
        }
    }

    /// `--devices A,B,...` written back ([`Self::token`] of each, comma-separated), for the
    /// resume commands vramfit prints.
    pub fn list_flag(devices: &[DeviceChoice]) -> String {
        let tokens: Vec<String> = devices.iter().map(|d| d.token()).collect();
        format!(" --devices {}", tokens.join(","))
    }
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;

    /// One entry of `--devices` ([`DEVICE_FORMS`]), case and surrounding spaces ignored.
    ///
    /// # Errors
    /// The entry and the forms it may take, when it is none of them.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let entry = s.trim().to_ascii_lowercase();
        let (kind, index) = match entry.split_once(':') {
            Some((kind, rest)) => (kind, Some(rest)),
            None => (entry.as_str(), None),
        };
        let unknown = || format!("`{}` is not a device: each entry of --devices is one of {DEVICE_FORMS}", s.trim());
        match (kind, index) {
            ("auto", None) => Ok(DeviceChoice::Auto),
            ("gpu", None) => Ok(DeviceChoice::Gpu(None)),
            ("gpu", Some(i)) => i.parse().map(|i| DeviceChoice::Gpu(Some(i))).map_err(|_| unknown()),
            ("cpu", None) | ("cpu", Some("flex")) => Ok(DeviceChoice::Cpu(CpuBackend::Flex)),
            #[cfg(not(target_arch = "wasm32"))]
            ("cpu", Some("ndarray")) => Ok(DeviceChoice::Cpu(CpuBackend::Ndarray)),
            _ => Err(unknown()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{CpuBackend, DeviceChoice};

    #[test]
    fn device_list_entries_read_back_what_they_write() {
        let all = [
            DeviceChoice::Auto,
            DeviceChoice::Gpu(None),
            DeviceChoice::Gpu(Some(2)),
            DeviceChoice::Cpu(CpuBackend::Flex),
            DeviceChoice::Cpu(CpuBackend::Ndarray),
        ];
        for choice in all {
            assert_eq!(choice.token().parse::<DeviceChoice>(), Ok(choice));
        }
        assert_eq!(" GPU:1 ".parse::<DeviceChoice>(), Ok(DeviceChoice::Gpu(Some(1))));
        assert_eq!("cpu:flex".parse::<DeviceChoice>(), Ok(DeviceChoice::Cpu(CpuBackend::Flex)));
        assert_eq!(DeviceChoice::list_flag(&all[1..3]), " --devices gpu,gpu:2");
        for bad in ["gpu:x", "cuda", "cpu:torch", "gpu:-1", ""] {
            let err = bad.parse::<DeviceChoice>().unwrap_err();
            assert!(err.contains(&format!("`{bad}` is not a device")) && err.contains("gpu:N"), "{err}");
        }
    }
}
