//! Chunk bytes in object storage (S3 and S3-compatible servers, Google Cloud Storage, Azure Blob)
//! through the `object_store` crate.
//!
//! Layout under the URL's prefix: `chunks/<name>` for chunks and `VERSION`, the layout marker,
//! written at start-up (which proves the store can be written) and read by [`BlobStore::ping`].
//!
//! A chunk streams to the store as it arrives and is hashed on the way. A body of declared
//! length goes in one PUT through a link this server presigns for itself, frames passed on as
//! they come: no buffer. A body of unknown length (v1's chunked PATCH) is buffered: up to
//! [`PART_SIZE`] it is one PUT, a larger one a multipart upload of [`PART_SIZE`] parts with at
//! most [`PARTS_IN_FLIGHT`] being sent, and all such puts together hold at most
//! [`UPLOAD_BUFFER_PARTS`] part-sized buffers (plus chunks under 1 MiB), however many run at
//! once. An object appears only when its PUT, or the completion of its multipart upload,
//! succeeds: no reader ever sees part of a chunk. A multipart upload cut short by a crash stays
//! invisible and is billed until the bucket's lifecycle rule for incomplete multipart uploads
//! removes it (docs/scale-out.md).
//!
//! Durability is the store's: a put is durable when it returns, so `sync` has nothing to do and
//! nothing is ever lost to a crash of this machine.
//!
//! A store that refuses connections, stays silent or answers 5xx fails a request within
//! seconds ([`super::bounded`], [`retries`]) with [`BlobError::Unavailable`], which clients
//! hear as "retry later" (503); a refusal (403, a bad request) stays [`BlobError::Io`].

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::signer::Signer;
use object_store::{
    ClientConfigKey, GetOptions, GetRange, MultipartUpload, ObjectStore, PutPayload,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use url::Url;

use super::bounded::{self, Bounded, CONNECT_TIMEOUT, SILENCE};
use super::bursts::in_bursts;
use super::{BlobError, BlobStore, ByteStream, Capacity, Digests, Listed, NameStream};
use crate::model::{BlobName, Chunk, Millis};

const LAYOUT_VERSION: &str = "1";
/// Chunks up to this size are one PUT; larger ones are multipart uploads of parts this size
/// (S3 and GCS want at least 5 MiB per part but the last).
const PART_SIZE: usize = 8 << 20;
/// Parts of one chunk being sent at once.
const PARTS_IN_FLIGHT: usize = 2;
/// Part-sized buffers all puts together may hold: what bounds the memory of many block
/// uploads at once (the JS client sends 8 blocks of 64 MiB in parallel).
const UPLOAD_BUFFER_PARTS: usize = 4;
/// How long an upload link the server makes for itself stays valid: the store checks it when
/// the request starts, and the request starts at once.
const LINK_TTL: Duration = Duration::from_secs(600);
/// How long `/readyz` waits for the store.
const PING_TIMEOUT: Duration = Duration::from_secs(5);
/// Chunks declared this small are received whole outside the budget.
const SMALL: u64 = 1 << 20;
/// The longest one request to the store may take, body included. The clients' default (30 s)
/// would cut a download that a slow runner takes minutes to read; silence is bounded apart
/// ([`SILENCE`]).
const REQUEST_TIMEOUT: &str = "15m";
/// No retry of a failed request starts later than this after its first try.
const RETRY_BUDGET: Duration = Duration::from_secs(10);

/// Failed requests are retried (throttling, a dropped connection, a download resumed where it
/// broke off) up to 5 times within [`RETRY_BUDGET`], backing off from 100 ms: a store that
/// refuses connections fails a request in about 3 s, one that answers 5xx within about 10 s,
/// and a silent one after [`SILENCE`] (a request that timed out is not tried again once the
/// budget is spent).
fn retries() -> object_store::RetryConfig {
    object_store::RetryConfig {
        max_retries: 5,
        retry_timeout: RETRY_BUDGET,
        ..object_store::RetryConfig::default()
    }
}

/// The connect timeout as the clients' configuration value.
fn connect_timeout() -> String {
    format!("{}s", CONNECT_TIMEOUT.as_secs())
}

/// Which object store, and where in it: `s3://BUCKET/PREFIX`, `gs://BUCKET/PREFIX` or
/// `az://CONTAINER/PREFIX`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectStorageUrl {
    pub kind: ObjectKind,
    pub bucket: String,
    /// Without leading or trailing slashes; may be empty.
    pub prefix: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    S3,
    Gcs,
    Azure,
}

impl ObjectKind {
    fn name(self) -> &'static str {
        match self {
            Self::S3 => "s3",
            Self::Gcs => "gcs",
            Self::Azure => "azure",
        }
    }

    fn scheme(self) -> &'static str {
        match self {
            Self::S3 => "s3",
            Self::Gcs => "gs",
            Self::Azure => "az",
        }
    }
}

impl ObjectStorageUrl {
    /// Reads `s3://`, `gs://` and `az://` URLs; `None` for any other scheme. The error says
    /// what is wrong with a URL of one of these schemes.
    pub fn parse(raw: &str) -> Option<Result<Self, String>> {
        let (scheme, rest) = raw.split_once("://")?;
        let kind = match scheme {
            "s3" => ObjectKind::S3,
            "gs" => ObjectKind::Gcs,
            "az" => ObjectKind::Azure,
            _ => return None,
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let prefix = prefix.trim_matches('/');
        let ok_char = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
        // Azure container names are lowercase letters, digits and hyphens only.
        let azure_ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
        if bucket.is_empty()
            || !bucket.chars().all(ok_char)
            || (kind == ObjectKind::Azure && !bucket.chars().all(azure_ok))
        {
            return Some(Err(format!(
                "names no valid bucket (expected {scheme}://BUCKET/PREFIX)"
            )));
        }
        if rest.contains(['?', '#']) {
            return Some(Err(
                "must not carry a query or fragment; credentials and endpoints come from the environment"
                    .into(),
            ));
        }
        if prefix
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
            && !prefix.is_empty()
        {
            return Some(Err("has an empty, `.` or `..` segment in its prefix".into()));
        }
        Some(Ok(Self {
            kind,
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
        }))
    }
}

impl fmt::Display for ObjectStorageUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.kind.scheme(), self.bucket)?;
        if !self.prefix.is_empty() {
            write!(f, "/{}", self.prefix)?;
        }
        Ok(())
    }
}

type SharedSigner = Arc<dyn Signer>;

/// A [`BlobStore`] on S3, GCS or Azure Blob.
pub struct ObjectStorage {
    store: Arc<dyn ObjectStore>,
    signer: SharedSigner,
    url: ObjectStorageUrl,
    chunks: Path,
    marker: Path,
    /// Shares of [`UPLOAD_BUFFER_PARTS`], one per part-sized buffer being filled or sent.
    upload_budget: Arc<Semaphore>,
    /// For streaming uploads through presigned links.
    http: reqwest::Client,
}

// By hand: the clients' own `Debug` would print their credentials.
impl fmt::Debug for ObjectStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectStorage")
            .field("url", &self.url.to_string())
            .finish_non_exhaustive()
    }
}

/// A store's failure: [`BlobError::Unavailable`] when a retry later may succeed.
fn store_err(what: impl fmt::Display, e: object_store::Error) -> BlobError {
    let what = what.to_string();
    if bounded::is_unavailable(&e) {
        BlobError::Unavailable {
            what,
            source: io::Error::other(e),
        }
    } else {
        BlobError::Io {
            what,
            source: io::Error::other(e),
        }
    }
}

/// A presigned link's request failed: unavailable unless the request could not be built. The
/// link's query is a credential: never in an error.
fn link_err(what: String, e: reqwest::Error) -> BlobError {
    let builder = e.is_builder();
    let source = io::Error::other(e.without_url());
    if builder {
        BlobError::Io { what, source }
    } else {
        BlobError::Unavailable { what, source }
    }
}

impl ObjectStorage {
    /// Connects with credentials, region and endpoint from each cloud's standard environment
    /// variables (`AWS_*`, `GOOGLE_*`, `AZURE_*`), then writes and reads the layout marker, so
    /// that wrong credentials or an unreachable store fail here rather than on the first upload.
    pub async fn open(url: &ObjectStorageUrl) -> Result<Self, BlobError> {
        let (store, signer) = Self::client(url).map_err(|e| store_err(url, e))?;
        let root = Path::from(url.prefix.as_str());
        let this = Self {
            store,
            signer,
            chunks: root.child("chunks"),
            marker: root.child("VERSION"),
            url: url.clone(),
            upload_budget: Arc::new(Semaphore::new(UPLOAD_BUFFER_PARTS)),
            http: reqwest::Client::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .build()
                .map_err(|e| BlobError::Io {
                    what: url.to_string(),
                    source: io::Error::other(e),
                })?,
        };
        this.check_layout().await?;
        Ok(this)
    }

    fn client(
        url: &ObjectStorageUrl,
    ) -> Result<(Arc<dyn ObjectStore>, SharedSigner), object_store::Error> {
        let bucket_url = format!("{}://{}", url.kind.scheme(), url.bucket);
        Ok(match url.kind {
            ObjectKind::S3 => {
                use object_store::aws::AmazonS3ConfigKey as Key;
                let mut builder = object_store::aws::AmazonS3Builder::from_env()
                    .with_url(bucket_url)
                    .with_retry(retries())
                    .with_http_connector(Bounded)
                    .with_config(Key::Client(ClientConfigKey::Timeout), REQUEST_TIMEOUT)
                    .with_config(
                        Key::Client(ClientConfigKey::ConnectTimeout),
                        connect_timeout(),
                    );
                // An S3-compatible server on plain HTTP: the endpoint says so, no second switch.
                let endpoint = builder.get_config_value(&Key::Endpoint).unwrap_or_default();
                if endpoint.starts_with("http://") {
                    builder = builder.with_allow_http(true);
                }
                let s3 = Arc::new(builder.build()?);
                (s3.clone(), s3)
            }
            ObjectKind::Gcs => {
                use object_store::gcp::GoogleConfigKey as Key;
                let gcs = Arc::new(
                    object_store::gcp::GoogleCloudStorageBuilder::from_env()
                        .with_url(bucket_url)
                        .with_retry(retries())
                        .with_http_connector(Bounded)
                        .with_config(Key::Client(ClientConfigKey::Timeout), REQUEST_TIMEOUT)
                        .with_config(
                            Key::Client(ClientConfigKey::ConnectTimeout),
                            connect_timeout(),
                        )
                        .build()?,
                );
                (gcs.clone(), gcs)
            }
            ObjectKind::Azure => {
                use object_store::azure::AzureConfigKey as Key;
                let mut builder = object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_url(bucket_url)
                    .with_retry(retries())
                    .with_http_connector(Bounded)
                    .with_config(Key::Client(ClientConfigKey::Timeout), REQUEST_TIMEOUT)
                    .with_config(
                        Key::Client(ClientConfigKey::ConnectTimeout),
                        connect_timeout(),
                    );
                let emulator = builder
                    .get_config_value(&Key::UseEmulator)
                    .is_some_and(|v| v == "true");
                let endpoint = builder.get_config_value(&Key::Endpoint).unwrap_or_default();
                if emulator || endpoint.starts_with("http://") {
                    builder = builder.with_allow_http(true);
                }
                let azure = Arc::new(builder.build()?);
                (azure.clone(), azure)
            }
        })
    }

    /// Refuses a layout this version cannot read, then writes the layout marker (again, with
    /// the same bytes, after the first start): every start proves the credentials can write.
    async fn check_layout(&self) -> Result<(), BlobError> {
        let what = || format!("{}/VERSION", self.url);
        match self.store.get(&self.marker).await {
            Ok(found) => {
                let text = found.bytes().await.map_err(|e| store_err(what(), e))?;
                if text.trim_ascii() != LAYOUT_VERSION.as_bytes() {
                    return Err(BlobError::Io {
                        what: what(),
                        source: io::Error::other(format!(
                            "data layout version {} is not supported (expected {LAYOUT_VERSION})",
                            String::from_utf8_lossy(text.trim_ascii())
                        )),
                    });
                }
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(store_err(what(), e)),
        }
        let marker = PutPayload::from(format!("{LAYOUT_VERSION}\n"));
        self.store
            .put(&self.marker, marker)
            .await
            .map_err(|e| store_err(what(), e))?;
        Ok(())
    }

    /// A link to `name` for `method`, valid for `ttl`, signed with the store's credentials.
    async fn presigned_link(
        &self,
        name: &BlobName,
        method: reqwest::Method,
        ttl: Duration,
    ) -> Result<Url, BlobError> {
        self.signer
            .signed_url(method, &self.path_of(name), ttl)
            .await
            .map_err(|e| store_err(format!("signing a link to chunk {name}"), e))
    }

    fn path_of(&self, name: &BlobName) -> Path {
        self.chunks.child(name.as_str())
    }

    fn not_found_or(name: &BlobName, e: object_store::Error) -> BlobError {
        match e {
            object_store::Error::NotFound { .. } => BlobError::NotFound(name.clone()),
            e => store_err(format!("chunk {name}"), e),
        }
    }
}

/// The parts of a chunk being sent, each a task holding its share of the buffer budget until
/// the store has it. Dropping this (a put cut short) stops them.
struct Parts {
    upload: Box<dyn MultipartUpload>,
    sending: JoinSet<object_store::Result<()>>,
}

impl Parts {
    /// Starts sending `frames` as the next part.
    fn send(&mut self, frames: Vec<Bytes>, permit: OwnedSemaphorePermit) {
        let part = self.upload.put_part(frames.into_iter().collect());
        self.sending.spawn(async move {
            let sent = part.await;
            drop(permit);
            sent
        });
    }

    /// Waits until fewer than `at_most` parts are being sent.
    async fn wait_below(&mut self, at_most: usize) -> object_store::Result<()> {
        while self.sending.len() >= at_most.max(1) {
            match self.sending.join_next().await {
                Some(Ok(sent)) => sent?,
                Some(Err(e)) => {
                    return Err(object_store::Error::Generic {
                        store: "hoard",
                        source: Box::new(e),
                    })
                }
                None => break,
            }
        }
        Ok(())
    }

    /// Gives up the upload; the store drops the parts it had.
    async fn abort(mut self) {
        self.sending.shutdown().await;
        // Best effort: an upload left behind is invisible and expires by lifecycle rule.
        let _ = self.upload.abort().await;
    }
}

impl ObjectStorage {
    /// Streams a body of known length to the store in one PUT through a presigned link: no
    /// buffer, one request, the frames passed on as they arrive and hashed on the way. Only
    /// the client's retry can repeat it, since the body cannot be replayed. A store that takes
    /// no bytes for [`SILENCE`], or sends no answer within [`SILENCE`] of the last, fails it as
    /// unavailable; a client that is slow to send is not the store's silence.
    async fn put_through_link(
        &self,
        name: &BlobName,
        link: Url,
        mut body: ByteStream,
        declared: u64,
    ) -> Result<Chunk, BlobError> {
        // The request reads from a channel this function feeds: it reads the client's body to
        // its end even after the declared bytes went out (the request stops there), so that a
        // longer body is seen; one shorter than declared fails the request rather than end it.
        // The client's body arrives in pieces as small as 4 KiB: the request takes them in
        // bursts, so that the connection writes each burst at once (see `bursts`).
        let (tx, mut rx) = tokio::sync::mpsc::channel::<io::Result<Bytes>>(2);
        let outgoing = in_bursts(Box::pin(futures_util::stream::poll_fn(move |cx| {
            rx.poll_recv(cx)
        })));
        let mut request = self
            .http
            .put(link)
            .header(reqwest::header::CONTENT_LENGTH, declared)
            .body(reqwest::Body::wrap_stream(outgoing));
        if self.url.kind == ObjectKind::Azure {
            request = request.header("x-ms-blob-type", "BlockBlob");
        }
        // Tells the answer's wait whether to go on once the body is over: not when the store
        // stopped taking it.
        let (fed_tx, fed_rx) = tokio::sync::oneshot::channel::<bool>();
        let what = || format!("chunk {name}");
        let silent = |how: String| BlobError::Unavailable {
            what: what(),
            source: io::Error::new(io::ErrorKind::TimedOut, how),
        };
        let feed = async move {
            // Both digests while the bytes pass: reading a chunk back later, as the digest
            // pass does on local disk, would cost a second transfer from the store.
            let mut digests = Digests::with_sha256();
            let mut received: u64 = 0;
            while let Some(frame) = body.next().await {
                let frame = match frame {
                    Ok(frame) => frame,
                    Err(e) => {
                        let _ = tx
                            .send(Err(io::Error::other("the client's body failed")))
                            .await;
                        return Err(BlobError::Body(e));
                    }
                };
                received += frame.len() as u64;
                if received > declared {
                    break;
                }
                digests.update(&frame);
                match tokio::time::timeout(SILENCE, tx.send(Ok(frame))).await {
                    Ok(Ok(())) => {}
                    // The request is over early (the store refused it): its answer says why.
                    Ok(Err(_)) => return Ok(None),
                    Err(_) => {
                        return Err(silent(format!(
                            "the store took no bytes of the body for {SILENCE:?}"
                        )))
                    }
                }
            }
            if received != declared {
                // Fails the request, so the store keeps nothing of it.
                let _ = tx.send(Err(io::Error::other("body length mismatch"))).await;
                return Err(BlobError::LengthMismatch {
                    declared,
                    actual: received,
                });
            }
            Ok(Some(digests.finish()))
        };
        let feed = async move {
            let fed = feed.await;
            let stalled = matches!(fed, Err(BlobError::Unavailable { .. }));
            let _ = fed_tx.send(!stalled);
            fed
        };
        let answer = async {
            let send = request.send();
            tokio::pin!(send);
            tokio::select! {
                sent = &mut send => Some(sent),
                fed = fed_rx => match fed {
                    Ok(true) => tokio::time::timeout(SILENCE, send).await.ok(),
                    _ => None,
                },
            }
        };
        let (sent, fed) = tokio::join!(answer, feed);
        let stored = match sent {
            None => Err(silent(format!(
                "the store sent no answer within {SILENCE:?} of the body's end"
            ))),
            Some(Err(e)) => Err(link_err(what(), e)),
            Some(Ok(answer)) if !answer.status().is_success() => {
                let status = answer.status();
                let text = tokio::time::timeout(SILENCE, answer.text()).await;
                let text: String = match text {
                    Ok(Ok(text)) => text.chars().take(300).collect(),
                    _ => String::new(),
                };
                let source = io::Error::other(format!("the store answered {status}: {text}"));
                if bounded::is_failing(status) {
                    Err(BlobError::Unavailable {
                        what: what(),
                        source,
                    })
                } else {
                    Err(BlobError::Io {
                        what: what(),
                        source,
                    })
                }
            }
            Some(Ok(_)) => Ok(()),
        };
        match (fed, stored) {
            (Ok(Some((sha256, xxh3))), Ok(())) => Ok(Chunk {
                blob: name.clone(),
                size: declared,
                sha256,
                xxh3: Some(xxh3),
            }),
            (Ok(None), Ok(())) => Err(BlobError::Io {
                what: what(),
                source: io::Error::other("the store answered before the whole body was sent"),
            }),
            (Ok(_), Err(e)) => Err(e),
            (Err(e), stored) => {
                // The store may have taken the declared bytes before the excess was seen.
                if stored.is_ok() {
                    let _ = self.store.delete(&self.path_of(name)).await;
                }
                Err(e)
            }
        }
    }

    /// Receives, hashes and stores `body`; see [`BlobStore::put`]. Bytes are held in part-sized
    /// buffers, each taken from the store-wide budget before it fills, so a put waits rather
    /// than hold more memory than [`UPLOAD_BUFFER_PARTS`] parts in all. A put never needs a
    /// second share while it waits for one, so puts cannot deadlock on the budget.
    async fn put_buffered(
        &self,
        name: &BlobName,
        mut body: ByteStream,
        declared_len: Option<u64>,
    ) -> Result<Chunk, BlobError> {
        let path = self.path_of(name);
        let fail = |e| store_err(format!("chunk {name}"), e);
        let mut digests = Digests::with_sha256();
        let mut received: u64 = 0;
        let mut buffer: Vec<Bytes> = Vec::new();
        let mut buffered = 0usize;
        // Small chunks are held whole outside the budget, as the disk store holds them.
        let budgeted = declared_len.is_none_or(|len| len > SMALL);
        let mut share: Option<OwnedSemaphorePermit> = None;
        let mut parts: Option<Parts> = None;
        let outcome: Result<(), BlobError> = async {
            while let Some(frame) = body.next().await {
                let frame = frame.map_err(BlobError::Body)?;
                received += frame.len() as u64;
                if let Some(declared) = declared_len.filter(|&d| received > d) {
                    return Err(BlobError::LengthMismatch {
                        declared,
                        actual: received,
                    });
                }
                digests.update(&frame);
                if frame.is_empty() {
                    continue;
                }
                // A full buffer becomes a part once more bytes follow it, so a chunk of
                // exactly PART_SIZE is still one PUT.
                if buffered >= PART_SIZE {
                    if parts.is_none() {
                        let upload = self.store.put_multipart(&path).await.map_err(fail)?;
                        parts = Some(Parts {
                            upload,
                            sending: JoinSet::new(),
                        });
                    }
                    let sending = parts.as_mut().expect("started above");
                    sending.wait_below(PARTS_IN_FLIGHT).await.map_err(fail)?;
                    let permit = share.take().expect("large bodies are budgeted");
                    sending.send(std::mem::take(&mut buffer), permit);
                    buffered = 0;
                }
                if budgeted && share.is_none() {
                    let budget = self.upload_budget.clone();
                    share = Some(
                        budget
                            .acquire_owned()
                            .await
                            .map_err(io::Error::other)
                            .map_err(BlobError::Body)?,
                    );
                }
                buffered += frame.len();
                buffer.push(frame);
            }
            if let Some(declared) = declared_len.filter(|&d| received != d) {
                return Err(BlobError::LengthMismatch {
                    declared,
                    actual: received,
                });
            }
            Ok(())
        }
        .await;
        if let Err(e) = outcome {
            if let Some(parts) = parts {
                parts.abort().await;
            }
            return Err(e);
        }
        match parts {
            None => {
                let payload: PutPayload = buffer.into_iter().collect();
                self.store.put(&path, payload).await.map_err(fail)?;
            }
            Some(mut sending) => {
                if !buffer.is_empty() {
                    let permit = share.take().expect("large bodies are budgeted");
                    sending.send(buffer, permit);
                }
                let sent = match sending.wait_below(1).await {
                    Ok(()) => sending.upload.complete().await.map(|_| ()),
                    Err(e) => Err(e),
                };
                if let Err(e) = sent {
                    sending.abort().await;
                    return Err(fail(e));
                }
            }
        }
        let (sha256, xxh3) = digests.finish();
        Ok(Chunk {
            blob: name.clone(),
            size: received,
            sha256,
            xxh3: Some(xxh3),
        })
    }
}

#[async_trait]
impl BlobStore for ObjectStorage {
    async fn put(
        &self,
        name: &BlobName,
        body: ByteStream,
        declared_len: Option<u64>,
    ) -> Result<Chunk, BlobError> {
        // A body of known length streams straight through in one PUT; one of unknown length
        // (v1's chunked PATCH), or too small to be worth a link, is buffered into parts.
        if let Some(declared) = declared_len.filter(|&len| len > SMALL) {
            match self
                .presigned_link(name, reqwest::Method::PUT, LINK_TTL)
                .await
            {
                Ok(link) => return self.put_through_link(name, link, body, declared).await,
                Err(e) => tracing::debug!(error = %e, "no presigned upload link; buffering"),
            }
        }
        self.put_buffered(name, body, declared_len).await
    }

    async fn get(&self, name: &BlobName, offset: u64, len: u64) -> Result<ByteStream, BlobError> {
        let path = self.path_of(name);
        if len == 0 {
            // A zero-length range is not a range the stores accept; the chunk must still exist.
            self.store
                .head(&path)
                .await
                .map_err(|e| Self::not_found_or(name, e))?;
            return Ok(Box::pin(futures_util::stream::empty()));
        }
        // One GET for the whole range: a response under way keeps streaming if the chunk is
        // deleted meanwhile, and the connection's flow control bounds what is buffered.
        let options = GetOptions {
            range: Some(GetRange::Bounded(offset..offset + len)),
            ..GetOptions::default()
        };
        let found = self
            .store
            .get_opts(&path, options)
            .await
            .map_err(|e| Self::not_found_or(name, e))?;
        if found.range != (offset..offset + len) {
            return Err(BlobError::Io {
                what: format!("chunk {name}"),
                source: io::Error::other(format!(
                    "asked for bytes {offset}..{} and the store answered {:?}",
                    offset + len,
                    found.range
                )),
            });
        }
        // In bursts: the store's response comes in pieces as small as the store writes them.
        Ok(in_bursts(Box::pin(
            found.into_stream().map_err(io::Error::other),
        )))
    }

    async fn delete(&self, name: &BlobName) -> Result<(), BlobError> {
        match self.store.delete(&self.path_of(name)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_err(format!("chunk {name}"), e)),
        }
    }

    async fn list(&self) -> Result<NameStream, BlobError> {
        let url = self.url.to_string();
        let listed = self.store.list(Some(&self.chunks)).filter_map(move |item| {
            let url = url.clone();
            async move {
                match item {
                    // Anything else under the prefix is not ours to collect.
                    Ok(meta) => BlobName::parse(meta.location.filename()?).map(|name| {
                        Ok(Listed {
                            name,
                            modified: meta.last_modified.timestamp_millis() as Millis,
                        })
                    }),
                    Err(e) => Some(Err(store_err(format!("listing {url}"), e))),
                }
            }
        });
        Ok(Box::pin(listed))
    }

    async fn capacity(&self) -> Result<Option<Capacity>, BlobError> {
        Ok(None)
    }

    /// Reads the layout marker: a cheap request that needs the credentials to work. A marker
    /// that is gone while the store answers (the bucket or the prefix was emptied, or made
    /// anew) is written again, as at start-up, so readiness follows the store; a marker of
    /// another layout stays a refusal. The error's kind says which ([`BlobError::readiness`]).
    async fn ping(&self) -> Result<(), BlobError> {
        let what = || format!("{}/VERSION", self.url);
        let timed_out = || BlobError::Unavailable {
            what: what(),
            source: io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {PING_TIMEOUT:?}"),
            ),
        };
        // Without retries' patience: a readiness probe wants an answer now.
        let deadline = tokio::time::Instant::now() + PING_TIMEOUT;
        let read = async {
            let found = self.store.get(&self.marker).await?;
            found.bytes().await
        };
        match tokio::time::timeout_at(deadline, read).await {
            Err(_) => Err(timed_out()),
            Ok(Ok(text)) if text.trim_ascii() == LAYOUT_VERSION.as_bytes() => Ok(()),
            Ok(Ok(text)) => Err(BlobError::Io {
                what: what(),
                source: io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "data layout version {} is not supported (expected {LAYOUT_VERSION})",
                        String::from_utf8_lossy(text.trim_ascii())
                    ),
                ),
            }),
            Ok(Err(object_store::Error::NotFound { .. })) => {
                let marker = PutPayload::from(format!("{LAYOUT_VERSION}\n"));
                match tokio::time::timeout_at(deadline, self.store.put(&self.marker, marker)).await
                {
                    Err(_) => Err(timed_out()),
                    Ok(Ok(_)) => {
                        tracing::warn!(url = %self.url, "the layout marker was gone (the bucket or prefix emptied?): written again");
                        Ok(())
                    }
                    // The store answered the read a moment ago: it refuses this write.
                    Ok(Err(e)) => Err(BlobError::Io {
                        what: what(),
                        source: io::Error::new(io::ErrorKind::PermissionDenied, e),
                    }),
                }
            }
            Ok(Err(e)) => Err(store_err(what(), e)),
        }
    }

    async fn sync(&self, _force: bool) -> Result<(), BlobError> {
        Ok(())
    }

    /// A put is durable once the store has answered it.
    fn note_committed(&self) {}

    fn lost_since(&self) -> Option<Millis> {
        None
    }

    async fn presigned_get(
        &self,
        name: &BlobName,
        ttl: Duration,
    ) -> Result<Option<Url>, BlobError> {
        Ok(Some(
            self.presigned_link(name, reqwest::Method::GET, ttl).await?,
        ))
    }

    fn kind(&self) -> &'static str {
        self.url.kind.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_store_a_bucket_and_a_prefix() {
        let url = ObjectStorageUrl::parse("s3://my-bucket/ci/cache/")
            .unwrap()
            .unwrap();
        assert_eq!(url.kind, ObjectKind::S3);
        assert_eq!(url.bucket, "my-bucket");
        assert_eq!(url.prefix, "ci/cache");
        assert_eq!(url.to_string(), "s3://my-bucket/ci/cache");
        let url = ObjectStorageUrl::parse("gs://b").unwrap().unwrap();
        assert_eq!((url.kind, url.prefix.as_str()), (ObjectKind::Gcs, ""));
        assert_eq!(url.to_string(), "gs://b");
        let url = ObjectStorageUrl::parse("az://container/p")
            .unwrap()
            .unwrap();
        assert_eq!(url.kind, ObjectKind::Azure);
        assert!(ObjectStorageUrl::parse("file:///srv").is_none());
        assert!(ObjectStorageUrl::parse("/srv").is_none());
        for bad in [
            "s3://",
            "s3:///prefix",
            "s3://bucket?region=x",
            "s3://user:secret@bucket/p",
            "s3://bucket/a//b",
            "gs://bucket/../other",
            "az://My.Container",
        ] {
            assert!(
                ObjectStorageUrl::parse(bad).unwrap().is_err(),
                "{bad} should be refused"
            );
        }
    }
}
