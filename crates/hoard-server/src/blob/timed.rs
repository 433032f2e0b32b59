//! A [`BlobStore`] that times every operation of the store it wraps, for
//! `hoard_storage_operation_duration_seconds{operation}`. A put is timed from its first byte to
//! the chunk being stored, so it includes receiving the body.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{BlobError, BlobStore, ByteStream, Capacity, NameStream};
use crate::metrics::Metrics;
use crate::model::{BlobName, Chunk, Millis};

#[derive(Debug)]
pub struct Timed {
    inner: Arc<dyn BlobStore>,
    metrics: Arc<Metrics>,
}

impl Timed {
    pub fn new(inner: Arc<dyn BlobStore>, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }

    async fn time<T>(&self, operation: &'static str, work: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let out = work.await;
        self.metrics.storage(operation, started.elapsed());
        out
    }
}

#[async_trait]
impl BlobStore for Timed {
    async fn put(
        &self,
        name: &BlobName,
        body: ByteStream,
        declared_len: Option<u64>,
    ) -> Result<Chunk, BlobError> {
        self.time("put", self.inner.put(name, body, declared_len))
            .await
    }

    async fn get(&self, name: &BlobName, offset: u64, len: u64) -> Result<ByteStream, BlobError> {
        self.time("get", self.inner.get(name, offset, len)).await
    }

    async fn delete(&self, name: &BlobName) -> Result<(), BlobError> {
        self.time("delete", self.inner.delete(name)).await
    }

    async fn list(&self) -> Result<NameStream, BlobError> {
        self.time("list", self.inner.list()).await
    }

    async fn capacity(&self) -> Result<Option<Capacity>, BlobError> {
        self.time("capacity", self.inner.capacity()).await
    }

    async fn ping(&self) -> Result<(), BlobError> {
        self.time("ping", self.inner.ping()).await
    }

    async fn sync(&self, force: bool) -> Result<(), BlobError> {
        self.time("sync", self.inner.sync(force)).await
    }

    fn note_committed(&self) {
        self.inner.note_committed();
    }

    fn lost_since(&self) -> Option<Millis> {
        self.inner.lost_since()
    }

    async fn presigned_get(
        &self,
        name: &BlobName,
        ttl: Duration,
    ) -> Result<Option<url::Url>, BlobError> {
        self.time("presign", self.inner.presigned_get(name, ttl))
            .await
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn local_path(&self, name: &BlobName) -> Option<std::path::PathBuf> {
        self.inner.local_path(name)
    }
}
