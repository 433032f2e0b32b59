//! `hoard doctor`: run on a runner machine or in a job step, it says why caching does or does
//! not work there. It reads the environment as the clients do ([`plan`]), then asks the server
//! ([`probe`]): does it answer, is the clock close, is the token accepted, does a tiny entry
//! save, restore and match. Each finding comes with the exact fix. The token is never printed.

mod plan;
mod probe;
mod trust;

use std::fmt::Write as _;
use std::time::Duration;

pub use plan::{Env, Plan, Protocol};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Ok,
    Warn,
    Fail,
}

/// One thing found, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub severity: Severity,
    pub what: String,
    pub fix: Option<String>,
}

impl Finding {
    pub fn ok(what: impl Into<String>) -> Self {
        Self {
            severity: Severity::Ok,
            what: what.into(),
            fix: None,
        }
    }

    pub fn warn(what: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            severity: Severity::Warn,
            what: what.into(),
            fix: Some(fix.into()),
        }
    }

    pub fn fail(what: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            severity: Severity::Fail,
            what: what.into(),
            fix: Some(fix.into()),
        }
    }
}

/// Everything found, in the order it was checked.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn failed(&self) -> bool {
        self.findings.iter().any(|f| f.severity == Severity::Fail)
    }

    /// The report as printed: one line per finding, its fix indented below.
    pub fn render(&self) -> String {
        self.render_as(
            "hoard doctor: what a cache client in this environment will do",
            "caching works here",
            "caching will not work here until the failures above are fixed",
        )
    }

    /// The report under `title`, ending with `works` or `broken`.
    pub fn render_as(&self, title: &str, works: &str, broken: &str) -> String {
        let mut out = format!("{title}\n");
        for f in &self.findings {
            let mark = match f.severity {
                Severity::Ok => "ok  ",
                Severity::Warn => "warn",
                Severity::Fail => "FAIL",
            };
            let _ = writeln!(out, "  {mark} {}", f.what);
            if let Some(fix) = &f.fix {
                let _ = writeln!(out, "       fix: {fix}");
            }
        }
        let verdict = if self.failed() { broken } else { works };
        let _ = writeln!(out, "{verdict}");
        out
    }
}

/// Reads the environment, then checks the server it names (each request within `timeout`).
pub async fn run(env: Env, timeout: Duration) -> Report {
    let plan = plan::plan(&env);
    let mut findings = plan.findings.clone();
    if let (Some(base), Some(token)) = (&plan.base, &env.token) {
        let extra_ca_certs = env.extra_ca_certs.as_deref();
        findings.extend(probe::probe(plan.protocol, base, token, extra_ca_certs, timeout).await);
    }
    Report { findings }
}
