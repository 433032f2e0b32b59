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
    /// Measure servers with the published benchmark method, side by side.
    Bench(Box<BenchArgs>),
    /// The null baseline server that `hoard bench --baseline` starts.
    #[command(hide = true)]
    NullServer {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: std::net::SocketAddr,
    },
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
        Command::Bench(args) => match runtime.block_on(hoard::bench::run(*args)) {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::NullServer { listen } => match runtime.block_on(hoard::bench::null::run(listen)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e}");
                ExitCode::FAILURE
            }
        },
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
    tracing::info!("metadata in {}", config.database.redacted());
    match listener.local_addr() {
        Ok(addr) => tracing::info!("listening on {addr}"),
        Err(_) => tracing::info!("listening on {}", config.listen),
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
