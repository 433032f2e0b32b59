//! Runtime tokens (`ACTIONS_RUNTIME_TOKEN`, PROTOCOL.md §8) turned into an [`Identity`].
//!
//! The token is a JWT. Its `ac` claim (a JSON string) lists the scopes and permissions, and
//! `repository_id` names the repository. Signature verification is issue #4: until it lands the
//! claims are decoded without verification, and `hoard serve` warns about it at start-up.

use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine;
use serde::Deserialize;

use crate::cache::model::{RepoId, Scope};
use crate::cache::scope::{derive_scopes, AccessGrant};

/// The caller, as far as the cache is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub repository: RepoId,
    /// Readable scopes in token order: current ref first, then base and default branches.
    pub read_scopes: Vec<Scope>,
    /// Where writes go; `None` for read-only tokens.
    pub write_scope: Option<Scope>,
    /// The token's subject or run identifiers, for audit logs.
    pub subject: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("missing bearer token")]
    Missing,
    #[error("the bearer token is not a well-formed JWT")]
    Malformed,
    #[error("the token's ac claim is not a list of scopes")]
    BadScopes,
}

#[derive(Deserialize)]
struct Claims {
    #[serde(default)]
    ac: Option<serde_json::Value>,
    #[serde(default)]
    repository_id: Option<serde_json::Value>,
    #[serde(default)]
    sub: Option<String>,
    #[serde(default)]
    scp: Option<String>,
}

/// Turns bearer tokens into identities.
#[derive(Debug, Clone, Default)]
pub struct TokenReader;

impl TokenReader {
    /// Reads the `Authorization` header value (`Bearer <jwt>`).
    pub fn identify(&self, authorization: Option<&str>) -> Result<Identity, TokenError> {
        let header = authorization.ok_or(TokenError::Missing)?;
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .ok_or(TokenError::Missing)?
            .trim();
        identity_from_jwt(token)
    }
}

fn identity_from_jwt(token: &str) -> Result<Identity, TokenError> {
    let mut parts = token.split('.');
    let (Some(_header), Some(payload), Some(_signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed);
    };
    let payload = URL_SAFE_NO_PAD
        .decode(payload)
        .or_else(|_| URL_SAFE.decode(payload))
        .map_err(|_| TokenError::Malformed)?;
    let claims: Claims = serde_json::from_slice(&payload).map_err(|_| TokenError::Malformed)?;
    identity_from_claims(claims)
}

fn identity_from_claims(claims: Claims) -> Result<Identity, TokenError> {
    // `ac` is a JSON string holding an array; accept the array itself too.
    let grants: Vec<AccessGrant> = match claims.ac {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::String(s)) => {
            serde_json::from_str(&s).map_err(|_| TokenError::BadScopes)?
        }
        Some(v @ serde_json::Value::Array(_)) => {
            serde_json::from_value(v).map_err(|_| TokenError::BadScopes)?
        }
        Some(_) => return Err(TokenError::BadScopes),
    };
    let scopes = derive_scopes(&grants);
    // Forge tokens (act, Gitea) carry no repository id: they share one namespace.
    let repository = match claims.repository_id {
        Some(serde_json::Value::Number(n)) => n.to_string(),
        Some(serde_json::Value::String(s)) => s,
        _ => String::new(),
    };
    Ok(Identity {
        repository: RepoId::new(repository),
        read_scopes: scopes.read,
        write_scope: scopes.write,
        subject: claims.sub.or(claims.scp).unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(payload: &str) -> String {
        format!(
            "Bearer {}.{}.sig",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256","typ":"JWT"}"#),
            URL_SAFE_NO_PAD.encode(payload)
        )
    }

    #[test]
    fn reads_repository_and_scopes() {
        let token = jwt(
            r#"{"ac":"[{\"Scope\":\"refs/pull/7/merge\",\"Permission\":3},{\"Scope\":\"refs/heads/main\",\"Permission\":1}]","repository_id":"42","sub":"repo:o/r"}"#,
        );
        let id = TokenReader.identify(Some(&token)).unwrap();
        assert_eq!(id.repository, RepoId::new("42"));
        assert_eq!(id.write_scope, Some(Scope::new("refs/pull/7/merge")));
        assert_eq!(id.read_scopes.len(), 2);
        assert_eq!(id.subject, "repo:o/r");
    }

    #[test]
    fn numeric_repository_ids_are_read() {
        let token = jwt(r#"{"ac":"[]","repository_id":123}"#);
        let id = TokenReader.identify(Some(&token)).unwrap();
        assert_eq!(id.repository, RepoId::new("123"));
        assert!(id.read_scopes.is_empty());
    }

    #[test]
    fn malformed_tokens_are_refused() {
        assert_eq!(TokenReader.identify(None), Err(TokenError::Missing));
        assert_eq!(
            TokenReader.identify(Some("Basic abc")),
            Err(TokenError::Missing)
        );
        assert_eq!(
            TokenReader.identify(Some("Bearer abc")),
            Err(TokenError::Malformed)
        );
        assert_eq!(
            TokenReader.identify(Some("Bearer a.!!!.c")),
            Err(TokenError::Malformed)
        );
        assert_eq!(
            TokenReader.identify(Some(&jwt(r#"{"ac":"not json"}"#))),
            Err(TokenError::BadScopes)
        );
    }
}
