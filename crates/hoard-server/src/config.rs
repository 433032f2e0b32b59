//! `hoard serve` configuration: flags and `HOARD_*` environment variables, validated at start-up.
//! A bad value stops the server with one sentence naming the option and its variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use url::Url;

use crate::meta::DatabaseUrl;
use crate::model::units::{parse_size, FreeSpace};
use crate::model::{Clock, Share, SystemClock};

#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address and port to listen on. All interfaces by default, so runners on other machines
    /// can reach the server.
    #[arg(long, env = "HOARD_LISTEN", default_value = "0.0.0.0:3000")]
    pub listen: String,

    /// Directory holding the SQLite database, the chunk files and the URL signing key.
    #[arg(long, env = "HOARD_DATA_DIR", default_value = "./hoard-data")]
    pub data_dir: PathBuf,

    /// Metadata database URL: sqlite://PATH, postgres://USER:PASS@HOST:PORT/DB or
    /// mysql://USER:PASS@HOST:PORT/DB (MySQL 8, MariaDB 10.11+)
    /// [default: sqlite://<data-dir>/hoard.db].
    #[arg(long, env = "HOARD_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<crate::secret::SecretText>,

    /// Connections to a PostgreSQL or MySQL database this process may hold.
    #[arg(long, env = "HOARD_DATABASE_POOL_SIZE", default_value_t = 16)]
    pub database_pool_size: u32,

    /// How long a request waits for a PostgreSQL or MySQL connection before it is answered
    /// 503 with Retry-After (the database is down, hangs or every connection is busy).
    #[arg(long, env = "HOARD_DATABASE_ACQUIRE_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    pub database_acquire_timeout: Duration,

    /// Where entry bytes live: file://DIR, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or
    /// az://CONTAINER/PREFIX. Object storage reads its credentials, region and endpoint from
    /// the cloud's usual environment variables (AWS_*, GOOGLE_*, AZURE_*; docs/scale-out.md)
    /// [default: file://<data-dir>].
    #[arg(long, env = "HOARD_STORAGE_URL")]
    pub storage_url: Option<String>,

    /// Answer downloads of object-stored entries with a redirect to a short-lived presigned
    /// URL of the object store, so the bytes flow from the store to the runner. Only plain GETs
    /// of single-chunk entries are redirected; the rest stream through hoard.
    #[arg(long, env = "HOARD_DIRECT_DOWNLOADS")]
    pub direct_downloads: bool,

    /// Base URL runners use to reach this server, used in signed upload and download links
    /// [default: the scheme (X-Forwarded-Proto) and Host of each request].
    #[arg(long, env = "HOARD_PUBLIC_URL")]
    pub public_url: Option<String>,

    /// Serve HTTPS with the certificate chain in this PEM file (with --tls-key). Re-read on
    /// SIGHUP, so a renewed certificate is served without a restart.
    #[arg(long, env = "HOARD_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert, in PEM (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "HOARD_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Forward every request that is not hoard's own (for example actions/upload-artifact's
    /// ArtifactService calls, which share ACTIONS_RESULTS_URL) to this results service. On
    /// github.com: https://results-receiver.actions.githubusercontent.com/. Runners set up with
    /// `hoard runner setup` need it; /readyz says where it points [default: off].
    #[arg(long, env = "HOARD_UPSTREAM_RESULTS_URL")]
    pub upstream_results_url: Option<String>,

    /// Read through to this cache service on a local miss (Twirp v2, such as GitHub's results
    /// service, https://results-receiver.actions.githubusercontent.com/): hoard asks it with
    /// the job's own token, stores a hit in the job's own scope (not at all for a read-only
    /// job) and serves it, so a team switching to hoard starts warm [default: off].
    #[arg(long, env = "HOARD_UPSTREAM_CACHE")]
    pub upstream_cache: Option<String>,

    /// How long the upstream cache may take to answer a lookup, and to start sending an entry;
    /// later, the lookup is a miss.
    #[arg(long, env = "HOARD_UPSTREAM_CACHE_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    pub upstream_cache_timeout: Duration,

    /// The largest entry read through from the upstream cache; a larger hit is handed to the
    /// client as the upstream's own link, not stored.
    #[arg(long, env = "HOARD_UPSTREAM_CACHE_MAX_SIZE", default_value = "10GiB", value_parser = parse_size)]
    pub upstream_cache_max_size: u64,

    /// Entries read through from the upstream cache at once; past it, the client is sent to the
    /// upstream's link.
    #[arg(long, env = "HOARD_UPSTREAM_CACHE_FETCHES", default_value_t = 4)]
    pub upstream_cache_fetches: usize,

    /// How long a signed upload link stays valid.
    #[arg(long, env = "HOARD_UPLOAD_URL_TTL", default_value = "6h", value_parser = humantime::parse_duration)]
    pub upload_url_ttl: Duration,

    /// How long a signed download link stays valid.
    #[arg(long, env = "HOARD_DOWNLOAD_URL_TTL", default_value = "1h", value_parser = humantime::parse_duration)]
    pub download_url_ttl: Duration,

    /// How long a reservation may stay unfinalized before another job may save the same key
    /// (GitHub uses 24h).
    #[arg(long, env = "HOARD_RESERVATION_TTL", default_value = "24h", value_parser = humantime::parse_duration)]
    pub reservation_ttl: Duration,

    /// How often stored chunks are flushed to disk (syncfs); the kernel's own writeback age is
    /// 30s too. After a machine crash, entries saved since the last flush are forgotten at
    /// start-up rather than served damaged. A process crash loses nothing.
    #[arg(long, env = "HOARD_SYNC_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub sync_interval: Duration,

    /// Memory that uploads and downloads on local disk may hold at once for their blocks, in
    /// bytes or with a unit (at least 2MiB). Past it, transfers move in smaller blocks, then wait.
    #[arg(long, env = "HOARD_TRANSFER_MEMORY", default_value = "16MiB", value_parser = parse_size)]
    pub transfer_memory: u64,

    /// On SIGTERM or SIGINT, how long in-flight requests may take to finish.
    #[arg(long, env = "HOARD_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,

    /// Trusted issuer of runtime tokens (repeatable; comma-separated in the variable). Keys are
    /// found by OIDC discovery at <issuer>/.well-known/openid-configuration. Add your GHE.com
    /// issuer (https://token.actions.githubusercontent.com/<enterprise>) or GHES issuer here.
    #[arg(long = "token-issuer", env = "HOARD_TOKEN_ISSUERS", value_delimiter = ',', default_value = crate::auth::verify::GITHUB_ISSUER)]
    pub token_issuers: Vec<String>,

    /// Verify RS256/ES256 tokens against this JWKS file instead of discovery (air-gapped sites).
    #[arg(long, env = "HOARD_JWKS_FILE")]
    pub jwks_file: Option<PathBuf>,

    /// Accept HS256 tokens signed with the secret in this file (forges such as Gitea, tests).
    #[arg(long, env = "HOARD_TOKEN_HS256_SECRET_FILE")]
    pub token_hs256_secret_file: Option<PathBuf>,

    /// Clock skew allowed when checking a token's exp and nbf.
    #[arg(long, env = "HOARD_TOKEN_LEEWAY", default_value = "60s", value_parser = humantime::parse_duration)]
    pub token_leeway: Duration,

    /// Read runtime tokens without checking their signature, issuer or expiry. Anyone who can
    /// reach the server can then read and write any repository's entries.
    #[arg(long, env = "HOARD_INSECURE_SKIP_TOKEN_VALIDATION")]
    pub insecure_skip_token_validation: bool,

    /// Namespaces by secret path prefix, for act and Gitea's cache.external_server: per line a
    /// name, a secret prefix (16+ letters, digits, '-', '_') and read-only or read-write.
    /// Requests to /<secret>/_apis/artifactcache/ then belong to that namespace.
    #[arg(long, env = "HOARD_NAMESPACES_FILE")]
    pub namespaces_file: Option<PathBuf>,

    /// Accept Forgejo runner cache-proxy requests whose Forgejo-Cache-MAC verifies with the
    /// secret in this file (the secret of `forgejo-runner cache-server`).
    #[arg(long, env = "HOARD_FORGEJO_CACHE_SECRET_FILE")]
    pub forgejo_cache_secret_file: Option<PathBuf>,

    /// How long after a Forgejo run started its proxy's requests are accepted.
    #[arg(long, env = "HOARD_FORGEJO_RUN_MAX_AGE", default_value = "24h", value_parser = humantime::parse_duration)]
    pub forgejo_run_max_age: Duration,

    /// What requests without any credential may do: off, read-only or read-write. They share
    /// one namespace; anyone who can reach the server can use it.
    #[arg(long, env = "HOARD_ANONYMOUS_ACCESS", default_value = "off", value_parser = parse_anonymous)]
    pub anonymous_access: Anonymous,

    /// Write policies: a TOML file of [[rule]]s by repository and scope, each read-write,
    /// read-only or deny, optionally for some caller kinds (docs/security.md). Re-read on
    /// SIGHUP; a bad file refuses start-up, or keeps the policy in force on reload. Without it,
    /// every token may do what it grants.
    #[arg(long, env = "HOARD_POLICY_FILE")]
    pub policy_file: Option<PathBuf>,

    /// Proxies whose `X-Forwarded-For` is believed when recording who wrote an entry: IP
    /// addresses or networks (`10.0.0.0/8`), comma-separated. From any other peer the header is
    /// ignored and the peer's own address is recorded.
    #[arg(long, env = "HOARD_TRUSTED_PROXIES", value_delimiter = ',', value_parser = parse_trusted_proxy)]
    pub trusted_proxies: Vec<ipnet::IpNet>,

    /// File holding the key that signs upload and download links (at least 32 bytes); made with
    /// mode 0600 if missing. Replicas must share it [default: <data-dir>/signing.key].
    #[arg(long, env = "HOARD_SIGNING_KEY_FILE")]
    pub signing_key_file: Option<PathBuf>,

    /// The link signing key itself (at least 32 characters), instead of a file.
    #[arg(long, env = "HOARD_SIGNING_KEY", hide_env_values = true)]
    pub signing_key: Option<crate::secret::SecretText>,

    /// Largest entry accepted, in bytes or with a unit (KiB, MiB, GiB).
    #[arg(long, env = "HOARD_MAX_ENTRY_SIZE", default_value = "10GiB", value_parser = parse_size)]
    pub max_entry_size: u64,

    /// Most uploads a repository may have open at once; more get 429 with Retry-After.
    #[arg(long, env = "HOARD_MAX_OPEN_UPLOADS", default_value_t = 1000)]
    pub max_open_uploads: u32,

    /// How long a lookup's answer is reused for the same keys. Exact within one process; with
    /// several processes on one database, an entry saved through another becomes visible here
    /// within this time. 0s turns it off.
    #[arg(long, env = "HOARD_LOOKUP_CACHE_TTL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub lookup_cache_ttl: Duration,

    /// Bytes one repository's entries may hold; after each save, its least recently used
    /// entries are evicted until it is under (GitHub: 10 GB). 0 turns the quota off.
    #[arg(long, env = "HOARD_REPO_QUOTA", default_value = "10GiB", value_parser = parse_size)]
    pub repo_quota: u64,

    /// The share of the repository quota that entries of pull requests (`refs/pull/*`) and tags
    /// (`refs/tags/*`) may hold, 1% to 100%. They go first when the repository is over its
    /// quota or they are over their share, and a branch's entry is never evicted for theirs;
    /// 100% gives GitHub's plain LRU over the whole repository.
    #[arg(long, env = "HOARD_PR_SCOPE_SHARE", default_value = "50%", value_parser = Share::parse)]
    pub pr_scope_share: Share,

    /// Bytes all entries may hold together; least recently used entries of any repository go
    /// first [default: no limit].
    #[arg(long, env = "HOARD_MAX_STORAGE", value_parser = parse_size)]
    pub max_storage: Option<u64>,

    /// Free space to keep on the data file system (local disk only), in bytes or as a
    /// percentage such as 5%: below it, least recently used entries are evicted, and saves are
    /// refused once nothing is left to evict. 0 turns it off.
    #[arg(long, env = "HOARD_MIN_FREE_SPACE", default_value = "5%", value_parser = FreeSpace::parse)]
    pub min_free_space: FreeSpace,

    /// Entries not restored for this long expire (GitHub: 7 days). 0s turns expiry off.
    #[arg(long, env = "HOARD_UNUSED_TTL", default_value = "7d", value_parser = humantime::parse_duration)]
    pub unused_ttl: Duration,

    /// Entries older than this expire, used or not [default: no maximum age].
    #[arg(long, env = "HOARD_MAX_AGE", value_parser = humantime::parse_duration)]
    pub max_age: Option<Duration>,

    /// How long the chunks of an evicted or expired entry stay readable, so that downloads
    /// already under way finish; also the age below which an unreferenced chunk is never
    /// collected [default: --download-url-ttl plus --lookup-cache-ttl plus 1h].
    #[arg(long, env = "HOARD_DELETION_GRACE", value_parser = humantime::parse_duration)]
    pub deletion_grace: Option<Duration>,

    /// How often the maintenance pass runs: abandoned uploads, expiry, global limits, deferred
    /// deletions and orphaned chunks.
    #[arg(long, env = "HOARD_GC_INTERVAL", default_value = "10m", value_parser = humantime::parse_duration)]
    pub gc_interval: Duration,

    /// File holding the admin token (one line). It turns on the admin API and the dashboard
    /// at /_hoard/, which `hoard caches` and `hoard status` use; without a token they are off
    /// and answer 404.
    #[arg(long, env = "HOARD_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,

    /// The admin token itself, instead of a file (best from the environment: a flag shows in
    /// the process list).
    #[arg(
        long,
        env = "HOARD_ADMIN_TOKEN",
        hide_env_values = true,
        conflicts_with = "admin_token_file"
    )]
    pub admin_token: Option<crate::secret::SecretText>,

    /// File holding the secret of GitHub's webhook (one line): turns on the receiver at
    /// /_hoard/webhooks/github, which promotes a merge queue's caches into the branch it merges
    /// into (and, where the policy file opts in, a merged pull request's). See
    /// docs/promotion.md.
    #[arg(long, env = "HOARD_GITHUB_WEBHOOK_SECRET_FILE")]
    pub github_webhook_secret_file: Option<PathBuf>,

    /// Serve /metrics on this address (such as 127.0.0.1:9300) instead of on --listen, so that
    /// runners cannot read it [default: on --listen].
    #[arg(long, env = "HOARD_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,

    /// Also export lookups per repository (hit or miss), for at most this many repositories;
    /// later ones are counted as `other`. 0 turns these series off.
    #[arg(long, env = "HOARD_METRICS_REPOSITORIES", default_value_t = 0)]
    pub metrics_repositories: usize,

    /// Also export lookups per key family (`hoard_family_lookups_total`), for at most this many
    /// (repository, family) pairs; later ones are counted as `other`. 0 turns these series off.
    #[arg(long, env = "HOARD_METRICS_FAMILIES", default_value_t = 0)]
    pub metrics_families: usize,

    /// How long the hourly statistics by key family are kept; older hours are folded into days,
    /// and days are kept for a year.
    #[arg(long, env = "HOARD_STATS_RETENTION", default_value = "30d", value_parser = humantime::parse_duration)]
    pub stats_retention: Duration,

    /// How long a restore record (who received which entry, kept through a purge of the entry)
    /// is kept after its latest restore.
    #[arg(long, env = "HOARD_RESTORE_RECORDS_RETENTION", default_value = "90d", value_parser = humantime::parse_duration)]
    pub restore_records_retention: Duration,

    /// The most restore records one repository keeps (about 1 KB each with their indexes); the
    /// oldest by latest restore go first, at each maintenance pass. 0: no bound.
    #[arg(
        long,
        env = "HOARD_MAX_RESTORE_RECORDS_PER_REPOSITORY",
        default_value_t = 50_000
    )]
    pub max_restore_records_per_repository: u64,

    /// The most restore records kept in all (about 1 KB each with their indexes: the default
    /// is some 200 MB); the oldest by latest restore go first, at each maintenance pass.
    /// 0: no bound.
    #[arg(long, env = "HOARD_MAX_RESTORE_RECORDS", default_value_t = 200_000)]
    pub max_restore_records: u64,

    /// How long a quarantined entry (out of every lookup, kept with its bytes for examination:
    /// `hoard caches rm --quarantine`, or damage found by an integrity check) is kept before it
    /// is deleted.
    #[arg(long, env = "HOARD_QUARANTINE_RETENTION", default_value = "30d", value_parser = humantime::parse_duration)]
    pub quarantine_retention: Duration,

    /// The most key families whose statistics are kept per repository; later families count as
    /// `other`, so that no client can grow the statistics without bound.
    #[arg(long, env = "HOARD_STATS_MAX_FAMILIES", default_value_t = 100)]
    pub stats_max_families: usize,

    /// A client must send a request's headers within this time.
    #[arg(long, env = "HOARD_HEADER_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub header_timeout: Duration,

    /// An upload whose body sends nothing for this long is abandoned.
    #[arg(long, env = "HOARD_IDLE_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,
}

/// One `--trusted-proxies` item: an address (a network of one) or a network.
fn parse_trusted_proxy(raw: &str) -> Result<ipnet::IpNet, String> {
    let raw = raw.trim();
    raw.parse::<ipnet::IpNet>()
        .or_else(|_| raw.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("{raw:?} is neither an IP address nor a network such as 10.0.0.0/8"))
}

/// `--anonymous-access`: `off`, or what anonymous requests may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anonymous(pub Option<crate::auth::namespaces::Access>);

fn parse_anonymous(raw: &str) -> Result<Anonymous, String> {
    match raw {
        "off" | "none" => Ok(Anonymous(None)),
        other => crate::auth::namespaces::Access::parse(other)
            .map(|a| Anonymous(Some(a)))
            .ok_or_else(|| "expected off, read-only or read-write".to_owned()),
    }
}

/// Admin tokens shorter than this are accepted with a warning: guessing one must be hopeless.
pub const SHORT_ADMIN_TOKEN: usize = 16;

/// The warning for an admin token shorter than [`SHORT_ADMIN_TOKEN`].
pub const SHORT_ADMIN_TOKEN_WARNING: &str =
    "the admin token is shorter than 16 characters and could be guessed; make one with: openssl rand -hex 32";

/// Limits applied to requests.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_entry_size: u64,
    pub max_open_uploads: u32,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
}

/// Where the HTTPS certificate chain and key are (PEM); `tls` reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// The metadata database.
    pub database: DatabaseUrl,
    /// Connections to a networked database, and how long a request waits for one.
    pub database_pool: crate::meta::PoolSettings,
    /// Where chunk bytes are kept.
    pub storage: Storage,
    /// Redirect downloads to presigned object URLs.
    pub direct_downloads: bool,
    pub public_url: Option<Url>,
    pub upstream_results_url: Option<Url>,
    /// Read-through to an upstream cache (`--upstream-cache`).
    pub upstream_cache: Option<UpstreamCache>,
    /// HTTPS certificate and key; `None` serves plain HTTP.
    pub tls: Option<TlsFiles>,
    pub upload_url_ttl: Duration,
    pub download_url_ttl: Duration,
    pub reservation_ttl: Duration,
    pub sync_interval: Duration,
    /// What blocks of transfers on local disk may hold at once (`--transfer-memory`).
    pub transfer_memory: u64,
    pub shutdown_timeout: Duration,
    pub lookup_cache_ttl: Duration,
    pub tokens: crate::auth::TokenSettings,
    pub forgejo: Option<crate::auth::forgejo::ForgejoSettings>,
    pub namespaces: crate::auth::namespaces::Namespaces,
    pub anonymous: Option<crate::auth::namespaces::Access>,
    /// Proxies whose `X-Forwarded-For` names the client (`--trusted-proxies`).
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// The write policy as `--policy-file` read at start-up; its `source` is the file that
    /// SIGHUP reads again. `None`: no policy (every token may do what it grants).
    pub policy: Option<crate::cache::policy::Policy>,
    /// The link signing key, if given directly; else `signing_key_file` is used.
    pub signing_key: Option<crate::secret::Secret>,
    pub signing_key_file: PathBuf,
    pub limits: Limits,
    pub lifecycle: crate::cache::lifecycle::Limits,
    /// Turns on the admin API and dashboard.
    pub admin_token: Option<crate::secret::Secret>,
    /// Turns on the GitHub webhook receiver.
    pub github_webhook_secret: Option<crate::secret::Secret>,
    /// Where the server reads the time (entry ages, link and token expiry): the machine's clock.
    /// No flag sets it; tests put a `ManualClock` here to move time instead of sleeping.
    pub clock: Arc<dyn Clock>,
    /// Where /metrics is served if not on `listen`.
    pub metrics_listen: Option<SocketAddr>,
    /// Repositories with their own lookup series (0: none).
    pub metrics_repositories: usize,
    /// (Repository, family) pairs with their own lookup series (0: none).
    pub metrics_families: usize,
    /// Families whose statistics are kept per repository.
    pub stats_max_families: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

impl ServeArgs {
    pub fn validate(&self) -> Result<Config, ConfigError> {
        let listen: SocketAddr = self.listen.parse().map_err(|_| {
            ConfigError(format!(
                "--listen (HOARD_LISTEN) must be an IP address and port such as 0.0.0.0:3000, not {:?}.",
                self.listen
            ))
        })?;
        if self.data_dir.as_os_str().is_empty() {
            return Err(ConfigError(
                "--data-dir (HOARD_DATA_DIR) must not be empty.".into(),
            ));
        }
        let database = match &self.database_url {
            None => DatabaseUrl::Sqlite(self.data_dir.join("hoard.db")),
            Some(url) => DatabaseUrl::parse(url.expose())
                .map_err(|e| ConfigError(format!("--database-url (HOARD_DATABASE_URL) {e}.")))?,
        };
        if self.database_pool_size == 0 {
            return Err(ConfigError(
                "--database-pool-size (HOARD_DATABASE_POOL_SIZE) must be at least 1.".into(),
            ));
        }
        if !(Duration::from_millis(100)..=Duration::from_secs(60))
            .contains(&self.database_acquire_timeout)
        {
            return Err(ConfigError(
                "--database-acquire-timeout (HOARD_DATABASE_ACQUIRE_TIMEOUT) must be from 100ms to 60s.".into(),
            ));
        }
        let storage = match &self.storage_url {
            None => Storage::Dir(self.data_dir.clone()),
            Some(url) => storage(url)?,
        };
        if self.direct_downloads && matches!(storage, Storage::Dir(_)) {
            return Err(ConfigError(
                "--direct-downloads (HOARD_DIRECT_DOWNLOADS) needs object storage (--storage-url s3://, gs:// or az://).".into(),
            ));
        }
        let public_url = self.public_url.as_deref().map(public_url).transpose()?;
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                let files = TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                };
                files
                    .load()
                    .map_err(|e| ConfigError(format!("{e} (HOARD_TLS_CERT, HOARD_TLS_KEY).")))?;
                Some(files)
            }
            (None, None) => None,
            _ => {
                return Err(ConfigError(
                    "--tls-cert (HOARD_TLS_CERT) and --tls-key (HOARD_TLS_KEY) go together.".into(),
                ))
            }
        };
        let upstream_results_url = self
            .upstream_results_url
            .as_deref()
            .map(|raw| http_url("--upstream-results-url", "HOARD_UPSTREAM_RESULTS_URL", raw))
            .transpose()?;
        let upstream_cache = match self.upstream_cache.as_deref() {
            None => None,
            Some(raw) => {
                let url = http_url("--upstream-cache", "HOARD_UPSTREAM_CACHE", raw)?;
                if self.upstream_cache_fetches == 0 {
                    return Err(ConfigError(
                        "--upstream-cache-fetches (HOARD_UPSTREAM_CACHE_FETCHES) must be at least 1.".into(),
                    ));
                }
                if self.upstream_cache_timeout.is_zero() {
                    return Err(ConfigError(
                        "--upstream-cache-timeout (HOARD_UPSTREAM_CACHE_TIMEOUT) must be above 0."
                            .into(),
                    ));
                }
                Some(UpstreamCache {
                    url,
                    timeout: self.upstream_cache_timeout,
                    max_size: self.upstream_cache_max_size,
                    fetches: self.upstream_cache_fetches,
                })
            }
        };
        for (flag, env, value) in [
            (
                "--upload-url-ttl",
                "HOARD_UPLOAD_URL_TTL",
                self.upload_url_ttl,
            ),
            (
                "--download-url-ttl",
                "HOARD_DOWNLOAD_URL_TTL",
                self.download_url_ttl,
            ),
            ("--sync-interval", "HOARD_SYNC_INTERVAL", self.sync_interval),
            (
                "--header-timeout",
                "HOARD_HEADER_TIMEOUT",
                self.header_timeout,
            ),
            ("--idle-timeout", "HOARD_IDLE_TIMEOUT", self.idle_timeout),
            ("--gc-interval", "HOARD_GC_INTERVAL", self.gc_interval),
            (
                "--reservation-ttl",
                "HOARD_RESERVATION_TTL",
                self.reservation_ttl,
            ),
        ] {
            if value < Duration::from_secs(1) {
                return Err(ConfigError(format!("{flag} ({env}) must be at least 1s.")));
            }
        }
        let tokens = self.token_settings()?;
        let signing_key = match &self.signing_key {
            Some(key) if key.expose().len() < 32 => {
                return Err(ConfigError(
                    "--signing-key (HOARD_SIGNING_KEY) must be at least 32 characters.".into(),
                ))
            }
            Some(key) => Some(crate::secret::Secret::new(key.expose().as_bytes())),
            None => None,
        };
        if self.max_open_uploads == 0 {
            return Err(ConfigError(
                "--max-open-uploads (HOARD_MAX_OPEN_UPLOADS) must be at least 1.".into(),
            ));
        }
        if self.max_entry_size == 0 {
            return Err(ConfigError(
                "--max-entry-size (HOARD_MAX_ENTRY_SIZE) must be above 0.".into(),
            ));
        }
        let lifecycle = self.lifecycle()?;
        let admin_token = self.admin_token()?;
        let github_webhook_secret = self.github_webhook_secret()?;
        let metrics_listen = match &self.metrics_listen {
            None => None,
            Some(raw) => Some(raw.parse::<SocketAddr>().map_err(|_| {
                ConfigError(format!(
                    "--metrics-listen (HOARD_METRICS_LISTEN) must be an IP address and port such as 127.0.0.1:9300, not {raw:?}."
                ))
            })?),
        };
        // Port 0 picks a free port for each.
        if metrics_listen == Some(listen) && listen.port() != 0 {
            return Err(ConfigError(
                "--metrics-listen (HOARD_METRICS_LISTEN) must differ from --listen; leave it unset to serve /metrics there.".into(),
            ));
        }
        let namespaces = match &self.namespaces_file {
            Some(path) => crate::auth::namespaces::Namespaces::load(path).map_err(|e| {
                ConfigError(format!("--namespaces-file (HOARD_NAMESPACES_FILE): {e}."))
            })?,
            None => Default::default(),
        };
        let forgejo = match &self.forgejo_cache_secret_file {
            Some(path) => {
                let secret = std::fs::read(path).map_err(|e| {
                    ConfigError(format!("--forgejo-cache-secret-file (HOARD_FORGEJO_CACHE_SECRET_FILE): cannot read {}: {e}.", path.display()))
                })?;
                // forgejo-runner passes the secret as a string: a trailing newline is the file's.
                let secret = secret.trim_ascii_end().to_vec();
                if secret.is_empty() {
                    return Err(ConfigError(
                        "--forgejo-cache-secret-file (HOARD_FORGEJO_CACHE_SECRET_FILE) is empty."
                            .into(),
                    ));
                }
                Some(crate::auth::forgejo::ForgejoSettings {
                    secret: crate::secret::Secret::new(secret),
                    max_age: self.forgejo_run_max_age,
                    leeway: self.token_leeway,
                })
            }
            None => None,
        };
        let policy = self
            .policy_file
            .as_deref()
            .map(crate::cache::policy::Policy::load)
            .transpose()
            .map_err(|e| ConfigError(format!("--policy-file (HOARD_POLICY_FILE): {e}.")))?;
        if self.transfer_memory < crate::blob::transfer_memory::MIN_BUDGET {
            return Err(ConfigError(
                "--transfer-memory (HOARD_TRANSFER_MEMORY) must be at least 2MiB: one block being read and one being sent.".into(),
            ));
        }
        if self.metrics_repositories > 10_000 {
            return Err(ConfigError(
                "--metrics-repositories (HOARD_METRICS_REPOSITORIES) must be at most 10000: each is a series in every scrape.".into(),
            ));
        }
        if self.metrics_families > 10_000 {
            return Err(ConfigError(
                "--metrics-families (HOARD_METRICS_FAMILIES) must be at most 10000: each is a series in every scrape.".into(),
            ));
        }
        if !(1..=10_000).contains(&self.stats_max_families) {
            return Err(ConfigError(
                "--stats-max-families (HOARD_STATS_MAX_FAMILIES) must be from 1 to 10000.".into(),
            ));
        }
        Ok(Config {
            metrics_repositories: self.metrics_repositories,
            metrics_families: self.metrics_families,
            stats_max_families: self.stats_max_families,
            admin_token,
            github_webhook_secret,
            metrics_listen,
            lifecycle,
            tokens,
            forgejo,
            namespaces,
            anonymous: self.anonymous_access.0,
            trusted_proxies: self.trusted_proxies.clone(),
            policy,
            signing_key,
            signing_key_file: self
                .signing_key_file
                .clone()
                .unwrap_or_else(|| self.data_dir.join("signing.key")),
            limits: Limits {
                max_entry_size: self.max_entry_size,
                max_open_uploads: self.max_open_uploads,
                header_timeout: self.header_timeout,
                idle_timeout: self.idle_timeout,
            },
            listen,
            data_dir: self.data_dir.clone(),
            database,
            database_pool: crate::meta::PoolSettings {
                size: self.database_pool_size,
                acquire_timeout: self.database_acquire_timeout,
            },
            storage,
            direct_downloads: self.direct_downloads,
            public_url,
            upstream_results_url,
            upstream_cache,
            tls,
            upload_url_ttl: self.upload_url_ttl,
            download_url_ttl: self.download_url_ttl,
            reservation_ttl: self.reservation_ttl,
            sync_interval: self.sync_interval,
            transfer_memory: self.transfer_memory,
            shutdown_timeout: self.shutdown_timeout,
            lookup_cache_ttl: self.lookup_cache_ttl,
            clock: Arc::new(SystemClock),
        })
    }
}

impl ServeArgs {
    fn admin_token(&self) -> Result<Option<crate::secret::Secret>, ConfigError> {
        let token = match (&self.admin_token, &self.admin_token_file) {
            (Some(token), _) => token.expose().trim().to_owned(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|e| {
                    ConfigError(format!(
                        "--admin-token-file (HOARD_ADMIN_TOKEN_FILE): cannot read {}: {e}.",
                        path.display()
                    ))
                })?
                .trim()
                .to_owned(),
            (None, None) => return Ok(None),
        };
        if token.is_empty() {
            return Err(ConfigError(
                "the admin token (--admin-token-file, HOARD_ADMIN_TOKEN) is empty; make one with: openssl rand -hex 32".into(),
            ));
        }
        if token.chars().any(|c| c.is_control() || c == ' ') {
            return Err(ConfigError(
                "the admin token (--admin-token-file, HOARD_ADMIN_TOKEN) must not contain spaces or control characters.".into(),
            ));
        }
        Ok(Some(crate::secret::Secret::new(token.into_bytes())))
    }

    fn github_webhook_secret(&self) -> Result<Option<crate::secret::Secret>, ConfigError> {
        let Some(path) = &self.github_webhook_secret_file else {
            return Ok(None);
        };
        let secret = std::fs::read_to_string(path).map_err(|e| {
            ConfigError(format!(
                "--github-webhook-secret-file (HOARD_GITHUB_WEBHOOK_SECRET_FILE): cannot read {}: {e}.",
                path.display()
            ))
        })?;
        // GitHub signs with the secret as typed; a trailing newline of the file is not part
        // of it.
        let secret = secret.trim_end_matches(['\r', '\n']);
        if secret.is_empty() {
            return Err(ConfigError(
                "the GitHub webhook secret (--github-webhook-secret-file) is empty; make one with: openssl rand -hex 32".into(),
            ));
        }
        Ok(Some(crate::secret::Secret::new(secret.as_bytes().to_vec())))
    }

    fn lifecycle(&self) -> Result<crate::cache::lifecycle::Limits, ConfigError> {
        use crate::cache::lifecycle::Limits;
        // A reader may open a removed entry until this process's reuse of it lapses, then
        // download it for as long as its link lives.
        let least_grace = self.download_url_ttl + self.lookup_cache_ttl;
        let deletion_grace = match self.deletion_grace {
            Some(grace) if grace < least_grace => {
                return Err(ConfigError(format!(
                    "--deletion-grace (HOARD_DELETION_GRACE) must be at least --download-url-ttl plus --lookup-cache-ttl ({}), so that downloads under way are never cut short.",
                    humantime::format_duration(least_grace)
                )))
            }
            Some(grace) => grace,
            None => least_grace + Duration::from_secs(3600),
        };
        if self.max_storage == Some(0) {
            return Err(ConfigError(
                "--max-storage (HOARD_MAX_STORAGE) must be above 0; leave it unset for no limit."
                    .into(),
            ));
        }
        let min_free_space = match self.min_free_space {
            FreeSpace::Bytes(0) => None,
            FreeSpace::Percent(0.0) => None,
            other => Some(other),
        };
        Ok(Limits {
            repo_quota: (self.repo_quota > 0).then_some(self.repo_quota),
            pr_scope_share: self.pr_scope_share,
            max_storage: self.max_storage,
            min_free_space,
            unused_ttl: (!self.unused_ttl.is_zero()).then_some(self.unused_ttl),
            max_age: self.max_age.filter(|age| !age.is_zero()),
            deletion_grace,
            gc_interval: self.gc_interval,
            stats_retention: self.stats_retention,
            restore_records_retention: self.restore_records_retention,
            max_restore_records_per_repository: (self.max_restore_records_per_repository > 0)
                .then_some(self.max_restore_records_per_repository),
            max_restore_records: (self.max_restore_records > 0).then_some(self.max_restore_records),
            quarantine_retention: self.quarantine_retention,
        })
    }

    fn token_settings(&self) -> Result<crate::auth::TokenSettings, ConfigError> {
        let issuers: Vec<String> = self
            .token_issuers
            .iter()
            .map(|i| i.trim().to_owned())
            .filter(|i| !i.is_empty())
            .collect();
        for issuer in &issuers {
            let ok = Url::parse(issuer)
                .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some());
            if !ok {
                return Err(ConfigError(format!(
                    "--token-issuer (HOARD_TOKEN_ISSUERS) must be http(s) URLs; {issuer:?} is not."
                )));
            }
        }
        let jwks = match &self.jwks_file {
            Some(path) => Some(
                crate::auth::TokenSettings::load_jwks_file(path)
                    .map_err(|e| ConfigError(format!("--jwks-file (HOARD_JWKS_FILE): {e}.")))?,
            ),
            None => None,
        };
        let hs256_secret = match &self.token_hs256_secret_file {
            Some(path) => {
                let secret = std::fs::read(path).map_err(|e| {
                    ConfigError(format!("--token-hs256-secret-file (HOARD_TOKEN_HS256_SECRET_FILE): cannot read {}: {e}.", path.display()))
                })?;
                // Used byte for byte: a forge's secret may begin or end with whitespace bytes.
                if secret.len() < 32 {
                    return Err(ConfigError(
                        "--token-hs256-secret-file (HOARD_TOKEN_HS256_SECRET_FILE) must hold at least 32 bytes.".into(),
                    ));
                }
                Some(crate::secret::Secret::new(secret))
            }
            None => None,
        };
        if issuers.is_empty() && hs256_secret.is_none() && !self.insecure_skip_token_validation {
            return Err(ConfigError(
                "no way to verify tokens: give --token-issuer or --token-hs256-secret-file (or, on a trusted network only, --insecure-skip-token-validation).".into(),
            ));
        }
        Ok(crate::auth::TokenSettings {
            issuers,
            jwks,
            hs256_secret,
            leeway: self.token_leeway,
            insecure_skip_validation: self.insecure_skip_token_validation,
        })
    }
}

/// Where chunk bytes are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Storage {
    /// A local directory.
    Dir(PathBuf),
    /// A bucket (or container) of S3, GCS or Azure Blob.
    Object(crate::blob::ObjectStorageUrl),
}

impl std::fmt::Display for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Dir(dir) => write!(f, "file://{}", dir.display()),
            Self::Object(url) => url.fmt(f),
        }
    }
}

fn storage(url: &str) -> Result<Storage, ConfigError> {
    if let Some(object) = crate::blob::ObjectStorageUrl::parse(url) {
        return object
            .map(Storage::Object)
            .map_err(|e| ConfigError(format!("--storage-url (HOARD_STORAGE_URL) {e}.")));
    }
    let path = url.strip_prefix("file://").ok_or_else(|| {
        let scheme = url.split(':').next().unwrap_or(url);
        ConfigError(format!(
            "--storage-url (HOARD_STORAGE_URL) must be file://DIR, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or az://CONTAINER/PREFIX; {scheme:?} is none of them."
        ))
    })?;
    if path.is_empty() {
        return Err(ConfigError(
            "--storage-url (HOARD_STORAGE_URL) names no directory.".into(),
        ));
    }
    Ok(Storage::Dir(PathBuf::from(path)))
}

fn public_url(raw: &str) -> Result<Url, ConfigError> {
    http_url("--public-url", "HOARD_PUBLIC_URL", raw)
}

/// An http(s) URL with a host and no query or fragment, for option `flag` (variable `env`).
/// Read-through to an upstream cache (`--upstream-cache` and its limits).
#[derive(Debug, Clone)]
pub struct UpstreamCache {
    pub url: Url,
    pub timeout: Duration,
    pub max_size: u64,
    pub fetches: usize,
}

fn http_url(flag: &str, env: &str, raw: &str) -> Result<Url, ConfigError> {
    let url = Url::parse(raw)
        .map_err(|e| ConfigError(format!("{flag} ({env}) is not a URL ({e}): {raw:?}.")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(ConfigError(format!(
            "{flag} ({env}) must be an http:// or https:// URL with a host, not {raw:?}."
        )));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(ConfigError(format!(
            "{flag} ({env}) must not have a query or fragment."
        )));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn args(list: &[&str]) -> ServeArgs {
        Cli::try_parse_from(std::iter::once("hoard").chain(list.iter().copied()))
            .unwrap()
            .serve
    }

    #[test]
    fn a_policy_file_is_read_at_start_and_a_bad_one_names_the_option_and_line() {
        assert!(args(&[]).validate().unwrap().policy.is_none());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.toml");
        std::fs::write(
            &path,
            "[[rule]]\nrepository = \"*\"\nscope = \"refs/heads/main\"\naccess = \"read-only\"\n",
        )
        .unwrap();
        let file = path.to_str().unwrap();
        let policy = args(&["--policy-file", file]).validate().unwrap().policy;
        let policy = policy.unwrap();
        assert_eq!(policy.rules.len(), 1);
        assert_eq!(policy.source.as_deref(), Some(path.as_path()));
        std::fs::write(&path, "[[rule]]\nrepository = \"*\"\nscope = 1\n").unwrap();
        let err = args(&["--policy-file", file]).validate().unwrap_err();
        assert!(
            err.0
                .starts_with("--policy-file (HOARD_POLICY_FILE): the policy file ")
                && err.0.contains("line 3"),
            "{err}"
        );
        let err = args(&["--policy-file", "/nonexistent/policy.toml"])
            .validate()
            .unwrap_err();
        assert!(
            err.0
                .contains("cannot read the policy file /nonexistent/policy.toml"),
            "{err}"
        );
    }

    #[test]
    fn defaults_are_port_3000_and_a_local_data_dir() {
        let c = args(&[]).validate().unwrap();
        assert_eq!(c.listen.port(), 3000);
        assert_eq!(
            c.database,
            DatabaseUrl::Sqlite(PathBuf::from("./hoard-data/hoard.db"))
        );
        assert_eq!(c.storage, Storage::Dir(PathBuf::from("./hoard-data")));
        assert!(c.public_url.is_none());
        assert_eq!(
            c.database_pool,
            crate::meta::PoolSettings {
                size: 16,
                acquire_timeout: Duration::from_secs(2)
            }
        );
    }

    #[test]
    fn bad_values_fail_with_a_sentence_naming_the_option() {
        let err = args(&["--listen", "nowhere"]).validate().unwrap_err();
        assert!(err.0.contains("--listen (HOARD_LISTEN)"), "{err}");
        let err = args(&["--database-url", "oracle://db/x"])
            .validate()
            .unwrap_err();
        assert!(err.0.contains("HOARD_DATABASE_URL"), "{err}");
        for bad in ["ftp://bucket", "s3://", "gs://bucket/a//b"] {
            let err = args(&["--storage-url", bad]).validate().unwrap_err();
            assert!(err.0.contains("HOARD_STORAGE_URL"), "{err}");
        }
        let err = args(&["--direct-downloads"]).validate().unwrap_err();
        assert!(err.0.contains("HOARD_DIRECT_DOWNLOADS"), "{err}");
        let err = args(&["--public-url", "ftp://x"]).validate().unwrap_err();
        assert!(err.0.contains("HOARD_PUBLIC_URL"), "{err}");
        let err = args(&["--upload-url-ttl", "0s"]).validate().unwrap_err();
        assert!(err.0.contains("--upload-url-ttl"), "{err}");
    }

    #[test]
    fn database_urls_pick_the_backend() {
        let db = |url: &str| {
            args(&["--database-url", url])
                .validate()
                .map(|c| c.database)
        };
        assert_eq!(
            db("postgres://u:p@127.0.0.1:5432/hoard").unwrap(),
            DatabaseUrl::Postgres("postgres://u:p@127.0.0.1:5432/hoard".into())
        );
        assert!(matches!(
            db("postgresql://h/db").unwrap(),
            DatabaseUrl::Postgres(_)
        ));
        assert_eq!(
            db("mariadb://root@h:3306/db").unwrap(),
            DatabaseUrl::MySql("mysql://root@h:3306/db".into())
        );
        let err = db("postgres://h").unwrap_err();
        assert!(err.0.contains("names no database"), "{err}");
        let err = db("mysql:///x").unwrap_err();
        assert!(err.0.contains("names no host"), "{err}");
        let err = args(&["--database-pool-size", "0"]).validate().unwrap_err();
        assert!(err.0.contains("HOARD_DATABASE_POOL_SIZE"), "{err}");
        for wait in ["50ms", "2min"] {
            let err = args(&["--database-acquire-timeout", wait])
                .validate()
                .unwrap_err();
            assert!(err.0.contains("HOARD_DATABASE_ACQUIRE_TIMEOUT"), "{err}");
        }
        let pool = args(&["--database-acquire-timeout", "500ms"])
            .validate()
            .unwrap()
            .database_pool;
        assert_eq!(pool.acquire_timeout, Duration::from_millis(500));
        let redacted = DatabaseUrl::parse("postgres://u:secret@h/db")
            .unwrap()
            .redacted();
        assert!(!redacted.contains("secret"), "{redacted}");
    }

    #[test]
    fn lifecycle_defaults_follow_github_and_bad_values_are_refused() {
        let l = args(&[]).validate().unwrap().lifecycle;
        assert_eq!(l.repo_quota, Some(10 << 30));
        assert_eq!(l.unused_ttl, Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(l.min_free_space, Some(FreeSpace::Percent(5.0)));
        assert_eq!(l.max_storage, None);
        assert_eq!(l.pr_scope_share, Share::parse("50%").unwrap());
        let whole = args(&["--pr-scope-share", "100"]).validate().unwrap();
        assert!(whole.lifecycle.pr_scope_share.is_whole());
        for bad in ["0%", "101%", "half"] {
            let Err(err) = Cli::try_parse_from(["hoard", "--pr-scope-share", bad]) else {
                panic!("{bad:?} was accepted");
            };
            assert!(err.to_string().contains("--pr-scope-share"), "{err}");
        }
        assert_eq!(l.deletion_grace, Duration::from_secs(3600 + 1 + 3600));
        let off = args(&[
            "--repo-quota",
            "0",
            "--unused-ttl",
            "0s",
            "--min-free-space",
            "0",
        ])
        .validate()
        .unwrap()
        .lifecycle;
        assert_eq!(
            (off.repo_quota, off.unused_ttl, off.min_free_space),
            (None, None, None)
        );
        let err = args(&["--deletion-grace", "10m"]).validate().unwrap_err();
        assert!(err.0.contains("HOARD_DELETION_GRACE"), "{err}");
        let err = args(&["--max-storage", "0"]).validate().unwrap_err();
        assert!(err.0.contains("HOARD_MAX_STORAGE"), "{err}");
        assert!(Cli::try_parse_from(["hoard", "--min-free-space", "120%"]).is_err());
    }

    #[test]
    fn token_verification_is_on_by_default_with_githubs_issuer() {
        let c = args(&[]).validate().unwrap();
        assert!(!c.tokens.insecure_skip_validation);
        assert_eq!(c.tokens.issuers, [crate::auth::verify::GITHUB_ISSUER]);
        let err = args(&["--token-issuer", "not a url"])
            .validate()
            .unwrap_err();
        assert!(err.0.contains("HOARD_TOKEN_ISSUERS"), "{err}");
        let err = args(&["--jwks-file", "/nonexistent/jwks.json"])
            .validate()
            .unwrap_err();
        assert!(err.0.contains("--jwks-file"), "{err}");
        let err = args(&["--signing-key", "short"]).validate().unwrap_err();
        assert!(err.0.contains("HOARD_SIGNING_KEY"), "{err}");
    }

    #[test]
    fn no_secret_shows_in_the_configuration_as_printed() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.to_str().unwrap().to_owned()
        };
        let hs256 = file("hs256", "hs256-secret-hs256-secret-hs256-secret");
        let forgejo = file("forgejo", "forgejo-secret-value");
        let namespaces = file("ns", "act nssecretnssecret0123 read-write\n");
        let c = args(&[
            "--signing-key",
            "signing-key-signing-key-signing-key",
            "--database-url",
            "postgres://hoard:db-password-value@db:5432/hoard",
            "--token-hs256-secret-file",
            &hs256,
            "--forgejo-cache-secret-file",
            &forgejo,
            "--namespaces-file",
            &namespaces,
        ])
        .validate()
        .unwrap();
        let shown = format!("{c:?} {c:#?}");
        for secret in [
            "signing-key-signing",
            "db-password-value",
            "hs256-secret",
            "forgejo-secret-value",
            "nssecretnssecret",
        ] {
            assert!(!shown.contains(secret), "{secret} shows in {shown}");
        }
        assert!(shown.contains("act"), "namespace names do show");
    }

    #[test]
    fn explicit_locations_are_used() {
        let c = args(&[
            "--database-url",
            "sqlite:///tmp/x.db",
            "--storage-url",
            "file:///srv/chunks",
            "--public-url",
            "https://cache.example/",
        ])
        .validate()
        .unwrap();
        assert_eq!(c.database, DatabaseUrl::Sqlite(PathBuf::from("/tmp/x.db")));
        assert_eq!(c.storage, Storage::Dir(PathBuf::from("/srv/chunks")));
        assert_eq!(c.public_url.unwrap().as_str(), "https://cache.example/");
        let c = args(&["--storage-url", "s3://bucket/ci", "--direct-downloads"])
            .validate()
            .unwrap();
        assert_eq!(
            c.storage,
            Storage::Object(
                crate::blob::ObjectStorageUrl::parse("s3://bucket/ci")
                    .unwrap()
                    .unwrap()
            )
        );
        assert!(c.direct_downloads);
    }
}
