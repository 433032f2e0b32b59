//! Power loss under a running hoard (issue #61): its data directory (chunks, `VERSION`, `synced`,
//! the SQLite database and the signing key) on ext4 on a disk that keeps only what was flushed to
//! it ([`PowerDisk`]), and the power cut while clients save and restore, at random moments and
//! at chosen ones: in a new store's first second, at the next flush (the middle of a `syncfs` or
//! a journal commit), after a number of writes, while idle, after an entry was finalized with
//! nothing put since, after a write-back of everything, and a second time while hoard recovers
//! from the first. hoard restarts after each cut with a new boot id, as after a reboot (a private
//! mount namespace over `/proc/sys/kernel/random/boot_id`).
//!
//! After every cut:
//! - hoard starts;
//! - no download returns other bytes than the ones saved, nor breaks off (an entry whose bytes
//!   were lost is never served);
//! - every save acknowledged more than one `--sync-interval` before the cut (and the flush
//!   round's own time, [`DURABLE_AFTER`]) restores;
//! - SQLite's integrity check passes, and at the end ext4's own check (`e2fsck -fn`).
//!
//! It prints, per cut, the saves made, lost and kept, and the youngest save that survived
//! (`cargo nextest run --test power_loss --no-capture`).
//!
//! Needs root, `/dev/fuse` and a loop device; without them it says why and passes, unless
//! `HOARD_TEST_REQUIRE_POWER_LOSS=1` (as in CI), when it fails.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

#[path = "../common/mod.rs"]
mod common;
/// The simulated disk's own checks: what the power-loss checks stand on.
mod disk;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::power_disk::PowerDisk;
use common::process::Hoard;
use common::{main_token, random_bytes, secret_file, SERVICE, VERSION};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

/// hoard's `--sync-interval` here: short, so that a cycle is short.
const SYNC_INTERVAL: Duration = Duration::from_secs(1);
/// A save acknowledged this long before a cut must survive it: one interval until the next
/// flush round, and that round's own time (a `syncfs` through the loop device and FUSE, a record,
/// a checkpoint), with room for a round that a commit landing during it makes run once more.
const DURABLE_AFTER: Duration = Duration::from_millis(2500);
/// Clients saving at once while the power is on.
const CLIENTS: usize = 3;
/// Cuts in all (the two cuts of a recovery cycle count as two).
const CUTS: usize = 20;

/// One acknowledged save: its bytes are `random_bytes(len, seed)`.
#[derive(Debug, Clone)]
struct Saved {
    key: String,
    len: usize,
    seed: u64,
    acked: Instant,
}

/// How a cycle ends.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// A new store (a new data directory), cut within its first second.
    NewStore,
    /// A new store left alone past ext4's journal commit (5 s), so that its files' names and
    /// sizes reached the disk while their contents, never flushed, did not; then a few saves,
    /// and a cut before hoard's first flush of them.
    NewStoreAfterJournalCommit,
    /// After a random time of saves and restores.
    AtRandom,
    /// When the next flush reaches the disk, before it makes anything durable.
    AtNextFlush,
    /// Right after a random number of writes reach the disk.
    AfterWrites,
    /// After saves, then three intervals with nothing going on.
    WhileIdle,
    /// An upload's blocks put, an interval passes, then its finalize, then quiet.
    FinalizedAfterTheFlush,
    /// Shortly after `sync(2)` wrote back everything: chunks and commits on disk that hoard's
    /// own record may not cover yet (such entries are forgotten, never served broken).
    AfterWriteBack,
    /// A random cut, then another one while hoard starts and recovers from it.
    DuringRecovery,
    /// Saves, then hoard killed (a crash of the process: the page cache keeps what it wrote)
    /// and started again on the same boot, then three intervals with nothing going on, then the
    /// cut: the new process must flush what the old one left before it records anything.
    ProcessCrashThenIdle,
}

const ALL: [Cut; 10] = [
    Cut::NewStore,
    Cut::NewStoreAfterJournalCommit,
    Cut::AtRandom,
    Cut::AtNextFlush,
    Cut::AfterWrites,
    Cut::WhileIdle,
    Cut::FinalizedAfterTheFlush,
    Cut::AfterWriteBack,
    Cut::DuringRecovery,
    Cut::ProcessCrashThenIdle,
];

/// The cycles of a run, in order, repeated until [`CUTS`] cuts.
const PLAN: [Cut; 18] = [
    Cut::NewStoreAfterJournalCommit,
    Cut::AtRandom,
    Cut::AtNextFlush,
    Cut::WhileIdle,
    Cut::FinalizedAfterTheFlush,
    Cut::AfterWrites,
    // A new store every six cycles keeps the run within the disk.
    Cut::NewStore,
    Cut::AfterWriteBack,
    Cut::DuringRecovery,
    Cut::AtRandom,
    Cut::AtNextFlush,
    Cut::AfterWrites,
    Cut::NewStore,
    Cut::AtRandom,
    Cut::DuringRecovery,
    Cut::ProcessCrashThenIdle,
    Cut::AtNextFlush,
    Cut::AtRandom,
];

/// What one cut did to the saves, for the printed table.
#[derive(Debug, Default)]
struct Tally {
    /// Saves acknowledged in this cycle.
    saves: usize,
    /// Saves restored after the cut: this cycle's and the earlier ones still on record.
    restores: usize,
    /// Entries hoard forgot at start-up, as its log says.
    forgotten: Option<usize>,
    lost: usize,
    kept: usize,
    youngest_kept: Option<Duration>,
    oldest_lost: Option<Duration>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hoard_keeps_what_it_acknowledged_and_never_serves_lost_bytes_across_power_cuts() {
    let disk = match PowerDisk::new() {
        Ok(disk) => Arc::new(disk),
        Err(why) if std::env::var("HOARD_TEST_REQUIRE_POWER_LOSS").as_deref() == Ok("1") => {
            panic!("the power-loss test cannot run here: {why}")
        }
        Err(why) => {
            eprintln!("skipped: the power-loss test cannot run here: {why}");
            return;
        }
    };
    let seed: u64 = std::env::var("HOARD_POWER_LOSS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("power-loss seed {seed} (HOARD_POWER_LOSS_SEED={seed} repeats this run)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // Outside the disk: the token secret and the boot ids are the machine's, not the store's.
    let outside = tempfile::tempdir().unwrap();
    let secret = secret_file(outside.path());
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let mut rig = Rig {
        disk: disk.clone(),
        outside: outside.path().to_owned(),
        secret,
        http,
        data: PathBuf::new(),
        stores: 0,
        boots: 0,
        saved: Vec::new(),
        next_key: Arc::new(AtomicU64::new(0)),
    };

    // `HOARD_POWER_LOSS_PLAN=WhileIdle,AtNextFlush` runs those cycles alone, once each.
    let chosen: Option<Vec<Cut>> = std::env::var("HOARD_POWER_LOSS_PLAN").ok().map(|names| {
        names
            .split(',')
            .map(|name| {
                *ALL.iter()
                    .find(|cut| format!("{cut:?}") == name.trim())
                    .unwrap_or_else(|| panic!("no cycle named {name:?}: {ALL:?}"))
            })
            .collect()
    });
    let (mut plan, wanted): (Box<dyn Iterator<Item = &Cut>>, usize) = match &chosen {
        Some(chosen) => (Box::new(chosen.iter()), usize::MAX),
        None => (Box::new(PLAN.iter().cycle()), CUTS),
    };
    let mut cuts = 0;
    let mut totals = Tally::default();
    while cuts < wanted {
        let Some(&cut) = plan.next() else { break };
        let tally = rig.cycle(cut, &mut rng).await;
        cuts += if matches!(cut, Cut::DuringRecovery) {
            2
        } else {
            1
        };
        eprintln!(
            "cut {cuts:>2} {cut:<26?} saves {:>3}, restores {:>4}, forgotten at start {:?}, lost {:>2}, kept {:>3}, youngest kept {:?}, oldest lost {:?}",
            tally.saves,
            tally.restores,
            tally.forgotten,
            tally.lost,
            tally.kept,
            tally.youngest_kept,
            tally.oldest_lost
        );
        totals.saves += tally.saves;
        totals.restores += tally.restores;
        totals.lost += tally.lost;
    }
    eprintln!(
        "{cuts} cuts, {} acknowledged saves, {} restores checked, {} saves lost (all younger than {DURABLE_AFTER:?}), no corrupt hit",
        totals.saves, totals.restores, totals.lost
    );
    if chosen.is_none() {
        assert!(
            totals.saves >= 100,
            "too few saves to mean anything: {totals:?}"
        );
    }
    disk.check_consistent()
        .unwrap_or_else(|e| panic!("after the last cut: {e}"));
}

/// How many entries hoard says it forgot at start-up, if it says so.
fn forgotten_at_start(hoard: &Hoard) -> Option<usize> {
    let log = hoard.log.lock().unwrap();
    let line = log
        .iter()
        .find(|l| l.contains("forgot the entries finalized after it"))?;
    let count = line.split("entries=").nth(1)?.split_whitespace().next()?;
    count.parse().ok()
}

struct Rig {
    disk: Arc<PowerDisk>,
    outside: PathBuf,
    secret: PathBuf,
    http: reqwest::Client,
    /// The data directory in use, on the disk.
    data: PathBuf,
    stores: usize,
    boots: usize,
    /// Every save acknowledged and not yet found lost, in the store in use.
    saved: Vec<Saved>,
    next_key: Arc<AtomicU64>,
}

impl Rig {
    /// hoard on the store in use, as after a boot with a boot id of its own.
    fn start(&mut self) -> Hoard {
        self.boots += 1;
        let boot_id = format!(
            "{:08x}-0000-4000-8000-{:012x}",
            self.boots,
            rand::random::<u64>() >> 16
        );
        std::fs::write(self.boot_file(), format!("{boot_id}\n")).unwrap();
        self.start_on_this_boot()
    }

    /// The file that holds the boot id of the boot in progress.
    fn boot_file(&self) -> PathBuf {
        self.outside.join(format!("boot-{}", self.boots))
    }

    /// hoard on the store in use, on the boot in progress (after a crash of its process).
    fn start_on_this_boot(&mut self) -> Hoard {
        let boot_file = self.boot_file();
        let mut command = Command::new("unshare");
        // Slave: the disk's unmount at a reboot reaches this namespace's copy of it (the disk's
        // mounts are shared), and the bind mount below stays in here.
        command.args(["--mount", "--propagation", "slave", "--", "sh", "-c"]);
        command.arg(r#"mount --bind "$0" /proc/sys/kernel/random/boot_id && exec "$@""#);
        command.arg(&boot_file);
        let interval = format!("{}ms", SYNC_INTERVAL.as_millis());
        Hoard::start_command(
            command,
            &self.data,
            &[
                "--token-hs256-secret-file",
                self.secret.to_str().unwrap(),
                "--sync-interval",
                &interval,
            ],
        )
    }

    /// A new, empty data directory on the disk, in place of the last one.
    fn new_store(&mut self) {
        if self.stores > 0 {
            std::fs::remove_dir_all(&self.data).unwrap();
        }
        self.stores += 1;
        self.data = self.disk.path().join(format!("store-{}", self.stores));
        self.saved.clear();
    }

    /// Runs one cycle: hoard up, clients at work, the cut, the reboot, and the checks.
    async fn cycle(&mut self, cut: Cut, rng: &mut impl Rng) -> Tally {
        let mut tally = Tally::default();
        if self.stores == 0 || matches!(cut, Cut::NewStore | Cut::NewStoreAfterJournalCommit) {
            self.new_store();
        }
        let mut hoard = self.start();
        let base = hoard.base.clone();
        let before = self.saved.len();
        let cut_at = match cut {
            Cut::NewStore => {
                let work = self.clients(&base, 2);
                tokio::time::sleep(Duration::from_millis(rng.random_range(300..900))).await;
                self.cut_now(&work).await
            }
            Cut::NewStoreAfterJournalCommit => {
                tokio::time::sleep(Duration::from_secs(6)).await;
                let work = self.clients(&base, 2);
                tokio::time::sleep(Duration::from_millis(rng.random_range(100..400))).await;
                self.cut_now(&work).await
            }
            Cut::AtRandom | Cut::DuringRecovery => {
                let work = self.clients(&base, CLIENTS);
                tokio::time::sleep(Duration::from_millis(rng.random_range(500..4000))).await;
                self.cut_now(&work).await
            }
            Cut::AtNextFlush => {
                let work = self.clients(&base, CLIENTS);
                tokio::time::sleep(Duration::from_millis(rng.random_range(800..2500))).await;
                self.disk.cut_at_flush(1);
                self.armed_cut(&work).await
            }
            Cut::AfterWrites => {
                let work = self.clients(&base, CLIENTS);
                tokio::time::sleep(Duration::from_millis(rng.random_range(800..2500))).await;
                self.disk.cut_after_writes(rng.random_range(1..400));
                self.armed_cut(&work).await
            }
            Cut::WhileIdle => {
                let work = self.clients(&base, CLIENTS);
                tokio::time::sleep(Duration::from_millis(rng.random_range(500..2000))).await;
                work.stop().await;
                tokio::time::sleep(3 * SYNC_INTERVAL).await;
                self.cut_now(&work).await
            }
            Cut::FinalizedAfterTheFlush => {
                let work = self.clients(&base, 1);
                tokio::time::sleep(Duration::from_millis(500)).await;
                work.stop().await;
                let key = self.next_key();
                let (len, seed) = (5 << 19, rng.random());
                let saver = Saver::new(&self.http, &base);
                let url = saver.reserve(&key).await.unwrap();
                saver.upload(&url, &random_bytes(len, seed)).await.unwrap();
                // Its chunks are flushed by the next round; its entry comes after that round.
                tokio::time::sleep(2 * SYNC_INTERVAL).await;
                saver.finalize(&key, len).await.unwrap();
                work.record(key, len, seed);
                tokio::time::sleep(3 * SYNC_INTERVAL).await;
                self.cut_now(&work).await
            }
            Cut::ProcessCrashThenIdle => {
                let work = self.clients(&base, CLIENTS);
                tokio::time::sleep(Duration::from_millis(rng.random_range(500..2000))).await;
                work.stop().await;
                // Killed, then started on the same boot: it must not take the chunks its
                // predecessor left in the page cache for flushed. Every save was acknowledged
                // more than three intervals before the cut, so all of them must survive.
                hoard.kill_in_place();
                hoard = self.start_on_this_boot();
                tokio::time::sleep(3 * SYNC_INTERVAL).await;
                self.cut_now(&work).await
            }
            Cut::AfterWriteBack => {
                let work = self.clients(&base, CLIENTS);
                tokio::time::sleep(Duration::from_millis(rng.random_range(500..2000))).await;
                rustix::fs::sync();
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..500))).await;
                self.cut_now(&work).await
            }
        };
        tally.saves = self.saved.len() - before;
        drop(hoard.kill_9());
        self.reboot();
        if matches!(cut, Cut::DuringRecovery) {
            // hoard starts and recovers from the first cut (forgets, checkpoints, deletes,
            // flushes) when the power goes again, a few disk writes into it.
            let writes = rng.random_range(1..60);
            self.disk.cut_after_writes(writes);
            // The dead disk answers every write, so hoard goes on starting. A recovery that
            // made fewer writes than drawn is cut as it finishes (the start waits for it).
            let second = self.start();
            if !self.disk.wait_until_cut(Duration::from_secs(1)) {
                eprintln!("recovery made fewer than {writes} disk writes: cut as it ended");
                self.disk.cut_now();
            }
            drop(second.kill_9());
            self.reboot();
        }
        let hoard = self.start();
        tally.forgotten = forgotten_at_start(&hoard);
        self.check_database();
        let deadline = cut_at.checked_sub(DURABLE_AFTER);
        let checked = self.check(&hoard.base, cut_at, deadline).await;
        tally.restores = checked.restores;
        tally.lost = checked.lost;
        tally.kept = checked.kept;
        tally.youngest_kept = checked.youngest_kept;
        tally.oldest_lost = checked.oldest_lost;
        drop(hoard); // stopped by SIGKILL too: the next cycle starts as after a crash of the process
        tally
    }

    fn reboot(&self) {
        // The processes on the disk are gone; the mount namespace of the last one goes with it,
        // and may take a moment to let go of the file system.
        for _ in 0..50 {
            if self.disk.power_on().is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.disk
            .power_on()
            .unwrap_or_else(|e| panic!("cannot reboot the disk: {e}"));
    }

    /// SQLite's own check of the database hoard recovered.
    fn check_database(&self) {
        let conn = rusqlite::Connection::open_with_flags(
            self.data.join("hoard.db"),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .unwrap();
        let result: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(result, "ok", "SQLite's integrity check after a power cut");
    }

    /// Restores every save on record: a hit must be its bytes, whole; a miss is allowed only
    /// for a save acknowledged after `deadline`.
    async fn check(&mut self, base: &str, cut_at: Instant, deadline: Option<Instant>) -> Tally {
        let mut tally = Tally::default();
        let saver = Saver::new(&self.http, base);
        let mut kept = Vec::new();
        for save in std::mem::take(&mut self.saved) {
            tally.restores += 1;
            let age = cut_at.saturating_duration_since(save.acked);
            match saver.restore(&save.key).await {
                Ok(Some(bytes)) => {
                    assert!(
                        bytes.len() == save.len && bytes == random_bytes(save.len, save.seed),
                        "corrupt hit: {} restored {} bytes that are not the {} saved",
                        save.key,
                        bytes.len(),
                        save.len
                    );
                    tally.kept += 1;
                    tally.youngest_kept = Some(tally.youngest_kept.map_or(age, |y| y.min(age)));
                    kept.push(save);
                }
                Ok(None) => {
                    let must_survive = deadline.is_some_and(|d| save.acked < d);
                    assert!(
                        !must_survive,
                        "{} was acknowledged {age:?} before the cut and is lost",
                        save.key,
                    );
                    tally.lost += 1;
                    tally.oldest_lost = Some(tally.oldest_lost.map_or(age, |o| o.max(age)));
                }
                Err(e) => panic!("restoring {} after a power cut: {e}", save.key),
            }
        }
        self.saved = kept;
        tally
    }

    fn next_key(&self) -> String {
        format!(
            "power-{}-{}",
            self.stores,
            self.next_key.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// `n` clients saving (and now and then restoring what was saved) until stopped.
    fn clients(&self, base: &str, n: usize) -> Work {
        let work = Work {
            stop: Arc::new(AtomicBool::new(false)),
            acked: Arc::new(Mutex::new(Vec::new())),
            tasks: Arc::new(Mutex::new(Vec::new())),
        };
        for _ in 0..n {
            let (http, base) = (self.http.clone(), base.to_owned());
            let (stop, acked) = (work.stop.clone(), work.acked.clone());
            let (stores, next_key) = (self.stores, self.next_key.clone());
            let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
            let task = tokio::spawn(async move {
                let saver = Saver::new(&http, &base);
                while !stop.load(Ordering::Relaxed) {
                    let key = format!(
                        "power-{stores}-{}",
                        next_key.fetch_add(1, Ordering::Relaxed)
                    );
                    // Mostly small saves (a chunk written whole), some of more than 1 MiB (staged
                    // and renamed), a few of several blocks; about 170 KiB on average, so that a
                    // store's six cycles fit the disk.
                    let len = match rng.random_range(0..100) {
                        0..75 => rng.random_range(1..64 << 10),
                        75..95 => rng.random_range(64 << 10..512 << 10),
                        95..99 => rng.random_range(1 << 20..2 << 20),
                        _ => rng.random_range(2 << 20..3 << 20),
                    };
                    let seed = rng.random();
                    if saver.save(&key, &random_bytes(len, seed)).await.is_ok() {
                        let save = Saved {
                            key,
                            len,
                            seed,
                            acked: Instant::now(),
                        };
                        acked.lock().unwrap().push(save);
                    }
                    // A restore of something saved before, while the power is on: never a
                    // corrupt hit either.
                    let earlier = {
                        let acked = acked.lock().unwrap();
                        (!acked.is_empty()).then(|| acked[rng.random_range(0..acked.len())].clone())
                    };
                    if let Some(save) = earlier {
                        if let Ok(Some(bytes)) = saver.restore(&save.key).await {
                            if stop.load(Ordering::Relaxed) {
                                break; // the power may be gone: what was read is not checked
                            }
                            assert!(
                                bytes == random_bytes(save.len, save.seed),
                                "corrupt hit while running: {}",
                                save.key
                            );
                        }
                    }
                }
            });
            work.tasks.lock().unwrap().push(task);
        }
        work
    }

    /// Cuts the power now; the instant it did, and the saves acknowledged before it on record.
    async fn cut_now(&mut self, work: &Work) -> Instant {
        let at = Instant::now();
        self.disk.cut_now();
        self.end(work, at).await
    }

    /// Waits for an armed cut; the instant it was seen.
    async fn armed_cut(&mut self, work: &Work) -> Instant {
        let disk = self.disk.clone();
        let seen = tokio::task::spawn_blocking(move || {
            // Polled finely: the instant taken is at most a poll late, which only makes the
            // check stricter by that much.
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if disk.is_cut() {
                    return Some(Instant::now());
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            None
        })
        .await
        .unwrap();
        let at = match seen {
            Some(at) => at - Duration::from_millis(2),
            None => panic!("the armed cut did not come within 30 s"),
        };
        self.end(work, at).await
    }

    /// Stops the clients and keeps the saves acknowledged before `cut` (an answer after the cut
    /// came from a server whose disk was already dead: not counted either way).
    async fn end(&mut self, work: &Work, cut: Instant) -> Instant {
        work.stop().await;
        let acked = std::mem::take(&mut *work.acked.lock().unwrap());
        self.saved
            .extend(acked.into_iter().filter(|s| s.acked < cut));
        cut
    }
}

/// Clients at work, and the saves they had acknowledged.
struct Work {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<Saved>>>,
    tasks: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Work {
    /// Stops the clients, waiting for their current requests (a dead server answers fast).
    async fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap());
        for task in tasks {
            if let Err(e) = task.await {
                if e.is_panic() {
                    std::panic::resume_unwind(e.into_panic());
                }
            }
        }
    }

    fn record(&self, key: String, len: usize, seed: u64) {
        self.acked.lock().unwrap().push(Saved {
            key,
            len,
            seed,
            acked: Instant::now(),
        });
    }
}

/// The v2 client's calls, each an `Err` rather than a panic when the server is gone.
struct Saver<'a> {
    http: &'a reqwest::Client,
    base: &'a str,
    token: String,
}

impl<'a> Saver<'a> {
    fn new(http: &'a reqwest::Client, base: &'a str) -> Self {
        Self {
            http,
            base,
            token: main_token(),
        }
    }

    async fn twirp(&self, method: &str, body: Value) -> Result<Value, String> {
        let res = self
            .http
            .post(format!("{}{SERVICE}{method}", self.base))
            .bearer_auth(&self.token)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| format!("{method}: {e}"))?;
        let status = res.status().as_u16();
        let text = res.text().await.map_err(|e| format!("{method}: {e}"))?;
        if status != 200 {
            return Err(format!("{method}: {status} {text}"));
        }
        serde_json::from_str(&text).map_err(|e| format!("{method}: {e}: {text}"))
    }

    async fn reserve(&self, key: &str) -> Result<String, String> {
        let body = self
            .twirp(
                "CreateCacheEntry",
                json!({ "key": key, "version": VERSION }),
            )
            .await?;
        match body["signed_upload_url"].as_str() {
            Some(url) if body["ok"] == true => Ok(url.to_owned()),
            _ => Err(format!("CreateCacheEntry: {body}")),
        }
    }

    /// Put Blob for up to 2 MiB, as the v2 client does for small files; Put Block and Put
    /// Block List of 1 MiB blocks above.
    async fn upload(&self, url: &str, data: &[u8]) -> Result<(), String> {
        let put = |req: reqwest::RequestBuilder, what: &'static str| async move {
            let res = req.send().await.map_err(|e| format!("{what}: {e}"))?;
            match res.status().as_u16() {
                201 => Ok(()),
                status => Err(format!("{what}: {status}")),
            }
        };
        if data.len() <= 2 << 20 {
            let req = self
                .http
                .put(url)
                .header("x-ms-blob-type", "BlockBlob")
                .body(data.to_vec());
            return put(req, "Put Blob").await;
        }
        let mut ids = Vec::new();
        for (i, block) in data.chunks(1 << 20).enumerate() {
            use base64::Engine;
            let id = base64::engine::general_purpose::STANDARD.encode(format!("block-{i:06}"));
            let req = self
                .http
                .put(format!(
                    "{url}&comp=block&blockid={}",
                    common::percent_encode(&id)
                ))
                .body(block.to_vec());
            put(req, "Put Block").await?;
            ids.push(id);
        }
        let list: String = ids
            .iter()
            .map(|id| format!("<Latest>{id}</Latest>"))
            .collect();
        let req = self
            .http
            .put(format!("{url}&comp=blocklist"))
            .header("content-type", "application/xml")
            .body(format!(
                "<?xml version=\"1.0\" encoding=\"utf-8\"?><BlockList>{list}</BlockList>"
            ));
        put(req, "Put Block List").await
    }

    async fn finalize(&self, key: &str, len: usize) -> Result<(), String> {
        let body = self
            .twirp(
                "FinalizeCacheEntryUpload",
                json!({ "key": key, "version": VERSION, "size_bytes": len.to_string() }),
            )
            .await?;
        if body["ok"] == true {
            Ok(())
        } else {
            Err(format!("FinalizeCacheEntryUpload: {body}"))
        }
    }

    async fn save(&self, key: &str, data: &[u8]) -> Result<(), String> {
        let url = self.reserve(key).await?;
        self.upload(&url, data).await?;
        self.finalize(key, data.len()).await
    }

    /// The entry's bytes, whole, or `None` for a miss. A download that breaks off or answers
    /// with an error is an `Err`.
    async fn restore(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        let body = self
            .twirp(
                "GetCacheEntryDownloadURL",
                json!({ "key": key, "version": VERSION }),
            )
            .await?;
        if body["ok"] != true {
            return Ok(None);
        }
        let url = body["signed_download_url"]
            .as_str()
            .ok_or_else(|| format!("lookup of {key}: {body}"))?;
        let res = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| format!("download of {key}: {e}"))?;
        let status = res.status().as_u16();
        if status != 200 {
            return Err(format!("download of {key}: {status}"));
        }
        let bytes = res
            .bytes()
            .await
            .map_err(|e| format!("download of {key} broke off: {e}"))?;
        Ok(Some(bytes.to_vec()))
    }
}
