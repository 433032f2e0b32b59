//! Write policies (`--policy-file`, issue #23 part 3) against the real binary: what v2 and v1
//! answer for a write or read the policy refuses, reloads on SIGHUP (a bad file keeps the
//! policy in force), the admin API's view, and a bad file refusing start-up. The real client's
//! side is in `e2e_client.rs`.
//!
//! The policy's health (issue #42): a failed reload shows in `hoard status`, `/readyz`'s
//! warnings, both metrics, the admin API and the dashboard's policy page (chromium,
//! `tests/e2e/policy.mjs`; screenshots in `target/tmp/dashboard/policy-*.png`), and clears
//! after a good one; a file edited and not reloaded shows as differing; refused writes and
//! lookups are counted in the statistics by family.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::process::Hoard;
use common::{claims, poll, sign_hs256, twirp_at, TestServer, MAIN, VERSION};
use serde_json::{json, Value};

const ADMIN: &str = "policy-admin-token-0123456789abcdef";
const PULL: &str = "refs/pull/7/merge";

/// Freezes main of octo/app and denies every pull request scope.
const FREEZE: &str = r#"
# Incident 42: main of octo/app is frozen.
[[rule]]
repository = "octo/app"
scope = "refs/heads/main"
access = "read-only"

[[rule]]
repository = "*"
scope = "refs/pull/*"
access = "deny"
"#;

/// A token of octo/app (id 1) with `grants`.
fn app_token(grants: &[(&str, u8)]) -> String {
    let mut c = claims("1", grants);
    c["repository"] = json!("octo/app");
    sign_hs256(&c)
}

fn other_token() -> String {
    let mut c = claims("2", &[(MAIN, 3)]);
    c["repository"] = json!("octo/other");
    sign_hs256(&c)
}

struct Server {
    hoard: Hoard,
    http: reqwest::Client,
    _data: tempfile::TempDir,
}

impl Server {
    fn start(policy: &Path) -> Self {
        let data = tempfile::tempdir().unwrap();
        let secret = common::secret_file(data.path());
        let hoard = Hoard::start_with(
            data.path(),
            &[
                "--token-hs256-secret-file",
                secret.to_str().unwrap(),
                "--policy-file",
                policy.to_str().unwrap(),
                "--admin-token",
                ADMIN,
            ],
        );
        Self {
            hoard,
            http: reqwest::Client::new(),
            _data: data,
        }
    }

    async fn twirp(&self, method: &str, token: &str, body: Value) -> (u16, Value) {
        twirp_at(&self.http, &self.hoard.base, token, method, body).await
    }

    async fn create(&self, token: &str, key: &str) -> (u16, Value) {
        self.twirp(
            "CreateCacheEntry",
            token,
            json!({ "key": key, "version": VERSION }),
        )
        .await
    }

    async fn finalize(&self, token: &str, key: &str, size: usize) -> (u16, Value) {
        self.twirp(
            "FinalizeCacheEntryUpload",
            token,
            json!({ "key": key, "version": VERSION, "size_bytes": size.to_string() }),
        )
        .await
    }

    async fn lookup(&self, token: &str, key: &str) -> (u16, Value) {
        self.twirp(
            "GetCacheEntryDownloadURL",
            token,
            json!({ "key": key, "version": VERSION }),
        )
        .await
    }

    /// A whole v2 save; the entry id.
    async fn save(&self, token: &str, key: &str, data: &[u8]) -> i64 {
        let (status, body) = self.create(token, key).await;
        assert_eq!((status, &body["ok"]), (200, &json!(true)), "{body}");
        let url = body["signed_upload_url"].as_str().unwrap();
        let put = self
            .http
            .put(url)
            .header("x-ms-blob-type", "BlockBlob")
            .body(data.to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(put.status(), 201);
        let (status, body) = self.finalize(token, key, data.len()).await;
        assert_eq!((status, &body["ok"]), (200, &json!(true)), "{body}");
        body["entry_id"].as_str().unwrap().parse().unwrap()
    }

    /// A v1 call: the status and the JSON body (`Null` when empty).
    async fn v1(
        &self,
        method: reqwest::Method,
        resource: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(
                method,
                format!("{}/_apis/artifactcache/{resource}", self.hoard.base),
            )
            .bearer_auth(token)
            .header("accept", "application/json;api-version=6.0-preview.1");
        if let Some(body) = body {
            req = req
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let res = req.send().await.unwrap();
        let status = res.status().as_u16();
        let text = res.text().await.unwrap();
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{status}: {e}: {text}"))
        };
        (status, body)
    }

    async fn v1_reserve(&self, token: &str, key: &str) -> (u16, Value) {
        let body = json!({ "key": key, "version": VERSION });
        self.v1(reqwest::Method::POST, "caches", token, Some(body))
            .await
    }

    async fn v1_lookup(&self, token: &str, key: &str) -> (u16, Value) {
        let resource = format!("cache?keys={key}&version={VERSION}");
        self.v1(reqwest::Method::GET, &resource, token, None).await
    }

    async fn admin_policy(&self) -> Value {
        self.admin("policy").await
    }

    /// `GET policy` once it knows whether the file on disk differs: the server gives a
    /// comparison a deadline (a slow file system answers "not known", null), and on a busy
    /// machine a first one may miss it; the next finds the answer kept.
    async fn admin_policy_compared(&self) -> Value {
        until("the policy file compared", async || {
            let policy = self.admin_policy().await;
            (!policy["differs_from_file"].is_null()).then_some(policy)
        })
        .await
    }

    /// An admin API answer, which must be a 200.
    async fn admin(&self, path: &str) -> Value {
        let res = self
            .http
            .get(format!("{}/_hoard/api/v1/{path}", self.hoard.base))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "{path}");
        res.json().await.unwrap()
    }

    /// `/readyz`: its status and body.
    async fn readyz(&self) -> (u16, Value) {
        let res = self
            .http
            .get(format!("{}/readyz", self.hoard.base))
            .send()
            .await
            .unwrap();
        (res.status().as_u16(), res.json().await.unwrap())
    }

    /// The value of the series `name` (no labels) in `/metrics`.
    async fn metric(&self, name: &str) -> f64 {
        let text = self
            .http
            .get(format!("{}/metrics", self.hoard.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or_else(|| panic!("{name} is not in /metrics:\n{text}"))
    }

    /// The dashboard's policy page as chromium sees it (`tests/e2e/policy.mjs`), its
    /// screenshot kept as `target/tmp/dashboard/<shot>`.
    async fn dashboard_policy(&self, shot: &str) -> (Value, String) {
        assert!(
            Path::new("/usr/bin/chromium").exists(),
            "Debian's chromium is needed (apt-get install chromium; .ci/run installs it)"
        );
        let e2e = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e");
        assert!(
            e2e.join("node_modules/playwright-core").exists(),
            "playwright-core is not installed: run `npm ci --prefix tests/e2e` (scripts/test does)"
        );
        let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
        let mut cmd = Command::new("node");
        cmd.arg(e2e.join("policy.mjs"))
            .env("HOARD_URL", &self.hoard.base)
            .env("HOARD_ADMIN_TOKEN", ADMIN)
            .env("SCREENSHOT_DIR", shots)
            .env("SCREENSHOT_NAME", shot);
        tokio::task::spawn_blocking(move || common::node_result(cmd.output().unwrap()))
            .await
            .unwrap()
    }

    /// What `hoard status` prints for this server.
    async fn status_text(&self) -> String {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hoard"));
        cmd.arg("status")
            .env("HOARD_SERVER", &self.hoard.base)
            .env("HOARD_ADMIN_TOKEN", ADMIN)
            .env_remove("HOARD_ADMIN_TOKEN_FILE")
            .env("RUST_LOG", "off");
        let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    fn log_lines(&self, needle: &str) -> Vec<String> {
        let log = self.hoard.log.lock().unwrap();
        log.iter().filter(|l| l.contains(needle)).cloned().collect()
    }

    /// Sends SIGHUP and waits for the policy's reload line (reloaded, or not); returns it.
    async fn hangup(&self) -> String {
        let before = self.log_lines("SIGHUP: policy").len();
        let hup = Command::new("kill")
            .args(["-HUP", &self.hoard.pid().to_string()])
            .status()
            .unwrap();
        assert!(hup.success());
        let seen = common::eventually(Duration::from_secs(10), || {
            self.log_lines("SIGHUP: policy").len() > before
        })
        .await;
        assert!(seen, "no reload line: {:?}", self.hoard.log.lock().unwrap());
        self.log_lines("SIGHUP: policy").pop().unwrap()
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs the real client and chromium"
)]
async fn refused_writes_and_reads_answer_as_github_does_and_sighup_swaps_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.toml");
    std::fs::write(&file, "# no rules yet\n").unwrap();
    let srv = Server::start(&file);
    let main = app_token(&[(MAIN, 3)]);
    let pull = app_token(&[(PULL, 3), (MAIN, 1)]);
    let pull_only = app_token(&[(PULL, 3)]);

    // A file without rules is today's behaviour.
    let on_main = srv.save(&main, "deps", b"main bytes").await;
    srv.save(&pull, "pr", b"pull bytes").await;
    let policy = srv.admin_policy().await;
    assert_eq!(policy["rules"], json!([]));
    assert_eq!(policy["source"], file.to_str().unwrap());

    // The freeze goes in force on SIGHUP.
    std::fs::write(&file, FREEZE).unwrap();
    let line = srv.hangup().await;
    assert!(
        line.contains(&format!(
            "SIGHUP: policy reloaded from {}: 2 rules",
            file.display()
        )),
        "{line}"
    );
    let policy = srv.admin_policy().await;
    assert_eq!(
        policy["rules"],
        json!([
            { "repository": "octo/app", "scope": MAIN, "access": "read-only", "callers": null, "line": 3 },
            { "repository": "*", "scope": "refs/pull/*", "access": "deny", "callers": null, "line": 8 },
        ])
    );
    assert!(policy["loaded_at"].as_str().unwrap().ends_with('Z'));
    let status = srv.status_text().await;
    assert!(
        status.contains(&format!(
            "policy     2 rules from {}, loaded ",
            file.display()
        )),
        "{status}"
    );
    // The freeze took (issue #42): its load is the last attempt, the file on disk is what is in
    // force (the same SHA-256), nothing warns, and the metrics say when it was loaded.
    let loaded_at = policy["loaded_at"].as_str().unwrap().to_owned();
    assert_eq!(
        policy["last_attempt"],
        json!({ "at": loaded_at, "outcome": "ok", "error": null })
    );
    assert_eq!(policy["differs_from_file"], false, "{policy}");
    assert_eq!(policy["file_changed_at"], Value::Null);
    assert_eq!(policy["digest"], sha256(FREEZE.as_bytes()));
    assert_eq!(policy["warnings"], json!([]));
    assert!(
        !status.contains("last load") && !status.contains("differs"),
        "{status}"
    );
    let (code, ready) = srv.readyz().await;
    assert_eq!((code, &ready["warnings"]), (200, &json!([])), "{ready}");
    assert_eq!(srv.metric("hoard_policy_reload_failures_total").await, 0.0);
    assert_eq!(
        srv.metric("hoard_policy_last_load_timestamp_seconds").await,
        unix_seconds(&loaded_at)
    );

    // v2: a frozen scope's create and finalize are 200 ok:false with GitHub's prefix (§2.4).
    let frozen = "cache write denied: refs/heads/main of octo/app is read-only by policy rule 1";
    assert_eq!(
        srv.create(&main, "new").await,
        (200, json!({ "ok": false, "message": frozen }))
    );
    let (status, body) = srv.finalize(&main, "deps", 10).await;
    assert_eq!(
        (status, &body["ok"], &body["message"]),
        (200, &json!(false), &json!(frozen))
    );
    // Restores still hit.
    let (status, hit) = srv.lookup(&main, "deps").await;
    assert_eq!((status, &hit["ok"]), (200, &json!(true)), "{hit}");
    assert_eq!(hit["matched_key"], "deps");
    let download = srv.http.get(hit["signed_download_url"].as_str().unwrap());
    let bytes = download.send().await.unwrap().bytes().await.unwrap();
    assert_eq!(&bytes[..], b"main bytes");
    assert!(on_main > 0);

    // A denied scope is invisible: the pull request reads main, not its own entry.
    let (_, hit) = srv.lookup(&pull, "deps").await;
    assert_eq!(hit["ok"], true, "{hit}");
    assert_eq!(srv.lookup(&pull, "pr").await, (200, json!({ "ok": false })));
    assert_eq!(
        srv.create(&pull, "pr2").await.1["message"],
        "cache write denied: refs/pull/7/merge of octo/app is denied by policy rule 2"
    );
    // Nothing left to read: permission_denied with GitHub's read-denied prefix.
    let read_denied = "cache read denied: refs/pull/7/merge of octo/app is denied by policy rule 2";
    assert_eq!(
        srv.lookup(&pull_only, "pr").await,
        (
            403,
            json!({ "code": "permission_denied", "msg": read_denied })
        )
    );

    // v1: 403 {"message": …} for both.
    assert_eq!(
        srv.v1_reserve(&main, "v1-new").await,
        (403, json!({ "message": frozen }))
    );
    assert_eq!(
        srv.v1_lookup(&pull_only, "pr").await,
        (403, json!({ "message": read_denied }))
    );
    let (status, hit) = srv.v1_lookup(&main, "deps").await;
    assert_eq!((status, &hit["cacheKey"]), (200, &json!("deps")), "{hit}");

    // Another repository's main is not frozen.
    srv.save(&other_token(), "deps", b"other").await;

    // Each refusal is audited with its rule.
    let wait = |action: &'static str| {
        let srv = &srv;
        async move {
            common::eventually(Duration::from_secs(10), || {
                srv.log_lines("hoard::audit")
                    .iter()
                    .any(|l| l.contains(action) && l.contains("rule=") && l.contains("kind=hs256"))
            })
            .await
        }
    };
    assert!(wait("write_denied").await, "{:?}", srv.log_lines("audit"));
    assert!(wait("read_denied").await, "{:?}", srv.log_lines("audit"));

    // A bad file on reload keeps the policy in force, and says where it is wrong.
    std::fs::write(&file, FREEZE.replace("\"deny\"", "\"denied\"")).unwrap();
    let line = srv.hangup().await;
    assert!(
        line.contains("SIGHUP: policy not reloaded, the previous one stays")
            && line.contains(&format!("the policy file {}, line 11", file.display()))
            && line.contains("denied"),
        "{line}"
    );
    assert!(line.contains("ERROR"), "logged as an error: {line}");
    assert_eq!(srv.create(&main, "new").await.1["message"], frozen);
    assert_eq!(
        srv.admin_policy().await["rules"].as_array().unwrap().len(),
        2
    );
    a_failed_reload_shows_everywhere(&srv, &file, &loaded_at).await;

    // Lifting the freeze (a rule that lets main write again, before the freeze) opens saves.
    let lifted = format!(
        "[[rule]]\nrepository = \"1\"\nscope = \"refs/heads/*\"\naccess = \"read-write\"\n{FREEZE}"
    );
    std::fs::write(&file, &lifted).unwrap();
    assert!(srv.hangup().await.contains("3 rules"));
    a_good_reload_clears_it(&srv, &loaded_at).await;
    srv.save(&main, "new", b"after the freeze").await;
    let (status, body) = srv.v1_reserve(&main, "v1-new").await;
    assert_eq!(status, 201, "{body}");

    an_edit_not_reloaded_shows_as_differing(&srv, &file, &lifted).await;

    // Refusals are counted in the statistics by family, beside hits and misses: five writes
    // (two creates of main, its finalize and v1 reserve, the pull request's create) and two
    // lookups (v2 and v1, of the token that reads only a denied scope).
    // Counts are written once a second.
    let totals = poll(
        Duration::from_secs(10),
        async || srv.admin("stats?repository=octo/app&since=24h").await["totals"].clone(),
        |totals| totals["refused_writes"] == 5 && totals["refused_reads"] == 2,
    )
    .await;
    assert_eq!(
        (&totals["refused_writes"], &totals["refused_reads"]),
        (&json!(5), &json!(2)),
        "{totals}"
    );
    assert_eq!(
        totals["lookups"],
        totals["exact_hits"].as_u64().unwrap()
            + totals["restore_key_hits"].as_u64().unwrap()
            + totals["misses"].as_u64().unwrap(),
        "a refused lookup is not a lookup answered: {totals}"
    );
    let families = srv
        .admin("stats/families?repository=octo/app&since=24h")
        .await;
    let by_family = |field: &str| -> u64 {
        families["families"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f[field].as_u64().unwrap())
            .sum()
    };
    assert_eq!(
        (by_family("refused_writes"), by_family("refused_reads")),
        (5, 2),
        "{families}"
    );
    let pulls = families["families"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["scope_class"] == "pull_request")
        .map(|f| {
            (
                f["refused_writes"].as_u64().unwrap(),
                f["refused_reads"].as_u64().unwrap(),
            )
        })
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    assert_eq!(
        pulls,
        (1, 2),
        "the pull request's refusals in its class: {families}"
    );
}

/// `sha256:<hex>` of `bytes`, as the admin API names the bytes in force.
fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// An RFC 3339 time as the whole seconds since 1970 a Prometheus timestamp gauge shows.
fn unix_seconds(rfc3339: &str) -> f64 {
    let at = humantime::parse_rfc3339(rfc3339).unwrap();
    at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as f64
}

/// `probe`'s answer once it gives one, asking again for up to 10 s; fails naming `what`.
async fn until<T>(what: &str, probe: impl AsyncFnMut() -> Option<T>) -> T {
    let found = poll(Duration::from_secs(10), probe, Option::is_some).await;
    found.unwrap_or_else(|| panic!("{what}: not within 10 s"))
}

/// After a reload that failed (rule 2 of `file` spells its access wrong, line 11) while the
/// freeze loaded at `loaded_at` stays in force: the admin API, `hoard status`, `/readyz`'s
/// warnings (still ready), both metrics and the dashboard's policy page all say so.
async fn a_failed_reload_shows_everywhere(srv: &Server, file: &Path, loaded_at: &str) {
    let at_line = format!("the policy file {}, line 11", file.display());
    let failed = format!("the policy file {} failed to reload at ", file.display());
    let policy = srv.admin_policy_compared().await;
    assert_eq!(policy["loaded_at"], loaded_at, "the freeze stays in force");
    let attempt = &policy["last_attempt"];
    assert_eq!(attempt["outcome"], "failed", "{policy}");
    assert!(
        attempt["error"].as_str().unwrap().contains(&at_line),
        "{policy}"
    );
    assert_ne!(attempt["at"], loaded_at, "{policy}");
    assert_eq!(policy["differs_from_file"], true, "{policy}");
    assert_eq!(
        policy["digest"],
        sha256(FREEZE.as_bytes()),
        "the bytes in force"
    );
    let warnings = policy["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{policy}");
    let warning = warnings[0].as_str().unwrap();
    assert!(
        warning.starts_with(&failed)
            && warning.contains(&at_line)
            && warning.ends_with(&format!(
                "the policy loaded at {}Z stays in force",
                &loaded_at[..19]
            )),
        "{warning}"
    );

    let status = srv.status_text().await;
    assert!(
        status.contains("           last load failed at ") && status.contains(&at_line),
        "{status}"
    );
    assert!(
        status.contains(&format!("WARNING    {warning}")),
        "{status}"
    );

    let (code, ready) = srv.readyz().await;
    assert_eq!(
        (code, &ready["status"]),
        (200, &json!("ready")),
        "a warning, not a failure: {ready}"
    );
    assert_eq!(ready["warnings"], json!([warning]), "{ready}");

    assert_eq!(srv.metric("hoard_policy_reload_failures_total").await, 1.0);
    assert_eq!(
        srv.metric("hoard_policy_last_load_timestamp_seconds").await,
        unix_seconds(loaded_at),
        "the last good load's time stays"
    );

    let (page, log) = srv.dashboard_policy("policy-reload-failed.png").await;
    assert_eq!(
        (&page["bannerState"], &page["bannerRole"]),
        (&json!("reload-failed"), &json!("alert")),
        "{log}"
    );
    let banner = page["banner"].as_str().unwrap_or_default();
    assert!(
        banner.contains("The last reload of the policy file failed") && banner.contains(&at_line),
        "{log}"
    );
    assert_eq!(
        page["rules"],
        json!([
            ["1", "3", "octo/app", MAIN, "read-only", "every caller"],
            ["2", "8", "*", "refs/pull/*", "deny", "every caller"],
        ]),
        "{log}"
    );
    assert_eq!(page["file"], file.to_str().unwrap(), "{log}");
    assert_eq!(page["outcomeState"], "failed", "{log}");
    assert!(
        page["outcome"].as_str().unwrap().contains(&at_line),
        "{log}"
    );
    assert_eq!(page["digest"], sha256(FREEZE.as_bytes()), "{log}");
}

/// After a good reload that followed a failed one (the freeze loaded at `before`): the failure
/// is gone from every place, the metrics say when the new policy was loaded, and the failed
/// reload stays counted.
async fn a_good_reload_clears_it(srv: &Server, before: &str) {
    let policy = srv.admin_policy_compared().await;
    let loaded_at = policy["loaded_at"].as_str().unwrap();
    assert!(loaded_at >= before, "{policy}");
    assert_eq!(
        policy["last_attempt"],
        json!({ "at": loaded_at, "outcome": "ok", "error": null })
    );
    assert_eq!(
        (&policy["differs_from_file"], &policy["warnings"]),
        (&json!(false), &json!([])),
        "{policy}"
    );
    let status = srv.status_text().await;
    assert!(
        status.contains("policy     3 rules from ")
            && !status.contains("last load")
            && !status.contains("WARNING"),
        "{status}"
    );
    let (code, ready) = srv.readyz().await;
    assert_eq!((code, &ready["warnings"]), (200, &json!([])), "{ready}");
    assert_eq!(srv.metric("hoard_policy_reload_failures_total").await, 1.0);
    assert_eq!(
        srv.metric("hoard_policy_last_load_timestamp_seconds").await,
        unix_seconds(loaded_at)
    );
    let (page, log) = srv.dashboard_policy("policy-in-force.png").await;
    assert_eq!(
        (&page["bannerState"], &page["banner"]),
        (&json!("ok"), &Value::Null),
        "{log}"
    );
    assert_eq!(page["rules"].as_array().unwrap().len(), 3, "{log}");
    assert_eq!(page["outcomeState"], "ok", "{log}");
    assert_eq!(page["disk"], "The policy in force", "{log}");
}

/// `file` edited after the policy in force (`in_force`'s bytes) was loaded, and not reloaded:
/// `/readyz`, the admin API and `hoard status` say the file differs, and since when; the same
/// bytes written again (a new time, the same content) do not differ.
async fn an_edit_not_reloaded_shows_as_differing(srv: &Server, file: &Path, in_force: &str) {
    std::fs::write(file, format!("{in_force}\n# an edit not reloaded yet\n")).unwrap();
    let differs = format!(
        "the policy file {} differs from the policy in force (loaded at ",
        file.display()
    );
    // Known once a comparison finished within its deadline (see `admin_policy_compared`).
    let (code, ready) = until("the edit seen by /readyz", async || {
        let (code, ready) = srv.readyz().await;
        (!ready["warnings"].as_array().unwrap().is_empty()).then_some((code, ready))
    })
    .await;
    assert_eq!((code, &ready["status"]), (200, &json!("ready")), "{ready}");
    let warnings = ready["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{ready}");
    let warning = warnings[0].as_str().unwrap();
    assert!(
        warning.starts_with(&differs)
            && warning.contains("changed on disk at ")
            && warning.ends_with("not reloaded; send SIGHUP to load it"),
        "{warning}"
    );
    let policy = srv.admin_policy_compared().await;
    assert_eq!(policy["differs_from_file"], true, "{policy}");
    assert_eq!(policy["last_attempt"]["outcome"], "ok", "{policy}");
    let changed = policy["file_changed_at"].as_str().unwrap();
    assert!(changed >= policy["loaded_at"].as_str().unwrap(), "{policy}");
    assert_eq!(policy["digest"], sha256(in_force.as_bytes()));
    let differs_line =
        format!("the file on disk differs from the policy in force (changed {changed})");
    until("the edit seen by hoard status", async || {
        Some(srv.status_text().await).filter(|status| status.contains(&differs_line))
    })
    .await;

    std::fs::write(file, in_force).unwrap();
    let (_, ready) = srv.readyz().await;
    assert_eq!(
        ready["warnings"],
        json!([]),
        "the same bytes again: {ready}"
    );
    assert_eq!(
        srv.admin_policy_compared().await["differs_from_file"],
        false
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn rules_can_be_limited_to_caller_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.toml");
    // Tokens of these tests are HS256: a rule for GitHub's own tokens leaves them alone.
    std::fs::write(
        &file,
        "[[rule]]\nrepository = \"*\"\nscope = \"*\"\naccess = \"deny\"\ncallers = [\"github\", \"forgejo\"]\n\n[[rule]]\nrepository = \"*\"\nscope = \"refs/tags/*\"\naccess = \"read-only\"\ncallers = [\"hs256\"]\n",
    )
    .unwrap();
    let srv = Server::start(&file);
    srv.save(&app_token(&[(MAIN, 3)]), "k", b"x").await;
    let tag = app_token(&[("refs/tags/v1", 3)]);
    assert_eq!(
        srv.create(&tag, "k").await.1["message"],
        "cache write denied: refs/tags/v1 of octo/app is read-only by policy rule 2"
    );
    assert_eq!(
        srv.admin_policy().await["rules"][0]["callers"],
        json!(["github", "forgejo"])
    );
}

#[test]
fn a_bad_policy_file_refuses_start_up_with_one_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[rule]]\nrepository = \"*\"\nscope = \"*\"\naccess = \"deny\"\ncallers = [\"robots\"]\n",
    )
    .unwrap();
    let missing = dir.path().join("missing.toml");
    for (file, needle) in [
        (&bad, format!("the policy file {}, line 5", bad.display())),
        (
            &missing,
            format!("cannot read the policy file {}", missing.display()),
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_hoard"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--policy-file")
            .arg(file)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--policy-file (HOARD_POLICY_FILE): ") && stderr.contains(&needle),
            "{stderr}"
        );
        assert_eq!(stderr.trim().lines().count(), 1, "one sentence: {stderr}");
    }
}

#[tokio::test]
async fn without_a_policy_file_the_admin_api_shows_none() {
    let srv = TestServer::start_with(&["--admin-token", ADMIN]).await;
    let res = srv
        .http
        .get(srv.url("/_hoard/api/v1/policy"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    assert_eq!(
        body,
        json!({
            "source": null, "loaded_at": null, "rules": [], "digest": null,
            "last_attempt": null, "differs_from_file": null, "file_changed_at": null,
            "warnings": [], "promotions": [],
        })
    );
    let res = srv
        .http
        .get(srv.url("/_hoard/api/v1/status"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.json::<Value>().await.unwrap()["policy"], body);
    let res = srv
        .http
        .post(srv.url("/_hoard/api/v1/policy"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 405);
}

/// A freeze by owner/name holds for a token that carries only its `repository_id` once any
/// token has paired that id with the name, and until then is reported; a freeze by id holds
/// always; a token that names its id otherwise is decided by the id's name (issue #43).
#[tokio::test(flavor = "multi_thread")]
async fn a_freeze_by_name_follows_the_id_and_an_unpaired_name_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.toml");
    std::fs::write(
        &file,
        "[[rule]]\nrepository = \"octo/app\"\nscope = \"refs/heads/main\"\naccess = \"read-only\"\n\n[[rule]]\nrepository = 5\nscope = \"refs/heads/main\"\naccess = \"read-only\"\n",
    )
    .unwrap();
    let srv = Server::start(&file);
    let token = |id: &str, name: Option<&str>| {
        let mut c = claims(id, &[(MAIN, 3)]);
        if let Some(name) = name {
            c["repository"] = json!(name);
        }
        sign_hs256(&c)
    };
    let unpaired = "policy rule 1 (line 1) names octo/app, which no token has named yet";
    let readyz = || async {
        let res = srv
            .http
            .get(format!("{}/readyz", srv.hoard.base))
            .send()
            .await
            .unwrap();
        res.json::<Value>().await.unwrap()["warnings"].to_string()
    };
    assert!(readyz().await.contains(unpaired), "{}", readyz().await);
    assert!(srv.status_text().await.contains(unpaired));
    assert!(
        !srv.log_lines(unpaired).is_empty(),
        "reported at load: {:?}",
        srv.hoard.log.lock().unwrap()
    );

    // A freeze by id holds for a token without a name.
    let by_id = srv.create(&token("5", None), "k").await;
    assert_eq!(by_id.1["ok"], false, "{by_id:?}");

    // Before any token pairs id 1 with octo/app, its id-only token is not frozen (and the
    // rule is reported as applying to nothing).
    assert_eq!(srv.create(&token("1", None), "before").await.1["ok"], true);

    // A reader of octo/app pairs id 1 with the name; from then on the id-only token is frozen
    // and the report is gone.
    let (status, _) = srv.lookup(&token("1", Some("octo/app")), "none").await;
    assert_eq!(status, 200);
    let frozen = "cache write denied: refs/heads/main of octo/app is read-only by policy rule 1";
    assert_eq!(
        srv.create(&token("1", None), "after").await,
        (200, json!({ "ok": false, "message": frozen }))
    );
    assert!(!readyz().await.contains(unpaired), "{}", readyz().await);
    assert!(!srv.status_text().await.contains(unpaired));

    // A token of id 1 that names itself otherwise is decided by the id's name, and logged.
    assert_eq!(
        srv.create(&token("1", Some("evil/other")), "renamed").await,
        (200, json!({ "ok": false, "message": frozen }))
    );
    // The log is read by another thread: wait for the line rather than race it.
    let logged = common::eventually(Duration::from_secs(10), || {
        !srv.log_lines("name_disagrees").is_empty()
    })
    .await;
    assert!(logged, "{:?}", srv.hoard.log.lock().unwrap());
    // Another repository is not frozen.
    assert_eq!(srv.create(&other_token(), "free").await.1["ok"], true);
}

/// Bytes staged for a reservation made before a freeze never become an entry: the finalize
/// the freeze refuses ends the upload, so a finalize after the freeze is lifted finds none
/// (issue #43). A new save after the freeze works as ever.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_finalize_ends_the_upload_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.toml");
    std::fs::write(&file, "# no rules yet\n").unwrap();
    let srv = Server::start(&file);
    let main = app_token(&[(MAIN, 3)]);

    let (status, body) = srv.create(&main, "staged").await;
    assert_eq!((status, &body["ok"]), (200, &json!(true)), "{body}");
    let put = srv
        .http
        .put(body["signed_upload_url"].as_str().unwrap())
        .header("x-ms-blob-type", "BlockBlob")
        .body(b"staged under a freeze".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 201);

    std::fs::write(&file, FREEZE).unwrap();
    assert!(srv.hangup().await.contains("reloaded"));
    let (status, body) = srv.finalize(&main, "staged", 21).await;
    assert_eq!((status, &body["ok"]), (200, &json!(false)), "{body}");
    let logged = common::eventually(Duration::from_secs(10), || {
        !srv.log_lines("action=\"abort\"").is_empty()
    })
    .await;
    assert!(
        logged,
        "the refused finalize ends the upload: {:?}",
        srv.hoard.log.lock().unwrap()
    );

    std::fs::write(&file, "# lifted\n").unwrap();
    assert!(srv.hangup().await.contains("reloaded"));
    let (status, body) = srv.finalize(&main, "staged", 21).await;
    assert!(
        status != 200 || body["ok"] != json!(true),
        "a finalize after the freeze must not make the staged bytes an entry: {status} {body}"
    );
    assert_eq!(
        srv.lookup(&main, "staged").await,
        (200, json!({ "ok": false }))
    );
    // The slot is free: a new save of the key works.
    srv.save(&main, "staged", b"after the freeze").await;
    let (_, hit) = srv.lookup(&main, "staged").await;
    assert_eq!(hit["ok"], true, "{hit}");
}

/// A reload that leaves no rules where there were some lifts every freeze and denial at once:
/// `/readyz`, `hoard status`, the admin API and the log say so, for an empty file and for one
/// of comments only, until a policy with rules is loaded again. A file without rules at
/// start-up is today's behaviour and stays quiet.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_that_lifts_every_rule_warns_until_rules_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.toml");
    std::fs::write(&file, "# no rules yet\n").unwrap();
    let srv = Server::start(&file);
    let (code, ready) = srv.readyz().await;
    assert_eq!((code, &ready["warnings"]), (200, &json!([])), "{ready}");

    std::fs::write(&file, FREEZE).unwrap();
    assert!(srv.hangup().await.contains("2 rules"));
    // A token of octo/app ties the freeze's name to its id (else /readyz says it does not).
    assert_eq!(srv.lookup(&app_token(&[(MAIN, 3)]), "none").await.0, 200);
    let (_, ready) = srv.readyz().await;
    assert_eq!(ready["warnings"], json!([]), "{ready}");

    let lifted = format!(
        "the policy file {} has no rules since its reload at ",
        file.display()
    );
    for (i, empty) in ["", "# the incident is over\n\n   # nothing frozen\n"]
        .into_iter()
        .enumerate()
    {
        std::fs::write(&file, empty).unwrap();
        assert!(srv.hangup().await.contains("0 rules"));
        let warned = srv.log_lines("are lifted");
        assert_eq!(warned.len(), i + 1, "one log line per lift: {warned:?}");
        assert!(
            warned[i].contains("WARN") && warned[i].contains(&lifted),
            "{}",
            warned[i]
        );
        let (code, ready) = srv.readyz().await;
        assert_eq!(code, 200, "a warning never fails readiness: {ready}");
        let warnings = ready["warnings"].as_array().unwrap();
        assert_eq!(warnings.len(), 1, "{ready}");
        let warning = warnings[0].as_str().unwrap();
        assert!(
            warning.starts_with(&lifted)
                && warning.contains(
                    ": the 2 rules in force before are lifted, so no scope is read-only or denied"
                ),
            "{warning}"
        );
        let status = srv.status_text().await;
        assert!(
            status.contains(&format!("WARNING    {lifted}"))
                && status.contains("policy     0 rules from "),
            "{status}"
        );
        let policy = srv.admin_policy().await;
        assert_eq!(policy["warnings"], json!([warning]), "{policy}");

        // Rules back: the warning goes.
        std::fs::write(&file, FREEZE).unwrap();
        assert!(srv.hangup().await.contains("2 rules"));
        let (_, ready) = srv.readyz().await;
        assert_eq!(ready["warnings"], json!([]), "{ready}");
        assert!(!srv.status_text().await.contains("WARNING"));
    }
}
