//! `hoard bench`: the published benchmark method (BENCHMARKS.md) against any number of servers
//! side by side, plus a null baseline, alternating targets round by round and reporting medians.

mod client;
mod edges;
pub mod fleet;
pub mod floor;
pub mod null;
mod page_cache;
mod procstat;
mod progress;
mod reference;
pub mod report;
mod scenarios;
pub mod stats;
mod tools;

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use client::Client;
use report::{Better, Report, Row};
use scenarios::{Payloads, Phase, Plan, RoundResult};

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// A running server to measure, as LABEL=URL (repeatable).
    #[arg(long = "target", value_name = "LABEL=URL")]
    pub targets: Vec<String>,

    /// A server to start and measure, as LABEL=COMMAND (run with `sh -c`; repeatable). Needs a
    /// --health URL; its origin is where the benchmark sends requests.
    #[arg(long = "spawn", value_name = "LABEL=COMMAND")]
    pub spawns: Vec<String>,

    /// Health URL of a spawned server, as LABEL=URL (or just URL with a single --spawn).
    /// Startup is timed until it answers 200.
    #[arg(long = "health", value_name = "[LABEL=]URL")]
    pub health: Vec<String>,

    /// Measure memory and CPU of an already running target's process tree, as LABEL=PID.
    #[arg(long = "pid", value_name = "LABEL=PID")]
    pub pids: Vec<String>,

    /// Also run the null baseline (a trivial server, started as its own process) as a column.
    #[arg(long)]
    pub baseline: bool,

    /// Also run the disk floor (the simplest correct disk-backed server: files, no database,
    /// no hashing; its own process and temporary directory) as a column.
    #[arg(long)]
    pub baseline_disk: bool,

    /// Rounds; targets alternate within each round and the report shows medians.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,

    /// Multiply every size and count by this factor (e.g. 0.05 for a quick run).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,

    /// The phases to run, in their fixed order: upload, download1, download2, lookups, small,
    /// tools, fleet [default: all but tools and fleet]. A download or lookups phase without the upload before it
    /// uploads its entries untimed first (download2 likewise downloads once untimed).
    #[arg(long, value_delimiter = ',', value_name = "PHASE,…")]
    pub phases: Vec<Phase>,

    /// The same as `--phases small`.
    #[arg(long, hide = true, conflicts_with = "phases")]
    pub only_small: bool,

    /// Tools phase: the build tools' APIs a target speaks, as LABEL=API[,API…] (`bazel` at the
    /// root, `bazel:/PREFIX`, `turbo`, `none`; repeatable) [default: hoard's, `bazel:/_bazel,turbo`].
    /// Spawned servers find the token the bench sends them in HOARD_BENCH_TOKEN.
    #[arg(long = "tool-api", value_name = "LABEL=API")]
    pub tool_apis: Vec<String>,

    /// Fleet phase: jobs at once.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub fleet_jobs: usize,

    /// Fleet phase: jobs each of the `--fleet-jobs` runs in turn, per round.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub fleet_rounds: usize,

    /// Also measure N edges (`hoard edge`) in front of a hoard of their own, which the bench
    /// starts as it starts its own: a target `edges` whose phases go through the first edge and
    /// whose fleet jobs go to the edges in turn. The report adds what the origin sent (origin
    /// egress) and each edge's hit ratio.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub edges: usize,

    /// Store this many small entries, across 1,000 repositories, in the database of the hoard
    /// the bench starts, before it starts: lookups and saves then run against a large database.
    /// The report gives the database and write-ahead log sizes before and after the phases.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub preload: u64,

    /// Before the rounds, fill the free memory with a scratch file's clean page cache (untimed;
    /// as much as half the free disk space), so that every target writes into memory the kernel
    /// recycles, as on a server that has run for a while, instead of into free memory a virtual
    /// machine may have to get back from its host first.
    #[arg(long)]
    pub fill_page_cache: bool,

    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Runtime token to send [default: a token that reads and writes refs/heads/main of
    /// repository "bench": HS256-signed with the secret given to the hoard the bench starts
    /// itself, unsigned for other targets].
    #[arg(long, env = "HOARD_BENCH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchFailure {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Target(String),
}

fn usage(msg: impl Into<String>) -> BenchFailure {
    BenchFailure::Usage(msg.into())
}

/// A target under test.
struct Target {
    label: String,
    base: String,
    verify_content: bool,
    /// Process tree to measure, if known.
    pid: Option<u32>,
    child: Option<Child>,
    startup_ms: Option<f64>,
    idle: Option<procstat::Resident>,
    cpu_at_start: f64,
    rounds: Vec<RoundResult>,
    client_cpu: f64,
    /// The token for this target, when the bench made the server and knows its secret.
    token: Option<String>,
    /// That secret: the fleet's tokens (one per repository and scope) are signed with it.
    secret: Option<Vec<u8>>,
    /// Whether the fleet's entries are stored on this target yet.
    fleet_seeded: bool,
    /// What the tools phase speaks to it.
    tool_apis: Vec<tools::ToolApi>,
    /// Keeps a spawned server's data directory alive until the end.
    _data: Option<tempfile::TempDir>,
    /// The edges a target of edges spreads its fleet over (the first is `base`).
    edges: Vec<String>,
    /// Processes the target needs besides its own (the edges' origin, further edges): stopped
    /// with it.
    helpers: Vec<Target>,
    /// The SQLite database of a hoard the bench started, and what was preloaded into it.
    database: Option<PathBuf>,
    preloaded: Option<Preloaded>,
}

/// What `--preload` stored, and the database's size after it.
#[derive(Debug, Clone, Copy)]
struct Preloaded {
    entries: u64,
    seconds: f64,
    database_bytes: u64,
    wal_bytes: u64,
}

/// The sizes of a SQLite database file and its write-ahead log.
fn database_sizes(db: &std::path::Path) -> (u64, u64) {
    let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    (size(db), size(std::path::Path::new(&wal)))
}

/// Stores `n` entries of one 64 KiB chunk each across 1,000 repositories, straight into the
/// SQLite database at `db` (10,000 per transaction).
async fn preload(db: &std::path::Path, n: u64) -> Result<Preloaded, BenchFailure> {
    use hoard_model::{BlobName, CacheKey, Chunk, RepoId, Scope, Slot, Version};
    use hoard_server::meta::Health as _;
    let started = Instant::now();
    let fail = |e: hoard_server::meta::MetaError| usage(format!("--preload: {e}"));
    let store = hoard_server::meta::SqliteStore::open(db)
        .await
        .map_err(fail)?;
    let version = Version::parse("preload").map_err(|e| usage(e.to_string()))?;
    let mut next = 0u64;
    while next < n {
        let batch: Vec<(Slot, Vec<Chunk>, hoard_model::Millis)> = (next..n.min(next + 10_000))
            .map(|i| {
                let key = CacheKey::parse(&format!("preload-{i}")).expect("a valid key");
                let slot = Slot {
                    repository: RepoId::new(format!("preload-{}", i % 1000)),
                    scope: Scope::new("refs/heads/main"),
                    key,
                    version: version.clone(),
                };
                let chunk = Chunk {
                    blob: BlobName::random(),
                    size: 64 << 10,
                    // Recorded, never read: any digest (not all zeros, which means "not yet").
                    sha256: Some([0xab; 32]),
                    xxh3: Some(i),
                };
                (slot, vec![chunk], hoard_model::now_millis())
            })
            .collect();
        next += batch.len() as u64;
        store.import(batch).await.map_err(fail)?;
    }
    store.checkpoint().await.map_err(fail)?;
    drop(store);
    let (database_bytes, wal_bytes) = database_sizes(db);
    Ok(Preloaded {
        entries: n,
        seconds: started.elapsed().as_secs_f64(),
        database_bytes,
        wal_bytes,
    })
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn split_label(raw: &str, what: &str) -> Result<(String, String), BenchFailure> {
    match raw.split_once('=') {
        Some((label, value)) if !label.is_empty() && !value.is_empty() => {
            Ok((label.to_owned(), value.to_owned()))
        }
        _ => Err(usage(format!("{what} must be LABEL=VALUE, not {raw:?}"))),
    }
}

fn free_port() -> Result<u16, BenchFailure> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| usage(format!("no free port: {e}")))?;
    Ok(listener
        .local_addr()
        .map_err(|e| usage(e.to_string()))?
        .port())
}

fn origin_of(url: &str) -> Result<String, BenchFailure> {
    let parsed = url::Url::parse(url).map_err(|e| usage(format!("bad URL {url:?}: {e}")))?;
    Ok(parsed.origin().ascii_serialization())
}

/// The seed of the run's random payloads.
const PAYLOAD_SEED: u64 = 0x686f617264;

const BENCH_AC: &str = r#"[{"Scope":"refs/heads/main","Permission":3}]"#;

fn claims(repository: &str, ac: &str) -> serde_json::Value {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    serde_json::json!({
        "ac": ac,
        "repository_id": repository,
        "sub": "hoard-bench",
        "exp": now + 24 * 3600,
    })
}

/// An unsigned runtime token for repository "bench", branch main, read and write: for servers
/// that do not check signatures.
/// The bytes of the fleet phase at `scale` with `jobs` at once and `rounds` jobs each, as
/// `hoard bench` plans them (same seed): what a plain object-store client moves to compare.
pub fn fleet_transfers(jobs: usize, rounds: usize, scale: f64) -> fleet::Transfers {
    let plan = Plan::scaled(scale);
    let data = Payloads::generate(&plan, PAYLOAD_SEED);
    fleet::Fleet::new(
        fleet::FleetPlan::new(jobs, rounds, &plan, scale),
        &data,
        "plain",
    )
    .transfers(&data)
}

pub fn unsigned_token() -> String {
    token_for(None, "bench", BENCH_AC).unwrap_or_default()
}

/// A runtime token for `repository` with the scopes of `ac` (the claim's JSON string):
/// HS256-signed with `secret`, or unsigned without one.
fn token_for(secret: Option<&[u8]>, repository: &str, ac: &str) -> Result<String, String> {
    let claims = claims(repository, ac);
    match secret {
        None => Ok(format!(
            "{}.{}.bench",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        )),
        Some(secret) => jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(secret),
        )
        .map_err(|e| format!("cannot sign the bench token: {e}")),
    }
}

/// Starts `command` and waits until `health` answers 200; returns the child and the time taken.
async fn spawn_server(command: &mut Command, health: &str) -> Result<(Child, f64), BenchFailure> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| usage(e.to_string()))?;
    let started = Instant::now();
    let mut child = command
        .spawn()
        .map_err(|e| BenchFailure::Target(format!("cannot start {command:?}: {e}")))?;
    loop {
        if let Ok(res) = http.get(health).send().await {
            if res.status() == 200 {
                return Ok((child, started.elapsed().as_secs_f64() * 1000.0));
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(BenchFailure::Target(format!(
                "{command:?} exited with {status} before {health} was healthy"
            )));
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            return Err(BenchFailure::Target(format!(
                "{health} was not healthy within 60 s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn target(label: String, base: String, verify_content: bool) -> Target {
    Target {
        label,
        base,
        verify_content,
        pid: None,
        child: None,
        startup_ms: None,
        idle: None,
        cpu_at_start: 0.0,
        rounds: Vec::new(),
        client_cpu: 0.0,
        token: None,
        secret: None,
        fleet_seeded: false,
        tool_apis: tools::ToolApi::hoard(),
        edges: Vec::new(),
        helpers: Vec::new(),
        _data: None,
        database: None,
        preloaded: None,
    }
}

async fn spawned(
    label: String,
    mut command: Command,
    health: &str,
    verify_content: bool,
) -> Result<Target, BenchFailure> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let (child, startup_ms) = spawn_server(&mut command, health).await?;
    let mut t = target(label, origin_of(health)?, verify_content);
    t.pid = Some(child.id());
    t.child = Some(child);
    t.startup_ms = Some(startup_ms);
    Ok(t)
}

/// This hoard binary on SQLite and a temporary directory, tokens verified as in production
/// (HS256 with a secret only this run knows), with `preload` small entries stored first.
async fn own_hoard(exe: &Path, label: &str, preload_entries: u64) -> Result<Target, BenchFailure> {
    let dir = tempfile::tempdir().map_err(|e| usage(e.to_string()))?;
    let database = dir.path().join("data").join("hoard.db");
    let preloaded = match preload_entries {
        0 => None,
        n => Some(preload(&database, n).await?),
    };
    let port = free_port()?;
    let secret = hoard_model::BlobName::random().as_str().repeat(2);
    let secret_file = dir.path().join("bench-token-secret");
    std::fs::write(&secret_file, &secret).map_err(|e| usage(e.to_string()))?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "serve",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--data-dir",
    ])
    .arg(dir.path().join("data"))
    .arg("--token-hs256-secret-file")
    .arg(&secret_file);
    cmd.env("RUST_LOG", "warn");
    let health = format!("http://127.0.0.1:{port}/healthz");
    let mut t = spawned(label.into(), cmd, &health, true).await?;
    t.token = Some(token_for(Some(secret.as_bytes()), "bench", BENCH_AC).map_err(usage)?);
    t.secret = Some(secret.into_bytes());
    t._data = Some(dir);
    t.database = Some(database);
    t.preloaded = preloaded;
    Ok(t)
}

async fn prepare_targets(args: &BenchArgs) -> Result<Vec<Target>, BenchFailure> {
    let mut targets = Vec::new();
    let exe =
        std::env::current_exe().map_err(|e| usage(format!("cannot find the hoard binary: {e}")))?;

    // No target given: measure this hoard binary itself on SQLite and a temporary directory.
    if args.targets.is_empty() && args.spawns.is_empty() {
        targets.push(own_hoard(&exe, "hoard", args.preload).await?);
    }
    if args.edges > 0 {
        targets.push(edges::target(&exe, args.edges).await?);
    }
    for raw in &args.spawns {
        let (label, command) = split_label(raw, "--spawn")?;
        let health = args
            .health
            .iter()
            .find_map(|h| h.strip_prefix(&format!("{label}=")).map(str::to_owned))
            .or_else(|| {
                (args.spawns.len() == 1 && args.health.len() == 1 && !args.health[0].contains('='))
                    .then(|| args.health[0].clone())
            })
            .ok_or_else(|| usage(format!("--spawn {label} needs --health {label}=URL")))?;
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &format!("exec {command}")]);
        // The token the bench sends it, for servers that are told theirs (Turborepo's anchor).
        let token = args.token.clone().unwrap_or_else(unsigned_token);
        cmd.env("HOARD_BENCH_TOKEN", &token);
        let mut t = spawned(label, cmd, &health, true).await?;
        t.token = Some(token);
        targets.push(t);
    }
    for raw in &args.targets {
        let (label, url) = split_label(raw, "--target")?;
        targets.push(target(label, url.trim_end_matches('/').to_owned(), true));
    }
    for raw in &args.pids {
        let (label, pid) = split_label(raw, "--pid")?;
        let pid: u32 = pid
            .parse()
            .map_err(|_| usage(format!("--pid {label}: {pid:?} is not a process id")))?;
        let t = targets
            .iter_mut()
            .find(|t| t.label == label)
            .ok_or_else(|| usage(format!("--pid names {label:?}, which is not a target")))?;
        t.pid = Some(pid);
    }
    for raw in &args.tool_apis {
        let (label, apis) = split_label(raw, "--tool-api")?;
        let t = targets
            .iter_mut()
            .find(|t| t.label == label)
            .ok_or_else(|| usage(format!("--tool-api names {label:?}, which is not a target")))?;
        t.tool_apis = tools::ToolApi::parse_list(&apis).map_err(usage)?;
    }
    if args.preload > 0 && !targets.iter().any(|t| t.database.is_some()) {
        return Err(usage(
            "--preload needs the hoard the bench starts itself (no --target or --spawn)",
        ));
    }
    if args.baseline {
        let port = free_port()?;
        let mut cmd = Command::new(&exe);
        cmd.args(["null-server", "--listen", &format!("127.0.0.1:{port}")]);
        targets.push(
            spawned(
                "baseline".into(),
                cmd,
                &format!("http://127.0.0.1:{port}/healthz"),
                false,
            )
            .await?,
        );
    }
    if args.baseline_disk {
        let port = free_port()?;
        let dir = tempfile::tempdir().map_err(|e| usage(e.to_string()))?;
        let mut cmd = Command::new(&exe);
        cmd.args([
            "disk-floor-server",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--dir",
        ])
        .arg(dir.path());
        let mut floor = spawned(
            report::FLOOR.into(),
            cmd,
            &format!("http://127.0.0.1:{port}/healthz"),
            true,
        )
        .await?;
        floor._data = Some(dir);
        targets.push(floor);
    }
    let mut labels: Vec<&str> = targets.iter().map(|t| t.label.as_str()).collect();
    labels.sort_unstable();
    if labels.windows(2).any(|w| w[0] == w[1]) {
        return Err(usage("target labels must be distinct"));
    }
    Ok(targets)
}

/// Runs the benchmark and prints the report; returns it for callers that want the numbers.
pub async fn run(args: BenchArgs) -> Result<Report, BenchFailure> {
    if args.rounds == 0 {
        return Err(usage("--rounds must be at least 1"));
    }
    if !(args.scale > 0.0 && args.scale <= 100.0) {
        return Err(usage("--scale must be above 0 and at most 100"));
    }
    let default_token = unsigned_token();
    let phases: Vec<Phase> = if args.only_small {
        vec![Phase::Small]
    } else if args.phases.is_empty() {
        Phase::DEFAULT.to_vec()
    } else {
        let mut p = args.phases.clone();
        p.sort_unstable();
        p.dedup();
        p
    };
    let has = |p| phases.contains(&p);
    if has(Phase::Fleet) && (args.fleet_jobs == 0 || args.fleet_rounds == 0) {
        return Err(usage("--fleet-jobs and --fleet-rounds must be at least 1"));
    }
    let plan = Plan::scaled(args.scale);
    let mut targets = prepare_targets(&args).await?;
    if targets.is_empty() {
        return Err(usage("nothing to measure"));
    }
    // Let spawned servers settle, then take their idle footprint and CPU so far.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for t in &mut targets {
        if let Some(pid) = t.pid {
            t.idle = Some(procstat::tree_resident(&procstat::process_tree(pid)));
            t.cpu_at_start = if t.child.is_some() {
                0.0
            } else {
                procstat::tree_cpu_seconds(pid)
            };
        }
    }
    let data = Payloads::generate(&plan, PAYLOAD_SEED);
    let run_id = hoard_model::BlobName::random().as_str()[..8].to_owned();
    let fleet = has(Phase::Fleet).then(|| {
        fleet::Fleet::new(
            fleet::FleetPlan::new(args.fleet_jobs, args.fleet_rounds, &plan, args.scale),
            &data,
            &run_id,
        )
    });
    // Removed, and its page cache dropped, when the run ends.
    let _page_cache_fill = if args.fill_page_cache {
        Some(
            tokio::task::spawn_blocking(page_cache::fill)
                .await
                .map_err(|e| usage(e.to_string()))?
                .map_err(|e| usage(format!("--fill-page-cache: {e}")))?,
        )
    } else {
        None
    };
    let tool_apis: Vec<&'static str> = {
        let mut names: Vec<&'static str> = targets
            .iter()
            .flat_map(|t| t.tool_apis.iter().map(tools::ToolApi::name))
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    };
    let sampler = procstat::PeakSampler::start(targets.iter().filter_map(|t| t.pid).collect());
    let bench_started = Instant::now();
    let client_cpu_start = procstat::self_cpu_seconds();
    for round in 0..args.rounds {
        let objects = has(Phase::Tools).then(|| {
            tools::Objects::generate(
                plan.tool_objects,
                &format!("{run_id}-{round}"),
                PAYLOAD_SEED + round as u64,
            )
        });
        // A B, then B A: whatever the machine does over time, every target runs as often early
        // as late, and none is always the first after the servers started.
        let mut order: Vec<usize> = (0..targets.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let t = &mut targets[i];
            let token = args
                .token
                .as_deref()
                .or(t.token.as_deref())
                .unwrap_or(&default_token);
            // The servers with background work of their own behind this one (an edge's origin;
            // the other edges have none to wait for).
            let behind = t
                .helpers
                .iter()
                .filter(|h| !t.edges.contains(&h.base))
                .map(|h| h.base.clone())
                .collect();
            let client = Client::new(&t.base, token, t.verify_content).behind(behind);
            let progress = progress::Progress::new(&t.label, round + 1, args.rounds);
            let tag = format!("{run_id}-{round}");
            let failed = |e| BenchFailure::Target(format!("{}: round {}: {e}", t.label, round + 1));
            scenarios::drain_writeback().await;
            let cpu_before = procstat::self_cpu_seconds();
            let mut result = scenarios::run_round(&client, &plan, &data, &tag, &phases, &progress)
                .await
                .map_err(failed)?;
            if let Some(objects) = &objects {
                for api in &t.tool_apis {
                    // Each API from cold connections and a settled server, as every target.
                    scenarios::settle(&client).await;
                    scenarios::drain_writeback().await;
                    let client = Client::new(&t.base, token, t.verify_content);
                    let figures = tools::run(&client, api, objects, &progress)
                        .await
                        .map_err(failed)?;
                    result.moved_bytes += 2 * objects.bytes();
                    result.verified_bytes += objects.bytes();
                    result.tools.push((api.name(), figures));
                }
            }
            if let Some(fleet) = &fleet {
                let secret = t.secret.clone();
                let sign =
                    move |repository: &str, ac: &str| token_for(secret.as_deref(), repository, ac);
                if !t.fleet_seeded {
                    let bar = progress.phase(
                        "fleet (untimed seeding)",
                        fleet::REPOSITORIES as u64,
                        "repositories",
                    );
                    result.moved_bytes += fleet
                        .seed(&client, &data, &sign, &|| bar.inc(1))
                        .await
                        .map_err(failed)?;
                    bar.finish(&format!(
                        "{} repositories, two entries each in main",
                        fleet::REPOSITORIES
                    ));
                    t.fleet_seeded = true;
                }
                let jobs = fleet.jobs(round, &tag, &sign).map_err(failed)?;
                scenarios::drain_writeback().await;
                let bar = progress.phase("fleet", jobs.len() as u64, "jobs");
                // A target of edges: the jobs go to the edges in turn.
                let clients: Vec<Client> = if t.edges.is_empty() {
                    vec![client.clone()]
                } else {
                    t.edges
                        .iter()
                        .map(|base| Client::new(base, token, t.verify_content))
                        .collect()
                };
                let http = reqwest::Client::new();
                let before = futures_util::future::join_all(
                    t.edges.iter().map(|e| edges::Counters::of(&http, e)),
                )
                .await;
                let mut r = fleet::run(&clients, fleet, &data, &jobs, &|| bar.inc(1)).await;
                if t.edges.is_empty() {
                    // Every byte restored came from the server.
                    r.origin_egress = Some(r.down);
                } else {
                    let after = futures_util::future::join_all(
                        t.edges.iter().map(|e| edges::Counters::of(&http, e)),
                    )
                    .await;
                    let seen: Vec<(f64, Option<f64>, f64)> =
                        before.iter().zip(after).map(|(b, a)| b.until(a)).collect();
                    r.origin_egress = Some(seen.iter().map(|s| s.0).sum::<f64>() as u64);
                    r.edge_hit_pct = seen.iter().map(|s| s.1).collect();
                    r.edge_unanswered = seen.iter().map(|s| s.2).sum::<f64>() as u64;
                }
                bar.finish(&format!(
                    "{} jobs, {} at once: {} MiB/s, {}/s, job p50 {} s, p99 {} s, {} lookups/s, \
                     {} errors; exact {:.1}%, restore key {:.1}%, miss {:.1}%",
                    jobs.len(),
                    fleet.plan.jobs,
                    report::format_value(r.mib_s, "MiB/s"),
                    report::format_value(r.jobs_s, "/s"),
                    report::format_value(r.job_p50_s, "s"),
                    report::format_value(r.job_p99_s, "s"),
                    report::format_value(r.lookups_s, "/s"),
                    r.errors,
                    r.exact_pct,
                    r.restore_key_pct,
                    r.miss_pct
                ));
                for e in &r.first_errors {
                    tracing::warn!("{}: round {}: fleet: {e}", t.label, round + 1);
                }
                result.moved_bytes += r.up + r.down;
                result.verified_bytes += r.down;
                result.fleet = Some(r);
            }
            t.client_cpu += procstat::self_cpu_seconds() - cpu_before;
            scenarios::settle(&client).await;
            t.rounds.push(result);
        }
    }
    let wall = bench_started.elapsed().as_secs_f64();
    let client_cpu = procstat::self_cpu_seconds() - client_cpu_start;
    let peaks = sampler.finish();
    let rounds = args.rounds as f64;

    let med = |f: &dyn Fn(&RoundResult) -> f64| -> Vec<Option<f64>> {
        targets
            .iter()
            .map(|t| stats::median(&t.rounds.iter().map(f).collect::<Vec<_>>()))
            .collect()
    };
    let fleet_med =
        |f: fn(&fleet::FleetResult) -> f64| med(&|r: &RoundResult| r.fleet.as_ref().map_or(0.0, f));
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let cpu: Vec<Option<f64>> = targets
        .iter()
        .map(|t| {
            t.pid
                .map(|p| (procstat::tree_cpu_seconds(p) - t.cpu_at_start) / rounds)
        })
        .collect();
    let peak = |part: &dyn Fn(&procstat::Resident) -> u64| -> Vec<Option<f64>> {
        targets
            .iter()
            .map(|t| t.pid.and_then(|p| peaks.get(&p)).map(|m| mib(part(m))))
            .collect()
    };
    let row = |metric, unit, better, values| Row {
        metric,
        unit,
        better,
        values,
    };
    let mut rows = vec![
        row(
            "Startup to healthy",
            "ms",
            Better::Lower,
            targets.iter().map(|t| t.startup_ms).collect(),
        ),
        row(
            "Idle memory",
            "MiB",
            Better::Lower,
            targets.iter().map(|t| t.idle.map(|m| mib(m.rss))).collect(),
        ),
        row("Peak memory", "MiB", Better::Lower, peak(&|m| m.rss)),
        // The published method's figures: the heap and stacks, without the mapped binary.
        row(
            "Idle anonymous memory",
            "MiB",
            Better::Lower,
            targets
                .iter()
                .map(|t| t.idle.map(|m| mib(m.anon)))
                .collect(),
        ),
        row(
            "Peak anonymous memory",
            "MiB",
            Better::Lower,
            peak(&|m| m.anon),
        ),
        row("Server CPU time per round", "s", Better::Lower, cpu.clone()),
        row(
            "Server CPU per GiB moved",
            "s/GiB",
            Better::Lower,
            cpu.iter()
                .zip(&targets)
                .map(|(c, t)| {
                    let moved: u64 = t.rounds.iter().map(|r| r.moved_bytes).sum();
                    let gib_per_round = moved as f64 / rounds / (1u64 << 30) as f64;
                    c.filter(|_| moved > 0).map(|c| c / gib_per_round)
                })
                .collect(),
        ),
    ];
    if has(Phase::Upload) {
        rows.push(row(
            "Upload 8 entries in parallel, 32 MiB blocks",
            "MiB/s",
            Better::Higher,
            med(&|r| r.upload_published_mib_s),
        ));
        rows.push(row(
            "Upload 8 entries, @actions/cache layout",
            "MiB/s",
            Better::Higher,
            med(&|r| r.upload_sdk_mib_s),
        ));
    }
    if has(Phase::Download1) {
        rows.push(row(
            "First download (all 8)",
            "MiB/s",
            Better::Higher,
            med(&|r| r.first_download_mib_s),
        ));
    }
    if has(Phase::Download2) {
        rows.push(row(
            "Later download (all 8 again)",
            "MiB/s",
            Better::Higher,
            med(&|r| r.later_download_mib_s),
        ));
    }
    if has(Phase::Lookups) {
        rows.push(row(
            "Lookups at 64 concurrent",
            "/s",
            Better::Higher,
            med(&|r| r.lookups_per_s),
        ));
        rows.push(row(
            "Lookup p50",
            "ms",
            Better::Lower,
            med(&|r| r.lookup_p50_ms),
        ));
        rows.push(row(
            "Lookup p99",
            "ms",
            Better::Lower,
            med(&|r| r.lookup_p99_ms),
        ));
    }
    if has(Phase::Small) {
        rows.push(row(
            "Small save+restore at 32 concurrent",
            "/s",
            Better::Higher,
            med(&|r| r.small_per_s),
        ));
    }
    for api in &tool_apis {
        let figure = |f: fn(&tools::ApiFigures) -> f64| -> Vec<Option<f64>> {
            targets
                .iter()
                .map(|t| {
                    let values: Vec<f64> = t
                        .rounds
                        .iter()
                        .flat_map(|r| r.tools.iter())
                        .filter(|(name, _)| name == api)
                        .map(|(_, figures)| f(figures))
                        .collect();
                    stats::median(&values)
                })
                .collect()
        };
        let [put, put_p99, get, get_p99] = tools::row_labels(api);
        rows.extend([
            row(put, "/s", Better::Higher, figure(|f| f.put_per_s)),
            row(put_p99, "ms", Better::Lower, figure(|f| f.put_p99_ms)),
            row(get, "/s", Better::Higher, figure(|f| f.get_per_s)),
            row(get_p99, "ms", Better::Lower, figure(|f| f.get_p99_ms)),
        ]);
    }
    if fleet.is_some() {
        rows.extend([
            row(
                "Fleet: up + down",
                "MiB/s",
                Better::Higher,
                fleet_med(|f| f.mib_s),
            ),
            row("Fleet: jobs", "/s", Better::Higher, fleet_med(|f| f.jobs_s)),
            row(
                "Fleet: job p50",
                "s",
                Better::Lower,
                fleet_med(|f| f.job_p50_s),
            ),
            row(
                "Fleet: job p99",
                "s",
                Better::Lower,
                fleet_med(|f| f.job_p99_s),
            ),
            row(
                "Fleet: lookups",
                "/s",
                Better::Higher,
                fleet_med(|f| f.lookups_s),
            ),
            // Errors are summed over the rounds, not a median: one is one too many.
            row(
                "Fleet: errors (all rounds)",
                "jobs",
                Better::Neither,
                targets
                    .iter()
                    .map(|t| {
                        Some(
                            t.rounds
                                .iter()
                                .filter_map(|r| r.fleet.as_ref())
                                .map(|f| f.errors as f64)
                                .sum(),
                        )
                    })
                    .collect(),
            ),
            row(
                "Fleet: exact hits seen",
                "%",
                Better::Neither,
                fleet_med(|f| f.exact_pct),
            ),
            row(
                "Fleet: restore-key hits seen",
                "%",
                Better::Neither,
                fleet_med(|f| f.restore_key_pct),
            ),
            row(
                "Fleet: misses seen",
                "%",
                Better::Neither,
                fleet_med(|f| f.miss_pct),
            ),
            // Summed: through edges, the first round fetches and the later ones hit.
            row(
                "Fleet: origin egress (all rounds)",
                "MiB",
                Better::Lower,
                targets
                    .iter()
                    .map(|t| {
                        let sent: Vec<u64> = t
                            .rounds
                            .iter()
                            .filter_map(|r| r.fleet.as_ref()?.origin_egress)
                            .collect();
                        (!sent.is_empty()).then(|| mib(sent.iter().sum()))
                    })
                    .collect(),
            ),
            row(
                "Fleet: edge hit ratio",
                "%",
                Better::Higher,
                targets
                    .iter()
                    .map(|t| {
                        let means: Vec<f64> = t
                            .rounds
                            .iter()
                            .filter_map(|r| r.fleet.as_ref())
                            .filter_map(|f| {
                                stats::mean(
                                    &f.edge_hit_pct.iter().flatten().copied().collect::<Vec<_>>(),
                                )
                            })
                            .collect();
                        stats::median(&means)
                    })
                    .collect(),
            ),
        ]);
    }
    rows.push(row(
        "Client CPU time per round",
        "s",
        Better::Lower,
        targets
            .iter()
            .map(|t| Some(t.client_cpu / rounds))
            .collect(),
    ));
    let mut notes = vec![format!(
        "phases: {}",
        phases
            .iter()
            .map(|p| p.name())
            .collect::<Vec<_>>()
            .join(", ")
    )];
    if phases
        .iter()
        .any(|p| !matches!(p, Phase::Fleet | Phase::Tools))
    {
        notes.push(format!(
            "entries: {} × {:.1} MiB; lookups: {}; small: {} × {} KiB",
            plan.entries,
            plan.entry_size as f64 / (1 << 20) as f64,
            plan.lookups,
            plan.small_ops,
            plan.small_size / 1024
        ));
    }
    if has(Phase::Tools) {
        notes.push(format!(
            "tools: {} objects of 1–64 KiB per API and round, PUT then GET at {} concurrent",
            plan.tool_objects,
            tools::CONCURRENCY
        ));
    }
    if let Some(fleet) = &fleet {
        let (exact, restore, miss) = fleet.planned();
        let p = &fleet.plan;
        let kib = |b: usize| b as f64 / 1024.0;
        notes.push(format!(
            "fleet: {} jobs at once × {} each = {} jobs per round over {} repositories, {} missing lookups each; planned per round: {exact} exact, {restore} restore-key, {miss} miss; saves of {:.0}–{:.0} KiB (70%) and {:.0}–{:.0} KiB (30%)",
            p.jobs,
            p.rounds,
            p.jobs_per_round(),
            fleet::REPOSITORIES,
            fleet::MISSING_LOOKUPS,
            kib(p.large.0),
            kib(p.large.1),
            kib(p.small.0),
            kib(p.small.1),
        ));
    }
    for t in targets.iter().filter(|t| !t.edges.is_empty()) {
        let per_round: Vec<String> = t
            .rounds
            .iter()
            .filter_map(|r| r.fleet.as_ref())
            .map(|f| {
                let each: Vec<String> = f
                    .edge_hit_pct
                    .iter()
                    .map(|p| p.map_or("–".to_owned(), |p| format!("{p:.0}%")))
                    .collect();
                each.join(" ")
            })
            .collect();
        let unanswered: u64 = t
            .rounds
            .iter()
            .filter_map(|r| r.fleet.as_ref())
            .map(|f| f.edge_unanswered)
            .sum();
        notes.push(format!(
            "{}: {} edges (`hoard edge`) in front of a hoard of their own, fleet jobs to the edges in turn, memory and CPU of the first edge; each edge's fleet hit ratio by round: {}; fleet lookups the origin did not answer in time (told as misses): {unanswered}",
            t.label,
            t.edges.len(),
            if per_round.is_empty() { "no fleet".to_owned() } else { per_round.join("; ") }
        ));
    }
    notes.push(format!(
        "client CPU {client_cpu:.1} s over {wall:.1} s of wall time"
    ));
    for t in &targets {
        let Some(db) = &t.database else { continue };
        let (db_after, wal_after) = database_sizes(db);
        let per = |bytes: u64, n: u64| bytes as f64 / n.max(1) as f64;
        match t.preloaded {
            Some(p) => notes.push(format!(
                "{}: preloaded {} entries in {:.1} s; database {:.1} MiB + WAL {:.1} MiB after the preload ({:.0} bytes per entry), {:.1} MiB + {:.1} MiB after the phases",
                t.label,
                p.entries,
                p.seconds,
                mib(p.database_bytes),
                mib(p.wal_bytes),
                per(p.database_bytes + p.wal_bytes, p.entries),
                mib(db_after),
                mib(wal_after)
            )),
            None => notes.push(format!(
                "{}: database {:.1} MiB + WAL {:.1} MiB after the phases",
                t.label,
                mib(db_after),
                mib(wal_after)
            )),
        }
    }
    for t in &targets {
        let verified: u64 = t.rounds.iter().map(|r| r.verified_bytes).sum();
        let how = if t.verify_content {
            "byte for byte"
        } else {
            "length only (it serves zeros)"
        };
        notes.push(format!(
            "{}: every download checked, {:.1} MiB verified {how}",
            t.label,
            mib(verified)
        ));
    }
    let report = Report {
        targets: targets.iter().map(|t| t.label.clone()).collect(),
        rounds: args.rounds,
        scale: args.scale,
        rows,
        notes,
    };
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{}", report.to_markdown());
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).map_err(|e| usage(e.to_string()))?;
        std::fs::write(path, json)
            .map_err(|e| usage(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(report)
}
