//! The object store's own throughput through a plain client, for comparison with `hoard bench`
//! on the same store: the bytes of the published upload phase (8 entries of 128 MiB in
//! parallel, as 32 MiB blocks) put as plain objects, then read back twice, every byte counted.
//!
//! ```text
//! AWS_ENDPOINT_URL=http://127.0.0.1:9000 AWS_ACCESS_KEY_ID=… AWS_SECRET_ACCESS_KEY=… \
//!   cargo run --release --example object_store_floor -- s3://bucket/floor [SCALE]
//! ```
//!
//! Credentials and the endpoint come from the environment as for `hoard serve`. It uses the
//! same `object_store` client as hoard, with one PUT per 32 MiB object (no multipart), which is
//! the least work a client can do to store these bytes.
//!
//! With `fleet [JOBS [ROUNDS]]` after the scale, it moves the bytes of `hoard bench`'s fleet
//! phase instead (the same plan and seed): each repository's two seeded entries put untimed,
//! then, three times, every job of a round with JOBS at once, each a GET of the entry it
//! restores and a PUT of what it saves (one PUT per entry). It prints the median up + down
//! MiB/s and jobs/s.

#![allow(clippy::print_stdout)] // A report for the terminal.

use std::sync::Arc;
use std::time::Instant;

use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};

const MIB: usize = 1 << 20;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .ok_or("usage: object_store_floor s3://BUCKET/PREFIX [SCALE]")?;
    let scale: f64 = args.next().map_or(Ok(1.0), |s| s.parse())?;
    let parsed = url::Url::parse(&url)?;
    let (store, prefix) = client(&parsed)?;
    let store: Arc<dyn ObjectStore> = store.into();
    if args.next().as_deref() == Some("fleet") {
        let jobs = args.next().map_or(Ok(64), |s| s.parse())?;
        let rounds = args.next().map_or(Ok(3), |s| s.parse())?;
        fleet(&store, &prefix, scale, jobs, rounds).await?;
        return clean(&store, &prefix).await;
    }

    let entries = 8;
    let entry_size = ((128 * MIB) as f64 * scale) as usize;
    let block = (32 * MIB).min(entry_size);
    let blocks_per_entry = entry_size.div_ceil(block);
    let payload = bytes::Bytes::from(
        (0..block)
            .map(|i| (i as u8).wrapping_mul(31))
            .collect::<Vec<u8>>(),
    );
    let total = (entries * blocks_per_entry * block) as f64 / MIB as f64;
    let path = |e: usize, b: usize| prefix.child(format!("e{e}")).child(format!("b{b}"));

    let started = Instant::now();
    futures_util::future::try_join_all((0..entries).map(|e| {
        let (store, payload) = (store.clone(), payload.clone());
        let paths: Vec<Path> = (0..blocks_per_entry).map(|b| path(e, b)).collect();
        async move {
            for p in paths {
                store.put(&p, PutPayload::from(payload.clone())).await?;
            }
            Ok::<_, object_store::Error>(())
        }
    }))
    .await?;
    report("upload", total, started);

    for round in ["first download", "later download"] {
        let started = Instant::now();
        let read: Vec<usize> = futures_util::future::try_join_all((0..entries).map(|e| {
            let store = store.clone();
            let paths: Vec<Path> = (0..blocks_per_entry).map(|b| path(e, b)).collect();
            async move {
                let mut n = 0;
                for p in paths {
                    let mut body = store.get(&p).await?.into_stream();
                    while let Some(frame) = body.try_next().await? {
                        n += frame.len();
                    }
                }
                Ok::<_, object_store::Error>(n)
            }
        }))
        .await?;
        assert_eq!(
            read.iter().sum::<usize>(),
            entries * blocks_per_entry * block
        );
        report(round, total, started);
    }
    clean(&store, &prefix).await
}

async fn clean(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let names: Vec<Path> = store
        .list(Some(prefix))
        .map_ok(|m| m.location)
        .try_collect()
        .await?;
    for name in names {
        store.delete(&name).await?;
    }
    Ok(())
}

async fn fleet(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    scale: f64,
    jobs: usize,
    rounds: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let plan = hoard::bench::fleet_transfers(jobs, rounds, scale);
    let seeded = |i: usize| prefix.child("seeded").child(i.to_string());
    futures_util::future::try_join_all(plan.seeded.iter().enumerate().map(|(i, b)| {
        let path = seeded(i);
        async move { store.put(&path, PutPayload::from(b.clone())).await }
    }))
    .await?;
    let (seeded_bytes, seeded) = (&plan.seeded, &seeded);
    let (mut rates, mut job_rates) = (Vec::new(), Vec::new());
    for round in 0..3 {
        let started = Instant::now();
        let moved: Vec<usize> = futures_util::stream::iter(plan.jobs.iter().enumerate())
            .map(|(i, (restore, save))| async move {
                let mut n = 0;
                if let Some(r) = restore {
                    let mut body = store.get(&seeded(*r)).await?.into_stream();
                    while let Some(frame) = body.try_next().await? {
                        n += frame.len();
                    }
                    assert_eq!(n, seeded_bytes[*r].len(), "restored whole");
                }
                if let Some(bytes) = save {
                    let path = prefix.child(format!("r{round}")).child(i.to_string());
                    store.put(&path, PutPayload::from(bytes.clone())).await?;
                    n += bytes.len();
                }
                Ok::<_, object_store::Error>(n)
            })
            .buffer_unordered(jobs.max(1))
            .try_collect()
            .await?;
        let secs = started.elapsed().as_secs_f64();
        let mib = moved.iter().sum::<usize>() as f64 / MIB as f64;
        println!(
            "    fleet round {}: {:8.1} MiB/s, {:6.1} jobs/s ({mib:.0} MiB, {} jobs in {secs:.2} s)",
            round + 1,
            mib / secs,
            plan.jobs.len() as f64 / secs,
            plan.jobs.len()
        );
        rates.push(mib / secs);
        job_rates.push(plan.jobs.len() as f64 / secs);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "          fleet: {:8.1} MiB/s, {:6.1} jobs/s (medians of 3 rounds)",
        median(&mut rates),
        median(&mut job_rates)
    );
    Ok(())
}

fn report(what: &str, mib: f64, started: Instant) {
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{what:>15}: {:8.1} MiB/s ({mib:.0} MiB in {secs:.2} s)",
        mib / secs
    );
}

type Client = (Box<dyn ObjectStore>, Path);

fn client(url: &url::Url) -> Result<Client, Box<dyn std::error::Error>> {
    let bucket = format!("{}://{}", url.scheme(), url.host_str().unwrap_or_default());
    let prefix = Path::from(url.path().trim_matches('/'));
    let store: Box<dyn ObjectStore> = match url.scheme() {
        "s3" => {
            let builder = object_store::aws::AmazonS3Builder::from_env().with_url(bucket);
            let http = std::env::var("AWS_ENDPOINT_URL").is_ok_and(|e| e.starts_with("http://"));
            Box::new(builder.with_allow_http(http).build()?)
        }
        "gs" => Box::new(
            object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_url(bucket)
                .build()?,
        ),
        "az" => Box::new(
            object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_url(bucket)
                .with_allow_http(true)
                .build()?,
        ),
        other => return Err(format!("{other}:// is not an object store URL").into()),
    };
    Ok((store, prefix))
}
