//! A store that times every operation of the store it wraps, for
//! `hoard_database_operation_duration_seconds{operation}` (the operation is the method's name).
//!
//! The store traits are declared through [`store_trait!`], which also writes their timed
//! implementation for [`Timed`]: a method is written once, in its trait, and the wrapper follows.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;

use super::{Health, MetaError, MetaStore};
use crate::metrics::Metrics;

/// Declares a store trait (every method `async`, returning a value) and implements it for
/// [`Timed`] by timing the wrapped store's method under the method's name.
macro_rules! store_trait {
    (
        $(#[$attr:meta])*
        pub trait $name:ident {
            $(
                $(#[$doc:meta])*
                async fn $method:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;
            )*
        }
    ) => {
        $(#[$attr])*
        #[async_trait::async_trait]
        pub trait $name: Send + Sync + std::fmt::Debug + 'static {
            $( $(#[$doc])* async fn $method(&self $(, $arg: $ty)*) -> $ret; )*
        }

        #[async_trait::async_trait]
        impl $name for $crate::meta::Timed {
            $(
                async fn $method(&self $(, $arg: $ty)*) -> $ret {
                    self.time(stringify!($method), self.inner.$method($($arg),*)).await
                }
            )*
        }
    };
}

#[derive(Debug)]
pub struct Timed {
    pub(super) inner: Arc<dyn MetaStore>,
    metrics: Arc<Metrics>,
}

impl Timed {
    pub fn new(inner: Arc<dyn MetaStore>, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }

    pub(super) async fn time<T>(
        &self,
        operation: &'static str,
        work: impl Future<Output = T>,
    ) -> T {
        let started = Instant::now();
        let out = work.await;
        self.metrics.database(operation, started.elapsed());
        out
    }
}

/// By hand: `wants_checkpoint` is a signal awaited for minutes, not an operation to time.
#[async_trait]
impl Health for Timed {
    async fn ping(&self) -> Result<(), MetaError> {
        self.time("ping", self.inner.ping()).await
    }

    async fn checkpoint(&self) -> Result<(), MetaError> {
        self.time("checkpoint", self.inner.checkpoint()).await
    }

    async fn wants_checkpoint(&self) {
        self.inner.wants_checkpoint().await
    }
}
