//! hoard's container image, built by `scripts/image` from the Dockerfile and run with podman as
//! users run it: a volume on /data, a read-only root, configuration by HOARD_* variables, host
//! networking on loopback. The real `@actions/cache` client saves and restores through it, and
//! with an S3 store it reaches the bucket from inside the container.
//!
//! The image holds this test run's own build of hoard (`CARGO_BIN_EXE_hoard`), so the suite does
//! not pay for a second, release build; the image definition, its files, user and health check
//! are the ones `scripts/image` makes for a release.
//!
//! Without podman (or where it cannot run containers) the tests say so and return, unless
//! HOARD_TEST_REQUIRE_CONTAINERS=1 (set by CI), where that is a failure.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};

use common::{emulators, random_bytes, sign_hs256, TEST_SECRET};

/// podman with the runtime and limits this machine needs (crun and podman's default rlimits
/// fail here; see README, "Containers").
fn podman() -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(["--runtime", "runc"]);
    cmd
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn stdout_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn all_of(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The image built once for this test binary, or why containers cannot run here.
fn image() -> Option<&'static str> {
    static IMAGE: OnceLock<Result<String, String>> = OnceLock::new();
    let image = IMAGE.get_or_init(build_image);
    match image {
        Ok(name) => Some(name),
        Err(why) => {
            let required = std::env::var("HOARD_TEST_REQUIRE_CONTAINERS").as_deref() == Ok("1");
            assert!(!required, "containers are required here, but {why}");
            eprintln!(
                "skipped: the container tests need podman that can run containers, but {why}"
            );
            None
        }
    }
}

fn build_image() -> Result<String, String> {
    match Command::new("podman").arg("--version").output() {
        Ok(out) if out.status.success() => {}
        _ => {
            return Err(
                "podman is not installed (Debian: apt-get install podman buildah runc)".into(),
            )
        }
    }
    let name = format!("localhost/hoard-test:{}", std::process::id());
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = run(Command::new(repo.join("scripts/image"))
        .args(["--binary", env!("CARGO_BIN_EXE_hoard"), "--tag", &name])
        .current_dir(repo));
    if !out.status.success() {
        return Err(format!("scripts/image failed:\n{}", all_of(&out)));
    }
    // Can this machine run a container at all? The image's own health command answers even
    // without a server (exit 1), which is enough to tell.
    let probe = run(podman().args(common_run_args()).args([
        "--rm",
        &name,
        "health",
        "--url",
        "http://127.0.0.1:9/readyz",
        "--timeout",
        "1s",
    ]));
    if probe.status.code() != Some(1) {
        return Err(format!(
            "podman cannot run a container here:\n{}",
            all_of(&probe)
        ));
    }
    Ok(name)
}

/// What every `podman run` here needs: the machine's limits, loopback through the host's
/// network, and a read-only root as the image must support.
fn common_run_args() -> [&'static str; 7] {
    [
        "run",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=4096:4096",
        "--network",
        "host",
    ]
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One running container of the image, with its own named volume on /data, removed on drop.
struct Container {
    name: String,
    volume: String,
    base: String,
}

impl Container {
    /// Starts the image with `env` on a free loopback port and waits until /readyz answers 200.
    async fn start(image: &str, secrets: &Path, env: &[(&str, String)]) -> Self {
        let port = free_port();
        let name = format!("hoard-test-{}-{port}", std::process::id());
        let volume = format!("{name}-data");
        let mut cmd = podman();
        cmd.args(common_run_args())
            .args(["--detach", "--read-only", "--name", &name])
            .args(["--volume", &format!("{volume}:/data")])
            .args([
                "--volume",
                &format!("{}:/run/secrets:ro", secrets.display()),
            ])
            .args(["--env", &format!("HOARD_LISTEN=127.0.0.1:{port}")])
            // The machine's free space is not the test's (as in the other tests).
            .args(["--env", "HOARD_MIN_FREE_SPACE=0"]);
        for (k, v) in env {
            cmd.args(["--env", &format!("{k}={v}")]);
        }
        let out = run(cmd.arg(image));
        let container = Self {
            name,
            volume,
            base: format!("http://127.0.0.1:{port}"),
        };
        assert!(out.status.success(), "podman run failed:\n{}", all_of(&out));
        container.wait_ready().await;
        container
    }

    async fn wait_ready(&self) {
        let http = client();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(res) = http.get(format!("{}/readyz", self.base)).send().await {
                if res.status() == 200 {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the container did not become ready; its log:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The host directory behind the container's /data volume.
    fn data_on_host(&self) -> PathBuf {
        let out = run(podman().args([
            "volume",
            "inspect",
            "--format",
            "{{.Mountpoint}}",
            &self.volume,
        ]));
        PathBuf::from(stdout_of(&out))
    }

    fn logs(&self) -> String {
        all_of(&run(podman().args(["logs", &self.name])))
    }

    fn inspect(&self, format: &str) -> String {
        stdout_of(&run(
            podman().args(["inspect", "--format", format, &self.name])
        ))
    }

    fn exec(&self, args: &[&str]) -> Output {
        run(podman().arg("exec").arg(&self.name).args(args))
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman()
            .args(["rm", "--force", "--time", "0", &self.name])
            .output();
        let _ = podman()
            .args(["volume", "rm", "--force", &self.volume])
            .output();
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()
        .unwrap()
}

/// A directory holding the HS256 secret the containers trust, readable by the image's user.
fn secrets_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token-secret"), TEST_SECRET).unwrap();
    make_readable_by_all(dir.path());
    dir
}

fn make_readable_by_all(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir(path).unwrap() {
        let entry = entry.unwrap().path();
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

const SECRET_IN_CONTAINER: &str = "/run/secrets/token-secret";

/// A token of repository 7 that reads and writes its main branch.
fn token() -> String {
    sign_hs256(&common::claims("7", &[("refs/heads/main", 3)]))
}

fn sha256_file(path: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(path).unwrap()))
}

/// Runs the real `@actions/cache` 6.3.0 client in `dir` against `server` (v2); its RESULT.
fn real_client(server: &str, dir: &Path, args: &[&str]) -> (Value, String) {
    let e2e = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e");
    assert!(
        e2e.join("node_modules/@actions/cache").exists(),
        "the real client is not installed: run `npm ci --prefix tests/e2e` (scripts/test does)"
    );
    let runner_temp = dir.join("runner-temp");
    std::fs::create_dir_all(&runner_temp).unwrap();
    let out = Command::new("node")
        .arg(e2e.join("client.mjs"))
        .args(args)
        .current_dir(dir)
        .env("ACTIONS_RESULTS_URL", format!("{server}/"))
        .env("ACTIONS_CACHE_SERVICE_V2", "true")
        .env("ACTIONS_RUNTIME_TOKEN", token())
        .env("RUNNER_TEMP", &runner_temp)
        .env("GITHUB_WORKSPACE", dir)
        .env_remove("GITHUB_SERVER_URL")
        .env_remove("ACTIONS_CACHE_URL")
        .env_remove("HOARD_E2E_CLIENT")
        .output()
        .expect("run node");
    common::node_result(out)
}

/// Saves `bytes` under `key` with the real client, removes the file, restores it and checks
/// that it came back byte for byte. Returns the saved entry's id.
fn save_and_restore(server: &str, key: &str, bytes: &[u8]) -> i64 {
    let dir = tempfile::tempdir().unwrap();
    let file: PathBuf = dir.path().join("payload/data.bin");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, bytes).unwrap();
    let saved_sha = sha256_file(&file);

    let (id, out) = real_client(server, dir.path(), &["save", key, "payload"]);
    let id = id
        .as_i64()
        .unwrap_or_else(|| panic!("save returned {id}:\n{out}"));
    assert!(id > 0, "{out}");
    std::fs::remove_dir_all(dir.path().join("payload")).unwrap();

    let (miss, out) = real_client(
        server,
        dir.path(),
        &["restore", &format!("{key}-other"), "payload"],
    );
    assert_eq!(miss, Value::Null, "another key misses:\n{out}");

    let (hit, out) = real_client(server, dir.path(), &["restore", key, "payload"]);
    assert_eq!(hit, Value::String(key.to_owned()), "{out}");
    assert_eq!(sha256_file(&file), saved_sha, "restored bytes differ");
    id
}

/// The uid the container's main process runs as, read from the host's /proc.
fn process_uid(container: &Container) -> u32 {
    let pid = container.inspect("{{.State.Pid}}");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uids = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .expect("Uid line");
    uids.split_whitespace().next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn the_image_serves_the_real_client_as_an_unprivileged_user_on_a_read_only_root() {
    let Some(image) = image() else { return };
    let secrets = secrets_dir();
    let admin_token = "container-admin-token-0123456789";
    let container = Container::start(
        image,
        secrets.path(),
        &[
            (
                "HOARD_TOKEN_HS256_SECRET_FILE",
                SECRET_IN_CONTAINER.to_owned(),
            ),
            ("HOARD_ADMIN_TOKEN", admin_token.to_owned()),
            ("HOARD_SHUTDOWN_TIMEOUT", "20s".to_owned()),
        ],
    )
    .await;

    // Not root, on the root file system it was given.
    assert_eq!(
        process_uid(&container),
        10001,
        "the server runs as the image's user"
    );
    assert_eq!(container.inspect("{{.HostConfig.ReadonlyRootfs}}"), "true");

    // One small entry (Put Blob) and one over the client's single-put limit (blocks).
    let small = random_bytes(300 * 1024, 41);
    save_and_restore(&container.base, "container-small", &small);
    let large = random_bytes(40 * 1024 * 1024, 42);
    let id = save_and_restore(&container.base, "container-large", &large);

    // HOARD_* variables configure it: the admin API is on because HOARD_ADMIN_TOKEN is set,
    // and it lists what the client saved.
    let http = client();
    let res = http
        .get(format!("{}/_hoard/api/v1/caches/{id}", container.base))
        .bearer_auth(admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let entry: Value = res.json().await.unwrap();
    assert_eq!(entry["key"], "container-large", "{entry}");
    // The entry lives in /data, the volume, not in the container's (read-only) root.
    let data = container.data_on_host();
    let stored: u64 = common::files_under(&data)
        .iter()
        .map(|f| f.metadata().map(|m| m.len()).unwrap_or(0))
        .sum();
    assert!(
        stored >= large.len() as u64,
        "the volume holds {stored} bytes: {:?}",
        common::files_under(&data)
    );

    // The health check needs no shell: the image's own HEALTHCHECK, and `hoard health` by exec.
    let health = container.exec(&["/usr/local/bin/hoard", "health"]);
    assert!(health.status.success(), "{}", all_of(&health));
    let check = run(podman().args(["healthcheck", "run", &container.name]));
    assert!(
        check.status.success(),
        "podman healthcheck run: {}",
        all_of(&check)
    );
    // ... and there is no shell to run anything else.
    let shell = container.exec(&["/bin/sh", "-c", "true"]);
    assert!(!shell.status.success(), "the image has a shell");

    // SIGTERM: a clean exit, well within the shutdown timeout.
    let started = Instant::now();
    let stop = run(podman().args(["stop", "--time", "25", &container.name]));
    assert!(stop.status.success(), "{}", all_of(&stop));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?} to stop",
        started.elapsed()
    );
    assert_eq!(
        container.inspect("{{.State.ExitCode}}"),
        "0",
        "exit status after SIGTERM; log:\n{}",
        container.logs()
    );
    assert!(
        container.logs().contains("shutting down"),
        "{}",
        container.logs()
    );
}

#[test]
fn the_image_holds_only_hoard_its_libraries_and_certificates() {
    let Some(image) = image() else { return };
    let labels = stdout_of(&run(podman().args([
        "image",
        "inspect",
        "--format",
        "{{json .Config.Labels}}",
        image,
    ])));
    let labels: Value = serde_json::from_str(&labels).unwrap();
    for label in [
        "org.opencontainers.image.source",
        "org.opencontainers.image.version",
        "org.opencontainers.image.licenses",
    ] {
        assert!(labels[label].is_string(), "no {label} in {labels}");
    }
    assert_eq!(labels["org.opencontainers.image.licenses"], "MIT");
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );

    let mount = run(podman().args(["image", "mount", image]));
    assert!(mount.status.success(), "{}", all_of(&mount));
    let root = PathBuf::from(stdout_of(&mount));
    let files = common::files_under(&root);
    let _ = podman().args(["image", "unmount", image]).output();

    let names: Vec<String> = files
        .iter()
        .map(|f| format!("/{}", f.strip_prefix(&root).unwrap().display()))
        .collect();
    // Every file is hoard, a library it loads, its certificates or the name files.
    for name in &names {
        let expected = name == "/usr/local/bin/hoard"
            || name.contains(".so")
            || name == "/etc/ssl/certs/ca-certificates.crt"
            || ["/etc/passwd", "/etc/group", "/etc/nsswitch.conf"].contains(&name.as_str());
        assert!(expected, "unexpected file {name} in the image: {names:?}");
    }
    assert!(
        names.contains(&"/usr/local/bin/hoard".to_owned()),
        "{names:?}"
    );
    assert!(
        names.contains(&"/etc/ssl/certs/ca-certificates.crt".to_owned()),
        "{names:?}"
    );
    for absent in [
        "/bin/sh",
        "/usr/bin/apt-get",
        "/usr/bin/dpkg",
        "/bin/busybox",
    ] {
        assert!(
            !names.contains(&absent.to_owned()),
            "{absent} is in the image"
        );
    }
}

#[tokio::test]
async fn the_image_reaches_an_s3_bucket_from_inside_the_container() {
    let Some(image) = image() else { return };
    let s3 = emulators::s3();
    let bucket = s3.bucket();
    let secrets = secrets_dir();
    let mut env: Vec<(&str, String)> = vec![
        (
            "HOARD_TOKEN_HS256_SECRET_FILE",
            SECRET_IN_CONTAINER.to_owned(),
        ),
        ("HOARD_STORAGE_URL", format!("s3://{bucket}/in-container")),
    ];
    let s3_env = s3.env();
    for (k, v) in &s3_env {
        env.push((k.as_str(), v.clone()));
    }
    let container = Container::start(image, secrets.path(), &env).await;
    let bytes = random_bytes(3 * 1024 * 1024, 43);
    save_and_restore(&container.base, "container-s3", &bytes);

    // The bytes went to the bucket, not to /data.
    let store = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(&s3.endpoint)
        .with_access_key_id(&s3.access_key_id)
        .with_secret_access_key(&s3.secret_access_key)
        .with_region(&s3.region)
        .with_bucket_name(&bucket)
        .with_allow_http(true)
        .build()
        .unwrap();
    let prefix = object_store::path::Path::from("in-container");
    let listed: Vec<object_store::ObjectMeta> = futures_util::TryStreamExt::try_collect(
        object_store::ObjectStore::list(&store, Some(&prefix)),
    )
    .await
    .unwrap();
    let in_bucket: u64 = listed.iter().map(|o| o.size).sum();
    assert!(
        in_bucket >= bytes.len() as u64,
        "the bucket holds {in_bucket} bytes under in-container/; container log:\n{}",
        container.logs()
    );
}
