//! Chunks on object storage, against real servers started for the test process: S3 on moto,
//! Azure Blob on Azurite, and Google Cloud Storage's XML API (what object_store speaks) on moto.
//!
//! Each test sets the cloud's environment variables for its own process (nextest runs every
//! test in a process of its own) and opens the store as `hoard serve` would.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::emulators;
use common::emulators::set_env;
use common::process::Hoard;
use hoard::blob::{BlobStore, ObjectStorage, ObjectStorageUrl};
use hoard::model::BlobName;

async fn open(url: &str) -> ObjectStorage {
    let url = ObjectStorageUrl::parse(url).unwrap().unwrap();
    ObjectStorage::open(&url).await.unwrap()
}

/// A presigned link reads the chunk whole and by range with no other credential, and a link
/// to a missing chunk does not.
async fn presigned_links_read_the_chunk(store: &ObjectStorage) {
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let name = BlobName::random();
    let body = futures_util::stream::iter([Ok(Bytes::from(data.clone()))]);
    store
        .put(&name, Box::pin(body), Some(data.len() as u64))
        .await
        .unwrap();
    let link = store
        .presigned_get(&name, Duration::from_secs(60))
        .await
        .unwrap()
        .expect("object stores presign");
    let http = reqwest::Client::new();
    let whole = http.get(link.clone()).send().await.unwrap();
    assert_eq!(whole.status(), 200);
    assert_eq!(whole.bytes().await.unwrap(), data);
    let part = http
        .get(link)
        .header("range", "bytes=10-19")
        .send()
        .await
        .unwrap();
    assert_eq!(part.status(), 206);
    assert_eq!(part.bytes().await.unwrap(), data[10..20]);
    let missing = store
        .presigned_get(&BlobName::random(), Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(http.get(missing).send().await.unwrap().status(), 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_s3_store_conforms() {
    let s3 = emulators::s3();
    set_env(&s3.env());
    let store = open(&format!("s3://{}/ci/cache", s3.bucket())).await;
    assert_eq!(store.kind(), "s3");
    hoard::blob::conformance::run_all(&store).await;
    presigned_links_read_the_chunk(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_azure_blob_store_conforms() {
    let azurite = emulators::azurite();
    set_env(&azurite.env());
    let store = open(&format!("az://{}/ci", azurite.container())).await;
    assert_eq!(store.kind(), "azure");
    hoard::blob::conformance::run_all(&store).await;
    // Azurite checks signatures: this also proves the link is signed right.
    presigned_links_read_the_chunk(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_azure_emulator_switch_works_too() {
    let azurite = emulators::azurite();
    set_env(&azurite.emulator_env());
    let store = open(&format!("az://{}", azurite.container())).await;
    presigned_links_read_the_chunk(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_gcs_store_conforms_on_an_xml_api_server() {
    let gcs = emulators::gcs();
    set_env(&gcs.env());
    let store = open(&format!("gs://{}/cache", gcs.bucket())).await;
    assert_eq!(store.kind(), "gcs");
    hoard::blob::conformance::run_all(&store).await;
    presigned_links_read_the_chunk(&store).await;
}

/// Two stores on one bucket and prefix see each other's chunks (replicas share a bucket), and
/// a store under another prefix sees none of them.
#[tokio::test(flavor = "multi_thread")]
async fn stores_on_one_prefix_share_chunks_and_prefixes_keep_apart() {
    let s3 = emulators::s3();
    set_env(&s3.env());
    let bucket = s3.bucket();
    let a = open(&format!("s3://{bucket}/team")).await;
    let b = open(&format!("s3://{bucket}/team/")).await;
    let other = open(&format!("s3://{bucket}/other")).await;
    let name = BlobName::random();
    let body = futures_util::stream::iter([Ok(Bytes::from_static(b"shared"))]);
    a.put(&name, Box::pin(body), Some(6)).await.unwrap();
    let got: Vec<Bytes> =
        futures_util::TryStreamExt::try_collect(b.get(&name, 0, 6).await.unwrap())
            .await
            .unwrap();
    assert_eq!(got.concat(), b"shared");
    assert!(matches!(
        other.get(&name, 0, 6).await,
        Err(hoard::blob::BlobError::NotFound(_))
    ));
    let listed: Vec<_> = futures_util::TryStreamExt::try_collect(other.list().await.unwrap())
        .await
        .unwrap();
    assert!(listed.is_empty(), "{listed:?}");
}

/// hoard's own process: wrong credentials or an unreachable store stop start-up with one
/// sentence that names the option and leaks no secret.
#[test]
fn a_store_hoard_cannot_use_stops_start_up_with_one_sentence() {
    let azurite = emulators::azurite();
    let container = azurite.container();
    let wrong_key = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXktd3Jvbmcta2V5LXdyb25nLWtleQ==";
    let mut env = azurite.env();
    for (k, v) in env.iter_mut() {
        if k == "AZURE_STORAGE_ACCOUNT_KEY" {
            *v = wrong_key.to_owned();
        }
    }
    let unreachable: Vec<(String, String)> = [
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:9"),
        ("AWS_ACCESS_KEY_ID", "hoard-test"),
        ("AWS_SECRET_ACCESS_KEY", "s3-secret-never-logged"),
        ("AWS_REGION", "us-east-1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for (url, env, secret) in [
        (format!("az://{container}"), env, wrong_key),
        (
            "s3://bucket/p".to_owned(),
            unreachable,
            "s3-secret-never-logged",
        ),
    ] {
        let data = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hoard"))
            .args(["serve", "--listen", "127.0.0.1:0", "--storage-url", &url])
            .arg("--data-dir")
            .arg(data.path())
            .env_remove("RUST_LOG")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR")).collect();
        assert_eq!(lines.len(), 1, "{stderr}");
        assert!(
            lines[0].contains("cannot open the chunk store (--storage-url, HOARD_STORAGE_URL)"),
            "{stderr}"
        );
        assert!(lines[0].contains(url.trim_end_matches("/p")), "{stderr}");
        assert!(!stderr.contains(secret), "a secret in the log: {stderr}");
    }
}

/// `/readyz` follows the store: when the layout marker goes (the bucket or prefix emptied or
/// made anew) while the store answers, hoard writes it again and stays ready; a marker of
/// another layout version is a 503 whose body says so in words, the cause in the log, and
/// nothing of the credentials there.
#[test]
fn readiness_follows_the_store_and_rewrites_a_missing_marker() {
    let s3 = emulators::s3();
    let bucket = s3.bucket();
    let data = tempfile::tempdir().unwrap();
    let env = s3.env();
    let hoard = Hoard::start_with_env(
        data.path(),
        &[
            "--storage-url",
            &format!("s3://{bucket}/x"),
            "--insecure-skip-token-validation",
        ],
        &env,
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        let readyz = || async {
            let res = http
                .get(format!("{}/readyz", hoard.base))
                .send()
                .await
                .unwrap();
            let status = res.status();
            (status, res.json::<serde_json::Value>().await.unwrap())
        };
        assert_eq!(readyz().await.0, 200);
        set_env(&env);
        let store = object_store::aws::AmazonS3Builder::from_env()
            .with_url(format!("s3://{bucket}"))
            .build()
            .unwrap();
        let marker = || async {
            match object_store::ObjectStore::get(&store, &"x/VERSION".into()).await {
                Ok(found) => Some(found.bytes().await.unwrap()),
                Err(object_store::Error::NotFound { .. }) => None,
                Err(e) => panic!("{e}"),
            }
        };
        // The marker goes, as when the prefix is emptied: ready again at once, marker back.
        object_store::ObjectStore::delete(&store, &"x/VERSION".into())
            .await
            .unwrap();
        assert_eq!(marker().await, None);
        let (status, body) = readyz().await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(marker().await.as_deref(), Some(&b"1\n"[..]));

        // A marker of another layout version is a refusal, and is left as it is.
        object_store::ObjectStore::put(
            &store,
            &"x/VERSION".into(),
            Bytes::from_static(b"2\n").into(),
        )
        .await
        .unwrap();
        let (status, body) = readyz().await;
        assert_eq!(status, 503, "{body}");
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .contains("layout marker (VERSION) is of another version"),
            "{body}"
        );
        assert_eq!(marker().await.as_deref(), Some(&b"2\n"[..]));
        // Log lines come through a pipe, a moment after the answer.
        let logged = || {
            let log = hoard.log.lock().unwrap();
            log.iter()
                .any(|l| l.contains("readiness check failed") && l.contains("version 2"))
        };
        assert!(
            common::eventually(Duration::from_secs(10), logged).await,
            "the refusal of the version 2 marker is logged: {}",
            hoard.log.lock().unwrap().join("\n")
        );
    });
    let log = hoard.log.lock().unwrap().join("\n");
    assert!(!log.contains(&s3.secret_access_key), "{log}");
}

/// A prefix written by a layout this version does not know is refused, not overwritten.
#[tokio::test(flavor = "multi_thread")]
async fn another_layout_version_is_refused() {
    let s3 = emulators::s3();
    set_env(&s3.env());
    let bucket = s3.bucket();
    let raw = object_store::aws::AmazonS3Builder::from_env()
        .with_url(format!("s3://{bucket}"))
        .build()
        .unwrap();
    object_store::ObjectStore::put(&raw, &"p/VERSION".into(), Bytes::from_static(b"2\n").into())
        .await
        .unwrap();
    let url = ObjectStorageUrl::parse(&format!("s3://{bucket}/p"))
        .unwrap()
        .unwrap();
    let err = ObjectStorage::open(&url).await.unwrap_err().to_string();
    assert!(
        err.contains("data layout version 2 is not supported"),
        "{err}"
    );
    let kept = object_store::ObjectStore::get(&raw, &"p/VERSION".into())
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(kept.as_ref(), b"2\n", "the marker is left as it was");
}
