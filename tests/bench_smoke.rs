//! `hoard bench` end to end, tiny: it spawns a hoard and the null baseline, runs every scenario
//! with verified downloads, and writes a report with every row. Correctness only, no speed.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

use std::process::Command;

use serde_json::Value;

/// Runs `hoard bench ARGS… --json FILE` to success: the JSON report and the printed output.
fn bench(args: &[&str]) -> (Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_hoard"))
        .arg("bench")
        .args(args)
        .arg("--json")
        .arg(&json_path)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed:\n{stdout}\n{stderr}");
    let report = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    (report, stdout)
}

/// The report's notes.
fn notes(report: &Value) -> Vec<&str> {
    report["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect()
}

#[test]
fn a_small_bench_run_reports_every_metric_for_hoard_and_both_references() {
    let (report, stdout) = bench(&[
        "--baseline",
        "--baseline-disk",
        "--scale",
        "0.01",
        "--rounds",
        "2",
    ]);
    assert_eq!(
        report["targets"],
        serde_json::json!(["hoard", "baseline", "disk floor"])
    );
    assert_eq!(report["rounds"], 2);
    let rows = report["rows"].as_array().unwrap();
    let metrics: Vec<&str> = rows.iter().map(|r| r["metric"].as_str().unwrap()).collect();
    for expected in [
        "Startup to healthy",
        "Idle memory",
        "Peak memory",
        "Server CPU time per round",
        "Server CPU per GiB moved",
        "Upload 8 entries in parallel, 32 MiB blocks",
        "Upload 8 entries, @actions/cache layout",
        "First download (all 8)",
        "Later download (all 8 again)",
        "Lookups at 64 concurrent",
        "Lookup p50",
        "Lookup p99",
        "Small save+restore at 32 concurrent",
        "Client CPU time per round",
    ] {
        let row = rows
            .iter()
            .find(|r| r["metric"] == expected)
            .unwrap_or_else(|| panic!("no row {expected:?}: {metrics:?}"));
        for (i, v) in row["values"].as_array().unwrap().iter().enumerate() {
            let v = v
                .as_f64()
                .unwrap_or_else(|| panic!("{expected}: no value for target {i}"));
            assert!(v >= 0.0 && v.is_finite(), "{expected}: {v}");
        }
    }
    for rate in [
        "First download (all 8)",
        "Lookups at 64 concurrent",
        "Small save+restore at 32 concurrent",
    ] {
        let row = rows.iter().find(|r| r["metric"] == rate).unwrap();
        assert!(
            row["values"]
                .as_array()
                .unwrap()
                .iter()
                .all(|v| v.as_f64().unwrap() > 0.0),
            "{rate}"
        );
    }
    let notes = notes(&report);
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("hoard: every download checked") && n.contains("byte for byte")),
        "{notes:?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("baseline: every download checked")),
        "{notes:?}"
    );
    // The disk floor keeps real bytes: its downloads are compared too.
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("disk floor: every download checked")
                && n.contains("byte for byte")),
        "{notes:?}"
    );
    // The Markdown table went to stdout too, one column per target, with both ratios.
    assert!(
        stdout.contains("| metric | hoard | baseline | disk floor |"),
        "{stdout}"
    );
    let upload = stdout
        .lines()
        .find(|l| l.starts_with("| Upload 8 entries in parallel"))
        .unwrap();
    assert!(
        upload.contains("% null, ") && upload.contains("% disk)"),
        "{upload}"
    );
}

#[test]
fn a_failing_target_fails_the_run() {
    // Nothing listens on this port: the run must fail with a message, not report numbers.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = Command::new(env!("CARGO_BIN_EXE_hoard"))
        .args(["bench", "--scale", "0.01", "--rounds", "1", "--target"])
        .arg(format!("nothing=http://127.0.0.1:{port}"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nothing: round 1"), "{stderr}");
}

#[test]
fn a_preloaded_run_reports_the_database_size() {
    let (report, _) = bench(&["--preload", "3000", "--scale", "0.01", "--rounds", "1"]);
    let notes = notes(&report);
    let preload = notes
        .iter()
        .find(|n| n.contains("preloaded 3000 entries"))
        .unwrap_or_else(|| panic!("no preload note: {notes:?}"));
    assert!(preload.contains("bytes per entry"), "{preload}");
    assert!(
        notes.iter().any(|n| n.contains("every download checked")),
        "{notes:?}"
    );
    // Refused where it cannot apply.
    let out = Command::new(env!("CARGO_BIN_EXE_hoard"))
        .args([
            "bench",
            "--preload",
            "10",
            "--target",
            "x=http://127.0.0.1:9",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--preload"));
}
