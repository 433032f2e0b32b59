//! `hoard caches ls|rm|usage` and `hoard status`: the admin API from a shell. Readable tables by
//! default, `--json` for scripts (the API's own answers); on failure, one sentence on standard
//! error and exit status 1. Answers are read into the server's own types ([`wire`]).

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use serde::Serialize;

use hoard_model::admin_wire as wire;
use hoard_model::TermSafe;

/// Where the server is and how to sign in to it.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerArgs {
    /// The hoard server's base URL.
    #[arg(
        long,
        env = "HOARD_SERVER",
        default_value = "http://127.0.0.1:3000",
        global = true
    )]
    pub server: String,

    /// File holding the admin token [default: the HOARD_ADMIN_TOKEN variable].
    #[arg(long, env = "HOARD_ADMIN_TOKEN_FILE", global = true)]
    pub token_file: Option<std::path::PathBuf>,

    /// Print the API's JSON answer instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum CachesCommand {
    /// List cache entries, most recently used first.
    Ls(Box<ListArgs>),
    /// Everything about one entry, including who wrote it.
    Show {
        /// The entry's id (as `ls` shows it).
        id: i64,
    },
    /// Delete or quarantine entries: by id, or every entry a filter selects.
    Rm(Box<RemoveArgs>),
    /// Save an entry's archive, live or in quarantine, to a file for examination (every chunk
    /// is checked on the way, as for any download).
    Download {
        /// The entry's id (as `ls` shows it).
        id: i64,
        /// The file to write.
        #[arg(long, short = 'o')]
        output: std::path::PathBuf,
    },
    /// Which jobs restored the entries a writer filter selects (the blast radius of a writer,
    /// such as `--run-id` of a compromised run), from the restore records: kept through a
    /// purge or a quarantine of the entries.
    Restorers(Box<FilterArgs>),
    /// Make the entries of one ref readable in another ref of the same repository (a merge
    /// queue's branch in its base branch, a merged pull request's ref in its base), as entries of
    /// their own over the same bytes: what hoard does on GitHub's webhooks, by hand. The target
    /// ref's write policy and its entries win. Undo with `rm --promoted-by <the id printed>`.
    Promote(Box<PromoteArgs>),
    /// Put a quarantined entry back: lookups find it again.
    Release {
        /// The entry's id (as `ls --state quarantined` shows it).
        id: i64,
    },
    /// Hit ratio, misses and bytes per key family over a period, most misses first, each
    /// with its trend.
    Stats(Box<StatsArgs>),
    /// Bytes, entries, hits and misses per repository, largest first.
    Usage {
        /// Only this repository (owner/name or id).
        #[arg(long)]
        repository: Option<String>,
        /// Most repositories shown.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum TokensCommand {
    /// A token that reads one ref of one repository (and writes there with --write) at hoard's
    /// build-tool endpoints: printed alone, for `export TURBO_TOKEN=$(hoard tokens create …)`.
    Create(Box<TokenArgs>),
}

/// What `hoard tokens create` asks for.
#[derive(Debug, Clone, clap::Args)]
pub struct TokenArgs {
    /// The repository (owner/name or id).
    #[arg(long)]
    pub repository: String,
    /// The ref it reads, and writes with --write [default: refs/heads/main].
    #[arg(long = "ref")]
    pub scope: Option<String>,
    /// Also write into that ref (a token for a machine that builds the default branch).
    #[arg(long)]
    pub write: bool,
    /// How long it lives, such as 12h or 30d (at most 366d) [default: 30d].
    #[arg(long)]
    pub ttl: Option<String>,
    /// Who it is for: its writes record developer:<SUBJECT> as their writer.
    #[arg(long)]
    pub subject: Option<String>,
}

/// Runs `hoard tokens …`; returns what to print.
pub async fn tokens(server: &ServerArgs, command: &TokensCommand) -> Result<String, CliError> {
    let client = Client::new(server)?;
    let TokensCommand::Create(args) = command;
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    query.append_pair("repository", &args.repository);
    for (name, value) in [
        ("ref", &args.scope),
        ("ttl", &args.ttl),
        ("subject", &args.subject),
    ] {
        if let Some(value) = value {
            query.append_pair(name, value);
        }
    }
    if args.write {
        query.append_pair("write", "true");
    }
    let answer: wire::ToolToken = client
        .call(reqwest::Method::POST, &format!("tokens?{}", query.finish()))
        .await?;
    if server.json {
        return Ok(pretty(&answer));
    }
    // The token alone on standard output; what it may do on standard error, for people.
    let what = match &answer.write_ref {
        Some(scope) => format!("reads and writes {}", TermSafe(scope)),
        None => format!(
            "reads {} (read-only)",
            TermSafe(&answer.read_refs.join(", "))
        ),
    };
    let repository = if answer.repository.is_empty() {
        &answer.repository_id
    } else {
        &answer.repository
    };
    eprintln!(
        "A token for {}: {what}, until {}.",
        TermSafe(repository),
        TermSafe(&answer.expires_at)
    );
    Ok(format!("{}\n", answer.token))
}

/// What `hoard caches promote` promotes.
#[derive(Debug, Clone, clap::Args)]
pub struct PromoteArgs {
    /// The repository (owner/name or id).
    #[arg(long)]
    pub repository: String,
    /// The ref whose entries are promoted (such as refs/heads/gh-readonly-queue/main/pr-7-…).
    #[arg(long = "from-scope", visible_alias = "from-ref")]
    pub from_scope: String,
    /// The ref they become readable in (such as refs/heads/main).
    #[arg(long = "to-scope", visible_alias = "to-ref")]
    pub to_scope: String,
    /// Change nothing; print what would be promoted.
    #[arg(long)]
    pub dry_run: bool,
}

/// What `hoard caches stats` shows.
#[derive(Debug, Clone, clap::Args)]
pub struct StatsArgs {
    /// Only this repository (owner/name or id) [default: every repository].
    #[arg(long)]
    pub repository: Option<String>,
    /// The period: a duration back from now (24h, 7d, 30d), or an RFC 3339 time.
    #[arg(long, default_value = "7d")]
    pub since: String,
    /// Only this class of refs: default_branch, other_branch, pull_request or tag.
    #[arg(long)]
    pub scope_class: Option<String>,
    /// Rank by misses, bytes (stored) or lookups.
    #[arg(long, default_value = "misses")]
    pub sort: String,
    /// Most families shown.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
}

/// What selects entries.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct FilterArgs {
    /// Entries whose key starts with this (case-insensitive).
    #[arg(long)]
    pub key: Option<String>,
    /// Entries of this repository (owner/name or id).
    #[arg(long)]
    pub repository: Option<String>,
    /// Entries saved in this ref, the scope (such as refs/heads/main).
    #[arg(long = "ref", visible_alias = "scope")]
    pub git_ref: Option<String>,
    /// Entries of this exact version.
    #[arg(long)]
    pub version: Option<String>,
    /// Entries written by this workflow run (`written_by.run_id`).
    #[arg(long)]
    pub run_id: Option<String>,
    /// Entries written by callers with this token subject (`written_by.subject`).
    #[arg(long)]
    pub subject: Option<String>,
    /// Entries written by this kind of caller: github, ghes, hs256, forgejo, namespace,
    /// anonymous or developer (a token from `hoard tokens create`).
    #[arg(long)]
    pub kind: Option<String>,
    /// Entries written at or after this time (RFC 3339, such as 2026-05-04T12:00:00Z).
    #[arg(long)]
    pub written_after: Option<String>,
    /// Entries written before this time (RFC 3339).
    #[arg(long)]
    pub written_before: Option<String>,
    /// Entries whose archive has this digest (sha256:… or sha256-chunks:…, as `show` prints
    /// it): the same bytes under every key and run that saved them.
    #[arg(long)]
    pub digest: Option<String>,
    /// Live entries, or those in quarantine (`quarantined`).
    #[arg(long, value_parser = ["live", "quarantined"])]
    pub state: Option<String>,
    /// Entries made by one promotion (`promoted.by`: a webhook delivery's id, or the
    /// `admin:…` id `promote` printed).
    #[arg(long)]
    pub promoted_by: Option<String>,
}

impl FilterArgs {
    /// The set parts, as the admin API names them.
    fn pairs(&self) -> [(&'static str, &Option<String>); 12] {
        [
            ("key", &self.key),
            ("repository", &self.repository),
            ("ref", &self.git_ref),
            ("version", &self.version),
            ("run_id", &self.run_id),
            ("subject", &self.subject),
            ("kind", &self.kind),
            ("written_after", &self.written_after),
            ("written_before", &self.written_before),
            ("digest", &self.digest),
            ("state", &self.state),
            ("promoted_by", &self.promoted_by),
        ]
    }

    /// Whether a part that selects entries is set (the state alone selects a whole state).
    fn is_set(&self) -> bool {
        self.pairs()
            .iter()
            .any(|(name, v)| *name != "state" && v.is_some())
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Sort by last use, size or creation.
    #[arg(long, default_value = "last-used", value_parser = ["last-used", "size", "created"])]
    pub sort: String,
    /// Smallest or oldest first.
    #[arg(long)]
    pub asc: bool,
    /// Most entries shown.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    /// Also show who wrote each entry: kind, subject, run, job, address, and when.
    #[arg(long, short = 'l')]
    pub long: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RemoveArgs {
    /// Ids of the entries to delete (as `ls` shows them).
    pub ids: Vec<i64>,
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Delete every entry (when no id or filter is given).
    #[arg(long)]
    pub all: bool,
    /// Delete nothing: say what would be deleted.
    #[arg(long)]
    pub dry_run: bool,
    /// Quarantine instead of deleting: the entries leave every lookup at once, and stay with
    /// their bytes and restore records for `--quarantine-retention`, to download and examine
    /// (`hoard caches download`) or release (`hoard caches release`).
    #[arg(long)]
    pub quarantine: bool,
    /// Delete the entries' restore records too (who restored them), which are otherwise kept
    /// for their retention after the entries go. Not with `--quarantine`.
    #[arg(long, conflicts_with = "quarantine")]
    pub with_restore_records: bool,
}

/// A failure, as the one sentence the user sees.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CliError(String);

struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    fn new(args: &ServerArgs) -> Result<Self, CliError> {
        let token = match &args.token_file {
            Some(path) => std::fs::read_to_string(path).map_err(|e| {
                CliError(format!(
                    "cannot read the admin token file {}: {e}",
                    path.display()
                ))
            })?,
            None => std::env::var("HOARD_ADMIN_TOKEN").map_err(|_| {
                CliError("no admin token: set HOARD_ADMIN_TOKEN or pass --token-file".into())
            })?,
        };
        let token = token.trim().to_owned();
        if token.is_empty() {
            return Err(CliError("the admin token is empty".into()));
        }
        let base = args.server.trim_end_matches('/').to_owned();
        let url = url::Url::parse(&base)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| {
                CliError(format!(
                    "--server (HOARD_SERVER) must be an http(s) URL, not {base:?}"
                ))
            })?;
        // The admin API is at the root; a path is a runner's prefix (a namespace's secret, a
        // proxy's route), where the admin token does not belong.
        if url.path() != "/" || url.query().is_some() {
            return Err(CliError(format!(
                "--server (HOARD_SERVER) must be the server's origin, such as {}, without a path (the admin API is at its root)",
                url.origin().ascii_serialization()
            )));
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(300))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| CliError(format!("cannot make an HTTP client: {e}")))?;
        Ok(Self { http, base, token })
    }

    /// Calls the admin API; any answer but 200 is an error carrying the server's message.
    async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path_and_query: &str,
    ) -> Result<T, CliError> {
        let response = self.send(method, path_and_query).await?;
        let status = response.status();
        let body = response.bytes().await.unwrap_or_default();
        serde_json::from_slice(&body).map_err(|_| {
            CliError(format!(
                "{} answered {status} but not with the admin API's JSON: is it a hoard server?",
                self.base
            ))
        })
    }

    /// A successful answer of the admin API, its body not read yet (an archive is streamed).
    async fn send(
        &self,
        method: reqwest::Method,
        path_and_query: &str,
    ) -> Result<reqwest::Response, CliError> {
        let url = format!("{}/_hoard/api/v1/{path_and_query}", self.base);
        let response = self
            .http
            .request(method, &url)
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| {
                CliError(format!(
                    "cannot reach hoard at {}: {}",
                    self.base,
                    root_cause(&e)
                ))
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.bytes().await.unwrap_or_default();
        let error = serde_json::from_slice::<wire::ErrorMessage>(&body).ok();
        // The server's words may quote what a client chose.
        let message = TermSafe(
            error
                .as_ref()
                .map_or("no explanation given", |e| e.message.as_str()),
        );
        Err(CliError(match status.as_u16() {
            401 => format!("{} refused the admin token ({message})", self.base),
            _ => format!("{} answered {status}: {message}", self.base),
        }))
    }
}

/// The innermost error: "Connection refused", not reqwest's wrapping of it.
fn root_cause(e: &dyn std::error::Error) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// The families `hoard caches stats` asks for: `--limit`, at most 1,000, and few enough that
/// rows × buckets of the period stay within the server's ceiling of trend points (the server
/// picks hours up to 48 h, days beyond).
fn families_within_ceiling(args: &StatsArgs) -> usize {
    use hoard_model::stats::{trend_bucket, MAX_FAMILY_ROWS, MAX_TREND_POINTS};
    let length = humantime::parse_duration(&args.since).ok().or_else(|| {
        let at = humantime::parse_rfc3339_weak(&args.since).ok()?;
        std::time::SystemTime::now().duration_since(at).ok()
    });
    // The server refuses what it cannot read; the limit does not matter then.
    let buckets = length.map_or(1, |d| {
        let length = d.as_millis().min(i64::MAX as u128 / 2) as u64;
        let width = trend_bucket(length as i64).millis() as u64;
        length.div_ceil(width) + 1
    });
    let within = MAX_TREND_POINTS as u64 / buckets.max(1);
    args.limit
        .clamp(1, MAX_FAMILY_ROWS)
        .min(within.max(1) as usize)
}

/// `key=value&…` of the filter's set parts, percent-encoded.
fn filter_query(filter: &FilterArgs) -> url::form_urlencoded::Serializer<'static, String> {
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    for (name, value) in filter.pairs() {
        if let Some(value) = value {
            query.append_pair(name, value);
        }
    }
    query
}

/// Runs `hoard caches …`; returns what to print.
pub async fn caches(server: &ServerArgs, command: &CachesCommand) -> Result<String, CliError> {
    let client = Client::new(server)?;
    match command {
        CachesCommand::Ls(args) => list(&client, server.json, args).await,
        CachesCommand::Rm(args) => remove(&client, server.json, args).await,
        CachesCommand::Download { id, output } => download(&client, *id, output).await,
        CachesCommand::Restorers(filter) => restorers(&client, server.json, filter).await,
        CachesCommand::Promote(args) => promote(&client, server.json, args).await,
        CachesCommand::Release { id } => {
            let entry: wire::CacheDetail = client
                .call(reqwest::Method::POST, &format!("caches/{id}/release"))
                .await?;
            Ok(if server.json {
                pretty(&entry)
            } else {
                format!("Released entry {id}: lookups find it again.\n") + &entry_text(&entry.cache)
            })
        }
        CachesCommand::Show { id } => {
            let entry: wire::CacheDetail = client
                .call(reqwest::Method::GET, &format!("caches/{id}"))
                .await?;
            Ok(if server.json {
                pretty(&entry)
            } else {
                entry_text(&entry.cache) + &restored_text(&entry.restored_by)
            })
        }
        CachesCommand::Stats(args) => {
            let mut query = url::form_urlencoded::Serializer::new(String::new());
            query
                .append_pair("since", &args.since)
                .append_pair("sort", &args.sort)
                .append_pair("limit", &families_within_ceiling(args).to_string());
            for (name, value) in [
                ("repository", &args.repository),
                ("scope_class", &args.scope_class),
            ] {
                if let Some(value) = value {
                    query.append_pair(name, value);
                }
            }
            let families: wire::Families = client
                .call(
                    reqwest::Method::GET,
                    &format!("stats/families?{}", query.finish()),
                )
                .await?;
            Ok(if server.json {
                pretty(&families)
            } else {
                families_table(&families, args.repository.is_none())
            })
        }
        CachesCommand::Usage { repository, limit } => {
            let mut query = url::form_urlencoded::Serializer::new(String::new());
            query.append_pair("limit", &limit.clamp(&1, &1000).to_string());
            if let Some(r) = repository {
                query.append_pair("repository", r);
            }
            let usage: wire::Usage = client
                .call(reqwest::Method::GET, &format!("usage?{}", query.finish()))
                .await?;
            Ok(if server.json {
                pretty(&usage)
            } else {
                usage_table(&usage)
            })
        }
    }
}

/// Runs `hoard status`; returns what to print.
pub async fn status(server: &ServerArgs) -> Result<String, CliError> {
    let client = Client::new(server)?;
    let status: wire::Status = client.call(reqwest::Method::GET, "status").await?;
    if server.json {
        return Ok(pretty(&status));
    }
    // The status carries the policy; a server from before that is asked for it, and one from
    // before write policies has no `policy` endpoint: the lines are left out.
    let policy = match &status.policy {
        Some(policy) => Some(policy.clone()),
        None => client
            .call::<wire::Policy>(reqwest::Method::GET, "policy")
            .await
            .ok(),
    };
    Ok(status_text(&status, policy.as_ref()))
}

/// `hoard status`'s lines on the write policy in force: its file and load time, then a
/// failed last load and a file on disk that differs, if so.
fn policy_line(policy: &wire::Policy) -> String {
    let (Some(source), Some(at)) = (&policy.source, &policy.loaded_at) else {
        return "policy     none (every token may do what it grants)\n".to_owned();
    };
    let mut out = format!(
        "policy     {} rules from {}, loaded {at}\n",
        policy.rules.len(),
        TermSafe(source)
    );
    if let Some(attempt) = policy.last_attempt.as_ref().filter(|a| a.outcome != "ok") {
        let _ = writeln!(
            out,
            "           last load {} at {}: {}; the rules above stay in force",
            attempt.outcome,
            attempt.at,
            TermSafe(attempt.error.as_deref().unwrap_or("no reason given"))
        );
    }
    if policy.differs_from_file == Some(true) {
        let since = policy
            .file_changed_at
            .as_deref()
            .map(|at| format!(" (changed {at})"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "           the file on disk differs from the policy in force{since}"
        );
    }
    out
}

async fn list(client: &Client, json: bool, args: &ListArgs) -> Result<String, CliError> {
    let sort = match args.sort.as_str() {
        "size" => "size_in_bytes",
        "created" => "created_at",
        _ => "last_accessed_at",
    };
    let limit = args.limit.max(1);
    let mut entries: Vec<wire::Cache> = Vec::new();
    let mut cursor: Option<String> = None;
    let mut total;
    // Pages until `limit` entries or the end.
    loop {
        let mut query = filter_query(&args.filter);
        query
            .append_pair("sort", sort)
            .append_pair("direction", if args.asc { "asc" } else { "desc" })
            .append_pair("per_page", &(limit - entries.len()).min(1000).to_string());
        if let Some(c) = &cursor {
            query.append_pair("cursor", c);
        }
        let page: wire::CacheList = client
            .call(reqwest::Method::GET, &format!("caches?{}", query.finish()))
            .await?;
        total = page.total_count;
        entries.extend(page.actions_caches);
        cursor = page.next_cursor;
        if cursor.is_none() || entries.len() >= limit {
            break;
        }
    }
    if json {
        return Ok(pretty(&Listed {
            total_count: total,
            actions_caches: entries,
        }));
    }
    if entries.is_empty() {
        return Ok("No cache entries match.\n".into());
    }
    let now = SystemTime::now();
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            let mut row = vec![
                e.id.to_string(),
                repository_label(&e.repository, &e.repository_id),
                e.git_ref.clone(),
                e.key.clone(),
                size(e.size_in_bytes),
                ago(&e.last_accessed_at, now),
                e.hits.to_string(),
            ];
            if let Some(at) = &e.quarantined_at {
                row.push(ago(at, now));
                row.push(e.quarantine_reason.clone().unwrap_or_default());
            }
            if args.long {
                row.extend(writer_cells(e));
            }
            row
        })
        .collect();
    let quarantined = entries.iter().any(|e| e.quarantined_at.is_some());
    let mut header = vec![
        "ID",
        "REPOSITORY",
        "REF",
        "KEY",
        "SIZE",
        "LAST USED",
        "HITS",
    ];
    if quarantined {
        header.extend(["QUARANTINED", "REASON"]);
    }
    if args.long {
        header.extend(["WRITTEN", "KIND", "SUBJECT", "RUN", "JOB", "ADDRESS"]);
    }
    let mut out = table(&header, &rows);
    let _ = writeln!(out, "{} of {total} entries", entries.len());
    Ok(out)
}

async fn remove(client: &Client, json: bool, args: &RemoveArgs) -> Result<String, CliError> {
    let has_filter = args.filter.is_set();
    let answer = match (args.ids.is_empty(), has_filter || args.all) {
        (false, false) => remove_ids(client, &args.ids, args).await?,
        (true, true) => {
            let mut query = filter_query(&args.filter);
            if args.all && !has_filter {
                query.append_pair("all", "true");
            }
            if args.dry_run {
                query.append_pair("dry_run", "true");
            }
            if args.quarantine {
                query.append_pair("quarantine", "true");
            }
            if args.with_restore_records {
                query.append_pair("restores", "true");
            }
            client
                .call(reqwest::Method::DELETE, &format!("caches?{}", query.finish()))
                .await?
        }
        (false, true) => {
            return Err(CliError("give entry ids or a filter (--key, --repository, --ref, --version, --run-id, --subject, --kind, --written-after, --written-before, --all), not both".into()))
        }
        (true, false) => {
            return Err(CliError("say what to delete: entry ids, a filter (--key, --repository, --ref, --version, --run-id, --subject, --kind, --written-after, --written-before) or --all".into()))
        }
    };
    if json {
        return Ok(pretty(&answer));
    }
    let records = match answer.restore_records_deleted {
        None => String::new(),
        Some(1) => ", with 1 restore record".to_owned(),
        Some(n) => format!(", with {n} restore records"),
    };
    let count = answer.deleted;
    let noun = if count == 1 { "entry" } else { "entries" };
    let ids = answer
        .ids
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let ids = match (ids.is_empty(), answer.ids_truncated) {
        (true, _) => String::new(),
        (false, false) => format!(": {ids}"),
        (false, true) => format!(": {ids}, … (the first {})", answer.ids.len()),
    };
    let uploads = match answer.uploads_aborted {
        0 => String::new(),
        1 => " and 1 open upload".to_owned(),
        n => format!(" and {n} open uploads"),
    };
    let (would, did, nothing) = match args.quarantine {
        true => ("would quarantine", "Quarantined", "changed"),
        false => ("would delete", "Deleted", "deleted"),
    };
    Ok(if answer.dry_run {
        format!(
            "Dry run: {would} {count} {noun} ({}){ids}{uploads}. Nothing was {nothing}.\n{}",
            size(answer.size_in_bytes),
            jobs_text(&answer.restored_by)
        )
    } else {
        format!(
            "{did} {count} {noun} ({}){ids}{uploads}{records}.\n",
            size(answer.size_in_bytes)
        )
    })
}

/// `caches promote`: the entries of one ref made readable in another.
async fn promote(client: &Client, json: bool, args: &PromoteArgs) -> Result<String, CliError> {
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    query
        .append_pair("repository", &args.repository)
        .append_pair("from_ref", &args.from_scope)
        .append_pair("to_ref", &args.to_scope);
    if args.dry_run {
        query.append_pair("dry_run", "true");
    }
    let answer: wire::PromotionResult = client
        .call(
            reqwest::Method::POST,
            &format!("promotions?{}", query.finish()),
        )
        .await?;
    if json {
        return Ok(pretty(&answer));
    }
    let verb = if answer.dry_run {
        "Would promote"
    } else {
        "Promoted"
    };
    let bytes: u64 = answer.promoted.iter().map(|p| p.size_in_bytes).sum();
    let noun = if answer.promoted.len() == 1 {
        "entry"
    } else {
        "entries"
    };
    let mut out = format!(
        "{verb} {} {noun} ({}) from {} to {}.\n",
        answer.promoted.len(),
        size(bytes),
        answer.from_ref,
        answer.to_ref,
    );
    for p in &answer.promoted {
        let id = p.id.map_or("-".to_owned(), |id| id.to_string());
        out.push_str(&format!("  {id:>8} <- {:<8} {}\n", p.from_id, p.key));
    }
    if answer.present > 0 {
        out.push_str(&format!(
            "{} already in {} with the same key and version: kept.\n",
            answer.present, answer.to_ref
        ));
    }
    if answer.refused > 0 {
        out.push_str(&format!(
            "{} refused by the write policy of {}.\n",
            answer.refused, answer.to_ref
        ));
    }
    if !answer.dry_run && !answer.promoted.is_empty() {
        out.push_str(&format!(
            "Undo with: hoard caches rm --promoted-by {}\n",
            answer.promoted_by
        ));
    }
    Ok(out)
}

/// `caches restorers`: the jobs that restored what the filter's writers wrote.
async fn restorers(client: &Client, json: bool, filter: &FilterArgs) -> Result<String, CliError> {
    // A restore record keeps its entry's writer, repository, ref and time, not the rest.
    let unkept = [
        ("--key", &filter.key),
        ("--version", &filter.version),
        ("--digest", &filter.digest),
        ("--state", &filter.state),
        ("--promoted-by", &filter.promoted_by),
    ];
    if let Some((flag, _)) = unkept.iter().find(|(_, v)| v.is_some()) {
        return Err(CliError(format!(
            "{flag} is not kept with a restore record: select the writer with --run-id, --subject, --kind, --repository, --ref, --written-after or --written-before"
        )));
    }
    if !filter.is_set() {
        return Err(CliError(
            "name the writer: --run-id, --subject, --kind, --repository, --ref, --written-after or --written-before".into(),
        ));
    }
    let query = filter_query(filter).finish();
    let answer: wire::RestoreList = client
        .call(reqwest::Method::GET, &format!("restores?{query}"))
        .await?;
    Ok(if json {
        pretty(&answer)
    } else {
        restorers_text(&answer)
    })
}

/// `caches restorers`' lines: the jobs, then a note when the server gave only the most recent
/// of the records that matched (its answer's `truncated`).
fn restorers_text(answer: &wire::RestoreList) -> String {
    let mut out = match answer.jobs.is_empty() {
        true => "No job restored an entry these writers wrote.\n".to_owned(),
        false => jobs_text(&answer.jobs),
    };
    if answer.truncated {
        let _ = writeln!(
            out,
            "Note: more restores matched than the server returns; these jobs are from the {} most recent. Narrow the filter (--run-id, --ref, --written-after, --written-before) for the rest.",
            answer.restores.len()
        );
    }
    out
}

/// `caches download`: the archive of entry `id` into `output`, with its SHA-256 to compare
/// with the entry's digest (a one-chunk entry's digest is the SHA-256 of its bytes).
async fn download(client: &Client, id: i64, output: &std::path::Path) -> Result<String, CliError> {
    use sha2::Digest as _;
    use tokio::io::AsyncWriteExt as _;
    // Whether it is in quarantine already: a quarantine that lands after a broken download is
    // the damage the download found.
    let quarantined_before = quarantine_of(client, id).await.map(|(at, _)| at);
    let mut response = client
        .send(reqwest::Method::GET, &format!("caches/{id}/content"))
        .await?;
    let failed = |e: std::io::Error| CliError(format!("writing {}: {e}", output.display()));
    let mut file = tokio::fs::File::create(output).await.map_err(failed)?;
    let (mut hasher, mut written) = (sha2::Sha256::new(), 0u64);
    loop {
        let chunk = match response.chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(e) => {
                // Half an archive is not one: nothing is left to be mistaken for it.
                drop(file);
                let _ = tokio::fs::remove_file(output).await;
                let removed = output.display();
                return Err(CliError(
                    match damage_found(client, id, quarantined_before).await {
                        Some(how) => format!(
                            "entry {id} is damaged: {}; hoard has quarantined it. The download broke off after {written} bytes, and {removed} was removed",
                            TermSafe(&how)
                        ),
                        None => format!(
                            "the download of entry {id} broke off after {written} bytes, and {removed} was removed: {} (a damaged chunk ends it; see the server's log)",
                            root_cause(&e)
                        ),
                    },
                ));
            }
        };
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(failed)?;
        written += chunk.len() as u64;
    }
    file.flush().await.map_err(failed)?;
    file.sync_all().await.map_err(failed)?;
    Ok(format!(
        "Wrote entry {id} to {} ({}, {written} bytes), sha256:{}\n",
        output.display(),
        size(written),
        hex::encode(hasher.finalize())
    ))
}

/// When entry `id` was quarantined and why; `None` if it is not in quarantine, or cannot be
/// asked about.
async fn quarantine_of(client: &Client, id: i64) -> Option<(String, String)> {
    let entry: wire::CacheDetail = client
        .call(reqwest::Method::GET, &format!("caches/{id}"))
        .await
        .ok()?;
    let at = entry.cache.quarantined_at?;
    Some((at, entry.cache.quarantine_reason.unwrap_or_default()))
}

/// How entry `id` is damaged, once the server has quarantined it for the damage a broken
/// download found (the quarantine lands just after the stream ends); `None` if no new
/// quarantine comes within a few seconds (the break was something else, such as the network).
async fn damage_found(client: &Client, id: i64, before: Option<String>) -> Option<String> {
    for _ in 0..50 {
        match quarantine_of(client, id).await {
            Some((at, reason)) if Some(&at) != before.as_ref() => return Some(reason),
            // In quarantine since before the download: not news about this break.
            Some(_) => return None,
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    None
}

/// Deletes the entries `ids` one by one (or, on a dry run, asks what each would delete), and
/// adds up the answers.
async fn remove_ids(
    client: &Client,
    ids: &[i64],
    args: &RemoveArgs,
) -> Result<wire::Deleted, CliError> {
    let dry_run = args.dry_run;
    let mode = match (args.quarantine, args.with_restore_records) {
        (true, _) => "&quarantine=true",
        (false, true) => "&restores=true",
        (false, false) => "",
    };
    let mut total = wire::Deleted {
        deleted: 0,
        quarantine: args.quarantine,
        dry_run,
        size_in_bytes: 0,
        ids: Vec::new(),
        ids_truncated: false,
        uploads_aborted: 0,
        restored_by: Vec::new(),
        // As the server answers: none on a dry run.
        restore_records_deleted: (args.with_restore_records && !dry_run).then_some(0),
    };
    for id in ids {
        let answer: wire::Deleted = client
            .call(
                reqwest::Method::DELETE,
                &format!("caches/{id}?dry_run={dry_run}{mode}"),
            )
            .await
            .map_err(|e| CliError(format!("entry {id}: {e}")))?;
        total.deleted += answer.deleted;
        total.size_in_bytes += answer.size_in_bytes;
        total.ids.extend(answer.ids);
        for job in answer.restored_by {
            add_job(&mut total.restored_by, job);
        }
        if let (Some(sum), Some(n)) = (
            total.restore_records_deleted.as_mut(),
            answer.restore_records_deleted,
        ) {
            *sum += n;
        }
    }
    Ok(total)
}

/// The `ls --long` cells of who wrote `e`: when, kind, subject, run, job, address (`-` where
/// nothing was recorded).
fn writer_cells(e: &wire::Cache) -> [String; 6] {
    let of = |field: fn(&wire::WrittenBy) -> &str| {
        dash(e.written_by.as_ref().map(field).unwrap_or_default()).to_owned()
    };
    [
        e.created_at.clone(),
        of(|w| &w.kind),
        of(|w| &w.subject),
        of(|w| &w.run_id),
        of(|w| &w.job_id),
        of(|w| &w.address),
    ]
}

/// `caches show`: one field per line.
fn entry_text(e: &wire::Cache) -> String {
    let mut out = String::new();
    let mut field = |name: &str, value: &str| {
        let _ = writeln!(out, "{name:<16}{}", TermSafe(dash(value)));
    };
    field("id", &e.id.to_string());
    field(
        "repository",
        &repository_label(&e.repository, &e.repository_id),
    );
    field("repository id", &e.repository_id);
    field("ref", &e.git_ref);
    field("key", &e.key);
    field("version", &e.version);
    field(
        "size",
        &format!("{} ({} bytes)", size(e.size_in_bytes), e.size_in_bytes),
    );
    field("digest", e.digest.as_deref().unwrap_or_default());
    field("state", &e.state);
    if let Some(at) = &e.quarantined_at {
        field("  since", at);
        field(
            "  reason",
            e.quarantine_reason.as_deref().unwrap_or_default(),
        );
        field(
            "  deleted at",
            e.quarantine_expires_at.as_deref().unwrap_or_default(),
        );
    }
    if let Some(p) = &e.promoted {
        field("promoted from", &p.from_ref);
        field("  by", &p.by);
        field(
            "  for",
            if p.cause.is_empty() {
                "by hand"
            } else {
                &p.cause
            },
        );
    }
    if let Some(tool) = &e.tool {
        field("tool", tool);
    }
    if let Some(from) = &e.read_through {
        field("read through", from);
    }
    field("created", &e.created_at);
    field("last used", &e.last_accessed_at);
    field("hits", &e.hits.to_string());
    match &e.written_by {
        Some(w) => {
            field("written by", &w.kind);
            field("  issuer", &w.issuer);
            field("  subject", &w.subject);
            field("  run", &w.run_id);
            field("  job", &w.job_id);
            field("  address", &w.address);
        }
        None => field(
            "written by",
            "not recorded (saved before hoard kept writers)",
        ),
    }
    out
}

/// `show`'s lines of who restored an entry, most recent first.
fn restored_text(restores: &[wire::Restore]) -> String {
    if restores.is_empty() {
        return "restored by   nobody recorded\n".to_owned();
    }
    let mut out = String::from("restored by\n");
    for r in restores {
        let w = &r.reader;
        out.push_str(&format!(
            "  {} run {} job {} ({}) from {}: {} time{}, last {}\n",
            TermSafe(&w.kind),
            TermSafe(dash(&w.run_id)),
            TermSafe(dash(&w.job_id)),
            TermSafe(dash(&w.subject)),
            TermSafe(dash(&w.address)),
            r.count,
            if r.count == 1 { "" } else { "s" },
            r.last_restored_at
        ));
    }
    out
}

/// A dry run's lines of the jobs that restored what it would delete.
fn jobs_text(jobs: &[wire::RestoringJob]) -> String {
    if jobs.is_empty() {
        return String::new();
    }
    let mut out = String::from("Restored by:\n");
    for j in jobs {
        out.push_str(&format!(
            "  {} run {} job {} ({}): {} {}, {} restore{}, last {}\n",
            TermSafe(&j.kind),
            TermSafe(dash(&j.run_id)),
            TermSafe(dash(&j.job_id)),
            TermSafe(dash(&j.subject)),
            j.entries,
            if j.entries == 1 { "entry" } else { "entries" },
            j.restores,
            if j.restores == 1 { "" } else { "s" },
            j.last_restored_at
        ));
    }
    out
}

/// Adds what `job` restored of one entry to `jobs`: to the same job's line if there is one.
fn add_job(jobs: &mut Vec<wire::RestoringJob>, job: wire::RestoringJob) {
    let same = |j: &&mut wire::RestoringJob| {
        (&j.kind, &j.subject, &j.run_id, &j.job_id)
            == (&job.kind, &job.subject, &job.run_id, &job.job_id)
    };
    match jobs.iter_mut().find(same) {
        Some(known) => {
            known.entries += job.entries;
            known.restores += job.restores;
            // RFC 3339 times in one format sort as text.
            if job.last_restored_at > known.last_restored_at {
                known.last_restored_at = job.last_restored_at;
            }
        }
        None => jobs.push(job),
    }
}

/// `text`, or `-` when empty.
fn dash(text: &str) -> &str {
    if text.is_empty() {
        "-"
    } else {
        text
    }
}

/// `ls --json`: the entries of every page read, and how many the filter selects.
#[derive(Serialize)]
struct Listed {
    total_count: u64,
    actions_caches: Vec<wire::Cache>,
}

/// `hoard caches stats`: a family per line, its trend as the hit ratio per bucket.
fn families_table(families: &wire::Families, with_repository: bool) -> String {
    let mut header = vec![
        "FAMILY",
        "CLASS",
        "LOOKUPS",
        "HIT RATIO",
        "MISSES",
        "REFUSED W/R",
        "RESTORED",
        "SAVED",
        "STORED",
    ];
    if with_repository {
        header.insert(0, "REPOSITORY");
    }
    let trend_title = format!("TREND (hit ratio per {})", families.bucket);
    header.push(&trend_title);
    let rows: Vec<Vec<String>> = families
        .families
        .iter()
        .map(|f| {
            let mut row = vec![
                f.family.clone(),
                f.scope_class.clone(),
                f.counters.lookups.to_string(),
                percent(f.hit_ratio),
                f.counters.misses.to_string(),
                format!("{}/{}", f.counters.refused_writes, f.counters.refused_reads),
                size(f.counters.bytes_restored),
                size(f.counters.bytes_saved),
                size(f.bytes_stored),
                sparkline(&f.trend),
            ];
            if with_repository {
                row.insert(0, repository_label(&f.repository_name, &f.repository));
            }
            row
        })
        .collect();
    let mut out = if rows.is_empty() {
        String::new()
    } else {
        table(&header, &rows)
    };
    let quota = families
        .quota_bytes
        .map_or(String::new(), |q| format!(" of {}", size(q)));
    let _ = writeln!(
        out,
        "{} families from {} to {}; {} stored{quota}",
        families.families.len(),
        families.since,
        families.until,
        size(families.stored_bytes),
    );
    out
}

/// The hit ratio of each bucket as a bar from `▁` (none hit) to `█` (all hit); `·` where
/// nothing was looked up.
fn sparkline(trend: &wire::FamilyTrend) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    trend
        .lookups
        .iter()
        .zip(&trend.hits)
        .map(|(&lookups, &hits)| {
            if lookups == 0 {
                '·'
            } else {
                let ratio = hits.min(lookups) as f64 / lookups as f64;
                BARS[((ratio * 7.0).round() as usize).min(7)]
            }
        })
        .collect()
}

fn usage_table(usage: &wire::Usage) -> String {
    let mut out = String::new();
    if !usage.repositories.is_empty() {
        let rows: Vec<Vec<String>> = usage
            .repositories
            .iter()
            .map(|r| {
                vec![
                    repository_label(&r.full_name, &r.repository_id),
                    size(r.active_caches_size_in_bytes),
                    r.active_caches_count.to_string(),
                    size(r.pr_and_tag_caches_size_in_bytes),
                    r.hits.to_string(),
                    r.misses.to_string(),
                    percent(r.hit_ratio),
                ]
            })
            .collect();
        out = table(
            &[
                "REPOSITORY",
                "SIZE",
                "ENTRIES",
                "PR+TAG SIZE",
                "HITS",
                "MISSES",
                "HIT RATIO",
            ],
            &rows,
        );
    }
    let total = &usage.total;
    let _ = writeln!(
        out,
        "{} in {} entries across {} repositories; {} uploads in progress",
        size(total.size_in_bytes),
        total.entries,
        usage.repository_count,
        total.open_uploads,
    );
    out
}

fn status_text(status: &wire::Status, policy: Option<&wire::Policy>) -> String {
    let (limits, usage, lookups) = (&status.limits, &status.usage, &status.lookups);
    let limit = |v: Option<u64>| v.map_or("none".to_owned(), size);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "hoard {} up {}",
        status.version,
        duration(status.uptime_seconds)
    );
    let _ = writeln!(out, "database   {}", status.database);
    let _ = writeln!(out, "storage    {}", status.storage);
    let _ = writeln!(
        out,
        "stored     {} in {} entries; {} uploads in progress",
        size(usage.size_in_bytes),
        usage.entries,
        usage.open_uploads
    );
    let _ = writeln!(
        out,
        "limits     {} in all, {} per repository, {} per entry",
        limit(limits.max_storage),
        limit(limits.repository_quota),
        limit(Some(limits.max_entry_size))
    );
    let _ = writeln!(
        out,
        "lookups    {} hits, {} misses since start ({} hit ratio)",
        lookups.hits,
        lookups.misses,
        percent(lookups.hit_ratio)
    );
    if let Some(policy) = policy {
        out.push_str(&policy_line(policy));
    }
    if status.warnings.is_empty() {
        out.push_str("warnings   none\n");
    }
    for w in &status.warnings {
        let _ = writeln!(out, "WARNING    {}", TermSafe(w));
    }
    out
}

/// An answer as `--json` prints it: indented, keys in the (sorted) order the server sends.
fn pretty(answer: &impl Serialize) -> String {
    let value = serde_json::to_value(answer).unwrap_or_default();
    format!(
        "{}\n",
        serde_json::to_string_pretty(&value).unwrap_or_default()
    )
}

/// A repository's name, or its id when it has none.
fn repository_label(name: &str, id: &str) -> String {
    if name.is_empty() {
        format!("id {id}")
    } else {
        name.to_owned()
    }
}

fn percent(ratio: Option<f64>) -> String {
    ratio.map_or("-".to_owned(), |r| format!("{:.1}%", r * 100.0))
}

/// Bytes in binary units: `512 B`, `1.5 KiB`, `3.2 GiB`.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

fn duration(seconds: u64) -> String {
    match seconds {
        s if s < 60 => format!("{s} s"),
        s if s < 3600 => format!("{} min", s / 60),
        s if s < 86_400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        s => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

/// How long ago an RFC 3339 time was: `just now`, `5 min ago`, `3 h ago`, `2 d ago`.
fn ago(at: &str, now: SystemTime) -> String {
    let Ok(at) = humantime::parse_rfc3339(at) else {
        return "-".into();
    };
    match now.duration_since(at).map(|d| d.as_secs()).unwrap_or(0) {
        s if s < 60 => "just now".into(),
        s if s < 3600 => format!("{} min ago", s / 60),
        s if s < 86_400 => format!("{} h ago", s / 3600),
        s => format!("{} d ago", s / 86_400),
    }
}

/// Columns padded to their widest cell; numbers-looking last columns stay left-aligned too,
/// so that the table reads the same in any terminal. Every cell is shown terminal-safe
/// ([`TermSafe`]): most hold text a client chose (keys, refs, repository names, subjects).
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|c| TermSafe(c).to_string()).collect())
        .collect();
    let rows = rows.as_slice();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            let _ = write!(text, "{cell:<width$}", width = widths[i]);
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_asks_for_no_more_families_than_the_ceiling_allows() {
        let args = |since: &str, limit: usize| StatsArgs {
            repository: None,
            since: since.to_owned(),
            scope_class: None,
            sort: "misses".to_owned(),
            limit,
        };
        assert_eq!(families_within_ceiling(&args("7d", 20)), 20);
        assert_eq!(families_within_ceiling(&args("24h", 5000)), 1000);
        // 366 days: 100,000 / 366 = 273 families.
        assert_eq!(families_within_ceiling(&args("365d", 1000)), 273);
        let ten_thousand_hours = families_within_ceiling(&args("10000h", 1000));
        assert!(ten_thousand_hours * 418 <= hoard_model::stats::MAX_TREND_POINTS);
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(1023), "1023 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(10 << 30), "10.0 GiB");
    }

    #[test]
    fn sparklines_show_the_hit_ratio_per_bucket() {
        let trend = wire::FamilyTrend {
            lookups: vec![0, 4, 4, 1],
            hits: vec![0, 0, 2, 1],
            misses: vec![0, 4, 2, 0],
        };
        assert_eq!(sparkline(&trend), "·▁▅█");
    }

    #[test]
    fn tables_align_columns() {
        let t = table(
            &["ID", "KEY"],
            &[
                vec!["1".into(), "a".into()],
                vec!["100".into(), "bcd".into()],
            ],
        );
        assert_eq!(t, "ID   KEY\n1    a\n100  bcd\n");
    }

    #[test]
    fn restorers_say_when_the_server_gave_only_the_most_recent_records() {
        let job = wire::RestoringJob {
            kind: "github".into(),
            subject: "repo:octo/app:ref:refs/heads/main".into(),
            run_id: "7".into(),
            job_id: "build".into(),
            entries: 1,
            restores: 1000,
            last_restored_at: "2025-12-01T20:00:00Z".into(),
        };
        let restore = wire::Restore {
            entry_id: 1,
            repository_id: "1".into(),
            git_ref: "refs/heads/main".into(),
            key: "k".into(),
            written_by: None,
            written_at: "2025-12-01T19:00:00Z".into(),
            reader: wire::WrittenBy {
                kind: "github".into(),
                issuer: String::new(),
                subject: String::new(),
                run_id: "7".into(),
                job_id: "build".into(),
                address: String::new(),
            },
            first_restored_at: "2025-12-01T19:00:00Z".into(),
            last_restored_at: "2025-12-01T20:00:00Z".into(),
            count: 1,
        };
        let mut answer = wire::RestoreList {
            jobs: vec![job],
            restores: vec![restore; 1000],
            truncated: true,
        };
        let text = restorers_text(&answer);
        assert!(
            text.ends_with("Note: more restores matched than the server returns; these jobs are from the 1000 most recent. Narrow the filter (--run-id, --ref, --written-after, --written-before) for the rest.\n"),
            "{text}"
        );
        answer.truncated = false;
        let whole = restorers_text(&answer);
        assert!(!whole.contains("Note"), "{whole}");
        assert!(
            whole.starts_with("Restored by:\n  github run 7 job build"),
            "{whole}"
        );
    }

    #[test]
    fn tables_and_show_escape_what_clients_chose() {
        let t = table(&["KEY"], &[vec!["a\n\u{1b}[31m\u{202e}\u{2028}b".into()]]);
        assert_eq!(t, "KEY\na\\n\\u{1b}[31m\\u{202e}\\u{2028}b\n");
    }
}
