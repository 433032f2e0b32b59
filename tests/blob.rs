//! Blob endpoints behind signed links (PROTOCOL.md §3, §4, §10.3–10.4, §12).
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A JS-SDK-style block id: base64(uuid + zero-padded index) (§3.4).
fn js_block_id(i: usize) -> String {
    STANDARD.encode(format!("a3d8ea2a-5ac1-47d6-978e-be6d39c9a11a{i:012}"))
}

fn block_list(ids: &[String], tag: &str) -> String {
    let items: String = ids
        .iter()
        .map(|id| format!("<{tag}>{id}</{tag}>"))
        .collect();
    format!(
        r#"<?xml version="1.0" encoding="UTF-8" standalone="yes"?><BlockList>{items}</BlockList>"#
    )
}

async fn assert_azure_error(res: reqwest::Response, status: u16, code: &str) {
    assert_eq!(res.status().as_u16(), status);
    assert_eq!(res.headers()["x-ms-error-code"], code);
    assert_eq!(res.headers()["content-type"], "application/xml");
    let body = res.text().await.unwrap();
    assert!(
        body.starts_with("<?xml") && body.contains(&format!("<Code>{code}</Code>")),
        "{body}"
    );
}

#[tokio::test]
async fn put_blob_answers_201_with_the_azure_headers() {
    let srv = TestServer::start().await;
    let url = srv.reserve(&main_token(), "k", VERSION).await;
    let res = srv.put_blob(&url, b"abc".to_vec()).await;
    assert_eq!(res.status(), 201);
    for h in [
        "x-ms-request-id",
        "x-ms-version",
        "etag",
        "last-modified",
        "date",
    ] {
        assert!(res.headers().contains_key(h), "missing {h}");
    }
    assert_eq!(res.headers()["content-length"], "0");
    assert!(res.bytes().await.unwrap().is_empty());
}

#[tokio::test]
async fn blocks_arrive_concurrently_out_of_order_and_the_list_orders_them() {
    let srv = TestServer::start().await;
    let t = main_token();
    let url = srv.reserve(&t, "blocks", VERSION).await;
    let parts: Vec<Vec<u8>> = (0..5)
        .map(|i| random_bytes(100_000 + i * 7, i as u64 + 10))
        .collect();
    let ids: Vec<String> = (0..5).map(js_block_id).collect();
    // Last block first, the rest at once.
    assert_eq!(
        srv.put_block(&url, &ids[4], parts[4].clone())
            .await
            .status(),
        201
    );
    let uploads = (0..4).map(|i| srv.put_block(&url, &ids[i], parts[i].clone()));
    for res in futures_util::future::join_all(uploads).await {
        assert_eq!(res.status(), 201);
    }
    assert_eq!(
        srv.put_block_list(&url, block_list(&ids, "Latest"))
            .await
            .status(),
        201
    );
    let whole: Vec<u8> = parts.concat();
    let (_, body) = srv.finalize(&t, "blocks", VERSION, whole.len()).await;
    assert_eq!(body["ok"], true, "{body}");
    assert_eq!(srv.restore(&t, "blocks", VERSION).await.unwrap(), whole);
}

#[tokio::test]
async fn a_retried_block_replaces_the_earlier_copy() {
    let srv = TestServer::start().await;
    let t = main_token();
    let url = srv.reserve(&t, "retry", VERSION).await;
    let id = js_block_id(0);
    srv.put_block(&url, &id, b"first attempt, garbled".to_vec())
        .await;
    srv.put_block(&url, &id, b"second".to_vec()).await;
    assert_eq!(
        srv.put_block_list(&url, block_list(&[id], "Latest"))
            .await
            .status(),
        201
    );
    srv.finalize(&t, "retry", VERSION, 6).await;
    assert_eq!(srv.restore(&t, "retry", VERSION).await.unwrap(), b"second");
    assert_eq!(srv.chunk_files().len(), 1, "the replaced copy is deleted");
}

#[tokio::test]
async fn binary_block_ids_with_plus_slash_and_equals_are_opaque() {
    let srv = TestServer::start().await;
    let t = main_token();
    let url = srv.reserve(&t, "sccache", VERSION).await;
    // 16 raw bytes, as sccache sends them: base64 with '+', '/' and '='.
    let ids = [
        STANDARD.encode([0xfb; 16]),
        STANDARD.encode([0xff; 16]),
        STANDARD.encode([0x3e; 16]),
    ];
    assert!(ids[0].contains('+') && ids[1].contains('/') && ids[0].ends_with('='));
    srv.put_block(&url, &ids[1], b"BB".to_vec()).await;
    srv.put_block(&url, &ids[0], b"AA".to_vec()).await;
    srv.put_block(&url, &ids[2], b"CC".to_vec()).await;
    let res = srv.put_block_list(&url, block_list(&ids, "Latest")).await;
    assert_eq!(res.status(), 201);
    srv.finalize(&t, "sccache", VERSION, 6).await;
    assert_eq!(
        srv.restore(&t, "sccache", VERSION).await.unwrap(),
        b"AABBCC"
    );
}

#[tokio::test]
async fn committed_and_uncommitted_sources_are_honoured() {
    let srv = TestServer::start().await;
    let t = main_token();
    let url = srv.reserve(&t, "k", VERSION).await;
    let (a, b) = (js_block_id(0), js_block_id(1));
    srv.put_block(&url, &a, b"aa".to_vec()).await;
    srv.put_block_list(&url, block_list(std::slice::from_ref(&a), "Uncommitted"))
        .await;
    srv.put_block(&url, &b, b"bb".to_vec()).await;
    let xml =
        format!("<BlockList><Committed>{a}</Committed><Uncommitted>{b}</Uncommitted></BlockList>");
    assert_eq!(srv.put_block_list(&url, xml).await.status(), 201);
    srv.finalize(&t, "k", VERSION, 4).await;
    assert_eq!(srv.restore(&t, "k", VERSION).await.unwrap(), b"aabb");
}

#[tokio::test]
async fn an_unknown_block_id_is_400_invalid_block_list() {
    let srv = TestServer::start().await;
    let t = main_token();
    let url = srv.reserve(&t, "k", VERSION).await;
    srv.put_block(&url, &js_block_id(0), b"aa".to_vec()).await;
    let res = srv
        .put_block_list(
            &url,
            block_list(&[js_block_id(0), js_block_id(9)], "Latest"),
        )
        .await;
    assert_azure_error(res, 400, "InvalidBlockList").await;
    let (_, body) = srv.finalize(&t, "k", VERSION, 2).await;
    assert_eq!(body["ok"], false, "nothing was committed");

    let res = srv.put_block_list(&url, "<BlockList><Latest>".into()).await;
    assert_azure_error(res, 400, "InvalidXmlDocument").await;
    let res = srv
        .http
        .put(format!("{url}&comp=block"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_azure_error(res, 400, "MissingRequiredQueryParameter").await;
    let res = srv
        .http
        .put(format!("{url}&comp=appendblock"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_azure_error(res, 400, "InvalidQueryParameterValue").await;
}

#[tokio::test]
async fn forged_expired_and_cross_purpose_links_are_403() {
    let srv = TestServer::start().await;
    let t = main_token();
    let url = srv.reserve(&t, "k", VERSION).await;
    let forged = url.replace("sig=", "sig=AAAA");
    assert_azure_error(
        srv.put_blob(&forged, b"x".to_vec()).await,
        403,
        "AuthenticationFailed",
    )
    .await;
    let unsigned = url.split('?').next().unwrap().to_owned();
    assert_azure_error(
        srv.put_blob(&unsigned, b"x".to_vec()).await,
        403,
        "AuthenticationFailed",
    )
    .await;
    let other_id = url.replacen("/_blob/uploads/1.", "/_blob/uploads/2.", 1);
    assert_ne!(other_id, url);
    assert_azure_error(
        srv.put_blob(&other_id, b"x".to_vec()).await,
        403,
        "AuthenticationFailed",
    )
    .await;
    let as_download = url.replace("/_blob/uploads/", "/_blob/entries/");
    let res = srv.http.get(&as_download).send().await.unwrap();
    assert_azure_error(res, 403, "AuthenticationFailed").await;
    assert!(
        srv.chunk_files().is_empty(),
        "nothing stored by refused requests"
    );

    let clock = manual_clock();
    let srv = TestServer::start_with_clock(&["--upload-url-ttl", "1s"], clock.clone()).await;
    let url = srv.reserve(&t, "k", VERSION).await;
    clock.advance(std::time::Duration::from_secs(1));
    assert_azure_error(
        srv.put_blob(&url, b"x".to_vec()).await,
        403,
        "AuthenticationFailed",
    )
    .await;
}

#[tokio::test]
async fn upload_links_stop_working_once_finalized() {
    let srv = TestServer::start().await;
    let t = main_token();
    let url = srv.reserve(&t, "k", VERSION).await;
    srv.put_blob(&url, b"abc".to_vec()).await;
    srv.finalize(&t, "k", VERSION, 3).await;
    let res = srv.put_blob(&url, b"evil".to_vec()).await;
    assert_azure_error(res, 403, "AuthorizationFailure").await;
    let res = srv.put_block(&url, &js_block_id(0), b"evil".to_vec()).await;
    assert_azure_error(res, 403, "AuthorizationFailure").await;
    assert_eq!(srv.restore(&t, "k", VERSION).await.unwrap(), b"abc");
}

async fn saved_entry(srv: &TestServer, data: &[u8]) -> String {
    let t = main_token();
    srv.save(&t, "dl", VERSION, data).await;
    let (_, body) = srv.lookup(&t, "dl", &[], VERSION).await;
    body["signed_download_url"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn downloads_serve_whole_entries_with_headers() {
    let srv = TestServer::start().await;
    let data = random_bytes(3_000_000, 5);
    let url = saved_entry(&srv, &data).await;
    let res = srv.http.get(&url).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let h = res.headers().clone();
    assert_eq!(h["content-length"], "3000000");
    assert_eq!(h["accept-ranges"], "bytes");
    assert_eq!(h["content-type"], "application/octet-stream");
    assert!(
        h.contains_key("etag")
            && h.contains_key("last-modified")
            && h.contains_key("x-ms-request-id")
    );
    assert_eq!(res.bytes().await.unwrap().as_ref(), data.as_slice());

    let res = srv.http.head(&url).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-length"], "3000000");
    assert_eq!(res.headers()["etag"], h["etag"]);
}

#[tokio::test]
async fn ranges_are_served_from_the_right_chunks() {
    let srv = TestServer::start().await;
    let t = main_token();
    let upload = srv.reserve(&t, "dl", VERSION).await;
    let parts: Vec<Vec<u8>> = (0..3).map(|i| random_bytes(1000, i + 50)).collect();
    let ids: Vec<String> = (0..3).map(js_block_id).collect();
    for (id, part) in ids.iter().zip(&parts) {
        srv.put_block(&upload, id, part.clone()).await;
    }
    srv.put_block_list(&upload, block_list(&ids, "Latest"))
        .await;
    srv.finalize(&t, "dl", VERSION, 3000).await;
    let whole = parts.concat();
    let (_, body) = srv.lookup(&t, "dl", &[], VERSION).await;
    let url = body["signed_download_url"].as_str().unwrap();

    for (header, value, start, end) in [
        ("range", "bytes=0-0", 0, 0),
        ("range", "bytes=990-2010", 990, 2010),
        ("x-ms-range", "bytes=1000-1999", 1000, 1999),
        ("range", "bytes=2500-", 2500, 2999),
        ("range", "bytes=-10", 2990, 2999),
        ("range", "bytes=2990-9999", 2990, 2999),
    ] {
        let res = srv
            .http
            .get(url)
            .header(header, value)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 206, "{value}");
        assert_eq!(
            res.headers()["content-range"],
            format!("bytes {start}-{end}/3000")
        );
        assert_eq!(
            res.headers()["content-length"],
            (end - start + 1).to_string()
        );
        assert_eq!(
            res.bytes().await.unwrap().as_ref(),
            &whole[start..=end],
            "{value}"
        );
    }
    // x-ms-range wins over Range.
    let res = srv
        .http
        .get(url)
        .header("range", "bytes=0-9")
        .header("x-ms-range", "bytes=10-19")
        .send()
        .await
        .unwrap();
    assert_eq!(res.bytes().await.unwrap().as_ref(), &whole[10..20]);

    let res = srv
        .http
        .get(url)
        .header("range", "bytes=3000-")
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers()["content-range"], "bytes */3000");
    assert_azure_error(res, 416, "InvalidRange").await;

    let res = srv
        .http
        .get(url)
        .header("if-match", "\"other\"")
        .send()
        .await
        .unwrap();
    assert_azure_error(res, 412, "ConditionNotMet").await;
}

#[tokio::test]
async fn unknown_entries_and_paths_get_xml_errors() {
    let srv = TestServer::start().await;
    let res = srv
        .http
        .get(srv.url("/_blob/entries/notanumber?se=1&sig=x"))
        .send()
        .await
        .unwrap();
    assert_azure_error(res, 404, "BlobNotFound").await;
    let res = srv
        .http
        .get(srv.url("/_blob/elsewhere/1"))
        .send()
        .await
        .unwrap();
    assert_azure_error(res, 404, "BlobNotFound").await;
    let url = saved_entry(&srv, b"abc").await;
    let res = srv.http.delete(&url).send().await.unwrap();
    assert_azure_error(res, 405, "UnsupportedHttpVerb").await;
}

/// Sends raw HTTP/1.1 and returns the response head, or "" if the server closed first.
async fn raw_exchange(srv: &TestServer, head: String, body: &[u8], close_write: bool) -> String {
    let mut stream = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    if close_write {
        stream.shutdown().await.unwrap();
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        stream.read_to_end(&mut out),
    )
    .await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn a_body_shorter_than_its_content_length_stores_nothing() {
    let srv = TestServer::start().await;
    let t = main_token();
    let url = srv.reserve(&t, "k", VERSION).await;
    let path = url.trim_start_matches(&srv.base).to_owned();
    let head = format!(
        "PUT {path} HTTP/1.1\r\nhost: {}\r\nx-ms-blob-type: BlockBlob\r\ncontent-length: 1000\r\n\r\n",
        srv.addr
    );
    let answer = raw_exchange(&srv, head, &[1u8; 400], true).await;
    assert!(!answer.contains(" 201 "), "{answer}");
    let (_, body) = srv.finalize(&t, "k", VERSION, 400).await;
    assert_eq!(body["ok"], false);
    assert!(
        eventually(std::time::Duration::from_secs(5), || srv
            .chunk_files()
            .is_empty())
        .await
    );
    assert!(
        common::files_under(&srv.data.path().join("tmp")).is_empty(),
        "staging file removed"
    );
}

#[tokio::test]
async fn a_body_longer_than_its_content_length_stores_only_what_was_declared() {
    let srv = TestServer::start().await;
    let t = main_token();
    let url = srv.reserve(&t, "k", VERSION).await;
    let path = url.trim_start_matches(&srv.base).to_owned();
    let head = format!(
        "PUT {path} HTTP/1.1\r\nhost: {}\r\nx-ms-blob-type: BlockBlob\r\ncontent-length: 4\r\nconnection: close\r\n\r\n",
        srv.addr
    );
    let answer = raw_exchange(&srv, head, b"abcdEXTRA", false).await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    let (_, body) = srv.finalize(&t, "k", VERSION, 4).await;
    assert_eq!(body["ok"], true);
    assert_eq!(srv.restore(&t, "k", VERSION).await.unwrap(), b"abcd");
}

#[tokio::test]
async fn a_block_list_longer_than_azures_limit_is_400_block_list_too_long() {
    let srv = TestServer::start().await;
    let t = main_token();
    let url = srv.reserve(&t, "long-list", VERSION).await;
    srv.put_block(&url, &js_block_id(0), b"aa".to_vec()).await;
    let ids: Vec<String> = (0..50_001).map(|_| js_block_id(0)).collect();
    let res = srv.put_block_list(&url, block_list(&ids, "Latest")).await;
    assert_azure_error(res, 400, "BlockListTooLong").await;
    let (_, body) = srv.finalize(&t, "long-list", VERSION, 2).await;
    assert_eq!(body["ok"], false, "nothing was committed");
    assert_eq!(
        srv.chunk_files().len(),
        1,
        "the staged block is all that is kept"
    );
    // Azure's limit itself is allowed: the same block listed exactly 50,000 times.
    let ids: Vec<String> = (0..50_000).map(|_| js_block_id(0)).collect();
    let res = srv.put_block_list(&url, block_list(&ids, "Latest")).await;
    assert_eq!(res.status(), 201);
    let (_, body) = srv.finalize(&t, "long-list", VERSION, 100_000).await;
    assert_eq!(body["ok"], true, "{body}");
}

/// The id of an upload link: its path's last segment.
fn upload_id(url: &str) -> i64 {
    let path = url.split('?').next().unwrap();
    let segment = path.rsplit('/').next().unwrap();
    segment.split('.').next().unwrap().parse().unwrap()
}

/// Azure keeps at most 100,000 uncommitted blocks per blob, and so does hoard: one more is 409
/// `BlockCountExceedsLimit` and is not kept, while a retried id, which replaces its copy, still
/// fits.
#[tokio::test]
async fn an_upload_holds_at_most_azures_count_of_uncommitted_blocks() {
    let srv = TestServer::start().await;
    let t = main_token();
    let url = srv.reserve(&t, "many", VERSION).await;
    let id = upload_id(&url);
    // 100,000 staged blocks, written as rows: 100,000 Put Block calls would take minutes.
    let db = rusqlite::Connection::open(srv.data.path().join("hoard.db")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    db.execute(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 99999)
         INSERT INTO staged_blocks (upload_id, block_id, blob_name, size, sha256, xxh3)
         SELECT ?1, CAST(printf('seeded-%06d', i) AS BLOB), printf('%032x', i), 1, randomblob(32), NULL
         FROM n",
        [id],
    )
    .unwrap();
    // The upload's totals, which every change to its blocks keeps.
    db.execute(
        "UPDATE uploads SET staged_count = 100000, staged_bytes = 100000 WHERE id = ?1",
        [id],
    )
    .unwrap();
    let staged = |block: &str| -> (i64, i64) {
        db.query_row(
            "SELECT COUNT(*), COUNT(CASE WHEN block_id = CAST(?2 AS BLOB) THEN 1 END)
             FROM staged_blocks WHERE upload_id = ?1",
            rusqlite::params![id, block],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
    };
    assert_eq!(staged("one-more"), (100_000, 0));

    let res = srv.put_block(&url, "one-more", b"abc".to_vec()).await;
    assert_azure_error(res, 409, "BlockCountExceedsLimit").await;
    assert_eq!(
        staged("one-more"),
        (100_000, 0),
        "the refused block is not recorded"
    );
    assert!(
        eventually(std::time::Duration::from_secs(5), || srv
            .chunk_files()
            .is_empty())
        .await,
        "the refused block's bytes are deleted"
    );

    let res = srv.put_block(&url, "seeded-000007", b"abc".to_vec()).await;
    assert_eq!(res.status(), 201, "{}", res.text().await.unwrap());
    assert_eq!(staged("seeded-000007"), (100_000, 1));
    assert_eq!(srv.chunk_files().len(), 1);
    let (_, body) = srv.finalize(&t, "many", VERSION, 3).await;
    assert_eq!(body["ok"], false, "staged blocks are no entry: {body}");
}

/// A link's signature is checked before its row is loaded: with the metadata tables gone from
/// under the server, forged links to rows it never loaded are still refused as forged (403),
/// not answered with a database error, no row load is even tried (the store's call counts in
/// `/metrics` stay), and a link stripped of its row time is refused too.
#[tokio::test]
async fn signatures_are_checked_before_any_row_is_read() {
    let srv = TestServer::start().await;
    let t = main_token();
    let upload = srv.reserve(&t, "k", VERSION).await;
    let res = srv.put_blob(&upload, b"bytes".to_vec()).await;
    assert_eq!(res.status(), 201);
    srv.finalize(&t, "k", VERSION, 5).await;
    let (_, hit) = srv.lookup(&t, "k", &[], VERSION).await;
    let download = hit["signed_download_url"].as_str().unwrap().to_owned();
    // The link names the row's creation time after its id: `/_blob/entries/<id>.<created>`.
    let (path, _) = download.split_once('?').unwrap();
    assert!(path.rsplit('/').next().unwrap().contains('.'), "{download}");

    // Another connection removes the rows' tables: any load now fails.
    let db = rusqlite::Connection::open(srv.data.path().join("hoard.db")).unwrap();
    db.execute_batch("PRAGMA foreign_keys=OFF; DROP TABLE entry_chunks; DROP TABLE entries; DROP TABLE staged_blocks; DROP TABLE upload_parts; DROP TABLE uploads;")
        .unwrap();
    drop(db);

    let forge = |link: &str, id: &str| {
        let (path, query) = link.split_once('?').unwrap();
        let (dir, segment) = path.rsplit_once('/').unwrap();
        let created = segment.split_once('.').unwrap().1;
        let path = format!("{dir}/{id}.{created}");
        let query = query.replace("sig=", "sig=AAAA");
        format!("{path}?{query}")
    };
    let chunks = || {
        let mut files = srv.chunk_files();
        files.sort();
        files
    };
    let chunks_before = chunks();
    // Every load of an upload or an entry is a timed database call, failed ones included.
    let loads = || async {
        database_calls(&srv.http, &srv.base, "upload").await
            + database_calls(&srv.http, &srv.base, "entry").await
    };
    let loads_before = loads().await;
    // Forged links to rows that never existed (no cache holds them), and to the upload the test
    // made (uploads are read from the database by every request): a server that loaded the
    // rows first would fail (500), not refuse.
    let reservation = upload_id(&upload).to_string();
    for link in [
        forge(&download, "999"),
        forge(&upload, "999"),
        forge(&upload, &reservation),
    ] {
        let res = if link.contains("/uploads/") {
            srv.put_blob(&link, b"x".to_vec()).await
        } else {
            srv.http.get(&link).send().await.unwrap()
        };
        assert_azure_error(res, 403, "AuthenticationFailed").await;
    }
    let stripped = {
        let (path, query) = download.split_once('?').unwrap();
        format!("{}?{query}", path.rsplit_once('.').unwrap().0)
    };
    let res = srv.http.get(&stripped).send().await.unwrap();
    assert_azure_error(res, 403, "AuthenticationFailed").await;
    assert_eq!(chunks(), chunks_before, "nothing stored by refused links");
    assert_eq!(
        loads().await,
        loads_before,
        "no row was loaded for a refused link"
    );
}

/// Get Blob Properties on an upload link, as azcopy checks the length it put: 404
/// `BlobNotFound` with no body before anything is committed, then 200 with the committed
/// length and Azure's headers, after Put Blob and after a Put Block List alike.
#[tokio::test]
async fn head_on_an_upload_link_describes_the_committed_blob() {
    let srv = TestServer::start().await;
    let t = main_token();
    let url = srv.reserve(&t, "head", VERSION).await;
    let res = srv.http.head(&url).send().await.unwrap();
    assert_eq!(res.status(), 404);
    assert_eq!(res.headers()["x-ms-error-code"], "BlobNotFound");
    assert!(res.headers().contains_key("x-ms-request-id"));
    assert!(res.bytes().await.unwrap().is_empty());

    let ids: Vec<String> = (0..2).map(js_block_id).collect();
    for (i, id) in ids.iter().enumerate() {
        let res = srv
            .put_block(&url, id, random_bytes(1000 + i, i as u64))
            .await;
        assert_eq!(res.status(), 201);
    }
    // Staged blocks are no blob yet.
    assert_eq!(srv.http.head(&url).send().await.unwrap().status(), 404);
    let res = srv.put_block_list(&url, block_list(&ids, "Latest")).await;
    assert_eq!(res.status(), 201);
    let res = srv.http.head(&url).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let h = res.headers();
    assert_eq!(h["content-length"], "2001");
    assert_eq!(h["x-ms-blob-type"], "BlockBlob");
    for name in [
        "etag",
        "last-modified",
        "x-ms-request-id",
        "x-ms-version",
        "x-ms-creation-time",
    ] {
        assert!(h.contains_key(name), "missing {name}");
    }
    assert!(res.bytes().await.unwrap().is_empty());

    let res = srv.put_blob(&url, b"whole".to_vec()).await;
    assert_eq!(res.status(), 201);
    let res = srv.http.head(&url).send().await.unwrap();
    assert_eq!(
        (res.status().as_u16(), &res.headers()["content-length"]),
        (200, &"5".parse().unwrap())
    );
    let (_, done) = srv.finalize(&t, "head", VERSION, 5).await;
    assert_eq!(done["ok"], true, "{done}");
}

/// Get Block List on an upload link: the committed blocks in list order, the staged ones, or
/// both, by id and size, as Azure's XML; a blob made by Put Blob has no committed blocks.
#[tokio::test]
async fn get_block_list_on_an_upload_link() {
    let srv = TestServer::start().await;
    let t = main_token();
    let url = srv.reserve(&t, "blocklist", VERSION).await;
    let ids: Vec<String> = (0..3).map(js_block_id).collect();
    for (i, id) in ids.iter().enumerate() {
        let res = srv
            .put_block(&url, id, random_bytes(10 + i, i as u64))
            .await;
        assert_eq!(res.status(), 201);
    }
    let get = |kind: &'static str| {
        let url = format!("{url}&comp=blocklist{kind}");
        let http = srv.http.clone();
        async move {
            let res = http.get(url).send().await.unwrap();
            assert_eq!(res.status(), 200);
            assert_eq!(res.headers()["content-type"], "application/xml");
            res.text().await.unwrap()
        }
    };
    let block = |i: usize| {
        format!(
            "<Block><Name>{}</Name><Size>{}</Size></Block>",
            ids[i],
            10 + i
        )
    };
    assert_eq!(
        get("&blocklisttype=all").await,
        format!(
            r#"<?xml version="1.0" encoding="utf-8"?><BlockList><CommittedBlocks></CommittedBlocks><UncommittedBlocks>{}{}{}</UncommittedBlocks></BlockList>"#,
            block(0),
            block(1),
            block(2)
        )
    );
    let res = srv
        .put_block_list(
            &url,
            block_list(&[ids[2].clone(), ids[0].clone()], "Latest"),
        )
        .await;
    assert_eq!(res.status(), 201);
    assert_eq!(
        get("").await,
        format!(
            r#"<?xml version="1.0" encoding="utf-8"?><BlockList><CommittedBlocks>{}{}</CommittedBlocks></BlockList>"#,
            block(2),
            block(0)
        )
    );
    assert!(get("&blocklisttype=uncommitted")
        .await
        .contains("<UncommittedBlocks></UncommittedBlocks>"));
    let res = srv
        .http
        .get(format!("{url}&comp=blocklist&blocklisttype=some"))
        .send()
        .await
        .unwrap();
    assert_azure_error(res, 400, "InvalidQueryParameterValue").await;
    assert_eq!(srv.put_blob(&url, b"x".to_vec()).await.status(), 201);
    assert!(get("")
        .await
        .contains("<CommittedBlocks></CommittedBlocks>"));
}

/// Blob paths are matched after percent-decoding: the Go SDK's `uploads%2F<id>` is the same
/// link, while `%2e%2e`, an encoded `/` inside the id and doubled slashes never reach another
/// upload or entry (404 or 403, nothing stored, the other rows unchanged).
#[tokio::test]
async fn encoded_paths_route_as_decoded_and_never_reach_another_row() {
    let srv = TestServer::start().await;
    let t = main_token();
    srv.save(&t, "other", VERSION, b"the other entry").await;
    let (_, hit) = srv.lookup(&t, "other", &[], VERSION).await;
    let download = hit["signed_download_url"].as_str().unwrap().to_owned();
    let url = srv.reserve(&t, "encoded", VERSION).await;

    let encoded = url.replacen("/_blob/uploads/", "/_blob/uploads%2F", 1);
    assert_eq!(
        srv.put_blob(&encoded, b"via %2F".to_vec()).await.status(),
        201
    );
    let lower = url.replacen("/_blob/uploads/", "/_blob%2fuploads%2f", 1);
    assert_eq!(srv.http.head(&lower).send().await.unwrap().status(), 200);
    let res = srv
        .http
        .get(download.replacen("/_blob/entries/", "/_blob/entries%2F", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.bytes().await.unwrap(), &b"the other entry"[..]);

    let (path, query) = url.split_once('?').unwrap();
    let (dir, segment) = path.rsplit_once('/').unwrap();
    let (entry_path, _) = download.split_once('?').unwrap();
    let entry_segment = entry_path.rsplit('/').next().unwrap();
    let chunks_before = srv.chunk_files();
    for hostile in [
        format!("{dir}/%2e%2e/entries/{entry_segment}?{query}"),
        format!("{dir}%2F%2e%2e%2Fentries%2F{entry_segment}?{query}"),
        format!("{dir}/{segment}%2F%2e%2e%2F{entry_segment}?{query}"),
        format!("{dir}//{segment}?{query}"),
        format!("{dir}%2F%2F{segment}?{query}"),
        format!(
            "{}//uploads/{segment}?{query}",
            dir.trim_end_matches("/uploads")
        ),
        format!("{dir}/%252F{segment}?{query}"),
        format!("{dir}/%2e%2e?{query}"),
    ] {
        // Raw, as sent: an HTTP client library would resolve the dot segments first.
        let path = hostile.trim_start_matches(&srv.base);
        let head = format!(
            "PUT {path} HTTP/1.1\r\nhost: {}\r\nx-ms-blob-type: BlockBlob\r\ncontent-length: 7\r\nconnection: close\r\n\r\n",
            srv.addr
        );
        let answer = raw_exchange(&srv, head, b"hostile", false).await;
        let status = answer.split(' ').nth(1).unwrap_or("");
        assert!(status == "404" || status == "403", "{hostile}: {answer}");
        assert!(
            answer.to_ascii_lowercase().contains("x-ms-error-code"),
            "{hostile}: {answer}"
        );
    }
    assert_eq!(
        srv.chunk_files(),
        chunks_before,
        "nothing stored by hostile paths"
    );
    let res = srv.http.head(&url).send().await.unwrap();
    assert_eq!(
        res.headers()["content-length"],
        "7",
        "the upload kept its blob"
    );
    assert_eq!(
        srv.restore(&t, "other", VERSION).await.unwrap(),
        b"the other entry"
    );
}

/// Links made by the previous release (`<id>?se=<Unix seconds>&ct=<created>&sig=…`) keep
/// opening their upload and entry until they expire.
#[tokio::test]
async fn links_of_the_previous_format_work_until_they_expire() {
    use hoard::auth::{LinkTarget, UrlSigner};
    use hoard::model::{EntryId, UploadId};
    let srv = TestServer::start().await;
    let t = main_token();
    let signer = UrlSigner::load_or_create(&srv.data.path().join("signing.key")).unwrap();
    // `<base>/_blob/<kind>/` and the id and creation time of a link of this release.
    let parts = |link: &str| {
        let (path, _) = link.split_once('?').unwrap();
        let (dir, segment) = path.rsplit_once('/').unwrap();
        let (id, created) = segment.split_once('.').unwrap();
        (
            dir.to_owned(),
            id.parse::<i64>().unwrap(),
            created.parse::<i64>().unwrap(),
        )
    };
    let later = unix_now() + 600;

    let (dir, id, created_at) = parts(&srv.reserve(&t, "old", VERSION).await);
    let target = LinkTarget {
        id: UploadId::new(id),
        created_at,
    };
    let old_upload = format!(
        "{dir}/{id}?se={later}&ct={created_at}&sig={}",
        signer.sign(target, later)
    );
    assert_eq!(
        srv.put_blob(&old_upload, b"old link".to_vec())
            .await
            .status(),
        201
    );
    assert_eq!(
        srv.http.head(&old_upload).send().await.unwrap().status(),
        200
    );
    let (_, done) = srv.finalize(&t, "old", VERSION, 8).await;
    assert_eq!(done["ok"], true, "{done}");

    let (_, hit) = srv.lookup(&t, "old", &[], VERSION).await;
    let (dir, id, created_at) = parts(hit["signed_download_url"].as_str().unwrap());
    let target = LinkTarget {
        id: EntryId::new(id),
        created_at,
    };
    let old_download = |expires: u64| {
        format!(
            "{dir}/{id}?se={expires}&ct={created_at}&sig={}",
            signer.sign(target, expires)
        )
    };
    let res = srv.http.get(old_download(later)).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.bytes().await.unwrap(), &b"old link"[..]);
    let res = srv
        .http
        .get(old_download(unix_now() - 1))
        .send()
        .await
        .unwrap();
    assert_azure_error(res, 403, "AuthenticationFailed").await;
}
