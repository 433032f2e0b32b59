//! azcopy (Microsoft's transfer tool on the Azure SDK for Go, npm `@azure-tools/azcopy-linux`,
//! installed by `scripts/clients`) uploading to and downloading from hoard's signed links:
//! saves of several sizes (one Put Blob under the block size, 1 MiB Put Blocks and a block list
//! above it, then Get Blob Properties to check the length), a miss, and byte-identical
//! restores, with hoard reached at an IP and by a host name (`localhost`, for which the SDK
//! sends the blob name's `/` percent-encoded). azcopy has no v1: v1's transfers are no blob
//! links. Without azcopy the test skips, except under `HOARD_TEST_REQUIRE_CLIENTS=1` (CI).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::clients::{all_of, clean_env, installed, or_skip, output};
use crate::common::*;

fn azcopy() -> Option<PathBuf> {
    or_skip("azcopy", installed("bin/azcopy"))
}

/// `azcopy copy FROM TO` with 1 MiB blocks, its plans and logs in `work`. `from_to` says which
/// side is the blob (`LocalBlob`, `BlobLocal`): azcopy recognises a blob URL by its host
/// (`*.blob.core.windows.net`) only.
async fn copy(
    azcopy: &Path,
    work: &Path,
    from_to: &str,
    from: &str,
    to: &str,
) -> std::process::Output {
    let mut cmd = Command::new(azcopy);
    clean_env(&mut cmd)
        .args(["copy", from, to, "--from-to", from_to])
        .args(["--block-size-mb", "1", "--skip-version-check"])
        .args(["--log-level", "INFO", "--output-level", "essential"])
        .env("AZCOPY_JOB_PLAN_LOCATION", work.join("plans"))
        .env("AZCOPY_LOG_LOCATION", work.join("logs"))
        .env("AZCOPY_DISABLE_SYSLOG", "true")
        .env("HOME", work);
    output(cmd).await
}

/// The logs of azcopy's jobs, for failure messages.
fn logs(work: &Path) -> String {
    files_under(&work.join("logs"))
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn azcopy_uploads_and_downloads_through_signed_links() {
    let Some(azcopy) = azcopy() else { return };
    let srv = TestServer::start().await;
    let t = main_token();
    let work = tempfile::tempdir().unwrap();
    let by_name = format!("http://localhost:{}", srv.addr.port());
    for (i, (base, size)) in [
        (&srv.base, 100),
        (&srv.base, 2 * (1 << 20) + 4321),
        (&by_name, 1),
        (&by_name, 3 * (1 << 20)),
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("azcopy-{i}-{size}");
        let (status, body) = twirp_at(
            &srv.http,
            base,
            &t,
            "CreateCacheEntry",
            serde_json::json!({ "key": key, "version": VERSION }),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let upload = body["signed_upload_url"].as_str().unwrap().to_owned();
        assert!(upload.starts_with(base.as_str()), "{upload}");

        let data = random_bytes(size, 70 + i as u64);
        let file = work.path().join(format!("save-{i}"));
        std::fs::write(&file, &data).unwrap();
        let out = copy(
            &azcopy,
            work.path(),
            "LocalBlob",
            file.to_str().unwrap(),
            &upload,
        )
        .await;
        assert!(
            out.status.success(),
            "upload of {size} bytes to {upload}:\n{}\n{}",
            all_of(&out),
            logs(work.path())
        );
        let (status, done) = twirp_at(
            &srv.http,
            base,
            &t,
            "FinalizeCacheEntryUpload",
            serde_json::json!({ "key": key, "version": VERSION, "size_bytes": size.to_string() }),
        )
        .await;
        assert_eq!(
            (status, &done["ok"]),
            (200, &serde_json::json!(true)),
            "{done}"
        );

        let (status, hit) = twirp_at(
            &srv.http,
            base,
            &t,
            "GetCacheEntryDownloadURL",
            serde_json::json!({ "key": key, "version": VERSION }),
        )
        .await;
        assert_eq!(
            (status, &hit["ok"]),
            (200, &serde_json::json!(true)),
            "{hit}"
        );
        let download = hit["signed_download_url"].as_str().unwrap();
        let restored = work.path().join(format!("restored-{i}"));
        let out = copy(
            &azcopy,
            work.path(),
            "BlobLocal",
            download,
            restored.to_str().unwrap(),
        )
        .await;
        assert!(
            out.status.success(),
            "download of {size} bytes from {download}:\n{}\n{}",
            all_of(&out),
            logs(work.path())
        );
        let back = std::fs::read(&restored).unwrap();
        assert!(
            back == data,
            "restored {} bytes of {size}, not the bytes saved",
            back.len()
        );
    }
    let (status, miss) = srv.lookup(&t, "azcopy-never-saved", &[], VERSION).await;
    assert_eq!(
        (status, &miss["ok"]),
        (200, &serde_json::json!(false)),
        "{miss}"
    );
}
