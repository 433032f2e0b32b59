//! Runtime tokens (`ACTIONS_RUNTIME_TOKEN`, PROTOCOL.md §8) turned into an [`Identity`].
//!
//! The token is a JWT. Its `ac` claim (a JSON string) lists the scopes and permissions, and
//! `repository_id` names the repository. Signatures are checked by `auth::verify` before the
//! claims are read here.

use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine;
use jsonwebtoken::Algorithm;
use serde::Deserialize;

use super::scope::{derive_scopes, AccessGrant};
use crate::model::{CallerKind, Provenance, RepoId, Scope};

/// The caller, as far as the cache is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub repository: RepoId,
    /// The repository's name for people (owner/name), or empty: shown to operators, never
    /// used to decide anything.
    pub repository_name: String,
    /// Readable scopes in token order: current ref first, then base and default branches.
    pub read_scopes: Vec<Scope>,
    /// Where writes go; `None` for read-only tokens.
    pub write_scope: Option<Scope>,
    /// How the caller was identified.
    pub kind: CallerKind,
    /// The token's issuer (`iss`), clipped; empty without one.
    pub issuer: String,
    /// The token's subject, clipped: recorded as the writer of what it saves, and in audit logs.
    pub subject: String,
    /// The run and job the token was issued to (GitHub's `Actions.Results:<run>:<job>` in
    /// `scp`, act and Gitea's `RunID` and `JobID`), clipped; empty when it names none.
    pub run_id: String,
    pub job_id: String,
}

impl Identity {
    /// How people know the repository: its name, else its id.
    pub fn display_repository(&self) -> &str {
        if self.repository_name.is_empty() {
            self.repository.as_str()
        } else {
            &self.repository_name
        }
    }

    /// What an entry this caller writes from `address` records of its writer.
    pub fn provenance(&self, address: Option<std::net::IpAddr>) -> Provenance {
        Provenance {
            kind: self.kind,
            issuer: self.issuer.clone(),
            subject: self.subject.clone(),
            run_id: self.run_id.clone(),
            job_id: self.job_id.clone(),
            address: address.map(|a| a.to_string()).unwrap_or_default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("missing bearer token")]
    Missing,
    #[error("the bearer token is not a well-formed JWT")]
    Malformed,
    #[error("the token's ac claim is not a list of scopes")]
    BadScopes,
    #[error("the token's repository_id claim must be a string or an integer of at most 255 bytes")]
    BadRepository,
    #[error("{0}")]
    Rejected(String),
    /// The cause is logged where the fetch failed; clients get no internal detail.
    #[error("the token issuer's keys are unavailable; retry later")]
    KeysUnavailable(String),
}

/// The longest repository id kept (the metadata stores index it).
const MAX_REPOSITORY_ID: usize = 255;

/// A claim as it was sent, `null` included (serde reads a `null` into an `Option` as absent);
/// an absent claim is `None` through `#[serde(default)]`.
fn as_sent<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

#[derive(Deserialize)]
pub(crate) struct Claims {
    #[serde(default)]
    ac: Option<serde_json::Value>,
    /// `null` included: it is refused, not read as absent.
    #[serde(default, deserialize_with = "as_sent")]
    repository_id: Option<serde_json::Value>,
    /// `owner/name`, when the issuer includes it.
    #[serde(default)]
    repository: Option<serde_json::Value>,
    #[serde(default)]
    sub: Option<String>,
    #[serde(default)]
    scp: Option<String>,
    /// Read whatever its type: only a string is kept (a forge's token may carry anything).
    #[serde(default)]
    iss: Option<serde_json::Value>,
    /// act and Gitea name the run and job in claims of their own.
    #[serde(default, rename = "RunID")]
    run_id: Option<serde_json::Value>,
    #[serde(default, rename = "JobID")]
    job_id: Option<serde_json::Value>,
}

/// A claim that names a run or job: a string or an integer; anything else names none.
fn id_claim(value: Option<serde_json::Value>) -> Option<String> {
    match value? {
        serde_json::Value::String(s) if !s.is_empty() => Some(s),
        serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        _ => None,
    }
}

pub(crate) fn claims_from_json(value: serde_json::Value) -> Result<Claims, TokenError> {
    serde_json::from_value(value).map_err(|_| TokenError::Malformed)
}

/// Reads a JWT's claims without checking its signature: only for
/// `--insecure-skip-token-validation`.
pub(crate) fn identity_from_unverified_jwt(token: &str) -> Result<Identity, TokenError> {
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
    // Unverified, the kind is what the token says of itself: its algorithm and issuer.
    let kind = match claims.iss.as_ref().and_then(serde_json::Value::as_str) {
        _ if jsonwebtoken::decode_header(token).is_ok_and(|h| h.alg == Algorithm::HS256) => {
            CallerKind::Hs256
        }
        Some(iss) if !iss.is_empty() && !is_github_issuer(iss) => CallerKind::Ghes,
        _ => CallerKind::Github,
    };
    identity_from_claims(claims, kind)
}

/// The identity of a token's claims; `kind` is how its signature was checked.
pub(crate) fn identity_from_claims(
    claims: Claims,
    kind: CallerKind,
) -> Result<Identity, TokenError> {
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
        Some(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
        Some(serde_json::Value::String(s)) if s.len() <= MAX_REPOSITORY_ID => s,
        None => String::new(),
        // Anything else is refused rather than read as "no repository", which would put the
        // token in the namespace forge tokens share.
        Some(_) => return Err(TokenError::BadRepository),
    };
    // Only a display name: a value of another type or an overlong one is left out, not refused.
    let repository_name = match claims.repository {
        Some(serde_json::Value::String(s)) if s.len() <= MAX_REPOSITORY_ID => s,
        _ => String::new(),
    };
    // GitHub's `scp` names them as `Actions.Results:<run>:<job>`; act and Gitea's own claims
    // are read when `scp` names none.
    let results = claims
        .scp
        .as_deref()
        .unwrap_or_default()
        .split_whitespace()
        .find_map(|s| s.strip_prefix("Actions.Results:"));
    let (scp_run, scp_job) = match results {
        Some(ids) => match ids.split_once(':') {
            Some((run, job)) => (run, job),
            None => (ids, ""),
        },
        None => ("", ""),
    };
    let or_claim = |from_scp: &str, claim| match from_scp {
        "" => id_claim(claim).unwrap_or_default(),
        some => some.to_owned(),
    };
    let run_id = or_claim(scp_run, claims.run_id);
    let job_id = or_claim(scp_job, claims.job_id);
    Ok(Identity {
        repository: RepoId::new(repository),
        repository_name,
        read_scopes: scopes.read,
        write_scope: scopes.write,
        kind,
        issuer: Provenance::clip(
            claims
                .iss
                .as_ref()
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default(),
        ),
        subject: Provenance::clip(claims.sub.as_deref().unwrap_or_default()),
        run_id: Provenance::clip(&run_id),
        job_id: Provenance::clip(&job_id),
    })
}

/// GitHub's issuer for Actions tokens (PROTOCOL.md §8).
pub const GITHUB_ISSUER: &str = "https://token.actions.githubusercontent.com";

/// Whether `iss` is GitHub's own issuer (a trailing slash aside).
pub fn is_github_issuer(iss: &str) -> bool {
    normalize_issuer(iss) == normalize_issuer(GITHUB_ISSUER)
}

/// An issuer as compared: without a trailing slash.
pub(super) fn normalize_issuer(iss: &str) -> &str {
    iss.trim_end_matches('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(payload: &str) -> String {
        format!(
            "{}.{}.sig",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256","typ":"JWT"}"#),
            URL_SAFE_NO_PAD.encode(payload)
        )
    }

    #[test]
    fn reads_repository_scopes_and_run() {
        let token = jwt(
            r#"{"ac":"[{\"Scope\":\"refs/pull/7/merge\",\"Permission\":3},{\"Scope\":\"refs/heads/main\",\"Permission\":1}]","repository_id":"42","sub":"repo:o/r","scp":"Actions.Runner:11:22 Actions.Results:33:44"}"#,
        );
        let id = identity_from_unverified_jwt(&token).unwrap();
        assert_eq!(id.repository, RepoId::new("42"));
        assert_eq!(id.write_scope, Some(Scope::new("refs/pull/7/merge")));
        assert_eq!(id.read_scopes.len(), 2);
        assert_eq!(id.subject, "repo:o/r");
        assert_eq!((id.run_id.as_str(), id.job_id.as_str()), ("33", "44"));
        assert_eq!(id.kind, CallerKind::Github);
    }

    #[test]
    fn act_and_gitea_name_run_and_job_in_claims_of_their_own() {
        let id =
            identity_from_unverified_jwt(&jwt(r#"{"ac":"[]","RunID":12,"JobID":"34"}"#)).unwrap();
        assert_eq!((id.run_id.as_str(), id.job_id.as_str()), ("12", "34"));
        // A claim of another type names nothing.
        let id = identity_from_unverified_jwt(&jwt(r#"{"ac":"[]","RunID":{"x":1}}"#)).unwrap();
        assert_eq!(id.run_id, "");
    }

    #[test]
    fn an_unverified_tokens_kind_is_what_its_header_and_issuer_say() {
        let ghes = jwt(r#"{"ac":"[]","iss":"https://ghes.example/_services/token"}"#);
        let id = identity_from_unverified_jwt(&ghes).unwrap();
        assert_eq!(id.kind, CallerKind::Ghes);
        assert_eq!(id.issuer, "https://ghes.example/_services/token");
        let hs = format!(
            "{}.{}.sig",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256"}"#),
            URL_SAFE_NO_PAD.encode(r#"{"ac":"[]"}"#)
        );
        assert_eq!(
            identity_from_unverified_jwt(&hs).unwrap().kind,
            CallerKind::Hs256
        );
    }

    #[test]
    fn an_issuer_of_another_type_is_left_out_not_refused() {
        let id = identity_from_unverified_jwt(&jwt(r#"{"ac":"[]","iss":7}"#)).unwrap();
        assert_eq!(id.issuer, "");
    }

    #[test]
    fn a_tokens_texts_are_clipped() {
        let long = "s".repeat(5000);
        let id = identity_from_unverified_jwt(&jwt(&format!(
            r#"{{"ac":"[]","sub":"{long}","scp":"Actions.Results:{long}:1"}}"#
        )))
        .unwrap();
        assert_eq!(id.subject.len(), Provenance::MAX_FIELD);
        assert_eq!(id.run_id.len(), Provenance::MAX_FIELD);
        assert_eq!(id.job_id, "1");
    }

    #[test]
    fn repository_ids_are_strings_or_integers() {
        for bad in [
            r#"{"ac":"[]","repository_id":{}}"#,
            r#"{"ac":"[]","repository_id":[1]}"#,
            r#"{"ac":"[]","repository_id":true}"#,
            r#"{"ac":"[]","repository_id":1.5}"#,
            r#"{"ac":"[]","repository_id":null}"#,
        ] {
            assert!(
                matches!(
                    identity_from_unverified_jwt(&jwt(bad)),
                    Err(TokenError::BadRepository)
                ),
                "{bad}"
            );
        }
        let long = format!(r#"{{"ac":"[]","repository_id":"{}"}}"#, "7".repeat(256));
        assert!(identity_from_unverified_jwt(&jwt(&long)).is_err());
        let forge = identity_from_unverified_jwt(&jwt(r#"{"ac":"[]"}"#)).unwrap();
        assert_eq!(forge.repository.as_str(), "");
    }

    #[test]
    fn numeric_repository_ids_are_read() {
        let id = identity_from_unverified_jwt(&jwt(r#"{"ac":"[]","repository_id":123}"#)).unwrap();
        assert_eq!(id.repository, RepoId::new("123"));
        assert!(id.read_scopes.is_empty());
    }

    #[test]
    fn malformed_tokens_are_refused() {
        assert_eq!(
            identity_from_unverified_jwt("abc"),
            Err(TokenError::Malformed)
        );
        assert_eq!(
            identity_from_unverified_jwt("a.!!!.c"),
            Err(TokenError::Malformed)
        );
        assert_eq!(
            identity_from_unverified_jwt(&jwt(r#"{"ac":"not json"}"#)),
            Err(TokenError::BadScopes)
        );
        assert_eq!(
            identity_from_unverified_jwt(&jwt(r#"{"ac":7}"#)),
            Err(TokenError::BadScopes)
        );
    }
}
