//! `hoard gocache`: Go's build cache program (`GOCACHEPROG="hoard gocache"`, Go 1.24 and
//! later). Go sends its requests as JSON lines on stdin (`cmd/go/internal/cacheprog`): `get` an
//! action's output, `put` one, `close`. Outputs live in a local directory, as Go needs a file
//! on disk for each; what is not there is fetched from hoard, and what Go puts is sent to it,
//! under the job's scope (`/_gocache/`: an action's record names its output, an output is
//! named by its SHA-256). hoard unreachable or refusing: a miss, and the build goes on.

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
    /// The job's runtime token (what `actions/cache` sends).
    #[arg(long, env = "ACTIONS_RUNTIME_TOKEN", hide_env_values = true)]
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

    /// The output of `action` if both its record and its file are here.
    fn find(&self, action: &str) -> Option<(String, u64)> {
        let (output, size) = parse_record(&std::fs::read_to_string(self.record(action)).ok()?)?;
        let on_disk = std::fs::metadata(self.output(&output)).ok()?.len();
        (on_disk == size).then_some((output, size))
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

/// `<output hex> <size>`.
fn parse_record(text: &str) -> Option<(String, u64)> {
    let (output, size) = text.trim().split_once(' ')?;
    let valid = output.len() == 64 && output.bytes().all(|b| b.is_ascii_hexdigit());
    Some((
        valid.then(|| output.to_ascii_lowercase())?,
        size.parse().ok()?,
    ))
}

/// hoard's `/_gocache/`.
struct Remote {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    /// Said once on stderr when hoard cannot be reached; the build goes on without it.
    warned: bool,
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

    /// The body at `path`, `None` if hoard has none (or cannot say).
    async fn get(&mut self, path: &str) -> Option<Vec<u8>> {
        let answer = self.request(reqwest::Method::GET, path).send().await;
        match answer {
            Ok(res) if res.status().is_success() => match res.bytes().await {
                Ok(bytes) => Some(bytes.to_vec()),
                Err(e) => {
                    self.warn("reading from hoard failed", e);
                    None
                }
            },
            Ok(res) if res.status() == reqwest::StatusCode::NOT_FOUND => None,
            Ok(res) => {
                self.warn("hoard refused a read", res.status());
                None
            }
            Err(e) => {
                self.warn("hoard cannot be reached", e);
                None
            }
        }
    }

    async fn put(&mut self, path: &str, body: Vec<u8>) {
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
            Err(e) => self.warn("hoard cannot be reached", e),
        }
    }
}

/// Serves the go command on stdin and stdout until it says `close` or its stdin ends.
pub async fn run(args: GocacheArgs) -> Result<(), String> {
    let dir = match args.dir {
        Some(dir) => dir,
        None => default_dir()?,
    };
    let local = Local { dir };
    std::fs::create_dir_all(&local.dir)
        .map_err(|e| format!("cannot create {}: {e}", local.dir.display()))?;
    let mut remote = Remote {
        http: reqwest::Client::new(),
        base: args.url.as_str().trim_end_matches('/').to_owned(),
        token: args.token.filter(|t| !t.is_empty()),
        warned: false,
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
            Some((output, size)) => Response {
                id,
                output_id: hex::decode(&output).ok(),
                size,
                disk_path: local.output(&output).display().to_string(),
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

/// The output of `action`: here, or fetched from hoard and kept here.
async fn get(local: &Local, remote: &mut Remote, action: &str) -> Option<(String, u64)> {
    if let Some(found) = local.find(action) {
        return Some(found);
    }
    let record = remote.get(&format!("a/{action}")).await?;
    let (output, size) = parse_record(std::str::from_utf8(&record).ok()?)?;
    if std::fs::metadata(local.output(&output))
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
        if bytes.len() as u64 != size || hex::encode(Sha256::digest(&bytes)) != output {
            return None;
        }
        Local::write(&local.output(&output), &bytes).ok()?;
    }
    Local::write(&local.record(action), format!("{output} {size}").as_bytes()).ok()?;
    Some((output, size))
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
    let size = body.len() as u64;
    let record = format!("{output} {size}");
    Local::write(&path, &body).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Local::write(&local.record(action), record.as_bytes())
        .map_err(|e| format!("cannot write the record of {action}: {e}"))?;
    // Go names an output by its content's SHA-256, as hoard checks.
    if size > 0 && hex::encode(Sha256::digest(&body)) == output {
        remote.put(&format!("o/{output}"), body).await;
    }
    remote
        .put(&format!("a/{action}"), record.into_bytes())
        .await;
    Ok(path)
}
