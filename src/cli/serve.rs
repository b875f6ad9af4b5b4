//! `vramfit serve`: this machine's devices for other machines' runs, through burn's remote
//! server (burn-remote, WebSocket transport). A client trains on them with
//! `--device remote:HOST:PORT[/N]` or as entries of `--devices` (`crate::device::remote`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::device::{self, DeviceChoice, remote::TOKEN_VARIABLE};

/// `vramfit serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The devices served, comma-separated, numbered from 0 in this order (a client's
    /// remote:HOST:PORT/N picks device N). One server serves one backend (burn's remote server
    /// takes the devices of one): adapters (gpu, gpu:N) or one CPU backend (cpu, cpu:ndarray);
    /// serve the other from a second `vramfit serve` on another port. Default: every hardware
    /// adapter, else the CPU.
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<DeviceChoice>,
    /// The address to listen on. The default answers this machine only; give the machine's
    /// address (or 0.0.0.0) to serve a trusted network: the WebSocket transport is unencrypted.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: std::net::IpAddr,
    /// The port; 0 takes a free one (printed).
    #[arg(long, default_value_t = 4100)]
    pub port: u16,
    /// The file holding the token clients must present (in their VRAMFIT_TOKEN). Made, with a
    /// random token readable by its owner only, when it does not exist. Without it the token is
    /// VRAMFIT_TOKEN's.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
}

/// Runs `vramfit serve` until Ctrl-C.
///
/// # Errors
/// No token, a device that cannot be opened or served, a port in use.
pub fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    if !cfg!(feature = "remote") {
        anyhow::bail!("vramfit serve: {}", device::remote::NOT_BUILT);
    }
    let token = match &args.token_file {
        Some(path) => read_or_make_token(path)?,
        None => std::env::var(TOKEN_VARIABLE).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty()).ok_or_else(|| {
            anyhow::anyhow!(
                "vramfit serve needs a token for its clients: pass --token-file FILE (made with a random token when missing) or set {TOKEN_VARIABLE}"
            )
        })?,
    };
    let choices = if args.devices.is_empty() { default_devices() } else { args.devices.clone() };
    let mut devices = Vec::new();
    println!("vramfit serve: devices");
    for (index, choice) in choices.iter().enumerate() {
        if matches!(choice, DeviceChoice::Remote(_)) {
            anyhow::bail!("--devices {}: a server serves this machine's devices, not another server's", choice.token());
        }
        let selected = device::select(*choice)?;
        println!("  {index}: {} ({})", selected.name, choice.token());
        devices.push(selected);
    }
    // burn's server takes the devices of one backend: refused here, before the port is bound.
    let backend = |d: &device::SelectedDevice| if d.is_gpu() { "wgpu".to_string() } else { d.name.clone() };
    if let Some(other) = devices.iter().find(|d| backend(d) != backend(&devices[0])) {
        anyhow::bail!(
            "cannot serve {} and {} together: one server serves adapters or one CPU backend; serve the other from a second `vramfit serve --port ...`",
            devices[0].name,
            other.name
        );
    }
    let devices: Vec<_> = devices.into_iter().map(|d| d.device).collect();
    let listener = std::net::TcpListener::bind((args.bind, args.port)).with_context(|| {
        format!("cannot listen on {}:{} (another server there? --port 0 takes a free one)", args.bind, args.port)
    })?;
    let addr = listener.local_addr()?;
    println!(
        "vramfit serve: listening on ws://{addr}; clients set {TOKEN_VARIABLE} to the token and train with --device remote:{addr}[/N]"
    );
    if !args.bind.is_loopback() {
        println!("vramfit serve: the WebSocket transport is unencrypted: serve only a network you trust");
    }
    std::io::stdout().flush()?;
    sessions::serve(devices, &token, listener)
}

/// Every hardware adapter, else the default CPU backend (a software adapter is slower than it).
fn default_devices() -> Vec<DeviceChoice> {
    let hardware: Vec<DeviceChoice> =
        device::list_adapters().iter().filter(|a| !a.is_software()).map(|a| DeviceChoice::Gpu(Some(a.index))).collect();
    if hardware.is_empty() { vec![DeviceChoice::Cpu(device::CpuBackend::DEFAULT)] } else { hardware }
}

/// The token in `path`, or a new random one written there (owner-only permissions) when the
/// file does not exist.
///
/// # Errors
/// The file cannot be read or made, or it is empty.
fn read_or_make_token(path: &Path) -> anyhow::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(text) if !text.trim().is_empty() => Ok(text.trim().to_string()),
        Ok(_) => anyhow::bail!("{}: the token file is empty: delete it to have a new token made", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let token: String = (0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut file =
                options.open(path).with_context(|| format!("cannot make the token file {}", path.display()))?;
            writeln!(file, "{token}").with_context(|| format!("cannot write the token file {}", path.display()))?;
            println!("vramfit serve: made a new token in {}", path.display());
            Ok(token)
        }
        Err(e) => Err(e).with_context(|| format!("cannot read the token file {}", path.display())),
    }
}

#[cfg(feature = "remote")]
mod sessions {
    //! The server itself and its log: one line per session asked for (who, which device,
    //! opened or refused) and per session closed (how long it lasted).

    use std::collections::HashMap;
    use std::process::ExitCode;
    use std::time::{Duration, Instant};

    use burn::server::telemetry::{DrainStatus, TelemetryEvent, TelemetryProbe};
    use burn::server::{AuthorizationRequest, PeerAuthorizer, RemoteServer, TokenAuthorizer, WebSocketTransport};
    use burn::tensor::Device;

    /// Serves `devices` on `listener` to clients presenting `token`, until Ctrl-C.
    pub(super) fn serve(
        devices: Vec<Device>,
        token: &str,
        listener: std::net::TcpListener,
    ) -> anyhow::Result<ExitCode> {
        let tokens = TokenAuthorizer::new(token.to_string()).map_err(|_| anyhow::anyhow!("the token is empty"))?;
        let served = devices.len();
        let authorizer = move |request: AuthorizationRequest<'_>| {
            let client = request.client;
            let device = request.device_index;
            let verdict = tokens.authorize(request);
            // burn checks the index after the token: a good token on a missing device is told
            // "no such device" by burn, not "opened".
            match &verdict {
                Ok(()) if device as usize >= served => {
                    println!("vramfit serve: {client} asked for device {device}: none (this server serves {served})")
                }
                Ok(()) => println!("vramfit serve: {client} asked for device {device}: opened"),
                Err(why) => println!("vramfit serve: {client} asked for device {device}: refused ({why})"),
            }
            verdict
        };
        let (probe, subscription) = TelemetryProbe::channel(1 << 16);
        std::thread::Builder::new().name("vramfit-serve-log".into()).spawn(move || log_sessions(subscription))?;
        RemoteServer::new(devices)
            .with_authorizer(authorizer)
            .with_telemetry(probe)
            .serve(WebSocketTransport::from_listener(listener))
            .map_err(|e| anyhow::anyhow!("the server stopped: {e}"))?;
        println!("vramfit serve: stopped");
        Ok(ExitCode::SUCCESS)
    }

    /// Prints when each session opens and how long it lasted when it closes.
    fn log_sessions(mut subscription: burn::server::telemetry::TelemetrySubscription) {
        let mut open = HashMap::new();
        let mut events = Vec::new();
        loop {
            let status = subscription.drain_into(&mut events);
            for event in events.drain(..) {
                match &*event {
                    TelemetryEvent::SessionOpened { session, device } => {
                        println!("vramfit serve: session {session} on device {device} started");
                        open.insert(*session, Instant::now());
                    }
                    TelemetryEvent::SessionClosed { session } => {
                        let lasted = open.remove(session).map_or(0.0, |t: Instant| t.elapsed().as_secs_f64());
                        println!("vramfit serve: session {session} ended after {lasted:.1} s");
                    }
                    _ => {}
                }
            }
            if matches!(status, DrainStatus::Closed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[cfg(not(feature = "remote"))]
mod sessions {
    pub(super) fn serve(
        _: Vec<burn::tensor::Device>,
        _: &str,
        _: std::net::TcpListener,
    ) -> anyhow::Result<std::process::ExitCode> {
        anyhow::bail!("vramfit serve: {}", crate::device::remote::NOT_BUILT)
    }
}
