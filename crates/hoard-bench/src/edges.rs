//! The edge scenario (`--edges N`, issue #59): N `hoard edge`s in front of a hoard of their
//! own, measured as one target, `edges`. Its phases go through the first edge; its fleet jobs
//! go to the edges in turn, as runners on N nodes would. What the edges say of themselves on
//! `/metrics` gives the origin's egress (what it sent them) and each edge's hit ratio.

use std::path::Path;
use std::process::Command;

use super::{free_port, own_hoard, spawned, usage, BenchFailure, Target};

/// The edges' target: the first edge, with the others and the origin as its helpers.
pub async fn target(exe: &Path, n: usize) -> Result<Target, BenchFailure> {
    let origin = own_hoard(exe, "edges' origin", 0).await?;
    let mut edges = Vec::with_capacity(n);
    for i in 0..n {
        let dir = tempfile::tempdir().map_err(|e| usage(e.to_string()))?;
        let port = free_port()?;
        let mut cmd = Command::new(exe);
        cmd.args([
            "edge",
            "--origin",
            &origin.base,
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--max-bytes",
            "1TiB",
            "--data-dir",
        ])
        .arg(dir.path());
        cmd.env("RUST_LOG", "warn");
        // Ready once it sees the origin.
        let health = format!("http://127.0.0.1:{port}/readyz");
        let mut edge = spawned(format!("edge {i}"), cmd, &health, true).await?;
        edge._data = Some(dir);
        edges.push(edge);
    }
    let mut first = edges.remove(0);
    first.label = "edges".into();
    first.token = origin.token.clone();
    first.secret = origin.secret.clone();
    first.edges = std::iter::once(first.base.clone())
        .chain(edges.iter().map(|e| e.base.clone()))
        .collect();
    first.helpers = edges;
    first.helpers.push(origin);
    Ok(first)
}

/// An edge's counters that the report uses.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counters {
    pub from_origin: f64,
    pub hits: f64,
    pub misses: f64,
    /// Lookups answered as misses because the origin did not answer in time.
    pub unanswered: f64,
}

impl Counters {
    /// Read from the edge at `base`; zeros if it does not answer (the report then shows none).
    pub async fn of(http: &reqwest::Client, base: &str) -> Self {
        let text = match http.get(format!("{base}/metrics")).send().await {
            Ok(res) => res.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        Self {
            from_origin: value("hoard_edge_bytes_from_origin_total"),
            hits: value("hoard_edge_hits_total"),
            misses: value("hoard_edge_misses_total"),
            unanswered: value("hoard_edge_lookups_total{outcome=\"unanswered\"}"),
        }
    }

    /// What happened between `self` and `later`: bytes from the origin, the hit ratio in
    /// percent (`None` without a download), and lookups the origin did not answer in time.
    pub fn until(self, later: Self) -> (f64, Option<f64>, f64) {
        let hits = later.hits - self.hits;
        let downloads = hits + later.misses - self.misses;
        (
            later.from_origin - self.from_origin,
            (downloads > 0.0).then(|| 100.0 * hits / downloads),
            later.unanswered - self.unanswered,
        )
    }
}
