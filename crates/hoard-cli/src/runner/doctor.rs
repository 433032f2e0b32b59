//! `hoard runner doctor`: whether a runner directory sends its jobs' cache calls to hoard, as
//! `runner setup` left it. Checks the runner directory and version, a leftover DLL patch, the
//! `.env` lines in effect, that the preload and hook are the ones this hoard writes, the URL
//! (slash, loopback, reachable from here) and forwarding. Findings in `hoard doctor`'s form.

use std::path::Path;

use url::Url;

use super::checks::{self, Readiness};
use super::env_file::{self, CACHE_URL, CHAINED_HOOK, HOOK, NODE_OPTIONS, RESULTS_URL};
use super::{files, GITHUB_RESULTS, PROBE_TIMEOUT};
use crate::doctor::{Finding, Report};

/// Runs every check on the runner directory `dir`.
pub async fn run(dir: &Path) -> Report {
    let mut findings = Vec::new();
    let runner = match checks::runner_dir(dir) {
        Ok(runner) => runner,
        Err(why) => {
            findings.push(Finding::fail(
                why,
                "give --runner-dir the runner's directory",
            ));
            return Report { findings };
        }
    };
    let setup_again = format!(
        "hoard runner setup --runner-dir {} --url URL, then restart the runner: {}",
        runner.root.display(),
        runner.restart_command()
    );
    findings.push(Finding::ok(format!(
        "runner directory: {}{}",
        runner.root.display(),
        if runner.configured {
            ""
        } else {
            " (not registered yet: no .runner)"
        }
    )));
    match runner.version() {
        Ok(v) => match checks::parse_version(&v) {
            Some(parsed) if parsed < checks::MIN_RUNNER => findings.push(Finding::warn(
                format!("runner version {v}: older than any GitHub still accepts"),
                "update the runner (the set-up survives updates: they replace bin/ and externals/ only)",
            )),
            _ => findings.push(Finding::ok(format!("runner version {v}"))),
        },
        Err(why) => findings.push(Finding::warn(
            format!("runner version unknown: {why}"),
            "check that bin/Runner.Listener runs on this machine",
        )),
    }
    match runner.dll_patches() {
        Some(found) if !found.is_empty() => findings.push(Finding::fail(
            format!(
                "bin/Runner.Worker.dll is patched the old way ({}): the runner never sets ACTIONS_RESULTS_URL, so the preload has nothing to replace",
                found.join(", ")
            ),
            runner.dll_restore_hint(),
        )),
        Some(_) => findings.push(Finding::ok("bin/Runner.Worker.dll is not patched")),
        None => findings.push(Finding::warn(
            "bin/Runner.Worker.dll cannot be read",
            "check the runner's installation",
        )),
    }

    let env = std::fs::read_to_string(runner.env_file()).unwrap_or_default();
    let preload_path = runner.hoard_dir().join(files::PRELOAD_NAME);
    let hook_path = runner.hoard_dir().join(files::HOOK_NAME);
    if !env_file::has_block(&env) {
        findings.push(Finding::fail(
            format!(
                "{} has no block from hoard runner setup",
                runner.env_file().display()
            ),
            setup_again.clone(),
        ));
        return Report { findings };
    }
    let require = env_file::require_option(&preload_path.to_string_lossy()).unwrap_or_default();
    match env_file::last_value(&env, NODE_OPTIONS) {
        Some(v) if env_file::loads(v, &require) => {
            findings.push(Finding::ok(format!(".env: NODE_OPTIONS={v}")));
            // The block copies the NODE_OPTIONS before it: an edit above it since is hidden.
            let before = env_file::undo(&env).unwrap_or_default();
            let expected = env_file::merge_node_options(
                env_file::last_value(&before, NODE_OPTIONS).unwrap_or(""),
                &require,
            );
            if v != expected {
                findings.push(Finding::warn(
                    format!(".env: NODE_OPTIONS was changed above hoard's block since setup (now {expected:?} there); the block's copy wins"),
                    setup_again.clone(),
                ));
            }
        }
        other => findings.push(Finding::fail(
            format!(
                ".env: NODE_OPTIONS in effect ({}) does not load {}",
                other.unwrap_or("unset"),
                preload_path.display()
            ),
            setup_again.clone(),
        )),
    }
    match env_file::last_value(&env, HOOK) {
        Some(v) if Path::new(v) == hook_path => {
            findings.push(Finding::ok(format!(".env: {HOOK}={v}")))
        }
        other => findings.push(Finding::fail(
            format!(
                ".env: {HOOK} in effect ({}) is not hoard's hook, so a job does not fall back to GitHub when hoard is down",
                other.unwrap_or("unset")
            ),
            setup_again.clone(),
        )),
    }
    if let Some(chained) = env_file::last_value(&env, CHAINED_HOOK) {
        if Path::new(chained).is_file() {
            findings.push(Finding::ok(format!(
                ".env: the hook that was there before, {chained}, runs after hoard's"
            )));
        } else {
            findings.push(Finding::warn(
                format!(
                    ".env: {CHAINED_HOOK}={chained} does not exist: every job's hook will fail"
                ),
                format!("restore {chained}, or remove the {CHAINED_HOOK} line"),
            ));
        }
    }
    for name in ["ACTIONS_RESULTS_URL", "ACTIONS_CACHE_URL"] {
        if let Some(v) = env_file::last_value(&env, name) {
            findings.push(Finding::warn(
                format!(".env sets {name}={v} (the old set-up): the runner overrides it for JavaScript actions, and run: steps see it"),
                format!("remove the {name} line from .env"),
            ));
        }
    }
    for (name, expected) in files::all() {
        let path = runner.hoard_dir().join(name);
        match std::fs::read(&path) {
            Ok(text) if text == expected.as_bytes() => findings.push(Finding::ok(format!(
                "{} is the one this hoard ({}) writes",
                path.display(),
                env!("CARGO_PKG_VERSION")
            ))),
            Ok(_) => findings.push(Finding::fail(
                format!(
                    "{} differs from the one this hoard ({}) writes: edited, or written by another version",
                    path.display(),
                    env!("CARGO_PKG_VERSION")
                ),
                setup_again.clone(),
            )),
            Err(e) => findings.push(Finding::fail(
                format!("cannot read {}: {e}", path.display()),
                setup_again.clone(),
            )),
        }
    }

    findings.extend(build_tools_findings(&env));
    let results = env_file::last_value(&env, RESULTS_URL).map(str::to_owned);
    let cache = env_file::last_value(&env, CACHE_URL).map(str::to_owned);
    for (name, raw) in [(RESULTS_URL, &results), (CACHE_URL, &cache)] {
        let Some(raw) = raw else { continue };
        findings.extend(url_findings(name, raw, name == RESULTS_URL));
        let Ok(url) = Url::parse(raw) else { continue };
        if checks::is_loopback_host(&url) {
            continue; // Said above.
        }
        if let Some(addrs) = checks::resolves_to_loopback(&url).await {
            let addrs: Vec<String> = addrs.iter().map(ToString::to_string).collect();
            findings.push(Finding::warn(
                format!(
                    ".env: {name}={raw}: {} resolves to {} here, a loopback address: BuildKit's container (docker/build-push-action type=gha) cannot reach it",
                    url.host_str().unwrap_or_default(),
                    addrs.join(", ")
                ),
                "use this machine's LAN address, or a name that resolves to it",
            ));
        }
    }
    let Some(probe) = results.as_deref().or(cache.as_deref()) else {
        findings.push(Finding::fail(
            format!(".env sets neither {RESULTS_URL} nor {CACHE_URL}"),
            setup_again,
        ));
        return Report { findings };
    };
    let Ok(base) = Url::parse(probe) else {
        return Report { findings };
    };
    match checks::readiness(&base, PROBE_TIMEOUT).await {
        Readiness::Ready { forwards_to } => {
            findings.push(Finding::ok(format!("hoard at {base} answers ready from this machine")));
            match (forwards_to, results.is_some()) {
                (Some(to), _) => findings.push(Finding::ok(format!(
                    "hoard forwards the results service (artifacts) to {to}"
                ))),
                (None, true) => findings.push(Finding::fail(
                    format!("hoard at {base} does not forward the results service: every job falls back to GitHub for cache v2 and artifacts (the hook says so in a warning)"),
                    format!("start hoard with --upstream-results-url {GITHUB_RESULTS} (HOARD_UPSTREAM_RESULTS_URL; on GHE.com your enterprise's results service)"),
                )),
                (None, false) => {}
            }
        }
        Readiness::NotReady(why) => findings.push(Finding::fail(
            format!("hoard at {base} is not ready ({why}): jobs fall back to GitHub's cache"),
            "see hoard's log, and its /readyz answer",
        )),
        Readiness::Unreachable(why) => findings.push(Finding::fail(
            format!("hoard at {base} does not answer from this machine ({why}): jobs fall back to GitHub's cache"),
            "start hoard, or check the address, firewall and DNS between this machine and hoard",
        )),
    }
    Report { findings }
}

/// Findings about `--build-tools`: which tools jobs hand hoard to, and whether Go's cache
/// program is there to run (Go stops a build whose GOCACHEPROG cannot start; the preload then
/// leaves it unset, with a warning in each job).
fn build_tools_findings(env: &str) -> Vec<Finding> {
    let mut out = Vec::new();
    let Some(tools) = env_file::last_value(env, env_file::BUILD_TOOLS) else {
        return out;
    };
    out.push(Finding::ok(format!(
        "build tools: {tools} get hoard and a token of the job's own in each job"
    )));
    if let Some(command) = env_file::last_value(env, env_file::GOCACHEPROG) {
        let program = command.split(' ').next().unwrap_or_default();
        let runnable = std::fs::metadata(program).is_ok_and(|m| {
            use std::os::unix::fs::PermissionsExt;
            m.is_file() && m.permissions().mode() & 0o111 != 0
        });
        if runnable {
            out.push(Finding::ok(format!("GOCACHEPROG runs {command}")));
        } else {
            out.push(Finding::fail(
                format!("{program} (GOCACHEPROG for go) is not an executable file: Go builds in jobs do not use hoard"),
                "install hoard there again, or run hoard runner setup --build-tools again with the hoard binary that stays",
            ));
        }
    }
    out
}

/// Findings about one of the URLs in `.env`.
fn url_findings(name: &str, raw: &str, root_only: bool) -> Vec<Finding> {
    let mut out = Vec::new();
    let Ok(url) = Url::parse(raw) else {
        out.push(Finding::fail(
            format!(".env: {name}={raw} is not a URL"),
            "run hoard runner setup again with a URL such as http://cache.internal:3000/",
        ));
        return out;
    };
    if !raw.ends_with('/') {
        out.push(Finding::fail(
            format!(".env: {name}={raw} has no trailing slash: v1 clients and sccache append to it as given"),
            format!("run hoard runner setup again (it adds the slash): {raw}/"),
        ));
    }
    if root_only && url.path() != "/" {
        out.push(Finding::fail(
            format!(".env: {name}={raw} has a path, which @actions/cache drops"),
            "serve hoard at the root of its origin",
        ));
    }
    if checks::is_loopback_host(&url) {
        out.push(Finding::warn(
            format!(".env: {name}={raw} is a loopback or link-local address: BuildKit's container (docker/build-push-action type=gha) cannot reach it"),
            "use an address of this machine that containers reach",
        ));
    } else {
        out.push(Finding::ok(format!(".env: {name}={raw}")));
    }
    out
}
