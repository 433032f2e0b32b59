//! Runtime-token verification (PROTOCOL.md §8): RS256 and ES256 against the issuer's JWKS
//! (OIDC discovery, or a key file for air-gapped sites), HS256 with a shared secret for forges,
//! `exp`/`nbf` with a small leeway. Verified tokens are remembered until they expire, keyed by
//! a hash of the token, so a job's repeated calls cost one hash lookup (DESIGN.md §6); under
//! `--insecure-skip-token-validation` a token's claims are read once and remembered the same way.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::sync::RwLock;

use super::token::{
    claims_from_json, identity_from_claims, normalize_issuer, Identity, TokenError,
};
use super::unix_seconds;
use crate::model::{CallerKind, Clock, Millis, SystemClock};

pub use super::token::{is_github_issuer, GITHUB_ISSUER};

/// Verified tokens remembered at most; past this, expired ones go, then all.
const CACHE_CAPACITY: usize = 4096;
/// An unknown `kid` refetches an issuer's keys at most this often (a rotation is picked up
/// within seconds; a flood of forged kids costs one fetch per interval).
const REFRESH_AT_MOST_EVERY: Duration = Duration::from_secs(10);

/// How tokens are checked.
#[derive(Debug, Clone)]
pub struct TokenSettings {
    /// Accepted `iss` values for RS256/ES256 tokens.
    pub issuers: Vec<String>,
    /// Keys for every issuer, instead of discovery.
    pub jwks: Option<JwkSet>,
    /// Secret for HS256 tokens (forges, tests); HS256 is refused without one.
    pub hs256_secret: Option<crate::secret::Secret>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
    /// Decode claims without checking anything (explicit operator choice; warned about).
    pub insecure_skip_validation: bool,
}

impl TokenSettings {
    pub fn load_jwks_file(path: &Path) -> Result<JwkSet, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        serde_json::from_str(&text)
            .map_err(|e| format!("{} is not a JWKS document: {e}", path.display()))
    }
}

#[derive(Clone)]
struct VerificationKey {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
}

struct IssuerKeys {
    keys: Vec<VerificationKey>,
    /// When they were fetched (or a fetch failed), on the verifier's clock.
    fetched: Millis,
}

impl IssuerKeys {
    /// Whether a refetch must wait: the last one was less than [`REFRESH_AT_MOST_EVERY`] ago.
    /// A clock that went back counts as time passed, so a step back never blocks a rotation.
    fn fresh(&self, now: Millis) -> bool {
        let age = now.saturating_sub(self.fetched);
        (0..REFRESH_AT_MOST_EVERY.as_millis() as Millis).contains(&age)
    }
}

/// A verified (or, unchecked, read) token's identity and its `exp`, by the SHA-256 of the token.
type Remembered = (Arc<Identity>, u64);

/// Turns bearer tokens into identities.
pub struct Verifier {
    settings: TokenSettings,
    static_keys: Vec<VerificationKey>,
    discovered: RwLock<HashMap<String, IssuerKeys>>,
    /// One gate per trusted issuer (a bounded set): held while its keys are fetched.
    refreshing: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Made on the first key fetch: loading the system's root certificates costs start-up
    /// several milliseconds and idle memory, and a server on HS256 or a JWKS file never fetches.
    http: std::sync::OnceLock<reqwest::Client>,
    /// Keyed by a SHA-256 already: foldhash spends less on it than SipHash would.
    verified: Mutex<foldhash::HashMap<[u8; 32], Remembered>>,
    /// Where `exp`, `nbf` and the refresh interval are measured: the machine's clock unless
    /// [`Verifier::with_clock`].
    clock: Arc<dyn Clock>,
    /// Checks the tool tokens hoard signs (`tool_token.rs`), when this verifier takes them.
    tool_tokens: Option<super::signing::UrlSigner>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("issuers", &self.settings.issuers)
            .field("insecure", &self.settings.insecure_skip_validation)
            .finish_non_exhaustive()
    }
}

/// The algorithm a JWK is for: its `alg`, else what its key type implies.
fn jwk_algorithm(jwk: &Jwk) -> Option<Algorithm> {
    match (&jwk.common.key_algorithm, &jwk.algorithm) {
        (Some(KeyAlgorithm::RS256), AlgorithmParameters::RSA(_)) => Some(Algorithm::RS256),
        (Some(KeyAlgorithm::ES256), AlgorithmParameters::EllipticCurve(p))
            if p.curve == EllipticCurve::P256 =>
        {
            Some(Algorithm::ES256)
        }
        (None, AlgorithmParameters::RSA(_)) => Some(Algorithm::RS256),
        (None, AlgorithmParameters::EllipticCurve(p)) if p.curve == EllipticCurve::P256 => {
            Some(Algorithm::ES256)
        }
        _ => None,
    }
}

fn keys_of(set: &JwkSet) -> Vec<VerificationKey> {
    set.keys
        .iter()
        .filter_map(|jwk| {
            let alg = jwk_algorithm(jwk)?;
            let key = DecodingKey::from_jwk(jwk).ok()?;
            Some(VerificationKey {
                kid: jwk.common.key_id.clone(),
                alg,
                key,
            })
        })
        .collect()
}

/// The `iss` and `exp` of a token, read before its signature is checked (to pick the keys).
#[derive(Deserialize)]
struct Peek {
    #[serde(default)]
    iss: Option<String>,
}

fn peek_payload(token: &str) -> Result<Peek, TokenError> {
    let payload = token.split('.').nth(1).ok_or(TokenError::Malformed)?;
    let bytes = URL_SAFE_NO_PAD
        .decode(payload)
        .or_else(|_| URL_SAFE.decode(payload))
        .map_err(|_| TokenError::Malformed)?;
    serde_json::from_slice(&bytes).map_err(|_| TokenError::Malformed)
}

fn map_jwt_error(e: jsonwebtoken::errors::Error) -> TokenError {
    use jsonwebtoken::errors::ErrorKind;
    match e.kind() {
        // `exp` and `nbf` are not the library's to check (`check_validity`, on our clock).
        ErrorKind::InvalidSignature => {
            TokenError::Rejected("the token's signature does not verify".into())
        }
        ErrorKind::InvalidIssuer => {
            TokenError::Rejected("the token's issuer is not trusted".into())
        }
        ErrorKind::MissingRequiredClaim(c) => {
            TokenError::Rejected(format!("the token has no {c} claim"))
        }
        ErrorKind::InvalidAlgorithm => {
            TokenError::Rejected("the token's algorithm does not match its key".into())
        }
        _ => TokenError::Malformed,
    }
}

impl Verifier {
    pub fn new(settings: TokenSettings) -> Self {
        let static_keys = settings.jwks.as_ref().map(keys_of).unwrap_or_default();
        Self {
            settings,
            static_keys,
            discovered: RwLock::new(HashMap::new()),
            refreshing: Mutex::new(HashMap::new()),
            http: std::sync::OnceLock::new(),
            verified: Mutex::new(foldhash::HashMap::default()),
            clock: Arc::new(SystemClock),
            tool_tokens: None,
        }
    }

    /// The same verifier also taking the tool tokens `signer` signs.
    pub fn with_tool_tokens(self, signer: super::signing::UrlSigner) -> Self {
        Self {
            tool_tokens: Some(signer),
            ..self
        }
    }

    /// The same verifier reading the time from `clock` (tests move a `ManualClock`).
    pub fn with_clock(self, clock: Arc<dyn Clock>) -> Self {
        Self { clock, ..self }
    }

    /// Now, in the Unix seconds of a token's `exp` and `nbf`.
    pub fn now(&self) -> u64 {
        unix_seconds(self.clock.as_ref())
    }

    /// Reads the `Authorization` header value: `Bearer <jwt>`, or Basic credentials whose
    /// password (or user, without a password) is the token, as ccache sends the credentials of
    /// its storage URL.
    pub async fn identify(&self, authorization: Option<&str>) -> Result<Arc<Identity>, TokenError> {
        let header = authorization.ok_or(TokenError::Missing)?;
        let credential = credential(header).ok_or(TokenError::Missing)?;
        let token = credential.trim();
        if token.starts_with(super::tool_token::PREFIX) {
            // hoard's own signature, checked with one MAC: nothing to remember.
            let signer = self
                .tool_tokens
                .as_ref()
                .ok_or_else(|| TokenError::Rejected("tool tokens are not taken here".into()))?;
            return signer.verify_tool_token(token).map(Arc::new);
        }
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = self.now();
        if let Some(identity) = self.remembered(&digest, now) {
            return Ok(identity);
        }
        let (identity, exp) = if self.settings.insecure_skip_validation {
            // Unchecked, the identity is the token's alone and never expires: read once, as a
            // verified one is (an unsigned token's header fails to parse at a cost).
            let identity = super::token::identity_from_unverified_jwt(token)?;
            (identity, u64::MAX)
        } else {
            self.verify(token).await?
        };
        let identity = Arc::new(identity);
        self.remember(digest, identity.clone(), exp, now);
        Ok(identity)
    }

    fn remembered(&self, digest: &[u8; 32], now: u64) -> Option<Arc<Identity>> {
        let mut cache = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        match cache.get(digest) {
            Some((identity, exp)) if now < exp.saturating_add(self.settings.leeway.as_secs()) => {
                Some(identity.clone())
            }
            Some(_) => {
                cache.remove(digest);
                None
            }
            None => None,
        }
    }

    fn remember(&self, digest: [u8; 32], identity: Arc<Identity>, exp: u64, now: u64) {
        let mut cache = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= CACHE_CAPACITY {
            cache.retain(|_, (_, e)| now < *e);
            if cache.len() >= CACHE_CAPACITY {
                cache.clear();
            }
        }
        cache.insert(digest, (identity, exp));
    }

    async fn verify(&self, token: &str) -> Result<(Identity, u64), TokenError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
        let mut validation = Validation::new(header.alg);
        // `exp` and `nbf` are checked below on our clock (jsonwebtoken reads the system's);
        // the library still requires `exp` to be present.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        validation.set_required_spec_claims(&["exp"]);
        let (exp, claims, kind) = match header.alg {
            Algorithm::HS256 => {
                let secret = self.settings.hs256_secret.as_ref().ok_or_else(|| {
                    TokenError::Rejected(
                        "HS256 tokens are not accepted (no --token-hs256-secret-file)".into(),
                    )
                })?;
                let claims = decode(
                    token,
                    &DecodingKey::from_secret(secret.expose()),
                    &validation,
                )?;
                (self.check_times(&claims)?, claims, CallerKind::Hs256)
            }
            Algorithm::RS256 | Algorithm::ES256 => {
                let iss = peek_payload(token)?
                    .iss
                    .ok_or_else(|| TokenError::Rejected("the token has no iss claim".into()))?;
                let trusted = self
                    .settings
                    .issuers
                    .iter()
                    .any(|i| normalize_issuer(i) == normalize_issuer(&iss));
                if !trusted {
                    return Err(TokenError::Rejected(format!(
                        "the token's issuer {:?} is not trusted",
                        crate::model::LogSafe(&iss).to_string()
                    )));
                }
                validation.set_issuer(&[iss.as_str()]);
                let keys = self
                    .keys_for(&iss, header.kid.as_deref(), header.alg)
                    .await?;
                let mut result = Err(TokenError::Rejected(
                    "no key of the issuer matches the token".into(),
                ));
                for key in &keys {
                    result = decode(token, key, &validation);
                    if result.is_ok() {
                        break;
                    }
                }
                let claims = result?;
                // On the clock after the key fetch (which may take seconds), before any other
                // claim: an expired token is told it expired.
                let exp = self.check_times(&claims)?;
                // An issuer's token must name its repository: without one, entries of every
                // repository would share a namespace (PROTOCOL.md §8).
                let names_repository = match claims.get("repository_id") {
                    Some(serde_json::Value::Number(_)) => true,
                    Some(serde_json::Value::String(s)) => !s.is_empty(),
                    _ => false,
                };
                if !names_repository {
                    return Err(TokenError::Rejected(
                        "the token has no repository_id claim".into(),
                    ));
                }
                let kind = if is_github_issuer(&iss) {
                    CallerKind::Github
                } else {
                    CallerKind::Ghes
                };
                (exp, claims, kind)
            }
            other => {
                return Err(TokenError::Rejected(format!(
                    "{other:?} tokens are not accepted"
                )))
            }
        };
        let identity = identity_from_claims(claims_from_json(claims)?, kind)?;
        Ok((identity, exp))
    }

    /// Checks a signed token's `exp` and `nbf` on this verifier's clock, read now; returns `exp`.
    fn check_times(&self, claims: &serde_json::Value) -> Result<u64, TokenError> {
        let exp = claims
            .get("exp")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0);
        let nbf = claims.get("nbf").and_then(serde_json::Value::as_u64);
        check_validity(exp, nbf, self.now(), self.settings.leeway.as_secs())?;
        Ok(exp)
    }

    /// The keys that may have signed a token of `iss`: the one named by `kid`, or every key of
    /// the algorithm when the token names none. Refreshes the issuer's keys (at most every
    /// [`REFRESH_AT_MOST_EVERY`]) when none matches; a failed refresh keeps the known keys.
    async fn keys_for(
        &self,
        iss: &str,
        kid: Option<&str>,
        alg: Algorithm,
    ) -> Result<Vec<DecodingKey>, TokenError> {
        let pick = |keys: &[VerificationKey]| -> Vec<DecodingKey> {
            keys.iter()
                .filter(|k| k.alg == alg && (kid.is_none() || k.kid.as_deref() == kid))
                .map(|k| k.key.clone())
                .collect()
        };
        let no_match = || TokenError::Rejected("no key of the issuer matches the token".into());
        if self.settings.jwks.is_some() {
            let keys = pick(&self.static_keys);
            return if keys.is_empty() {
                Err(no_match())
            } else {
                Ok(keys)
            };
        }
        let issuer = normalize_issuer(iss).to_owned();
        // What the known keys decide: the matching keys, a refusal while they are fresh, or
        // nothing (unknown issuer, or stale keys without a match: refetch).
        let decide = |entry: Option<&IssuerKeys>| -> Option<Result<Vec<DecodingKey>, TokenError>> {
            let entry = entry?;
            let keys = pick(&entry.keys);
            if !keys.is_empty() {
                return Some(Ok(keys));
            }
            entry.fresh(self.clock.now()).then(|| Err(no_match()))
        };
        if let Some(decided) = decide(self.discovered.read().await.get(&issuer)) {
            return decided;
        }
        // One refresh per issuer at a time, and no lock on the known keys while it runs:
        // tokens whose keys are known keep verifying. Requests that queued behind a refresh
        // find its keys and share that one fetch.
        let gate = {
            let mut gates = self.refreshing.lock().unwrap_or_else(|p| p.into_inner());
            gates.entry(issuer.clone()).or_default().clone()
        };
        let _turn = gate.lock().await;
        if let Some(decided) = decide(self.discovered.read().await.get(&issuer)) {
            return decided;
        }
        let fetched = self.discover(&issuer).await;
        let mut known = self.discovered.write().await;
        match fetched {
            Ok(keys) => {
                let matching = pick(&keys);
                known.insert(
                    issuer,
                    IssuerKeys {
                        keys,
                        fetched: self.clock.now(),
                    },
                );
                if matching.is_empty() {
                    Err(no_match())
                } else {
                    Ok(matching)
                }
            }
            Err(e) => {
                tracing::error!(issuer = %issuer, error = %e, "cannot fetch the token issuer's keys");
                // Keep what was known, and do not hammer a failing issuer.
                let keys = known.remove(&issuer).map(|e| e.keys).unwrap_or_default();
                known.insert(
                    issuer,
                    IssuerKeys {
                        keys,
                        fetched: self.clock.now(),
                    },
                );
                Err(TokenError::KeysUnavailable(e))
            }
        }
    }

    /// The client for key fetches, made the first time one is needed.
    fn http(&self) -> Result<&reqwest::Client, String> {
        if let Some(client) = self.http.get() {
            return Ok(client);
        }
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("cannot build the HTTP client for token key discovery: {e}"))?;
        Ok(self.http.get_or_init(|| client))
    }

    /// OIDC discovery: `<issuer>/.well-known/openid-configuration` → `jwks_uri` → keys.
    async fn discover(&self, issuer: &str) -> Result<Vec<VerificationKey>, String> {
        #[derive(Deserialize)]
        struct Discovery {
            jwks_uri: String,
        }
        let config_url = format!("{issuer}/.well-known/openid-configuration");
        let http = self.http()?;
        let discovery: Discovery = http
            .get(&config_url)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| format!("{config_url}: {e}"))?
            .json()
            .await
            .map_err(|e| format!("{config_url}: {e}"))?;
        let set: JwkSet = http
            .get(&discovery.jwks_uri)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| format!("{}: {e}", discovery.jwks_uri))?
            .json()
            .await
            .map_err(|e| format!("{}: {e}", discovery.jwks_uri))?;
        Ok(keys_of(&set))
    }
}

/// A token's validity window at `now` (Unix seconds), `leeway` seconds wider on each side for
/// clock skew; as jsonwebtoken checks it, but on our clock. Client-given numbers saturate: an
/// `exp` near `u64::MAX` is far in the future, never wrapped into the past.
fn check_validity(exp: u64, nbf: Option<u64>, now: u64, leeway: u64) -> Result<(), TokenError> {
    if exp.saturating_add(leeway) < now {
        return Err(TokenError::Rejected("the token has expired".into()));
    }
    if nbf.is_some_and(|nbf| nbf > now.saturating_add(leeway)) {
        return Err(TokenError::Rejected(
            "the token is not valid yet (nbf)".into(),
        ));
    }
    Ok(())
}

fn decode(
    token: &str,
    key: &DecodingKey,
    validation: &Validation,
) -> Result<serde_json::Value, TokenError> {
    jsonwebtoken::decode::<serde_json::Value>(token, key, validation)
        .map(|d| d.claims)
        .map_err(map_jwt_error)
}

/// The token an `Authorization` value carries: after `Bearer`, or the password of Basic
/// credentials (the user, when the password is empty).
pub fn credential(header: &str) -> Option<std::borrow::Cow<'_, str>> {
    use base64::Engine as _;
    if let Some(token) = header
        .strip_prefix("Bearer ")
        .or_else(|| header.strip_prefix("bearer "))
    {
        return Some(token.into());
    }
    let encoded = header
        .strip_prefix("Basic ")
        .or_else(|| header.strip_prefix("basic "))?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let credentials = String::from_utf8(decoded).ok()?;
    let (user, password) = credentials.split_once(':').unwrap_or((&credentials, ""));
    Some(
        if password.is_empty() { user } else { password }
            .to_owned()
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_valid_from_nbf_to_exp_give_or_take_the_leeway() {
        assert_eq!(check_validity(1000, Some(900), 950, 60), Ok(()));
        assert_eq!(check_validity(1000, None, 1060, 60), Ok(()));
        assert!(check_validity(1000, None, 1061, 60).is_err(), "expired");
        assert_eq!(check_validity(1000, Some(1010), 950, 60), Ok(()));
        assert!(
            check_validity(1000, Some(1011), 950, 60).is_err(),
            "not yet"
        );
    }

    #[test]
    fn client_given_extremes_saturate_instead_of_wrapping() {
        assert_eq!(check_validity(u64::MAX, None, 1000, 60), Ok(()));
        assert_eq!(
            check_validity(u64::MAX, Some(u64::MAX), u64::MAX, 60),
            Ok(())
        );
        assert!(check_validity(0, None, 1000, u64::MAX - 10).is_ok());
        assert!(check_validity(1000, Some(u64::MAX), 1000, u64::MAX).is_ok());
    }

    #[test]
    fn keys_are_refetched_at_most_every_interval_and_after_a_step_back() {
        let keys = IssuerKeys {
            keys: Vec::new(),
            fetched: 100_000,
        };
        let interval = REFRESH_AT_MOST_EVERY.as_millis() as Millis;
        assert!(keys.fresh(100_000));
        assert!(keys.fresh(100_000 + interval - 1));
        assert!(!keys.fresh(100_000 + interval));
        assert!(!keys.fresh(99_999), "the clock went back: refetch");
    }

    #[tokio::test]
    async fn an_unchecked_token_is_read_once_and_each_token_keeps_its_own_identity() {
        let v = Verifier::new(TokenSettings {
            issuers: Vec::new(),
            jwks: None,
            hs256_secret: None,
            leeway: Duration::from_secs(60),
            insecure_skip_validation: true,
        });
        let unsigned = |repository_id: u64| {
            let part = |json: serde_json::Value| URL_SAFE_NO_PAD.encode(json.to_string());
            format!(
                "Bearer {}.{}.x",
                part(serde_json::json!({"alg": "none"})),
                part(serde_json::json!({"repository_id": repository_id, "ac": "[]"}))
            )
        };
        let (one, two) = (unsigned(1), unsigned(2));
        let first = v.identify(Some(&one)).await.unwrap();
        let again = v.identify(Some(&one)).await.unwrap();
        assert!(Arc::ptr_eq(&first, &again), "read once, then remembered");
        let other = v.identify(Some(&two)).await.unwrap();
        assert_eq!(
            (first.repository.as_str(), other.repository.as_str()),
            ("1", "2")
        );
        for _ in 0..2 {
            assert!(matches!(
                v.identify(Some("Bearer not.a-token")).await,
                Err(TokenError::Malformed)
            ));
        }
    }

    #[tokio::test]
    async fn a_remembered_token_with_a_huge_exp_neither_panics_nor_expires() {
        let v = Verifier::new(TokenSettings {
            issuers: Vec::new(),
            jwks: None,
            hs256_secret: None,
            leeway: Duration::from_secs(60),
            insecure_skip_validation: false,
        });
        let identity = Arc::new(
            identity_from_claims(
                claims_from_json(serde_json::json!({})).unwrap(),
                CallerKind::Hs256,
            )
            .unwrap(),
        );
        v.remember([1; 32], identity, u64::MAX, 1000);
        assert!(v.remembered(&[1; 32], 2000).is_some());
    }
}
