//! What a cache client in this environment will do, read from its variables the way
//! `@actions/cache` reads them (PROTOCOL.md §1): which protocol, which URL, and what in the
//! environment already stops it. Pure: the checks against the server come after.

use url::Url;

use super::Finding;

/// The environment variables the clients read.
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub results_url: Option<String>,
    pub cache_url: Option<String>,
    pub service_v2: Option<String>,
    pub server_url: Option<String>,
    pub token: Option<String>,
    pub cache_mode: Option<String>,
    /// `NODE_EXTRA_CA_CERTS`: more certificates the Node client trusts.
    pub extra_ca_certs: Option<String>,
}

impl Env {
    /// Reads the variables through `get` (the process environment, in `hoard doctor`).
    pub fn read(get: impl Fn(&str) -> Option<String>) -> Self {
        Self {
            results_url: get("ACTIONS_RESULTS_URL"),
            cache_url: get("ACTIONS_CACHE_URL"),
            service_v2: get("ACTIONS_CACHE_SERVICE_V2"),
            server_url: get("GITHUB_SERVER_URL"),
            token: get("ACTIONS_RUNTIME_TOKEN").filter(|t| !t.is_empty()),
            cache_mode: get("ACTIONS_CACHE_MODE"),
            extra_ca_certs: get("NODE_EXTRA_CA_CERTS"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    V1,
    V2,
}

/// What the client will do.
#[derive(Debug, Clone)]
pub struct Plan {
    pub protocol: Protocol,
    /// Where the client sends its calls: the origin for v2 (the JS client drops the path), the
    /// URL as given for v1 (`<url>_apis/artifactcache/…`). `None` if it has nowhere to go.
    pub base: Option<Url>,
    pub findings: Vec<Finding>,
}

/// `isGhes()`: anything but github.com, `*.ghe.com` and `*.localhost`.
fn is_ghes(server_url: Option<&str>) -> bool {
    let url = server_url
        .filter(|s| !s.is_empty())
        .unwrap_or("https://github.com");
    let host = Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_ascii_uppercase))
        .unwrap_or_default();
    !(host == "GITHUB.COM" || host.ends_with(".GHE.COM") || host.ends_with(".LOCALHOST"))
}

pub fn plan(env: &Env) -> Plan {
    let mut findings = Vec::new();
    let ghes = is_ghes(env.server_url.as_deref());
    // JavaScript truthiness: any non-empty string, "false" included.
    let v2_flag = env.service_v2.as_deref().is_some_and(|v| !v.is_empty());
    let protocol = if ghes {
        let server = env.server_url.as_deref().unwrap_or_default();
        let mut finding = Finding::ok(format!(
            "protocol: v1, because GITHUB_SERVER_URL ({server}) is not github.com, *.ghe.com or *.localhost"
        ));
        if v2_flag {
            finding = Finding::warn(
                format!("protocol: v1, whatever ACTIONS_CACHE_SERVICE_V2 says: GITHUB_SERVER_URL ({server}) is not github.com, *.ghe.com or *.localhost, so the client takes it for GitHub Enterprise Server"),
                "on a forge or GHES, point ACTIONS_CACHE_URL at hoard (v1); for v2, the job must run with GITHUB_SERVER_URL=https://github.com",
            );
        }
        findings.push(finding);
        Protocol::V1
    } else if v2_flag {
        let mut finding = Finding::ok("protocol: v2 (ACTIONS_CACHE_SERVICE_V2 is set)");
        if matches!(
            env.service_v2
                .as_deref()
                .map(str::to_ascii_lowercase)
                .as_deref(),
            Some("false" | "0" | "no")
        ) {
            finding = Finding::warn(
                format!(
                    "protocol: v2, because ACTIONS_CACHE_SERVICE_V2={:?} is a non-empty string (the JS client does not parse it; Go clients such as buildx read it as false)",
                    env.service_v2.as_deref().unwrap_or_default()
                ),
                "set ACTIONS_CACHE_SERVICE_V2=true for v2, or leave it unset for v1",
            );
        }
        findings.push(finding);
        Protocol::V2
    } else {
        findings.push(Finding::ok(
            "protocol: v1 (ACTIONS_CACHE_SERVICE_V2 is not set)",
        ));
        Protocol::V1
    };

    let (name, raw) = match protocol {
        Protocol::V2 => ("ACTIONS_RESULTS_URL", env.results_url.clone()),
        Protocol::V1 => match (&env.cache_url, &env.results_url) {
            (Some(url), _) if !url.is_empty() => ("ACTIONS_CACHE_URL", Some(url.clone())),
            (_, Some(url)) if !url.is_empty() => ("ACTIONS_RESULTS_URL", Some(url.clone())),
            _ => ("ACTIONS_CACHE_URL", None),
        },
    };
    let base = match raw.filter(|u| !u.is_empty()) {
        None => {
            findings.push(Finding::fail(
                format!("{name} is not set: the client reports the cache service as unavailable and skips caching"),
                format!("set {name}=http://HOST:3000/ (with the trailing slash) in the runner's environment (its .env file)"),
            ));
            None
        }
        Some(raw) => match Url::parse(&raw) {
            Err(e) => {
                findings.push(Finding::fail(
                    format!("{name}={raw:?} is not a URL ({e})"),
                    format!("set {name}=http://HOST:3000/"),
                ));
                None
            }
            Ok(url) => Some(check_url(name, &raw, url, protocol, &mut findings)),
        },
    };

    if env.token.is_none() {
        findings.push(Finding::fail(
            "ACTIONS_RUNTIME_TOKEN is not set: every call would be refused",
            "the runner sets it for JavaScript action steps only; in a run: step, export it first (for example with crazy-max/ghaction-github-runtime)",
        ));
    }
    match env.cache_mode.as_deref().unwrap_or("") {
        "none" => findings.push(Finding::warn(
            "ACTIONS_CACHE_MODE=none: @actions/cache 6.2+ neither restores nor saves",
            "unset ACTIONS_CACHE_MODE (the job variable actions_cache_mode)",
        )),
        "read" => findings.push(Finding::warn(
            "ACTIONS_CACHE_MODE=read: @actions/cache 6.2+ restores but does not save",
            "unset ACTIONS_CACHE_MODE to save too",
        )),
        "write" | "write-only" => findings.push(Finding::warn(
            "ACTIONS_CACHE_MODE=write-only: @actions/cache 6.2+ saves but does not restore",
            "unset ACTIONS_CACHE_MODE to restore too",
        )),
        _ => {}
    }
    Plan {
        protocol,
        base,
        findings,
    }
}

/// Findings about the URL the client will use, and the base its calls go to.
fn check_url(
    name: &str,
    raw: &str,
    url: Url,
    protocol: Protocol,
    findings: &mut Vec<Finding>,
) -> Url {
    if !matches!(url.scheme(), "http" | "https") {
        findings.push(Finding::fail(
            format!("{name}={raw} is not an http(s) URL"),
            format!("set {name}=http://HOST:3000/"),
        ));
    }
    match protocol {
        Protocol::V1 => {
            if !raw.ends_with('/') {
                findings.push(Finding::fail(
                    format!("{name}={raw} has no trailing slash: the v1 client appends _apis/artifactcache/ as given and calls {raw}_apis/artifactcache/…"),
                    format!("set {name}={raw}/"),
                ));
                // What the client will actually call, so the checks below see what it sees.
                return Url::parse(&format!("{raw}/")).unwrap_or(url);
            }
            url
        }
        Protocol::V2 => {
            if url.path() != "/" {
                findings.push(Finding::warn(
                    format!("{name}={raw} has a path: the JS client drops it and calls {}/twirp/… (buildx and sccache keep it)", url.origin().ascii_serialization()),
                    "serve hoard at the root of its origin and drop the path from the URL",
                ));
            } else if !raw.ends_with('/') {
                findings.push(Finding::warn(
                    format!("{name}={raw} has no trailing slash: sccache appends twirp/… to it as given"),
                    format!("set {name}={raw}/"),
                ));
            }
            let mut origin = url;
            origin.set_path("/");
            origin.set_query(None);
            origin
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Severity;

    fn env(vars: &[(&str, &str)]) -> Env {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env::read(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    fn failures(plan: &Plan) -> Vec<&str> {
        plan.findings
            .iter()
            .filter(|f| f.severity == Severity::Fail)
            .map(|f| f.what.as_str())
            .collect()
    }

    #[test]
    fn github_com_with_the_flag_speaks_v2_to_the_origin() {
        let p = plan(&env(&[
            ("ACTIONS_RESULTS_URL", "http://cache:3000/"),
            ("ACTIONS_CACHE_SERVICE_V2", "True"),
            ("ACTIONS_RUNTIME_TOKEN", "t"),
        ]));
        assert_eq!(p.protocol, Protocol::V2);
        assert_eq!(p.base.unwrap().as_str(), "http://cache:3000/");
        assert!(failures(&plan(&env(&[
            ("ACTIONS_RESULTS_URL", "http://cache:3000/"),
            ("ACTIONS_CACHE_SERVICE_V2", "1"),
            ("ACTIONS_RUNTIME_TOKEN", "t"),
        ])))
        .is_empty());
    }

    #[test]
    fn a_forge_server_url_forces_v1_and_says_so() {
        let p = plan(&env(&[
            ("ACTIONS_RESULTS_URL", "http://cache:3000/"),
            ("ACTIONS_CACHE_URL", "http://cache:3000/ns/"),
            ("ACTIONS_CACHE_SERVICE_V2", "true"),
            ("GITHUB_SERVER_URL", "https://codeberg.org"),
            ("ACTIONS_RUNTIME_TOKEN", "t"),
        ]));
        assert_eq!(p.protocol, Protocol::V1);
        assert_eq!(p.base.unwrap().as_str(), "http://cache:3000/ns/");
        assert!(p.findings[0].what.contains("GITHUB_SERVER_URL"));
        assert_eq!(p.findings[0].severity, Severity::Warn);
        for host in [
            "https://github.com",
            "https://acme.ghe.com",
            "http://gh.localhost",
        ] {
            let p = plan(&env(&[
                ("ACTIONS_CACHE_SERVICE_V2", "true"),
                ("GITHUB_SERVER_URL", host),
            ]));
            assert_eq!(p.protocol, Protocol::V2, "{host}");
        }
    }

    #[test]
    fn a_v1_url_without_its_trailing_slash_is_a_failure() {
        let p = plan(&env(&[
            ("ACTIONS_CACHE_URL", "http://cache:3000/ns"),
            ("ACTIONS_RUNTIME_TOKEN", "t"),
        ]));
        let fails = failures(&p);
        assert_eq!(fails.len(), 1, "{fails:?}");
        assert!(
            fails[0].contains("http://cache:3000/ns_apis/artifactcache/"),
            "{fails:?}"
        );
        assert_eq!(p.base.unwrap().as_str(), "http://cache:3000/ns/");
    }

    #[test]
    fn missing_urls_and_tokens_are_failures() {
        let p = plan(&env(&[("ACTIONS_CACHE_SERVICE_V2", "true")]));
        let fails = failures(&p);
        assert!(fails
            .iter()
            .any(|f| f.starts_with("ACTIONS_RESULTS_URL is not set")));
        assert!(fails
            .iter()
            .any(|f| f.starts_with("ACTIONS_RUNTIME_TOKEN is not set")));
        assert!(p.base.is_none());
        let p = plan(&env(&[
            ("ACTIONS_RESULTS_URL", "not a url"),
            ("ACTIONS_RUNTIME_TOKEN", "t"),
        ]));
        assert!(failures(&p)[0].contains("is not a URL"));
    }

    #[test]
    fn a_false_flag_still_selects_v2_in_javascript() {
        let p = plan(&env(&[
            ("ACTIONS_RESULTS_URL", "http://cache:3000/"),
            ("ACTIONS_CACHE_SERVICE_V2", "false"),
            ("ACTIONS_RUNTIME_TOKEN", "t"),
        ]));
        assert_eq!(p.protocol, Protocol::V2);
        assert_eq!(p.findings[0].severity, Severity::Warn);
    }
}
