//! `hoard serve` configuration: flags and `HOARD_*` environment variables, validated at start-up.
//! A bad value stops the server with one sentence naming the option and its variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use url::Url;

#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address and port to listen on. All interfaces by default, so runners on other machines
    /// can reach the server.
    #[arg(long, env = "HOARD_LISTEN", default_value = "0.0.0.0:3000")]
    pub listen: String,

    /// Directory holding the SQLite database, the chunk files and the URL signing key.
    #[arg(long, env = "HOARD_DATA_DIR", default_value = "./hoard-data")]
    pub data_dir: PathBuf,

    /// Metadata database URL: sqlite://PATH [default: sqlite://<data-dir>/hoard.db].
    #[arg(long, env = "HOARD_DATABASE_URL")]
    pub database_url: Option<String>,

    /// Where entry bytes live: file://DIR [default: file://<data-dir>].
    #[arg(long, env = "HOARD_STORAGE_URL")]
    pub storage_url: Option<String>,

    /// Base URL runners use to reach this server, used in signed upload and download links
    /// [default: the scheme (X-Forwarded-Proto) and Host of each request].
    #[arg(long, env = "HOARD_PUBLIC_URL")]
    pub public_url: Option<String>,

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

    /// On SIGTERM or SIGINT, how long in-flight requests may take to finish.
    #[arg(long, env = "HOARD_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Path of the SQLite database file.
    pub sqlite_path: PathBuf,
    /// Root of the local chunk store.
    pub storage_dir: PathBuf,
    pub public_url: Option<Url>,
    pub upload_url_ttl: Duration,
    pub download_url_ttl: Duration,
    pub reservation_ttl: Duration,
    pub sync_interval: Duration,
    pub shutdown_timeout: Duration,
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
        let sqlite_path = match &self.database_url {
            None => self.data_dir.join("hoard.db"),
            Some(url) => sqlite_path(url)?,
        };
        let storage_dir = match &self.storage_url {
            None => self.data_dir.clone(),
            Some(url) => storage_dir(url)?,
        };
        let public_url = self.public_url.as_deref().map(public_url).transpose()?;
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
                "--reservation-ttl",
                "HOARD_RESERVATION_TTL",
                self.reservation_ttl,
            ),
        ] {
            if value < Duration::from_secs(1) {
                return Err(ConfigError(format!("{flag} ({env}) must be at least 1s.")));
            }
        }
        Ok(Config {
            listen,
            data_dir: self.data_dir.clone(),
            sqlite_path,
            storage_dir,
            public_url,
            upload_url_ttl: self.upload_url_ttl,
            download_url_ttl: self.download_url_ttl,
            reservation_ttl: self.reservation_ttl,
            sync_interval: self.sync_interval,
            shutdown_timeout: self.shutdown_timeout,
        })
    }
}

fn sqlite_path(url: &str) -> Result<PathBuf, ConfigError> {
    let path = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| {
            let scheme = url.split(':').next().unwrap_or(url);
            ConfigError(format!(
                "--database-url (HOARD_DATABASE_URL) must be sqlite://PATH; the {scheme:?} database is not supported by this version."
            ))
        })?;
    let path = path.split('?').next().unwrap_or(path);
    if path.is_empty() {
        return Err(ConfigError(
            "--database-url (HOARD_DATABASE_URL) names no database file.".into(),
        ));
    }
    Ok(PathBuf::from(path))
}

fn storage_dir(url: &str) -> Result<PathBuf, ConfigError> {
    let path = url.strip_prefix("file://").ok_or_else(|| {
        let scheme = url.split(':').next().unwrap_or(url);
        ConfigError(format!(
            "--storage-url (HOARD_STORAGE_URL) must be file://DIR; {scheme:?} storage is not supported by this version."
        ))
    })?;
    if path.is_empty() {
        return Err(ConfigError(
            "--storage-url (HOARD_STORAGE_URL) names no directory.".into(),
        ));
    }
    Ok(PathBuf::from(path))
}

fn public_url(raw: &str) -> Result<Url, ConfigError> {
    let url = Url::parse(raw).map_err(|e| {
        ConfigError(format!(
            "--public-url (HOARD_PUBLIC_URL) is not a URL ({e}): {raw:?}."
        ))
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(ConfigError(format!(
            "--public-url (HOARD_PUBLIC_URL) must be an http:// or https:// URL with a host, not {raw:?}."
        )));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(ConfigError(
            "--public-url (HOARD_PUBLIC_URL) must not have a query or fragment.".into(),
        ));
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
    fn defaults_are_port_3000_and_a_local_data_dir() {
        let c = args(&[]).validate().unwrap();
        assert_eq!(c.listen.port(), 3000);
        assert_eq!(c.sqlite_path, PathBuf::from("./hoard-data/hoard.db"));
        assert_eq!(c.storage_dir, PathBuf::from("./hoard-data"));
        assert!(c.public_url.is_none());
    }

    #[test]
    fn bad_values_fail_with_a_sentence_naming_the_option() {
        let err = args(&["--listen", "nowhere"]).validate().unwrap_err();
        assert!(err.0.contains("--listen (HOARD_LISTEN)"), "{err}");
        let err = args(&["--database-url", "postgres://db/x"])
            .validate()
            .unwrap_err();
        assert!(err.0.contains("HOARD_DATABASE_URL"), "{err}");
        let err = args(&["--storage-url", "s3://bucket"])
            .validate()
            .unwrap_err();
        assert!(err.0.contains("HOARD_STORAGE_URL"), "{err}");
        let err = args(&["--public-url", "ftp://x"]).validate().unwrap_err();
        assert!(err.0.contains("HOARD_PUBLIC_URL"), "{err}");
        let err = args(&["--upload-url-ttl", "0s"]).validate().unwrap_err();
        assert!(err.0.contains("--upload-url-ttl"), "{err}");
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
        assert_eq!(c.sqlite_path, PathBuf::from("/tmp/x.db"));
        assert_eq!(c.storage_dir, PathBuf::from("/srv/chunks"));
        assert_eq!(c.public_url.unwrap().as_str(), "https://cache.example/");
    }
}
