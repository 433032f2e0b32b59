use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use hoard::bench::BenchArgs;
use hoard::config::ServeArgs;

/// A self-hosted cache server for GitHub Actions.
#[derive(Parser)]
#[command(name = "hoard", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the cache server.
    Serve(Box<ServeArgs>),
    /// Run an edge: a byte cache on this machine's disk, beside the runners, in front of a hoard.
    ///
    /// Every lookup and save is decided by the origin (--origin, a hoard server or its
    /// replicas); the edge serves entries' bytes from its own disk (at most --max-bytes, the
    /// least recently used removed first), fetching each from the origin once. Runners point
    /// at the edge as they would at hoard. Origin down: lookups are misses within
    /// --lookup-timeout and saves are refused, so jobs go on.
    Edge(Box<hoard::edge::EdgeArgs>),
    /// Run one maintenance pass now (expiry, eviction, abandoned uploads, garbage collection).
    ///
    /// Aborts abandoned uploads, expires and evicts entries, and deletes chunks whose grace period
    /// is over and orphaned chunks. Takes the same options as `serve` (and its HOARD_*
    /// variables); safe while servers run.
    Gc(Box<GcArgs>),
    /// Check every stored chunk against its SHA-256 and quarantine damaged entries.
    ///
    /// Reads every chunk of every entry, quarantines the entries whose chunks are damaged or
    /// missing, and exits with 1 if any were found. A large chunk whose SHA-256 the server's
    /// digest pass has not recorded yet is checked against its XXH3. Takes the same options as `serve`; safe while
    /// servers run.
    Verify(Box<ServeArgs>),
    /// Say why caching works or not here: run it on a runner machine or in a job step.
    ///
    /// Reads the environment the way the cache clients do (ACTIONS_RESULTS_URL,
    /// ACTIONS_CACHE_URL, ACTIONS_CACHE_SERVICE_V2, GITHUB_SERVER_URL, ACTIONS_RUNTIME_TOKEN,
    /// ACTIONS_CACHE_MODE), says which protocol they will pick and why, then checks that the
    /// server answers, the clock, that the token is accepted (never printing it), and that a
    /// tiny entry saves, restores and matches. Each finding comes with its fix; exits with 1 if
    /// any check failed.
    Doctor {
        /// How long each request may take.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
    },
    /// Exit 0 if the server on this machine is ready (its /readyz answers 200), 1 if not.
    ///
    /// The container image's health check: it needs no shell or HTTP client. Asks
    /// 127.0.0.1 on the port of HOARD_LISTEN (3000 by default), over HTTPS when
    /// HOARD_TLS_CERT is set, unless given --url.
    Health {
        /// The readiness URL to ask, such as http://127.0.0.1:3000/readyz.
        #[arg(long)]
        url: Option<url::Url>,
        /// How long the server may take to answer.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
    },
    /// Go's build cache program: `GOCACHEPROG="hoard gocache"` in a job.
    ///
    /// Speaks Go's GOCACHEPROG protocol on stdin and stdout (Go 1.24 and later): outputs are
    /// kept in a local directory and shared through hoard at --url (HOARD_URL) under the job's
    /// scope, with the job's HOARD_TOOL_TOKEN (or ACTIONS_RUNTIME_TOKEN). hoard unreachable:
    /// misses, never failures.
    Gocache(hoard::gocache::GocacheArgs),
    /// Point a GitHub Actions runner at hoard without patching it, check it, or undo it.
    ///
    /// `setup` writes a Node preload and a job-started hook under the runner's .hoard/ and adds
    /// one block to its .env; `undo` removes them (.env is then as it was); `doctor` checks a
    /// runner set up so. `setup --arc` prints the same for actions-runner-controller.
    Runner {
        #[command(subcommand)]
        command: RunnerCommand,
    },
    /// List and delete cache entries on a running server, or see usage per repository.
    ///
    /// Talks to the admin API of the server at --server (HOARD_SERVER) with the admin token from
    /// HOARD_ADMIN_TOKEN or --token-file. Tables by default, --json for scripts.
    Caches {
        #[command(flatten)]
        server: hoard::admin_cli::ServerArgs,
        #[command(subcommand)]
        command: hoard::admin_cli::CachesCommand,
    },
    /// Issue a token for one repository's build tools outside Actions (a developer's machine).
    ///
    /// Talks to the admin API like `hoard caches`. Read-only unless --write.
    Tokens {
        #[command(flatten)]
        server: hoard::admin_cli::ServerArgs,
        #[command(subcommand)]
        command: hoard::admin_cli::TokensCommand,
    },
    /// A running server's version, uptime, backends, storage, limits, lookups and warnings.
    ///
    /// Talks to the admin API like `hoard caches`.
    Status {
        #[command(flatten)]
        server: hoard::admin_cli::ServerArgs,
    },
    /// Measure servers with the published benchmark method, side by side.
    Bench(Box<BenchArgs>),
    /// The null baseline server that `hoard bench --baseline` starts.
    #[command(hide = true)]
    NullServer {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: std::net::SocketAddr,
    },
    /// The disk floor server that `hoard bench --baseline-disk` starts.
    #[command(hide = true)]
    DiskFloorServer {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: std::net::SocketAddr,
        #[arg(long)]
        dir: std::path::PathBuf,
    },
}

#[derive(Subcommand)]
enum RunnerCommand {
    /// Make the runner's JavaScript actions use hoard, with a fallback to GitHub per job.
    ///
    /// Refuses a directory that is not a runner's, a runner patched the old way
    /// (Runner.Worker.dll), a loopback --url (unless --allow-loopback) and a hoard that does not
    /// forward the results service. Running it again changes nothing.
    Setup(hoard::runner::SetupArgs),
    /// Remove what setup added: .env is then byte for byte as before setup.
    Undo(hoard::runner::DirArgs),
    /// Check a runner set up with `hoard runner setup`; exits with 1 if a check failed.
    Doctor(hoard::runner::DirArgs),
}

#[derive(clap::Args)]
struct GcArgs {
    /// Report what the pass would delete, and change nothing.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    serve: ServeArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Serve(args) => runtime.block_on(serve(*args)),
        Command::Edge(args) => runtime.block_on(edge(*args)),
        Command::Gc(args) => runtime.block_on(gc(*args)),
        Command::Verify(args) => runtime.block_on(verify(*args)),
        Command::Doctor { timeout } => {
            let env = hoard::doctor::Env::read(|name| std::env::var(name).ok());
            let report = runtime.block_on(hoard::doctor::run(env, timeout));
            // The report is the command's output; logs go to standard error.
            let _ = std::io::Write::write_all(&mut std::io::stdout(), report.render().as_bytes());
            if report.failed() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Command::Health { url, timeout } => runtime.block_on(health(url, timeout)),
        Command::Gocache(args) => match runtime.block_on(hoard::gocache::run(args)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("hoard gocache: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Runner { command } => runner(&runtime, command),
        Command::Caches { server, command } => print_or_fail(
            "hoard",
            runtime.block_on(hoard::admin_cli::caches(&server, &command)),
        ),
        Command::Tokens { server, command } => print_or_fail(
            "hoard",
            runtime.block_on(hoard::admin_cli::tokens(&server, &command)),
        ),
        Command::Status { server } => {
            print_or_fail("hoard", runtime.block_on(hoard::admin_cli::status(&server)))
        }
        Command::Bench(args) => match runtime.block_on(hoard::bench::run(*args)) {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::DiskFloorServer { listen, dir } => {
            match runtime.block_on(hoard::bench::floor::run(listen, &dir)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::NullServer { listen } => match runtime.block_on(hoard::bench::null::run(listen)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e}");
                ExitCode::FAILURE
            }
        },
    }
}

async fn health(url: Option<url::Url>, timeout: std::time::Duration) -> ExitCode {
    let url = match url {
        Some(url) => Ok(url),
        None => {
            let listen = std::env::var("HOARD_LISTEN").ok();
            let tls = std::env::var_os("HOARD_TLS_CERT").is_some_and(|v| !v.is_empty());
            hoard::health::default_url(listen.as_deref(), tls)
        }
    };
    let answer = match url {
        Ok(url) => hoard::health::check(&url, timeout).await,
        Err(e) => Err(e),
    };
    print_or_fail("hoard", answer.map(|line| line + "\n"))
}

fn runner(runtime: &tokio::runtime::Runtime, command: RunnerCommand) -> ExitCode {
    let result = match command {
        RunnerCommand::Setup(args) => runtime.block_on(hoard::runner::setup(&args)),
        RunnerCommand::Undo(args) => hoard::runner::undo(&args),
        RunnerCommand::Doctor(args) => {
            let report = runtime.block_on(hoard::runner::doctor::run(&args.runner_dir));
            let _ = std::io::Write::write_all(
                &mut std::io::stdout(),
                report
                    .render_as(
                        "hoard runner doctor: whether this runner's jobs send their cache calls to hoard",
                        "this runner is set up for hoard",
                        "this runner is not set up for hoard until the failures above are fixed",
                    )
                    .as_bytes(),
            );
            return if report.failed() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    print_or_fail("hoard runner", result)
}

/// A command's output on standard output, or its failure as one sentence on standard error
/// after `command: `.
fn print_or_fail(command: &str, result: Result<String, impl std::fmt::Display>) -> ExitCode {
    match result {
        Ok(out) => {
            let _ = std::io::Write::write_all(&mut std::io::stdout(), out.as_bytes());
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!("{command}: {e}\n").as_bytes(),
            );
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> ExitCode {
    let config = match args.validate() {
        Ok(config) => config,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    let shutdown = CancellationToken::new();
    let state = match hoard::build_state(&config, shutdown.clone()).await {
        Ok(state) => state,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(
                "cannot listen on {} (--listen, HOARD_LISTEN): {e}",
                config.listen
            );
            return ExitCode::FAILURE;
        }
    };
    if config.tokens.insecure_skip_validation {
        tracing::warn!("{}", hoard::UNVERIFIED_TOKENS_WARNING);
    }
    if config.anonymous.is_some() {
        tracing::warn!("{}", hoard::auth::callers::ANONYMOUS_WARNING);
    }
    tracing::info!("metadata in {}", config.database.redacted());
    tracing::info!("chunks in {}", config.storage);
    if let Some(tls) = &config.tls {
        tracing::info!(
            "serving HTTPS with {} (re-read on SIGHUP)",
            tls.cert.display()
        );
    }
    match listener.local_addr() {
        Ok(addr) => tracing::info!("listening on {addr}"),
        Err(_) => tracing::info!("listening on {}", config.listen),
    }
    if let Some(addr) = config.metrics_listen {
        let listener = match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(
                    "cannot listen on {addr} (--metrics-listen, HOARD_METRICS_LISTEN): {e}"
                );
                return ExitCode::FAILURE;
            }
        };
        let bound = listener.local_addr().unwrap_or(addr);
        tracing::info!("metrics on http://{bound}/metrics");
        tokio::spawn(hoard::serve_metrics(
            state.clone(),
            listener,
            shutdown.clone(),
        ));
    }
    if config.admin_token.is_some() {
        tracing::info!("admin API and dashboard on /_hoard/");
    }
    tokio::spawn(stop_on_signal(shutdown.clone()));
    match hoard::serve(&config, state, listener, shutdown).await {
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn edge(args: hoard::edge::EdgeArgs) -> ExitCode {
    let stop = CancellationToken::new();
    tokio::spawn(stop_on_signal(stop.clone()));
    match hoard::edge::run(args, stop).await {
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(hoard::edge::EdgeError::Config(e)) => {
            tracing::error!("{e}");
            ExitCode::from(2)
        }
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// The domain for a one-off command, or the exit code of the failure (already logged).
async fn open_cache(args: &ServeArgs) -> Result<hoard::cache::Cache, ExitCode> {
    let config = args.validate().map_err(|e| {
        tracing::error!("{e}");
        ExitCode::from(2)
    })?;
    hoard::open_cache(&config).await.map_err(|e| {
        tracing::error!("{e}");
        ExitCode::FAILURE
    })
}

/// Writes report lines to standard output; a closed pipe ends the report quietly.
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{line}");
}

async fn gc(args: GcArgs) -> ExitCode {
    let cache = match open_cache(&args.serve).await {
        Ok(cache) => cache,
        Err(code) => return code,
    };
    use hoard::cache::lifecycle::Action;
    let mut print = |action: Action| match action {
        Action::AbortUpload(id) => say(format_args!("abort upload {id} (abandoned)")),
        Action::Expire(e) => say(format_args!(
            "expire entry {} of repository {} ({} bytes)",
            e.id, e.repository, e.size
        )),
        Action::Evict(e) => say(format_args!(
            "evict entry {} of repository {} ({} bytes)",
            e.id, e.repository, e.size
        )),
        Action::DeleteChunk(name) => say(format_args!("delete chunk {name} (grace period over)")),
        Action::DeleteOrphan(name) => say(format_args!("delete chunk {name} (orphaned)")),
    };
    let report = match cache.maintenance_pass(args.dry_run, &mut print).await {
        Ok(report) => report,
        Err(e) => {
            tracing::error!("maintenance pass failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let verb = if args.dry_run { "would" } else { "did" };
    say(format_args!(
        "{verb}: abort {} uploads, prune {} upload records, expire {} entries, evict {} entries, delete {} chunks and {} orphaned chunks",
        report.aborted_uploads,
        report.pruned_uploads,
        report.expired,
        report.evicted,
        report.deleted_chunks,
        report.orphans
    ));
    ExitCode::SUCCESS
}

async fn verify(args: ServeArgs) -> ExitCode {
    let cache = match open_cache(&args).await {
        Ok(cache) => cache,
        Err(code) => return code,
    };
    let mut reported = 0;
    let result = cache
        .verify_all(|report| {
            for (id, how) in &report.damaged[reported..] {
                say(format_args!("quarantined entry {id}: {how}"));
            }
            reported = report.damaged.len();
        })
        .await;
    match result {
        Ok(report) => {
            say(format_args!(
                "checked {} entries, {} chunks, {} bytes: {} damaged",
                report.entries,
                report.chunks,
                report.bytes,
                report.damaged.len()
            ));
            if report.damaged.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            tracing::error!("verification failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Cancels `shutdown` on SIGINT or SIGTERM.
async fn stop_on_signal(shutdown: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("cannot watch SIGTERM: {e}");
                    let _ = ctrl_c.await;
                    shutdown.cancel();
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down: no new connections, waiting for in-flight requests");
    shutdown.cancel();
}
