//! Tool tokens: what a job hands its build tools instead of its runtime token (issue #60). hoard
//! mints one from a runtime token it verified (`POST /_hoard/tools/token`): it carries that
//! token's identity (repository, readable and writable scopes, writer) and expiry, signed with
//! hoard's signing key, so it can do no more than the job could, for no longer, and only at
//! hoard (GitHub's services do not know it). Replicas that share the signing key accept each
//! other's.

use base64::Engine as _;
use hmac::Mac;
use serde::{Deserialize, Serialize};

use super::signing::UrlSigner;
use super::token::{Identity, TokenError};
use crate::model::{CallerKind, RepoId, Scope};

/// How a tool token begins (a JWT never does).
pub const PREFIX: &str = "hoardtool.";

/// What the signature covers besides the claims: no link signature can pass for one.
const DOMAIN: &[u8] = b"hoard tool token v1\n";

/// The identity a tool token carries, and until when.
#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    repository: String,
    repository_name: String,
    read_scopes: Vec<String>,
    write_scope: Option<String>,
    kind: String,
    issuer: String,
    subject: String,
    run_id: String,
    job_id: String,
    /// Unix seconds.
    exp: u64,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
}

impl UrlSigner {
    /// A tool token for `who`, good until `exp` (Unix seconds).
    pub fn tool_token(&self, who: &Identity, exp: u64) -> String {
        let claims = Claims {
            repository: who.repository.as_str().to_owned(),
            repository_name: who.repository_name.clone(),
            read_scopes: who
                .read_scopes
                .iter()
                .map(|s| s.as_str().to_owned())
                .collect(),
            write_scope: who.write_scope.as_ref().map(|s| s.as_str().to_owned()),
            kind: who.kind.as_str().to_owned(),
            issuer: who.issuer.clone(),
            subject: who.subject.clone(),
            run_id: who.run_id.clone(),
            job_id: who.job_id.clone(),
            exp,
        };
        let payload = b64().encode(serde_json::to_vec(&claims).expect("claims serialize"));
        let signature = b64().encode(self.tool_mac(&payload));
        format!("{PREFIX}{payload}.{signature}")
    }

    /// The identity `token` carries, if this server (or one sharing its key) minted it and it
    /// has not expired.
    pub fn verify_tool_token(&self, token: &str) -> Result<Identity, TokenError> {
        let rejected = |why: &str| TokenError::Rejected(format!("tool token {why}"));
        let rest = token.strip_prefix(PREFIX).ok_or(TokenError::Malformed)?;
        let (payload, signature) = rest.split_once('.').ok_or(TokenError::Malformed)?;
        let signature = b64().decode(signature).map_err(|_| TokenError::Malformed)?;
        self.keyed_for_tools(payload)
            .verify_slice(&signature)
            .map_err(|_| rejected("signature does not verify"))?;
        let claims: Claims = b64()
            .decode(payload)
            .ok()
            .and_then(|json| serde_json::from_slice(&json).ok())
            .ok_or(TokenError::Malformed)?;
        if claims.exp <= self.now() {
            return Err(rejected("has expired"));
        }
        let kind: CallerKind = claims.kind.parse().map_err(|_| TokenError::Malformed)?;
        Ok(Identity {
            repository: RepoId::new(claims.repository),
            repository_name: claims.repository_name,
            read_scopes: claims.read_scopes.into_iter().map(Scope::new).collect(),
            write_scope: claims.write_scope.map(Scope::new),
            kind,
            issuer: claims.issuer,
            subject: claims.subject,
            run_id: claims.run_id,
            job_id: claims.job_id,
        })
    }

    fn tool_mac(&self, payload: &str) -> Vec<u8> {
        self.keyed_for_tools(payload)
            .finalize()
            .into_bytes()
            .to_vec()
    }

    fn keyed_for_tools(&self, payload: &str) -> super::signing::HmacSha256 {
        let mut mac = self.keyed();
        mac.update(DOMAIN);
        mac.update(payload.as_bytes());
        mac
    }
}

/// The expiry a JWT names (`exp`), read without checking it: for a token just verified.
pub fn jwt_expiry(token: &str) -> Option<u64> {
    let payload = token.split('.').nth(1)?;
    let json = b64().decode(payload.trim_end_matches('=')).ok()?;
    serde_json::from_slice::<serde_json::Value>(&json)
        .ok()?
        .get("exp")?
        .as_u64()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::ManualClock;
    use crate::secret::Secret;

    fn who() -> Identity {
        Identity {
            repository: RepoId::new("1296269"),
            repository_name: "octo/hello".into(),
            read_scopes: vec![
                Scope::new("refs/pull/7/merge"),
                Scope::new("refs/heads/main"),
            ],
            write_scope: Some(Scope::new("refs/pull/7/merge")),
            kind: CallerKind::Github,
            issuer: "https://token.actions.githubusercontent.com".into(),
            subject: "repo:octo/hello:pull_request".into(),
            run_id: "88".into(),
            job_id: "41".into(),
        }
    }

    #[test]
    fn a_tool_token_carries_its_identity_until_it_expires_and_only_with_its_key() {
        let clock = Arc::new(ManualClock::starting_at(1_700_000_000_000));
        let signer = UrlSigner::new(Secret::new(vec![7; 32])).with_clock(clock.clone());
        let token = signer.tool_token(&who(), 1_700_000_600);
        assert!(token.starts_with(PREFIX));
        assert_eq!(signer.verify_tool_token(&token).unwrap(), who());

        // Another key, or a changed claim, and it is refused.
        let other = UrlSigner::new(Secret::new(vec![8; 32])).with_clock(clock.clone());
        assert!(other.verify_tool_token(&token).is_err());
        let (payload, signature) = token[PREFIX.len()..].split_once('.').unwrap();
        let mut claims: serde_json::Value =
            serde_json::from_slice(&b64().decode(payload).unwrap()).unwrap();
        claims["write_scope"] = "refs/heads/main".into();
        let forged = format!(
            "{PREFIX}{}.{signature}",
            b64().encode(serde_json::to_vec(&claims).unwrap())
        );
        assert!(signer.verify_tool_token(&forged).is_err());
        assert!(signer.verify_tool_token("hoardtool.x").is_err());

        clock.advance(std::time::Duration::from_secs(600));
        let expired = signer.verify_tool_token(&token).unwrap_err();
        assert!(expired.to_string().contains("expired"), "{expired}");
    }

    #[test]
    fn a_jwts_expiry_is_read() {
        let payload = b64().encode(br#"{"exp":1700000600,"sub":"x"}"#);
        assert_eq!(
            jwt_expiry(&format!("e30.{payload}.sig")),
            Some(1_700_000_600)
        );
        assert_eq!(jwt_expiry("not a jwt"), None);
    }
}
