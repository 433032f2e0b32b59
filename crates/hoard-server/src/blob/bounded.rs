//! How long an object store may stay silent before a request to it fails, and which failures
//! mean "the store is unavailable" (a retry later may succeed) rather than "the store refused".
//!
//! `object_store`'s clients only bound a request's total time, which must allow a download that
//! a slow runner takes minutes to read; a store that accepts the connection and then says
//! nothing (paused, overloaded, a half-open connection) would hold the request that long. So
//! every request of theirs goes through [`Bounded`], which fails it with a timeout when:
//! - the answer's headers take longer than [`SILENCE`] (plus a second per [`MIN_SEND_RATE`]
//!   bytes of the request's own body, which the store must receive first);
//! - the answer's body sends nothing for [`SILENCE`] while it is being read (a reader that
//!   stops reading is not counted: the wait starts when the next bytes are asked for).
//!
//! It also turns a 5xx, 429 or 408 answer into an error of its own, retried like those answers
//! (`object_store` retries them alike), so that what is left after the retries can be told
//! apart from a refusal: `object_store` keeps a status in a private type.

use std::error::Error;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService, ReqwestConnector,
};
use object_store::ClientOptions;

/// How long a connection to the store may take to open: a store that refuses or cannot be
/// reached fails within the retries' few seconds, not a TCP timeout's minutes.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the store may stay silent: before its answer to a request once the request is
/// sent, or between two reads of an answer's body.
pub(super) const SILENCE: Duration = Duration::from_secs(10);
/// The slowest upload to the store that is not taken for silence: the wait for an answer
/// grows by a second for every this many bytes the request carries (an 8 MiB part: 32 s more).
const MIN_SEND_RATE: u64 = 256 << 10;

/// Why the store is taken for unavailable, as this transport saw it.
#[derive(Debug, thiserror::Error)]
pub(super) enum Unavailable {
    #[error("the store sent no answer within {0:?}")]
    NoAnswer(Duration),
    #[error("the store sent nothing for {0:?} in the middle of an answer")]
    Stalled(Duration),
    #[error("the store answered {status}: {text}")]
    Failing {
        status: reqwest::StatusCode,
        text: String,
    },
}

/// Whether `e` (an `object_store` error, or a `reqwest` one from a presigned link) means the
/// store is unavailable: it refused or dropped the connection, stayed silent, or answered 5xx.
pub(super) fn is_unavailable(e: &(dyn Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.is::<Unavailable>() {
            return true;
        }
        if let Some(e) = e.downcast_ref::<HttpError>() {
            if matches!(
                e.kind(),
                HttpErrorKind::Connect
                    | HttpErrorKind::Request
                    | HttpErrorKind::Timeout
                    | HttpErrorKind::Interrupted
            ) {
                return true;
            }
        }
        if let Some(e) = e.downcast_ref::<reqwest::Error>() {
            if e.is_connect() || e.is_timeout() {
                return true;
            }
        }
        if let Some(e) = e.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            if matches!(
                e.kind(),
                K::ConnectionRefused
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::NotConnected
                    | K::BrokenPipe
                    | K::TimedOut
                    | K::UnexpectedEof
            ) {
                return true;
            }
        }
        next = e.source();
    }
    false
}

/// Whether an answer's status says the store is (for now) unable to serve, not that it refuses.
pub(super) fn is_failing(status: reqwest::StatusCode) -> bool {
    status.is_server_error()
        || status == reqwest::StatusCode::TOO_MANY_REQUESTS
        || status == reqwest::StatusCode::REQUEST_TIMEOUT
}

/// The `object_store` transport with the bounds above (`with_http_connector`).
#[derive(Debug, Default)]
pub(super) struct Bounded;

impl HttpConnector for Bounded {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Patient { inner }))
    }
}

#[derive(Debug)]
struct Patient {
    inner: HttpClient,
}

#[async_trait]
impl HttpService for Patient {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let sending = request.body().content_length() as u64;
        let patience = SILENCE + Duration::from_secs(sending / MIN_SEND_RATE);
        let response = tokio::time::timeout(patience, self.inner.execute(request))
            .await
            .map_err(|_| {
                HttpError::new(HttpErrorKind::Timeout, Unavailable::NoAnswer(patience))
            })??;
        let status = response.status();
        if is_failing(status) {
            // The store's own words (an S3 error code such as SlowDown) go into the log.
            let body = tokio::time::timeout(SILENCE, response.into_body().bytes()).await;
            let text = match body {
                Ok(Ok(bytes)) => String::from_utf8_lossy(&bytes).chars().take(300).collect(),
                _ => String::new(),
            };
            // `Request` is retried as the status would have been.
            return Err(HttpError::new(
                HttpErrorKind::Request,
                Unavailable::Failing { status, text },
            ));
        }
        Ok(response.map(|body| {
            HttpResponseBody::new(Watched {
                body,
                silence: None,
            })
        }))
    }
}

/// An answer's body that fails when the store sends nothing for [`SILENCE`] while it is read.
struct Watched {
    body: HttpResponseBody,
    /// Armed when a read finds nothing to take, disarmed by the next frame.
    silence: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Body for Watched {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            this.silence = None;
            return Poll::Ready(frame);
        }
        let silence = this
            .silence
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(SILENCE)));
        match silence.as_mut().poll(cx) {
            Poll::Ready(()) => {
                this.silence = None;
                Poll::Ready(Some(Err(HttpError::new(
                    HttpErrorKind::Timeout,
                    Unavailable::Stalled(SILENCE),
                ))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
