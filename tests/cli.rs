//! `hoard caches ls|rm|usage` and `hoard status` against a running server: tables, `--json`,
//! deletions, and one clear sentence with a non-zero exit on every kind of failure.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::process::Output;

use serde_json::{json, Value};

use common::{claims, manual_clock, sign_hs256, TestServer, MAIN, VERSION};

const ADMIN: &str = "cli-admin-token-0123456789abcdef";

/// Runs the hoard binary with `args` against `server`, the admin token in the environment.
async fn hoard(server: &str, token: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hoard"));
    cmd.args(args)
        .env("HOARD_SERVER", server)
        .env_remove("HOARD_ADMIN_TOKEN")
        .env_remove("HOARD_ADMIN_TOKEN_FILE")
        .env("RUST_LOG", "off");
    if let Some(token) = token {
        cmd.env("HOARD_ADMIN_TOKEN", token);
    }
    // The server runs on this test's runtime: wait for the command on another thread.
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// A failure: exit status 1, nothing on standard output, one line on standard error.
fn failure(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    let err = String::from_utf8(out.stderr.clone()).unwrap();
    assert_eq!(err.lines().count(), 1, "one sentence: {err}");
    err
}

fn json_out(out: &Output) -> Value {
    serde_json::from_str(&stdout(out)).unwrap()
}

async fn server_with_entries() -> (TestServer, Vec<i64>) {
    let clock = common::manual_clock();
    let srv = TestServer::start_with_clock(&["--admin-token", ADMIN], clock.clone()).await;
    let mut c = claims("77", &[(MAIN, 3)]);
    c["repository"] = json!("octo/cli");
    let t = sign_hs256(&c);
    let mut ids = Vec::new();
    for (key, size) in [
        ("npm-linux", 2048),
        ("npm-macos", 100),
        ("cargo-linux", 5000),
    ] {
        ids.push(srv.save(&t, key, VERSION, &vec![7u8; size]).await);
    }
    // The restore comes after the last save (times are the server's, in milliseconds).
    clock.advance(std::time::Duration::from_secs(1));
    assert!(srv.restore(&t, "npm-linux", VERSION).await.is_some());
    assert!(srv.restore(&t, "missing", VERSION).await.is_none());
    (srv, ids)
}

#[tokio::test(flavor = "multi_thread")]
async fn ls_usage_and_status_print_tables_and_json() {
    let (srv, ids) = server_with_entries().await;
    let base = srv.base.clone();

    let table = stdout(&hoard(&base, Some(ADMIN), &["caches", "ls"]).await);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("ID") && lines[0].contains("LAST USED"),
        "{table}"
    );
    assert!(
        lines[1].contains("npm-linux") && lines[1].contains("octo/cli"),
        "most recent first: {table}"
    );
    assert!(lines[1].contains("2.0 KiB"), "{table}");
    assert_eq!(lines.last().unwrap(), &"3 of 3 entries");

    let sized = stdout(
        &hoard(
            &base,
            Some(ADMIN),
            &["caches", "ls", "--sort", "size", "--asc", "--limit", "2"],
        )
        .await,
    );
    let rows: Vec<&str> = sized.lines().skip(1).collect();
    assert!(
        rows[0].contains("npm-macos") && rows[1].contains("npm-linux"),
        "{sized}"
    );
    assert_eq!(rows[2], "2 of 3 entries");

    let listed = json_out(
        &hoard(
            &base,
            Some(ADMIN),
            &["caches", "ls", "--key", "NPM", "--json"],
        )
        .await,
    );
    assert_eq!(listed["total_count"], 2);
    let ids_listed: Vec<i64> = listed["actions_caches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids_listed, [ids[0], ids[1]]);
    let none = stdout(
        &hoard(
            &base,
            Some(ADMIN),
            &["caches", "ls", "--repository", "octo/other"],
        )
        .await,
    );
    assert_eq!(none, "No cache entries match.\n");

    let usage = stdout(&hoard(&base, Some(ADMIN), &["caches", "usage"]).await);
    assert!(
        usage.lines().next().unwrap().starts_with("REPOSITORY"),
        "{usage}"
    );
    let row = usage.lines().nth(1).unwrap();
    for cell in ["octo/cli", "7.0 KiB", "3", "50.0%"] {
        assert!(row.contains(cell), "{cell} in {usage}");
    }
    let usage_json = json_out(&hoard(&base, Some(ADMIN), &["caches", "usage", "--json"]).await);
    assert_eq!(usage_json["repositories"][0]["hits"], 1);
    assert_eq!(usage_json["repositories"][0]["misses"], 1);

    let status = stdout(&hoard(&base, Some(ADMIN), &["status"]).await);
    assert!(
        status.starts_with(&format!("hoard {} up", env!("CARGO_PKG_VERSION"))),
        "{status}"
    );
    assert!(status.contains("database   sqlite"), "{status}");
    assert!(status.contains("3 entries"), "{status}");
    assert!(status.contains("1 hits, 1 misses"), "{status}");
    assert!(status.contains("policy     none"), "{status}");
    let status_json = json_out(&hoard(&base, Some(ADMIN), &["status", "--json"]).await);
    assert_eq!(status_json["usage"]["entries"], 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn rm_deletes_by_id_or_filter() {
    let (srv, ids) = server_with_entries().await;
    let base = srv.base.clone();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("admin-token");
    std::fs::write(&token_file, format!("{ADMIN}\n")).unwrap();
    let file = token_file.to_str().unwrap();

    let out = stdout(
        &hoard(
            &base,
            None,
            &["caches", "rm", &ids[2].to_string(), "--token-file", file],
        )
        .await,
    );
    assert_eq!(out, format!("Deleted 1 entry (4.9 KiB): {}.\n", ids[2]));
    let err = failure(&hoard(&base, Some(ADMIN), &["caches", "rm", &ids[2].to_string()]).await);
    assert!(
        err.contains(&format!("entry {}", ids[2])) && err.contains("no such cache entry"),
        "{err}"
    );

    let err = failure(&hoard(&base, Some(ADMIN), &["caches", "rm"]).await);
    assert!(err.contains("say what to delete"), "{err}");
    let err = failure(&hoard(&base, Some(ADMIN), &["caches", "rm", "1", "--key", "npm"]).await);
    assert!(err.contains("not both"), "{err}");

    let deleted = json_out(
        &hoard(
            &base,
            Some(ADMIN),
            &["caches", "rm", "--key", "npm-", "--json"],
        )
        .await,
    );
    assert_eq!(deleted["deleted"], 2, "{deleted}");
    let left = json_out(&hoard(&base, Some(ADMIN), &["caches", "ls", "--json"]).await);
    assert_eq!(left["total_count"], 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_are_one_sentence_and_exit_1() {
    let (srv, _) = server_with_entries().await;
    let base = srv.base.clone();

    let err = failure(&hoard(&base, None, &["caches", "ls"]).await);
    assert!(
        err.contains("no admin token: set HOARD_ADMIN_TOKEN or pass --token-file"),
        "{err}"
    );
    let err = failure(&hoard(&base, Some("wrong-token"), &["status"]).await);
    assert!(err.contains("refused the admin token"), "{err}");
    let err = failure(
        &hoard(
            &base,
            Some(ADMIN),
            &["caches", "ls", "--token-file", "/nonexistent/token"],
        )
        .await,
    );
    assert!(
        err.contains("cannot read the admin token file /nonexistent/token"),
        "{err}"
    );

    // Nothing listens on a port just released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = failure(
        &hoard(
            &format!("http://127.0.0.1:{port}"),
            Some(ADMIN),
            &["status"],
        )
        .await,
    );
    assert!(
        err.contains("cannot reach hoard at") && err.contains("refused"),
        "{err}"
    );
    let err = failure(&hoard("ftp://example", Some(ADMIN), &["status"]).await);
    assert!(err.contains("must be an http(s) URL"), "{err}");
    let prefixed = format!("{base}/namespace-secret-0123456789");
    let err = failure(&hoard(&prefixed, Some(ADMIN), &["status"]).await);
    assert!(err.contains("without a path"), "{err}");
    assert!(
        !err.contains("namespace-secret"),
        "the path is not echoed: {err}"
    );

    // Something that answers 200 with a page (a login portal, another service) is no success.
    let portal = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let portal_url = format!("http://{}", portal.local_addr().unwrap());
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut socket, _)) = portal.accept().await {
            let mut buf = [0u8; 4096];
            let _ = socket.read(&mut buf).await;
            let page = "<html>sign in</html>";
            let _ = socket
                .write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                        page.len()
                    )
                    .as_bytes(),
                )
                .await;
        }
    });
    let err = failure(&hoard(&portal_url, Some(ADMIN), &["caches", "rm", "--all"]).await);
    assert!(err.contains("not with the admin API's JSON"), "{err}");

    // A server without an admin token says how to turn the API on.
    let off = TestServer::start().await;
    let err = failure(&hoard(&off.base, Some(ADMIN), &["caches", "usage"]).await);
    assert!(
        err.contains("404") && err.contains("--admin-token-file"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn writers_are_listed_shown_and_purged_by_run() {
    let srv = TestServer::start_with(&["--admin-token", ADMIN]).await;
    let base = srv.base.clone();
    let run_token = |run: &str| {
        let mut c = claims("78", &[(MAIN, 3)]);
        c["repository"] = json!("octo/runs");
        c["scp"] = json!(format!("Actions.Results:{run}:job-{run}"));
        sign_hs256(&c)
    };
    let (one, two) = (run_token("4001"), run_token("4002"));
    let a = srv.save(&one, "deps-a", VERSION, b"from run 4001").await;
    let b = srv.save(&two, "deps-b", VERSION, b"from run 4002").await;
    let c = srv.save(&two, "deps-c", VERSION, b"also from 4002").await;

    let long = stdout(&hoard(&base, Some(ADMIN), &["caches", "ls", "--long"]).await);
    let header = long.lines().next().unwrap();
    for column in ["WRITTEN", "KIND", "SUBJECT", "RUN", "JOB", "ADDRESS"] {
        assert!(header.contains(column), "{long}");
    }
    let row = |key: &str| long.lines().find(|l| l.contains(key)).unwrap().to_owned();
    assert!(
        row("deps-a").contains("hs256") && row("deps-a").contains("4001"),
        "{long}"
    );
    assert!(
        row("deps-b").contains("job-4002") && row("deps-b").contains("127.0.0.1"),
        "{long}"
    );

    let shown = stdout(&hoard(&base, Some(ADMIN), &["caches", "show", &b.to_string()]).await);
    for line in [
        "written by      hs256",
        "  run           4002",
        "  job           job-4002",
        "digest          sha256:",
    ] {
        assert!(shown.contains(line), "{line:?} in:\n{shown}");
    }

    let dry = stdout(
        &hoard(
            &base,
            Some(ADMIN),
            &["caches", "rm", "--run-id", "4002", "--dry-run"],
        )
        .await,
    );
    assert_eq!(
        dry,
        format!("Dry run: would delete 2 entries (27 B): {b}, {c}. Nothing was deleted.\n")
    );
    let listed = json_out(&hoard(&base, Some(ADMIN), &["caches", "ls", "--json"]).await);
    assert_eq!(listed["total_count"], 3, "a dry run deletes nothing");
    let purged = stdout(&hoard(&base, Some(ADMIN), &["caches", "rm", "--run-id", "4002"]).await);
    assert_eq!(purged, format!("Deleted 2 entries (27 B): {b}, {c}.\n"));
    let left = json_out(&hoard(&base, Some(ADMIN), &["caches", "ls", "--json"]).await);
    assert_eq!(left["actions_caches"][0]["id"], a);
    assert_eq!(left["total_count"], 1);
    assert!(srv.restore(&two, "deps-b", VERSION).await.is_none());
    assert_eq!(
        srv.restore(&one, "deps-a", VERSION).await.unwrap(),
        b"from run 4001"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn stats_prints_families_with_hit_ratio_misses_bytes_and_trend() {
    // The server's clock stands still: every call falls in one hour, the trend's last.
    let srv = TestServer::start_with_clock(&["--admin-token", ADMIN], manual_clock()).await;
    let mut c = claims("78", &[(MAIN, 3)]);
    c["repository"] = json!("octo/stats-cli");
    let t = sign_hs256(&c);
    let key = "deps-Linux-0123456789abcdef";
    assert_eq!(srv.lookup(&t, key, &["deps-Linux-"], VERSION).await.0, 200);
    srv.save(&t, key, VERSION, &[1u8; 3000]).await;
    let (_, hit) = srv.lookup(&t, key, &["deps-Linux-"], VERSION).await;
    assert_eq!(hit["ok"], true, "{hit}");
    srv.lookup(&t, "tool-cache-89abcdef01234567", &[], VERSION)
        .await;

    let out = stdout(
        &hoard(
            &srv.base,
            Some(ADMIN),
            &[
                "caches",
                "stats",
                "--repository",
                "octo/stats-cli",
                "--since",
                "24h",
            ],
        )
        .await,
    );
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("FAMILY") && lines[0].contains("TREND (hit ratio per hour)"),
        "{out}"
    );
    // Most misses first; the ratio, the misses, the bytes and the trend of each family.
    assert!(lines[1].starts_with("deps-Linux-"), "{out}");
    for cell in ["default_branch", "50.0%", "2.9 KiB"] {
        assert!(lines[1].contains(cell), "{cell} in {out}");
    }
    assert!(
        lines[1].ends_with('▅'),
        "the current hour's ratio ends the trend: {out}"
    );
    assert!(
        lines[1]
            .trim_end()
            .chars()
            .rev()
            .take(24)
            .filter(|c| *c == '·')
            .count()
            == 23,
        "{out}"
    );
    assert!(
        lines[2].starts_with("tool-cache-") && lines[2].contains("0.0%"),
        "{out}"
    );
    assert!(lines[3].starts_with("2 families from "), "{out}");

    let json = json_out(
        &hoard(
            &srv.base,
            Some(ADMIN),
            &[
                "caches", "stats", "--json", "--since", "24h", "--sort", "lookups",
            ],
        )
        .await,
    );
    assert_eq!(json["families"][0]["family"], "deps-Linux-");
    assert_eq!(json["families"][0]["lookups"], 2);
    assert_eq!(
        json["families"][0]["trend"]["lookups"]
            .as_array()
            .unwrap()
            .len(),
        24
    );

    let err = failure(
        &hoard(
            &srv.base,
            Some(ADMIN),
            &["caches", "stats", "--scope-class", "feature"],
        )
        .await,
    );
    assert!(err.contains("scope_class must be one of"), "{err}");
    srv.stop().await;
}

/// Characters that must never reach the operator's terminal raw: a control sequence, a line
/// break, a bidi override and a line separator.
fn assert_terminal_safe(out: &str, what: &str) {
    for c in out.chars() {
        let bad = (c.is_control() && c != '\n')
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        assert!(!bad, "{what} prints {c:?} raw:\n{out}");
    }
}

/// Client-supplied text (the repository claim, the `ac` scope, the subject, the key) is shown
/// escaped by every table and listing, as the audit log shows it; `--json` keeps it exact.
#[tokio::test(flavor = "multi_thread")]
async fn client_text_reaches_the_terminal_escaped_and_json_keeps_it_exact() {
    let srv = TestServer::start_with(&["--admin-token", ADMIN]).await;
    let base = srv.base.clone();
    let repository = "octo/evil\n\u{1b}[31mred\u{202e}\u{2028}x";
    let scope = "refs/heads/m\u{1b}[31m\u{202e}\u{2028}\nain";
    let subject = "repo:octo/evil\n\u{1b}[2J\u{202e}\u{2066}\u{2028}";
    let key = "deps-\u{202e}\u{2028}-x";
    let mut c = claims("79", &[(scope, 3)]);
    c["repository"] = json!(repository);
    c["sub"] = json!(subject);
    c["scp"] = json!("Actions.Results:5001:job-5001");
    let t = sign_hs256(&c);
    let id = srv.save(&t, key, VERSION, b"hostile text").await;
    assert_eq!(
        srv.restore(&t, key, VERSION).await.unwrap(),
        b"hostile text"
    );

    // The server keeps the subject as its verifier stored it (which replaces some characters
    // itself): what the terminal shows is that text, escaped.
    let listed = json_out(&hoard(&base, Some(ADMIN), &["caches", "ls", "--json"]).await);
    let stored = listed["actions_caches"][0]["written_by"]["subject"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        stored.contains('\u{202e}') && stored.contains('\u{2028}'),
        "{stored:?}"
    );
    let subject_shown = escaped(&stored);

    let long = stdout(&hoard(&base, Some(ADMIN), &["caches", "ls", "--long"]).await);
    assert_terminal_safe(&long, "ls --long");
    assert_eq!(long.lines().count(), 3, "header, one row, total:\n{long}");
    for shown in [
        "octo/evil\\n\\u{1b}[31mred\\u{202e}\\u{2028}x",
        "refs/heads/m\\u{1b}[31m\\u{202e}\\u{2028}\\nain",
        "deps-\\u{202e}\\u{2028}-x",
        &subject_shown,
    ] {
        assert!(long.contains(shown), "{shown} in:\n{long}");
    }

    let shown = stdout(&hoard(&base, Some(ADMIN), &["caches", "show", &id.to_string()]).await);
    assert_terminal_safe(&shown, "show");
    for line in [
        "repository      octo/evil\\n\\u{1b}[31mred\\u{202e}\\u{2028}x\n",
        "ref             refs/heads/m\\u{1b}[31m\\u{202e}\\u{2028}\\nain\n",
        "key             deps-\\u{202e}\\u{2028}-x\n",
        &format!("  subject       {subject_shown}\n"),
    ] {
        assert!(shown.contains(line), "{line:?} in:\n{shown}");
    }
    assert!(
        shown.contains(&format!("({subject_shown})")),
        "the restorer's subject too:\n{shown}"
    );

    let usage = stdout(&hoard(&base, Some(ADMIN), &["caches", "usage"]).await);
    assert_terminal_safe(&usage, "usage");
    assert!(
        usage.contains("octo/evil\\n\\u{1b}[31mred\\u{202e}\\u{2028}x"),
        "{usage}"
    );

    let restorers = stdout(
        &hoard(
            &base,
            Some(ADMIN),
            &["caches", "restorers", "--run-id", "5001"],
        )
        .await,
    );
    assert_terminal_safe(&restorers, "restorers");
    assert!(restorers.contains(&subject_shown), "{restorers}");
    let dry = stdout(
        &hoard(
            &base,
            Some(ADMIN),
            &["caches", "rm", "--run-id", "5001", "--dry-run"],
        )
        .await,
    );
    assert_terminal_safe(&dry, "rm --dry-run");

    // JSON escapes it itself: the exact text, as stored.
    let entry = &listed["actions_caches"][0];
    assert_eq!(entry["repository"], repository);
    assert_eq!(entry["ref"], scope);
    assert_eq!(entry["key"], key);
    assert!(subject.starts_with("repo:octo/evil"));
}

/// `text` as the CLI must show it: line breaks and tabs as `\n`, `\r`, `\t`, every other
/// control character, bidi control and line or paragraph separator as `\u{…}`.
fn escaped(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\n' => "\\n".to_owned(),
            '\r' => "\\r".to_owned(),
            '\t' => "\\t".to_owned(),
            c if c.is_control()
                || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') =>
            {
                format!("\\u{{{:x}}}", u32::from(c))
            }
            c => c.to_string(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn promote_makes_a_refs_entries_readable_in_another_and_rm_undoes_it() {
    const PR: &str = "refs/pull/7/merge";
    let srv = TestServer::start_with(&["--admin-token", ADMIN]).await;
    let base = srv.base.clone();
    let token = |scope: &str| {
        let mut c = claims("79", &[(scope, 3)]);
        c["repository"] = json!("octo/promo");
        sign_hs256(&c)
    };
    let (pr, main) = (token(PR), token(MAIN));
    let source = srv
        .save(&pr, "deps-pr", VERSION, b"built in the pull request")
        .await;
    let args = |extra: &[&'static str]| {
        let mut all = vec![
            "caches",
            "promote",
            "--repository",
            "octo/promo",
            "--from-scope",
            PR,
            "--to-scope",
            MAIN,
        ];
        all.extend_from_slice(extra);
        all
    };

    let dry = stdout(&hoard(&base, Some(ADMIN), &args(&["--dry-run"])).await);
    assert!(
        dry.starts_with(&format!(
            "Would promote 1 entry (25 B) from {PR} to {MAIN}.\n"
        )),
        "{dry}"
    );
    assert!(srv.restore(&main, "deps-pr", VERSION).await.is_none());

    let done = json_out(&hoard(&base, Some(ADMIN), &args(&["--json"])).await);
    let id = done["promoted"][0]["id"].as_i64().unwrap();
    assert_eq!(done["promoted"][0]["from_id"], source, "{done}");
    let by = done["promoted_by"].as_str().unwrap().to_owned();
    assert_eq!(
        srv.restore(&main, "deps-pr", VERSION).await.unwrap(),
        b"built in the pull request"
    );
    let shown = stdout(&hoard(&base, Some(ADMIN), &["caches", "show", &id.to_string()]).await);
    for line in [
        format!("promoted from   {PR}"),
        format!("  by            {by}"),
        "  for           by hand".to_owned(),
    ] {
        assert!(shown.contains(&line), "{line:?} in:\n{shown}");
    }
    let again = stdout(&hoard(&base, Some(ADMIN), &args(&[])).await);
    assert!(
        again.contains(&format!(
            "1 already in {MAIN} with the same key and version: kept."
        )),
        "{again}"
    );

    let undone = stdout(&hoard(&base, Some(ADMIN), &["caches", "rm", "--promoted-by", &by]).await);
    assert_eq!(undone, format!("Deleted 1 entry (25 B): {id}.\n"));
    assert!(srv.restore(&main, "deps-pr", VERSION).await.is_none());
    assert!(srv.restore(&pr, "deps-pr", VERSION).await.is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_create_prints_a_token_alone_that_reads_the_repository() {
    let (srv, _) = server_with_entries().await;
    let base = srv.base.clone();
    let mut c = claims("77", &[(MAIN, 3)]);
    c["repository"] = json!("octo/cli");
    let job = sign_hs256(&c);
    let put = srv
        .http
        .put(srv.url("/v1/cache/abc123"))
        .bearer_auth(&job)
        .body("an nx output")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);

    let out = hoard(
        &base,
        Some(ADMIN),
        &["tokens", "create", "--repository", "octo/cli"],
    )
    .await;
    let printed = stdout(&out);
    let token = printed.trim_end();
    assert_eq!(printed.lines().count(), 1, "{printed}");
    assert!(token.starts_with("hoardtool."), "{printed}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("octo/cli") && said.contains("read-only"),
        "{said}"
    );
    let get = srv
        .http
        .get(srv.url("/v1/cache/abc123"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 200);
    assert_eq!(get.text().await.unwrap(), "an nx output");

    let json = json_out(
        &hoard(
            &base,
            Some(ADMIN),
            &[
                "tokens",
                "create",
                "--repository",
                "77",
                "--write",
                "--ttl",
                "2h",
                "--json",
            ],
        )
        .await,
    );
    assert_eq!(json["write_ref"], MAIN, "{json}");
    let err = failure(
        &hoard(
            &base,
            Some(ADMIN),
            &["tokens", "create", "--repository", "octo/none"],
        )
        .await,
    );
    assert!(err.contains("no such repository"), "{err}");
}
