//! OpenDAL's `ghac` service (PyPI `opendal`, in the venv `scripts/clients` makes) against
//! hoard, over v2 and v1: writes of several sizes whole and through its streamed writer
//! (256 KiB writes; block uploads with ids holding a raw `/` over v2), a path never written
//! not found, and byte-identical reads, by `tests/clients/opendal_ghac.py`. Without the venv
//! the tests skip, except under `HOARD_TEST_REQUIRE_CLIENTS=1` (CI).

use std::path::Path;
use std::process::Command;

use crate::common::clients::{assert_spoke_only, clean_env, installed, or_skip, output, point_at};
use crate::common::*;

const SIZES: [usize; 3] = [1, 300_000, 9 * (1 << 20) + 17];

async fn writes_and_reads(v2: bool) {
    let Some(python) = or_skip("OpenDAL", installed("venv/bin/python")) else {
        return;
    };
    let srv = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut datas = Vec::new();
    for (i, size) in SIZES.into_iter().enumerate() {
        let data = random_bytes(size, 90 + i as u64);
        std::fs::write(dir.path().join(format!("data-{size}")), &data).unwrap();
        datas.push(data);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/opendal_ghac.py");
    let mut cmd = Command::new(python);
    clean_env(&mut cmd).arg(script).arg(dir.path());
    cmd.args(SIZES.map(|s| s.to_string()));
    point_at(&mut cmd, &srv.base, v2, &main_token());
    let (result, all) = node_result(output(cmd).await);
    assert_spoke_only(&srv.http, &srv.base, v2).await;
    assert_eq!(result["miss"], "not found", "{all}");
    for (size, data) in SIZES.into_iter().zip(datas) {
        for read in ["read", "streamed"] {
            let back = std::fs::read(dir.path().join(format!("{read}-{size}"))).unwrap();
            assert!(
                back == data,
                "{read} {size}: {} bytes, not those written\n{all}",
                back.len()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn opendal_ghac_writes_and_reads_over_v2() {
    writes_and_reads(true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn opendal_ghac_writes_and_reads_over_v1() {
    writes_and_reads(false).await;
}
