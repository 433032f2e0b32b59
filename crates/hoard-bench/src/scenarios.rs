//! The published benchmark's scenarios (BENCHMARKS.md "The published method"), run against one
//! target for one round.

use std::time::Instant;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use rand::{RngCore, SeedableRng};

use super::client::{Client, Result};
use super::progress::Progress;
use super::report::format_value;
use super::stats::percentile;

const MIB: usize = 1 << 20;
/// The version hash every bench entry uses (`sha256("data|zstd-without-long|1.0")`).
pub const VERSION: &str = "3ad75f27293d65a135214b8c82b296080f911dc107e52f1e7ec871a2eda46e69";

/// The phases of a round, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum Phase {
    /// 8 entries in parallel with 32 MiB blocks, then the same through @actions/cache's layout.
    Upload,
    /// First download of the 8 (needs them uploaded: untimed if `upload` is not chosen).
    Download1,
    /// Later download of the 8 (after a first one: untimed if `download1` is not chosen).
    Download2,
    /// Lookups at 64 concurrent of the 8 (uploaded untimed if `upload` is not chosen).
    Lookups,
    /// Small save+restores at 32 concurrent.
    Small,
    /// Build tools' small objects (opt-in): PUT then GET, Bazel's and Turborepo's APIs.
    Tools,
    /// A CI fleet (opt-in): see `--fleet-jobs`.
    Fleet,
}

impl Phase {
    /// Every phase but the fleet: what a run measures unless told otherwise.
    pub const DEFAULT: [Phase; 5] = [
        Phase::Upload,
        Phase::Download1,
        Phase::Download2,
        Phase::Lookups,
        Phase::Small,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Upload => "upload",
            Phase::Download1 => "download1",
            Phase::Download2 => "download2",
            Phase::Lookups => "lookups",
            Phase::Small => "small",
            Phase::Tools => "tools",
            Phase::Fleet => "fleet",
        }
    }
}

/// Sizes and counts, scaled from the published ones by `--scale`.
#[derive(Debug, Clone)]
pub struct Plan {
    pub entries: usize,
    pub entry_size: usize,
    /// Block size of the published upload (32 MiB).
    pub published_block: usize,
    /// Block size and in-flight count of `@actions/cache` 6.3.0 (64 MiB, 8), used above
    /// `sdk_single_put_max` (128 MiB).
    pub sdk_block: usize,
    pub sdk_in_flight: usize,
    pub sdk_single_put_max: usize,
    pub lookups: usize,
    pub lookup_concurrency: usize,
    pub small_ops: usize,
    pub small_size: usize,
    pub small_concurrency: usize,
    /// Objects of the tools phase, per API and round.
    pub tool_objects: usize,
}

impl Plan {
    pub fn scaled(scale: f64) -> Self {
        let size = |full: usize, min: usize| ((full as f64 * scale) as usize).max(min);
        Self {
            entries: 8,
            entry_size: size(128 * MIB, 64 * 1024),
            published_block: size(32 * MIB, 16 * 1024),
            sdk_block: size(64 * MIB, 32 * 1024),
            sdk_in_flight: 8,
            sdk_single_put_max: size(128 * MIB, 64 * 1024),
            lookups: size(5_000, 20),
            lookup_concurrency: 64,
            small_ops: size(300, 8),
            small_size: size(256 * 1024, 4 * 1024),
            small_concurrency: 32,
            tool_objects: size(2_000, 50),
        }
    }
}

/// The payloads of one run: distinct random bytes per entry, made once and reused.
pub struct Payloads {
    pub entries: Vec<Bytes>,
}

impl Payloads {
    pub fn generate(plan: &Plan, seed: u64) -> Self {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let entries = (0..plan.entries)
            .map(|_| {
                let mut buf = vec![0u8; plan.entry_size];
                rng.fill_bytes(&mut buf);
                Bytes::from(buf)
            })
            .collect();
        Self { entries }
    }

    /// The `i`-th small payload: a distinct slice of the large ones.
    fn small(&self, i: usize, size: usize) -> Bytes {
        let entry = &self.entries[i % self.entries.len()];
        let size = size.min(entry.len());
        let room = entry.len() - size;
        let offset = if room == 0 {
            0
        } else {
            (i / self.entries.len() * 4099) % room
        };
        entry.slice(offset..offset + size)
    }
}

/// One round's figures for one target.
#[derive(Debug, Clone, Default)]
pub struct RoundResult {
    pub upload_published_mib_s: f64,
    pub upload_sdk_mib_s: f64,
    pub first_download_mib_s: f64,
    pub later_download_mib_s: f64,
    pub lookups_per_s: f64,
    pub lookup_p50_ms: f64,
    pub lookup_p99_ms: f64,
    pub small_per_s: f64,
    /// Bytes downloaded and checked this round.
    pub verified_bytes: u64,
    /// Bytes uploaded and downloaded this round, untimed set-up included (for CPU per GiB).
    pub moved_bytes: u64,
    /// The fleet phase's figures, when it ran.
    pub fleet: Option<FleetResult>,
    /// The tools phase's figures, by API name, when it ran.
    pub tools: Vec<(&'static str, super::tools::ApiFigures)>,
}

fn mib_per_s(bytes: usize, started: Instant) -> f64 {
    bytes as f64 / MIB as f64 / started.elapsed().as_secs_f64()
}

/// Runs the chosen phases but the fleet, in order, with what they need done untimed first;
/// `tag` makes this round's keys unique.
pub async fn run_round(
    client: &Client,
    plan: &Plan,
    data: &Payloads,
    tag: &str,
    phases: &[Phase],
    progress: &Progress,
) -> Result<RoundResult> {
    let mut out = RoundResult::default();
    let has = |p| phases.contains(&p);
    let total = plan.entries * plan.entry_size;
    let published_key = |i: usize| format!("bench-{tag}-published-{i}");
    let sdk_key = |i: usize| format!("bench-{tag}-sdk-{i}");
    let mib = |rate: f64| format!("{} MiB/s", format_value(rate, "MiB/s"));

    if has(Phase::Upload) || has(Phase::Download1) || has(Phase::Download2) || has(Phase::Lookups) {
        let name = if has(Phase::Upload) {
            "upload"
        } else {
            "upload (untimed set-up)"
        };
        let bar = progress.phase(name, 2 * plan.entries as u64, "entries");
        // Upload 8 × 128 MiB in parallel, 32 MiB blocks (the published method).
        let started = Instant::now();
        futures_util::future::try_join_all(data.entries.iter().enumerate().map(|(i, payload)| {
            let key = published_key(i);
            let bar = &bar;
            async move {
                let url = client.reserve(&key, VERSION).await?;
                client
                    .put_blocks(&url, payload.clone(), plan.published_block, 1)
                    .await?;
                client.finalize(&key, VERSION, payload.len()).await?;
                bar.inc(1);
                Ok::<_, super::client::BenchError>(())
            }
        }))
        .await?;
        out.upload_published_mib_s = mib_per_s(total, started);

        // The same through @actions/cache 6.3.0's layout: one Put Blob up to 128 MiB, else
        // 64 MiB blocks with 8 in flight.
        let started = Instant::now();
        futures_util::future::try_join_all(data.entries.iter().enumerate().map(|(i, payload)| {
            let key = sdk_key(i);
            let bar = &bar;
            async move {
                client
                    .save_sdk(
                        &key,
                        VERSION,
                        payload.clone(),
                        plan.sdk_single_put_max,
                        plan.sdk_block,
                        plan.sdk_in_flight,
                    )
                    .await?;
                bar.inc(1);
                Ok::<_, super::client::BenchError>(())
            }
        }))
        .await?;
        out.upload_sdk_mib_s = mib_per_s(total, started);
        out.moved_bytes += 2 * total as u64;
        bar.finish(&format!(
            "8 entries in parallel with 32 MiB blocks {}, @actions/cache layout {}",
            mib(out.upload_published_mib_s),
            mib(out.upload_sdk_mib_s)
        ));
    }

    // First and later download of all 8 (restore = lookup + GET), every byte checked.
    let first = has(Phase::Download1) || has(Phase::Download2);
    for (later, wanted) in [(false, first), (true, has(Phase::Download2))] {
        if !wanted {
            continue;
        }
        let name = match (later, has(Phase::Download1)) {
            (true, _) => "download2",
            (false, true) => "download1",
            (false, false) => "download1 (untimed set-up)",
        };
        let bar = progress.phase(name, plan.entries as u64, "entries");
        let started = Instant::now();
        let moved: Vec<u64> = futures_util::future::try_join_all(
            data.entries.iter().enumerate().map(|(i, payload)| {
                let key = published_key(i);
                let bar = &bar;
                async move {
                    let n = client.restore(&key, VERSION, payload).await?;
                    bar.inc(1);
                    Ok::<_, super::client::BenchError>(n)
                }
            }),
        )
        .await?;
        out.verified_bytes += moved.iter().sum::<u64>();
        out.moved_bytes += moved.iter().sum::<u64>();
        let rate = mib_per_s(total, started);
        if later {
            out.later_download_mib_s = rate;
        } else {
            out.first_download_mib_s = rate;
        }
        bar.finish(&format!("all 8, checked, {}", mib(rate)));
    }

    if has(Phase::Lookups) {
        // The phases before wrote and left entries to digest: the lookups are not theirs to pay
        // for (nor, behind an edge, for the origin's share of them).
        settle(client).await;
        drain_writeback().await;
        lookups(client, plan, tag, progress, &mut out).await?;
    }
    if has(Phase::Small) {
        // The upload phase's writes are not this phase's to pay for.
        drain_writeback().await;
        small(client, plan, data, tag, progress, &mut out).await?;
    }
    Ok(out)
}

/// Waits, untimed, until the kernel has written every dirty page to disk (`sync(2)`). Before a
/// target's round and before its write-heavy phases, so that each starts from the same state:
/// on a machine whose disk takes writes slower than the page cache does, a phase otherwise
/// pays for the writeback of whatever ran before it (another target's uploads as well as its
/// own), and the figures follow the order the targets ran in.
pub async fn drain_writeback() {
    let _ = tokio::task::spawn_blocking(rustix::fs::sync).await;
}

/// Waits, untimed, until the target has finished the background work its round left (a hoard's
/// digest pass, which waits for the requests to stop), so that the work does not run while
/// the next target is measured. Its CPU still counts in the target's server CPU. Gives up
/// after five minutes; a server that does not report such work is not waited for.
pub async fn settle(client: &Client) {
    let give_up = Instant::now() + std::time::Duration::from_secs(300);
    while let Some(pending) = client.digests_pending().await {
        if pending == 0 || Instant::now() > give_up {
            return;
        }
        // Not more often: each poll renders the whole metrics page, on the server's CPU.
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// Lookups at 64 concurrent: hits on this round's entries, half through a restore key.
async fn lookups(
    client: &Client,
    plan: &Plan,
    tag: &str,
    progress: &Progress,
    out: &mut RoundResult,
) -> Result<()> {
    let bar = progress.phase("lookups", plan.lookups as u64, "lookups");
    let started = Instant::now();
    let latencies: Vec<f64> = futures_util::stream::iter(0..plan.lookups)
        .map(|n| {
            let i = n % plan.entries;
            let key = if n % 2 == 0 {
                format!("bench-{tag}-published-{i}")
            } else {
                format!("bench-{tag}-sdk-{i}")
            };
            let bar = &bar;
            async move {
                let t = Instant::now();
                let hit = if n % 4 == 1 {
                    client
                        .lookup(&format!("{key}-newer"), &[&key], VERSION)
                        .await?
                } else {
                    client.lookup(&key, &[], VERSION).await?
                };
                if hit.is_none() {
                    return Err(super::client::BenchError::Protocol(format!(
                        "lookup {key}: miss"
                    )));
                }
                bar.inc(1);
                Ok(t.elapsed().as_secs_f64() * 1000.0)
            }
        })
        .buffer_unordered(plan.lookup_concurrency)
        .try_collect()
        .await?;
    out.lookups_per_s = plan.lookups as f64 / started.elapsed().as_secs_f64();
    out.lookup_p50_ms = percentile(&latencies, 50.0).unwrap_or(0.0);
    out.lookup_p99_ms = percentile(&latencies, 99.0).unwrap_or(0.0);
    bar.finish(&format!(
        "{} at {} concurrent, {}/s, p50 {} ms, p99 {} ms",
        plan.lookups,
        plan.lookup_concurrency,
        format_value(out.lookups_per_s, "/s"),
        format_value(out.lookup_p50_ms, "ms"),
        format_value(out.lookup_p99_ms, "ms")
    ));
    Ok(())
}

/// Small save + restore, 256 KiB at 32 concurrent.
async fn small(
    client: &Client,
    plan: &Plan,
    data: &Payloads,
    tag: &str,
    progress: &Progress,
    out: &mut RoundResult,
) -> Result<()> {
    let bar = progress.phase("small", plan.small_ops as u64, "save+restores");
    let started = Instant::now();
    let moved: Vec<u64> = futures_util::stream::iter(0..plan.small_ops)
        .map(|i| {
            let payload = data.small(i, plan.small_size);
            let key = format!("bench-{tag}-small-{i}");
            let bar = &bar;
            async move {
                let url = client.reserve(&key, VERSION).await?;
                client.put_whole(&url, payload.clone()).await?;
                client.finalize(&key, VERSION, payload.len()).await?;
                let n = client.restore(&key, VERSION, &payload).await?;
                bar.inc(1);
                Ok::<_, super::client::BenchError>(n)
            }
        })
        .buffer_unordered(plan.small_concurrency)
        .try_collect()
        .await?;
    let moved: u64 = moved.iter().sum();
    out.verified_bytes += moved;
    out.moved_bytes += 2 * moved;
    out.small_per_s = plan.small_ops as f64 / started.elapsed().as_secs_f64();
    bar.finish(&format!(
        "{} × {} KiB at {} concurrent, {}/s",
        plan.small_ops,
        plan.small_size / 1024,
        plan.small_concurrency,
        format_value(out.small_per_s, "/s")
    ));
    Ok(())
}

/// One round of the fleet phase against one target.
#[derive(Debug, Clone, Default)]
pub struct FleetResult {
    pub mib_s: f64,
    pub jobs_s: f64,
    pub job_p50_s: f64,
    pub job_p99_s: f64,
    pub lookups_s: f64,
    pub errors: usize,
    /// Shares of the restores seen (percent): exact, restore key, miss.
    pub exact_pct: f64,
    pub restore_key_pct: f64,
    pub miss_pct: f64,
    pub up: u64,
    pub down: u64,
    /// Bytes of entries the server behind the clients sent: all that was restored, or through
    /// edges, what the origin sent them.
    pub origin_egress: Option<u64>,
    /// Through edges: each edge's downloads served from its own disk, in percent.
    pub edge_hit_pct: Vec<Option<f64>>,
    /// Through edges: lookups the origin did not answer in time.
    pub edge_unanswered: u64,
    /// The first few errors, for the report's notes.
    pub first_errors: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_plan_is_the_published_one() {
        let p = Plan::scaled(1.0);
        assert_eq!(
            (p.entries, p.entry_size, p.published_block),
            (8, 128 * MIB, 32 * MIB)
        );
        assert_eq!((p.lookups, p.lookup_concurrency), (5_000, 64));
        assert_eq!(
            (p.small_ops, p.small_size, p.small_concurrency),
            (300, 256 * 1024, 32)
        );
        assert_eq!(
            (p.sdk_block, p.sdk_in_flight, p.sdk_single_put_max),
            (64 * MIB, 8, 128 * MIB)
        );
    }

    #[test]
    fn scaling_shrinks_sizes_and_counts_with_floors() {
        let p = Plan::scaled(0.01);
        assert_eq!(p.entry_size, (128.0 * MIB as f64 * 0.01) as usize);
        assert_eq!(p.lookups, 50);
        assert_eq!(p.small_ops, 8);
        let tiny = Plan::scaled(0.0);
        assert_eq!(tiny.entry_size, 64 * 1024);
        assert_eq!(tiny.lookups, 20);
    }

    #[test]
    fn small_payloads_are_distinct_slices() {
        let plan = Plan::scaled(0.001);
        let data = Payloads::generate(&plan, 1);
        let a = data.small(0, 4096);
        let b = data.small(8, 4096);
        assert_eq!(a.len(), 4096);
        assert_ne!(a, b);
    }
}
