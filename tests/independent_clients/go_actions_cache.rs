//! BuildKit's cache client, `github.com/tonistiigi/go-actions-cache` (what `docker buildx`
//! uses for `type=gha`), against hoard: saves of several sizes (the Azure SDK for Go puts a
//! small blob whole and a larger one as 1 MiB blocks with the ids it makes; v1 sends 32 MiB
//! chunks, four at a time), a miss and byte-identical restores, over v2 and v1, configured
//! from the environment as BuildKit is. The client is the small Go program in
//! `tests/go-actions-cache/`, built by `scripts/clients` with `go build` (modules from the Go
//! module proxy, pinned by its go.sum). Without it the tests skip, except under
//! `HOARD_TEST_REQUIRE_CLIENTS=1` (CI).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::clients::{all_of, clean_env, installed, or_skip, output, requests_by_protocol};
use crate::common::*;

/// The client, built by `scripts/clients` (`scripts/test` runs it; `go build` in
/// `tests/go-actions-cache/` does the same).
fn client() -> Option<PathBuf> {
    or_skip("go-actions-cache", installed("bin/go-actions-cache"))
}

enum Protocol {
    /// `ACTIONS_RESULTS_URL` at `base`, with the trailing slash the runner gives it.
    V2,
    V1,
}

/// Runs the client (`save`/`load`) against hoard at `base` over `protocol`.
async fn run(
    client: &Path,
    protocol: &Protocol,
    base: &str,
    args: &[&str],
) -> std::process::Output {
    let mut cmd = Command::new(client);
    clean_env(&mut cmd)
        .args(args)
        .env("ACTIONS_RUNTIME_TOKEN", main_token())
        .env("GO_ACTIONS_CACHE_DEBUG", "1");
    match protocol {
        Protocol::V2 => cmd
            .env("ACTIONS_CACHE_SERVICE_V2", "true")
            .env("ACTIONS_RESULTS_URL", format!("{base}/")),
        Protocol::V1 => cmd
            .env("ACTIONS_CACHE_API_FORCE_VERSION", "v1")
            .env("ACTIONS_CACHE_URL", format!("{base}/")),
    };
    output(cmd).await
}

/// Saves each size under its own key, checks that a key never saved misses, and restores
/// every save byte for byte; `false` if the client is not there (the test skips).
async fn saves_misses_and_restores(protocol: Protocol, base: &str, sizes: &[usize]) -> bool {
    let Some(client) = client() else {
        return false;
    };
    let client = client.as_path();
    let dir = tempfile::tempdir().unwrap();
    for (i, &size) in sizes.iter().enumerate() {
        let data = random_bytes(size, 40 + i as u64);
        let file = dir.path().join(format!("save-{size}"));
        std::fs::write(&file, &data).unwrap();
        let key = format!("buildkit-{size}");
        let out = run(
            client,
            &protocol,
            base,
            &["save", &key, file.to_str().unwrap()],
        )
        .await;
        assert!(
            out.status.success(),
            "save of {size} bytes:\n{}",
            all_of(&out)
        );

        let restored = dir.path().join(format!("restored-{size}"));
        let out = run(
            client,
            &protocol,
            base,
            &["load", &key, restored.to_str().unwrap()],
        )
        .await;
        assert!(
            out.status.success(),
            "restore of {size} bytes:\n{}",
            all_of(&out)
        );
        let back = std::fs::read(&restored).unwrap();
        assert!(
            back == data,
            "restored {} bytes of {size}, not the bytes saved",
            back.len()
        );
    }
    let nowhere = dir.path().join("missed");
    let out = run(
        client,
        &protocol,
        base,
        &["load", "buildkit-never-saved", nowhere.to_str().unwrap()],
    )
    .await;
    assert_eq!(out.status.code(), Some(3), "a miss:\n{}", all_of(&out));
    assert!(!nowhere.exists());
    true
}

const MIB: usize = 1 << 20;

/// v2 by host name (`localhost`): the Azure SDK for Go then sends the blob name's `/`
/// percent-encoded. A blob under 1 MiB is one Put Blob; above, 1 MiB blocks and a block list.
#[tokio::test(flavor = "multi_thread")]
async fn buildkit_saves_and_restores_over_v2() {
    let srv = TestServer::start().await;
    let base = format!("http://localhost:{}", srv.addr.port());
    let sizes = [1, 100_000, MIB, 3 * MIB + 12_345];
    if !saves_misses_and_restores(Protocol::V2, &base, &sizes).await {
        return;
    }
    let (v2, v1, uploads) = requests_by_protocol(&srv.http, &srv.base).await;
    assert!(v2 > 0.0 && v1 == 0.0, "v2 {v2}, v1 {v1} calls");
    // At least a Put Blob for each of the three smaller saves, and four 1 MiB blocks and a
    // block list for the largest.
    assert!(uploads >= 8.0, "{uploads} requests on upload links");
}

/// v1 at an IP: 32 MiB chunks uploaded four at a time, a larger save in two.
#[tokio::test(flavor = "multi_thread")]
async fn buildkit_saves_and_restores_over_v1() {
    let srv = TestServer::start().await;
    if !saves_misses_and_restores(Protocol::V1, &srv.base, &[1, 100_000, 32 * MIB + 7]).await {
        return;
    }
    let (v2, v1, uploads) = requests_by_protocol(&srv.http, &srv.base).await;
    // A reservation, a chunk for each small save and two for the large one, a commit and a
    // lookup each, and the miss.
    assert!(
        v1 >= 3.0 * 3.0 + 1.0 + 1.0 && v2 == 0.0,
        "v2 {v2}, v1 {v1} calls"
    );
    assert_eq!(uploads, 0.0);
}

/// The Azure SDK for Go takes hoard's links apart and puts them back together (azcopy does
/// so for every request; `blob.ParseURL` then `String`): what it rebuilds still opens the
/// upload, and a link of the previous format lost its expiry that way.
#[tokio::test(flavor = "multi_thread")]
async fn links_survive_the_azure_sdk_for_go() {
    let Some(client) = client() else { return };
    let client = client.as_path();
    let srv = TestServer::start().await;
    let t = main_token();
    let rebuilt_by_sdk = |link: String| async move {
        let mut cmd = Command::new(client);
        cmd.args(["azure-url", &link]);
        let out = output(cmd).await;
        assert!(out.status.success(), "{}", all_of(&out));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    // What the previous format lost: its `se` of Unix seconds.
    let old = rebuilt_by_sdk(format!(
        "{}/_blob/uploads/1?se=1796310245&ct=1796310000123&sig=abc",
        srv.base
    ))
    .await;
    assert!(!old.contains("se=") && old.contains("sig=abc"), "{old}");

    let bases = [
        srv.base.clone(),
        format!("http://localhost:{}", srv.addr.port()),
    ];
    for (i, base) in bases.iter().enumerate() {
        let key = format!("rebuilt-{i}");
        let (status, body) = twirp_at(
            &srv.http,
            base,
            &t,
            "CreateCacheEntry",
            serde_json::json!({ "key": key, "version": VERSION }),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let link = body["signed_upload_url"].as_str().unwrap();
        let rebuilt = rebuilt_by_sdk(link.to_owned()).await;
        assert!(
            rebuilt.contains("se=") && rebuilt.contains("sig="),
            "{rebuilt}"
        );
        let res = srv.put_blob(&rebuilt, b"rebuilt".to_vec()).await;
        assert_eq!(
            res.status(),
            201,
            "{rebuilt}: {}",
            res.text().await.unwrap()
        );
        let (_, done) = srv.finalize(&t, &key, VERSION, 7).await;
        assert_eq!(done["ok"], true, "{done}");
    }
}
