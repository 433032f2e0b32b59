//! The first hour of a cache-poisoning incident, as an operator works it with the CLI, with the
//! real `@actions/cache` 6.3.0 client as the jobs, on SQLite, PostgreSQL and MariaDB: a run
//! writes two poisoned entries into the default branch's scope and a release job restores them;
//! the blast radius names exactly that job; quarantine hides them from the client while keeping
//! them to download (byte-identical to what was saved) and to release; ids never come back.
//!
//! Needs `npm ci --prefix tests/e2e` first (scripts/test does it), plus tar and zstd.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::databases::{Backend, Server};
use common::process::Hoard;
use common::{claims, random_bytes, sign_hs256, MAIN};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const ADMIN: &str = "admin-token-for-the-incident-drill-0123";
const REPOSITORY: &str = "4242";

/// The token of a job: run `run`, job `job`, its subject as GitHub sets it for `git_ref`.
fn job_token(git_ref: &str, run: &str, job: &str) -> String {
    let mut c = claims(REPOSITORY, &[(MAIN, 3)]);
    c["repository"] = json!("octo/app");
    c["sub"] = json!(format!("repo:octo/app:ref:{git_ref}"));
    c["scp"] = json!(format!("Actions.Results:{run}:{job}"));
    sign_hs256(&c)
}

/// One job's workspace, with the real client.
struct Job {
    dir: tempfile::TempDir,
    token: String,
}

impl Job {
    fn new(token: String) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("runner-temp")).unwrap();
        Self { dir, token }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Writes `len` bytes seeded by `seed` at `rel`; returns their SHA-256.
    fn write(&self, rel: &str, len: usize, seed: u64) -> String {
        let path = self.path(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let bytes = random_bytes(len, seed);
        std::fs::write(&path, &bytes).unwrap();
        hex::encode(Sha256::digest(&bytes))
    }

    fn client(&self, server: &str, args: &[&str]) -> (Value, String) {
        let e2e = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e");
        assert!(
            e2e.join("node_modules/@actions/cache").exists(),
            "the real client is not installed: run `npm ci --prefix tests/e2e` (scripts/test does)"
        );
        let out = Command::new("node")
            .arg(e2e.join("client.mjs"))
            .args(args)
            .current_dir(self.dir.path())
            .env("ACTIONS_RUNTIME_TOKEN", &self.token)
            .env("RUNNER_TEMP", self.path("runner-temp"))
            .env("GITHUB_WORKSPACE", self.dir.path())
            .env("ACTIONS_RESULTS_URL", format!("{server}/"))
            .env("ACTIONS_CACHE_SERVICE_V2", "true")
            .env_remove("GITHUB_SERVER_URL")
            .env_remove("ACTIONS_CACHE_URL")
            .env_remove("ACTIONS_CACHE_MODE")
            .env_remove("HOARD_E2E_CLIENT")
            .output()
            .expect("run node");
        common::node_result(out)
    }

    /// Saves `paths` under `key`; returns the entry id.
    fn save(&self, server: &str, key: &str, paths: &[&str]) -> i64 {
        let args: Vec<&str> = ["save", key].iter().chain(paths).copied().collect();
        let (result, out) = self.client(server, &args);
        let id = result.as_i64().unwrap_or(-1);
        assert!(id > 0, "save of {key} failed:\n{out}");
        id
    }

    /// Restores `key` into `paths`: whether it hit.
    fn restore(&self, server: &str, key: &str, paths: &[&str]) -> bool {
        let args: Vec<&str> = ["restore", key].iter().chain(paths).copied().collect();
        let (result, out) = self.client(server, &args);
        match result {
            Value::String(hit) => {
                assert_eq!(hit, key, "{out}");
                true
            }
            _ => false,
        }
    }
}

/// `hoard caches ARGS… --json` against `server`, as the operator runs it; its JSON answer.
fn cli(server: &str, args: &[&str]) -> Value {
    serde_json::from_str(&cli_text(server, &[args, &["--json"]].concat())).unwrap()
}

/// `hoard caches ARGS…`: what it prints.
fn cli_text(server: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hoard"))
        .arg("caches")
        .args(args)
        .args(["--server", server])
        .env("HOARD_ADMIN_TOKEN", ADMIN)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "hoard caches {args:?} failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn ids(listing: &Value) -> Vec<i64> {
    let mut ids: Vec<i64> = listing["actions_caches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_i64().unwrap())
        .collect();
    ids.sort();
    ids
}

fn sha256_file(path: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(path).unwrap()))
}

/// The digest the server records for an entry, once its digest pass has read it.
fn recorded_digest(server: &str, id: i64) -> String {
    for _ in 0..200 {
        let entry = cli(server, &["show", &id.to_string()]);
        if let Some(digest) = entry["digest"].as_str() {
            return digest.to_owned();
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("entry {id} has no digest after 10 s");
}

fn drill_with(server: Option<Server>) {
    let Some(backend) = Backend::create(server) else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let secret = common::secret_file(data.path());
    let mut args = vec![
        "--token-hs256-secret-file",
        secret.to_str().unwrap(),
        "--admin-token",
        ADMIN,
    ];
    args.extend(backend.args());
    let hoard = Hoard::start_with_env(data.path(), &args, backend.env());
    let srv = hoard.base.as_str();

    // A push run saves clean dependencies; run 66 (a compromised workflow on the default
    // branch) writes two poisoned entries; the release job of run 70 restores all three, and
    // a test job of run 71 only the clean one.
    let push = Job::new(job_token(MAIN, "61", "build"));
    push.write("deps/lib.bin", 4096, 1);
    let clean = push.save(srv, "deps-Linux-1", &["deps"]);
    let poisoner = Job::new(job_token(MAIN, "66", "lint"));
    let tool_sha = poisoner.write("tools/bin/tool", 300_000, 66);
    let build_sha = poisoner.write("build/out.o", 2048, 67);
    let poisoned_tools = poisoner.save(srv, "tools-Linux-1", &["tools"]);
    let poisoned_build = poisoner.save(srv, "build-Linux-1", &["build"]);
    let release = Job::new(job_token("refs/tags/v1.0.0", "70", "publish"));
    for (key, path) in [
        ("deps-Linux-1", "deps"),
        ("tools-Linux-1", "tools"),
        ("build-Linux-1", "build"),
    ] {
        assert!(
            release.restore(srv, key, &[path]),
            "the release restores {key}"
        );
    }
    assert_eq!(sha256_file(&release.path("tools/bin/tool")), tool_sha);
    let tests = Job::new(job_token(MAIN, "71", "test"));
    assert!(tests.restore(srv, "deps-Linux-1", &["deps"]));

    // Which jobs restored what run 66 wrote: exactly the release job.
    let radius = cli(srv, &["restorers", "--run-id", "66"]);
    let jobs: Vec<(&str, &str, u64)> = radius["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["run_id"].as_str().unwrap(),
                j["job_id"].as_str().unwrap(),
                j["entries"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(jobs, [("70", "publish", 2)], "{radius}");
    let text = cli_text(srv, &["restorers", "--run-id", "66"]);
    assert!(text.contains("publish"), "{text}");

    // The dry run names what would go and who restored it; nothing changes.
    let dry = cli(srv, &["rm", "--run-id", "66", "--quarantine", "--dry-run"]);
    assert_eq!(dry["deleted"], 2, "{dry}");
    assert_eq!(dry["restored_by"][0]["run_id"], "70", "{dry}");
    assert!(release.restore(srv, "tools-Linux-1", &["tools"]));
    let radius = cli(srv, &["restorers", "--run-id", "66"]);
    assert_eq!(
        radius["jobs"][0]["restores"], 3,
        "every restore is recorded: {radius}"
    );

    // Quarantine: out of every lookup at once, kept for examination.
    let quarantined = cli(srv, &["rm", "--run-id", "66", "--quarantine"]);
    assert_eq!(quarantined["quarantine"], true, "{quarantined}");
    let mut gone = quarantined["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_i64().unwrap())
        .collect::<Vec<_>>();
    gone.sort();
    assert_eq!(gone, [poisoned_tools, poisoned_build]);
    let next_run = Job::new(job_token(MAIN, "72", "build"));
    assert!(
        !next_run.restore(srv, "tools-Linux-1", &["tools"]),
        "the client misses a quarantined entry"
    );
    assert!(!next_run.restore(srv, "build-Linux-1", &["build"]));
    assert!(
        next_run.restore(srv, "deps-Linux-1", &["deps"]),
        "the clean entry stays"
    );
    let live = cli(srv, &["ls", "--repository", "octo/app"]);
    assert_eq!(ids(&live), [clean], "{live}");
    let kept = cli(srv, &["ls", "--state", "quarantined"]);
    assert_eq!(ids(&kept), [poisoned_tools, poisoned_build], "{kept}");
    let table = cli_text(srv, &["ls", "--state", "quarantined"]);
    assert!(
        table.contains("QUARANTINED") && table.contains("quarantined by admin"),
        "{table}"
    );
    let shown = cli(srv, &["show", &poisoned_tools.to_string()]);
    assert_eq!(shown["state"], "quarantined", "{shown}");
    assert_eq!(shown["written_by"]["run_id"], "66");
    assert_eq!(
        shown["restored_by"][0]["reader"]["run_id"], "70",
        "its restore records are kept: {shown}"
    );
    let after = cli(srv, &["restorers", "--run-id", "66"]);
    assert_eq!(
        after["jobs"], radius["jobs"],
        "records outlive the quarantine"
    );

    // Examine: the archive downloads byte for byte as saved (its SHA-256 is the digest the
    // server recorded at save time), and holds the poisoned files.
    let archive = data.path().join("examined.tzst");
    let said = cli_text(
        srv,
        &[
            "download",
            &poisoned_tools.to_string(),
            "-o",
            archive.to_str().unwrap(),
        ],
    );
    let digest = recorded_digest(srv, poisoned_tools);
    assert_eq!(
        format!("sha256:{}", sha256_file(&archive)),
        digest,
        "the download is the archive that was saved"
    );
    assert!(said.contains(&digest), "{said}");
    let unpacked = data.path().join("unpacked");
    std::fs::create_dir(&unpacked).unwrap();
    let tar = Command::new("tar")
        .args(["--zstd", "-xf"])
        .arg(&archive)
        .arg("-C")
        .arg(&unpacked)
        .output()
        .unwrap();
    assert!(tar.status.success(), "{tar:?}");
    let tool = common::files_under(&unpacked)
        .into_iter()
        .find(|p| p.ends_with("tools/bin/tool"))
        .expect("the archive holds the tool");
    assert_eq!(sha256_file(&tool), tool_sha);
    // The same bytes, found by their digest.
    let same = cli(srv, &["ls", "--state", "quarantined", "--digest", &digest]);
    assert_eq!(ids(&same), [poisoned_tools], "{same}");

    // A false alarm for one of them: released, the client finds it again, bytes intact.
    let released = cli(srv, &["release", &poisoned_build.to_string()]);
    assert_eq!(released["state"], "live", "{released}");
    let again = Job::new(job_token(MAIN, "73", "build"));
    assert!(again.restore(srv, "build-Linux-1", &["build"]));
    assert_eq!(sha256_file(&again.path("build/out.o")), build_sha);

    // The other is deleted for good; its id never comes back, nor any other.
    let deleted = cli(srv, &["rm", &poisoned_tools.to_string()]);
    assert_eq!(deleted["deleted"], 1, "{deleted}");
    assert!(ids(&cli(srv, &["ls", "--state", "quarantined"])).is_empty());
    let fresh = Job::new(job_token(MAIN, "74", "build"));
    fresh.write("tools/bin/tool", 1000, 74);
    let rebuilt = fresh.save(srv, "tools-Linux-1", &["tools"]);
    let before = [clean, poisoned_tools, poisoned_build];
    assert!(
        before.iter().all(|id| rebuilt > *id),
        "{rebuilt} is a new id, past {before:?}"
    );
}

#[test]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs the real @actions/cache client (and PostgreSQL, MariaDB)"
)]
fn an_incident_is_worked_on_sqlite() {
    drill_with(None);
}

#[test]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs the real @actions/cache client (and PostgreSQL, MariaDB)"
)]
fn an_incident_is_worked_on_postgres() {
    drill_with(Some(Server::Postgres));
}

#[test]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs the real @actions/cache client (and PostgreSQL, MariaDB)"
)]
fn an_incident_is_worked_on_mariadb() {
    drill_with(Some(Server::MySql));
}

// Restore records: complete answers, bounded, reclaimed with their entries on request. These
// run the server in process on SQLite, on a manual clock, and read through the admin API.

const VERSION: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// The token of job `job` of run `run` in `repository`, reading and writing the default branch.
fn reader_token(repository: &str, run: &str, job: &str) -> String {
    let mut c = claims(repository, &[(MAIN, 3)]);
    c["scp"] = json!(format!("Actions.Results:{run}:{job}"));
    sign_hs256(&c)
}

async fn admin(srv: &common::TestServer, method: reqwest::Method, path: &str) -> (u16, Value) {
    let res = srv
        .http
        .request(method, srv.url(&format!("/_hoard/api/v1/{path}")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    common::json_of(res).await
}

async fn restores_of(srv: &common::TestServer, query: &str) -> Value {
    let (status, body) = admin(srv, reqwest::Method::GET, &format!("restores?{query}")).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Saves `key` in `repository` as a job of run `run`, and has `readers` other jobs of the run
/// restore it, one clock tick apart; returns the entry id.
async fn saved_and_restored(
    srv: &common::TestServer,
    clock: &hoard::model::ManualClock,
    repository: &str,
    key: &str,
    run: &str,
    readers: usize,
) -> i64 {
    let writer = reader_token(repository, run, "save");
    let id = srv.save(&writer, key, VERSION, key.as_bytes()).await;
    for job in 0..readers {
        clock.advance(std::time::Duration::from_millis(1));
        let token = reader_token(repository, run, &format!("job-{job}"));
        let (status, body) = srv.lookup(&token, key, &[], VERSION).await;
        assert_eq!((status, &body["ok"]), (200, &json!(true)), "{body}");
    }
    id
}

#[tokio::test]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs the real @actions/cache client (and PostgreSQL, MariaDB)"
)]
async fn a_restores_answer_is_truncated_exactly_when_records_are_left_out() {
    let clock = common::manual_clock();
    let srv = common::TestServer::start_with_clock(&["--admin-token", ADMIN], clock.clone()).await;
    // 20 entries, each restored by 50 jobs (the most readers an entry keeps): 1,000 records.
    for i in 0..20 {
        saved_and_restored(&srv, &clock, REPOSITORY, &format!("k-{i}"), "9", 50).await;
    }
    let all = restores_of(&srv, "repository=4242").await;
    assert_eq!(all["restores"].as_array().unwrap().len(), 1000);
    assert_eq!(all["truncated"], false, "exactly 1,000: all of them");
    let page = restores_of(&srv, "repository=4242&per_page=999").await;
    assert_eq!(page["restores"].as_array().unwrap().len(), 999);
    assert_eq!(page["truncated"], true, "one left out of 999");

    // One record more: the answer holds 1,000, the most recent first, and says so.
    saved_and_restored(&srv, &clock, REPOSITORY, "k-last", "9", 1).await;
    let all = restores_of(&srv, "repository=4242").await;
    let records = all["restores"].as_array().unwrap();
    assert_eq!(records.len(), 1000);
    assert_eq!(records[0]["key"], "k-last", "the most recent first");
    assert_eq!(all["truncated"], true, "1,001 records: one left out");
    srv.stop().await;
}

/// `hoard gc` with `args` on the server's data directory: one maintenance pass.
fn gc(srv: &common::TestServer, args: &[&str]) {
    let out = common::process::hoard_command()
        .arg("gc")
        .args(args)
        .arg("--data-dir")
        .arg(srv.data.path())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hoard gc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The reader jobs of `repository`'s restore records, most recent first.
async fn reader_jobs(srv: &common::TestServer, repository: &str) -> Vec<String> {
    restores_of(srv, &format!("repository={repository}")).await["restores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{}/{}",
                r["key"].as_str().unwrap(),
                r["reader"]["job_id"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs the real @actions/cache client (and PostgreSQL, MariaDB)"
)]
async fn restore_records_are_bounded_per_repository_and_in_all_oldest_first() {
    let clock = common::manual_clock();
    let srv = common::TestServer::start_with_clock(&["--admin-token", ADMIN], clock.clone()).await;
    // A quiet repository restored first; then a busy one, two entries by four jobs each.
    saved_and_restored(&srv, &clock, "5151", "quiet", "1", 3).await;
    saved_and_restored(&srv, &clock, REPOSITORY, "busy-a", "2", 4).await;
    saved_and_restored(&srv, &clock, REPOSITORY, "busy-b", "2", 4).await;
    assert_eq!(reader_jobs(&srv, REPOSITORY).await.len(), 8, "written");

    // Within both bounds: nothing goes.
    gc(
        &srv,
        &[
            "--max-restore-records-per-repository",
            "8",
            "--max-restore-records",
            "11",
        ],
    );
    assert_eq!(reader_jobs(&srv, REPOSITORY).await.len(), 8);
    assert_eq!(reader_jobs(&srv, "5151").await.len(), 3);

    // Five per repository, seven in all: the busy repository loses its three oldest; then the
    // quiet one its oldest, the oldest record left.
    gc(
        &srv,
        &[
            "--max-restore-records-per-repository",
            "5",
            "--max-restore-records",
            "7",
        ],
    );
    assert_eq!(
        reader_jobs(&srv, REPOSITORY).await,
        [
            "busy-b/job-3",
            "busy-b/job-2",
            "busy-b/job-1",
            "busy-b/job-0",
            "busy-a/job-3"
        ]
    );
    assert_eq!(
        reader_jobs(&srv, "5151").await,
        ["quiet/job-2", "quiet/job-1"]
    );

    // 0 is no bound.
    gc(
        &srv,
        &[
            "--max-restore-records-per-repository",
            "0",
            "--max-restore-records",
            "0",
        ],
    );
    assert_eq!(reader_jobs(&srv, REPOSITORY).await.len(), 5);
    srv.stop().await;
}

// Multi-threaded: the CLI's process is waited for on one thread while the server answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs the real @actions/cache client (and PostgreSQL, MariaDB)"
)]
async fn a_purge_reclaims_restore_records_only_when_asked() {
    use reqwest::Method;
    let clock = common::manual_clock();
    let srv = common::TestServer::start_with_clock(&["--admin-token", ADMIN], clock.clone()).await;
    saved_and_restored(&srv, &clock, REPOSITORY, "poisoned-1", "66", 3).await;
    saved_and_restored(&srv, &clock, REPOSITORY, "poisoned-2", "66", 2).await;
    let kept = saved_and_restored(&srv, &clock, REPOSITORY, "clean", "61", 2).await;
    let alone = saved_and_restored(&srv, &clock, REPOSITORY, "alone", "70", 2).await;
    let by_cli = saved_and_restored(&srv, &clock, REPOSITORY, "by-cli", "71", 2).await;
    saved_and_restored(&srv, &clock, REPOSITORY, "by-cli-filter", "72", 3).await;
    let written_by = |run: &str| format!("run_id={run}");

    // Refused together with a quarantine, which keeps records for examination.
    let (status, body) = admin(
        &srv,
        Method::DELETE,
        &format!("caches?{}&quarantine=true&restores=true", written_by("66")),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    // A dry run deletes nothing, records included.
    let (status, body) = admin(
        &srv,
        Method::DELETE,
        &format!("caches?{}&dry_run=true&restores=true", written_by("66")),
    )
    .await;
    assert_eq!((status, &body["deleted"]), (200, &json!(2)), "{body}");
    assert!(body.get("restore_records_deleted").is_none(), "{body}");
    let radius = restores_of(&srv, &written_by("66")).await;
    assert_eq!(radius["restores"].as_array().unwrap().len(), 5);

    // The purge of run 66's entries with their records: five records go, run 61's stay.
    let (status, body) = admin(
        &srv,
        Method::DELETE,
        &format!("caches?{}&restores=true", written_by("66")),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["deleted"], 2, "{body}");
    assert_eq!(body["restore_records_deleted"], 5, "{body}");
    let radius = restores_of(&srv, &written_by("66")).await;
    assert_eq!(radius["restores"], json!([]), "{radius}");
    assert_eq!(radius["jobs"], json!([]), "{radius}");
    let other = restores_of(&srv, &written_by("61")).await;
    assert_eq!(other["restores"].as_array().unwrap().len(), 2);

    // Without it, a purge keeps them (who restored what outlives the entry).
    let (status, body) = admin(&srv, Method::DELETE, &format!("caches/{kept}")).await;
    assert_eq!((status, &body["deleted"]), (200, &json!(1)), "{body}");
    assert!(body.get("restore_records_deleted").is_none(), "{body}");
    let other = restores_of(&srv, &written_by("61")).await;
    assert_eq!(other["restores"].as_array().unwrap().len(), 2);

    // One entry by id, with its records.
    let (status, body) = admin(
        &srv,
        Method::DELETE,
        &format!("caches/{alone}?restores=true"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["restore_records_deleted"], 2, "{body}");
    let gone = restores_of(&srv, &written_by("70")).await;
    assert_eq!(gone["restores"], json!([]), "{gone}");

    // The operator's way: `hoard caches rm --with-restore-records`, by id and by filter.
    let said = cli_text(
        &srv.base,
        &["rm", &by_cli.to_string(), "--with-restore-records"],
    );
    assert!(said.contains("with 2 restore records"), "{said}");
    let gone = restores_of(&srv, &written_by("71")).await;
    assert_eq!(gone["restores"], json!([]), "{gone}");
    let answer = cli(
        &srv.base,
        &["rm", "--run-id", "72", "--with-restore-records"],
    );
    assert_eq!(answer["restore_records_deleted"], 3, "{answer}");
    let gone = restores_of(&srv, &written_by("72")).await;
    assert_eq!(gone["restores"], json!([]), "{gone}");
    srv.stop().await;
}
