//! `hoard runner setup | undo | doctor`: point GitHub's own runner at hoard without patching it.
//!
//! The runner reads `<root>/.env` into its environment at start, and its Node actions inherit
//! that environment, `NODE_OPTIONS` included; a self-update replaces only `bin*` and
//! `externals*`. So `setup` writes a preload (`.hoard/preload.cjs`, [`files`]) that swaps hoard's
//! URL into `ACTIONS_RESULTS_URL`/`ACTIONS_CACHE_URL` inside each JavaScript action, after the
//! runner set GitHub's, and a job-started hook (`.hoard/job-started.sh`) that falls back to
//! GitHub for a job when hoard is not ready; then it adds one block to `.env` ([`env_file`]) that
//! loads both. `undo` removes the block (the file is then byte-identical to before) and the
//! files. [`checks`] holds what both trust only after checking; [`dir_fs`] is how both touch the
//! runner directory (often as root) without following a link a job planted; [`arc`] prints the
//! same for actions-runner-controller; [`doctor`] checks a set-up runner.

pub mod arc;
pub mod checks;
pub mod dir_fs;
pub mod doctor;
pub mod env_file;
pub mod files;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use url::Url;

use checks::Readiness;
use env_file::EnvChange;

/// How long `setup` and `doctor` wait for hoard's `/readyz`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// GitHub's results service, the `--upstream-results-url` a github.com runner needs.
pub const GITHUB_RESULTS: &str = "https://results-receiver.actions.githubusercontent.com/";

#[derive(Debug, Clone, clap::Args)]
pub struct SetupArgs {
    /// The runner's directory, as config.sh left it (run.sh, bin/, .runner).
    #[arg(long, required_unless_present = "arc")]
    pub runner_dir: Option<PathBuf>,
    /// hoard's URL, at the root of its origin (http://cache.internal:3000/). Jobs' JavaScript
    /// actions get it as ACTIONS_RESULTS_URL (cache v2, and artifact calls, which hoard
    /// forwards) and, unless --cache-url, as ACTIONS_CACHE_URL (cache v1).
    #[arg(long)]
    pub url: String,
    /// hoard's URL for ACTIONS_CACHE_URL (cache v1 and GHES), if not --url: for example with a
    /// path prefix. The trailing slash is added if missing.
    #[arg(long)]
    pub cache_url: Option<String>,
    /// Redirect ACTIONS_CACHE_URL only (cache v1, GitHub Enterprise Server) and leave
    /// ACTIONS_RESULTS_URL, and with it artifacts, to GitHub: hoard then need not forward.
    #[arg(long)]
    pub cache_only: bool,
    /// Print what would change, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Accept a loopback or link-local --url. BuildKit (docker/build-push-action's type=gha
    /// cache) runs in a container, where such an address is the container itself.
    #[arg(long)]
    pub allow_loopback: bool,
    /// Print, touching no cluster, a ConfigMap and the runner container's env and volumeMounts
    /// for an actions-runner-controller gha-runner-scale-set values file.
    #[arg(long)]
    pub arc: bool,
    /// With --arc: point each runner pod at the hoard edge on its own node (docs/edges.md: the
    /// DaemonSet of contrib/scale-out/kubernetes.yaml, with this host port), at
    /// http://<the node's address>:PORT/, instead of at --url. --url is then the origin the
    /// edges are in front of, which set-up checks.
    #[arg(long, requires = "arc", value_name = "PORT")]
    pub edge_port: Option<u16>,
    /// Point these build tools at hoard in every job, with a token of the job's own
    /// (docs/build-tools/): turbo, nx, sccache, ccache, go, or all. The first JavaScript action
    /// of each job exchanges the job's runtime token for a tool token and exports the tools'
    /// variables to the later steps, unless the workflow sets them itself. `go` sets
    /// GOCACHEPROG to this hoard binary's `gocache`.
    #[arg(long, value_delimiter = ',', value_name = "TOOL,…")]
    pub build_tools: Vec<BuildTool>,
}

/// A build tool `--build-tools` sets up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum BuildTool {
    Turbo,
    Nx,
    Sccache,
    Ccache,
    Go,
    All,
}

impl BuildTool {
    const EACH: [BuildTool; 5] = [Self::Turbo, Self::Nx, Self::Sccache, Self::Ccache, Self::Go];

    fn name(self) -> &'static str {
        match self {
            Self::Turbo => "turbo",
            Self::Nx => "nx",
            Self::Sccache => "sccache",
            Self::Ccache => "ccache",
            Self::Go => "go",
            Self::All => "all",
        }
    }
}

/// `--build-tools` as chosen: each once, in a fixed order (`all` is every one).
fn chosen_tools(asked: &[BuildTool]) -> Vec<BuildTool> {
    let mut tools: Vec<BuildTool> = if asked.contains(&BuildTool::All) {
        BuildTool::EACH.to_vec()
    } else {
        asked.to_vec()
    };
    tools.sort_unstable();
    tools.dedup();
    tools
}

/// `tools` as `.env` carries them (`turbo,nx,…`); `None` for none.
fn tools_line(tools: &[BuildTool]) -> Option<String> {
    (!tools.is_empty()).then(|| tools.iter().map(|t| t.name()).collect::<Vec<_>>().join(","))
}

/// `GOCACHEPROG` for this hoard binary: `<path> gocache`, which Go splits as a shell would.
fn gocacheprog() -> Result<String, Refusal> {
    // The path the system runs this binary by (Linux reads it from /proc/self/exe).
    let exe = std::env::current_exe().map_err(|e| {
        Refusal(format!(
            "cannot find this hoard binary for GOCACHEPROG: {e}"
        ))
    })?;
    let path = exe.to_str().ok_or_else(|| {
        Refusal(format!(
            "--build-tools go: this hoard binary's path ({}) is not UTF-8, which GOCACHEPROG cannot carry; install hoard elsewhere (such as /usr/local/bin/hoard)",
            exe.display()
        ))
    })?;
    if path
        .chars()
        .any(|c| c.is_whitespace() || "'\"\\".contains(c))
    {
        return refuse(format!(
            "--build-tools go: this hoard binary's path ({path}) has a space or a quote, which GOCACHEPROG cannot carry; install hoard elsewhere (such as /usr/local/bin/hoard)"
        ));
    }
    Ok(format!("{path} gocache"))
}

#[derive(Debug, Clone, clap::Args)]
pub struct DirArgs {
    /// The runner's directory, as config.sh left it (run.sh, bin/, .runner).
    #[arg(long)]
    pub runner_dir: PathBuf,
}

/// Why a command refused or failed: one sentence, with what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(pub String);

fn refuse<T>(msg: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal(msg.into()))
}

/// A URL for a cache client, with the slash at the end that the clients need.
fn client_url(flag: &str, raw: &str, root_only: bool) -> Result<Url, Refusal> {
    let mut url =
        Url::parse(raw).map_err(|e| Refusal(format!("{flag} {raw:?} is not a URL ({e})")))?;
    if !url.username().is_empty() || url.password().is_some() {
        // Said without the URL: the secret stays out of the output.
        let _ = url.set_username("");
        let _ = url.set_password(None);
        return refuse(format!(
            "{flag} carries a credential (user name or password) in its URL ({} with it removed). It would be written to .env, which every job can read, and shown in job logs; and hoard needs none there: each job's cache calls carry that job's own ACTIONS_RUNTIME_TOKEN, which hoard checks. Pass the URL without the credential; if a proxy in front of hoard asks for one, let it admit the runners by network instead (docs/runners.md, Reverse proxy and TLS)",
            url
        ));
    }
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return refuse(format!("{flag} {raw} must be an http:// or https:// URL"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return refuse(format!("{flag} {raw} must not have a query or fragment"));
    }
    if root_only && url.path() != "/" {
        return refuse(format!(
            "{flag} {raw} has a path: @actions/cache drops it and calls /twirp/… at the origin, so hoard must be served at the root of {} (for a path prefix for v1, use --cache-url)",
            url.origin().ascii_serialization()
        ));
    }
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    Ok(url)
}

/// Refuses a loopback or link-local URL unless allowed.
fn reachable_from_containers(flag: &str, url: &Url, allow: bool) -> Result<(), Refusal> {
    if checks::is_loopback_host(url) && !allow {
        return refuse(format!(
            "{flag} {url} is a loopback or link-local address. docker/build-push-action's type=gha cache is read and written by BuildKit, which runs in a container, where that address is the container itself, not this machine. Give an address of this machine that containers reach (its LAN address or name), or pass --allow-loopback if no job uses BuildKit's cache"
        ));
    }
    Ok(())
}

/// The URLs `setup` puts in place: (results, cache).
fn urls(args: &SetupArgs) -> Result<(Option<Url>, Url), Refusal> {
    let url = client_url("--url", &args.url, !args.cache_only)?;
    reachable_from_containers("--url", &url, args.allow_loopback)?;
    let cache = match &args.cache_url {
        Some(raw) => {
            let cache = client_url("--cache-url", raw, false)?;
            reachable_from_containers("--cache-url", &cache, args.allow_loopback)?;
            cache
        }
        None => url.clone(),
    };
    let results = (!args.cache_only).then_some(url);
    Ok((results, cache))
}

/// What `/readyz` at `base` says about forwarding, as a refusal or a note for the report;
/// `later` says how to check again.
async fn check_forwarding(
    base: &Url,
    needs_forwarding: bool,
    later: &str,
) -> Result<Option<String>, Refusal> {
    match checks::readiness(base, PROBE_TIMEOUT).await {
        Readiness::Ready { forwards_to: Some(to) } => Ok(Some(format!(
            "hoard at {base} is ready and forwards the results service (artifacts) to {to}"
        ))),
        Readiness::Ready { forwards_to: None } if needs_forwarding => refuse(format!(
            "hoard at {base} does not forward the results service: with this set-up every JavaScript action's results-service calls go to hoard, so actions/upload-artifact and download-artifact would fail. Start hoard with --upstream-results-url {GITHUB_RESULTS} (HOARD_UPSTREAM_RESULTS_URL; on GHE.com your enterprise's results service), or an older hoard that cannot say so: upgrade it. Or pass --cache-only to redirect only ACTIONS_CACHE_URL (v1, GHES)"
        )),
        Readiness::Ready { forwards_to: None } => Ok(Some(format!("hoard at {base} is ready"))),
        Readiness::NotReady(why) => Ok(Some(format!(
            "warning: hoard at {base} is not ready ({why}); until it is, each job falls back to GitHub's cache, and forwarding could not be checked: {later} once it is"
        ))),
        Readiness::Unreachable(why) => Ok(Some(format!(
            "warning: hoard at {base} did not answer ({why}); until it does, each job falls back to GitHub's cache, and forwarding could not be checked: {later} once it answers"
        ))),
    }
}

/// Refuses a host name that resolves to loopback addresses only, unless allowed.
async fn resolves_for_containers(flag: &str, url: &Url, allow: bool) -> Result<(), Refusal> {
    if allow {
        return Ok(());
    }
    if let Some(addrs) = checks::resolves_to_loopback(url).await {
        let addrs: Vec<String> = addrs.iter().map(ToString::to_string).collect();
        return refuse(format!(
            "{flag} {url}: {} resolves to {} on this machine, a loopback address. BuildKit (docker/build-push-action's type=gha cache) runs in a container, where that address is the container itself. Give this machine's LAN address or a name that resolves to it, or pass --allow-loopback if no job uses BuildKit's cache",
            url.host_str().unwrap_or_default(),
            addrs.join(", ")
        ));
    }
    Ok(())
}

/// `hoard runner setup`: the report, or why it refused.
pub async fn setup(args: &SetupArgs) -> Result<String, Refusal> {
    let (results, cache) = urls(args)?;
    if args.arc && args.build_tools.contains(&BuildTool::Go) {
        return refuse("--build-tools go needs the hoard binary in the runner container, which --arc does not put there; name the other tools, and set GOCACHEPROG in the runner image (docs/build-tools/go.md)");
    }
    if let Some(url) = &results {
        resolves_for_containers("--url", url, args.allow_loopback).await?;
    }
    resolves_for_containers("--cache-url", &cache, args.allow_loopback).await?;
    let mut report = String::new();
    if args.arc {
        let probe = results.as_ref().unwrap_or(&cache);
        let readyz = probe
            .join("/readyz")
            .map_or_else(|_| probe.to_string(), String::from);
        let later = format!("ask {readyz} from a runner pod (forwarding.results must not be null)");
        if let Some(note) = check_forwarding(probe, results.is_some(), &later).await? {
            // The cluster's address often does not resolve here: a note in a YAML comment.
            report.push_str(&format!("# {note}\n"));
        }
        // `all`, without go (said in the docs).
        let mut tools = chosen_tools(&args.build_tools);
        tools.retain(|t| *t != BuildTool::Go);
        let tools = tools_line(&tools);
        // Each runner at its node's edge: the node's address is known only in the pod.
        let edge = args.edge_port.map(arc::node_edge);
        let (results, cache) = match &edge {
            Some(edge) => (results.as_ref().map(|_| edge.as_str()), edge.as_str()),
            None => (results.as_ref().map(Url::as_str), cache.as_str()),
        };
        report.push_str(&arc::render(results, Some(cache), tools.as_deref()));
        return Ok(report);
    }
    let Some(dir) = &args.runner_dir else {
        return refuse("--runner-dir is required without --arc");
    };
    let runner = checks::runner_dir(dir).map_err(Refusal)?;
    if let Some(found) = runner.dll_patches().filter(|p| !p.is_empty()) {
        return refuse(format!(
            "{} is patched the old way ({} in bin/Runner.Worker.dll), so the runner never sets ACTIONS_RESULTS_URL and the preload would have nothing to replace. To restore it: {}. Then run this again",
            runner.root.display(),
            found.join(", "),
            runner.dll_restore_hint()
        ));
    }
    let probe = results.as_ref().unwrap_or(&cache);
    let later = format!(
        "run hoard runner doctor --runner-dir {}",
        runner.root.display()
    );
    if let Some(note) = check_forwarding(probe, results.is_some(), &later).await? {
        let _ = writeln!(report, "{note}");
    }

    let hoard_dir = runner.hoard_dir();
    let preload_path = hoard_dir.join(files::PRELOAD_NAME);
    let hook_path = hoard_dir.join(files::HOOK_NAME);
    let require = env_file::require_option(&preload_path.to_string_lossy()).ok_or_else(|| {
        Refusal(format!(
            "{} has a quote, a backslash or a newline in its path, which NODE_OPTIONS cannot carry; move the runner",
            runner.root.display()
        ))
    })?;
    let chosen = chosen_tools(&args.build_tools);
    let gocacheprog = match chosen.contains(&BuildTool::Go) {
        true => Some(gocacheprog()?),
        false => None,
    };
    let tools = tools_line(&chosen);
    let change = EnvChange {
        require,
        hook: hook_path.to_string_lossy().into_owned(),
        results_url: results.as_ref().map(|u| u.to_string()),
        cache_url: Some(cache.to_string()),
        build_tools: tools.clone(),
        gocacheprog: gocacheprog.clone(),
    };
    let env_path = runner.env_file();
    // As root in a directory the runner's user controls: nothing is followed (dir_fs).
    let fs = dir_fs::RunnerFs::open(&runner.root).map_err(Refusal)?;
    let existing = fs.read_env().map_err(Refusal)?;
    let before = existing
        .as_ref()
        .map(|e| e.text.clone())
        .unwrap_or_default();
    let after = env_file::setup(&before, &change)
        .map_err(|e| Refusal(format!("{}: {e}", env_path.display())))?;

    let verb = if args.dry_run { "would write" } else { "wrote" };
    let mut changed = false;
    let hoard = fs.hoard_dir(!args.dry_run).map_err(Refusal)?;
    for (name, text) in files::all() {
        let path = fs.hoard_path(name);
        let now = hoard
            .as_ref()
            .and_then(|dir| dir_fs::read_regular(dir, name));
        if now.as_deref() == Some(text.as_bytes()) {
            continue;
        }
        changed = true;
        if let (false, Some(dir)) = (args.dry_run, &hoard) {
            // Executable: the runner runs the hook with bash, but an operator may run it by hand.
            dir_fs::write_new(dir, name, text.as_bytes(), 0o755, None)
                .map_err(|e| Refusal(format!("cannot write {}: {e}", path.display())))?;
        }
        let _ = writeln!(report, "{verb} {}", path.display());
    }
    if after != before {
        changed = true;
        if !args.dry_run {
            fs.write_env(&after, existing.as_ref()).map_err(Refusal)?;
        }
        let _ = writeln!(
            report,
            "{} {}:\n{}",
            if args.dry_run {
                "would change"
            } else {
                "changed"
            },
            env_path.display(),
            env_file::describe(&before, &after)
        );
    }
    if !changed {
        let _ = writeln!(
            report,
            "nothing to change: {} is set up for hoard at {}",
            runner.root.display(),
            probe
        );
    } else if args.dry_run {
        let _ = writeln!(report, "dry run: nothing was changed");
    } else {
        let _ = writeln!(
            report,
            "the runner reads .env when it starts; restart it: {}",
            runner.restart_command()
        );
        let _ = writeln!(
            report,
            "undo with: hoard runner undo --runner-dir {}",
            runner.root.display()
        );
    }
    if let Some(tools) = &tools {
        let _ = writeln!(
            report,
            "build tools: {tools} use hoard in each job, with a token of the job's own, from its first JavaScript action on (docs/build-tools/)"
        );
    }
    if let Some(command) = &gocacheprog {
        let _ = writeln!(
            report,
            "go: GOCACHEPROG runs {command}: keep this binary there, readable by the runner's user"
        );
    }
    if !runner.configured {
        let _ = writeln!(
            report,
            "note: {} has no .runner yet: run config.sh to register it",
            runner.root.display()
        );
    }
    Ok(report)
}

/// `hoard runner undo`: removes hoard's block from `.env` and its files.
pub fn undo(args: &DirArgs) -> Result<String, Refusal> {
    let runner = checks::runner_dir(&args.runner_dir).map_err(Refusal)?;
    let env_path = runner.env_file();
    let mut report = String::new();
    // Both checked before anything changes; nothing is followed (dir_fs).
    let fs = dir_fs::RunnerFs::open(&runner.root).map_err(Refusal)?;
    let existing = fs.read_env().map_err(Refusal)?;
    let hoard = fs.hoard_dir(false).map_err(Refusal)?;
    if let Some(existing) = &existing {
        let before = &existing.text;
        let after =
            env_file::undo(before).map_err(|e| Refusal(format!("{}: {e}", env_path.display())))?;
        if after != *before {
            fs.write_env(&after, Some(existing)).map_err(Refusal)?;
            let _ = writeln!(
                report,
                "changed {}:\n{}",
                env_path.display(),
                env_file::describe(before, &after)
            );
        }
    }
    if let Some(dir) = &hoard {
        for (name, _) in files::all() {
            let path = fs.hoard_path(name);
            if dir_fs::remove(dir, name)
                .map_err(|e| Refusal(format!("cannot remove {}: {e}", path.display())))?
            {
                let _ = writeln!(report, "removed {}", path.display());
            }
        }
        // Only if empty: anything else in it is not hoard's.
        fs.remove_hoard_dir_if_empty();
    }
    if report.is_empty() {
        let _ = writeln!(report, "nothing to undo in {}", runner.root.display());
    } else {
        let _ = writeln!(
            report,
            "restart the runner so that it reads .env again: {}",
            runner.restart_command()
        );
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_urls_get_their_slash_and_keep_to_the_root() {
        assert_eq!(
            client_url("--url", "http://cache.internal:3000", true)
                .unwrap()
                .as_str(),
            "http://cache.internal:3000/"
        );
        assert!(client_url("--url", "http://cache.internal:3000/ns/", true).is_err());
        assert_eq!(
            client_url("--cache-url", "http://cache.internal:3000/ns", false)
                .unwrap()
                .as_str(),
            "http://cache.internal:3000/ns/"
        );
        assert!(client_url("--url", "ftp://cache.internal/", true).is_err());
        assert!(client_url("--url", "cache.internal:3000", true).is_err());
        for raw in ["http://u:pw@cache.internal/", "http://pw@cache.internal/"] {
            let why = client_url("--url", raw, true).unwrap_err().0;
            assert!(!why.contains("pw"), "{why}");
            assert!(why.contains("http://cache.internal/"), "{why}");
        }
    }
}
