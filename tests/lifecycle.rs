//! Lifecycle through the real server and the real `hoard` binary: integrity on download and
//! `hoard verify`, a full disk, and `hoard gc` killed mid-pass. (The rules themselves are tested
//! on a moved clock in `src/cache/tests.rs`.)
#![allow(clippy::unwrap_used)] // Test code fails loudly by design.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use common::{main_token, poll, random_bytes, TestServer, VERSION};

const MIB: usize = 1 << 20;

/// `hoard ARGS… --data-dir DIR`, run to completion: exit code and standard output.
fn hoard(args: &[&str], data: &Path) -> (i32, String) {
    let out = common::process::hoard_command()
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    (
        out.status.code().unwrap_or(-1),
        format!("{stdout}\n{stderr}"),
    )
}

/// The chunk file holding exactly `len` bytes (each test stores distinct sizes).
fn chunk_of_size(server: &TestServer, len: usize) -> PathBuf {
    server
        .chunk_files()
        .into_iter()
        .find(|p| std::fs::metadata(p).unwrap().len() == len as u64)
        .unwrap_or_else(|| panic!("no chunk of {len} bytes"))
}

fn flip_byte(path: &Path, at: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
}

async fn misses(server: &TestServer, key: &str) -> bool {
    let (status, body) = server.lookup(&main_token(), key, &[], VERSION).await;
    assert_eq!(status, 200, "{body}");
    body["ok"] == false
}

/// Polls until a lookup of `key` misses, to a deadline generous for a loaded CI machine: what
/// is asserted is that the miss comes, not how fast.
async fn misses_eventually(server: &TestServer, key: &str) -> bool {
    let missed = async || misses(server, key).await;
    poll(Duration::from_secs(30), missed, |missed| *missed).await
}

/// Downloads `key`, whose chunk is damaged: the answer promises `len` bytes, and the body ends
/// with an error before the last of them (a failed download, never a complete-looking one).
async fn fails_before_its_last_byte(server: &TestServer, key: &str, len: usize) {
    use futures_util::StreamExt;
    let (_, body) = server.lookup(&main_token(), key, &[], VERSION).await;
    assert_eq!(body["ok"], true, "{body}");
    let res = server
        .http
        .get(body["signed_download_url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "the damage is found while streaming");
    assert_eq!(res.content_length(), Some(len as u64));
    let mut body = res.bytes_stream();
    let mut received = 0;
    let mut failed = false;
    while let Some(frame) = body.next().await {
        match frame {
            Ok(frame) => received += frame.len(),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "the download fails, after {received} bytes");
    assert!(
        received < len,
        "{received} of {len} bytes reached the client before the failure"
    );
}

/// On object storage too: an object damaged in the store fails its download before its last
/// byte (the store is S3 on moto; its chunk is rewritten with one byte flipped).
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs the S3 emulator"
)]
async fn a_flipped_byte_in_object_storage_fails_the_download_before_its_last_byte() {
    let s3 = common::emulators::s3();
    let bucket = s3.bucket();
    common::emulators::set_env(&s3.env());
    let url = format!("s3://{bucket}/flip");
    let server = TestServer::start_with(&["--storage-url", &url]).await;
    let data = random_bytes(3 * MIB + 29, 21);
    server.save(&main_token(), "flipped", VERSION, &data).await;
    let store = object_store::aws::AmazonS3Builder::from_env()
        .with_url(format!("s3://{bucket}"))
        .build()
        .unwrap();
    let listed: Vec<object_store::ObjectMeta> = futures_util::TryStreamExt::try_collect(
        object_store::ObjectStore::list(&store, Some(&"flip/chunks".into())),
    )
    .await
    .unwrap();
    let chunk = listed
        .iter()
        .find(|o| o.size as usize == data.len())
        .expect("the chunk is in the bucket");
    let mut bytes = object_store::ObjectStore::get(&store, &chunk.location)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    assert!(bytes == data, "stored as sent");
    let last = bytes.len() - 10;
    bytes[last] ^= 0x01;
    object_store::ObjectStore::put(&store, &chunk.location, bytes.into())
        .await
        .unwrap();
    fails_before_its_last_byte(&server, "flipped", data.len()).await;
    assert!(
        misses_eventually(&server, "flipped").await,
        "quarantined: the next lookup misses"
    );
}

#[tokio::test]
async fn a_flipped_byte_fails_the_download_quarantines_the_entry_and_verify_reports_it() {
    let server = TestServer::start().await;
    let token = main_token();
    let data = random_bytes(3 * MIB + 17, 1);
    let flipped = server.save(&token, "flipped", VERSION, &data).await;
    let intact = random_bytes(1000, 2);
    server.save(&token, "intact", VERSION, &intact).await;
    // Damaged after the digest pass read it (before, the pass quarantines it: a test below),
    // in its last block.
    server.until_digested(flipped).await;
    flip_byte(&chunk_of_size(&server, data.len()), data.len() - 10);
    fails_before_its_last_byte(&server, "flipped", data.len()).await;
    // The quarantine lands right after the failed stream.
    assert!(
        misses_eventually(&server, "flipped").await,
        "the next lookup misses"
    );
    assert_eq!(
        server.restore(&token, "intact", VERSION).await.unwrap(),
        intact
    );

    // `hoard verify` (another process, while the server runs) finds damage nobody read yet.
    let later = random_bytes(5000, 3);
    server.save(&token, "later", VERSION, &later).await;
    flip_byte(&chunk_of_size(&server, later.len()), 10);
    let (code, out) = hoard(&["verify"], server.data.path());
    assert_eq!(code, 1, "damage found: exit 1\n{out}");
    assert!(out.contains("quarantined entry"), "{out}");
    assert!(out.contains("1 damaged"), "{out}");
    // Its lookup answer may be reused for --lookup-cache-ttl (1 s) by the server.
    assert!(
        misses_eventually(&server, "later").await,
        "quarantined by verify: a miss"
    );
    let (code, out) = hoard(&["verify"], server.data.path());
    assert_eq!(code, 0, "nothing damaged is left\n{out}");
    assert!(out.contains("0 damaged"), "{out}");
}

const ADMIN: &str = "lifecycle-admin-token-0123456789abcdef";

/// `hoard caches download ID -o OUT` against `server`: exit code, standard output and error.
async fn cli_download(server: &TestServer, id: i64, out: &Path) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hoard"));
    cmd.args(["caches", "download", &id.to_string(), "-o"])
        .arg(out)
        .env("HOARD_SERVER", &server.base)
        .env("HOARD_ADMIN_TOKEN", ADMIN)
        .env_remove("HOARD_ADMIN_TOKEN_FILE")
        .env("RUST_LOG", "off");
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A one-chunk entry whose damage is found before the answer's headers go (its chunk is read
/// and checked whole first) answers a proper error: over the signed link (v2 and v1 alike) an
/// Azure error, 500 `BlobDamaged` (a status `@actions/cache` reports as a failed download
/// without retrying it, where a 4xx body would be saved as the archive), and to
/// `hoard caches download` a sentence naming the damage, never "cannot reach hoard".
#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_one_chunk_entry_answers_an_error_that_names_the_damage() {
    let server = TestServer::start_with(&["--admin-token", ADMIN]).await;
    let token = main_token();
    let data = random_bytes(4099, 31);
    let id = server.save(&token, "small", VERSION, &data).await;
    server.until_digested(id).await;
    let (_, hit) = server.lookup(&token, "small", &[], VERSION).await;
    assert_eq!(hit["ok"], true, "{hit}");
    flip_byte(&chunk_of_size(&server, data.len()), 100);

    let res = server
        .http
        .get(hit["signed_download_url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 500, "an answer, not a cut connection");
    assert_eq!(res.headers()["x-ms-error-code"], "BlobDamaged");
    assert_eq!(res.headers()["content-type"], "application/xml");
    let body = res.text().await.unwrap();
    assert!(
        body.starts_with("<?xml")
            && body.contains("<Code>BlobDamaged</Code>")
            && body.contains("damaged"),
        "{body}"
    );
    assert!(!body.contains("chunk"), "no internals: {body}");
    assert!(misses_eventually(&server, "small").await, "quarantined");

    // The operator's download of it (in quarantine now, read and checked as ever).
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("small.tzst");
    let (code, stdout, stderr) = cli_download(&server, id, &out).await;
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(!stderr.contains("cannot reach"), "{stderr}");
    assert!(
        stderr.contains("500")
            && stderr.contains("damaged")
            && stderr.contains("does not match its recorded checksum"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        !out.exists(),
        "nothing is left to be mistaken for the archive"
    );

    // Found mid-stream (a large chunk, damaged at its end): the CLI names the damage too.
    let large = random_bytes(3 * MIB + 41, 32);
    let id = server.save(&token, "large", VERSION, &large).await;
    server.until_digested(id).await;
    flip_byte(&chunk_of_size(&server, large.len()), large.len() - 10);
    let out = dir.path().join("large.tzst");
    let (code, stdout, stderr) = cli_download(&server, id, &out).await;
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(!stderr.contains("cannot reach"), "{stderr}");
    assert!(
        stderr.contains(&format!("entry {id} is damaged"))
            && stderr.contains("does not match its recorded checksum")
            && stderr.contains("quarantined"),
        "{stderr}"
    );
    assert!(!out.exists(), "the partial file is removed");
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(<sha2::Sha256 as sha2::Digest>::digest(data))
}

/// A large entry gets its digest from the digest pass, a chunk damaged before the pass is
/// quarantined by it, and entries stored by the version before (every chunk with its SHA-256,
/// some without XXH3 or entry digest, in a database of the schema before) still download,
/// verify and get their digest.
#[tokio::test]
async fn large_entries_get_their_digest_after_the_save_and_chunks_stored_before_still_verify() {
    let server = TestServer::start().await;
    let token = main_token();
    let data = random_bytes(3 * MIB + 5, 11);
    let id = server.save(&token, "large", VERSION, &data).await;
    assert_eq!(
        server.until_digested(id).await,
        format!("sha256:{}", sha256_hex(&data)),
        "the digest pass records the SHA-256 of the bytes"
    );

    // Damaged before its pass: stop the server between the save and the pass.
    let early = random_bytes(2 * MIB + 9, 12);
    let early_id = server.save(&token, "early", VERSION, &early).await;
    let both = random_bytes(2 * MIB + 1, 13);
    let both_id = server.save(&token, "both", VERSION, &both).await;
    let sha_only = random_bytes(2 * MIB + 2, 14);
    let sha_only_id = server.save(&token, "sha-only", VERSION, &sha_only).await;
    for id in [early_id, both_id, sha_only_id] {
        server.until_digested(id).await;
    }
    let data_dir = server.shut_down().await;
    // The rows as the version before left them: its migrations only (what the later ones
    // made is undone, so that they run again), every chunk with its SHA-256 (written while
    // saving), "sha-only" from before XXH3 and entry digests were recorded; "early" as a crash
    // before its digest pass leaves it, then damaged.
    let db = rusqlite::Connection::open(data_dir.path().join("hoard.db")).unwrap();
    db.execute_batch(&format!(
        "DROP INDEX entries_awaiting_digest;
         DROP TABLE restores;
         DROP TABLE quarantined_entries;
         DROP TABLE quarantined_chunks;
         ALTER TABLE family_stats DROP COLUMN refused_writes;
         ALTER TABLE family_stats DROP COLUMN refused_reads;
         ALTER TABLE server_stats DROP COLUMN refused_writes;
         ALTER TABLE server_stats DROP COLUMN refused_reads;
         ALTER TABLE entries DROP COLUMN promoted_from;
         ALTER TABLE entries DROP COLUMN promoted_by;
         ALTER TABLE entries DROP COLUMN promoted_for;
         DROP TABLE webhook_deliveries;
         DROP TABLE webhook_refs;
         ALTER TABLE family_stats DROP COLUMN promoted_hits;
         ALTER TABLE server_stats DROP COLUMN promoted_hits;
         PRAGMA user_version = 8;
         UPDATE entry_chunks SET xxh3 = NULL WHERE entry_id = {sha_only_id};
         UPDATE entries SET digest = '' WHERE id IN ({sha_only_id}, {early_id});
         UPDATE entry_chunks SET sha256 = X'' WHERE entry_id = {early_id};"
    ))
    .unwrap();
    let with_sha256: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM entry_chunks WHERE length(sha256) = 32",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        with_sha256, 3,
        "large, both and sha-only keep their SHA-256"
    );
    drop(db);
    let early_chunk = files_of_size(data_dir.path(), early.len());
    flip_byte(&early_chunk, MIB);

    let server = TestServer::start_on(data_dir).await;
    // The start-up walk: "early" is read, found damaged and quarantined; "sha-only" gets its
    // digest from its chunk's SHA-256.
    assert_eq!(
        server.until_digested(sha_only_id).await,
        format!("sha256:{}", sha256_hex(&sha_only))
    );
    assert!(
        misses_eventually(&server, "early").await,
        "quarantined by the pass"
    );
    for (key, bytes) in [("both", &both), ("sha-only", &sha_only), ("large", &data)] {
        assert_eq!(
            server.restore(&token, key, VERSION).await.as_ref(),
            Some(bytes),
            "{key} downloads whole"
        );
    }
    let (code, out) = hoard(&["verify"], server.data.path());
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("0 damaged"), "{out}");
    // verify checks the SHA-256 of a chunk stored before: a flipped byte is found.
    flip_byte(&chunk_of_size(&server, sha_only.len()), 7);
    let (code, out) = hoard(&["verify"], server.data.path());
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("1 damaged"), "{out}");
}

/// The chunk file of exactly `len` bytes under a data directory.
fn files_of_size(data: &Path, len: usize) -> PathBuf {
    common::files_under(&data.join("chunks"))
        .into_iter()
        .find(|p| std::fs::metadata(p).unwrap().len() == len as u64)
        .unwrap_or_else(|| panic!("no chunk of {len} bytes"))
}

/// A tmpfs mounted over a directory for the life of the value.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Option<Self> {
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Self(dir.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[tokio::test]
async fn a_full_disk_gives_clean_errors_frees_the_staged_bytes_and_saves_resume() {
    let data = tempfile::tempdir().unwrap();
    // Mounting needs root (CI runs as root); elsewhere the domain tests cover the rules.
    let Some(_mount) = Tmpfs::mount(data.path(), "24m") else {
        eprintln!("skipped: cannot mount a tmpfs (not root)");
        return;
    };
    let server = TestServer::start_on_with(data, &[]).await;
    let token = main_token();
    let before = random_bytes(4 * MIB, 1);
    server.save(&token, "before", VERSION, &before).await;
    let chunks_before = server.chunk_files();

    // 8 blocks of 4 MiB do not fit in what is left.
    let url = server.reserve(&token, "huge", VERSION).await;
    let mut refused = None;
    for i in 0..8 {
        let res = server
            .put_block(
                &url,
                &format!("block-{i:03}"),
                random_bytes(4 * MIB, 10 + i),
            )
            .await;
        if res.status() != 201 {
            refused = Some(res);
            break;
        }
    }
    let res = refused.expect("the disk filled up");
    assert_eq!(res.status(), 507);
    assert_eq!(res.headers()["x-ms-error-code"], "InsufficientStorage");
    assert_eq!(res.headers()["content-type"], "application/xml");
    let body = res.text().await.unwrap();
    assert!(body.contains("<Code>InsufficientStorage</Code>"), "{body}");

    // The upload was abandoned and every byte it staged is free again.
    assert_eq!(server.chunk_files(), chunks_before, "staged chunks deleted");
    let staging = common::files_under(&server.data.path().join("tmp"));
    assert!(staging.is_empty(), "no staging files left: {staging:?}");
    let (status, body) = server.finalize(&token, "huge", VERSION, 32 * MIB).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ok"], false, "nothing to finalize: {body}");
    assert!(misses(&server, "huge").await, "nothing visible");
    assert_eq!(
        server.restore(&token, "before", VERSION).await.unwrap(),
        before,
        "earlier entries are intact"
    );

    // With the space back, saves work again.
    let after = random_bytes(4 * MIB, 2);
    server.save(&token, "after", VERSION, &after).await;
    assert_eq!(
        server.restore(&token, "after", VERSION).await.unwrap(),
        after
    );
}

/// Writes `count` chunk files no metadata names, last modified a day ago, and returns their
/// names: the test counts what is left of exactly these (a kept entry's random 32-hex name may
/// contain any pattern the planted ones share).
fn plant_orphans(data: &Path, count: usize) -> HashSet<String> {
    let old = SystemTime::now() - Duration::from_secs(86_400);
    let mut planted = HashSet::new();
    for i in 0..count {
        let name = format!("{:032x}", 0xdead_0000_0000u64 + i as u64);
        let dir = data.join("chunks").join(&name[..2]);
        std::fs::create_dir_all(&dir).unwrap();
        let file = std::fs::File::create(dir.join(&name)).unwrap();
        file.set_modified(old).unwrap();
        planted.insert(name);
    }
    planted
}

/// Looks `key` up and downloads the hit: `None` for a miss, or for an entry removed between
/// the lookup and the download (refused whole, never short).
async fn restore_if_present(server: &TestServer, key: &str) -> Option<Vec<u8>> {
    let (status, body) = server.lookup(&main_token(), key, &[], VERSION).await;
    assert_eq!(status, 200, "{body}");
    let url = body["signed_download_url"].as_str()?;
    let res = server.http.get(url).send().await.unwrap();
    match res.status().as_u16() {
        200 => Some(res.bytes().await.unwrap().to_vec()),
        403 | 404 => None,
        other => panic!("download of {key}: status {other}"),
    }
}

#[tokio::test]
async fn hoard_gc_killed_mid_pass_never_leaves_a_corrupt_or_short_hit() {
    // No reuse of lookups: what `hoard gc` removed is a miss at once.
    let server = TestServer::start_with(&["--lookup-cache-ttl", "0s"]).await;
    let token = main_token();
    let mut saved = Vec::new();
    for i in 0..120 {
        let data = random_bytes(2048 + i, i as u64);
        server
            .save(&token, &format!("entry-{i:03}"), VERSION, &data)
            .await;
        saved.push(data);
    }
    let orphans = plant_orphans(server.data.path(), 2000);
    let dir = server.data.path().to_str().unwrap().to_owned();

    // Evicting down to 100 KiB and collecting orphans, killed at several points.
    for delay in [5, 15, 40, 90, 200] {
        let mut child = common::process::hoard_command()
            .args(["gc", "--max-storage", "100KiB", "--data-dir", &dir])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(delay)).await;
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        for (i, data) in saved.iter().enumerate() {
            if let Some(got) = restore_if_present(&server, &format!("entry-{i:03}")).await {
                assert_eq!(&got, data, "entry-{i:03}: a hit is whole and intact");
            }
        }
    }

    // A pass run to the end finishes the work.
    let (code, out) = hoard(&["gc", "--max-storage", "100KiB"], server.data.path());
    assert_eq!(code, 0, "{out}");
    let orphans_left = server
        .chunk_files()
        .iter()
        .filter(|p| orphans.contains(p.file_name().unwrap().to_str().unwrap()))
        .count();
    assert_eq!(orphans_left, 0, "every orphan is collected\n{out}");
    let (mut kept, mut kept_bytes) = (0, 0);
    for (i, data) in saved.iter().enumerate() {
        if let Some(got) = restore_if_present(&server, &format!("entry-{i:03}")).await {
            assert_eq!(&got, data);
            kept += 1;
            kept_bytes += data.len();
        }
    }
    assert!(
        kept > 0 && kept < saved.len(),
        "evicted down to the limit: {kept} kept"
    );
    assert!(
        kept_bytes <= 100 << 10,
        "at most 100 KiB kept: {kept_bytes}"
    );
}

/// `--pr-scope-share` through the real server, on a moved clock: a repository filled with
/// pull-request entries past their share loses its least recently used pull-request entries,
/// and a save of the default branch over the quota evicts pull-request entries first; the
/// default branch's entry survives both, and the admin API shows bytes per class.
#[tokio::test]
async fn pull_request_entries_keep_within_their_share_and_the_default_branch_survives() {
    const ADMIN: &str = "admin-token-for-tests-0123456789";
    let clock = common::manual_clock();
    let server = TestServer::start_with_clock(
        &[
            "--repo-quota",
            "10000",
            "--pr-scope-share",
            "40%",
            "--admin-token",
            ADMIN,
        ],
        clock.clone(),
    )
    .await;
    let main = main_token();
    let pr = common::token("1", &[("refs/pull/5/merge", 3), (common::MAIN, 1)]);
    let tick = || clock.advance(Duration::from_secs(1));
    let usage = || async {
        let res = server
            .http
            .get(server.url("/_hoard/api/v1/usage"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        let (status, body) = common::json_of(res).await;
        assert_eq!(status, 200, "{body}");
        let repo = &body["repositories"][0];
        (
            repo["branch_caches_size_in_bytes"].as_u64().unwrap(),
            repo["pr_and_tag_caches_size_in_bytes"].as_u64().unwrap(),
            repo["pr_and_tag_caches_count"].as_u64().unwrap(),
        )
    };

    let deps = random_bytes(3000, 10);
    server.save(&main, "main-deps", VERSION, &deps).await;
    tick();
    let prs: Vec<Vec<u8>> = (0..3).map(|i| random_bytes(1500, 20 + i)).collect();
    for (i, data) in prs.iter().enumerate() {
        server.save(&pr, &format!("pr-{i}"), VERSION, data).await;
        tick();
    }
    // 4,500 bytes of pull-request entries against a share of 4,000: the oldest went.
    assert_eq!(server.restore(&pr, "pr-0", VERSION).await, None);
    assert_eq!(server.restore(&pr, "pr-1", VERSION).await.unwrap(), prs[1]);
    assert_eq!(server.restore(&pr, "pr-2", VERSION).await.unwrap(), prs[2]);
    assert_eq!(
        server.restore(&main, "main-deps", VERSION).await.unwrap(),
        deps
    );
    assert_eq!(usage().await, (3000, 3000, 2));
    tick();

    // The default branch's save over the quota (10,500 bytes): pull requests go first.
    let more = random_bytes(4500, 30);
    server.save(&main, "main-more", VERSION, &more).await;
    assert_eq!(server.restore(&pr, "pr-1", VERSION).await, None);
    assert_eq!(server.restore(&pr, "pr-2", VERSION).await.unwrap(), prs[2]);
    assert_eq!(
        server.restore(&main, "main-deps", VERSION).await.unwrap(),
        deps
    );
    assert_eq!(
        server.restore(&main, "main-more", VERSION).await.unwrap(),
        more
    );
    assert_eq!(usage().await, (7500, 1500, 1));
    server.stop().await;
}
