//! Independent clients of the cache protocol run as their own processes (BuildKit's
//! go-actions-cache, azcopy, sccache, OpenDAL): where each is found or built, and what a test
//! does when one cannot be had. A test skips with a printed sentence, except where
//! `HOARD_TEST_REQUIRE_CLIENTS=1` (set by CI), where that is a failure.
#![allow(dead_code)] // Each test binary uses a different part of this module.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `Some(value)`, or, when the client cannot be had (`why`), a failure where clients are
/// required and a printed skip elsewhere.
pub fn or_skip<T>(client: &str, found: Result<T, String>) -> Option<T> {
    match found {
        Ok(value) => Some(value),
        Err(why) => {
            let required = std::env::var("HOARD_TEST_REQUIRE_CLIENTS").as_deref() == Ok("1");
            assert!(
                !required,
                "{client} is required here (HOARD_TEST_REQUIRE_CLIENTS=1), but {why}"
            );
            eprintln!("skipped: this test runs {client}, but {why}");
            None
        }
    }
}

/// The repository's `target/` directory (where `.ci/run` and `scripts/test` install clients).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// Runs `cmd` to its end off the async runtime (the in-process server keeps serving).
pub async fn output(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || cmd.output().expect("start the client"))
        .await
        .unwrap()
}

/// stdout and stderr of `out`, for failure messages.
pub fn all_of(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Removes the variables that point a cache client somewhere, so that only what a test sets
/// applies.
pub fn clean_env(cmd: &mut Command) -> &mut Command {
    for var in [
        "ACTIONS_RUNTIME_TOKEN",
        "ACTIONS_CACHE_URL",
        "ACTIONS_RESULTS_URL",
        "ACTIONS_CACHE_SERVICE_V2",
        "ACTIONS_CACHE_API_FORCE_VERSION",
        "GITHUB_SERVER_URL",
        "GHCACHE_TOKEN_ENC",
        "GHCACHE_TOKEN_PW",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("NO_PROXY", "*")
}

/// Where `scripts/clients` installs the clients.
pub fn clients_dir() -> PathBuf {
    std::env::var_os("HOARD_CLIENTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("clients"))
}

/// A program `scripts/clients` installed (`bin/azcopy`, `venv/bin/sccache`, …), if it runs
/// with `--version`.
pub fn installed(path: &str) -> Result<PathBuf, String> {
    let exe = clients_dir().join(path);
    match Command::new(&exe).arg("--version").output() {
        Ok(out) if out.status.success() => Ok(exe),
        Ok(out) => Err(format!("{} does not run:\n{}", exe.display(), all_of(&out))),
        Err(e) => Err(format!(
            "{} cannot be run ({e}); run scripts/clients (scripts/test does)",
            exe.display()
        )),
    }
}

/// How a client is pointed at hoard at `base` over v2 or v1, as a runner would: the token and
/// the service URL (with the trailing slash the runner gives it).
pub fn point_at(cmd: &mut Command, base: &str, v2: bool, token: &str) {
    cmd.env("ACTIONS_RUNTIME_TOKEN", token);
    if v2 {
        cmd.env("ACTIONS_CACHE_SERVICE_V2", "true")
            .env("ACTIONS_RESULTS_URL", format!("{base}/"));
    } else {
        cmd.env("ACTIONS_CACHE_URL", format!("{base}/"));
    }
}

/// Requests hoard at `base` answered so far on the v2 service (Twirp), on v1
/// (`/_apis/artifactcache/`) and on upload links: which protocol a client spoke, and how many
/// blob requests its uploads took.
pub async fn requests_by_protocol(http: &reqwest::Client, base: &str) -> (f64, f64, f64) {
    let count = |route: &'static str| async move {
        super::metric(
            http,
            base,
            &format!("hoard_http_requests_total{{route=\"{route}"),
        )
        .await
    };
    (
        count("/twirp/").await,
        count("/_apis/").await,
        count("/_blob/uploads/").await,
    )
}

/// Checks that the client at hoard `base` spoke the protocol `point_at` gave it (v2 if `v2`),
/// and never the other.
pub async fn assert_spoke_only(http: &reqwest::Client, base: &str, v2: bool) {
    let (v2_calls, v1_calls, _) = requests_by_protocol(http, base).await;
    let spoken = if v2 {
        (v2_calls, v1_calls)
    } else {
        (v1_calls, v2_calls)
    };
    assert!(
        spoken.0 > 0.0 && spoken.1 == 0.0,
        "v2 {v2_calls}, v1 {v1_calls} calls"
    );
}
