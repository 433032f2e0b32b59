//! The files in `contrib/` are usable as shipped.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

use std::path::Path;
use std::process::Command;

/// `systemd-analyze verify` accepts the unit with no warning, with `ExecStart` pointing at the
/// binary under test (verify checks that it exists). Needs systemd-analyze (Debian's `systemd`
/// package, which `.ci/run` installs); HOARD_TEST_SKIP_SYSTEMD=1 skips it elsewhere.
#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    let available = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !available {
        assert!(
            std::env::var_os("HOARD_TEST_SKIP_SYSTEMD").is_some(),
            "systemd-analyze is missing: install Debian's systemd package, or set HOARD_TEST_SKIP_SYSTEMD=1"
        );
        return;
    }
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/hoard.service"),
    )
    .unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/hoard serve"));
    for hardening in [
        "DynamicUser=yes",
        "StateDirectory=hoard",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
    ] {
        assert!(unit.contains(hardening), "{hardening}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hoard.service");
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/hoard", env!("CARGO_BIN_EXE_hoard")),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Unknown settings are only warnings: none is allowed.
    assert!(stderr.trim().is_empty(), "{stderr}");
}

/// Every variable the example environment file sets or suggests is one `hoard serve` reads.
#[test]
fn the_environment_example_names_only_real_options() {
    let example =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/hoard.env"))
            .unwrap();
    let help = Command::new(env!("CARGO_BIN_EXE_hoard"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let mut seen = 0;
    for line in example.lines() {
        let line = line.trim_start_matches('#');
        let Some((name, _)) = line.split_once('=') else {
            continue;
        };
        if !name.starts_with("HOARD_") || name.contains(' ') {
            continue;
        }
        seen += 1;
        // Options whose values are secret show `[env: NAME]` without a value.
        let named = [format!("env: {name}="), format!("env: {name}]")];
        assert!(
            named.iter().any(|n| help.contains(n.as_str())),
            "{name} is not an option"
        );
    }
    assert!(seen >= 5, "the example sets {seen} variables");
}
