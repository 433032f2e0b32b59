//! The tools phase: build tools' small objects, as Bazel's HTTP cache and Turborepo's remote
//! cache API send them (BENCHMARKS.md: "build tools' small objects (GET/PUT, 1–64 KiB)"). Each
//! round PUTs a set of distinct objects, then GETs every one back and checks it, so that the
//! anchors (bazel-remote, turborepo-remote-cache) and hoard are measured on the same requests.

use std::time::Instant;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use rand::{Rng, SeedableRng};
use sha2::Digest;

use super::client::{BenchError, Client, Result};
use super::progress::Progress;
use super::report::format_value;
use super::stats::percentile;

/// The smallest and largest object, in bytes.
const SIZES: (usize, usize) = (1 << 10, 64 << 10);
/// Requests in flight, as a build fanning out over its actions has.
pub const CONCURRENCY: usize = 32;
/// The team every Turborepo request names (`slug`): the anchor requires one.
const TEAM: &str = "bench";

/// A protocol of the phase, and where a target serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolApi {
    /// Bazel's HTTP remote cache: `PUT/GET {prefix}/cas/<sha256>`.
    Bazel { prefix: String },
    /// Turborepo's remote cache API: `PUT/GET /v8/artifacts/<hash>?slug=…`, with the token.
    Turbo,
}

impl ToolApi {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Bazel { .. } => "Bazel CAS",
            Self::Turbo => "Turborepo",
        }
    }

    /// What a hoard serves (and the reference servers, which answer any path).
    pub fn hoard() -> Vec<ToolApi> {
        vec![
            ToolApi::Bazel {
                prefix: "/_bazel".into(),
            },
            ToolApi::Turbo,
        ]
    }

    /// `--tool-api`'s value, a list of: `bazel` (at the root, as bazel-remote serves it, or
    /// `bazel:/PREFIX`), `turbo`, `none`.
    pub fn parse_list(raw: &str) -> std::result::Result<Vec<ToolApi>, String> {
        raw.split(',')
            .filter(|s| !s.is_empty())
            .map(|s| match s {
                "bazel" => Ok(Some(ToolApi::Bazel {
                    prefix: String::new(),
                })),
                _ if s.starts_with("bazel:/") => Ok(Some(ToolApi::Bazel {
                    prefix: s["bazel:".len()..].trim_end_matches('/').to_owned(),
                })),
                "turbo" => Ok(Some(ToolApi::Turbo)),
                "none" => Ok(None),
                other => Err(format!("unknown tool API {other:?} (bazel, turbo or none)")),
            })
            .filter_map(|r| r.transpose())
            .collect()
    }
}

/// The report's rows for the API named `name`: PUT/s, PUT p99, GET/s, GET p99.
pub fn row_labels(name: &str) -> [&'static str; 4] {
    match name {
        "Bazel CAS" => [
            "Tools: Bazel CAS PUT",
            "Tools: Bazel CAS PUT p99",
            "Tools: Bazel CAS GET",
            "Tools: Bazel CAS GET p99",
        ],
        _ => [
            "Tools: Turborepo PUT",
            "Tools: Turborepo PUT p99",
            "Tools: Turborepo GET",
            "Tools: Turborepo GET p99",
        ],
    }
}

/// One API's figures for one round.
#[derive(Debug, Clone, Default)]
pub struct ApiFigures {
    pub put_per_s: f64,
    pub put_p99_ms: f64,
    pub get_per_s: f64,
    pub get_p99_ms: f64,
}

/// A round's objects: their sizes vary from 1 to 64 KiB (log-uniform, as a build's outputs
/// do), their bytes are fresh for the round (the tag is in them), so no server has them yet.
pub struct Objects {
    pub bodies: Vec<Bytes>,
}

impl Objects {
    pub fn generate(count: usize, tag: &str, seed: u64) -> Self {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let (lo, hi) = (SIZES.0 as f64, SIZES.1 as f64);
        let bodies = (0..count)
            .map(|i| {
                let size = (lo * (hi / lo).powf(rng.random::<f64>())) as usize;
                let mut body = vec![0u8; size.max(64)];
                rng.fill(&mut body[..]);
                let stamp = format!("{tag}/{i}/");
                let n = stamp.len().min(body.len());
                body[..n].copy_from_slice(&stamp.as_bytes()[..n]);
                Bytes::from(body)
            })
            .collect();
        Self { bodies }
    }

    pub fn bytes(&self) -> u64 {
        self.bodies.iter().map(|b| b.len() as u64).sum()
    }
}

/// The URL of object `body` under `api`.
fn url(base: &str, api: &ToolApi, body: &[u8]) -> String {
    let hash = hex(&sha2::Sha256::digest(body));
    match api {
        ToolApi::Bazel { prefix } => format!("{base}{prefix}/cas/{hash}"),
        // Turborepo names artifacts by a task hash of 16 hex digits; the content's does as well.
        ToolApi::Turbo => format!("{base}/v8/artifacts/{}?slug={TEAM}", &hash[..16]),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// PUTs every object, then GETs every one and checks it: the figures of `api` on `client`.
pub async fn run(
    client: &Client,
    api: &ToolApi,
    objects: &Objects,
    progress: &Progress,
) -> Result<ApiFigures> {
    let urls: Vec<String> = objects
        .bodies
        .iter()
        .map(|b| url(client.base(), api, b))
        .collect();
    let label = |method: &str| format!("tools: {} {method}", api.name());
    let (put_per_s, put_p99_ms) = timed(
        &label("PUT"),
        &urls,
        objects,
        progress,
        |url, body| async move {
            let res = client
                .http()
                .put(url)
                .bearer_auth(client.token())
                .header("content-type", "application/octet-stream")
                .header("x-artifact-duration", "120")
                .body(body.clone())
                .send()
                .await?;
            let status = res.status();
            // Read to the end, so that the connection is reused.
            let text = res.bytes().await?;
            if !status.is_success() {
                return Err(BenchError::Protocol(format!(
                    "PUT {url}: HTTP {status}: {}",
                    String::from_utf8_lossy(&text[..text.len().min(300)])
                )));
            }
            Ok(())
        },
    )
    .await?;
    let (get_per_s, get_p99_ms) = timed(
        &label("GET"),
        &urls,
        objects,
        progress,
        |url, body| async move {
            let res = client
                .http()
                .get(url)
                .bearer_auth(client.token())
                .send()
                .await?;
            let status = res.status();
            let got = res.bytes().await?;
            if status != 200 {
                return Err(BenchError::Protocol(format!("GET {url}: HTTP {status}")));
            }
            if got.len() != body.len() || (client.verify_content && got != *body) {
                return Err(BenchError::Protocol(format!(
                    "GET {url}: {} bytes that are not the {} PUT",
                    got.len(),
                    body.len()
                )));
            }
            Ok(())
        },
    )
    .await?;
    Ok(ApiFigures {
        put_per_s,
        put_p99_ms,
        get_per_s,
        get_p99_ms,
    })
}

/// `request` for every object at [`CONCURRENCY`] at once: requests per second and the p99 in
/// milliseconds.
async fn timed<'a, F, Fut>(
    name: &str,
    urls: &'a [String],
    objects: &'a Objects,
    progress: &Progress,
    request: F,
) -> Result<(f64, f64)>
where
    F: Fn(&'a str, &'a Bytes) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let n = urls.len();
    let bar = progress.phase(name, n as u64, "objects");
    let started = Instant::now();
    let latencies: Vec<f64> = futures_util::stream::iter(urls.iter().zip(&objects.bodies))
        .map(|(url, body)| {
            let (bar, request) = (&bar, &request);
            async move {
                let t = Instant::now();
                request(url, body).await?;
                bar.inc(1);
                Ok::<_, BenchError>(t.elapsed().as_secs_f64() * 1000.0)
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await?;
    let per_s = n as f64 / started.elapsed().as_secs_f64();
    let p99_ms = percentile(&latencies, 99.0).unwrap_or(0.0);
    bar.finish(&format!(
        "{n} objects, {CONCURRENCY} at once: {}/s, p99 {} ms",
        format_value(per_s, "/s"),
        format_value(p99_ms, "ms")
    ));
    Ok((per_s, p99_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_distinct_sized_within_bounds_and_fresh_per_round() {
        let a = Objects::generate(200, "r1", 7);
        let b = Objects::generate(200, "r2", 7);
        assert!(a
            .bodies
            .iter()
            .all(|o| (SIZES.0..=SIZES.1).contains(&o.len())));
        let small = a.bodies.iter().filter(|o| o.len() < 8 << 10).count();
        let large = a.bodies.iter().filter(|o| o.len() > 32 << 10).count();
        assert!(small > 20 && large > 20, "{small} small, {large} large");
        let mut hashes: Vec<_> = a
            .bodies
            .iter()
            .chain(&b.bodies)
            .map(sha2::Sha256::digest)
            .collect();
        hashes.sort_unstable();
        hashes.dedup();
        assert_eq!(hashes.len(), 400);
    }

    #[test]
    fn urls_follow_each_protocol() {
        let body = b"hello";
        let sha = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
        assert_eq!(
            url("http://h", &ToolApi::hoard()[0], body),
            format!("http://h/_bazel/cas/{sha}")
        );
        assert_eq!(
            url("http://h", &ToolApi::Turbo, body),
            "http://h/v8/artifacts/2cf24dba5fb0a30e?slug=bench"
        );
        assert_eq!(
            ToolApi::parse_list("bazel").unwrap(),
            vec![ToolApi::Bazel {
                prefix: String::new()
            }]
        );
        assert_eq!(ToolApi::parse_list("none").unwrap(), vec![]);
        assert_eq!(
            ToolApi::parse_list("bazel:/_bazel/,turbo").unwrap(),
            ToolApi::hoard()
        );
        assert!(ToolApi::parse_list("maven").is_err());
    }
}
