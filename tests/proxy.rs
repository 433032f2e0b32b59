//! The pass-through to the results service (`--upstream-results-url`): the real
//! `@actions/artifact` client (npm) pointed at hoard reaches a recording upstream through it,
//! large bodies stream both ways in bounded memory, and an unreachable upstream is a Twirp 502.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post};
use axum::{Json, Router};
use base64::Engine as _;
use common::process::Hoard;
use futures_util::StreamExt;
use serde_json::{json, Value};

const ARTIFACTS: &str = "/twirp/github.actions.results.api.v1.ArtifactService/";

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path_and_query: String,
    authorization: Option<String>,
    marker: Option<String>,
    proxy_connection: Option<String>,
}

/// A stand-in for GitHub's results service and its blob storage: it answers the
/// `ArtifactService` calls the artifact client makes, stores the uploaded blob, and records
/// every request.
#[derive(Default)]
struct Upstream {
    base: String,
    seen: Mutex<Vec<Seen>>,
    blocks: Mutex<HashMap<String, Vec<u8>>>,
    blob: Mutex<Vec<u8>>,
}

type Shared = Arc<Upstream>;

impl Upstream {
    /// Starts on a free port of this test's runtime.
    async fn start() -> Shared {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = Arc::new(Upstream {
            base: format!("http://{}", listener.local_addr().unwrap()),
            ..Default::default()
        });
        let app = Router::new()
            .route(&format!("{ARTIFACTS}{{method}}"), post(artifact_service))
            .route("/blob/container/artifact.zip", any(blob))
            .route("/count", any(count))
            .route("/stream", any(stream))
            .route(
                "/teapot",
                any(|| async { (StatusCode::IM_A_TEAPOT, "short and stout") }),
            )
            .layer(axum::middleware::from_fn_with_state(
                upstream.clone(),
                record,
            ))
            .with_state(upstream.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        upstream
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn record(
    State(up): State<Shared>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let seen = {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        Seen {
            method: req.method().to_string(),
            path_and_query: req.uri().path_and_query().unwrap().to_string(),
            authorization: header("authorization"),
            marker: header("x-test-marker"),
            proxy_connection: header("proxy-connection"),
        }
    };
    up.seen.lock().unwrap().push(seen);
    next.run(req).await
}

async fn artifact_service(
    State(up): State<Shared>,
    UrlPath(method): UrlPath<String>,
    Json(req): Json<Value>,
) -> Response {
    let blob_url = format!(
        "{}/blob/container/artifact.zip?sig=upstream-signature",
        up.base
    );
    let size = up.blob.lock().unwrap().len();
    let answer = match method.as_str() {
        "CreateArtifact" => json!({ "ok": true, "signed_upload_url": blob_url }),
        "FinalizeArtifact" => json!({ "ok": true, "artifact_id": "42" }),
        "ListArtifacts" => json!({ "artifacts": [{
            "workflow_run_backend_id": req["workflowRunBackendId"],
            "workflow_job_run_backend_id": req["workflowJobRunBackendId"],
            "database_id": "42",
            "name": "report",
            "size": size.to_string(),
            "created_at": "2026-12-01T00:00:00Z",
        }]}),
        "GetSignedArtifactURL" => json!({ "signed_url": blob_url }),
        _ => return (StatusCode::NOT_FOUND, "no such method").into_response(),
    };
    Json(answer).into_response()
}

/// Azure's Put Block, Put Block List and Put Blob, and a plain GET of the committed blob.
/// The query of `uri` as a map (the test's own values need no decoding).
fn query_of(uri: &Uri) -> HashMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

async fn blob(State(up): State<Shared>, method: Method, uri: Uri, body: Bytes) -> Response {
    let query = query_of(&uri);
    if method == Method::GET {
        return up.blob.lock().unwrap().clone().into_response();
    }
    match query.get("comp").map(String::as_str) {
        Some("block") => {
            let id = query["blockid"].clone();
            up.blocks.lock().unwrap().insert(id, body.to_vec());
        }
        Some("blocklist") => {
            let xml = String::from_utf8(body.to_vec()).unwrap();
            let blocks = up.blocks.lock().unwrap();
            let mut whole = Vec::new();
            for part in xml.split("<Latest>").skip(1) {
                let id = part.split("</Latest>").next().unwrap();
                whole.extend_from_slice(&blocks[id]);
            }
            *up.blob.lock().unwrap() = whole;
        }
        _ => *up.blob.lock().unwrap() = body.to_vec(),
    }
    let mut response = StatusCode::CREATED.into_response();
    let h = response.headers_mut();
    h.insert("x-ms-request-id", "0".parse().unwrap());
    h.insert("etag", "\"0x1\"".parse().unwrap());
    h.insert(
        "last-modified",
        "Tue, 01 Dec 2026 00:00:00 GMT".parse().unwrap(),
    );
    response
}

/// Counts a body as it streams in, without keeping it.
async fn count(uri: Uri, headers: HeaderMap, body: Body) -> Json<Value> {
    let mut stream = body.into_data_stream();
    let mut received = 0u64;
    while let Some(chunk) = stream.next().await {
        received += chunk.unwrap().len() as u64;
    }
    Json(json!({
        "received": received,
        "query": uri.query(),
        "content_type": headers.get("content-type").map(|v| v.to_str().unwrap()),
    }))
}

/// Streams `size` bytes of zeros, 1 MiB at a time.
async fn stream(uri: Uri) -> Response {
    let size: u64 = query_of(&uri)["size"].parse().unwrap();
    let piece = Bytes::from(vec![0u8; 1 << 20]);
    let chunks = (0..size.div_ceil(1 << 20)).map(move |i| {
        let len = (size - i * (1 << 20)).min(1 << 20) as usize;
        Ok::<_, std::io::Error>(piece.slice(..len))
    });
    let mut response = Body::from_stream(futures_util::stream::iter(chunks)).into_response();
    response
        .headers_mut()
        .insert("x-upstream", "streamed".parse().unwrap());
    response
}

fn hoard_forwarding_to(upstream: &str) -> (tempfile::TempDir, Hoard) {
    let data = tempfile::tempdir().unwrap();
    let secret = common::secret_file(data.path());
    let hoard = Hoard::start_with(
        data.path(),
        &[
            "--token-hs256-secret-file",
            secret.to_str().unwrap(),
            "--upstream-results-url",
            upstream,
        ],
    );
    (data, hoard)
}

/// Runs the real artifact client; its `RESULT` value and its output.
fn artifact(hoard: &Hoard, token: &str, workspace: &Path, args: &[&str]) -> (Value, String) {
    let e2e = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e");
    assert!(
        e2e.join("node_modules/@actions/artifact").exists(),
        "the real client is not installed: run `npm ci --prefix tests/e2e` (scripts/test does)"
    );
    let out = Command::new("node")
        .arg(e2e.join("artifact.mjs"))
        .args(args)
        .current_dir(workspace)
        .env("ACTIONS_RESULTS_URL", format!("{}/", hoard.base))
        .env("ACTIONS_RUNTIME_TOKEN", token)
        .env("GITHUB_WORKSPACE", workspace)
        .env("RUNNER_TEMP", workspace)
        .env_remove("GITHUB_SERVER_URL")
        .output()
        .unwrap();
    common::node_result(out)
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs the real @actions/artifact client"
)]
async fn the_real_artifact_client_reaches_the_upstream_through_hoard() {
    let upstream = Upstream::start().await;
    let (_data, hoard) = hoard_forwarding_to(&format!("{}/", upstream.base));
    let token = common::main_token();
    let ws = tempfile::tempdir().unwrap();
    let report = ws.path().join("out/report.txt");
    std::fs::create_dir_all(report.parent().unwrap()).unwrap();
    std::fs::write(&report, "all green\n".repeat(1000)).unwrap();

    let (hoard_ref, token_ref, ws_path) = (&hoard, token.as_str(), ws.path().to_owned());
    let (uploaded, out) = tokio::task::block_in_place(|| {
        artifact(
            hoard_ref,
            token_ref,
            &ws_path,
            &[
                "upload",
                "report",
                ws_path.join("out").to_str().unwrap(),
                report.to_str().unwrap(),
            ],
        )
    });
    assert_eq!(uploaded["id"], 42, "{out}");
    let (listed, out) =
        tokio::task::block_in_place(|| artifact(hoard_ref, token_ref, &ws_path, &["list"]));
    assert_eq!(listed["artifacts"][0]["name"], "report", "{out}");
    let into = ws.path().join("downloaded");
    let (_, out) = tokio::task::block_in_place(|| {
        artifact(
            hoard_ref,
            token_ref,
            &ws_path,
            &["download", "42", into.to_str().unwrap()],
        )
    });
    assert_eq!(
        std::fs::read_to_string(into.join("report.txt")).unwrap(),
        "all green\n".repeat(1000),
        "{out}"
    );

    // Every Twirp call crossed hoard with the job's token; the blob went straight to storage.
    let calls: Vec<(String, Option<String>)> = upstream
        .seen()
        .into_iter()
        .filter(|s| s.path_and_query.starts_with(ARTIFACTS))
        .map(|s| {
            (
                s.path_and_query[ARTIFACTS.len()..].to_owned(),
                s.authorization,
            )
        })
        .collect();
    let methods: Vec<&str> = calls.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(
        methods,
        [
            "CreateArtifact",
            "FinalizeArtifact",
            "ListArtifacts",
            "ListArtifacts",
            "GetSignedArtifactURL"
        ]
    );
    assert!(
        calls
            .iter()
            .all(|(_, auth)| auth.as_deref() == Some(&format!("Bearer {token}"))),
        "{calls:?}"
    );
    let log = hoard.log.lock().unwrap().join("\n");
    assert!(
        log.contains("forwarded to the upstream results service"),
        "{log}"
    );
    assert!(!log.contains(&token), "the token is never logged");
}

#[tokio::test]
async fn requests_and_answers_stream_through_unchanged() {
    let upstream = Upstream::start().await;
    let (_data, hoard) = hoard_forwarding_to(&upstream.base);
    let http = reqwest::Client::new();

    // 300 MiB up, generated as it is sent.
    const SIZE: u64 = 300 << 20;
    let chunks = (0..300).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![7u8; 1 << 20])));
    let res = http
        .post(format!("{}/count?a=1&b=%2F", hoard.base))
        .header("content-type", "application/x-test")
        .header("x-test-marker", "kept")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "dropped")
        .header("proxy-connection", "keep-alive")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["received"], SIZE);
    assert_eq!(body["query"], "a=1&b=%2F");
    assert_eq!(body["content_type"], "application/x-test");
    let seen = upstream.seen();
    let last = seen.last().unwrap();
    assert_eq!(
        (last.method.as_str(), last.marker.as_deref()),
        ("POST", Some("kept"))
    );
    assert_eq!(last.proxy_connection, None, "a hop-by-hop header");

    // 300 MiB down.
    let res = http
        .get(format!("{}/stream?size={SIZE}", hoard.base))
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers()["x-upstream"], "streamed");
    let mut received = 0u64;
    let mut stream = res.bytes_stream();
    while let Some(chunk) = stream.next().await {
        received += chunk.unwrap().len() as u64;
    }
    assert_eq!(received, SIZE);
    let peak_mib = hoard.peak_rss_kib() / 1024;
    assert!(
        peak_mib < 100,
        "peak RSS {peak_mib} MiB while proxying 600 MiB"
    );

    // Statuses and bodies come back as the upstream gave them.
    let res = http
        .get(format!("{}/teapot", hoard.base))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 418);
    assert_eq!(res.text().await.unwrap(), "short and stout");

    // hoard's own routes stay hoard's.
    let res = http
        .get(format!("{}/readyz", hoard.base))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(!upstream
        .seen()
        .iter()
        .any(|s| s.path_and_query == "/readyz"));
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_twirp_502() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (_data, hoard) = hoard_forwarding_to(&format!("http://127.0.0.1:{port}/"));
    let res = reqwest::Client::new()
        .post(format!("{}{ARTIFACTS}CreateArtifact", hoard.base))
        .bearer_auth(common::main_token())
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    let (status, body) = common::json_of(res).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["code"], "unavailable");
    assert!(
        body["msg"].as_str().unwrap().contains("127.0.0.1"),
        "{body}"
    );
}

#[tokio::test]
async fn without_an_upstream_other_services_are_not_found() {
    let srv = common::TestServer::start().await;
    let res = srv
        .http
        .post(srv.url(&format!("{ARTIFACTS}CreateArtifact")))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    let (status, body) = common::json_of(res).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["code"], "bad_route");
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_paths_are_never_forwarded() {
    let up = Upstream::start().await;
    let (_data, hoard) = hoard_forwarding_to(&up.base);
    let http = reqwest::Client::new();
    for path in [
        "/some-prefix/_hoard/api/v1/caches",
        "/ns/_hoard/",
        "/_hoard/api/v1/status",
    ] {
        let res = http
            .get(format!("{}{path}", hoard.base))
            .bearer_auth("the-admin-token-0123456789")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 404, "{path}");
    }
    assert!(
        up.seen().is_empty(),
        "nothing reached the upstream: {:?}",
        up.seen()
    );
}

/// What is hoard's own never reaches the upstream, however the path is spelled: a path whose
/// first segment is or starts with a namespace's secret (`ACTIONS_CACHE_URL` without its
/// trailing slash gives `/<secret>_apis/artifactcache/…`), and any request carrying the admin
/// token. They are answered 404, as unknown paths are, and the secret is not logged.
#[tokio::test(flavor = "multi_thread")]
async fn namespace_secrets_and_the_admin_token_are_never_forwarded() {
    const SECRET: &str = "0123456789abcdef0123";
    const ADMIN: &str = "the-admin-token-0123456789";
    let up = Upstream::start().await;
    let data = tempfile::tempdir().unwrap();
    let namespaces = data.path().join("namespaces");
    std::fs::write(&namespaces, format!("act {SECRET} read-write\n")).unwrap();
    let admin = data.path().join("admin-token");
    std::fs::write(&admin, ADMIN).unwrap();
    let secret = common::secret_file(data.path());
    let hoard = Hoard::start_with(
        data.path(),
        &[
            "--token-hs256-secret-file",
            secret.to_str().unwrap(),
            "--upstream-results-url",
            &up.base,
            "--namespaces-file",
            namespaces.to_str().unwrap(),
            "--admin-token-file",
            admin.to_str().unwrap(),
        ],
    );
    let http = reqwest::Client::new();
    let job = format!("Bearer {}", common::main_token());
    let admin_bearer = format!("Bearer {ADMIN}");
    let admin_other = format!("token {ADMIN}");
    let admin_basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{ADMIN}"))
    );
    for (path, authorization) in [
        (
            format!("/{SECRET}_apis/artifactcache/cache?keys=k&version=v"),
            job.as_str(),
        ),
        (format!("/{SECRET}/twirp/elsewhere"), job.as_str()),
        (
            format!("/%30{}_apis/artifactcache/caches", &SECRET[1..]),
            job.as_str(),
        ),
        ("/_HOARD/api/v1/status".to_owned(), admin_bearer.as_str()),
        ("/_hoard%2Fapi/v1/status".to_owned(), admin_bearer.as_str()),
        ("/prefix/_hoard".to_owned(), admin_bearer.as_str()),
        ("/count".to_owned(), admin_other.as_str()),
        ("/count".to_owned(), admin_basic.as_str()),
    ] {
        let res = http
            .get(format!("{}{path}", hoard.base))
            .header("authorization", authorization)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 404, "{path}");
    }
    assert!(
        up.seen().is_empty(),
        "nothing reached the upstream: {:?}",
        up.seen()
    );
    // Anything else still goes through.
    let res = http
        .get(format!("{}/count", hoard.base))
        .header("authorization", &job)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(up.seen().len(), 1);
    let log = hoard.log.lock().unwrap().join("\n");
    assert!(!log.contains(SECRET), "the secret is logged:\n{log}");
    assert!(!log.contains(ADMIN), "the admin token is logged:\n{log}");
}
