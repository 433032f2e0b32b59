//! The fleet phase (BENCHMARKS.md "The fleet phase"): a CI fleet on one server. `jobs` jobs run
//! at once, `rounds` each in turn, over 16 repositories (each its own `repository_id`), as
//! pushes to main and as pull requests (`refs/pull/N/merge`, main readable). A job probes 20 keys
//! that miss (2 restore keys each, as sccache and buildx do), restores its dependency cache
//! `deps-<repo>-<hash>` (restore key `deps-<repo>-`), and on an exact miss saves a new one as
//! `@actions/cache` 6.3.0 does.
//!
//! The plan is seeded and the same for every target and every round, and a round leaves nothing
//! that changes the next one:
//! - Before a target's first fleet round, untimed, each repository's main gets two entries, an
//!   older `deps-<repo>-<old>` and then the current `deps-<repo>-<current>`: exact hits restore
//!   the current one, restore-key hits must get it too (the newest with the prefix).
//! - Pushes to main only hit exactly, so nothing is ever saved into main after the seeding.
//! - Restore-key hits and misses are pull requests, each in its own pull request (a number no
//!   other job of the run uses), so what they save lands in a scope nobody reads again. A
//!   restore-key hit asks for a new hash of its repository; a miss asks for a key family that
//!   nothing has (as a new toolchain would), unique per round, with that family as its restore key.

use std::time::Instant;

use bytes::Bytes;
use futures_util::StreamExt;
use rand::{Rng, SeedableRng};

use super::client::{BenchError, Client, Result};
pub use super::scenarios::FleetResult;
use super::scenarios::{Payloads, Plan, VERSION};
use super::stats::percentile;

const MIB: f64 = (1 << 20) as f64;
/// Repositories of the fleet.
pub const REPOSITORIES: usize = 16;
/// Lookups of keys that miss, per job.
pub const MISSING_LOOKUPS: usize = 20;
const MAIN: &str = "refs/heads/main";
/// The plan's seed: the same jobs, sizes and outcomes in every run.
const SEED: u64 = 0x666c656574;

/// What a job's restore is planned to find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Exact,
    RestoreKey,
    Miss,
}

/// Sizes and counts of the fleet phase.
#[derive(Debug, Clone)]
pub struct FleetPlan {
    /// Jobs at once.
    pub jobs: usize,
    /// Jobs each of those runs in turn.
    pub rounds: usize,
    /// Save sizes: 70% in `large`, 30% in `small` (bytes, ends included).
    pub large: (usize, usize),
    pub small: (usize, usize),
    pub single_put_max: usize,
    pub block: usize,
    pub in_flight: usize,
}

impl FleetPlan {
    pub fn new(jobs: usize, rounds: usize, plan: &Plan, scale: f64) -> Self {
        let size = |full: f64| ((full * scale) as usize).clamp(1024, plan.entry_size);
        Self {
            jobs,
            rounds,
            large: (size(8.0 * MIB), size(96.0 * MIB)),
            small: (size(0.25 * MIB), size(4.0 * MIB)),
            single_put_max: plan.sdk_single_put_max,
            block: plan.sdk_block,
            in_flight: plan.sdk_in_flight,
        }
    }

    pub fn jobs_per_round(&self) -> usize {
        self.jobs * self.rounds
    }
}

/// Where an entry's bytes come from: a slice of one of the run's payloads.
#[derive(Debug, Clone, Copy)]
struct Slice {
    entry: usize,
    offset: usize,
    len: usize,
}

impl Slice {
    fn drawn(plan: &FleetPlan, data: &Payloads, rng: &mut rand::rngs::SmallRng) -> Self {
        let (lo, hi) = if rng.random_bool(0.7) {
            plan.large
        } else {
            plan.small
        };
        let entry = rng.random_range(0..data.entries.len());
        let room = data.entries[entry].len();
        let len = rng.random_range(lo..=hi).min(room);
        Self {
            entry,
            offset: rng.random_range(0..=room - len),
            len,
        }
    }

    fn bytes(self, data: &Payloads) -> Bytes {
        data.entries[self.entry].slice(self.offset..self.offset + self.len)
    }
}

/// One repository: its name in keys, its `repository_id`, its seeded entries.
#[derive(Debug, Clone)]
struct Repository {
    name: String,
    id: String,
    old: (String, Slice),
    current: (String, Slice),
}

/// One job of a round.
#[derive(Debug, Clone)]
pub struct Job {
    repository: usize,
    /// The pull request it runs for, or `None` for a push to main.
    pull: Option<u64>,
    outcome: Outcome,
    key: String,
    restore_key: String,
    /// The missing probes: key and its two restore keys.
    probes: Vec<[String; 3]>,
    save: Slice,
    token: String,
}

/// A runtime token for `repository` with the scopes of `ac` (the claim's JSON string).
pub type Sign<'a> = &'a dyn Fn(&str, &str) -> std::result::Result<String, String>;

fn ac_main() -> String {
    format!(r#"[{{"Scope":"{MAIN}","Permission":3}}]"#)
}

fn ac_pull(n: u64) -> String {
    format!(
        r#"[{{"Scope":"refs/pull/{n}/merge","Permission":3}},{{"Scope":"{MAIN}","Permission":1}}]"#
    )
}

/// The fleet of one run: its repositories and the shape of every round's jobs.
pub struct Fleet {
    pub plan: FleetPlan,
    repositories: Vec<Repository>,
    /// Per job of a round: repository, pull request or not, outcome, save.
    shape: Vec<(usize, bool, Outcome, Slice)>,
}

impl Fleet {
    /// The repositories and jobs for a run tagged `run` (repository ids are the run's own, so a
    /// server that outlives the run never mixes two runs' entries).
    pub fn new(plan: FleetPlan, data: &Payloads, run: &str) -> Self {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(SEED);
        let repositories = (0..REPOSITORIES)
            .map(|r| {
                let name = format!("app{r:02}");
                let old = (
                    format!("deps-{name}-{:016x}", rng.random::<u64>()),
                    Slice::drawn(&plan, data, &mut rng),
                );
                let current = (
                    format!("deps-{name}-{:016x}", rng.random::<u64>()),
                    Slice::drawn(&plan, data, &mut rng),
                );
                Repository {
                    id: format!("fleet-{run}-{name}"),
                    name,
                    old,
                    current,
                }
            })
            .collect();
        let n = plan.jobs_per_round();
        // 60% exact, 20% through the restore key, 20% miss; pushes to main are half the jobs,
        // all of them exact hits.
        let restore = (n as f64 * 0.2).round() as usize;
        let miss = (n as f64 * 0.2).round() as usize;
        let exact = n - restore - miss;
        let main = (n / 2).min(exact);
        let mut shape: Vec<(usize, bool, Outcome, Slice)> = (0..n)
            .map(|i| {
                let (pull, outcome) = if i < main {
                    (false, Outcome::Exact)
                } else if i < exact {
                    (true, Outcome::Exact)
                } else if i < exact + restore {
                    (true, Outcome::RestoreKey)
                } else {
                    (true, Outcome::Miss)
                };
                (
                    rng.random_range(0..REPOSITORIES),
                    pull,
                    outcome,
                    Slice::drawn(&plan, data, &mut rng),
                )
            })
            .collect();
        // Fisher–Yates with the plan's generator: the order jobs start in.
        for i in (1..shape.len()).rev() {
            shape.swap(i, rng.random_range(0..=i));
        }
        Self {
            plan,
            repositories,
            shape,
        }
    }

    /// The planned split of a round: exact, restore-key, miss.
    pub fn planned(&self) -> (usize, usize, usize) {
        let count = |o| self.shape.iter().filter(|s| s.2 == o).count();
        (
            count(Outcome::Exact),
            count(Outcome::RestoreKey),
            count(Outcome::Miss),
        )
    }

    /// Stores every repository's older and then current entry in main: what the hits of every
    /// round need. Untimed; once per target. `done` is called as each repository is seeded.
    pub async fn seed(
        &self,
        client: &Client,
        data: &Payloads,
        sign: Sign<'_>,
        done: &(dyn Fn() + Sync),
    ) -> Result<u64> {
        let saves = self.repositories.iter().map(|repo| async move {
            let token = sign(&repo.id, &ac_main()).map_err(BenchError::Protocol)?;
            let client = client.with_token(&token);
            let mut moved = 0;
            for (key, slice) in [&repo.old, &repo.current] {
                let payload = slice.bytes(data);
                moved += payload.len() as u64;
                client
                    .save_sdk(
                        key,
                        VERSION,
                        payload,
                        self.plan.single_put_max,
                        self.plan.block,
                        self.plan.in_flight,
                    )
                    .await?;
            }
            done();
            Ok::<_, BenchError>(moved)
        });
        let moved = futures_util::future::try_join_all(saves).await?;
        Ok(moved.iter().sum())
    }

    /// Round `round`'s jobs, with their tokens (signed before the timed part). `tag` makes the
    /// round's keys unique.
    pub fn jobs(&self, round: usize, tag: &str, sign: Sign<'_>) -> Result<Vec<Job>> {
        let n = self.shape.len() as u64;
        self.shape
            .iter()
            .enumerate()
            .map(|(i, &(r, pull, outcome, save))| {
                let repo = &self.repositories[r];
                let name = &repo.name;
                let pull = pull.then(|| 1 + round as u64 * n + i as u64);
                let ac = pull.map_or_else(ac_main, ac_pull);
                let token = sign(&repo.id, &ac).map_err(BenchError::Protocol)?;
                let job = format!("{tag}-{i}");
                let (key, restore_key) = match outcome {
                    Outcome::Exact => (repo.current.0.clone(), format!("deps-{name}-")),
                    Outcome::RestoreKey => {
                        (format!("deps-{name}-{job}-lock"), format!("deps-{name}-"))
                    }
                    Outcome::Miss => (
                        format!("deps-{name}-tool{job}-lock"),
                        format!("deps-{name}-tool{job}-"),
                    ),
                };
                let probes = (0..MISSING_LOOKUPS)
                    .map(|p| {
                        [
                            format!("sccache-{name}-{job}-{p}-obj"),
                            format!("sccache-{name}-{job}-{p}-"),
                            format!("buildx-{name}-{job}-{p}-"),
                        ]
                    })
                    .collect();
                Ok(Job {
                    repository: r,
                    pull,
                    outcome,
                    key,
                    restore_key,
                    probes,
                    save,
                    token,
                })
            })
            .collect()
    }
}

/// The bytes a run's fleet moves, for a plain client to move the same to an object store
/// (`examples/object_store_floor`): the seeded entries, and per job of a round, in start
/// order, which seeded entry it restores (hits exact or through the restore key) and what it
/// saves (on an exact miss).
pub struct Transfers {
    pub seeded: Vec<Bytes>,
    pub jobs: Vec<(Option<usize>, Option<Bytes>)>,
}

impl Fleet {
    pub fn transfers(&self, data: &Payloads) -> Transfers {
        let seeded = self
            .repositories
            .iter()
            .flat_map(|r| [r.old.1.bytes(data), r.current.1.bytes(data)])
            .collect();
        let jobs = self
            .shape
            .iter()
            .map(|&(r, _, outcome, save)| {
                let restores = (outcome != Outcome::Miss).then_some(2 * r + 1);
                let saves = (outcome != Outcome::Exact).then(|| save.bytes(data));
                (restores, saves)
            })
            .collect();
        Transfers { seeded, jobs }
    }
}

/// What one job did.
#[derive(Debug, Default)]
struct JobResult {
    seen: Option<Outcome>,
    up: u64,
    down: u64,
    lookups: u64,
    seconds: f64,
    error: Option<String>,
}

async fn job(client: &Client, fleet: &Fleet, data: &Payloads, job: &Job) -> JobResult {
    let started = Instant::now();
    let mut out = JobResult::default();
    let client = client.with_token(&job.token);
    let run = async {
        for [key, a, b] in &job.probes {
            out.lookups += 1;
            if let Some((_, matched)) = client.lookup_matched(key, &[a, b], VERSION).await? {
                return Err(BenchError::Protocol(format!(
                    "lookup {key}: hit {matched:?} where nothing was saved"
                )));
            }
        }
        out.lookups += 1;
        let repo = &fleet.repositories[job.repository];
        let hit = client
            .lookup_matched(&job.key, &[&job.restore_key], VERSION)
            .await?;
        out.seen = Some(match &hit {
            None => Outcome::Miss,
            Some((_, matched)) if matched.eq_ignore_ascii_case(&job.key) => Outcome::Exact,
            Some(_) => Outcome::RestoreKey,
        });
        if let Some((url, matched)) = hit {
            let planned = &repo.current.0;
            if job.outcome == Outcome::Miss || !matched.eq_ignore_ascii_case(planned) {
                return Err(BenchError::Protocol(format!(
                    "lookup {} (restore key {}): restored {matched:?}, planned {}",
                    job.key,
                    job.restore_key,
                    match job.outcome {
                        Outcome::Miss => "a miss",
                        _ => planned,
                    }
                )));
            }
            out.down += client.download(&url, &repo.current.1.bytes(data)).await?;
        } else if job.outcome != Outcome::Miss {
            return Err(BenchError::Protocol(format!(
                "lookup {} (restore key {}): miss, planned {}",
                job.key, job.restore_key, repo.current.0
            )));
        }
        if out.seen != Some(Outcome::Exact) {
            let payload = job.save.bytes(data);
            let size = payload.len() as u64;
            client
                .save_sdk(
                    &job.key,
                    VERSION,
                    payload,
                    fleet.plan.single_put_max,
                    fleet.plan.block,
                    fleet.plan.in_flight,
                )
                .await?;
            out.up += size;
        }
        Ok(())
    };
    if let Err(e) = run.await {
        let scope = job
            .pull
            .map_or_else(|| MAIN.to_owned(), |n| format!("refs/pull/{n}/merge"));
        out.error = Some(format!(
            "{} {scope}: {e}",
            fleet.repositories[job.repository].id
        ));
    }
    out.seconds = started.elapsed().as_secs_f64();
    out
}

/// Runs `jobs` with `fleet.plan.jobs` at once; `done` is called as each job ends.
/// Runs `jobs`, each through one of `clients` in turn (a server, or edges in front of one).
pub async fn run(
    clients: &[Client],
    fleet: &Fleet,
    data: &Payloads,
    jobs: &[Job],
    done: &(dyn Fn() + Sync),
) -> FleetResult {
    let started = Instant::now();
    let results: Vec<JobResult> = futures_util::stream::iter(jobs.iter().enumerate())
        .map(|(i, j)| async move {
            let r = job(&clients[i % clients.len()], fleet, data, j).await;
            done();
            r
        })
        .buffer_unordered(fleet.plan.jobs.max(1))
        .collect()
        .await;
    let wall = started.elapsed().as_secs_f64();
    let n = results.len().max(1) as f64;
    let share = |o| 100.0 * results.iter().filter(|r| r.seen == Some(o)).count() as f64 / n;
    let seconds: Vec<f64> = results.iter().map(|r| r.seconds).collect();
    let up: u64 = results.iter().map(|r| r.up).sum();
    let down: u64 = results.iter().map(|r| r.down).sum();
    let errors: Vec<String> = results.iter().filter_map(|r| r.error.clone()).collect();
    FleetResult {
        mib_s: (up + down) as f64 / MIB / wall,
        jobs_s: results.len() as f64 / wall,
        job_p50_s: percentile(&seconds, 50.0).unwrap_or(0.0),
        job_p99_s: percentile(&seconds, 99.0).unwrap_or(0.0),
        lookups_s: results.iter().map(|r| r.lookups).sum::<u64>() as f64 / wall,
        errors: errors.len(),
        exact_pct: share(Outcome::Exact),
        restore_key_pct: share(Outcome::RestoreKey),
        miss_pct: share(Outcome::Miss),
        up,
        down,
        origin_egress: None,
        edge_hit_pct: Vec::new(),
        edge_unanswered: 0,
        first_errors: errors.into_iter().take(3).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet(jobs: usize, rounds: usize) -> (Fleet, Payloads) {
        let plan = Plan::scaled(0.001);
        let data = Payloads::generate(&plan, 1);
        let fp = FleetPlan::new(jobs, rounds, &plan, 0.001);
        (Fleet::new(fp, &data, "t"), data)
    }

    fn unsigned(repo: &str, ac: &str) -> std::result::Result<String, String> {
        Ok(format!("{repo}|{ac}"))
    }

    #[test]
    fn the_full_plan_splits_sixty_twenty_twenty_with_main_exact_only() {
        let (f, _) = fleet(64, 3);
        assert_eq!(f.planned(), (116, 38, 38));
        let jobs = f.jobs(0, "r0", &unsigned).unwrap();
        assert_eq!(jobs.len(), 192);
        let main: Vec<&Job> = jobs.iter().filter(|j| j.pull.is_none()).collect();
        assert_eq!(main.len(), 96);
        assert!(main.iter().all(|j| j.outcome == Outcome::Exact));
        assert!(jobs.iter().all(|j| j.probes.len() == MISSING_LOOKUPS));
        // Every repository has jobs.
        for r in 0..REPOSITORIES {
            assert!(jobs.iter().any(|j| j.repository == r), "repository {r}");
        }
    }

    #[test]
    fn rounds_repeat_the_work_with_fresh_keys_and_pull_requests() {
        let (f, _) = fleet(8, 2);
        let a = f.jobs(0, "r0", &unsigned).unwrap();
        let b = f.jobs(1, "r1", &unsigned).unwrap();
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(
                (x.repository, x.outcome, x.save.len),
                (y.repository, y.outcome, y.save.len)
            );
            match x.outcome {
                Outcome::Exact => assert_eq!(x.key, y.key),
                _ => assert_ne!(x.key, y.key),
            }
            assert_ne!(x.probes[0][0], y.probes[0][0]);
        }
        let mut pulls: Vec<u64> = a.iter().chain(&b).filter_map(|j| j.pull).collect();
        let count = pulls.len();
        pulls.sort_unstable();
        pulls.dedup();
        assert_eq!(pulls.len(), count, "a pull request per job");
        // The same plan again: the same jobs.
        let (g, _) = fleet(8, 2);
        let c = g.jobs(0, "r0", &unsigned).unwrap();
        assert!(a
            .iter()
            .zip(&c)
            .all(|(x, y)| x.key == y.key && x.token == y.token));
    }

    #[test]
    fn sizes_follow_the_planned_mix() {
        let plan = Plan::scaled(1.0);
        let data = Payloads {
            entries: vec![Bytes::from(vec![0u8; plan.entry_size])],
        };
        let fp = FleetPlan::new(64, 3, &plan, 1.0);
        let f = Fleet::new(fp, &data, "t");
        let sizes: Vec<usize> = f.shape.iter().map(|s| s.3.len).collect();
        let large = sizes.iter().filter(|s| **s >= 8 << 20).count();
        assert!(sizes.iter().all(|s| (256 << 10..=96 << 20).contains(s)));
        assert!((110..=160).contains(&large), "{large} of 192 large");
        assert!(sizes.iter().all(|s| !(4 << 20 < *s && *s < 8 << 20)));
    }
}
