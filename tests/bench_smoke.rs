//! `hoard bench` end to end, tiny: it spawns a hoard and the null baseline, runs every scenario
//! with verified downloads, and writes a report with every row. Correctness only, no speed.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

use std::process::Command;

use serde_json::Value;

/// Runs `hoard bench ARGS… --json FILE` to success: the JSON report and the printed output.
fn bench(args: &[&str]) -> (Value, String) {
    let (report, stdout, _) = bench_logged(args, "warn");
    (report, stdout)
}

/// The same with `RUST_LOG` at `log`: also what it logged (standard error, not a terminal here).
fn bench_logged(args: &[&str], log: &str) -> (Value, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_hoard"))
        .env("HOARD_MIN_FREE_SPACE", "0")
        .arg("bench")
        .args(args)
        .arg("--json")
        .arg(&json_path)
        .env("RUST_LOG", log)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "bench failed:\n{stdout}\n{stderr}");
    let report = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    (report, stdout, stderr)
}

/// The values of row `metric`, one per target.
fn row_values(report: &Value, metric: &str) -> Vec<f64> {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["metric"] == metric)
        .unwrap_or_else(|| panic!("no row {metric:?}"))["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            v.as_f64()
                .unwrap_or_else(|| panic!("{metric}: a target without a value"))
        })
        .collect()
}

/// The metrics the report has rows for.
fn metrics(report: &Value) -> Vec<String> {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["metric"].as_str().unwrap().to_owned())
        .collect()
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
        .env("HOARD_MIN_FREE_SPACE", "0")
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
        .env("HOARD_MIN_FREE_SPACE", "0")
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

#[test]
fn the_fleet_phase_restores_as_planned_and_verified_on_hoard_and_both_references() {
    // 8 jobs at once × 2 = 16 jobs per round: 10 exact hits, 3 through the restore key, 3
    // misses (the plan rounds 20% of 16 to 3); two rounds, so the second must find the same.
    let (report, stdout, stderr) = bench_logged(
        &[
            "--baseline",
            "--baseline-disk",
            "--scale",
            "0.01",
            "--rounds",
            "2",
            "--phases",
            "fleet",
            "--fleet-jobs",
            "8",
            "--fleet-rounds",
            "2",
        ],
        "info",
    );
    assert_eq!(
        report["targets"],
        serde_json::json!(["hoard", "baseline", "disk floor"])
    );
    let notes = notes(&report);
    assert!(
        notes.iter().any(|n| n.contains(
            "16 jobs per round over 16 repositories, 20 missing lookups each; planned per round: 10 exact, 3 restore-key, 3 miss"
        )),
        "{notes:?}"
    );
    assert_eq!(row_values(&report, "Fleet: errors (all rounds)"), [0.0; 3]);
    assert_eq!(row_values(&report, "Fleet: exact hits seen"), [62.5; 3]);
    assert_eq!(
        row_values(&report, "Fleet: restore-key hits seen"),
        [18.75; 3]
    );
    assert_eq!(row_values(&report, "Fleet: misses seen"), [18.75; 3]);
    for rate in [
        "Fleet: up + down",
        "Fleet: jobs",
        "Fleet: job p50",
        "Fleet: job p99",
        "Fleet: lookups",
    ] {
        let values = row_values(&report, rate);
        assert!(
            values.iter().all(|v| *v > 0.0 && v.is_finite()),
            "{rate}: {values:?}"
        );
    }
    // Only the fleet ran: no rows of the other phases.
    let metrics = metrics(&report);
    assert!(
        !metrics
            .iter()
            .any(|m| m.starts_with("Upload") || m.contains("download") || m.starts_with("Lookup")),
        "{metrics:?}"
    );
    // Every restore was checked: byte for byte on hoard and the floor, by length on the null.
    for (target, how) in [
        ("hoard", "byte for byte"),
        ("disk floor", "byte for byte"),
        ("baseline", "length only"),
    ] {
        let note = notes
            .iter()
            .find(|n| n.starts_with(&format!("{target}: every download checked")))
            .unwrap_or_else(|| panic!("no note for {target}: {notes:?}"));
        assert!(note.contains(how) && !note.contains(" 0.0 MiB"), "{note}");
    }
    // The ratios to the references are in the table; none on the split.
    let line = |m: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(m))
            .unwrap()
            .to_owned()
    };
    assert!(line("| Fleet: up + down").contains("% disk)"), "{stdout}");
    assert!(!line("| Fleet: misses seen").contains("null"), "{stdout}");
    // One readable line per phase and round in the log (standard error is no terminal here).
    for target in ["hoard", "baseline", "disk floor"] {
        for round in 1..=2 {
            let fleet = format!("{target}, round {round}/2: fleet: 16 jobs, 8 at once: ");
            let lines: Vec<&str> = stderr.lines().filter(|l| l.contains(&fleet)).collect();
            assert_eq!(lines.len(), 1, "{fleet}\n{stderr}");
            assert!(
                lines[0].contains("0 errors; exact 62.5%, restore key 18.8%, miss 18.8%"),
                "{}",
                lines[0]
            );
        }
        let seeding = format!("{target}, round 1/2: fleet (untimed seeding)");
        assert_eq!(stderr.matches(&seeding).count(), 1, "{stderr}");
    }
    assert!(!stderr.contains("round 2/2: fleet (untimed"), "{stderr}");
    assert!(!stderr.contains("FleetResult {"), "{stderr}");
}

#[test]
fn a_phase_selection_runs_only_what_it_names() {
    let (report, _, stderr) = bench_logged(
        &[
            "--scale",
            "0.01",
            "--rounds",
            "1",
            "--phases",
            "small,lookups",
        ],
        "info",
    );
    let metrics = metrics(&report);
    for expected in [
        "Lookups at 64 concurrent",
        "Lookup p99",
        "Small save+restore at 32 concurrent",
        "Server CPU per GiB moved",
    ] {
        assert!(metrics.iter().any(|m| m == expected), "{metrics:?}");
    }
    assert!(
        !metrics
            .iter()
            .any(|m| m.starts_with("Upload") || m.contains("download") || m.starts_with("Fleet")),
        "{metrics:?}"
    );
    assert!(notes(&report).contains(&"phases: lookups, small"));
    // The lookups need the entries: uploaded once, untimed, and said so; nothing downloaded.
    let phase_lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("hoard, round 1/1: "))
        .collect();
    assert_eq!(phase_lines.len(), 3, "{stderr}");
    assert!(phase_lines[0].contains(": upload (untimed set-up): 8 entries in parallel"));
    assert!(phase_lines[1].contains(": lookups: ") && phase_lines[1].contains(" p99 "));
    assert!(phase_lines[2].contains(": small: "));
    assert!(
        !stderr.contains("download") && !stderr.contains("RoundResult"),
        "{stderr}"
    );
}

#[test]
fn the_tools_phase_puts_and_gets_every_object_through_both_apis() {
    let (report, _, stderr) = bench_logged(
        &[
            "--baseline",
            "--baseline-disk",
            "--scale",
            "0.02",
            "--rounds",
            "1",
            "--phases",
            "tools",
        ],
        "info",
    );
    assert_eq!(
        report["targets"],
        serde_json::json!(["hoard", "baseline", "disk floor"])
    );
    for api in ["Bazel CAS", "Turborepo"] {
        for what in ["PUT", "PUT p99", "GET", "GET p99"] {
            let values = row_values(&report, &format!("Tools: {api} {what}"));
            assert!(
                values.iter().all(|v| *v > 0.0 && v.is_finite()),
                "{api} {what}: {values:?}"
            );
        }
        // Every object went through on every target (50 at this scale, the least).
        assert!(
            stderr.contains(&format!("tools: {api} GET: 50 objects")),
            "{stderr}"
        );
    }
    assert!(notes(&report)
        .iter()
        .any(|n| n.contains("50 objects of 1–64 KiB per API")));
    assert!(!metrics(&report).iter().any(|m| m.starts_with("Lookup")));
}
