//! Hostile input (issue #4, point 4): each gets a clean answer in its endpoint's error format,
//! and nothing is stored or changed.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a test waits for what must happen soon (a cleanup, an answer): generous for a loaded
/// 2-core CI machine, and spent only when the test is failing anyway.
const PATIENCE: Duration = Duration::from_secs(30);
/// How long a test waits for the server to close a connection on purpose: below the default
/// `--header-timeout` (10 s), whose timer would otherwise close it too and hide a failure.
const HANG_UP: Duration = Duration::from_secs(8);

/// Entries and chunk files, to show a refused request changed nothing.
fn footprint(srv: &TestServer) -> (usize, usize) {
    (
        table_rows(srv.data.path(), "entries"),
        srv.chunk_files().len(),
    )
}

/// Upload records of any state: a reservation leaves one even before any byte arrives.
fn uploads(srv: &TestServer) -> usize {
    table_rows(srv.data.path(), "uploads")
}

async fn post_raw(
    srv: &TestServer,
    method: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (u16, serde_json::Value) {
    let res = srv
        .http
        .post(srv.url(&format!("{SERVICE}{method}")))
        .bearer_auth(main_token())
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap();
    json_of(res).await
}

#[tokio::test]
async fn malformed_twirp_bodies_are_400_twirp_json() {
    let srv = TestServer::start().await;
    let before = footprint(&srv);
    for (ct, body) in [
        ("application/json", b"{\"key\":".to_vec()),
        ("application/json", b"[1,2,3]".to_vec()),
        (
            "application/json",
            br#"{"key": 42, "version": "v"}"#.to_vec(),
        ),
        ("application/json", vec![0xff, 0xfe, 0x00]),
        (
            "application/protobuf",
            vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f],
        ),
        ("application/protobuf", vec![0x12, 0x05, b'a']),
    ] {
        for method in [
            "CreateCacheEntry",
            "FinalizeCacheEntryUpload",
            "GetCacheEntryDownloadURL",
        ] {
            let (status, body) = post_raw(&srv, method, ct, body.clone()).await;
            assert_eq!(status, 400, "{method} {ct} {body}");
            assert!(
                matches!(
                    body["code"].as_str(),
                    Some("malformed" | "invalid_argument")
                ),
                "{body}"
            );
        }
    }
    let bad_size = br#"{"key":"k","version":"v","size_bytes":"12abc"}"#.to_vec();
    let (status, body) = post_raw(
        &srv,
        "FinalizeCacheEntryUpload",
        "application/json",
        bad_size,
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("malformed")),
        "non-numeric int64"
    );
    let (status, body) = post_raw(
        &srv,
        "CreateCacheEntry",
        "application/json",
        vec![b' '; 65 * 1024],
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("malformed")),
        "oversized"
    );
    let (status, body) = post_raw(&srv, "CreateCacheEntry", "text/plain", b"{}".to_vec()).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("bad_route")),
        "unknown content type"
    );
    assert_eq!(footprint(&srv), before);
}

#[tokio::test]
async fn bad_keys_are_400_invalid_argument() {
    let srv = TestServer::start().await;
    let t = main_token();
    for key in [
        "x".repeat(513),
        "a,b".into(),
        "tab\there".into(),
        "nul\0".into(),
        "line\nbreak".into(),
        String::new(),
    ] {
        let (status, body) = srv
            .twirp(
                "CreateCacheEntry",
                &t,
                json!({ "key": key, "version": VERSION }),
            )
            .await;
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("invalid_argument")),
            "{key:?}"
        );
        let (status, _) = srv.lookup(&t, "ok", &[&key], VERSION).await;
        assert_eq!(status, 400, "restore key {key:?}");
    }
    let eleven: Vec<String> = (0..10).map(|i| format!("r{i}")).collect();
    let (status, body) = srv
        .twirp(
            "GetCacheEntryDownloadURL",
            &t,
            json!({ "key": "k", "restore_keys": eleven, "version": VERSION }),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_argument"))
    );
    assert_eq!(footprint(&srv), (0, 0));
}

#[tokio::test]
async fn path_like_keys_are_opaque_data() {
    let srv = TestServer::start().await;
    let t = main_token();
    let outside = srv.data.path().parent().unwrap().join("etc");
    for key in [
        "../../etc/passwd",
        "/etc/shadow",
        "..\\..\\windows",
        "chunks/00/escape",
        "%2e%2e%2f",
    ] {
        srv.save(&t, key, VERSION, key.as_bytes()).await;
        assert_eq!(srv.restore(&t, key, VERSION).await.unwrap(), key.as_bytes());
    }
    assert!(!outside.exists());
    // Every file hoard made is a server-named chunk, the database, or its own bookkeeping.
    for file in files_under(srv.data.path()) {
        let name = file.file_name().unwrap().to_str().unwrap().to_owned();
        let chunk_dir = name
            .get(..2)
            .map(|shard| srv.data.path().join("chunks").join(shard));
        let server_named_chunk = name.len() == 32
            && name.bytes().all(|b| b.is_ascii_hexdigit())
            && file.parent() == chunk_dir.as_deref();
        let ok = server_named_chunk
            || [
                "hoard.db",
                "hoard.db-wal",
                "hoard.db-shm",
                "VERSION",
                "synced",
                "signing.key",
                "test-token-secret",
            ]
            .contains(&name.as_str());
        assert!(ok, "unexpected file {}", file.display());
    }
}

#[tokio::test]
async fn uploads_larger_than_the_entry_limit_are_413_and_store_nothing() {
    let srv = TestServer::start_with(&["--max-entry-size", "64KiB"]).await;
    let t = main_token();
    let url = srv.reserve(&t, "big", VERSION).await;
    let res = srv.put_blob(&url, vec![1; 65 * 1024]).await;
    assert_eq!(res.status(), 413);
    assert_eq!(res.headers()["x-ms-error-code"], "RequestBodyTooLarge");
    // Without a Content-Length, the limit holds while streaming.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..20).map(|_| Ok(vec![2u8; 8 * 1024])).collect();
    let res = srv
        .http
        .put(format!("{url}&comp=block&blockid=YmxvY2s="))
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    let status = res.status();
    assert_eq!(status, 413, "{}", res.text().await.unwrap());
    let (_, body) = srv.finalize(&t, "big", VERSION, 200 * 1024).await;
    assert_eq!(body["ok"], false);
    assert!(eventually(PATIENCE, || srv.chunk_files().is_empty()).await);
    assert!(files_under(&srv.data.path().join("tmp")).is_empty());
    assert_eq!(footprint(&srv), (0, 0));
}

#[tokio::test]
async fn staged_blocks_cannot_add_up_to_more_than_an_entry() {
    let srv = TestServer::start_with(&["--max-entry-size", "64KiB"]).await;
    let url = srv.reserve(&main_token(), "k", VERSION).await;
    for i in 0..2 {
        let res = srv
            .put_block(&url, &format!("block-{i}"), vec![1; 30 * 1024])
            .await;
        assert_eq!(res.status(), 201);
    }
    // A retried block replaces its earlier copy, so it still fits.
    assert_eq!(
        srv.put_block(&url, "block-1", vec![2; 30 * 1024])
            .await
            .status(),
        201
    );
    let res = srv.put_block(&url, "block-2", vec![3; 30 * 1024]).await;
    assert_eq!(res.status(), 413);
    assert!(eventually(PATIENCE, || srv.chunk_files().len() == 2).await);
}

#[tokio::test]
async fn oversized_block_lists_are_refused() {
    let srv = TestServer::start().await;
    let url = srv.reserve(&main_token(), "k", VERSION).await;
    let huge = format!(
        "<BlockList>{}</BlockList>",
        "<Latest>QUFBQQ==</Latest>".repeat(400_000)
    );
    let res = srv.put_block_list(&url, huge).await;
    assert_eq!(res.status(), 413);
    assert_eq!(res.headers()["content-type"], "application/xml");
    assert_eq!(res.headers()["x-ms-error-code"], "RequestBodyTooLarge");
    let body = res.text().await.unwrap();
    assert!(body.contains("<Code>RequestBodyTooLarge</Code>"), "{body}");
    let (_, body) = srv.finalize(&main_token(), "k", VERSION, 0).await;
    assert_eq!(body["ok"], false, "nothing was committed: {body}");
    assert_eq!(footprint(&srv), (0, 0));
}

#[tokio::test]
async fn too_many_open_uploads_is_429_with_retry_after() {
    let srv = TestServer::start_with(&["--max-open-uploads", "2"]).await;
    let t = main_token();
    let a = srv.reserve(&t, "a", VERSION).await;
    srv.reserve(&t, "b", VERSION).await;
    let res = srv
        .http
        .post(srv.url(&format!("{SERVICE}CreateCacheEntry")))
        .bearer_auth(&t)
        .header("content-type", "application/json")
        .body(json!({ "key": "c", "version": VERSION }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(res.headers()["retry-after"], "60");
    let (_, body) = json_of(res).await;
    assert_eq!(body["code"], "resource_exhausted");
    // Other repositories are not held back, and finishing an upload frees a place.
    srv.reserve(&token("2", &[(MAIN, 3)]), "c", VERSION).await;
    let create_c = || {
        srv.twirp(
            "CreateCacheEntry",
            &t,
            json!({ "key": "c", "version": VERSION }),
        )
    };
    let (_, body) = srv.finalize(&t, "a", VERSION, 0).await;
    assert_eq!(body["ok"], false, "nothing uploaded: {body}");
    assert_eq!(create_c().await.0, 429, "a failed finalize leaves it open");
    assert_eq!(srv.put_blob(&a, b"abc".to_vec()).await.status(), 201);
    let (_, body) = srv.finalize(&t, "a", VERSION, 3).await;
    assert_eq!(body["ok"], true, "{body}");
    let (status, body) = create_c().await;
    assert_eq!((status, &body["ok"]), (200, &json!(true)), "{body}");
}

#[tokio::test]
async fn slow_clients_are_cut_off_while_sending_headers() {
    let srv = TestServer::start_with(&["--header-timeout", "1s"]).await;
    let mut stream = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    stream.write_all(b"POST /twirp/github.actions.results.api.v1.CacheService/CreateCacheEntry HTTP/1.1\r\nhost: x\r\n").await.unwrap();
    // ...and then nothing. The server must hang up (or answer 408) on its own.
    let mut buf = Vec::new();
    let read = tokio::time::timeout(HANG_UP, stream.read_to_end(&mut buf)).await;
    assert!(
        read.is_ok(),
        "the connection was still open after {HANG_UP:?}"
    );
    let text = String::from_utf8_lossy(&buf);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 408"),
        "{text}"
    );
}

#[tokio::test]
async fn stalled_upload_bodies_are_abandoned() {
    let srv = TestServer::start_with(&["--idle-timeout", "1s"]).await;
    let url = srv.reserve(&main_token(), "k", VERSION).await;
    let path = url.trim_start_matches(&srv.base).to_owned();
    let mut stream = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    let head = format!("PUT {path} HTTP/1.1\r\nhost: {}\r\nx-ms-blob-type: BlockBlob\r\ncontent-length: 100000\r\n\r\n", srv.addr);
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&[7u8; 1000]).await.unwrap();
    let text = read_azure_answer(&mut stream).await;
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("x-ms-error-code: IncompleteBody"), "{text}");
    assert!(text.contains("<Code>IncompleteBody</Code>"), "{text}");
    assert_abandoned(&srv).await;
}

/// Reads an answer up to the end of its Azure XML error body (or the connection's end).
async fn read_azure_answer(stream: &mut tokio::net::TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 4096];
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !String::from_utf8_lossy(&out).contains("</Error>") {
        let n = tokio::time::timeout_at(deadline, stream.read(&mut buf))
            .await
            .expect("no answer")
            .unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Nothing of a stalled upload was kept: no staging file, no chunk, nothing to finalize.
async fn assert_abandoned(srv: &TestServer) {
    assert!(
        eventually(PATIENCE, || files_under(&srv.data.path().join("tmp"))
            .is_empty())
        .await,
        "the staging file was left behind"
    );
    assert!(srv.chunk_files().is_empty());
    let (status, body) = srv.finalize(&main_token(), "k", VERSION, 1000).await;
    assert_eq!((status, body["ok"].as_bool()), (200, Some(false)), "{body}");
    assert_eq!(footprint(srv), (0, 0));
}

/// The idle timeout holds on HTTP/2 as on HTTP/1.1: an upload body or a Twirp body that stops
/// moving is abandoned with the endpoint's error, and nothing of it is kept.
#[tokio::test]
async fn stalled_http2_bodies_are_abandoned() {
    let srv = TestServer::start_with(&["--idle-timeout", "1s"]).await;
    let url = srv.reserve(&main_token(), "k", VERSION).await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    // A first piece of the body, and then nothing, with the stream left open.
    let stalled = || {
        let first = futures_util::stream::iter([Ok::<_, std::io::Error>(vec![7u8; 1000])]);
        reqwest::Body::wrap_stream(futures_util::StreamExt::chain(
            first,
            futures_util::stream::pending(),
        ))
    };
    let res = tokio::time::timeout(
        PATIENCE,
        h2.put(&url)
            .header("x-ms-blob-type", "BlockBlob")
            .header("content-length", "100000")
            .body(stalled())
            .send(),
    )
    .await
    .expect("the stalled upload was not answered: HTTP/2 has no idle timeout")
    .unwrap();
    assert_eq!(res.version(), reqwest::Version::HTTP_2);
    assert_eq!(res.status(), 400);
    assert_eq!(res.headers()["x-ms-error-code"], "IncompleteBody");
    let body = tokio::time::timeout(PATIENCE, res.text())
        .await
        .unwrap()
        .unwrap();
    assert!(body.contains("<Code>IncompleteBody</Code>"), "{body}");
    assert_abandoned(&srv).await;

    let res = tokio::time::timeout(
        PATIENCE,
        h2.post(srv.url(&format!("{SERVICE}CreateCacheEntry")))
            .bearer_auth(main_token())
            .header("content-type", "application/json")
            .body(stalled())
            .send(),
    )
    .await
    .expect("the stalled Twirp body was not answered: HTTP/2 has no idle timeout")
    .unwrap();
    assert_eq!(res.version(), reqwest::Version::HTTP_2);
    let (status, body) = json_of(res).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("malformed")),
        "{body}"
    );
    assert_eq!(body["msg"], "the request body did not arrive in time");
    assert_eq!(uploads(&srv), 1, "only the first reservation");
}

/// Both framings at once (the request-smuggling shape): hyper drops the Content-Length, reads
/// the body as chunked (RFC 9112 §6.3) and closes the connection after the answer, so no second
/// request can hide in the body. The services never see the ambiguity, nor does the upstream of
/// the pass-through.
#[tokio::test]
async fn requests_framed_both_ways_are_read_as_chunked_and_the_connection_closed() {
    let srv = TestServer::start().await;
    let url = srv.reserve(&main_token(), "smuggle", VERSION).await;
    let upload = url.trim_start_matches(&srv.base).to_owned();
    let token = main_token();
    for (method, path, extra, answer, error) in [
        // The block is the 4-byte chunk, not 10 bytes of Content-Length.
        (
            "PUT",
            format!("{upload}&comp=block&blockid=YQ%3D%3D"),
            String::new(),
            "HTTP/1.1 201",
            None,
        ),
        // "abcd" is no JSON: read as the chunked body, the call is malformed (10 bytes of
        // Content-Length would be too, but would leave the smuggled request to be served).
        (
            "POST",
            "/twirp/github.actions.results.api.v1.CacheService/CreateCacheEntry".to_owned(),
            format!("authorization: Bearer {token}\r\ncontent-type: application/json\r\n"),
            "HTTP/1.1 400",
            Some("\"code\":\"malformed\""),
        ),
        (
            "POST",
            "/_apis/artifactcache/caches".to_owned(),
            format!("authorization: Bearer {token}\r\n"),
            "HTTP/1.1 400",
            Some("{\"message\":"),
        ),
    ] {
        let mut stream = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\n{extra}content-length: 10\r\ntransfer-encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nhost: x\r\n\r\n",
            srv.addr
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        tokio::time::timeout(HANG_UP, stream.read_to_end(&mut buf))
            .await
            .expect("the connection was not closed")
            .unwrap();
        let text = String::from_utf8_lossy(&buf);
        assert!(text.starts_with(answer), "{path}: {text}");
        if let Some(error) = error {
            assert!(text.contains(error), "{path}: {text}");
        }
        assert_eq!(
            text.matches("HTTP/1.1 ").count(),
            1,
            "the request smuggled after the body was not served: {text}"
        );
    }
    let blocks: Vec<Vec<u8>> = srv
        .chunk_files()
        .iter()
        .map(|f| std::fs::read(f).unwrap())
        .collect();
    assert_eq!(
        blocks,
        [b"abcd"],
        "one block, of the chunked body's 4 bytes"
    );
    assert_eq!(uploads(&srv), 1, "no reservation but the test's own");
    assert_eq!(footprint(&srv).0, 0);
}

/// The token is checked before a Twirp body is read: a caller without a token, or with one that
/// does not verify, is answered at once, without the server waiting for (or buffering) a body it
/// promised and never sends; at the origin root and under a path prefix alike.
#[tokio::test]
async fn twirp_calls_are_refused_before_their_body_is_read() {
    let srv = TestServer::start_with(&["--idle-timeout", "30s"]).await;
    let forged = {
        let key = jsonwebtoken::EncodingKey::from_secret(b"not-the-servers-secret-not-the-servers");
        let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        jsonwebtoken::encode(&header, &claims("1", &[(MAIN, 3)]), &key).unwrap()
    };
    let credentials = [
        ("no token", String::new()),
        ("garbage", "authorization: Bearer not.a.jwt\r\n".to_owned()),
        ("forged", format!("authorization: Bearer {forged}\r\n")),
    ];
    for prefix in ["", "/some/prefix"] {
        for (what, credential) in &credentials {
            let mut stream = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
            let head = format!(
                "POST {prefix}{SERVICE}CreateCacheEntry HTTP/1.1\r\nhost: {}\r\n{credential}content-type: application/json\r\ncontent-length: 60000\r\n\r\n{{\"key\":",
                srv.addr
            );
            stream.write_all(head.as_bytes()).await.unwrap();
            // Read to the end of the JSON answer (it may come in more than one segment), well
            // before the 30 s idle timeout that waiting for the body would end in.
            let mut answer = Vec::new();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            while !answer.ends_with(b"}") {
                let mut buf = vec![0u8; 4096];
                let n = tokio::time::timeout_at(deadline, stream.read(&mut buf))
                    .await
                    .unwrap_or_else(|_| {
                        panic!(
                            "{prefix} {what}: the server waited for the body before checking the token"
                        )
                    })
                    .unwrap();
                if n == 0 {
                    break;
                }
                answer.extend_from_slice(&buf[..n]);
            }
            let text = String::from_utf8_lossy(&answer);
            assert!(text.starts_with("HTTP/1.1 401"), "{prefix} {what}: {text}");
            assert!(
                text.contains("\"code\":\"unauthenticated\""),
                "{prefix} {what}: {text}"
            );
        }
    }
    assert_eq!(uploads(&srv), 0, "nothing was reserved");
    assert_eq!(footprint(&srv), (0, 0));
}

/// An HTTP/2 connection that completes no request is closed after the header timeout, as an
/// HTTP/1.1 one is: a client that opens one and stays silent, or sends a header block and never
/// finishes it, holds it no longer.
#[tokio::test]
async fn silent_or_slow_http2_clients_are_cut_off() {
    let srv = TestServer::start_with(&["--header-timeout", "1s"]).await;
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    const SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];
    // HEADERS on stream 1 without END_HEADERS: the block is never finished.
    const PARTIAL_HEADERS: [u8; 10] = [0, 0, 1, 1, 0x1, 0, 0, 0, 1, 0x83];
    for (what, frames) in [
        ("silent", [&SETTINGS[..]].concat()),
        (
            "slow headers",
            [&SETTINGS[..], &PARTIAL_HEADERS[..]].concat(),
        ),
    ] {
        let mut stream = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
        stream.write_all(PREFACE).await.unwrap();
        stream.write_all(&frames).await.unwrap();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(HANG_UP, stream.read_to_end(&mut buf)).await;
        assert!(
            read.is_ok(),
            "{what}: the connection was still open after {HANG_UP:?}"
        );
        // The server spoke HTTP/2 (its SETTINGS frame) before closing.
        assert!(buf.len() >= 9 && buf[3] == 4, "{what}: {buf:?}");
    }
    // A connection serving a request is not cut off while it waits for it.
    let res = srv.http.get(srv.url("/healthz")).send().await.unwrap();
    assert_eq!(res.status(), 200);
}
