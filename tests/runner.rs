//! `hoard runner setup | undo | doctor` on fixture runner directories (the files `config.sh`
//! leaves, with the runner's Node linked in), and the real clients started the way the runner
//! starts a JavaScript action: the runner's environment read from the `.env` that setup wrote,
//! plus what the runner sets per step, with `ACTIONS_RESULTS_URL` pointing at a recording
//! stand-in for GitHub's results service.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::results::{Results, ARTIFACTS, CACHE};
use common::TestServer;
use serde_json::Value;

const VERSION: &str = "2.336.0";

/// A runner directory as `config.sh` leaves it, with `.env` holding `env`.
fn fixture(env: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for sub in ["bin", "externals/node20/bin", "_work"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
    }
    write_script(&root.join("run.sh"), "#!/bin/bash\necho runner\n");
    write_script(&root.join("config.sh"), "#!/bin/bash\n");
    write_script(
        &root.join("bin/Runner.Listener"),
        &format!("#!/bin/sh\necho {VERSION}\n"),
    );
    std::fs::write(
        root.join("bin/Runner.Worker.dll"),
        dll("ACTIONS_RESULTS_URL"),
    )
    .unwrap();
    std::os::unix::fs::symlink(node(), root.join("externals/node20/bin/node")).unwrap();
    std::fs::write(root.join(".runner"), "{}\n").unwrap();
    std::fs::write(root.join(".env"), env).unwrap();
    dir
}

fn write_script(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A stand-in for `Runner.Worker.dll` holding `name` as .NET keeps it (UTF-16LE).
fn dll(name: &str) -> Vec<u8> {
    let mut bytes = b"MZ\x90\x00\x03\x00 a .NET assembly ".to_vec();
    bytes.extend(name.encode_utf16().flat_map(u16::to_le_bytes));
    bytes.extend(b"\x00\x00 more");
    bytes
}

/// The `node` on PATH, standing in for the runner's bundled one.
fn node() -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join("node"))
                .find(|p| p.is_file())
        })
        .expect("node is needed on PATH")
}

/// `hoard ARGS`, as its own process.
async fn hoard(args: &[&str]) -> Output {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_hoard"))
            .args(&args)
            .env_remove("HOARD_UPSTREAM_RESULTS_URL")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn setup(dir: &Path, url: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "runner",
        "setup",
        "--runner-dir",
        dir.to_str().unwrap(),
        "--url",
        url,
    ];
    args.extend_from_slice(extra);
    hoard(&args).await
}

/// The runner's environment from `.env`, read as the runner reads it: `KEY=VALUE` split at the
/// first `=`, in order, a later line winning.
fn dotenv(dir: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(dir.join(".env")).unwrap();
    let mut env = BTreeMap::new();
    for line in text.lines() {
        if let Some((k, v)) = line.split_once('=') {
            if !k.is_empty() {
                env.insert(k.to_owned(), v.to_owned());
            }
        }
    }
    env
}

/// A hoard that forwards the results service to `upstream`.
async fn forwarding_hoard(upstream: &str) -> TestServer {
    TestServer::start_with(&["--upstream-results-url", upstream]).await
}

/// One job on the fixture runner: its temporary directory and workspace.
struct Job {
    runner: PathBuf,
    temp: tempfile::TempDir,
    workspace: tempfile::TempDir,
    /// What the runner sets for a JavaScript action step.
    step_env: Vec<(String, String)>,
}

impl Job {
    fn new(runner: &Path, github: &str) -> Self {
        let temp = tempfile::tempdir().unwrap();
        let workspace = tempfile::tempdir().unwrap();
        let step_env = [
            ("ACTIONS_RESULTS_URL", format!("{github}/")),
            ("ACTIONS_CACHE_URL", format!("{github}/v1-cache-id/")),
            ("ACTIONS_CACHE_SERVICE_V2", "True".to_owned()),
            ("ACTIONS_RUNTIME_TOKEN", common::main_token()),
            ("GITHUB_SERVER_URL", "https://github.com".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        Self {
            runner: runner.to_owned(),
            temp,
            workspace,
            step_env,
        }
    }

    /// The environment every step of the job gets: the runner's own (its process's, then
    /// `.env`) and the job's directories.
    fn base_command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap())
            .env(
                "HOME",
                std::env::var("HOME").unwrap_or_else(|_| "/tmp".into()),
            )
            .envs(dotenv(&self.runner))
            .env("RUNNER_TEMP", self.temp.path())
            .env("GITHUB_WORKSPACE", self.workspace.path())
            .current_dir(self.workspace.path());
        cmd
    }

    /// Runs the job-started hook as the runner does (`bash -e PATH`); its exit code and output.
    async fn hook(&self) -> (i32, String) {
        let hook = dotenv(&self.runner)["ACTIONS_RUNNER_HOOK_JOB_STARTED"].clone();
        let mut cmd = self.base_command(Path::new("bash"));
        cmd.args(["-e", &hook]);
        let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap();
        let (stdout, stderr) = text(&out);
        (out.status.code().unwrap(), format!("{stdout}{stderr}"))
    }

    /// Runs `script ARGS` from tests/e2e with the runner's Node, as the runner starts an action:
    /// the job's environment plus the step's. Its `RESULT`, its `ENV` line and its output.
    async fn action(
        &self,
        script: &str,
        extra: &[(&str, &str)],
        args: &[&str],
    ) -> (Value, Value, String) {
        let e2e = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e");
        assert!(
            e2e.join("node_modules/@actions/cache").exists(),
            "the real clients are not installed: run `npm ci --prefix tests/e2e` (scripts/test does)"
        );
        let mut cmd = self.base_command(&self.runner.join("externals/node20/bin/node"));
        cmd.arg(e2e.join(script))
            .args(args)
            .envs(self.step_env.iter().map(|(k, v)| (k, v)))
            .envs(extra.iter().copied())
            .env("HOARD_E2E_SHOW_ENV", "1");
        let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap();
        let (result, all) = common::node_result(out);
        let env = all
            .lines()
            .find_map(|l| l.strip_prefix("ENV "))
            .map(|l| serde_json::from_str(l).unwrap())
            .unwrap_or(Value::Null);
        (result, env, all)
    }

    /// The job's runtime token.
    fn token(&self) -> &str {
        let (_, token) = self
            .step_env
            .iter()
            .find(|(k, _)| k == "ACTIONS_RUNTIME_TOKEN")
            .unwrap();
        token
    }

    /// The URL variables a Node process of this job sees: an action's (with the step's
    /// variables) or any other (a `run:` step's, a tool's).
    async fn node_sees(&self, action: bool) -> Value {
        let mut cmd = self.base_command(&self.runner.join("externals/node20/bin/node"));
        cmd.args([
            "-e",
            "const e = process.env; console.log(JSON.stringify({ results: e.ACTIONS_RESULTS_URL ?? null, cache: e.ACTIONS_CACHE_URL ?? null, original: e.HOARD_ORIGINAL_ACTIONS_RESULTS_URL ?? null }))",
        ]);
        if action {
            cmd.envs(self.step_env.iter().map(|(k, v)| (k, v)));
        }
        let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{stdout}{stderr}");
        serde_json::from_str(stdout.trim()).unwrap()
    }

    /// The variables `names` as a JavaScript action of this job sees them (the step's variables
    /// plus `extra`): `null` for one that is not set.
    async fn action_sees(&self, extra: &[(&str, &str)], names: &[&str]) -> Value {
        let mut cmd = self.base_command(&self.runner.join("externals/node20/bin/node"));
        cmd.args([
            "-e",
            "const o = {}; for (const n of process.argv.slice(1)) o[n] = process.env[n] ?? null; console.log(JSON.stringify(o))",
        ])
        .args(names)
        .envs(self.step_env.iter().map(|(k, v)| (k, v)))
        .envs(extra.iter().copied());
        let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{stdout}{stderr}");
        serde_json::from_str(stdout.trim()).unwrap()
    }

    fn marker(&self) -> Option<String> {
        std::fs::read_to_string(self.temp.path().join(".hoard-fallback")).ok()
    }

    fn write(&self, rel: &str, data: &[u8]) {
        let path = self.workspace.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, data).unwrap();
    }

    fn read(&self, rel: &str) -> Vec<u8> {
        std::fs::read(self.workspace.path().join(rel)).unwrap()
    }

    fn remove(&self, rel: &str) {
        std::fs::remove_dir_all(self.workspace.path().join(rel)).unwrap();
    }
}

/// The slow case, with one hoard: the real clients through the preload, then the fallback
/// with hoard stopped.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs the real @actions/cache and @actions/artifact clients"
)]
async fn real_clients_use_hoard_through_the_preload_and_github_when_hoard_is_down() {
    let github = Results::start().await;
    let upstream = Results::start().await;
    let srv = forwarding_hoard(&format!("{}/", upstream.base)).await;
    let runner = fixture("LANG=C.UTF-8\n");
    let out = setup(runner.path(), &srv.base, &["--allow-loopback"]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");

    // A job starts: the hook finds hoard ready and leaves no marker.
    let job = Job::new(runner.path(), &github.base);
    let (code, said) = job.hook().await;
    assert_eq!(code, 0, "{said}");
    assert!(!said.contains("::warning::"), "{said}");
    assert!(!job.temp.path().join(".hoard-fallback").exists());

    // @actions/cache 6.3.0 from a CommonJS and from an ES-module entry point.
    let hoard_url = format!("{}/", srv.base);
    for (script, module, key) in [
        ("client.cjs", "commonjs", "cjs-key"),
        ("client.mjs", "es-module", "esm-key"),
    ] {
        let data = common::random_bytes(200_000, key.len() as u64);
        job.write("f/data.bin", &data);
        let (saved, env, out) = job.action(script, &[], &["save", key, "f"]).await;
        assert!(saved.as_i64().unwrap() > 0, "{out}");
        assert_eq!(env["module"], module, "{out}");
        assert_eq!(env["ACTIONS_RESULTS_URL"], hoard_url.as_str(), "{out}");
        assert_eq!(
            env["HOARD_ORIGINAL_ACTIONS_RESULTS_URL"],
            format!("{}/", github.base).as_str(),
            "GitHub's URL is kept: {out}"
        );
        job.remove("f");
        let (restored, _, out) = job.action(script, &[], &["restore", key, "f"]).await;
        assert_eq!(restored, key, "{out}");
        assert_eq!(job.read("f/data.bin"), data);
    }
    // The v1 client (3.2.4) through ACTIONS_CACHE_URL.
    let v1 = [("HOARD_E2E_CLIENT", "3")];
    let data = common::random_bytes(100_000, 3);
    job.write("g/data.bin", &data);
    let (saved, env, out) = job
        .action("client.cjs", &v1, &["save", "v1-key", "g"])
        .await;
    assert!(saved.as_i64().unwrap() > 0, "{out}");
    assert_eq!(env["ACTIONS_CACHE_URL"], hoard_url.as_str(), "{out}");
    job.remove("g");
    let (restored, _, out) = job
        .action("client.cjs", &v1, &["restore", "v1-key", "g"])
        .await;
    assert_eq!(restored, "v1-key", "{out}");
    assert_eq!(job.read("g/data.bin"), data);
    assert_eq!(common::table_rows(srv.data.path(), "entries"), 3);

    // @actions/artifact: its calls reach the results service through hoard, with the job's token.
    job.write("out/report.txt", &b"all green\n".repeat(100));
    let root = job.workspace.path().join("out");
    let file = root.join("report.txt");
    let (uploaded, _, out) = job
        .action(
            "artifact.mjs",
            &[],
            &[
                "upload",
                "report",
                root.to_str().unwrap(),
                file.to_str().unwrap(),
            ],
        )
        .await;
    assert_eq!(uploaded["id"], 42, "{out}");
    let calls: Vec<_> = upstream
        .seen()
        .into_iter()
        .filter(|s| s.path.starts_with(ARTIFACTS))
        .collect();
    let methods: Vec<&str> = calls.iter().map(|s| &s.path[ARTIFACTS.len()..]).collect();
    assert_eq!(methods, ["CreateArtifact", "FinalizeArtifact"]);
    let bearer = format!("Bearer {}", job.token());
    assert!(
        calls
            .iter()
            .all(|s| s.authorization.as_deref() == Some(&bearer)),
        "{calls:?}"
    );
    assert!(
        !upstream.blob().is_empty(),
        "the artifact's bytes were stored"
    );
    assert!(
        github.seen().is_empty(),
        "GitHub's URL got nothing while hoard was up: {:?}",
        github.paths()
    );

    // hoard stops. The next job's hook says so and leaves the marker; the same client's save
    // and restore go to GitHub's URL.
    let hoard_base = srv.base.clone();
    srv.stop().await;
    let job = Job::new(runner.path(), &github.base);
    let (code, said) = job.hook().await;
    assert_eq!(code, 0, "the hook never fails the job: {said}");
    let warning = said
        .lines()
        .find(|l| l.starts_with("::warning::"))
        .unwrap_or_else(|| panic!("no warning: {said}"));
    assert!(warning.contains(&hoard_base), "{warning}");
    assert!(warning.contains("ECONNREFUSED"), "the cause: {warning}");
    assert!(job.temp.path().join(".hoard-fallback").exists());
    job.write("f/data.bin", b"fallback");
    let (restored, env, out) = job
        .action("client.mjs", &[], &["restore", "down-key", "f"])
        .await;
    assert_eq!(restored, Value::Null, "{out}");
    assert_eq!(
        env["ACTIONS_RESULTS_URL"],
        format!("{}/", github.base).as_str(),
        "{out}"
    );
    assert_eq!(
        env["HOARD_ORIGINAL_ACTIONS_RESULTS_URL"],
        Value::Null,
        "{out}"
    );
    let (saved, _, out) = job
        .action("client.cjs", &[], &["save", "down-key", "f"])
        .await;
    assert_eq!(saved, -1, "GitHub's stand-in reserves nothing: {out}");
    let bearer = format!("Bearer {}", job.token());
    let cache_calls: Vec<(String, Option<String>)> = github
        .seen()
        .into_iter()
        .map(|s| (s.path.replace(CACHE, ""), s.authorization))
        .collect();
    assert_eq!(
        cache_calls,
        [
            ("GetCacheEntryDownloadURL".to_owned(), Some(bearer.clone())),
            ("CreateCacheEntry".to_owned(), Some(bearer.clone())),
        ]
    );
}

#[tokio::test]
async fn setup_twice_then_undo_gives_back_the_env_byte_for_byte() {
    let upstream = Results::start().await;
    let srv = forwarding_hoard(&upstream.base).await;
    let before = "LANG=C.UTF-8\nNODE_OPTIONS=--max-old-space-size=4096\nACTIONS_RUNNER_HOOK_JOB_STARTED=/opt/hooks/start.sh\nPATH=/usr/bin:/bin";
    let runner = fixture(before);
    std::fs::write(
        runner.path().join(".service"),
        "actions.runner.o-r.x.service\n",
    )
    .unwrap();
    let root = runner.path().canonicalize().unwrap();

    let out = setup(runner.path(), &srv.base, &["--allow-loopback"]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("sudo ./svc.sh stop && sudo ./svc.sh start"),
        "{stdout}"
    );
    let env = dotenv(runner.path());
    let preload = root.join(".hoard/preload.cjs");
    let hook = root.join(".hoard/job-started.sh");
    assert_eq!(
        env["NODE_OPTIONS"],
        format!("--max-old-space-size=4096 --require {}", preload.display())
    );
    assert_eq!(
        env["ACTIONS_RUNNER_HOOK_JOB_STARTED"],
        hook.to_str().unwrap()
    );
    assert_eq!(env["HOARD_CHAINED_JOB_STARTED_HOOK"], "/opt/hooks/start.sh");
    assert_eq!(env["HOARD_RESULTS_URL"], format!("{}/", srv.base));
    assert_eq!(env["HOARD_CACHE_URL"], format!("{}/", srv.base));
    assert_eq!(env["PATH"], "/usr/bin:/bin", "other lines are kept");
    assert!(preload.is_file() && hook.is_file());
    let after = std::fs::read(runner.path().join(".env")).unwrap();

    // A second run changes nothing.
    let out = setup(runner.path(), &srv.base, &["--allow-loopback"]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("nothing to change"), "{stdout}");
    assert_eq!(std::fs::read(runner.path().join(".env")).unwrap(), after);

    // --dry-run after undo says what it would do and does nothing.
    let out = hoard(&[
        "runner",
        "undo",
        "--runner-dir",
        runner.path().to_str().unwrap(),
    ])
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(
        std::fs::read_to_string(runner.path().join(".env")).unwrap(),
        before
    );
    assert!(!root.join(".hoard").exists(), "{stdout}");
    let out = setup(runner.path(), &srv.base, &["--allow-loopback", "--dry-run"]).await;
    let (stdout, _) = text(&out);
    assert!(out.status.success());
    assert!(stdout.contains("+ HOARD_RESULTS_URL="), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(runner.path().join(".env")).unwrap(),
        before
    );
    assert!(!root.join(".hoard").exists());
}

#[tokio::test]
async fn an_existing_hook_still_runs_after_hoards_and_keeps_its_exit_status() {
    let upstream = Results::start().await;
    let srv = forwarding_hoard(&upstream.base).await;
    let hooks = tempfile::tempdir().unwrap();
    let ran = hooks.path().join("ran");
    let theirs = hooks.path().join("start.sh");
    std::fs::write(
        &theirs,
        format!("echo their hook ran > {}\nexit 3\n", ran.display()),
    )
    .unwrap();
    let runner = fixture(&format!(
        "ACTIONS_RUNNER_HOOK_JOB_STARTED={}\n",
        theirs.display()
    ));
    let out = setup(runner.path(), &srv.base, &["--allow-loopback"]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    let job = Job::new(runner.path(), "http://127.0.0.1:9");
    let (code, said) = job.hook().await;
    assert_eq!(code, 3, "the existing hook's status: {said}");
    assert!(ran.is_file(), "{said}");
    assert!(!said.contains("::warning::"), "{said}");
}

/// A hoard restarted without forwarding: the hook says so, and the job's actions keep GitHub's
/// results URL (artifacts, cache v2) while v1 still goes to hoard. Processes that are not
/// actions are never touched.
#[tokio::test]
async fn a_hoard_that_stops_forwarding_sends_the_jobs_results_calls_to_github() {
    let upstream = Results::start().await;
    let forwarding = forwarding_hoard(&upstream.base).await;
    let runner = fixture("");
    let out = setup(runner.path(), &forwarding.base, &["--allow-loopback"]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    let github = "http://127.0.0.1:9";
    let job = Job::new(runner.path(), github);
    assert_eq!(
        job.node_sees(false).await,
        serde_json::json!({ "results": null, "cache": null, "original": null })
    );
    let hoard_url = format!("{}/", forwarding.base);
    assert_eq!(
        job.node_sees(true).await,
        serde_json::json!({ "results": hoard_url, "cache": hoard_url, "original": format!("{github}/") })
    );

    // The same runner, now pointed at a hoard without --upstream-results-url.
    let plain = TestServer::start().await;
    let env_path = runner.path().join(".env");
    let env = std::fs::read_to_string(&env_path).unwrap();
    std::fs::write(&env_path, env.replace(&forwarding.base, &plain.base)).unwrap();
    let job = Job::new(runner.path(), github);
    let (code, said) = job.hook().await;
    assert_eq!(code, 0, "{said}");
    assert!(
        said.lines()
            .any(|l| l.starts_with("::warning::") && l.contains("does not forward")),
        "{said}"
    );
    assert_eq!(
        job.node_sees(true).await,
        serde_json::json!({ "results": format!("{github}/"), "cache": format!("{}/", plain.base), "original": null })
    );
}

/// A hoard that accepts the connection and never answers: the hook gives up after its 2 s.
#[tokio::test]
async fn the_hook_gives_up_on_a_hoard_that_does_not_answer() {
    let upstream = Results::start().await;
    let srv = forwarding_hoard(&upstream.base).await;
    let runner = fixture("");
    let out = setup(runner.path(), &srv.base, &["--allow-loopback"]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_base = format!("http://{}", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            open.push(conn);
        }
    });
    let env_path = runner.path().join(".env");
    let env = std::fs::read_to_string(&env_path).unwrap();
    std::fs::write(&env_path, env.replace(&srv.base, &silent_base)).unwrap();
    let job = Job::new(runner.path(), "http://127.0.0.1:9");
    let (code, said) = job.hook().await;
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("no answer within 2 s"), "{said}");
    assert_eq!(
        std::fs::read_to_string(job.temp.path().join(".hoard-fallback")).unwrap(),
        "all\n"
    );
    held.abort();
}

#[tokio::test]
async fn a_loopback_url_is_refused_unless_allowed() {
    let runner = fixture("LANG=C.UTF-8\n");
    for url in [
        "http://127.0.0.1:3000/",
        "http://localhost:3000",
        "http://169.254.1.1/",
    ] {
        let out = setup(runner.path(), url, &[]).await;
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{url}: {stderr}");
        assert!(stderr.contains("loopback or link-local"), "{stderr}");
        assert!(
            stderr.contains("BuildKit") && stderr.contains("container"),
            "{stderr}"
        );
        assert!(stderr.contains("--allow-loopback"), "{stderr}");
    }
    assert_eq!(
        std::fs::read_to_string(runner.path().join(".env")).unwrap(),
        "LANG=C.UTF-8\n"
    );
    assert!(!runner.path().join(".hoard").exists());
}

#[tokio::test]
async fn a_runner_patched_the_old_way_is_found_and_how_to_restore_it_is_said() {
    let runner = fixture("ACTIONS_RESULTS_URL=http://cache.internal:3000/\n");
    let worker = runner.path().join("bin/Runner.Worker.dll");
    std::fs::write(&worker, dll("ACTIONS_RESULTS_ORL")).unwrap();
    let url = "http://cache.internal:3000/";
    let out = setup(runner.path(), url, &[]).await;
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("patched the old way (ACTIONS_RESULTS_ORL"),
        "{stderr}"
    );
    assert!(stderr.contains("reinstall"), "{stderr}");

    std::fs::write(
        worker.with_extension("dll.orig"),
        dll("ACTIONS_RESULTS_URL"),
    )
    .unwrap();
    let out = setup(runner.path(), url, &[]).await;
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cp ") && stderr.contains("Runner.Worker.dll.orig"),
        "{stderr}"
    );
    assert!(!runner.path().join(".hoard").exists());

    let out = hoard(&[
        "runner",
        "doctor",
        "--runner-dir",
        runner.path().to_str().unwrap(),
    ])
    .await;
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("FAIL") && l.contains("patched the old way")),
        "{stdout}"
    );
}

#[tokio::test]
async fn a_directory_that_is_not_a_runner_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(".env"), "A=b\n").unwrap();
    std::fs::create_dir(dir.path().join("bin")).unwrap();
    let out = setup(dir.path(), "http://cache.internal:3000/", &[]).await;
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is not a runner directory"), "{stderr}");
    assert!(stderr.contains("bin/Runner.Listener"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join(".env")).unwrap(),
        "A=b\n"
    );
    assert!(!dir.path().join(".hoard").exists());
}

#[tokio::test]
async fn a_hoard_that_does_not_forward_is_refused_unless_cache_only() {
    let srv = TestServer::start().await;
    let runner = fixture("LANG=C.UTF-8\n");
    let out = setup(runner.path(), &srv.base, &["--allow-loopback"]).await;
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("does not forward"), "{stderr}");
    assert!(
        stderr.contains(
            "--upstream-results-url https://results-receiver.actions.githubusercontent.com/"
        ),
        "{stderr}"
    );
    assert!(!runner.path().join(".hoard").exists());

    let out = setup(
        runner.path(),
        &srv.base,
        &["--allow-loopback", "--cache-only"],
    )
    .await;
    assert!(out.status.success(), "{:?}", text(&out));
    let env = dotenv(runner.path());
    assert_eq!(env["HOARD_CACHE_URL"], format!("{}/", srv.base));
    assert!(!env.contains_key("HOARD_RESULTS_URL"));
}

#[tokio::test]
async fn doctor_passes_a_set_up_runner_and_names_what_breaks() {
    let upstream = Results::start().await;
    let srv = forwarding_hoard(&upstream.base).await;
    let runner = fixture("LANG=C.UTF-8\n");
    let dir = runner.path().to_str().unwrap().to_owned();
    let out = setup(runner.path(), &srv.base, &["--allow-loopback"]).await;
    assert!(out.status.success(), "{:?}", text(&out));

    let out = doctor(&dir).await;
    let (stdout, _) = text(&out);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains(&format!("runner version {VERSION}")),
        "{stdout}"
    );
    assert!(stdout.contains("answers ready"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "forwards the results service (artifacts) to {}",
            upstream.base
        )),
        "{stdout}"
    );
    assert!(!stdout.contains("FAIL"), "{stdout}");

    // An edited preload.
    let preload = runner.path().join(".hoard/preload.cjs");
    let original = std::fs::read(&preload).unwrap();
    std::fs::write(&preload, b"// edited\n").unwrap();
    let out = doctor(&dir).await;
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("FAIL") && l.contains("preload.cjs differs")),
        "{stdout}"
    );
    std::fs::write(&preload, original).unwrap();

    // hoard stopped.
    srv.stop().await;
    let out = doctor(&dir).await;
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("FAIL") && l.contains("does not answer")),
        "{stdout}"
    );

    // After undo, the .env lines are missing.
    let out = hoard(&["runner", "undo", "--runner-dir", &dir]).await;
    assert!(out.status.success());
    let out = doctor(&dir).await;
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("has no block from hoard runner setup"),
        "{stdout}"
    );
}

/// `sudo hoard runner doctor` runs the runner's `bin/Runner.Listener` to read its version: a
/// program the runner's user (and so any job) can replace. As root it runs as that user.
#[tokio::test]
async fn doctor_as_root_runs_the_runners_program_as_the_runners_user() {
    if !is_root() {
        eprintln!("skipped: this test needs root (it runs hoard runner doctor as sudo does)");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let runner = fixture("LANG=C.UTF-8\n");
    // Where the program says who it ran as: a directory anyone may write to.
    let witness = outside();
    std::fs::set_permissions(witness.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let said = witness.path().join("uid");
    write_script(
        &runner.path().join("bin/Runner.Listener"),
        &format!(
            "#!/bin/sh\nid -u > {}\nid -G >> {}\necho {VERSION}\n",
            said.display(),
            said.display()
        ),
    );
    chown_tree(runner.path(), RUNNER_UID);
    let out = doctor(runner.path().to_str().unwrap()).await;
    let (stdout, stderr) = text(&out);
    assert!(
        stdout.contains(&format!("runner version {VERSION}")),
        "{stdout}{stderr}"
    );
    let ran_as = std::fs::read_to_string(&said).unwrap();
    let mut lines = ran_as.lines();
    assert_eq!(
        lines.next(),
        Some(RUNNER_UID.to_string().as_str()),
        "{ran_as}"
    );
    let groups: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert!(!groups.contains(&"0"), "no root group: {ran_as}");
}

async fn doctor(dir: &str) -> Output {
    hoard(&["runner", "doctor", "--runner-dir", dir]).await
}

/// The `--arc` output: a ConfigMap holding the two files, and a runner container whose env
/// names files that its volumeMounts bring from that ConfigMap.
#[tokio::test]
async fn arc_output_is_yaml_whose_env_names_what_it_mounts() {
    use yaml_rust2::{Yaml, YamlLoader};
    let upstream = Results::start().await;
    let srv = forwarding_hoard(&upstream.base).await;
    let out = hoard(&[
        "runner",
        "setup",
        "--arc",
        "--url",
        &srv.base,
        "--allow-loopback",
    ])
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let docs = YamlLoader::load_from_str(&stdout).unwrap();
    assert_eq!(docs.len(), 2, "{stdout}");
    let (configmap, values) = (&docs[0], &docs[1]);
    assert_eq!(configmap["kind"].as_str(), Some("ConfigMap"));
    let cm_name = configmap["metadata"]["name"].as_str().unwrap();
    let data = &configmap["data"];
    // The files are the ones setup writes on a runner machine.
    let runner = fixture("");
    let out = setup(runner.path(), &srv.base, &["--allow-loopback"]).await;
    assert!(out.status.success());
    for name in ["preload.cjs", "job-started.sh"] {
        assert_eq!(
            data[name].as_str(),
            Some(
                std::fs::read_to_string(runner.path().join(".hoard").join(name))
                    .unwrap()
                    .as_str()
            ),
            "{name}"
        );
    }

    let spec = &values["template"]["spec"];
    let container = &spec["containers"][0];
    assert_eq!(container["name"].as_str(), Some("runner"));
    let env: BTreeMap<&str, &str> = container["env"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["value"].as_str().unwrap()))
        .collect();
    assert_eq!(env["HOARD_RESULTS_URL"], format!("{}/", srv.base));
    let volumes = spec["volumes"].as_vec().unwrap();
    // Each file the env names is in a mounted directory, from a volume that is the ConfigMap.
    let mounted = |path: &str| -> bool {
        container["volumeMounts"].as_vec().unwrap().iter().any(|m| {
            let dir = m["mountPath"].as_str().unwrap();
            let Some(file) = path.strip_prefix(&format!("{dir}/")) else {
                return false;
            };
            volumes.iter().any(|v| {
                v["name"] == m["name"]
                    && v["configMap"]["name"].as_str() == Some(cm_name)
                    && !data[file].is_badvalue()
            })
        })
    };
    let preload = env["NODE_OPTIONS"].strip_prefix("--require ").unwrap();
    assert!(mounted(preload), "{preload}");
    assert!(mounted(env["ACTIONS_RUNNER_HOOK_JOB_STARTED"]));
    assert!(!mounted("/home/runner/.hoard/nothing.js"));
    let _ = Yaml::Null;
}

/// `--arc --edge-port`: each runner pod uses the edge on its own node (issue #59): the node's
/// address comes from the pod's status before the URLs that name it, and --url (the origin)
/// is still what set-up checks.
#[tokio::test]
async fn arc_output_points_each_runner_at_its_nodes_edge() {
    use yaml_rust2::YamlLoader;
    let upstream = Results::start().await;
    let srv = forwarding_hoard(&upstream.base).await;
    let args = [
        "runner",
        "setup",
        "--arc",
        "--edge-port",
        "3100",
        "--url",
        &srv.base,
        "--allow-loopback",
    ];
    let out = hoard(&args).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("is ready and forwards"),
        "the origin was checked: {stdout}"
    );
    let docs = YamlLoader::load_from_str(&stdout).unwrap();
    let env = docs[1]["template"]["spec"]["containers"][0]["env"]
        .as_vec()
        .unwrap();
    let names: Vec<&str> = env.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names[0], "HOARD_NODE_IP", "{names:?}");
    assert_eq!(
        env[0]["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("status.hostIP")
    );
    let value = |name: &str| {
        env.iter()
            .find(|e| e["name"].as_str() == Some(name))
            .and_then(|e| e["value"].as_str())
            .unwrap_or_else(|| panic!("{name} in {stdout}"))
    };
    for name in [
        "HOARD_RESULTS_URL",
        "HOARD_CACHE_URL",
        "CUSTOM_ACTIONS_RESULTS_URL",
    ] {
        assert_eq!(value(name), "http://$(HOARD_NODE_IP):3100/", "{name}");
    }
    // Only with --arc.
    let out = hoard(&[
        "runner",
        "setup",
        "--edge-port",
        "3100",
        "--url",
        &srv.base,
        "--runner-dir",
        "/nonexistent",
    ])
    .await;
    // Refused as usage (2) naming --arc, before the runner directory is looked at.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--arc"), "{stderr}");
}

// Set-up run as root (sudo) in a runner directory its user controls: a job runs as that user and
// may plant links there between two set-ups (issue 57).

/// The user that "owns" the fixture runner directory: anyone but root.
const RUNNER_UID: u32 = 65534;
/// Yet another user.
const STRANGER_UID: u32 = 65533;

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn chown_tree(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid)).unwrap();
    if std::fs::symlink_metadata(path).unwrap().is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            chown_tree(&entry.unwrap().path(), uid);
        }
    }
}

/// Every path under `dir` (itself included): its content or link target, mode and owner.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (String, u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(path) = todo.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let content = if meta.file_type().is_symlink() {
            std::fs::read_link(&path)
                .unwrap()
                .into_os_string()
                .into_encoded_bytes()
        } else if meta.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                todo.push(entry.unwrap().path());
            }
            Vec::new()
        } else {
            std::fs::read(&path).unwrap()
        };
        let content = String::from_utf8_lossy(&content).into_owned();
        out.insert(path, (content, meta.mode(), meta.uid()));
    }
    out
}

const PLANTED_BLOCK: &str = "PATH=/usr/bin\n# >>> hoard runner setup: planted\nNODE_OPTIONS=--require /x.cjs\n# <<< hoard runner setup\n";

/// What a job aims at: files and a directory outside the runner directory, root's.
fn outside() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("victim"), "precious\n").unwrap();
    std::fs::set_permissions(root.join("victim"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(root.join("environment"), PLANTED_BLOCK).unwrap();
    std::fs::create_dir(root.join("etc.d")).unwrap();
    std::fs::write(root.join("etc.d/keep.conf"), "x\n").unwrap();
    std::fs::write(root.join("etc.d/preload.cjs"), "// not hoard's\n").unwrap();
    std::fs::write(root.join("etc.d/job-started.sh"), "# not hoard's\n").unwrap();
    dir
}

async fn undo_cmd(dir: &Path) -> Output {
    hoard(&["runner", "undo", "--runner-dir", dir.to_str().unwrap()]).await
}

#[tokio::test]
async fn setup_and_undo_as_root_never_write_through_a_link_a_job_planted() {
    if !is_root() {
        eprintln!("skipped: this test needs root (it runs hoard runner setup as sudo does, in a directory another user owns)");
        return;
    }
    use std::os::unix::fs::{symlink, MetadataExt};
    let upstream = Results::start().await;
    let srv = forwarding_hoard(&upstream.base).await;
    let world = outside();
    let target = |name: &str| world.path().join(name);

    // Temporary names in .hoard, and the final names themselves, pointing outside.
    let runner = fixture("LANG=C.UTF-8\n");
    let hoard_dir = runner.path().join(".hoard");
    std::fs::create_dir(&hoard_dir).unwrap();
    for name in ["preload.tmp", "job-started.tmp", "preload.cjs"] {
        symlink(target("victim"), hoard_dir.join(name)).unwrap();
    }
    chown_tree(runner.path(), RUNNER_UID);
    let before = snapshot(world.path());
    let out = setup(runner.path(), &srv.base, &["--allow-loopback"]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(snapshot(world.path()), before, "{stdout}");
    for name in ["preload.cjs", "job-started.sh"] {
        let meta = std::fs::symlink_metadata(hoard_dir.join(name)).unwrap();
        assert!(meta.is_file(), "{name} is a regular file");
    }
    assert!(std::fs::read_to_string(hoard_dir.join("preload.cjs"))
        .unwrap()
        .contains("hoard runner preload"));
    let env = std::fs::symlink_metadata(runner.path().join(".env")).unwrap();
    assert_eq!(env.uid(), RUNNER_UID, ".env keeps its owner");
    assert_eq!(env.mode() & 0o777, 0o644, ".env keeps its mode");
    assert!(dotenv(runner.path())["NODE_OPTIONS"].contains("preload.cjs"));
    let out = undo_cmd(runner.path()).await;
    assert!(out.status.success(), "{:?}", text(&out));
    assert_eq!(snapshot(world.path()), before);
    assert_eq!(
        std::fs::read_to_string(runner.path().join(".env")).unwrap(),
        "LANG=C.UTF-8\n"
    );

    // .env a link to a file outside: refused, by setup and by undo, saying why.
    let runner = fixture("");
    std::fs::remove_file(runner.path().join(".env")).unwrap();
    symlink(target("environment"), runner.path().join(".env")).unwrap();
    chown_tree(runner.path(), RUNNER_UID);
    both_refuse(runner.path(), &srv.base, &[".env", "symbolic link"], || {
        assert_eq!(snapshot(world.path()), before);
    })
    .await;

    // .hoard a link to a directory outside: refused, by setup and by undo.
    let runner = fixture("LANG=C.UTF-8\n");
    symlink(target("etc.d"), runner.path().join(".hoard")).unwrap();
    chown_tree(runner.path(), RUNNER_UID);
    both_refuse(
        runner.path(),
        &srv.base,
        &[".hoard", "symbolic link"],
        || {
            assert_eq!(snapshot(world.path()), before);
        },
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(runner.path().join(".env")).unwrap(),
        "LANG=C.UTF-8\n"
    );

    // A .env or .hoard owned by a user who is neither root nor the runner directory's owner.
    for planted in [".env", ".hoard"] {
        let runner = fixture(PLANTED_BLOCK);
        std::fs::create_dir(runner.path().join(".hoard")).unwrap();
        chown_tree(runner.path(), RUNNER_UID);
        chown_tree(&runner.path().join(planted), STRANGER_UID);
        let inside = snapshot(runner.path());
        let owner = format!("owned by uid {STRANGER_UID}");
        both_refuse(runner.path(), &srv.base, &[planted, &owner], || {
            assert_eq!(snapshot(runner.path()), inside, "{planted}");
        })
        .await;
    }
}

/// Setup and then undo on `runner` both fail with a message holding every one of `says`, and
/// `unchanged` holds after each.
async fn both_refuse(runner: &Path, base: &str, says: &[&str], unchanged: impl Fn()) {
    for out in [
        setup(runner, base, &["--allow-loopback"]).await,
        undo_cmd(runner).await,
    ] {
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{says:?}: {stdout}{stderr}");
        assert!(
            says.iter().all(|s| stderr.contains(s)),
            "{says:?}: {stderr}"
        );
        unchanged();
    }
}

#[tokio::test]
async fn a_url_with_a_credential_is_refused_and_the_secret_never_shown() {
    let runner = fixture("LANG=C.UTF-8\n");
    let dir = runner.path().to_str().unwrap();
    let secret = "s3cr3t-pw";
    for args in [
        vec!["--url", "http://user:s3cr3t-pw@cache.internal:3000/"],
        vec!["--url", "http://s3cr3t-pw@cache.internal:3000/"],
        vec![
            "--url",
            "http://cache.internal:3000/",
            "--cache-url",
            "http://user:s3cr3t-pw@cache.internal:3000/v1/",
        ],
    ] {
        for arc in [false, true] {
            let mut all = vec!["runner", "setup", "--runner-dir", dir, "--dry-run"];
            all.extend(&args);
            if arc {
                all.push("--arc");
            }
            let out = hoard(&all).await;
            let (stdout, stderr) = text(&out);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {stdout}{stderr}");
            assert!(
                !stdout.contains(secret) && !stderr.contains(secret),
                "{stdout}{stderr}"
            );
            assert!(
                stderr.contains("credential") && stderr.contains("ACTIONS_RUNTIME_TOKEN"),
                "says how a job authenticates instead: {stderr}"
            );
        }
    }
    assert_eq!(
        std::fs::read_to_string(runner.path().join(".env")).unwrap(),
        "LANG=C.UTF-8\n"
    );
}

/// A stand-in for hoard whose `/readyz` answers `status` with `body`, to every request.
async fn readyz_answering(
    status: &'static str,
    body: String,
) -> (String, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let answer = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
            });
        }
    });
    (base, task)
}

/// Replaces the value of `key` in the runner's `.env` (every line of it).
fn set_env_line(runner: &Path, key: &str, value: &str) {
    let path = runner.join(".env");
    let text = std::fs::read_to_string(&path).unwrap();
    let out: String = text
        .lines()
        .map(|l| match l.split_once('=') {
            Some((k, _)) if k == key => format!("{key}={value}\n"),
            _ => format!("{l}\n"),
        })
        .collect();
    std::fs::write(&path, out).unwrap();
}

#[tokio::test]
async fn the_hook_checks_the_cache_url_too_and_falls_back_for_v1_alone() {
    let upstream = Results::start().await;
    let srv = forwarding_hoard(&upstream.base).await;
    let hoard_url = format!("{}/", srv.base);
    let github = "http://127.0.0.1:9";
    // A port below the ephemeral range that nothing listens on: no other test can be given it
    // (a port bound and let go could be).
    let closed = "http://127.0.0.1:1/".to_owned();
    for (cache_url, why) in [
        (closed.as_str(), "a --cache-url on a host that is down"),
        ("http//not a url", "a malformed HOARD_CACHE_URL"),
        ("ftp://cache.internal/", "not http"),
    ] {
        let runner = fixture("");
        let out = setup(runner.path(), &srv.base, &["--allow-loopback"]).await;
        assert!(out.status.success(), "{:?}", text(&out));
        set_env_line(runner.path(), "HOARD_CACHE_URL", cache_url);
        let job = Job::new(runner.path(), github);
        let (code, said) = job.hook().await;
        assert_eq!(code, 0, "{why}: {said}");
        let warnings: Vec<&str> = said
            .lines()
            .filter(|l| l.starts_with("::warning::"))
            .collect();
        assert_eq!(warnings.len(), 1, "{why}: {said}");
        assert!(warnings[0].contains("v1"), "{why}: {said}");
        assert_eq!(job.marker().as_deref(), Some("cache\n"), "{why}: {said}");
        // v2 and artifacts still go to hoard; v1 clients keep GitHub's URL for this job.
        let seen = job
            .action_sees(&[], &["ACTIONS_RESULTS_URL", "ACTIONS_CACHE_URL"])
            .await;
        assert_eq!(
            seen,
            serde_json::json!({ "ACTIONS_RESULTS_URL": hoard_url, "ACTIONS_CACHE_URL": format!("{github}/v1-cache-id/") }),
            "{why}"
        );
    }
    // Both down: everything stays with GitHub.
    let runner = fixture("");
    let out = setup(runner.path(), &srv.base, &["--allow-loopback"]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    set_env_line(runner.path(), "HOARD_CACHE_URL", &closed);
    set_env_line(runner.path(), "HOARD_RESULTS_URL", &closed);
    let job = Job::new(runner.path(), github);
    let (_, said) = job.hook().await;
    assert_eq!(job.marker().as_deref(), Some("all\n"), "{said}");
}

#[tokio::test]
async fn text_from_readyz_cannot_become_a_workflow_command() {
    let upstream = Results::start().await;
    let srv = forwarding_hoard(&upstream.base).await;
    let body = serde_json::json!({
        "status": "starting\n::error::injected\r\n::add-mask::x",
        "error": "100% down\n::set-output name=a::b\u{2028}::error::two",
    })
    .to_string();
    let (fake, task) = readyz_answering("503 Service Unavailable", body).await;
    let runner = fixture("");
    let out = setup(runner.path(), &srv.base, &["--allow-loopback"]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    set_env_line(runner.path(), "HOARD_RESULTS_URL", &fake);
    set_env_line(runner.path(), "HOARD_CACHE_URL", &fake);
    let job = Job::new(runner.path(), "http://127.0.0.1:9");
    let (code, said) = job.hook().await;
    assert_eq!(code, 0, "{said}");
    let lines: Vec<&str> = said
        .split(['\n', '\r', '\u{2028}'])
        .filter(|l| !l.is_empty())
        .collect();
    assert!(!lines.is_empty(), "{said:?}");
    for line in &lines {
        assert!(line.starts_with("::warning::"), "{said:?}");
    }
    assert!(
        said.contains("%0A::error::injected"),
        "escaped, and still said: {said:?}"
    );
    assert!(said.contains("100%25 down"), "{said:?}");
    assert_eq!(job.marker().as_deref(), Some("all\n"));
    task.abort();
}

#[tokio::test]
async fn the_ecosystems_custom_url_variables_agree_with_hoard() {
    let upstream = Results::start().await;
    let srv = forwarding_hoard(&upstream.base).await;
    let hoard_url = format!("{}/", srv.base);
    let github = "http://127.0.0.1:9";
    let runner = fixture("");
    let out = setup(runner.path(), &srv.base, &["--allow-loopback"]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    let env = dotenv(runner.path());
    assert_eq!(env["CUSTOM_ACTIONS_RESULTS_URL"], hoard_url);
    assert_eq!(env["CUSTOM_ACTIONS_CACHE_URL"], hoard_url);
    let names = [
        "CUSTOM_ACTIONS_RESULTS_URL",
        "CUSTOM_ACTIONS_CACHE_URL",
        "HOARD_ORIGINAL_CUSTOM_ACTIONS_RESULTS_URL",
    ];

    // hoard ready: an action sees hoard's URL there, even one the workflow set to another.
    let job = Job::new(runner.path(), github);
    let (_, said) = job.hook().await;
    assert!(!said.contains("::warning::"), "{said}");
    assert_eq!(
        job.action_sees(
            &[("CUSTOM_ACTIONS_RESULTS_URL", "http://elsewhere/")],
            &names
        )
        .await,
        serde_json::json!({
            "CUSTOM_ACTIONS_RESULTS_URL": hoard_url,
            "CUSTOM_ACTIONS_CACHE_URL": hoard_url,
            "HOARD_ORIGINAL_CUSTOM_ACTIONS_RESULTS_URL": "http://elsewhere/",
        })
    );

    // hoard down: they follow the job to GitHub, as ACTIONS_RESULTS_URL does.
    std::fs::write(job.temp.path().join(".hoard-fallback"), "all\n").unwrap();
    assert_eq!(
        job.action_sees(
            &[],
            &[
                "CUSTOM_ACTIONS_RESULTS_URL",
                "CUSTOM_ACTIONS_CACHE_URL",
                "ACTIONS_RESULTS_URL"
            ]
        )
        .await,
        serde_json::json!({
            "CUSTOM_ACTIONS_RESULTS_URL": format!("{github}/"),
            "CUSTOM_ACTIONS_CACHE_URL": format!("{github}/v1-cache-id/"),
            "ACTIONS_RESULTS_URL": format!("{github}/"),
        })
    );
    // No forwarding: results with GitHub, v1 with hoard.
    std::fs::write(job.temp.path().join(".hoard-fallback"), "results\n").unwrap();
    assert_eq!(
        job.action_sees(
            &[],
            &["CUSTOM_ACTIONS_RESULTS_URL", "CUSTOM_ACTIONS_CACHE_URL"]
        )
        .await,
        serde_json::json!({
            "CUSTOM_ACTIONS_RESULTS_URL": format!("{github}/"),
            "CUSTOM_ACTIONS_CACHE_URL": hoard_url,
        })
    );
    // The ARC output sets them too.
    let out = setup(runner.path(), &srv.base, &["--allow-loopback", "--arc"]).await;
    let (stdout, _) = text(&out);
    for name in ["CUSTOM_ACTIONS_RESULTS_URL", "CUSTOM_ACTIONS_CACHE_URL"] {
        assert!(
            stdout.contains(&format!(
                "- name: {name}\n            value: \"{hoard_url}\""
            )),
            "{stdout}"
        );
    }
}

#[tokio::test]
async fn actions_cache_mode_passes_through_the_preload_and_the_hook_untouched() {
    let upstream = Results::start().await;
    let srv = forwarding_hoard(&upstream.base).await;
    let hooks = tempfile::tempdir().unwrap();
    let seen = hooks.path().join("seen");
    let theirs = hooks.path().join("start.sh");
    std::fs::write(
        &theirs,
        format!(
            "printf '%s|%s' \"${{ACTIONS_CACHE_MODE-unset}}\" \"$ACTIONS_CACHE_MODE\" > {}\n",
            seen.display()
        ),
    )
    .unwrap();
    let runner = fixture(&format!(
        "ACTIONS_RUNNER_HOOK_JOB_STARTED={}\n",
        theirs.display()
    ));
    let out = setup(runner.path(), &srv.base, &["--allow-loopback"]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    for mode in ["read", "write", "write-only", "none", " Write-Only \t"] {
        for fallback in [None, Some("all\n"), Some("results\n"), Some("cache\n")] {
            let mut job = Job::new(runner.path(), "http://127.0.0.1:9");
            job.step_env
                .push(("ACTIONS_CACHE_MODE".into(), mode.into()));
            if let Some(marker) = fallback {
                std::fs::write(job.temp.path().join(".hoard-fallback"), marker).unwrap();
            }
            let seen_by_action = job.action_sees(&[], &["ACTIONS_CACHE_MODE"]).await;
            assert_eq!(seen_by_action["ACTIONS_CACHE_MODE"], mode, "{fallback:?}");
        }
        // The hook (and the hook it chains to) get the job's value as it was.
        let mut job = Job::new(runner.path(), "http://127.0.0.1:9");
        job.step_env
            .push(("ACTIONS_CACHE_MODE".into(), mode.into()));
        let mut cmd = job.base_command(Path::new("bash"));
        let hook = dotenv(runner.path())["ACTIONS_RUNNER_HOOK_JOB_STARTED"].clone();
        cmd.args(["-e", &hook]).env("ACTIONS_CACHE_MODE", mode);
        let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap();
        assert!(out.status.success(), "{:?}", text(&out));
        assert_eq!(
            std::fs::read_to_string(&seen).unwrap(),
            format!("{mode}|{mode}")
        );
    }
}

/// A JavaScript action of `job` that does nothing itself (the preload runs before it), with the
/// step's variables, `GITHUB_ENV` at `github_env`, and `extra`: what it printed.
async fn empty_action(job: &Job, github_env: &Path, extra: &[(&str, &str)]) -> String {
    let mut cmd = job.base_command(&job.runner.join("externals/node20/bin/node"));
    cmd.args(["-e", ""])
        .envs(job.step_env.iter().map(|(k, v)| (k, v)))
        .env("GITHUB_ENV", github_env)
        .env("GITHUB_REPOSITORY_OWNER", "octo")
        .envs(extra.iter().copied());
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    stdout
}

/// `NAME=value` lines of a `GITHUB_ENV` file.
fn exported(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn build_tools_get_hoard_and_a_token_of_the_jobs_own_once_per_job() {
    let srv = TestServer::start().await;
    let runner = fixture("");
    let out = setup(
        runner.path(),
        &srv.base,
        &["--allow-loopback", "--cache-only", "--build-tools", "all"],
    )
    .await;
    let (said, err) = text(&out);
    assert!(out.status.success(), "{said}{err}");
    assert!(
        said.contains("build tools: turbo,nx,sccache,ccache,go"),
        "{said}"
    );
    let env = dotenv(runner.path());
    assert_eq!(env["HOARD_BUILD_TOOLS"], "turbo,nx,sccache,ccache,go");
    let gocacheprog = env["HOARD_GOCACHEPROG"].clone();
    assert!(gocacheprog.ends_with("/hoard gocache"), "{gocacheprog}");

    let job = Job::new(runner.path(), "http://127.0.0.1:9");
    let (code, hook_said) = job.hook().await;
    assert_eq!(code, 0, "{hook_said}");
    let github_env = job.temp.path().join("github_env_1");
    // The workflow sets Nx's server itself: that one stays.
    let printed = empty_action(
        &job,
        &github_env,
        &[("NX_SELF_HOSTED_REMOTE_CACHE_SERVER", "http://nx.example")],
    )
    .await;
    let vars = exported(&github_env);
    let token = vars["HOARD_TOOL_TOKEN"].clone();
    assert!(token.starts_with("hoardtool."), "{vars:?}");
    assert!(
        printed.lines().any(|l| l == format!("::add-mask::{token}")),
        "the token is masked before anything else can print it: {printed}"
    );
    assert!(!token.contains(job.token()), "not the runtime token");
    let base = srv.base.trim_end_matches('/');
    for (name, value) in [
        ("HOARD_URL", base.to_owned()),
        ("TURBO_API", base.to_owned()),
        ("TURBO_TOKEN", token.clone()),
        ("TURBO_TEAM", "octo".to_owned()),
        ("SCCACHE_WEBDAV_ENDPOINT", format!("{base}/_dav/sccache")),
        ("SCCACHE_WEBDAV_TOKEN", token.clone()),
        (
            "CCACHE_REMOTE_STORAGE",
            format!(
                "http://job:{token}@{}/_dav/ccache|layout=subdirs",
                base.trim_start_matches("http://")
            ),
        ),
        ("GOCACHEPROG", gocacheprog.clone()),
    ] {
        assert_eq!(vars.get(name), Some(&value), "{name}: {vars:?}");
    }
    // Nx is the workflow's: none of its variables, so hoard's token goes to no other server.
    assert!(
        !vars.contains_key("NX_SELF_HOSTED_REMOTE_CACHE_SERVER")
            && !vars.contains_key("NX_SELF_HOSTED_REMOTE_CACHE_ACCESS_TOKEN"),
        "{vars:?}"
    );

    // The token is the job's: it writes the job's scope, which the job's runtime token reads.
    let put = srv
        .http
        .put(format!("{base}/v1/cache/0a1b"))
        .bearer_auth(&token)
        .body("from a build tool")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let got = srv
        .http
        .get(format!("{base}/v1/cache/0a1b"))
        .bearer_auth(job.token())
        .send()
        .await
        .unwrap();
    assert_eq!(got.text().await.unwrap(), "from a build tool");

    // Once per job: the next action exports nothing.
    let later = job.temp.path().join("github_env_2");
    let printed = empty_action(&job, &later, &[]).await;
    assert!(exported(&later).is_empty(), "{printed}");

    // A workflow that points Turborepo elsewhere (Vercel) keeps all of it: no hoard token there.
    let vercel = Job::new(runner.path(), "http://127.0.0.1:9");
    let theirs = vercel.temp.path().join("github_env");
    empty_action(&vercel, &theirs, &[("TURBO_TOKEN", "vercel-secret")]).await;
    let vars = exported(&theirs);
    assert!(vars.contains_key("SCCACHE_WEBDAV_ENDPOINT"), "{vars:?}");
    assert!(!vars.keys().any(|k| k.starts_with("TURBO_")), "{vars:?}");

    // Nor does a pull_request_target job (the base branch's token, the pull request's code).
    let target = Job::new(runner.path(), "http://127.0.0.1:9");
    let none = target.temp.path().join("github_env");
    empty_action(
        &target,
        &none,
        &[("GITHUB_EVENT_NAME", "pull_request_target")],
    )
    .await;
    assert!(exported(&none).is_empty());

    // A job that falls back to GitHub (hoard down when it started) gets nothing either.
    let down = Job::new(runner.path(), "http://127.0.0.1:9");
    std::fs::write(down.temp.path().join(".hoard-fallback"), "all\n").unwrap();
    let none = down.temp.path().join("github_env");
    empty_action(&down, &none, &[]).await;
    assert!(exported(&none).is_empty());

    // hoard refusing the exchange: a warning, and the tools build without it.
    let refused = Job::new(runner.path(), "http://127.0.0.1:9");
    let none = refused.temp.path().join("github_env");
    let printed = empty_action(&refused, &none, &[("ACTIONS_RUNTIME_TOKEN", "not-a-token")]).await;
    assert!(exported(&none).is_empty());
    assert!(
        printed.lines().any(
            |l| l.starts_with("::warning::hoard: no token for the build tools")
                && l.contains("401")
        ),
        "{printed}"
    );

    // The doctor names them, and a Go cache program that is gone; jobs then leave GOCACHEPROG
    // unset, with a warning, rather than break every Go build.
    let dir = runner.path().to_str().unwrap().to_owned();
    let (stdout, _) = text(&doctor(&dir).await);
    assert!(
        stdout.contains("build tools: turbo,nx,sccache,ccache,go")
            && stdout.contains(&format!("GOCACHEPROG runs {gocacheprog}")),
        "{stdout}"
    );
    set_env_line(
        runner.path(),
        "HOARD_GOCACHEPROG",
        "/nonexistent/hoard gocache",
    );
    let out = doctor(&dir).await;
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("FAIL") && l.contains("/nonexistent/hoard")),
        "{stdout}"
    );
    let gone = Job::new(runner.path(), "http://127.0.0.1:9");
    let vars_file = gone.temp.path().join("github_env");
    let printed = empty_action(&gone, &vars_file, &[]).await;
    let vars = exported(&vars_file);
    assert!(
        vars.contains_key("TURBO_API") && !vars.contains_key("GOCACHEPROG"),
        "{vars:?}"
    );
    assert!(
        printed
            .lines()
            .any(|l| l.starts_with("::warning::hoard: /nonexistent/hoard cannot be run")),
        "{printed}"
    );

    // Set up again without them: the variables are gone from .env.
    let out = setup(
        runner.path(),
        &srv.base,
        &["--allow-loopback", "--cache-only"],
    )
    .await;
    assert!(out.status.success(), "{:?}", text(&out));
    let env = dotenv(runner.path());
    assert!(!env.contains_key("HOARD_BUILD_TOOLS") && !env.contains_key("HOARD_GOCACHEPROG"));
}
