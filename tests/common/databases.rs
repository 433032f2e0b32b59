//! Throwaway databases on the PostgreSQL and MariaDB/MySQL servers the test machine runs.
//!
//! `HOARD_TEST_POSTGRES_URL` and `HOARD_TEST_MYSQL_URL` name a server (an administrative
//! connection, any database); they default to the local servers with trust/empty-password
//! logins. Each test creates its own database and drops it at the end. An unreachable server
//! fails the test with a sentence saying how to start it, unless `HOARD_TEST_SKIP_POSTGRES=1` or
//! `HOARD_TEST_SKIP_MYSQL=1` asks to skip it.

use sqlx::{AssertSqlSafe, Connection};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Postgres,
    MySql,
}

impl Server {
    fn admin_url(self) -> String {
        let (var, default) = match self {
            Self::Postgres => (
                "HOARD_TEST_POSTGRES_URL",
                "postgres://postgres@127.0.0.1:5432/postgres",
            ),
            Self::MySql => ("HOARD_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/mysql"),
        };
        std::env::var(var).unwrap_or_else(|_| default.to_owned())
    }

    fn skip_var(self) -> &'static str {
        match self {
            Self::Postgres => "HOARD_TEST_SKIP_POSTGRES",
            Self::MySql => "HOARD_TEST_SKIP_MYSQL",
        }
    }

    fn how_to_start(self) -> &'static str {
        match self {
            Self::Postgres => "start it with `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`, point HOARD_TEST_POSTGRES_URL at another server, or set HOARD_TEST_SKIP_POSTGRES=1 to skip these tests",
            Self::MySql => "start it with `start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd`, point HOARD_TEST_MYSQL_URL at another server, or set HOARD_TEST_SKIP_MYSQL=1 to skip these tests",
        }
    }
}

/// A fresh database, dropped when the test ends (also when it fails).
pub struct TestDatabase {
    server: Server,
    name: String,
    /// The URL hoard is given (`--database-url`).
    pub url: String,
}

impl TestDatabase {
    /// A new empty database, or `None` (with a message) when the user asked to skip `server`.
    pub async fn create(server: Server) -> Option<Self> {
        if std::env::var(server.skip_var()).is_ok_and(|v| v == "1" || v == "true") {
            eprintln!("skipped: {} is set", server.skip_var());
            return None;
        }
        let admin = server.admin_url();
        let name = format!(
            "hoard_test_{}",
            &hoard::model::BlobName::random().as_str()[..12]
        );
        let create = format!("CREATE DATABASE {name}");
        let result = match server {
            Server::Postgres => match sqlx::PgConnection::connect(&admin).await {
                Ok(mut c) => sqlx::raw_sql(AssertSqlSafe(create))
                    .execute(&mut c)
                    .await
                    .map(drop),
                Err(e) => Err(e),
            },
            Server::MySql => match sqlx::MySqlConnection::connect(&admin).await {
                Ok(mut c) => sqlx::raw_sql(AssertSqlSafe(create))
                    .execute(&mut c)
                    .await
                    .map(drop),
                Err(e) => Err(e),
            },
        };
        if let Err(e) = result {
            panic!(
                "cannot create a test database on {admin}: {e}; {}",
                server.how_to_start()
            );
        }
        let mut url = url::Url::parse(&admin).unwrap();
        url.set_path(&format!("/{name}"));
        Some(Self {
            server,
            name,
            url: url.to_string(),
        })
    }

    fn drop_now(&self) {
        let (server, admin, sql) = (
            self.server,
            self.server.admin_url(),
            format!("DROP DATABASE IF EXISTS {}", self.name),
        );
        // Drop runs outside any runtime the test may have; use a small one of our own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                match server {
                    Server::Postgres => {
                        if let Ok(mut c) = sqlx::PgConnection::connect(&admin).await {
                            let force = format!("{sql} WITH (FORCE)");
                            let _ = sqlx::raw_sql(AssertSqlSafe(force)).execute(&mut c).await;
                        }
                    }
                    Server::MySql => {
                        if let Ok(mut c) = sqlx::MySqlConnection::connect(&admin).await {
                            let _ = sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut c).await;
                        }
                    }
                }
            });
        })
        .join();
    }
}

/// Where a test server keeps its metadata: SQLite in its data directory, or a throwaway
/// database on a server.
pub struct Backend {
    database: Option<TestDatabase>,
    /// `--storage-url` and the environment it needs (object storage); `None`: the data dir.
    storage: Option<(String, Vec<(String, String)>)>,
}

impl Backend {
    pub fn sqlite() -> Self {
        Self {
            database: None,
            storage: None,
        }
    }

    /// SQLite for `None`; else a fresh database on the server, or `None` when the user asked
    /// to skip that server. For synchronous tests.
    pub fn create(server: Option<Server>) -> Option<Self> {
        let Some(server) = server else {
            return Some(Self::sqlite());
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let database = rt.block_on(TestDatabase::create(server))?;
        Some(Self {
            database: Some(database),
            storage: None,
        })
    }

    /// The same, with chunks at `storage_url` (object storage configured by `env`).
    pub fn with_storage(mut self, storage_url: String, env: Vec<(String, String)>) -> Self {
        self.storage = Some((storage_url, env));
        self
    }

    /// The environment `hoard serve` needs for this backend's storage.
    pub fn env(&self) -> &[(String, String)] {
        self.storage.as_ref().map_or(&[], |(_, env)| env.as_slice())
    }

    /// The `hoard serve` arguments that select it.
    pub fn args(&self) -> Vec<&str> {
        let mut args = match &self.database {
            Some(db) => vec!["--database-url", db.url.as_str()],
            None => Vec::new(),
        };
        if let Some((url, _)) = &self.storage {
            args.extend(["--storage-url", url.as_str()]);
        }
        args
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        self.drop_now();
    }
}
