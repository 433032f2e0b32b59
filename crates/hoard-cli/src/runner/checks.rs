//! What `runner setup` and `runner doctor` check before trusting a runner directory and a hoard
//! URL: that the directory is a runner's, that its `Runner.Worker.dll` is not patched the old way,
//! that the URL is one BuildKit's container can reach, which version the runner is, and what
//! hoard's `/readyz` says. The rules are pure functions; the probes are thin around them.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use url::{Host, Url};

/// `ACTIONS_RESULTS_ORL` and `ACTIONS_CACHE_ORL` as the old DLL patch (docs/runners.md) leaves
/// them: UTF-16LE, as .NET stores string literals.
const PATCHED_NAMES: [&str; 2] = ["ACTIONS_RESULTS_ORL", "ACTIONS_CACHE_ORL"];

fn utf16le(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

/// The renamed variables found in the bytes of a `Runner.Worker.dll`: non-empty means the runner
/// was patched the old way.
pub fn dll_patches(dll: &[u8]) -> Vec<&'static str> {
    PATCHED_NAMES
        .into_iter()
        .filter(|name| {
            let needle = utf16le(name);
            dll.windows(needle.len()).any(|w| w == needle.as_slice())
        })
        .collect()
}

/// Whether the host of `url` is one a container on the runner machine cannot reach as the
/// runner does: a loopback or link-local address, or `localhost` (and `*.localhost`).
pub fn is_loopback_host(url: &Url) -> bool {
    match url.host() {
        Some(Host::Ipv4(ip)) => is_loopback_ip(IpAddr::V4(ip)),
        Some(Host::Ipv6(ip)) => is_loopback_ip(IpAddr::V6(ip)),
        Some(Host::Domain(name)) => {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            name == "localhost" || name.ends_with(".localhost")
        }
        None => false,
    }
}

pub fn is_loopback_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_link_local() || v4.is_unspecified(),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_loopback_ip(IpAddr::V4(v4));
            }
            v6.is_loopback() || v6.is_unspecified() || (v6.segments()[0] & 0xffc0) == 0xfe80
        }
    }
}

/// The addresses a host name of `url` resolves to, if every one is loopback or link-local (a
/// machine's own name mapped to 127.0.1.1 in /etc/hosts, as Debian does). `None` for an address
/// literal, a name that does not resolve, or one with any other address.
pub async fn resolves_to_loopback(url: &Url) -> Option<Vec<IpAddr>> {
    let Some(Host::Domain(name)) = url.host() else {
        return None;
    };
    let port = url.port_or_known_default().unwrap_or(80);
    let addrs: Vec<IpAddr> = tokio::net::lookup_host((name, port))
        .await
        .ok()?
        .map(|a| a.ip())
        .collect();
    (!addrs.is_empty() && addrs.iter().all(|ip| is_loopback_ip(*ip))).then_some(addrs)
}

/// What a runner directory holds, as `config.sh` and the runner's tarball leave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerDir {
    pub root: PathBuf,
    /// `.runner` exists: `config.sh` registered it (ARC images are registered at start instead).
    pub configured: bool,
    /// `.service` exists: `svc.sh install` made it a service.
    pub service: bool,
}

/// The directory as a runner's, or why it is not one. A runner directory has `bin/Runner.Listener`
/// and `run.sh` (both in the tarball, kept by every update); `config.sh` adds `.runner`.
pub fn runner_dir(dir: &Path) -> Result<RunnerDir, String> {
    let root = dir
        .canonicalize()
        .map_err(|e| format!("cannot open {}: {e}", dir.display()))?;
    let missing: Vec<&str> = ["bin/Runner.Listener", "run.sh"]
        .into_iter()
        .filter(|f| !root.join(f).is_file())
        .collect();
    if !missing.is_empty() {
        let windows = root.join("bin/Runner.Listener.exe").is_file();
        return Err(if windows {
            format!("{} is a Windows runner: hoard runner setup writes a bash hook and supports Linux and macOS runners only", root.display())
        } else {
            format!(
                "{} is not a runner directory: it has no {} (give --runner-dir the directory where you ran config.sh, the one with run.sh and bin/)",
                root.display(),
                missing.join(" and no ")
            )
        });
    }
    Ok(RunnerDir {
        configured: root.join(".runner").is_file(),
        service: root.join(".service").is_file(),
        root,
    })
}

impl RunnerDir {
    pub fn env_file(&self) -> PathBuf {
        self.root.join(".env")
    }

    pub fn hoard_dir(&self) -> PathBuf {
        self.root.join(".hoard")
    }

    /// The command that makes the runner read `.env` again.
    pub fn restart_command(&self) -> String {
        let root = self.root.display();
        if self.service {
            format!("cd {root} && sudo ./svc.sh stop && sudo ./svc.sh start")
        } else {
            format!("stop the runner's ./run.sh (Ctrl-C) and start it again in {root}")
        }
    }

    /// The renamed variables in `bin/Runner.Worker.dll`, if it can be read.
    pub fn dll_patches(&self) -> Option<Vec<&'static str>> {
        std::fs::read(self.root.join("bin/Runner.Worker.dll"))
            .ok()
            .map(|bytes| dll_patches(&bytes))
    }

    /// How to undo the old patch.
    pub fn dll_restore_hint(&self) -> String {
        let orig = self.root.join("bin/Runner.Worker.dll.orig");
        if orig.is_file() {
            format!(
                "stop the runner, then restore the original: cp {} {}; and remove the ACTIONS_RESULTS_URL/ACTIONS_CACHE_URL lines the patch put in .env",
                orig.display(),
                self.root.join("bin/Runner.Worker.dll").display()
            )
        } else {
            "stop the runner and reinstall it (unpack the runner tarball of its version over this directory: bin/ is replaced, .env and .runner stay); remove the ACTIONS_RESULTS_URL/ACTIONS_CACHE_URL lines the patch put in .env".to_owned()
        }
    }

    /// The runner's version, as `bin/Runner.Listener --version` prints it.
    ///
    /// As root (`sudo hoard runner doctor`), the program, which the runner's user can replace, runs
    /// as the owner of the runner directory, never as root: through `setpriv` with that user's
    /// ids and no supplementary groups. Without `setpriv` it is not run at all.
    pub fn version(&self) -> Result<String, String> {
        let listener = self.root.join("bin/Runner.Listener");
        let mut command = match self.unprivileged_owner()? {
            None => std::process::Command::new(&listener),
            Some((uid, gid)) => {
                let mut command = std::process::Command::new("setpriv");
                command
                    .args(["--reuid", &uid.to_string(), "--regid", &gid.to_string()])
                    .args(["--clear-groups", "--"])
                    .arg(&listener);
                command
            }
        };
        let out = command
            .arg("--version")
            .current_dir(&self.root)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound if command.get_program() == "setpriv" => {
                    "not run: as root, hoard runs bin/Runner.Listener as the runner directory's \
                     owner with setpriv (util-linux), which is not installed"
                        .to_owned()
                }
                _ => format!("cannot run bin/Runner.Listener --version: {e}"),
            })?;
        let text = String::from_utf8_lossy(&out.stdout);
        let version = text.trim();
        if !out.status.success() || parse_version(version).is_none() {
            return Err(format!(
                "bin/Runner.Listener --version answered {:?} ({})",
                version, out.status
            ));
        }
        Ok(version.to_owned())
    }

    /// Whom to run the runner's own programs as, when hoard runs as root: the first owner
    /// other than root of the runner directory, its `bin/` and `bin/Runner.Listener` (uid, gid),
    /// any of whom could have put their code there. `None` when hoard is not root, or when root
    /// owns all three.
    fn unprivileged_owner(&self) -> Result<Option<(u32, u32)>, String> {
        use std::os::unix::fs::MetadataExt;
        if !rustix::process::geteuid().is_root() {
            return Ok(None);
        }
        for path in [
            self.root.clone(),
            self.root.join("bin"),
            self.root.join("bin/Runner.Listener"),
        ] {
            let meta = std::fs::symlink_metadata(&path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            if meta.uid() != 0 {
                return Ok(Some((meta.uid(), meta.gid())));
            }
        }
        Ok(None)
    }
}

/// `major.minor.patch`.
pub fn parse_version(v: &str) -> Option<(u32, u32, u32)> {
    let mut parts = v.trim().split('.').map(|p| p.parse::<u32>().ok());
    let version = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(version)
}

/// A runner older than this (December 2022) is far older than any GitHub still accepts (GitHub
/// refuses runners that fall behind its releases), so the set-up cannot have been tested on it.
pub const MIN_RUNNER: (u32, u32, u32) = (2, 300, 0);

/// What hoard's `/readyz` said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Ready; where it forwards the results service (`None`: it does not, or cannot say).
    Ready { forwards_to: Option<String> },
    /// It answered, but not ready.
    NotReady(String),
    /// No answer.
    Unreachable(String),
}

/// Reads `/readyz` at `base` within `timeout`.
pub async fn readiness(base: &Url, timeout: Duration) -> Readiness {
    let http = match reqwest::Client::builder().timeout(timeout).build() {
        Ok(http) => http,
        Err(e) => return Readiness::Unreachable(e.to_string()),
    };
    let url = match base.join("/readyz") {
        Ok(url) => url,
        Err(e) => return Readiness::Unreachable(e.to_string()),
    };
    let answer = match http.get(url).send().await {
        Ok(answer) => answer,
        Err(e) => {
            let cause = if e.is_timeout() {
                format!("no answer within {}", humantime::format_duration(timeout))
            } else {
                error_chain(&e)
            };
            return Readiness::Unreachable(cause);
        }
    };
    let status = answer.status();
    let body: serde_json::Value = answer.json().await.unwrap_or_default();
    if status != reqwest::StatusCode::OK || body["status"] != "ready" {
        return Readiness::NotReady(format!("answered {status}: {body}"));
    }
    Readiness::Ready {
        forwards_to: body["forwarding"]["results"].as_str().map(str::to_owned),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_link_local_hosts_are_named() {
        for url in [
            "http://127.0.0.1:3000/",
            "http://127.1.2.3/",
            "http://localhost:3000/",
            "http://LOCALHOST./",
            "http://hoard.localhost/",
            "http://[::1]:3000/",
            "http://[::ffff:127.0.0.1]/",
            "http://169.254.169.254/",
            "http://[fe80::1]/",
            "http://0.0.0.0:3000/",
        ] {
            assert!(is_loopback_host(&Url::parse(url).unwrap()), "{url}");
        }
        for url in [
            "http://cache.internal:3000/",
            "http://10.0.0.5:3000/",
            "http://192.168.1.2/",
            "http://[fd00::1]/",
            "http://localhost.example.com/",
        ] {
            assert!(!is_loopback_host(&Url::parse(url).unwrap()), "{url}");
        }
    }

    #[tokio::test]
    async fn names_that_resolve_to_loopback_only_are_found() {
        let local = Url::parse("http://localhost:3000/").unwrap();
        let addrs = resolves_to_loopback(&local).await.unwrap();
        assert!(addrs.iter().all(|ip| ip.is_loopback()), "{addrs:?}");
        // An address is judged as written, and a name that does not resolve is not refused.
        for url in ["http://127.0.0.1:3000/", "http://hoard.invalid:3000/"] {
            assert_eq!(resolves_to_loopback(&Url::parse(url).unwrap()).await, None);
        }
    }

    #[test]
    fn the_old_dll_patch_is_found() {
        let mut dll = b"MZ\x90\x00 some bytes ".to_vec();
        dll.extend(utf16le("ACTIONS_RESULTS_URL"));
        assert!(dll_patches(&dll).is_empty());
        // ASCII is not how .NET keeps the name.
        dll.extend(b"ACTIONS_RESULTS_ORL");
        assert!(dll_patches(&dll).is_empty());
        dll.extend(utf16le("ACTIONS_RESULTS_ORL"));
        assert_eq!(dll_patches(&dll), ["ACTIONS_RESULTS_ORL"]);
        dll.extend(utf16le("ACTIONS_CACHE_ORL"));
        assert_eq!(
            dll_patches(&dll),
            ["ACTIONS_RESULTS_ORL", "ACTIONS_CACHE_ORL"]
        );
    }

    #[test]
    fn runner_versions_parse() {
        assert_eq!(parse_version("2.336.0\n"), Some((2, 336, 0)));
        assert_eq!(parse_version("2.336"), None);
        assert_eq!(parse_version("v2.336.0"), None);
        assert_eq!(parse_version("2.336.0.1"), None);
    }
}
