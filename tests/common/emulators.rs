//! Object-storage emulators for the tests of the object-store backends: moto's S3 server, which
//! also answers the XML API that object_store's GCS client speaks, and Azurite's Blob service.
//!
//! Each is the running server that `HOARD_TEST_S3_ENDPOINT`, `HOARD_TEST_AZURITE_ENDPOINT` or
//! `HOARD_TEST_GCS_ENDPOINT` names (a plain `http://HOST:PORT`), or else one this test process
//! starts on a free loopback port from `target/emulators` (installed by `scripts/emulators`;
//! `HOARD_EMULATORS_DIR` moves it), the first time a test asks, and keeps until it exits. A
//! started emulator runs under a small `sh` watchdog that kills it when the watchdog's standard
//! input, a pipe only this process holds, closes: when this process exits, however it exits.
//! Each test makes its own bucket or container; the emulators keep them in memory.
#![allow(dead_code)] // Each test binary uses a different part of this module.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The account every Azurite has.
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
/// The well-known key of [`AZURITE_ACCOUNT`].
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// The Blob service version the helpers' own requests ask for (object_store 0.12's).
const AZURE_VERSION: &str = "2023-11-03";
/// How long an emulator may take to answer after it is started.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// An S3-compatible server and the credentials the tests use on it.
pub struct S3Server {
    /// Base URL, e.g. `http://127.0.0.1:41234`; buckets are addressed path-style under it.
    pub endpoint: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    pub region: String,
    emulator: Option<Emulator>,
}

/// Azurite's Blob service, with the well-known account [`AZURITE_ACCOUNT`].
pub struct AzuriteServer {
    /// Base URL without the account, e.g. `http://127.0.0.1:41235`.
    pub endpoint: String,
    emulator: Option<Emulator>,
}

/// A server of the GCS XML API, and a service-account key that points object_store at it.
pub struct GcsServer {
    /// Base URL object_store uses in place of `https://storage.googleapis.com`.
    pub base_url: String,
    /// Service-account JSON (`gcs_base_url`, a test RSA key): tokens and URLs are signed locally.
    pub service_account_key: String,
    /// The S3 server that serves it, when it is this process's [`s3`].
    s3: Option<&'static S3Server>,
}

/// Sets `env` (an emulator's `env()`) in this process, for the servers a test starts in it.
pub fn set_env(env: &[(String, String)]) {
    for (key, value) in env {
        std::env::set_var(key, value);
    }
}

/// The S3 server: `HOARD_TEST_S3_ENDPOINT`, or moto started for this process.
pub fn s3() -> &'static S3Server {
    static SERVER: OnceLock<S3Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let var = |name: &str, default: &str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| default.to_owned())
        };
        let (endpoint, emulator) = match endpoint_from_env("HOARD_TEST_S3_ENDPOINT") {
            Some(endpoint) => (endpoint, None),
            None => {
                let emulator = Emulator::start("moto (S3)", &moto_program(), moto_args);
                (emulator.endpoint.clone(), Some(emulator))
            }
        };
        S3Server {
            endpoint,
            access_key_id: var("HOARD_TEST_S3_ACCESS_KEY_ID", "hoard-test"),
            secret_access_key: var("HOARD_TEST_S3_SECRET_ACCESS_KEY", "hoard-test-secret"),
            region: var("HOARD_TEST_S3_REGION", "us-east-1"),
            emulator,
        }
    })
}

/// An S3 server (moto) of one test's own, which the test may kill, start again, pause and
/// empty: never the shared [`s3`], which other tests use. It keeps its data in memory, so a
/// server started again is empty until the test makes its bucket anew.
pub struct PrivateS3 {
    pub server: S3Server,
    port: u16,
}

impl PrivateS3 {
    /// moto, started for the calling test on a free loopback port.
    pub fn start() -> Self {
        let emulator = Emulator::start("moto (private S3)", &moto_program(), moto_args);
        let port = emulator.port();
        Self {
            server: S3Server {
                endpoint: emulator.endpoint.clone(),
                access_key_id: "hoard-test".into(),
                secret_access_key: "hoard-test-secret".into(),
                region: "us-east-1".into(),
                emulator: Some(emulator),
            },
            port,
        }
    }

    /// The server's own process (under its watchdog shell).
    fn pid(&self) -> u32 {
        self.server
            .emulator
            .as_ref()
            .expect("the private S3 server is running")
            .program_pid()
    }

    /// Kills the server (SIGKILL): connections to its port are refused from then on.
    pub fn kill(&mut self) {
        let pid = self.pid();
        signal(pid, "KILL");
        let emulator = self.server.emulator.take().unwrap();
        let mut watchdog = emulator.watchdog.lock().unwrap();
        let _ = watchdog.wait();
    }

    /// Starts the server again on the same port, empty (no bucket).
    pub fn start_again(&mut self) {
        assert!(self.server.emulator.is_none(), "kill it first");
        // The port is free once the old process is gone; a moment may pass before it is.
        for _ in 0..50 {
            if let Ok(emulator) =
                Emulator::start_on("moto (private S3)", &moto_program(), &moto_args, self.port)
            {
                self.server.emulator = Some(emulator);
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "cannot start the private S3 server again on port {}",
            self.port
        );
    }

    /// Pauses the server (SIGSTOP): connections are accepted by the kernel and answered by
    /// no one.
    pub fn pause(&self) {
        signal(self.pid(), "STOP");
    }

    /// Lets a paused server go on (SIGCONT).
    pub fn resume(&self) {
        signal(self.pid(), "CONT");
    }

    /// Empties the server (moto's reset: every bucket and object gone) and makes `bucket`
    /// anew, empty: a bucket emptied or made again under a running hoard.
    pub fn empty_and_make(&self, bucket: &str) {
        let (status, body) = http(&self.server.endpoint, "POST", "/moto-api/reset", &[])
            .unwrap_or_else(|e| panic!("the private S3 server does not answer: {e}"));
        assert_eq!(status, 200, "moto reset: {body}");
        self.make_bucket(bucket);
    }

    /// Makes the empty bucket `bucket`.
    pub fn make_bucket(&self, bucket: &str) {
        let (status, body) = self.server.signed_request("PUT", &format!("/{bucket}"));
        assert_eq!(status, 200, "cannot create bucket {bucket}: {body}");
    }
}

impl Drop for PrivateS3 {
    fn drop(&mut self) {
        // A paused server would not hear its watchdog's TERM.
        if let Some(emulator) = &self.server.emulator {
            signal(emulator.program_pid(), "CONT");
        }
    }
}

fn moto_program() -> PathBuf {
    emulators_dir().join("venv/bin/moto_server")
}

fn moto_args(port: u16) -> Vec<String> {
    ["-H", "127.0.0.1", "-p", &port.to_string()]
        .map(String::from)
        .to_vec()
}

/// Sends `signal` (a name such as `STOP`) to `pid`.
fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// Azurite's Blob service: `HOARD_TEST_AZURITE_ENDPOINT`, or Azurite started for this process.
pub fn azurite() -> &'static AzuriteServer {
    static SERVER: OnceLock<AzuriteServer> = OnceLock::new();
    SERVER.get_or_init(|| match endpoint_from_env("HOARD_TEST_AZURITE_ENDPOINT") {
        Some(endpoint) => AzuriteServer {
            endpoint,
            emulator: None,
        },
        None => {
            let program = emulators_dir().join("azurite/node_modules/.bin/azurite-blob");
            let emulator = Emulator::start("Azurite (Blob)", &program, |port| {
                let port = port.to_string();
                let args = [
                    "--blobHost",
                    "127.0.0.1",
                    "--blobPort",
                    &port,
                    "--inMemoryPersistence",
                    "--silent",
                    "--loose",
                    "--skipApiVersionCheck",
                    "--disableTelemetry",
                ];
                args.map(String::from).to_vec()
            });
            AzuriteServer {
                endpoint: emulator.endpoint.clone(),
                emulator: Some(emulator),
            }
        }
    })
}

/// The GCS XML API: `HOARD_TEST_GCS_ENDPOINT`, or this process's [`s3`] (moto speaks it too).
pub fn gcs() -> &'static GcsServer {
    static SERVER: OnceLock<GcsServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let (base_url, s3) = match endpoint_from_env("HOARD_TEST_GCS_ENDPOINT") {
            Some(endpoint) => (endpoint, None),
            None => {
                let s3 = s3();
                (s3.endpoint.clone(), Some(s3))
            }
        };
        let key = serde_json::json!({
            "type": "service_account",
            "client_email": "hoard-test@hoard-test.iam.gserviceaccount.com",
            "private_key_id": "hoard-test",
            "private_key": gcs_private_key(),
            "gcs_base_url": base_url,
        });
        GcsServer {
            base_url,
            service_account_key: key.to_string(),
            s3,
        }
    })
}

impl S3Server {
    /// Creates a new empty bucket and returns its name.
    pub fn bucket(&self) -> String {
        let name = unique_name();
        let (status, body) = self.signed_request("PUT", &format!("/{name}"));
        assert_eq!(
            status, 200,
            "cannot create bucket {name} on {}: {body}",
            self.endpoint
        );
        name
    }

    /// The environment that points object_store's `AmazonS3Builder::from_env` here.
    pub fn env(&self) -> Vec<(String, String)> {
        pairs(&[
            ("AWS_ENDPOINT", self.endpoint.as_str()),
            ("AWS_ACCESS_KEY_ID", self.access_key_id.as_str()),
            ("AWS_SECRET_ACCESS_KEY", self.secret_access_key.as_str()),
            ("AWS_REGION", self.region.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
        ])
    }

    /// An AWS SigV4-signed request without a body; the status and the body.
    fn signed_request(&self, method: &str, path: &str) -> (u16, String) {
        let host = authority(&self.endpoint);
        let (amz_date, date) = amz_dates(SystemTime::now());
        let empty_hash = hex::encode(Sha256::digest(b""));
        let signed_headers = "host;x-amz-content-sha256;x-amz-date";
        let canonical = format!(
            "{method}\n{path}\n\nhost:{host}\nx-amz-content-sha256:{empty_hash}\nx-amz-date:{amz_date}\n\n{signed_headers}\n{empty_hash}"
        );
        let scope = format!("{date}/{}/s3/aws4_request", self.region);
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
            hex::encode(Sha256::digest(canonical.as_bytes()))
        );
        let mut key = hmac_sha256(format!("AWS4{}", self.secret_access_key).as_bytes(), &date);
        for part in [self.region.as_str(), "s3", "aws4_request"] {
            key = hmac_sha256(&key, part);
        }
        let signature = hex::encode(hmac_sha256(&key, &to_sign));
        let authorization = format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
            self.access_key_id
        );
        let headers = [
            ("x-amz-date", amz_date),
            ("x-amz-content-sha256", empty_hash),
            ("Authorization", authorization),
        ];
        http(&self.endpoint, method, path, &headers)
            .unwrap_or_else(|e| panic!("S3 server {} does not answer: {e}", self.endpoint))
    }
}

impl AzuriteServer {
    /// The account's Blob service URL, e.g. `http://127.0.0.1:41235/devstoreaccount1`.
    pub fn account_url(&self) -> String {
        format!("{}/{AZURITE_ACCOUNT}", self.endpoint)
    }

    /// Creates a new empty container and returns its name.
    pub fn container(&self) -> String {
        let name = unique_name();
        let path = format!("/{AZURITE_ACCOUNT}/{name}");
        let date = httpdate::fmt_http_date(SystemTime::now());
        // Shared Key: the verb, eleven empty standard headers, the x-ms- headers, the resource.
        let to_sign = format!(
            "PUT\n{}x-ms-date:{date}\nx-ms-version:{AZURE_VERSION}\n/{AZURITE_ACCOUNT}{path}\nrestype:container",
            "\n".repeat(11)
        );
        let key = base64::engine::general_purpose::STANDARD
            .decode(AZURITE_KEY)
            .unwrap();
        let signature =
            base64::engine::general_purpose::STANDARD.encode(hmac_sha256(&key, &to_sign));
        let headers = [
            ("x-ms-date", date),
            ("x-ms-version", AZURE_VERSION.to_owned()),
            (
                "Authorization",
                format!("SharedKey {AZURITE_ACCOUNT}:{signature}"),
            ),
        ];
        let (status, body) = http(
            &self.endpoint,
            "PUT",
            &format!("{path}?restype=container"),
            &headers,
        )
        .unwrap_or_else(|e| panic!("Azurite {} does not answer: {e}", self.endpoint));
        assert_eq!(
            status, 201,
            "cannot create container {name} on {}: {body}",
            self.endpoint
        );
        name
    }

    /// The environment that points object_store's `MicrosoftAzureBuilder::from_env` here, as
    /// an account with a custom endpoint (configuration keys only).
    pub fn env(&self) -> Vec<(String, String)> {
        pairs(&[
            ("AZURE_STORAGE_ACCOUNT_NAME", AZURITE_ACCOUNT),
            ("AZURE_STORAGE_ACCOUNT_KEY", AZURITE_KEY),
            ("AZURE_STORAGE_ENDPOINT", &self.account_url()),
            ("AZURE_ALLOW_HTTP", "true"),
        ])
    }

    /// The same through object_store's emulator switch (`AZURE_STORAGE_USE_EMULATOR`).
    pub fn emulator_env(&self) -> Vec<(String, String)> {
        pairs(&[
            ("AZURE_STORAGE_USE_EMULATOR", "true"),
            // Read by object_store from the process environment only, never as a config key.
            ("AZURITE_BLOB_STORAGE_URL", self.endpoint.as_str()),
        ])
    }
}

impl GcsServer {
    /// Creates a new empty bucket and returns its name.
    pub fn bucket(&self) -> String {
        if let Some(s3) = self.s3 {
            return s3.bucket();
        }
        // Another S3-like XML server takes an unsigned PUT; a GCS emulator takes the JSON API.
        let name = unique_name();
        let (status, body) = http(&self.base_url, "PUT", &format!("/{name}"), &[])
            .unwrap_or_else(|e| panic!("GCS server {} does not answer: {e}", self.base_url));
        if status == 200 {
            return name;
        }
        let json = serde_json::json!({ "name": name }).to_string();
        let (status, json_body) = http_with_body(
            &self.base_url,
            "POST",
            "/storage/v1/b?project=hoard-test",
            &[("Content-Type", "application/json".to_owned())],
            json.as_bytes(),
        )
        .unwrap();
        assert_eq!(
            status, 200,
            "cannot create bucket {name} on {}: {body} / {json_body}",
            self.base_url
        );
        name
    }

    /// The environment that points object_store's `GoogleCloudStorageBuilder::from_env` here.
    pub fn env(&self) -> Vec<(String, String)> {
        pairs(&[(
            "GOOGLE_SERVICE_ACCOUNT_KEY",
            self.service_account_key.as_str(),
        )])
    }
}

/// A started emulator: the watchdog shell it runs under, and what it printed lately.
struct Emulator {
    /// Base URL, `http://127.0.0.1:PORT`.
    endpoint: String,
    /// Holding it holds the watchdog's standard input open; it is never dropped.
    watchdog: Mutex<Child>,
    log: Arc<Mutex<VecDeque<String>>>,
}

/// Runs `"$@"` until it exits or until standard input (fd 3 once moved) reaches end of file,
/// which happens when the process that holds the pipe's other end exits; then kills it.
const WATCHDOG: &str = r#"exec 3<&0 </dev/null 2>&1
"$@" & child=$!
{
  while read -r _ <&3; do :; done
  kill "$child" 2>/dev/null
  for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$child" 2>/dev/null || exit 0; sleep 0.5; done
  kill -9 "$child" 2>/dev/null
} &
watcher=$!
wait "$child"; status=$?
kill "$watcher" 2>/dev/null
exit "$status""#;

impl Emulator {
    /// Starts `program` with `args(port)` on a free loopback port and waits until it answers.
    fn start(name: &str, program: &Path, args: impl Fn(u16) -> Vec<String>) -> Self {
        assert!(
            program.exists(),
            "{name}: {} is missing; run scripts/emulators to install the emulators (or point \
             HOARD_TEST_S3_ENDPOINT / HOARD_TEST_AZURITE_ENDPOINT / HOARD_TEST_GCS_ENDPOINT at a \
             running server)",
            program.display()
        );
        let mut last_log = Vec::new();
        // Another process may take the free port before the emulator binds it: try another.
        for _ in 0..5 {
            match Self::start_on(name, program, &args, free_port()) {
                Ok(emulator) => return emulator,
                Err(log) => last_log = log,
            }
        }
        panic!("{name} found no free port:\n{}", last_log.join("\n"));
    }

    /// Starts `program` on `port` and waits until it answers; its last lines if the port was
    /// taken.
    fn start_on(
        name: &str,
        program: &Path,
        args: &impl Fn(u16) -> Vec<String>,
        port: u16,
    ) -> Result<Self, Vec<String>> {
        let started = Instant::now();
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("sh")
            .arg(program)
            .args(args(port))
            .current_dir(std::env::temp_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: cannot start {}: {e}", program.display()));
        let log = Arc::new(Mutex::new(VecDeque::new()));
        {
            let log = log.clone();
            let out = BufReader::new(child.stdout.take().unwrap());
            std::thread::spawn(move || {
                for line in out.lines().map_while(Result::ok) {
                    let mut log = log.lock().unwrap();
                    if log.len() == 200 {
                        log.pop_front();
                    }
                    log.push_back(line);
                }
            });
        }
        let endpoint = format!("http://127.0.0.1:{port}");
        loop {
            if http(&endpoint, "GET", "/", &[]).is_ok() {
                if std::env::var_os("HOARD_TEST_EMULATOR_TIMING").is_some() {
                    eprintln!(
                        "{name} answered on {endpoint} after {:?}",
                        started.elapsed()
                    );
                }
                return Ok(Self {
                    endpoint,
                    watchdog: Mutex::new(child),
                    log,
                });
            }
            if let Some(status) = child.try_wait().unwrap() {
                // Give the reader thread a moment to take the last lines.
                std::thread::sleep(Duration::from_millis(50));
                let last_log: Vec<String> = log.lock().unwrap().iter().cloned().collect();
                let busy = last_log
                    .iter()
                    .any(|l| l.contains("in use") || l.contains("EADDRINUSE"));
                assert!(
                    busy,
                    "{name} exited ({status}) before answering:\n{}",
                    last_log.join("\n")
                );
                return Err(last_log);
            }
            if started.elapsed() > START_TIMEOUT {
                let _ = child.kill();
                let lines: Vec<String> = log.lock().unwrap().iter().cloned().collect();
                panic!(
                    "{name} did not answer on {endpoint} within {START_TIMEOUT:?}:\n{}",
                    lines.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The loopback port it listens on.
    fn port(&self) -> u16 {
        authority(&self.endpoint)
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap()
    }

    /// The emulator's own process: the watchdog's child that is not a shell.
    fn program_pid(&self) -> u32 {
        let watchdog = self.watchdog.lock().unwrap().id();
        let children =
            std::fs::read_to_string(format!("/proc/{watchdog}/task/{watchdog}/children"))
                .unwrap_or_default();
        children
            .split_whitespace()
            .filter_map(|pid| pid.parse::<u32>().ok())
            .find(|pid| {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                comm.trim() != "sh"
            })
            .unwrap_or_else(|| panic!("the emulator under watchdog {watchdog} is not running"))
    }

    /// The last lines the emulator printed.
    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().iter().cloned().collect()
    }
}

/// The directory `scripts/emulators` installs into.
pub fn emulators_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    match std::env::var_os("HOARD_EMULATORS_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("target/emulators"),
    }
}

/// A PKCS#8 RSA key for the GCS service account, made once with openssl and kept.
fn gcs_private_key() -> String {
    let path = emulators_dir().join("gcs-test-key.pem");
    if let Ok(pem) = std::fs::read_to_string(&path) {
        return pem;
    }
    let out = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .output()
        .unwrap_or_else(|e| panic!("openssl is needed to make a GCS test key: {e}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "openssl genpkey failed: {err}");
    let pem = String::from_utf8(out.stdout).unwrap();
    // Other test processes may do the same at once: each renames a whole file into place.
    std::fs::create_dir_all(emulators_dir()).unwrap();
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, &pem).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    pem
}

/// A bucket or container name no other test uses. Letters and digits only: object_store's GCS
/// client percent-encodes every other character of the bucket name, which moto does not decode.
fn unique_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "hoardtest{:012x}{:08x}{}",
        nanos & 0xffff_ffff_ffff,
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The endpoint an environment variable names, if it is set and not empty.
fn endpoint_from_env(var: &str) -> Option<String> {
    let value = std::env::var(var).ok().filter(|v| !v.is_empty())?;
    assert!(
        value.starts_with("http://"),
        "{var} must be a plain http:// URL, not {value:?}"
    );
    Some(value.trim_end_matches('/').to_owned())
}

/// A loopback port nothing listens on right now.
/// A free loopback port below the kernel's ephemeral range: a server stopped and started
/// again on it (the private S3, a private PostgreSQL) never finds it taken as the local port of
/// one of the many client connections made meanwhile, which the kernel picks in that range.
pub fn free_port() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (first, span) = (10_000u16, low.saturating_sub(10_000).max(1));
    // Spread the tries of concurrent test processes by their ids and a counter.
    static NEXT: AtomicU64 = AtomicU64::new(0);
    for _ in 0..1000 {
        let n =
            u64::from(std::process::id()) * 7919 + NEXT.fetch_add(1, Ordering::Relaxed) * 104_729;
        let port = first + (n % u64::from(span)) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `HOST:PORT` of an `http://HOST:PORT[/...]` URL.
fn authority(endpoint: &str) -> &str {
    let rest = endpoint.strip_prefix("http://").unwrap_or(endpoint);
    rest.split('/').next().unwrap_or(rest)
}

/// One HTTP/1.1 request without a body on a fresh connection; the status and the body.
fn http(
    endpoint: &str,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
) -> std::io::Result<(u16, String)> {
    http_with_body(endpoint, method, path, headers, b"")
}

/// One HTTP/1.1 request on a fresh connection; the status and the body (as text).
fn http_with_body(
    endpoint: &str,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    let host = authority(endpoint);
    let mut stream = TcpStream::connect(host)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| text.strip_prefix("HTTP/1.0 "))
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {text:?}")))?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned());
    Ok((status, body.unwrap_or_default()))
}

/// HMAC-SHA256 of `data` under `key`.
fn hmac_sha256(key: &[u8], data: &str) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
    mac.update(data.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

/// `YYYYMMDDTHHMMSSZ` and `YYYYMMDD` of `time`, in UTC, for AWS SigV4.
fn amz_dates(time: SystemTime) -> (String, String) {
    let secs = time.duration_since(UNIX_EPOCH).unwrap().as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let (era, doe) = (z / 146_097, z % 146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    let date = format!("{year:04}{month:02}{day:02}");
    let time = format!(
        "{:02}{:02}{:02}",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    );
    (format!("{date}T{time}Z"), date)
}

/// Owned copies of `(name, value)` pairs.
fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}
