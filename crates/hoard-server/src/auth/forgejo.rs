//! The Forgejo runner's cache proxy (`act/cacheproxy`): hoard stands where
//! `forgejo-runner cache-server` stands. The proxy forwards each job's v1 calls with
//! `Forgejo-Cache-*` headers and a MAC over them, made with the secret it shares with the
//! cache server:
//!
//! `hex(HMAC-SHA256(secret, repo ">" run_number ">" timestamp ">" write_isolation_key))`
//!
//! Entries belong to the repository. A job with a write-isolation key (an unmerged pull
//! request) writes under that key and reads it first, then the shared namespace; other jobs
//! read and write the shared namespace.

use std::time::Duration;

use axum::http::HeaderMap;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::token::Identity;
use crate::model::{CallerKind, Provenance, RepoId, Scope};

pub const MAC_HEADER: &str = "forgejo-cache-mac";

/// How a Forgejo request is checked.
#[derive(Debug, Clone)]
pub struct ForgejoSettings {
    pub secret: crate::secret::Secret,
    /// How old a run's timestamp may be (a run's calls all carry its start time).
    pub max_age: Duration,
    /// How far in the future a timestamp may be (clock skew between runner and hoard).
    pub leeway: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForgejoError {
    #[error("Forgejo cache headers are not accepted here (no --forgejo-cache-secret-file)")]
    NotConfigured,
    #[error("the Forgejo-Cache-{0} header is missing or malformed")]
    Header(&'static str),
    #[error("the Forgejo cache MAC does not verify")]
    BadMac,
    #[error("the Forgejo run's timestamp is too old or in the future")]
    Stale,
}

/// A Forgejo proxy's request, as its headers describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForgejoRun {
    pub repository: String,
    pub run_number: String,
    pub timestamp: String,
    pub isolation_key: String,
    /// The proxy's own address and the job's id on it: downloads go back through them.
    pub proxy_url: Option<String>,
    pub run_id: Option<String>,
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Whether a request comes through a Forgejo proxy (it carries a MAC header).
pub fn is_forgejo(headers: &HeaderMap) -> bool {
    headers.contains_key(MAC_HEADER)
}

/// Reads and checks a Forgejo proxy's headers at `now` (Unix seconds).
pub fn verify(
    settings: &ForgejoSettings,
    headers: &HeaderMap,
    now: u64,
) -> Result<(Identity, ForgejoRun), ForgejoError> {
    let required = |name: &'static str, short: &'static str| {
        header(headers, name)
            .filter(|v| !v.is_empty() && v.len() <= 512)
            .ok_or(ForgejoError::Header(short))
    };
    let run = ForgejoRun {
        repository: required("forgejo-cache-repo", "Repo")?.to_owned(),
        run_number: header(headers, "forgejo-cache-runnumber")
            .unwrap_or("")
            .to_owned(),
        timestamp: required("forgejo-cache-timestamp", "Timestamp")?.to_owned(),
        isolation_key: header(headers, "forgejo-cache-writeisolationkey")
            .unwrap_or("")
            .to_owned(),
        proxy_url: header(headers, "forgejo-cache-host")
            .filter(|h| is_proxy_url(h))
            .map(|h| h.trim_end_matches('/').to_owned()),
        run_id: header(headers, "forgejo-cache-runid")
            .filter(|id| {
                !id.is_empty()
                    && id.len() <= 64
                    && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            })
            .map(str::to_owned),
    };
    let mac = required(MAC_HEADER, "MAC")?;
    let expected = hex::decode(mac).map_err(|_| ForgejoError::BadMac)?;
    let mut hmac = Hmac::<Sha256>::new_from_slice(settings.secret.expose())
        .map_err(|_| ForgejoError::NotConfigured)?;
    for (i, part) in [
        &run.repository,
        &run.run_number,
        &run.timestamp,
        &run.isolation_key,
    ]
    .into_iter()
    .enumerate()
    {
        if i > 0 {
            hmac.update(b">");
        }
        hmac.update(part.as_bytes());
    }
    hmac.verify_slice(&expected)
        .map_err(|_| ForgejoError::BadMac)?;
    // Checked after the MAC, so that a forged request learns nothing about timestamps.
    let started: u64 = run
        .timestamp
        .parse()
        .map_err(|_| ForgejoError::Header("Timestamp"))?;
    if started > now.saturating_add(settings.leeway.as_secs())
        || now.saturating_sub(started) > settings.max_age.as_secs()
    {
        return Err(ForgejoError::Stale);
    }
    Ok((identity(&run), run))
}

fn identity(run: &ForgejoRun) -> Identity {
    let shared = Scope::new("");
    let (read_scopes, write_scope) = if run.isolation_key.is_empty() {
        (vec![shared.clone()], shared)
    } else {
        let isolated = Scope::new(run.isolation_key.clone());
        (vec![isolated.clone(), shared], isolated)
    };
    Identity {
        repository: RepoId::new(format!("forgejo:{}", run.repository)),
        repository_name: run.repository.clone(),
        read_scopes,
        write_scope: Some(write_scope),
        kind: CallerKind::Forgejo,
        issuer: String::new(),
        subject: Provenance::clip(&format!("forgejo:{}", run.repository)),
        run_id: Provenance::clip(&run.run_number),
        job_id: Provenance::clip(run.run_id.as_deref().unwrap_or_default()),
    }
}

/// An http(s) URL (the proxy's origin, or the runner's `actions_cache_url_override`, which may
/// have a path) with nothing that could change the structure of a URL built on it.
fn is_proxy_url(raw: &str) -> bool {
    let Some(rest) = raw
        .strip_prefix("http://")
        .or_else(|| raw.strip_prefix("https://"))
    else {
        return false;
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let authority_ok = !authority.is_empty()
        && authority.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']' | b'_')
        });
    let path_ok = path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'~' | b'/'));
    authority_ok && path_ok && raw.len() <= 512
}

/// The MAC the proxy computes (Forgejo's `ComputeMac`), for tests and tools.
pub fn compute_mac(
    secret: &[u8],
    repository: &str,
    run_number: &str,
    timestamp: &str,
    isolation_key: &str,
) -> String {
    let Ok(mut hmac) = Hmac::<Sha256>::new_from_slice(secret) else {
        return String::new();
    };
    hmac.update(format!("{repository}>{run_number}>{timestamp}>{isolation_key}").as_bytes());
    hex::encode(hmac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const SECRET: &[u8] = b"forgejo-shared-secret";
    const NOW: u64 = 1_800_000_000;

    fn settings() -> ForgejoSettings {
        ForgejoSettings {
            secret: crate::secret::Secret::new(SECRET),
            max_age: Duration::from_secs(24 * 3600),
            leeway: Duration::from_secs(60),
        }
    }

    fn headers(repo: &str, ts: u64, isolation: &str, mac: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        let mut set = |name: &'static str, value: &str| {
            h.insert(name, HeaderValue::from_str(value).unwrap());
        };
        set("forgejo-cache-repo", repo);
        set("forgejo-cache-runnumber", "12");
        set("forgejo-cache-runid", "ab12cd34");
        set("forgejo-cache-timestamp", &ts.to_string());
        set("forgejo-cache-host", "http://10.0.0.7:40123");
        set(MAC_HEADER, mac);
        if !isolation.is_empty() {
            set("forgejo-cache-writeisolationkey", isolation);
        }
        h
    }

    fn signed(repo: &str, ts: u64, isolation: &str) -> HeaderMap {
        let mac = compute_mac(SECRET, repo, "12", &ts.to_string(), isolation);
        headers(repo, ts, isolation, &mac)
    }

    #[test]
    fn the_mac_is_forgejos() {
        // Forgejo's ComputeMac writes the parts with ">" between them, hex-encoded.
        let mac = compute_mac(b"secret", "owner/repo", "1", "1700000000", "");
        let mut h = Hmac::<Sha256>::new_from_slice(b"secret").unwrap();
        h.update(b"owner/repo>1>1700000000>");
        assert_eq!(mac, hex::encode(h.finalize().into_bytes()));
    }

    #[test]
    fn a_good_mac_names_the_repository_and_its_isolation() {
        let (id, run) = verify(&settings(), &signed("o/r", NOW - 60, ""), NOW).unwrap();
        assert_eq!(id.repository.as_str(), "forgejo:o/r");
        assert_eq!(id.read_scopes, [Scope::new("")]);
        assert_eq!(id.write_scope, Some(Scope::new("")));
        assert_eq!(run.proxy_url.as_deref(), Some("http://10.0.0.7:40123"));
        assert_eq!(run.run_id.as_deref(), Some("ab12cd34"));

        let pr = "refs/pull/3/head";
        let (id, _) = verify(&settings(), &signed("o/r", NOW, pr), NOW).unwrap();
        assert_eq!(id.read_scopes, [Scope::new(pr), Scope::new("")]);
        assert_eq!(id.write_scope, Some(Scope::new(pr)));
    }

    #[test]
    fn bad_macs_and_stale_runs_are_refused() {
        let s = settings();
        let mut forged = signed("o/r", NOW, "");
        forged.insert("forgejo-cache-repo", HeaderValue::from_static("o/other"));
        assert_eq!(verify(&s, &forged, NOW).unwrap_err(), ForgejoError::BadMac);
        let mut dropped_isolation = signed("o/r", NOW, "refs/pull/3/head");
        dropped_isolation.remove("forgejo-cache-writeisolationkey");
        assert_eq!(
            verify(&s, &dropped_isolation, NOW).unwrap_err(),
            ForgejoError::BadMac
        );
        assert_eq!(
            verify(&s, &headers("o/r", NOW, "", "zz"), NOW).unwrap_err(),
            ForgejoError::BadMac
        );
        let old = NOW - 24 * 3600 - 1;
        assert_eq!(
            verify(&s, &signed("o/r", old, ""), NOW).unwrap_err(),
            ForgejoError::Stale
        );
        assert_eq!(
            verify(&s, &signed("o/r", NOW + 3600, ""), NOW).unwrap_err(),
            ForgejoError::Stale
        );
        let mut no_repo = signed("o/r", NOW, "");
        no_repo.remove("forgejo-cache-repo");
        assert_eq!(
            verify(&s, &no_repo, NOW).unwrap_err(),
            ForgejoError::Header("Repo")
        );
    }

    #[test]
    fn an_odd_proxy_host_is_not_used_in_links() {
        let mut h = signed("o/r", NOW, "");
        h.insert(
            "forgejo-cache-host",
            HeaderValue::from_static("http://evil/x?y"),
        );
        let (_, run) = verify(&settings(), &h, NOW).unwrap();
        assert_eq!(run.proxy_url, None);
    }
}
