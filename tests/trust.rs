//! Token verification (issue #4, point 1): a test issuer made here, its keys given as a JWKS
//! file or found by OIDC discovery on a local endpoint, and every way a token must be refused.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use common::issuer::Issuer;
use common::process::Hoard;
use common::*;
use serde_json::{json, Value};

const ISS: &str = "https://token.issuer.test";

async fn server_trusting(issuer: &Issuer, extra: &[&str]) -> (TestServer, tempfile::TempDir) {
    let keys = tempfile::tempdir().unwrap();
    let jwks = issuer.write_jwks(keys.path());
    let mut args = vec![
        "--token-issuer",
        issuer.iss.as_str(),
        "--jwks-file",
        jwks.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    (TestServer::start_without_test_secret(&args).await, keys)
}

/// A lookup with `token`: 200 means the token was accepted.
async fn lookup_status(srv: &TestServer, token: &str) -> (u16, Value) {
    srv.lookup(token, "k", &[], VERSION).await
}

async fn assert_refused(srv: &TestServer, token: &str, why: &str) {
    let (status, body) = lookup_status(srv, token).await;
    assert_eq!(status, 401, "{why}: {body}");
    assert_eq!(body["code"], "unauthenticated", "{why}");
    // A refused token cannot write either.
    let (status, _) = srv
        .twirp(
            "CreateCacheEntry",
            token,
            json!({ "key": "k", "version": VERSION }),
        )
        .await;
    assert_eq!(status, 401, "{why}");
}

#[tokio::test]
async fn rs256_and_es256_tokens_of_a_trusted_issuer_are_accepted() {
    let issuer = Issuer::new(ISS);
    let (srv, _keys) = server_trusting(&issuer, &[]).await;
    let rs = issuer.token("1", &[(MAIN, 3)]);
    let es = issuer.es256(&issuer.claims("1", &[(MAIN, 3)]));
    srv.save(&rs, "k", VERSION, b"signed").await;
    assert_eq!(srv.restore(&es, "k", VERSION).await.unwrap(), b"signed");
    // A token that names no key is checked against every key of its algorithm.
    let no_kid = issuer.rs256_with_kid(&issuer.claims("1", &[(MAIN, 1)]), None);
    assert_eq!(srv.restore(&no_kid, "k", VERSION).await.unwrap(), b"signed");
}

#[tokio::test]
async fn bad_tokens_are_refused() {
    let issuer = Issuer::new(ISS);
    let (srv, _keys) = server_trusting(&issuer, &[]).await;
    let now = unix_now();

    let mut expired = issuer.claims("1", &[(MAIN, 3)]);
    expired["exp"] = json!(now - 3600);
    assert_refused(&srv, &issuer.rs256(&expired), "expired").await;

    let mut early = issuer.claims("1", &[(MAIN, 3)]);
    early["nbf"] = json!(now + 3600);
    assert_refused(&srv, &issuer.rs256(&early), "not yet valid").await;

    let mut no_repository = issuer.claims("1", &[(MAIN, 3)]);
    no_repository
        .as_object_mut()
        .unwrap()
        .remove("repository_id");
    assert_refused(&srv, &issuer.rs256(&no_repository), "no repository_id").await;

    let mut no_exp = issuer.claims("1", &[(MAIN, 3)]);
    no_exp.as_object_mut().unwrap().remove("exp");
    assert_refused(&srv, &issuer.rs256(&no_exp), "no exp").await;

    let stranger = Issuer::new(ISS); // Same issuer name and kid, other keys.
    assert_refused(&srv, &stranger.token("1", &[(MAIN, 3)]), "wrong key").await;

    let mut other_iss = issuer.claims("1", &[(MAIN, 3)]);
    other_iss["iss"] = json!("https://evil.example");
    assert_refused(&srv, &issuer.rs256(&other_iss), "untrusted issuer").await;

    let claims = issuer.claims("1", &[(MAIN, 3)]);
    let none = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    assert_refused(&srv, &none, "alg none").await;

    // Tampered payload: another repository's claims under a valid signature.
    let genuine = issuer.token("1", &[(MAIN, 1)]);
    let mut parts: Vec<String> = genuine.split('.').map(str::to_owned).collect();
    parts[1] = URL_SAFE_NO_PAD.encode(issuer.claims("2", &[(MAIN, 3)]).to_string());
    assert_refused(&srv, &parts.join("."), "tampered payload").await;

    // HS256 is refused unless a secret was configured for it.
    assert_refused(&srv, &sign_hs256(&claims), "HS256 without a secret").await;
    // A well-formed but unsigned-looking token.
    assert_refused(&srv, "not.a.jwt", "garbage").await;

    let (status, _) = lookup_status(&srv, &issuer.token("1", &[(MAIN, 3)])).await;
    assert_eq!(status, 200, "the genuine token still works");
}

#[tokio::test]
async fn an_hs256_secret_is_only_trusted_when_configured() {
    let srv = TestServer::start().await; // Trusts TEST_SECRET.
    let (status, _) = lookup_status(&srv, &main_token()).await;
    assert_eq!(status, 200);
    let other = {
        let key =
            jsonwebtoken::EncodingKey::from_secret(b"some-other-secret-some-other-secret-000");
        jsonwebtoken::encode(
            &jsonwebtoken::Header::default(),
            &claims("1", &[(MAIN, 3)]),
            &key,
        )
        .unwrap()
    };
    assert_refused(&srv, &other, "HS256 with another secret").await;
}

#[tokio::test]
async fn insecure_mode_must_be_asked_for_and_reads_unsigned_tokens() {
    let srv = TestServer::start_with(&["--insecure-skip-token-validation"]).await;
    let claims = claims("1", &[(MAIN, 3)]);
    let unsigned = format!(
        "{}.{}.x",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let (status, _) = lookup_status(&srv, &unsigned).await;
    assert_eq!(status, 200);
}

/// An OIDC issuer on a local port: discovery document and JWKS, counting key fetches. Each
/// key fetch waits for a permit of `gate` (plenty, unless a test holds them back).
struct DiscoveryServer {
    url: String,
    jwks_fetches: Arc<AtomicUsize>,
    jwks: Arc<std::sync::Mutex<Value>>,
    gate: Arc<tokio::sync::Semaphore>,
}

async fn discovery_server() -> DiscoveryServer {
    gated_discovery_server(tokio::sync::Semaphore::MAX_PERMITS).await
}

async fn gated_discovery_server(permits: usize) -> DiscoveryServer {
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let jwks_fetches = Arc::new(AtomicUsize::new(0));
    let jwks = Arc::new(std::sync::Mutex::new(json!({ "keys": [] })));
    let gate = Arc::new(tokio::sync::Semaphore::new(permits));
    let config = json!({ "issuer": url, "jwks_uri": format!("{url}/.well-known/jwks") });
    let app = axum::Router::new()
        .route(
            "/.well-known/openid-configuration",
            get(move || async move { axum::Json(config) }),
        )
        .route(
            "/.well-known/jwks",
            get({
                let (fetches, jwks, gate) = (jwks_fetches.clone(), jwks.clone(), gate.clone());
                move || async move {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    gate.acquire().await.unwrap().forget();
                    axum::Json(jwks.lock().unwrap().clone())
                }
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    DiscoveryServer {
        url,
        jwks_fetches,
        jwks,
        gate,
    }
}

/// A key fetch under way holds up no token whose keys are known, and the requests that need
/// it share that one fetch.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_fetch_under_way_blocks_nobody_else_and_is_shared() {
    let (slow, fast) = (gated_discovery_server(0).await, discovery_server().await);
    let (slow_issuer, fast_issuer) = (Issuer::new(&slow.url), Issuer::new(&fast.url));
    *slow.jwks.lock().unwrap() = slow_issuer.jwks.clone();
    *fast.jwks.lock().unwrap() = fast_issuer.jwks.clone();
    let issuers = format!("{},{}", slow.url, fast.url);
    let srv = Arc::new(TestServer::start_with(&["--token-issuer", &issuers]).await);
    assert_eq!(
        lookup_status(&srv, &fast_issuer.token("1", &[(MAIN, 3)]))
            .await
            .0,
        200
    );

    // Eight jobs of the slow issuer's first use, each with its own token: one key fetch,
    // held back by the issuer.
    let waiting: Vec<_> = (0..8)
        .map(|i| {
            let (srv, token) = (srv.clone(), slow_issuer.token(&i.to_string(), &[(MAIN, 3)]));
            tokio::spawn(async move { lookup_status(&srv, &token).await.0 })
        })
        .collect();
    let started = eventually(std::time::Duration::from_secs(30), || {
        slow.jwks_fetches.load(Ordering::SeqCst) >= 1
    })
    .await;
    assert!(started, "the slow issuer's keys were never asked for");
    // Meanwhile tokens of the other issuer verify: nothing waits on the slow fetch.
    for i in 0..3 {
        let token = fast_issuer.token(&format!("fast-{i}"), &[(MAIN, 3)]);
        assert_eq!(lookup_status(&srv, &token).await.0, 200);
    }
    assert!(
        waiting.iter().all(|w| !w.is_finished()),
        "the slow jobs still wait"
    );
    slow.gate.add_permits(100);
    for w in waiting {
        assert_eq!(w.await.unwrap(), 200);
    }
    assert_eq!(
        slow.jwks_fetches.load(Ordering::SeqCst),
        1,
        "the waiting requests shared one fetch"
    );
}

#[tokio::test]
async fn keys_are_found_by_discovery_cached_and_refreshed_on_an_unknown_kid() {
    let oidc = discovery_server().await;
    let issuer = Issuer::new(&oidc.url);
    let rotated = Issuer::new(&oidc.url);
    *oidc.jwks.lock().unwrap() = issuer.jwks.clone();
    let clock = manual_clock();
    let srv = TestServer::start_with_clock(&["--token-issuer", &oidc.url], clock.clone()).await;

    let (status, body) = lookup_status(&srv, &issuer.token("1", &[(MAIN, 3)])).await;
    assert_eq!(status, 200, "{body}");
    let es = issuer.es256(&issuer.claims("1", &[(MAIN, 1)]));
    for _ in 0..5 {
        assert_eq!(lookup_status(&srv, &es).await.0, 200);
    }
    assert_eq!(
        oidc.jwks_fetches.load(Ordering::SeqCst),
        1,
        "keys are fetched once"
    );

    // The issuer rotates to new keys under new kids.
    let mut rotated_jwks = rotated.jwks.clone();
    for key in rotated_jwks["keys"].as_array_mut().unwrap() {
        let kid = key["kid"].as_str().unwrap().replace("-1", "-2");
        key["kid"] = json!(kid);
    }
    *oidc.jwks.lock().unwrap() = rotated_jwks;
    let fresh = rotated.es256_with_kid(&rotated.claims("1", &[(MAIN, 3)]), "ec-2");
    // Within the refresh interval an unknown kid is refused and costs no fetch...
    let (status, _) = lookup_status(&srv, &fresh).await;
    assert_eq!(status, 401);
    let fetches_after_first = oidc.jwks_fetches.load(Ordering::SeqCst);
    for _ in 0..10 {
        lookup_status(&srv, &fresh).await;
    }
    assert!(
        oidc.jwks_fetches.load(Ordering::SeqCst) <= fetches_after_first,
        "a flood of unknown kids does not hammer the issuer"
    );
    // ... and once it has passed (10 s on the server's clock), the new keys are fetched and
    // the token is accepted.
    clock.advance(std::time::Duration::from_secs(10));
    let (status, body) = lookup_status(&srv, &fresh).await;
    assert_eq!(status, 200, "the rotated key is picked up: {body}");
    assert_eq!(
        oidc.jwks_fetches.load(Ordering::SeqCst),
        2,
        "one fetch for the first keys, one for the rotation"
    );
}

/// An unknown `kid` (the issuer rotated its keys) refetches the issuer's keys: the requests
/// that need the new key share one fetch, and while it is under way, tokens of keys already
/// known, of the same issuer, verify at once (no lock is held across the fetch).
#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_kid_refetch_is_shared_and_holds_up_no_known_key() {
    let oidc = gated_discovery_server(1).await; // The first fetch goes through; later ones wait.
    let (issuer, rotated) = (Issuer::new(&oidc.url), Issuer::new(&oidc.url));
    *oidc.jwks.lock().unwrap() = issuer.jwks.clone();
    let clock = manual_clock();
    let srv =
        Arc::new(TestServer::start_with_clock(&["--token-issuer", &oidc.url], clock.clone()).await);
    let first = issuer.token("first", &[(MAIN, 3)]);
    assert_eq!(lookup_status(&srv, &first).await.0, 200);
    assert_eq!(oidc.jwks_fetches.load(Ordering::SeqCst), 1);

    // The issuer adds a key under a new kid and keeps the old ones.
    let mut jwks = issuer.jwks.clone();
    let mut added = rotated.jwks["keys"][1].clone();
    added["kid"] = json!("ec-2");
    jwks["keys"].as_array_mut().unwrap().push(added);
    *oidc.jwks.lock().unwrap() = jwks;
    // Unknown kids cost no fetch within 10 s of the last one (on the server's clock); after
    // that, one is made.
    clock.advance(std::time::Duration::from_secs(10));
    let waiting: Vec<_> = (0..8)
        .map(|i| {
            let claims = rotated.claims(&format!("new-{i}"), &[(MAIN, 3)]);
            let (srv, token) = (srv.clone(), rotated.es256_with_kid(&claims, "ec-2"));
            tokio::spawn(async move { lookup_status(&srv, &token).await.0 })
        })
        .collect();
    let started = eventually(std::time::Duration::from_secs(30), || {
        oidc.jwks_fetches.load(Ordering::SeqCst) >= 2
    })
    .await;
    assert!(started, "the unknown kid caused no fetch");
    // Meanwhile tokens of the known keys (new tokens, so none is remembered) verify at once.
    for i in 0..3 {
        let token = issuer.token(&format!("known-{i}"), &[(MAIN, 3)]);
        // Long for a loaded machine, and still far short of forever: the gated fetch it must
        // not wait for opens only after this loop.
        let answer = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            lookup_status(&srv, &token),
        )
        .await
        .expect("a token of a known key waited for the key fetch");
        assert_eq!(answer.0, 200, "{}", answer.1);
    }
    assert!(
        waiting.iter().all(|w| !w.is_finished()),
        "the tokens of the new key wait for the fetch"
    );
    oidc.gate.add_permits(100);
    for w in waiting {
        assert_eq!(w.await.unwrap(), 200);
    }
    assert_eq!(
        oidc.jwks_fetches.load(Ordering::SeqCst),
        2,
        "the eight requests of the new key shared one fetch"
    );
}

/// `repository_id` must be a string or an integer. Any other JSON is refused (401), not read as
/// "no repository", the namespace forge tokens share; an integer names the same repository as
/// its decimal string.
#[tokio::test]
async fn repository_ids_must_be_strings_or_integers() {
    const BAD: &str =
        "the token's repository_id claim must be a string or an integer of at most 255 bytes";
    let hs256 = TestServer::start().await;
    let issuer = Issuer::new(ISS);
    let (rs256, _keys) = server_trusting(&issuer, &[]).await;
    let bad = [
        (json!({}), BAD, "the token has no repository_id claim"),
        (json!([1]), BAD, "the token has no repository_id claim"),
        (json!(true), BAD, "the token has no repository_id claim"),
        (json!(1.5), BAD, BAD),
        (json!("7".repeat(256)), BAD, BAD),
    ];
    for (value, hs256_msg, rs256_msg) in bad {
        let mut hs = claims("1", &[(MAIN, 3)]);
        hs["repository_id"] = value.clone();
        let mut rs = issuer.claims("1", &[(MAIN, 3)]);
        rs["repository_id"] = value.clone();
        for (srv, token, msg) in [
            (&hs256, sign_hs256(&hs), hs256_msg),
            (&rs256, issuer.rs256(&rs), rs256_msg),
        ] {
            let (status, body) = lookup_status(srv, &token).await;
            assert_eq!(status, 401, "{value}: {body}");
            assert_eq!(body["code"], "unauthenticated", "{value}");
            assert_eq!(body["msg"], msg, "{value}");
            assert_refused(srv, &token, &value.to_string()).await;
        }
    }
    for srv in [&hs256, &rs256] {
        assert_eq!(
            table_rows(srv.data.path(), "uploads"),
            0,
            "a refused token reserved nothing"
        );
    }
    // 123 and "123" are one repository.
    let mut numeric = claims("1", &[(MAIN, 3)]);
    numeric["repository_id"] = json!(123);
    hs256
        .save(&sign_hs256(&numeric), "k", VERSION, b"numeric")
        .await;
    let by_name = token("123", &[(MAIN, 1)]);
    assert_eq!(
        hs256.restore(&by_name, "k", VERSION).await.unwrap(),
        b"numeric"
    );
    assert!(hs256
        .restore(&token("", &[(MAIN, 1)]), "k", VERSION)
        .await
        .is_none());
}

/// A key fetch that fails is a 401 saying only that the keys are unavailable: the cause (the
/// issuer's address, the connection error) goes to the log, not to the client.
#[test]
fn an_unreachable_issuer_fails_closed_with_a_clear_answer() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let iss = format!("http://127.0.0.1:{port}");
    let issuer = Issuer::new(&iss);
    let data = tempfile::tempdir().unwrap();
    let hoard = Hoard::start_with(data.path(), &["--token-issuer", &iss]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        let token = issuer.token("1", &[(MAIN, 3)]);
        let (status, body) = twirp_at(
            &http,
            &hoard.base,
            &token,
            "GetCacheEntryDownloadURL",
            json!({ "key": "k", "version": VERSION }),
        )
        .await;
        assert_eq!(status, 401, "{body}");
        assert_eq!(
            body,
            json!({
                "code": "unauthenticated",
                "msg": "the token issuer's keys are unavailable; retry later",
            })
        );
        let (status, body) = twirp_at(
            &http,
            &hoard.base,
            &token,
            "CreateCacheEntry",
            json!({ "key": "k", "version": VERSION }),
        )
        .await;
        assert_eq!(
            (status, body["code"].as_str()),
            (401, Some("unauthenticated"))
        );
        let logged = eventually(std::time::Duration::from_secs(30), || {
            let log = hoard.log.lock().unwrap();
            log.iter()
                .any(|l| l.contains("cannot fetch the token issuer's keys"))
        })
        .await;
        assert!(logged, "{:#?}", hoard.log.lock().unwrap());
    });
    let log = hoard.log.lock().unwrap().clone();
    let line = log
        .iter()
        .find(|l| l.contains("cannot fetch the token issuer's keys"))
        .unwrap();
    assert!(line.contains("ERROR"), "{line}");
    assert!(
        line.contains(&format!("{iss}/.well-known/openid-configuration")),
        "the cause is logged: {line}"
    );
    assert_eq!(table_rows(data.path(), "uploads"), 0);
}

/// A server (its own process, its log kept) that trusts the test issuer [`ISS`] by its key file
/// and HS256 tokens signed with the test secret; the issuer, the server and its data directory.
fn hoard_trusting_the_test_issuer() -> (Issuer, Hoard, tempfile::TempDir) {
    let issuer = Issuer::new(ISS);
    let data = tempfile::tempdir().unwrap();
    let jwks = issuer.write_jwks(data.path());
    let secret = secret_file(data.path());
    let hoard = Hoard::start_with(
        data.path(),
        &[
            "--token-issuer",
            ISS,
            "--jwks-file",
            jwks.to_str().unwrap(),
            "--token-hs256-secret-file",
            secret.to_str().unwrap(),
        ],
    );
    (issuer, hoard, data)
}

/// What a client puts in a token reaches the log only bounded: a refusal's reason (here, an
/// untrusted issuer of 30,000 characters, read before any signature is checked) and the audit
/// line of a reservation (a token subject of 30,000 characters) stay short lines. A token past
/// the limit on a request's headers (64 KiB) is refused before it is read at all.
#[test]
fn refusals_and_audit_lines_log_bounded_text() {
    let (issuer, hoard, _data) = hoard_trusting_the_test_issuer();
    let mut untrusted = issuer.claims("1", &[(MAIN, 3)]);
    untrusted["iss"] = json!(format!("https://evil.example/{}", "x".repeat(30_000)));
    let mut oversized = untrusted.clone();
    oversized["iss"] = json!(format!("https://evil.example/{}", "x".repeat(100_000)));
    let mut long_subject = claims("1", &[(MAIN, 3)]);
    long_subject["sub"] = json!("s".repeat(30_000));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        let (status, body) = twirp_at(
            &http,
            &hoard.base,
            &issuer.rs256(&untrusted),
            "GetCacheEntryDownloadURL",
            json!({ "key": "k", "version": VERSION }),
        )
        .await;
        assert_eq!(
            (status, body["code"].as_str()),
            (401, Some("unauthenticated"))
        );
        let status = http
            .post(format!("{}{SERVICE}GetCacheEntryDownloadURL", hoard.base))
            .bearer_auth(issuer.rs256(&oversized))
            .header("content-type", "application/json")
            .body(json!({ "key": "k", "version": VERSION }).to_string())
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 431, "headers past the limit are refused unread");
        let (status, body) = twirp_at(
            &http,
            &hoard.base,
            &sign_hs256(&long_subject),
            "CreateCacheEntry",
            json!({ "key": "k", "version": VERSION }),
        )
        .await;
        assert_eq!((status, body["ok"].as_bool()), (200, Some(true)), "{body}");
        let logged = eventually(std::time::Duration::from_secs(30), || {
            let log = hoard.log.lock().unwrap();
            let audited = |action: &str| log.iter().any(|l| l.contains(action));
            audited("action=\"refused\"") && audited("action=\"reserve\"")
        })
        .await;
        assert!(logged, "the refusal and the reservation are audited");
    });
    let log = hoard.log.lock().unwrap().clone();
    let long: Vec<String> = log
        .iter()
        .filter(|l| l.len() > 2048)
        .map(|l| format!("{} bytes: {}…", l.len(), &l[..l.len().min(200)]))
        .collect();
    assert!(long.is_empty(), "log lines over 2 KiB: {long:#?}");
}

/// What a verified token carries reaches the log escaped: a newline in its `repository_id`,
/// `repository`, `ac` scopes, `sub` or run cannot start a forged line, and terminal escapes
/// do not pass through (issue #43). Every line stays one line without a control character.
#[test]
fn audit_lines_with_hostile_claims_stay_one_line_without_control_characters() {
    let (issuer, hoard, _data) = hoard_trusting_the_test_issuer();
    let forged = "\nFORGED hoard::audit: action=\"delete\" id=1 \u{1b}[2J\r\u{85}";
    let mut hostile = claims(&format!("1{forged}"), &[]);
    hostile["ac"] = json!(serde_json::to_string(&json!([
        { "Scope": format!("refs/heads/main{forged}"), "Permission": 3 }
    ]))
    .unwrap());
    hostile["repository"] = json!(format!("octo/app{forged}"));
    hostile["sub"] = json!(format!("repo:octo/app{forged}"));
    hostile["scp"] = json!(format!("Actions.Results:1{forged}:2{forged}"));
    let mut untrusted = hostile.clone();
    untrusted["iss"] = json!(format!("https://evil.example/{forged}"));

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        let token = sign_hs256(&hostile);
        let (status, body) = twirp_at(
            &http,
            &hoard.base,
            &token,
            "CreateCacheEntry",
            json!({ "key": "k", "version": VERSION }),
        )
        .await;
        assert_eq!((status, body["ok"].as_bool()), (200, Some(true)), "{body}");
        let url = body["signed_upload_url"].as_str().unwrap();
        let put = http
            .put(url)
            .header("x-ms-blob-type", "BlockBlob")
            .body(b"payload".to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(put.status(), 201);
        let (status, body) = twirp_at(
            &http,
            &hoard.base,
            &token,
            "FinalizeCacheEntryUpload",
            json!({ "key": "k", "version": VERSION, "size_bytes": 7 }),
        )
        .await;
        assert_eq!((status, body["ok"].as_bool()), (200, Some(true)), "{body}");
        // A refusal's reason, for a token whose issuer is not trusted.
        let (status, _) = twirp_at(
            &http,
            &hoard.base,
            &issuer.rs256(&untrusted),
            "GetCacheEntryDownloadURL",
            json!({ "key": "k", "version": VERSION }),
        )
        .await;
        assert_eq!(status, 401);
        let logged = eventually(std::time::Duration::from_secs(30), || {
            let log = hoard.log.lock().unwrap();
            let audited = |action: &str| log.iter().any(|l| l.contains(action));
            audited("action=\"reserve\"")
                && audited("action=\"finalize\"")
                && audited("action=\"refused\"")
        })
        .await;
        assert!(logged, "the writes and the refusal are audited");
    });
    let log = hoard.log.lock().unwrap().clone();
    let audit: Vec<&String> = log.iter().filter(|l| l.contains("hoard::audit")).collect();
    assert!(
        audit.iter().any(|l| l.contains("FORGED")),
        "the hostile claims are in the audit lines, escaped: {audit:#?}"
    );
    for line in &log {
        assert!(
            !line.trim_start().starts_with("FORGED"),
            "a token started a log line of its own: {line:?}"
        );
        assert!(
            !line.chars().any(|c| c.is_control() || c == '\u{85}'),
            "a control character reached the log: {line:?}"
        );
    }
}
