//! Remote devices: `vramfit serve` processes on 127.0.0.1 (the CPU backend) and clients that
//! train, evaluate and export on them, alone or beside the local CPU; a client without the
//! token refused; a server killed in the middle of a run.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use super::*;

/// A `vramfit serve --devices cpu --port 0` process; killed when dropped.
struct Server {
    child: Child,
    /// `HOST:PORT`, from the line the server prints once it listens.
    addr: String,
    /// Everything it printed.
    log: Arc<Mutex<String>>,
}

impl Server {
    fn start(token_file: &Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_vramfit"))
            .args(["serve", "--devices", "cpu", "--port", "0", "--token-file"])
            .arg(token_file)
            .env_remove("VRAMFIT_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let log = Arc::new(Mutex::new(String::new()));
        let mut addr = None;
        for line in lines.by_ref() {
            let line = line.unwrap();
            log.lock().unwrap().push_str(&format!("{line}\n"));
            if let Some(rest) = line.split_once("listening on ws://").map(|(_, r)| r) {
                addr = Some(rest.split(';').next().unwrap().to_string());
                break;
            }
        }
        let addr = addr.unwrap_or_else(|| panic!("the server never listened:\n{}", log.lock().unwrap()));
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                sink.lock().unwrap().push_str(&format!("{line}\n"));
            }
        });
        Server { child, addr, log }
    }

    fn device(&self) -> String {
        format!("remote:{}", self.addr)
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `vramfit ARGS` with `VRAMFIT_TOKEN` set to `token` (or unset); (exit code, output).
fn client(args: &[&str], token: Option<&str>) -> (Option<i32>, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vramfit"));
    command.args(args).env_remove("VRAMFIT_TOKEN");
    if let Some(token) = token {
        command.env("VRAMFIT_TOKEN", token);
    }
    let out = command.output().unwrap();
    (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `vramfit train --device remote:ADDR` trains on the server (its log shows the session), the
/// run learns, and `eval --device remote:ADDR` scores the exported weights there; the numbers
/// match `eval --device cpu` on the same weights.
#[test]
fn a_run_trains_evaluates_and_exports_on_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    let server = Server::start(&token_file);
    let token = std::fs::read_to_string(&token_file).unwrap();
    let run = dir.path().join("run");
    let data = dataset::bundled_dataset_dir();
    let remote = server.device();
    let args = ["train", "--device", &remote, "--data", path(&data), "--out", path(&run)];
    let (code, text) = client(&[&args[..], &["--epochs", "1", "--batch-size", "32"]].concat(), Some(&token));
    assert_eq!(code, Some(0), "{text}\nserver:\n{}", server.log());
    assert!(text.contains(&format!("training on remote device 0 of {}", server.addr)), "{text}");
    assert!(server.log().contains("asked for device 0: opened"), "{}", server.log());
    let export = run.join("export");
    let eval = |device: &str| {
        // Its CSV files beside the run, not in the working directory (the repository).
        let csv = dir.path().join("confusion.csv");
        let issues = dir.path().join("label_issues.csv");
        let args = ["eval", "--device", device, "--model", path(&export), "--data", path(&data)];
        let args = [&args[..], &["--csv", path(&csv), "--label-issues", path(&issues)]].concat();
        let (code, text) = client(&args, Some(&token));
        assert_eq!(code, Some(0), "{text}");
        let line = text.lines().find(|l| l.contains("top-1")).unwrap_or_else(|| panic!("no top-1 line: {text}"));
        line[line.find("top-1").unwrap()..].to_string()
    };
    let remote_eval = eval(&remote);
    assert_eq!(remote_eval, eval("cpu"));
    let top1: f64 = remote_eval
        .split("top-1")
        .nth(1)
        .unwrap()
        .trim_start_matches([' ', ':'])
        .split('%')
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(top1 > 30.0, "one epoch on the server reached {remote_eval}");
}

/// A client without the server's token (none, or a wrong one) is refused before anything runs:
/// the error names the token variable, no run folder is made, and the server logs the refusal.
#[test]
fn a_server_refuses_a_client_without_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("token"));
    let remote = server.device();
    let data = dataset::bundled_dataset_dir();
    for token in [None, Some("not-the-token")] {
        let run = dir.path().join("run");
        let args = ["train", "--device", &remote, "--data", path(&data), "--out", path(&run), "--max-steps", "1"];
        let (code, text) = client(&args, token);
        assert_ne!(code, Some(0), "{text}");
        assert!(text.contains("the server refused the token: set VRAMFIT_TOKEN"), "{text}");
        assert!(!run.exists(), "a refused run made its folder");
    }
    // The server's lines arrive through a thread: wait for the second.
    let started = std::time::Instant::now();
    while server.log().matches("asked for device 0: refused").count() < 2 && started.elapsed().as_secs() < 30 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(server.log().matches("asked for device 0: refused").count(), 2, "{}", server.log());
    // A refused replica of --devices makes no run folder either.
    let run = dir.path().join("run");
    let devices = format!("cpu,{remote}");
    let args = ["train", "--devices", &devices, "--data", path(&data), "--out", path(&run), "--max-steps", "1"];
    let (code, text) = client(&args, Some("not-the-token"));
    assert!(code != Some(0) && text.contains("the server refused the token"), "{text}");
    assert!(!run.exists(), "a run refused on its second device made its folder");
}

/// A run over two servers and the local CPU (`--devices cpu,remote:A,remote:B`) trains; the
/// same run, resumed on server A alone, ends with an error when A is killed in the middle of
/// it (not a hang), and resumes again on B to the end with every step once.
#[test]
fn a_run_over_two_servers_survives_one_killed_and_resumes_on_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    let mut a = Server::start(&token_file);
    let b = Server::start(&token_file);
    let token = std::fs::read_to_string(&token_file).unwrap();
    let run = dir.path().join("run");
    let data = dataset::bundled_dataset_dir();
    let devices = format!("cpu,{},{}", a.device(), b.device());
    let base = ["train", "--data", path(&data), "--out", path(&run), "--batch-size", "16", "--epochs", "1"];
    let first = [&base[..], &["--devices", &devices, "--grad-accum-steps", "3", "--max-steps", "2"]].concat();
    let (code, text) = client(&first, Some(&token));
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains(&format!(
            "training on CPU (burn flex) + remote device 0 of {} + remote device 0 of {}",
            a.addr, b.addr
        )),
        "{text}"
    );
    assert_eq!(metric_steps(&run), vec![1, 2]);
    assert!(a.log().contains("opened") && b.log().contains("opened"));

    // Resumed on A; A is killed once a step has been logged.
    let device_a = a.device();
    let on_a = [&base[..], &["--resume", "--device", &device_a]].concat();
    let mut resumed = Command::new(env!("CARGO_BIN_EXE_vramfit"));
    resumed.args(&on_a).env("VRAMFIT_TOKEN", &token).stdout(Stdio::piped()).stderr(Stdio::piped());
    let resumed = resumed.spawn().unwrap();
    let started = std::time::Instant::now();
    while metric_steps(&run).len() < 3 {
        assert!(started.elapsed().as_secs() < 300, "no step on A in 300 s");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    a.child.kill().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(resumed.wait_with_output().unwrap()).unwrap());
    let out =
        rx.recv_timeout(std::time::Duration::from_secs(120)).expect("the client hung after its server was killed");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "{text}");
    assert!(text.contains(&format!("the server of {device_a} no longer answers")), "{text}");
    assert!(text.contains("the checkpoint of step 2 (") && text.contains("resume with --resume"), "{text}");

    let device_b = b.device();
    let on_b = [&base[..], &["--resume", "--device", &device_b]].concat();
    let (code, text) = client(&on_b, Some(&token));
    assert_eq!(code, Some(0), "{text}");
    let steps = metric_steps(&run);
    assert_eq!(steps, (1..=*steps.last().unwrap()).collect::<Vec<_>>(), "{text}");
    assert!(run.join("export").join("model.safetensors").is_file());
}
