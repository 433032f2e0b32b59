//! `hoard doctor` against a real server: a healthy set-up passes on either protocol, and each
//! broken one gets its own finding and fix.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::process::Hoard;
use common::{main_token, token, TestServer, MAIN};

/// Runs `hoard doctor` with exactly `vars` as the cache-related environment; its exit status
/// and report.
async fn doctor(vars: &[(&str, &str)]) -> (bool, String) {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hoard"));
        cmd.args(["doctor", "--timeout", "5s"]);
        for name in [
            "ACTIONS_RESULTS_URL",
            "ACTIONS_CACHE_URL",
            "ACTIONS_CACHE_SERVICE_V2",
            "GITHUB_SERVER_URL",
            "ACTIONS_RUNTIME_TOKEN",
            "ACTIONS_CACHE_MODE",
            "NODE_EXTRA_CA_CERTS",
            "SSL_CERT_FILE",
            "SSL_CERT_DIR",
        ] {
            cmd.env_remove(name);
        }
        cmd.envs(vars);
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    })
    .await
    .unwrap()
}

fn line_with<'a>(report: &'a str, needle: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?}:\n{report}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_healthy_set_up_passes_on_both_protocols() {
    let srv = TestServer::start().await;
    let t = main_token();
    let root = format!("{}/", srv.base);
    let (ok, report) = doctor(&[
        ("ACTIONS_RESULTS_URL", &root),
        ("ACTIONS_CACHE_SERVICE_V2", "true"),
        ("ACTIONS_RUNTIME_TOKEN", &t),
    ])
    .await;
    assert!(ok, "{report}");
    assert!(line_with(&report, "protocol: v2").starts_with("  ok"));
    assert!(
        line_with(&report, "save and restore").starts_with("  ok"),
        "{report}"
    );
    assert!(report.ends_with("caching works here\n"), "{report}");
    assert!(!report.contains(&t), "the token is never printed");

    let prefixed = format!("{}/runner-3/", srv.base);
    let (ok, report) = doctor(&[
        ("ACTIONS_CACHE_URL", &prefixed),
        ("GITHUB_SERVER_URL", "https://ghes.example"),
        ("ACTIONS_RUNTIME_TOKEN", &t),
    ])
    .await;
    assert!(ok, "{report}");
    assert!(line_with(&report, "protocol: v1").contains("ghes.example"));
    assert!(
        line_with(&report, "token: accepted").contains("v1"),
        "{report}"
    );

    // A read-only token: restores work, saves are refused, and that is only a warning.
    let read_only = token("1", &[(MAIN, 1)]);
    let (ok, report) = doctor(&[
        ("ACTIONS_RESULTS_URL", &root),
        ("ACTIONS_CACHE_SERVICE_V2", "true"),
        ("ACTIONS_RUNTIME_TOKEN", &read_only),
    ])
    .await;
    assert!(ok, "{report}");
    assert!(line_with(&report, "may not save").starts_with("  warn"));
}

#[tokio::test(flavor = "multi_thread")]
async fn each_broken_set_up_gets_its_own_finding() {
    let srv = TestServer::start().await;
    let t = main_token();

    // Nothing listens on that port.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (ok, report) = doctor(&[
        (
            "ACTIONS_RESULTS_URL",
            &format!("http://127.0.0.1:{closed}/"),
        ),
        ("ACTIONS_CACHE_SERVICE_V2", "true"),
        ("ACTIONS_RUNTIME_TOKEN", &t),
    ])
    .await;
    assert!(!ok);
    let finding = line_with(&report, "cannot reach");
    assert!(finding.starts_with("  FAIL"), "{report}");
    assert!(report.contains("try curl"), "{report}");

    // v1 URL without its trailing slash.
    let (ok, report) = doctor(&[
        ("ACTIONS_CACHE_URL", &format!("{}/ns", srv.base)),
        ("ACTIONS_RUNTIME_TOKEN", &t),
    ])
    .await;
    assert!(!ok);
    assert!(line_with(&report, "no trailing slash").starts_with("  FAIL"));
    assert!(report.contains(&format!("fix: set ACTIONS_CACHE_URL={}/ns/", srv.base)));

    // A forge's GITHUB_SERVER_URL forces v1 whatever ACTIONS_CACHE_SERVICE_V2 says; v1 then
    // needs a URL the client will use.
    let (ok, report) = doctor(&[
        ("ACTIONS_CACHE_SERVICE_V2", "true"),
        ("GITHUB_SERVER_URL", "https://codeberg.org"),
        ("ACTIONS_RUNTIME_TOKEN", &t),
    ])
    .await;
    assert!(!ok);
    assert!(line_with(
        &report,
        "protocol: v1, whatever ACTIONS_CACHE_SERVICE_V2 says"
    )
    .contains("codeberg.org"));
    assert!(line_with(&report, "ACTIONS_CACHE_URL is not set").starts_with("  FAIL"));

    // A token the server does not accept.
    let foreign = {
        let key = jsonwebtoken::EncodingKey::from_secret(b"another-secret-another-secret-0123");
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &common::claims("1", &[(MAIN, 3)]),
            &key,
        )
        .unwrap()
    };
    let (ok, report) = doctor(&[
        ("ACTIONS_RESULTS_URL", &format!("{}/", srv.base)),
        ("ACTIONS_CACHE_SERVICE_V2", "true"),
        ("ACTIONS_RUNTIME_TOKEN", &foreign),
    ])
    .await;
    assert!(!ok);
    assert!(
        line_with(&report, "token: refused").contains("signature"),
        "{report}"
    );
    assert!(!report.contains(&foreign));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_without_v1_is_named() {
    // A server that is ready but serves nothing else (an older hoard, another cache server).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().route(
        "/readyz",
        axum::routing::get(|| async {
            axum::Json(serde_json::json!({ "status": "ready", "warnings": [] }))
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let (ok, report) = doctor(&[
        ("ACTIONS_CACHE_URL", &format!("{base}/")),
        ("ACTIONS_RUNTIME_TOKEN", &main_token()),
    ])
    .await;
    assert!(!ok);
    let finding = line_with(&report, "answered 404");
    assert!(
        finding.contains("does not serve the v1 cache service"),
        "{report}"
    );
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl is needed (scripts/test checks for it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const EC: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

/// A self-signed certificate as the usual one-liner makes it (`openssl req -x509`: it says
/// `CA:TRUE`), naming `names`; its certificate and key files.
fn self_signed(dir: &Path, file: &str, names: &str) -> (PathBuf, PathBuf) {
    let (cert, key) = (format!("{file}.pem"), format!("{file}.key"));
    let san = format!("subjectAltName={names}");
    let mut args = vec!["req", "-x509", "-days", "2", "-subj", "/CN=localhost"];
    args.extend(EC);
    args.extend(["-addext", &san, "-keyout", &key, "-out", &cert]);
    openssl(dir, &args);
    (dir.join(cert), dir.join(key))
}

/// Like [`self_signed`], valid only on the 1st of January 2020 (`openssl ca` sets the dates,
/// which `req -x509` of OpenSSL 3.0 cannot).
fn expired(dir: &Path) -> (PathBuf, PathBuf) {
    std::fs::write(
        dir.join("ca.cnf"),
        "[ca]\ndefault_ca = old\n[old]\ndatabase = index.txt\nnew_certs_dir = .\nserial = serial\n\
         default_md = sha256\npolicy = any\ncopy_extensions = copy\nunique_subject = no\n\
         [any]\ncommonName = supplied\n",
    )
    .unwrap();
    std::fs::write(dir.join("index.txt"), "").unwrap();
    std::fs::write(dir.join("serial"), "01\n").unwrap();
    let mut args = vec!["req", "-new", "-subj", "/CN=localhost"];
    args.extend(EC);
    args.extend([
        "-addext",
        "subjectAltName=DNS:localhost,IP:127.0.0.1",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-keyout",
        "expired.key",
        "-out",
        "expired.csr",
    ]);
    openssl(dir, &args);
    openssl(
        dir,
        &[
            "ca",
            "-batch",
            "-notext",
            "-config",
            "ca.cnf",
            "-selfsign",
            "-keyfile",
            "expired.key",
            "-in",
            "expired.csr",
            "-startdate",
            "20200101000000Z",
            "-enddate",
            "20200102000000Z",
            "-out",
            "expired.pem",
        ],
    );
    (dir.join("expired.pem"), dir.join("expired.key"))
}

/// Runs doctor against a hoard serving `cert` over HTTPS, trusting `trusted` as the Node
/// client would through `NODE_EXTRA_CA_CERTS`.
async fn doctor_over_https(
    data: &Path,
    cert: &Path,
    key: &Path,
    trusted: Option<&Path>,
) -> (bool, String) {
    let secret = common::secret_file(data);
    let hoard = Hoard::start_with(
        data,
        &[
            "--token-hs256-secret-file",
            secret.to_str().unwrap(),
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let url = format!("{}/", hoard.base.replace("http://", "https://"));
    let t = main_token();
    let mut vars = vec![
        ("ACTIONS_RESULTS_URL", url.as_str()),
        ("ACTIONS_CACHE_SERVICE_V2", "true"),
        ("ACTIONS_RUNTIME_TOKEN", &t),
    ];
    if let Some(trusted) = trusted {
        vars.push(("NODE_EXTRA_CA_CERTS", trusted.to_str().unwrap()));
    }
    doctor(&vars).await
}

/// Over HTTPS doctor trusts what the Node client trusts: a self-signed `CA:TRUE` certificate
/// named by `NODE_EXTRA_CA_CERTS` passes; an expired one, one for another name, and one not
/// trusted fail, each naming the certificate's problem instead of giving network advice.
#[tokio::test(flavor = "multi_thread")]
async fn over_https_doctor_trusts_what_the_client_trusts() {
    let dir = tempfile::tempdir().unwrap();
    let (good, good_key) = self_signed(dir.path(), "good", "DNS:localhost,IP:127.0.0.1");
    let data = tempfile::tempdir().unwrap();
    let (ok, report) = doctor_over_https(data.path(), &good, &good_key, Some(&good)).await;
    assert!(ok, "{report}");
    assert!(report.ends_with("caching works here\n"), "{report}");

    let (ok, report) = doctor_over_https(data.path(), &good, &good_key, None).await;
    assert!(!ok);
    let finding = line_with(&report, "TLS with");
    assert!(finding.contains("CA certificate"), "{report}");
    assert!(
        report.contains("NODE_EXTRA_CA_CERTS") && report.contains("openssl req"),
        "{report}"
    );
    assert!(!report.contains("firewall"), "{report}");

    let (old, old_key) = expired(dir.path());
    let (ok, report) = doctor_over_https(data.path(), &old, &old_key, Some(&old)).await;
    assert!(!ok);
    assert!(
        line_with(&report, "TLS with").contains("expired on Thu, 02 Jan 2020"),
        "{report}"
    );
    assert!(report.contains("renew"), "{report}");

    let (other, other_key) = self_signed(dir.path(), "other", "DNS:elsewhere.example");
    let (ok, report) = doctor_over_https(data.path(), &other, &other_key, Some(&other)).await;
    assert!(!ok);
    assert!(
        line_with(&report, "TLS with")
            .contains("does not name 127.0.0.1: it names elsewhere.example"),
        "{report}"
    );
    assert!(report.contains("subjectAltName=IP:127.0.0.1"), "{report}");
}
