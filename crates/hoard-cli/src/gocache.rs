//! `hoard gocache`: Go's build cache program (`GOCACHEPROG="hoard gocache"`, Go 1.24 and
//! later). Go sends its requests as JSON lines on stdin (`cmd/go/internal/cacheprog`): `get` an
//! action's output, `put` one, `close`. Outputs live in a local directory, as Go needs a file
//! on disk for each; what is not there is fetched from hoard, and what Go puts is sent to it,
//! under the job's scope (`/_gocache/`: an action's record names its output, an output is
//! named by its SHA-256), with the job's tool token (`HOARD_TOOL_TOKEN`) or runtime token. hoard unreachable or refusing: a miss, and the build goes on.

use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Where `hoard gocache` keeps its files and which hoard it talks to.
#[derive(Debug, Clone, clap::Args)]
pub struct GocacheArgs {
    /// hoard's address, such as http://hoard:3000.
    #[arg(long, env = "HOARD_URL")]
    pub url: url::Url,
    /// The job's tool token (`POST /_hoard/tools/token`, docs/build-tools/), else its
    /// runtime token from ACTIONS_RUNTIME_TOKEN.
    #[arg(long, env = "HOARD_TOOL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The local directory of outputs (default: hoard-gocache under the user's cache
    /// directory).
    #[arg(long, env = "HOARD_GOCACHE_DIR")]
    pub dir: Option<PathBuf>,
}

/// A request from the go command.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Request {
    #[serde(rename = "ID")]
    id: i64,
    command: String,
    #[serde(rename = "ActionID", default, with = "opt_base64")]
    action_id: Option<Vec<u8>>,
    #[serde(rename = "OutputID", default, with = "opt_base64")]
    output_id: Option<Vec<u8>>,
    #[serde(default)]
    body_size: u64,
}

/// An answer to the go command.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
struct Response {
    #[serde(rename = "ID")]
    id: i64,
    #[serde(skip_serializing_if = "String::is_empty")]
    err: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    known_commands: Vec<&'static str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    miss: bool,
    #[serde(
        rename = "OutputID",
        skip_serializing_if = "Option::is_none",
        with = "opt_base64"
    )]
    output_id: Option<Vec<u8>>,
    #[serde(skip_serializing_if = "is_zero")]
    size: u64,
    /// When the output was put (RFC 3339): `go clean -testcache` compares it.
    #[serde(skip_serializing_if = "Option::is_none")]
    time: Option<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    disk_path: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Go's `[]byte` in JSON: standard base64.
mod opt_base64 {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(bytes) => {
                s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
            }
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let raw: Option<String> = Option::deserialize(d)?;
        raw.map(|s| {
            base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(serde::de::Error::custom)
        })
        .transpose()
    }
}

/// The local directory: `a/<action>` holds `<output> <size>`, `o/<output>` the output.
struct Local {
    dir: PathBuf,
}

impl Local {
    fn record(&self, action: &str) -> PathBuf {
        self.dir.join("a").join(action)
    }

    fn output(&self, output: &str) -> PathBuf {
        self.dir.join("o").join(output)
    }

    /// The record of `action` if both it and its output's file are here.
    fn find(&self, action: &str) -> Option<Record> {
        let record = Record::parse(&std::fs::read_to_string(self.record(action)).ok()?)?;
        let on_disk = std::fs::metadata(self.output(&record.output)).ok()?.len();
        (on_disk == record.size).then_some(record)
    }

    /// Writes `bytes` to `path` whole or not at all (a reader never sees half a file).
    fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let dir = path.parent().expect("a path in the directory");
        std::fs::create_dir_all(dir)?;
        let mut file = tempfile::NamedTempFile::new_in(dir)?;
        file.write_all(bytes)?;
        file.persist(path).map_err(|e| e.error)?;
        Ok(())
    }
}

/// What an action's record says: its output, the output's size and when it was put.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    output: String,
    size: u64,
    /// Nanoseconds since the Unix epoch (0: not known).
    put_at: u64,
}

impl Record {
    /// `<output hex> <size> <put at>`.
    fn parse(text: &str) -> Option<Self> {
        let mut parts = text.split_whitespace();
        let output = parts.next()?;
        let valid = output.len() == 64 && output.bytes().all(|b| b.is_ascii_hexdigit());
        Some(Self {
            output: valid.then(|| output.to_ascii_lowercase())?,
            size: parts.next()?.parse().ok()?,
            put_at: parts.next().and_then(|t| t.parse().ok()).unwrap_or(0),
        })
    }

    fn text(&self) -> String {
        format!("{} {} {}", self.output, self.size, self.put_at)
    }

    /// The put time as Go reads it (RFC 3339 with nanoseconds, UTC).
    fn time(&self) -> Option<String> {
        (self.put_at > 0).then(|| rfc3339_nanos(self.put_at))
    }
}

/// `nanos` since the Unix epoch as RFC 3339 in UTC with nanoseconds.
fn rfc3339_nanos(nanos: u64) -> String {
    let secs = (nanos / 1_000_000_000) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // The civil date of a day number (Howard Hinnant's days_from_civil, inverted).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        nanos % 1_000_000_000
    )
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// hoard's `/_gocache/`.
struct Remote {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    /// Said once on stderr when hoard cannot be reached; the build goes on without it.
    warned: bool,
    /// hoard could not be reached once: not asked again by this process (each request would
    /// wait its time-out while Go waits).
    gone: bool,
}

impl Remote {
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self
            .http
            .request(method, format!("{}/_gocache/{path}", self.base));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    fn warn(&mut self, what: &str, e: impl std::fmt::Display) {
        if !self.warned {
            eprintln!(
                "hoard gocache: {what} at {}: {e}; going on without it",
                self.base
            );
            self.warned = true;
        }
    }

    /// hoard cannot be reached: said once, and not asked again.
    fn unreachable(&mut self, e: reqwest::Error) {
        self.warn("hoard cannot be reached", e);
        self.gone = true;
    }

    /// The body at `path`, `None` if hoard has none (or cannot say).
    async fn get(&mut self, path: &str) -> Option<Vec<u8>> {
        if self.gone {
            return None;
        }
        let answer = self.request(reqwest::Method::GET, path).send().await;
        match answer {
            Ok(res) if res.status().is_success() => match res.bytes().await {
                Ok(bytes) => Some(bytes.to_vec()),
                Err(e) => {
                    self.unreachable(e);
                    None
                }
            },
            Ok(res) if res.status() == reqwest::StatusCode::NOT_FOUND => None,
            Ok(res) => {
                self.warn("hoard refused a read", res.status());
                None
            }
            Err(e) => {
                self.unreachable(e);
                None
            }
        }
    }

    async fn put(&mut self, path: &str, body: Vec<u8>) {
        if self.gone {
            return;
        }
        let answer = self
            .request(reqwest::Method::PUT, path)
            .body(body)
            .send()
            .await;
        match answer {
            Ok(res) if res.status().is_success() => {}
            // A token that writes nowhere (a read-only job): reads still help.
            Ok(res) if res.status() == reqwest::StatusCode::FORBIDDEN => {}
            Ok(res) => self.warn("hoard refused a write", res.status()),
            Err(e) => self.unreachable(e),
        }
    }
}

/// Serves the go command on stdin and stdout until it says `close` or its stdin ends.
pub async fn run(args: GocacheArgs) -> Result<(), String> {
    let dir = match args.dir {
        Some(dir) => dir,
        None => default_dir()?,
    };
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // Go takes only absolute paths for its outputs.
    let dir = dir
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", dir.display()))?;
    let local = Local { dir };
    let http = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(3))
        .read_timeout(std::time::Duration::from_secs(30))
        .build()
        .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
    let mut remote = Remote {
        http,
        base: args.url.as_str().trim_end_matches('/').to_owned(),
        token: args
            .token
            .or_else(|| std::env::var("ACTIONS_RUNTIME_TOKEN").ok())
            .filter(|t| !t.is_empty()),
        warned: false,
        gone: false,
    };
    // Go waits for each answer's line: plain blocking reads and writes between requests.
    let mut stdin = std::io::stdin().lock().lines();
    let mut stdout = std::io::stdout().lock();
    let io = |e: std::io::Error| format!("talking to the go command: {e}");
    let mut send = |r: &Response| -> Result<(), String> {
        let mut line = serde_json::to_vec(r).expect("a response serializes");
        line.push(b'\n');
        stdout.write_all(&line).map_err(io)?;
        stdout.flush().map_err(io)
    };
    send(&Response {
        known_commands: vec!["get", "put", "close"],
        ..Response::default()
    })?;
    while let Some(line) = stdin.next().transpose().map_err(io)? {
        if line.trim().is_empty() {
            continue;
        }
        let request: Request = serde_json::from_str(&line)
            .map_err(|e| format!("the go command sent what is not a request ({e}): {line}"))?;
        let body = if request.command == "put" && request.body_size > 0 {
            // Go ends the request with an empty line, then sends the body's line.
            let raw = loop {
                let line = stdin
                    .next()
                    .transpose()
                    .map_err(io)?
                    .ok_or("the go command ended a put before its body")?;
                if !line.trim().is_empty() {
                    break line;
                }
            };
            let encoded: String = serde_json::from_str(&raw)
                .map_err(|e| format!("a put's body is not a JSON string: {e}"))?;
            base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|e| format!("a put's body is not base64: {e}"))?
        } else {
            Vec::new()
        };
        let close = request.command == "close";
        send(&answer(&local, &mut remote, request, body).await)?;
        if close {
            break;
        }
    }
    Ok(())
}

/// `$XDG_CACHE_HOME/hoard-gocache`, or `~/.cache/hoard-gocache`.
fn default_dir() -> Result<PathBuf, String> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .ok_or("no --dir, HOARD_GOCACHE_DIR, XDG_CACHE_HOME or HOME")?;
    Ok(base.join("hoard-gocache"))
}

async fn answer(local: &Local, remote: &mut Remote, request: Request, body: Vec<u8>) -> Response {
    let id = request.id;
    let failed = |err: String| Response {
        id,
        err,
        ..Response::default()
    };
    let action = request.action_id.as_deref().map(hex::encode);
    match (request.command.as_str(), action) {
        ("close", _) => Response {
            id,
            ..Response::default()
        },
        ("get", Some(action)) => match get(local, remote, &action).await {
            Some(record) => Response {
                id,
                output_id: hex::decode(&record.output).ok(),
                size: record.size,
                time: record.time(),
                disk_path: local.output(&record.output).display().to_string(),
                ..Response::default()
            },
            None => Response {
                id,
                miss: true,
                ..Response::default()
            },
        },
        ("put", Some(action)) => {
            let Some(output) = request.output_id.as_deref().map(hex::encode) else {
                return failed("a put without an OutputID".into());
            };
            match put(local, remote, &action, &output, body).await {
                Ok(path) => Response {
                    id,
                    disk_path: path.display().to_string(),
                    ..Response::default()
                },
                Err(e) => failed(e),
            }
        }
        (command, _) => failed(format!(
            "hoard gocache does not know {command:?} without an ActionID"
        )),
    }
}

/// The record of `action`: here, or fetched from hoard with its output and kept here.
async fn get(local: &Local, remote: &mut Remote, action: &str) -> Option<Record> {
    if let Some(found) = local.find(action) {
        return Some(found);
    }
    let text = remote.get(&format!("a/{action}")).await?;
    let record = Record::parse(std::str::from_utf8(&text).ok()?)?;
    let (output, size) = (&record.output, record.size);
    if std::fs::metadata(local.output(output))
        .map(|m| m.len())
        .ok()
        != Some(size)
    {
        let bytes = if size == 0 {
            Vec::new()
        } else {
            remote.get(&format!("o/{output}")).await?
        };
        // An output is named by its SHA-256: anything else is not it.
        if bytes.len() as u64 != size || hex::encode(Sha256::digest(&bytes)) != *output {
            return None;
        }
        Local::write(&local.output(output), &bytes).ok()?;
    }
    Local::write(&local.record(action), record.text().as_bytes()).ok()?;
    Some(record)
}

/// Keeps `body` as the output of `action` here, and sends both to hoard.
async fn put(
    local: &Local,
    remote: &mut Remote,
    action: &str,
    output: &str,
    body: Vec<u8>,
) -> Result<PathBuf, String> {
    let path = local.output(output);
    let record = Record {
        output: output.to_owned(),
        size: body.len() as u64,
        put_at: now_nanos(),
    };
    Local::write(&path, &body).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Local::write(&local.record(action), record.text().as_bytes())
        .map_err(|e| format!("cannot write the record of {action}: {e}"))?;
    // Go names an output by its content's SHA-256, as hoard checks.
    if record.size > 0 && hex::encode(Sha256::digest(&body)) == output {
        remote.put(&format!("o/{output}"), body).await;
    }
    remote
        .put(&format!("a/{action}"), record.text().into_bytes())
        .await;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_and_times_are_rfc_3339() {
        let record = Record {
            output: "ab".repeat(32),
            size: 42,
            put_at: 1_700_000_000_123_456_789,
        };
        assert_eq!(Record::parse(&record.text()), Some(record.clone()));
        assert_eq!(
            record.time().as_deref(),
            Some("2023-11-14T22:13:20.123456789Z")
        );
        assert_eq!(rfc3339_nanos(0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            rfc3339_nanos(951_782_400_000_000_000),
            "2000-02-29T00:00:00.000000000Z"
        );
        // Records of earlier versions had no time.
        let old = Record::parse(&format!("{} 7", "cd".repeat(32))).unwrap();
        assert_eq!((old.size, old.time()), (7, None));
        assert_eq!(Record::parse("not-hex 7 1"), None);
    }
}
