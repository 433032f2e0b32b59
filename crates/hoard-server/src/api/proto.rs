//! Messages of `github.actions.results.api.v1.CacheService` (PROTOCOL.md §2.3), readable from
//! protobuf-JSON and binary protobuf alike.
//!
//! JSON is read leniently (§2.2): proto names and lowerCamel names, int64 as string or number,
//! unknown fields ignored, missing fields defaulted. Responses use proto names, int64 as strings,
//! and leave out empty strings, as the real service does.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
pub struct CacheScope {
    #[prost(string, tag = "1")]
    #[serde(default)]
    pub scope: String,
    #[prost(int64, tag = "2")]
    #[serde(default, deserialize_with = "int64")]
    pub permission: i64,
}

/// Sent by other clients only; scope and repository come from the token, so this is ignored.
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
pub struct CacheMetadata {
    #[prost(int64, tag = "1")]
    #[serde(default, alias = "repositoryId", deserialize_with = "int64")]
    pub repository_id: i64,
    #[prost(message, repeated, tag = "2")]
    #[serde(default)]
    pub scope: Vec<CacheScope>,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
pub struct CreateCacheEntryRequest {
    #[prost(message, optional, tag = "1")]
    #[serde(default)]
    pub metadata: Option<CacheMetadata>,
    #[prost(string, tag = "2")]
    #[serde(default, deserialize_with = "string")]
    pub key: String,
    #[prost(string, tag = "3")]
    #[serde(default, deserialize_with = "string")]
    pub version: String,
}

#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub struct CreateCacheEntryResponse {
    #[prost(bool, tag = "1")]
    pub ok: bool,
    #[prost(string, tag = "2")]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub signed_upload_url: String,
    #[prost(string, tag = "3")]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
pub struct FinalizeCacheEntryUploadRequest {
    #[prost(message, optional, tag = "1")]
    #[serde(default)]
    pub metadata: Option<CacheMetadata>,
    #[prost(string, tag = "2")]
    #[serde(default, deserialize_with = "string")]
    pub key: String,
    #[prost(int64, tag = "3")]
    #[serde(default, alias = "sizeBytes", deserialize_with = "int64")]
    pub size_bytes: i64,
    #[prost(string, tag = "4")]
    #[serde(default, deserialize_with = "string")]
    pub version: String,
}

#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub struct FinalizeCacheEntryUploadResponse {
    #[prost(bool, tag = "1")]
    pub ok: bool,
    #[prost(int64, tag = "2")]
    #[serde(skip_serializing_if = "is_zero", serialize_with = "int64_as_string")]
    pub entry_id: i64,
    #[prost(string, tag = "3")]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
pub struct GetCacheEntryDownloadUrlRequest {
    #[prost(message, optional, tag = "1")]
    #[serde(default)]
    pub metadata: Option<CacheMetadata>,
    #[prost(string, tag = "2")]
    #[serde(default, deserialize_with = "string")]
    pub key: String,
    #[prost(string, repeated, tag = "3")]
    #[serde(default, alias = "restoreKeys", deserialize_with = "strings")]
    pub restore_keys: Vec<String>,
    #[prost(string, tag = "4")]
    #[serde(default, deserialize_with = "string")]
    pub version: String,
}

#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub struct GetCacheEntryDownloadUrlResponse {
    #[prost(bool, tag = "1")]
    pub ok: bool,
    #[prost(string, tag = "2")]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub signed_download_url: String,
    #[prost(string, tag = "3")]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub matched_key: String,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

fn int64_as_string<S: Serializer>(v: &i64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// int64 as protobuf-JSON allows it: a number or a decimal string; `null` is the default.
fn int64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int64 {
        Number(i64),
        Text(String),
        Null(()),
    }
    match Int64::deserialize(d)? {
        Int64::Number(n) => Ok(n),
        Int64::Text(s) => s
            .trim()
            .parse()
            .map_err(|_| serde::de::Error::custom(format!("{s:?} is not an int64"))),
        Int64::Null(()) => Ok(0),
    }
}

/// A string field; `null` is the default.
fn string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

/// A repeated string field; `null` is the default.
fn strings<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(Option::<Vec<String>>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn json_accepts_proto_and_camel_names_and_both_int64_forms() {
        let a: FinalizeCacheEntryUploadRequest =
            serde_json::from_str(r#"{"key":"k","size_bytes":"1000371","version":"v"}"#).unwrap();
        let b: FinalizeCacheEntryUploadRequest = serde_json::from_str(
            r#"{"key":"k","sizeBytes":1000371,"version":"v","extra":{"x":1}}"#,
        )
        .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.size_bytes, 1000371);
        let c: GetCacheEntryDownloadUrlRequest =
            serde_json::from_str(r#"{"key":"k","restoreKeys":["a","b"],"version":null}"#).unwrap();
        assert_eq!(c.restore_keys, ["a", "b"]);
        assert_eq!(c.version, "");
        assert!(
            serde_json::from_str::<FinalizeCacheEntryUploadRequest>(r#"{"size_bytes":"ten"}"#)
                .is_err()
        );
    }

    #[test]
    fn responses_use_proto_names_and_string_int64() {
        let r = FinalizeCacheEntryUploadResponse {
            ok: true,
            entry_id: 42,
            message: String::new(),
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"ok":true,"entry_id":"42"}"#
        );
        let miss = GetCacheEntryDownloadUrlResponse::default();
        assert_eq!(serde_json::to_string(&miss).unwrap(), r#"{"ok":false}"#);
    }

    #[test]
    fn binary_protobuf_round_trips() {
        let req = GetCacheEntryDownloadUrlRequest {
            metadata: None,
            key: "k".into(),
            restore_keys: vec!["a".into()],
            version: "v".into(),
        };
        let bytes = req.encode_to_vec();
        assert_eq!(
            GetCacheEntryDownloadUrlRequest::decode(bytes.as_slice()).unwrap(),
            req
        );
    }
}
