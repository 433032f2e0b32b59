//! The edge's counters and their Prometheus text (`/metrics`): downloads served from its disk
//! or fetched, bytes from the origin and to clients, lookups and saves the origin could not
//! decide.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::origin::Origin;
use crate::store::Store;

#[derive(Debug, Default)]
pub struct Counters {
    /// Downloads served from a copy on the edge's disk.
    pub hits: AtomicU64,
    /// Downloads of entries the edge had no copy of (fetched once, or joined a fetch).
    pub misses: AtomicU64,
    /// Downloads streamed from the origin without a copy (too large to keep, or a disk error).
    pub passed: AtomicU64,
    pub bytes_from_origin: AtomicU64,
    pub bytes_served: AtomicU64,
    pub lookups_hit: AtomicU64,
    pub lookups_miss: AtomicU64,
    /// Lookups answered as misses because the origin did not answer in time.
    pub lookups_unanswered: AtomicU64,
    /// Saves refused because the origin could not be reached.
    pub saves_refused: AtomicU64,
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} counter");
    let _ = writeln!(out, "{name} {value}");
}

fn gauge(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} gauge");
    let _ = writeln!(out, "{name} {value}");
}

/// The exposition of every counter.
pub fn render(counters: &Counters, store: &Store, origin: &Origin) -> String {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let mut out = String::with_capacity(2048);
    counter(
        &mut out,
        "hoard_edge_hits_total",
        "Downloads served from a copy on the edge's disk.",
        get(&counters.hits),
    );
    counter(
        &mut out,
        "hoard_edge_misses_total",
        "Downloads of entries the edge had no copy of (each entry fetched from the origin once).",
        get(&counters.misses),
    );
    counter(
        &mut out,
        "hoard_edge_passed_total",
        "Downloads streamed from the origin without keeping a copy.",
        get(&counters.passed),
    );
    counter(
        &mut out,
        "hoard_edge_bytes_from_origin_total",
        "Bytes of entries received from the origin.",
        get(&counters.bytes_from_origin),
    );
    counter(
        &mut out,
        "hoard_edge_bytes_served_total",
        "Bytes of entries sent to clients.",
        get(&counters.bytes_served),
    );
    let _ = writeln!(out, "# HELP hoard_edge_lookups_total Lookups through the edge, by outcome (unanswered: the origin did not answer in time, told as a miss).");
    let _ = writeln!(out, "# TYPE hoard_edge_lookups_total counter");
    for (outcome, c) in [
        ("hit", &counters.lookups_hit),
        ("miss", &counters.lookups_miss),
        ("unanswered", &counters.lookups_unanswered),
    ] {
        let _ = writeln!(
            out,
            "hoard_edge_lookups_total{{outcome=\"{outcome}\"}} {}",
            get(c)
        );
    }
    counter(
        &mut out,
        "hoard_edge_saves_refused_total",
        "Saves refused because the origin could not be reached.",
        get(&counters.saves_refused),
    );
    counter(
        &mut out,
        "hoard_edge_evictions_total",
        "Copies removed to keep within --max-bytes.",
        get(&store.counters.evictions),
    );
    counter(
        &mut out,
        "hoard_edge_damaged_copies_total",
        "Copies found damaged on disk, dropped and never served.",
        get(&store.counters.damaged),
    );
    let (stored, copies) = store.usage();
    gauge(
        &mut out,
        "hoard_edge_stored_bytes",
        "Bytes of the copies on disk.",
        stored,
    );
    gauge(
        &mut out,
        "hoard_edge_copies",
        "Copies on disk.",
        copies as u64,
    );
    gauge(
        &mut out,
        "hoard_edge_max_bytes",
        "The most the copies may take (--max-bytes).",
        store.max_bytes(),
    );
    let _ = writeln!(
        out,
        "# HELP hoard_edge_origin_up Whether each origin address answered its last check."
    );
    let _ = writeln!(out, "# TYPE hoard_edge_origin_up gauge");
    for (base, up) in origin.states() {
        let _ = writeln!(
            out,
            "hoard_edge_origin_up{{origin=\"{}\"}} {}",
            base.replace(['"', '\\', '\n'], ""),
            u8::from(up)
        );
    }
    out
}
