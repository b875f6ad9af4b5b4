//! Devices of a `vramfit serve` server, reached through burn's remote backend (burn-remote's
//! WebSocket transport): [`open`] connects one, [`set_credential`] holds the token the
//! server's authorizer checks.
//!
//! On a remote device every tensor operation runs on the server's backend (its CPU backend or
//! its adapter); the client keeps the autodiff graph, the optimizer's bookkeeping and the run
//! folder. vramfit's own kernels (GELU, GroupNorm + GELU, the depthwise convolution, the
//! augmentation kernel) are not forwarded: a remote device takes burn's operations for them,
//! as any device they do not cover does (`crate::kernels`).

use std::sync::OnceLock;

use super::{RemoteAddr, SelectedDevice};
use crate::{Error, Result};

/// The credential the client presents, set once by the process ([`set_credential`]); empty
/// until then, which a server started with a token refuses.
static CREDENTIAL: OnceLock<String> = OnceLock::new();

/// The environment variable the command line reads the token from (`VRAMFIT_TOKEN`): the
/// contents of the server's token file. A variable rather than a flag keeps it out of process
/// lists and out of the resume commands vramfit prints, and the training worker inherits it.
pub const TOKEN_VARIABLE: &str = "VRAMFIT_TOKEN";

/// What a build without the `remote` feature says when asked for a remote device or a server.
pub const NOT_BUILT: &str = "this vramfit was built without remote devices (build it with `--features remote`)";

/// The token this process presents to every server it connects; the first call wins.
pub fn set_credential(token: impl Into<String>) {
    let _ = CREDENTIAL.set(token.into().trim().to_string());
}

/// Connects device `remote.index` of the server at `remote.addr`.
///
/// # Errors
/// [`Error::Device`], naming the device and the likely fix: no server answers there, the
/// server refused the token, it has no such device, or this build has no remote devices (the
/// `remote` cargo feature).
#[cfg(all(feature = "remote", not(target_arch = "wasm32")))]
pub fn open(remote: RemoteAddr) -> Result<SelectedDevice> {
    use burn::remote::{ConnectError, RemoteHost};
    use burn::tensor::Device;

    let credential = CREDENTIAL.get().cloned().unwrap_or_default();
    let host = RemoteHost::websocket(&remote.url()).with_credential(credential);
    let device = Device::remote_options(&host).device_index(u32::from(remote.index)).init().map_err(|e| {
        let why = match e {
            ConnectError::Unauthorized => format!(
                "the server refused the token: set {TOKEN_VARIABLE} to the contents of the token file `vramfit serve` was started with"
            ),
            ConnectError::NoSuchDevice { device_count } => {
                format!("the server serves {device_count} device(s), numbered from 0")
            }
            ConnectError::Unreachable { reason } => {
                format!("no vramfit server answers there ({reason}); start one with `vramfit serve`")
            }
            other => other.to_string(),
        };
        Error::Device(format!("{}: {why}", remote.token()))
    })?;
    Ok(SelectedDevice {
        device,
        name: format!("remote device {} of {}", remote.index, remote.addr),
        adapter: None,
        note: None,
        remote: Some(remote),
    })
}

/// Without the `remote` feature (and in a browser) there are no remote devices.
///
/// # Errors
/// Always: [`Error::Device`] saying so.
#[cfg(not(all(feature = "remote", not(target_arch = "wasm32"))))]
pub fn open(remote: RemoteAddr) -> Result<SelectedDevice> {
    Err(Error::Device(format!("{}: {NOT_BUILT}", remote.token())))
}

/// Whether the server of `remote` still accepts connections (a TCP connection to its
/// listener within `timeout`): after a session was lost, whether the server is gone or closed
/// the session itself (the training loop's message says which).
pub fn server_answers(remote: RemoteAddr, timeout: std::time::Duration) -> bool {
    std::net::TcpStream::connect_timeout(&remote.addr, timeout).is_ok()
}
