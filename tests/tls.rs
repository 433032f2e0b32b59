//! HTTPS served by hoard itself (`--tls-cert`, `--tls-key`): the real `@actions/cache` client
//! saves and restores over it with a test CA, links are `https`, HTTP/2 is offered by ALPN, and
//! a certificate replaced on disk is served after SIGHUP. An edge reaches such an origin, and
//! only when it trusts the origin's certificate.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::process::Hoard;
use serde_json::Value;

/// A test CA and a certificate it signed for 127.0.0.1 and localhost.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
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

fn make_pki(dir: &Path, name: &str) -> Pki {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let file = |suffix: &str| format!("{name}-{suffix}");
    let mut ca_args = vec!["req", "-x509", "-days", "2", "-subj"];
    let ca_subject = format!("/CN=hoard test CA {name}");
    ca_args.push(&ca_subject);
    ca_args.extend(ec);
    let (ca_key, ca_pem) = (file("ca.key"), file("ca.pem"));
    ca_args.extend(["-keyout", &ca_key, "-out", &ca_pem]);
    openssl(dir, &ca_args);
    let (key, csr, cert, ext) = (
        file("key.pem"),
        file("csr.pem"),
        file("cert.pem"),
        file("ext.cnf"),
    );
    let mut req_args = vec!["req", "-subj", "/CN=localhost"];
    req_args.extend(ec);
    req_args.extend(["-keyout", &key, "-out", &csr]);
    openssl(dir, &req_args);
    std::fs::write(
        dir.join(&ext),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            &csr,
            "-CA",
            &ca_pem,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-extfile",
            &ext,
            "-out",
            &cert,
        ],
    );
    Pki {
        ca: dir.join(ca_pem),
        cert: dir.join(cert),
        key: dir.join(key),
    }
}

/// An HTTPS client that trusts only `ca`.
fn client_trusting(ca: &Path) -> reqwest::Client {
    let root = reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(root)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Runs the real client over HTTPS; its `RESULT` value and its output.
fn real_client(base: &str, ca: &Path, workspace: &Path, args: &[&str]) -> (Value, String) {
    let e2e = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e");
    let out = Command::new("node")
        .arg(e2e.join("client.mjs"))
        .args(args)
        .current_dir(workspace)
        .env("ACTIONS_RESULTS_URL", format!("{base}/"))
        .env("ACTIONS_CACHE_SERVICE_V2", "true")
        .env("ACTIONS_RUNTIME_TOKEN", common::main_token())
        .env("NODE_EXTRA_CA_CERTS", ca)
        .env("RUNNER_TEMP", workspace.join("runner-temp"))
        .env("GITHUB_WORKSPACE", workspace)
        .env_remove("GITHUB_SERVER_URL")
        .env_remove("ACTIONS_CACHE_URL")
        .env_remove("HOARD_E2E_CLIENT")
        .output()
        .unwrap();
    common::node_result(out)
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs the real @actions/cache client"
)]
async fn the_real_client_saves_and_restores_over_https_and_certificates_rotate_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (make_pki(dir.path(), "one"), make_pki(dir.path(), "two"));
    let (cert, key) = (
        dir.path().join("served-cert.pem"),
        dir.path().join("served-key.pem"),
    );
    std::fs::copy(&one.cert, &cert).unwrap();
    std::fs::copy(&one.key, &key).unwrap();
    let data = tempfile::tempdir().unwrap();
    let secret = common::secret_file(data.path());
    let hoard = Hoard::start_with(
        data.path(),
        &[
            "--token-hs256-secret-file",
            secret.to_str().unwrap(),
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let base = hoard.base.replace("http://", "https://");

    // The real client, trusting the test CA as a runner would (NODE_EXTRA_CA_CERTS).
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(ws.path().join("runner-temp")).unwrap();
    std::fs::create_dir_all(ws.path().join("deps")).unwrap();
    let payload = common::random_bytes(1 << 20, 77);
    std::fs::write(ws.path().join("deps/blob.bin"), &payload).unwrap();
    let (res, out) = tokio::task::block_in_place(|| {
        real_client(&base, &one.ca, ws.path(), &["save", "tls-1", "deps"])
    });
    assert!(res.as_i64().unwrap_or(-1) > 0, "{out}");
    std::fs::remove_dir_all(ws.path().join("deps")).unwrap();
    let (res, out) = tokio::task::block_in_place(|| {
        real_client(&base, &one.ca, ws.path(), &["restore", "tls-1", "deps"])
    });
    assert_eq!(res, "tls-1", "{out}");
    assert!(std::fs::read(ws.path().join("deps/blob.bin")).unwrap() == payload);

    // Links are https, and HTTP/2 is offered.
    let http = client_trusting(&one.ca);
    let res = http
        .post(format!("{base}{}CreateCacheEntry", common::SERVICE))
        .bearer_auth(common::main_token())
        .header("content-type", "application/json")
        .body(serde_json::json!({ "key": "tls-2", "version": common::VERSION }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(res.version(), reqwest::Version::HTTP_2);
    let body: Value = res.json().await.unwrap();
    let link = body["signed_upload_url"].as_str().unwrap();
    assert!(link.starts_with(&format!("{base}/_blob/")), "{link}");
    // Plain HTTP on the TLS port gets nowhere.
    assert!(reqwest::get(format!("{}/healthz", hoard.base))
        .await
        .is_err());

    // A new certificate on disk is served once hoard gets SIGHUP.
    let healthz = format!("{base}/healthz");
    let trusts_two = client_trusting(&two.ca);
    assert!(
        trusts_two.get(&healthz).send().await.is_err(),
        "still the first certificate"
    );
    std::fs::copy(&two.cert, &cert).unwrap();
    std::fs::copy(&two.key, &key).unwrap();
    let hup = Command::new("kill")
        .args(["-HUP", &hoard.pid().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    let reloaded = common::eventually(Duration::from_secs(10), || {
        hoard
            .log
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("TLS certificate reloaded"))
    })
    .await;
    assert!(reloaded, "{:?}", hoard.log.lock().unwrap());
    let res = trusts_two.get(&healthz).send().await.unwrap();
    assert_eq!(res.status(), 200);
    // (A fresh client: connections made before the reload keep the certificate they had.)
    assert!(
        client_trusting(&one.ca).get(&healthz).send().await.is_err(),
        "new connections no longer get the old certificate"
    );

    // A broken file on SIGHUP keeps the certificate in use.
    std::fs::write(&cert, "not a certificate").unwrap();
    Command::new("kill")
        .args(["-HUP", &hoard.pid().to_string()])
        .status()
        .unwrap();
    let refused = common::eventually(Duration::from_secs(10), || {
        hoard
            .log
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("not reloaded"))
    })
    .await;
    assert!(refused);
    let fresh = client_trusting(&two.ca);
    assert_eq!(fresh.get(&healthz).send().await.unwrap().status(), 200);
}

#[test]
fn a_bad_certificate_or_a_key_alone_stops_start_up_with_one_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path(), "one");
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "junk").unwrap();
    for (args, needle) in [
        (vec!["--tls-cert", pki.cert.to_str().unwrap()], "--tls-key"),
        (
            vec![
                "--tls-cert",
                junk.to_str().unwrap(),
                "--tls-key",
                pki.key.to_str().unwrap(),
            ],
            "--tls-cert",
        ),
        (
            vec![
                "--tls-cert",
                pki.cert.to_str().unwrap(),
                "--tls-key",
                junk.to_str().unwrap(),
            ],
            "--tls-key",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_hoard"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

/// Whether the edge at `edge` has a save decided: `cache write denied` and a lookup that
/// misses when it cannot reach its origin.
async fn decides(edge: &str, key: &str) -> bool {
    let http = reqwest::Client::new();
    let token = common::main_token();
    let body = serde_json::json!({ "key": key, "version": common::VERSION });
    let (_, reserved) =
        common::twirp_at(&http, edge, &token, "CreateCacheEntry", body.clone()).await;
    if reserved["ok"] == true {
        return true;
    }
    let message = reserved["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("cache write denied:"), "{reserved}");
    let (_, found) = common::twirp_at(&http, edge, &token, "GetCacheEntryDownloadURL", body).await;
    assert_eq!(found["ok"], false, "{found}");
    false
}

/// The edge's calls to an `https://` origin take their own path (not hyper's plain client):
/// through an edge that trusts the origin's CA (the system's store, `SSL_CERT_FILE`), a save
/// is decided and restores byte for byte; an edge that does not trust it decides nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_reaches_an_origin_over_https_only_when_it_trusts_its_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (pki, other) = (
        make_pki(dir.path(), "origin"),
        make_pki(dir.path(), "other"),
    );
    let data = tempfile::tempdir().unwrap();
    let secret = common::secret_file(data.path());
    let origin = Hoard::start_with(
        data.path(),
        &[
            "--token-hs256-secret-file",
            secret.to_str().unwrap(),
            "--tls-cert",
            pki.cert.to_str().unwrap(),
            "--tls-key",
            pki.key.to_str().unwrap(),
        ],
    );
    let origin_base = origin.base.replace("http://", "https://");
    let edge_trusting = |ca: &Path, dir: &Path| {
        let mut command = common::process::hoard_command();
        command.env("SSL_CERT_FILE", ca).env_remove("SSL_CERT_DIR");
        Hoard::start_edge_command(
            command,
            dir,
            &["--origin", &origin_base, "--lookup-timeout", "30s"],
        )
    };

    let trusting_dir = tempfile::tempdir().unwrap();
    let trusting = edge_trusting(&pki.ca, trusting_dir.path());
    let payload = common::random_bytes(300 << 10, 59);
    let link = common::save_through(&trusting.base, "edge-tls", &payload).await;
    let restored = reqwest::get(&link).await.unwrap();
    assert_eq!(restored.status(), 200);
    assert!(
        restored.bytes().await.unwrap() == payload,
        "a save through an edge that trusts the origin restores byte for byte"
    );

    let wary_dir = tempfile::tempdir().unwrap();
    let wary = edge_trusting(&other.ca, wary_dir.path());
    assert!(
        !decides(&wary.base, "edge-tls-2").await,
        "an edge that does not trust the origin's certificate sends it nothing"
    );
}
