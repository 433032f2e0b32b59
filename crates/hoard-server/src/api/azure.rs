//! The shape of the Azure Blob subset's answers (PROTOCOL.md §3.5): errors as XML with
//! `x-ms-error-code`, and the `x-ms-*` headers every answer carries. [`AzureError`] is the one
//! mapping of domain outcomes to this protocol's errors.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::auth::signing::SignatureError;
use crate::cache::CacheError;

/// The x-ms-version we answer with; clients ignore the value.
pub(super) const API_VERSION: &str = "2025-01-05";

/// An Azure Storage error: XML body plus `x-ms-error-code`.
#[derive(Debug)]
pub struct AzureError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// Seconds for a `Retry-After` header (the SDK's retry policy honours it on 503).
    retry_after: Option<u64>,
}

impl AzureError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn not_found() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "BlobNotFound",
            "The specified blob does not exist.",
        )
    }
}

impl IntoResponse for AzureError {
    fn into_response(self) -> Response {
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>{}</Code><Message>{}</Message></Error>",
            self.code,
            quick_xml::escape::escape(self.message.as_str())
        );
        let mut response = (self.status, body).into_response();
        let h = response.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/xml"),
        );
        h.insert("x-ms-error-code", HeaderValue::from_static(self.code));
        h.insert("x-ms-version", HeaderValue::from_static(API_VERSION));
        h.insert("x-ms-request-id", request_id());
        if let Some(seconds) = self.retry_after {
            h.insert(header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

impl From<SignatureError> for AzureError {
    fn from(e: SignatureError) -> Self {
        Self::new(StatusCode::FORBIDDEN, "AuthenticationFailed", e.to_string())
    }
}

impl From<CacheError> for AzureError {
    fn from(e: CacheError) -> Self {
        match e {
            CacheError::UploadNotFound | CacheError::EntryNotFound => Self::not_found(),
            CacheError::UploadClosed => {
                Self::new(StatusCode::FORBIDDEN, "AuthorizationFailure", e.to_string())
            }
            CacheError::TooManyBlocks => Self::new(
                StatusCode::CONFLICT,
                "BlockCountExceedsLimit",
                e.to_string(),
            ),
            CacheError::UnknownBlock => {
                Self::new(StatusCode::BAD_REQUEST, "InvalidBlockList", e.to_string())
            }
            CacheError::TooLarge(_) => Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "RequestBodyTooLarge",
                e.to_string(),
            ),
            CacheError::Invalid(e) => Self::new(
                StatusCode::BAD_REQUEST,
                "InvalidQueryParameterValue",
                e.to_string(),
            ),
            // A link to a row that does not exist is refused like a forged one: it cannot have
            // been signed for that row.
            CacheError::NoSuchLink => SignatureError::Forged.into(),
            CacheError::BodyLengthMismatch { .. } => {
                Self::new(StatusCode::BAD_REQUEST, "InvalidInput", e.to_string())
            }
            CacheError::BodyFailed(_) => Self::new(
                StatusCode::BAD_REQUEST,
                "IncompleteBody",
                "The request body ended early or failed.",
            ),
            // Damage found before the headers went (PROTOCOL.md §4.2): a 5xx, since
            // `@actions/cache`'s plain GET saves any answer below 500 as the archive (tar
            // then fails on the XML); 500, since it is the 5xx that fits and the one it does
            // not retry (502/503/504 it retries, to meet the quarantine's 404). The restore
            // fails with a warning naming the status; the job goes on. The Azure SDKs retry a
            // 500 and then meet the quarantine. How it was damaged is in the log, not here.
            CacheError::Damaged(_) => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "BlobDamaged",
                "The blob's stored bytes are damaged: they do not match the checksum recorded when they were written. The entry is quarantined; save it again.",
            ),
            // Not retried by the Azure SDK: the upload was abandoned and its chunks freed.
            CacheError::StorageFull => Self::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "InsufficientStorage",
                "The cache storage is full; this upload was abandoned and its blocks deleted.",
            ),
            ref e if e.is_transient() => {
                tracing::warn!(error = %e, "blob request could not be served now");
                Self {
                    retry_after: Some(1),
                    ..Self::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "ServerBusy",
                        "The server is busy; retry.",
                    )
                }
            }
            CacheError::Storage(_) | CacheError::Meta(_) => {
                tracing::error!(error = %e, "blob request failed");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalError",
                    "The server encountered an internal error.",
                )
            }
            other => Self::new(StatusCode::BAD_REQUEST, "InvalidInput", other.to_string()),
        }
    }
}

pub(super) fn request_id() -> HeaderValue {
    HeaderValue::from_str(&crate::model::random_uuid())
        .unwrap_or_else(|_| HeaderValue::from_static("00000000-0000-0000-0000-000000000000"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unavailable_store_is_server_busy_with_retry_after() {
        let response =
            AzureError::from(CacheError::storage_unavailable("connection refused")).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let h = response.headers();
        assert_eq!(h["x-ms-error-code"], "ServerBusy");
        assert_eq!(h[header::RETRY_AFTER], "1");
        let body = axum::body::to_bytes(response.into_body(), 4096)
            .await
            .unwrap();
        assert!(!String::from_utf8_lossy(&body).contains("refused"));
    }

    #[tokio::test]
    async fn a_message_with_markup_stays_well_formed_xml() {
        let hostile = "<a href='x'>&\"</a>";
        let response =
            AzureError::new(StatusCode::BAD_REQUEST, "InvalidInput", hostile).into_response();
        let body = axum::body::to_bytes(response.into_body(), 4096)
            .await
            .unwrap();
        let xml = std::str::from_utf8(&body).unwrap();
        let mut reader = quick_xml::Reader::from_str(xml);
        while reader.read_event().unwrap() != quick_xml::events::Event::Eof {}
        let message = xml
            .split_once("<Message>")
            .and_then(|(_, rest)| rest.split_once("</Message>"))
            .map(|(message, _)| message)
            .unwrap();
        assert!(!message.contains(['<', '>', '\'', '"']), "{message}");
        assert_eq!(quick_xml::escape::unescape(message).unwrap(), hostile);
    }
}
