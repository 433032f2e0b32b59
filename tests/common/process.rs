//! The `hoard` binary as its own process (`CARGO_BIN_EXE_hoard`), so a test can measure it,
//! read its log and kill it.
#![allow(dead_code)] // Each test binary uses a different part of this module.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::databases::Backend;

/// A command running the `hoard` binary as a test does: the machine's own free space is not
/// the test's (as in the in-process harness), or a host disk over 95% full would have `gc`
/// evict every entry and `serve` refuse saves.
pub fn hoard_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hoard"));
    command.env("HOARD_MIN_FREE_SPACE", "0");
    command
}

/// The `hoard` binary running as its own process, so it can be measured and killed.
pub struct Hoard {
    child: Child,
    pub base: String,
    pub data: PathBuf,
    /// Every line the server wrote to standard error so far.
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Hoard {
    /// Trusts HS256 tokens signed with the test secret.
    pub fn start(data: &Path) -> Self {
        Self::start_on(data, &Backend::sqlite())
    }

    /// Like [`Hoard::start`], with its metadata on `backend`.
    pub fn start_on(data: &Path, backend: &Backend) -> Self {
        let secret = super::secret_file(data);
        let mut args = vec!["--token-hs256-secret-file", secret.to_str().unwrap()];
        args.extend(backend.args());
        Self::start_with_env(data, &args, backend.env())
    }

    pub fn start_with(data: &Path, extra: &[&str]) -> Self {
        Self::start_with_env(data, extra, &[])
    }

    /// Like [`Hoard::start_with`], with `env` set for the server (object storage settings).
    pub fn start_with_env(data: &Path, extra: &[&str], env: &[(String, String)]) -> Self {
        let mut command = hoard_command();
        command.envs(env.iter().map(|(k, v)| (k, v)));
        Self::start_command(command, data, extra)
    }

    /// `hoard serve` on `data` with `extra`, run by `command`: the binary itself, or a program
    /// that ends by executing the arguments it is given after its own (the process started is
    /// the one killed).
    pub fn start_command(command: Command, data: &Path, extra: &[&str]) -> Self {
        Self::start_mode(command, "serve", data, extra)
    }

    /// `hoard edge` on `data` with `extra` (`--origin` among them).
    pub fn start_edge(data: &Path, extra: &[&str]) -> Self {
        Self::start_edge_command(hoard_command(), data, extra)
    }

    /// Like [`Hoard::start_edge`], run by `command` (the binary with an environment of its own).
    pub fn start_edge_command(command: Command, data: &Path, extra: &[&str]) -> Self {
        Self::start_mode(command, "edge", data, extra)
    }

    /// `hoard MODE` on `data` with `extra`, on a free port unless `extra` has a `--listen`.
    fn start_mode(mut command: Command, mode: &str, data: &Path, extra: &[&str]) -> Self {
        let is_hoard = command.get_program() == env!("CARGO_BIN_EXE_hoard");
        if !is_hoard {
            command.arg(env!("CARGO_BIN_EXE_hoard"));
        }
        command.arg(mode);
        if !extra.contains(&"--listen") {
            command.args(["--listen", "127.0.0.1:0"]);
        }
        let mut child = command
            .arg("--data-dir")
            .arg(data)
            .args(extra)
            // Also when `command` is a wrapper that runs the binary.
            .env("HOARD_MIN_FREE_SPACE", "0")
            // Request lines (debug level) too: tests count uploads by them.
            .env("RUST_LOG", "info,hoard::request=debug")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start hoard");
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in stderr.lines().map_while(Result::ok) {
                    if let Some(addr) = line.split("listening on ").nth(1) {
                        let _ = addr_tx.send(addr.trim().to_owned());
                    }
                    log.lock().unwrap().push(line);
                }
            });
        }
        let addr = addr_rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("hoard did not start: {:?}", log.lock().unwrap()));
        Self {
            child,
            base: format!("http://{addr}"),
            data: data.to_owned(),
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Peak resident memory of the server so far, from /proc.
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    /// Successful PUTs to upload links so far, from the request log.
    pub fn upload_puts(&self) -> usize {
        let log = self.log.lock().unwrap();
        log.iter()
            .filter(|l| {
                l.contains("method=PUT")
                    && l.contains("/_blob/uploads/")
                    && l.contains("status=201")
            })
            .count()
    }

    /// Waits for the process to exit by itself.
    pub fn wait(mut self) -> std::process::ExitStatus {
        self.child.wait().unwrap()
    }

    /// Kills the process (SIGKILL) and waits for it, keeping the handle (its log stays).
    pub fn kill_in_place(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn kill_9(mut self) -> PathBuf {
        self.child.kill().unwrap(); // SIGKILL
        self.child.wait().unwrap();
        self.data.clone()
    }
}

impl Drop for Hoard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
