//! Who is calling, from everything a request may carry: a Forgejo proxy's MAC headers, a
//! runtime token, a namespace's secret path prefix, or nothing (anonymous access, when the
//! operator turned it on). Each protocol asks here and answers refusals in its own shape.

use axum::http::{header, HeaderMap};

use super::forgejo::{self, ForgejoError, ForgejoRun, ForgejoSettings};
use super::namespaces::{shared_identity, Access, Namespaces};
use super::token::{Identity, TokenError};
use super::verify::Verifier;
use crate::model::CallerKind;

/// Warning shown at start-up and on `/readyz` when anonymous access is on.
pub const ANONYMOUS_WARNING: &str = "--anonymous-access is on: clients without credentials share one namespace that anyone who can reach this server can use";

/// The ways of identifying a caller the operator configured.
#[derive(Debug)]
pub struct Callers {
    pub tokens: Verifier,
    pub forgejo: Option<ForgejoSettings>,
    pub namespaces: Namespaces,
    /// What a request with no credential at all may do; `None` refuses it.
    pub anonymous: Option<Access>,
}

/// Why a caller was refused.
#[derive(Debug, thiserror::Error)]
pub enum CallerError {
    /// No credential, or a token that does not verify: 401.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// A Forgejo proxy's headers that do not verify: 403.
    #[error(transparent)]
    Forgejo(#[from] ForgejoError),
    /// A path prefix that is no namespace, without a token that verifies: 404, saying
    /// nothing about which namespaces exist.
    #[error("not found")]
    UnknownPrefix,
}

/// A caller, and the Forgejo run it came through if it did.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Shared with the verified-token cache: a job's requests reuse one identity, uncopied.
    pub identity: std::sync::Arc<Identity>,
    pub forgejo: Option<ForgejoRun>,
    /// How it was identified: `token`, `forgejo`, `namespace` or `anonymous`.
    pub how: &'static str,
    /// Where the request came from (the client's address, as the protocol layer resolved
    /// it): recorded as the writer's address of what it saves.
    pub address: Option<std::net::IpAddr>,
}

impl Callers {
    /// Identifies a request to a protocol endpoint under `prefix` (the path before
    /// `/_apis/artifactcache/` or `/twirp/`, without slashes; empty at the root).
    ///
    /// Order: Forgejo headers, when present, decide alone. Then a token that verifies keeps
    /// its identity under any prefix. Then a namespace's prefix names the caller, whatever
    /// unverifiable token it sends (act and Gitea send tokens only they can check); with
    /// namespaces configured, any other prefix is not found. Otherwise a request without a
    /// token is anonymous if that is on.
    pub async fn identify(
        &self,
        headers: &HeaderMap,
        prefix: &str,
        address: Option<std::net::IpAddr>,
    ) -> Result<Caller, CallerError> {
        if forgejo::is_forgejo(headers) {
            let settings = self.forgejo.as_ref().ok_or(ForgejoError::NotConfigured)?;
            let (identity, run) = forgejo::verify(settings, headers, self.tokens.now())?;
            return Ok(Caller {
                identity: identity.into(),
                forgejo: Some(run),
                how: "forgejo",
                address,
            });
        }
        let authorization = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let token = match authorization {
            Some(value) => Some(self.tokens.identify(Some(value)).await),
            None => None,
        };
        let (identity, how) = match token {
            Some(Ok(identity)) => (identity, "token"),
            // Without namespaces there is nothing to hide: the token's refusal says more.
            _ if !prefix.is_empty() && !self.namespaces.is_empty() => (
                self.namespaces
                    .identify(prefix)
                    .ok_or(CallerError::UnknownPrefix)?
                    .into(),
                "namespace",
            ),
            Some(Err(e)) => return Err(e.into()),
            None => match self.anonymous {
                Some(access) => (
                    shared_identity("anonymous".into(), access, CallerKind::Anonymous).into(),
                    "anonymous",
                ),
                None => return Err(TokenError::Missing.into()),
            },
        };
        Ok(Caller {
            identity,
            forgejo: None,
            how,
            address,
        })
    }
}
