//! What the user asks to run on ([`DeviceChoice`]): the default, a wgpu adapter, one of
//! burn's CPU backends ([`CpuBackend`]) or a device of a `vramfit serve` server
//! ([`RemoteAddr`]); as flags and as the entries of `--devices`.

use std::net::{SocketAddr, ToSocketAddrs};

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
    /// A device of a `vramfit serve` server (`crate::device::remote`).
    Remote(RemoteAddr),
}

/// A device of a `vramfit serve` server: the server's address and the device's position in
/// the list it serves (`vramfit serve` prints it). Written `remote:HOST:PORT[/N]`, `N` 0 when
/// left out; the host is resolved when the entry is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct RemoteAddr {
    /// The server's address (its WebSocket listener).
    pub addr: SocketAddr,
    /// The device's index in the server's list.
    pub index: u16,
}

impl RemoteAddr {
    /// `remote:ADDR` or `remote:ADDR/N` ([`Self::parse`] reads it back).
    pub fn token(self) -> String {
        match self.index {
            0 => format!("remote:{}", self.addr),
            n => format!("remote:{}/{n}", self.addr),
        }
    }

    /// The server's WebSocket URL, `ws://ADDR`.
    pub fn url(self) -> String {
        format!("ws://{}", self.addr)
    }

    /// `HOST:PORT[/N]` (what follows `remote:`), the host resolved to its first address (IPv4
    /// first).
    ///
    /// # Errors
    /// What is wrong with it, naming it: no port, a bad index, a host that does not resolve.
    pub fn parse(rest: &str) -> std::result::Result<Self, String> {
        let (host_port, index) = match rest.rsplit_once('/') {
            Some((host_port, n)) => {
                let index = n.parse().map_err(|_| {
                    format!("`remote:{rest}`: `{n}` is not a device index (remote:HOST:PORT/N, N from 0)")
                })?;
                (host_port, index)
            }
            None => (rest, 0),
        };
        let addrs: Vec<SocketAddr> = host_port
            .to_socket_addrs()
            .map_err(|e| format!("`remote:{rest}`: `{host_port}` is not HOST:PORT of a reachable name ({e})"))?
            .collect();
        let addr = addrs.iter().find(|a| a.is_ipv4()).or(addrs.first()).copied();
        let addr = addr.ok_or_else(|| format!("`remote:{rest}`: `{host_port}` resolves to no address"))?;
        Ok(Self { addr, index })
    }
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
            DeviceChoice::Remote(r) => format!(" --device {}", r.token()),
        }
    }
}

/// The forms of one entry of `--devices` ([`DeviceChoice::from_str`]).
pub const DEVICE_FORMS: &str = "auto, gpu, gpu:N (adapter N of `vramfit devices`), cpu, cpu:flex, cpu:ndarray or remote:HOST:PORT[/N] (device N of a `vramfit serve` server)";

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
            DeviceChoice::Remote(r) => r.token(),
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
        if let Some(rest) = s.trim().strip_prefix("remote:") {
            return RemoteAddr::parse(rest).map(DeviceChoice::Remote);
        }
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
    use super::{CpuBackend, DeviceChoice, RemoteAddr};

    #[test]
    fn device_list_entries_read_back_what_they_write() {
        let all = [
            DeviceChoice::Auto,
            DeviceChoice::Gpu(None),
            DeviceChoice::Gpu(Some(2)),
            DeviceChoice::Cpu(CpuBackend::Flex),
            DeviceChoice::Cpu(CpuBackend::Ndarray),
            DeviceChoice::Remote(RemoteAddr { addr: "127.0.0.1:4100".parse().unwrap(), index: 0 }),
            DeviceChoice::Remote(RemoteAddr { addr: "[::1]:4100".parse().unwrap(), index: 3 }),
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
        assert_eq!(
            "remote:localhost:4100/2".parse::<DeviceChoice>().map(DeviceChoice::token),
            Ok("remote:127.0.0.1:4100/2".into())
        );
        for (bad, says) in [
            ("remote:127.0.0.1", "is not HOST:PORT"),
            ("remote:127.0.0.1:4100/x", "`x` is not a device index"),
            ("remote:no-such-host.invalid:4100", "is not HOST:PORT"),
        ] {
            let err = bad.parse::<DeviceChoice>().unwrap_err();
            assert!(err.contains(bad) && err.contains(says), "{bad}: {err}");
        }
    }
}
