//! Secrets print as nothing (issue #12): the link signing key, the HS256 and Forgejo secrets, the
//! admin token and database passwords are held in types whose `Debug` and `Display` show none
//! of them, and none reaches a running server's log, its start-up errors or `--help`.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::process::Command;
use std::time::Duration;

use clap::Parser;
use common::databases::{Server, TestDatabase};
use common::process::Hoard;
use serde_json::json;

const SIGNING_KEY: &str = "signing-key-value-signing-key-value-0123";
const ADMIN_TOKEN: &str = "admin-token-value-0123456789abcdef";
const DB_PASSWORD: &str = "db-password-value-0123";
const FORGEJO_SECRET: &str = "forgejo-secret-value-0123456789";

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    serve: hoard::config::ServeArgs,
}

/// Every secret the tests give hoard, the HS256 one included.
fn secrets() -> [&'static str; 5] {
    [
        SIGNING_KEY,
        ADMIN_TOKEN,
        DB_PASSWORD,
        FORGEJO_SECRET,
        common::TEST_SECRET,
    ]
}

fn assert_no_secret(what: &str, shown: &str) {
    for secret in secrets() {
        assert!(!shown.contains(secret), "{what} shows {secret}: {shown}");
    }
}

/// The flags of a server given every kind of secret, in `dir`.
fn flags(dir: &std::path::Path) -> Vec<String> {
    let forgejo = dir.join("forgejo-secret");
    std::fs::write(&forgejo, FORGEJO_SECRET).unwrap();
    let hs256 = common::secret_file(dir);
    [
        "--signing-key",
        SIGNING_KEY,
        "--admin-token",
        ADMIN_TOKEN,
        "--token-hs256-secret-file",
        hs256.to_str().unwrap(),
        "--forgejo-cache-secret-file",
        forgejo.to_str().unwrap(),
    ]
    .map(str::to_owned)
    .to_vec()
}

#[test]
fn the_validated_configuration_prints_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("postgres://hoard:{DB_PASSWORD}@db:5432/hoard");
    let mut argv = vec!["hoard".to_owned(), "--database-url".into(), db];
    argv.extend(flags(dir.path()));
    let config = Cli::try_parse_from(argv).unwrap().serve.validate().unwrap();
    let (signing, admin) = (
        config.signing_key.as_ref().unwrap(),
        config.admin_token.as_ref().unwrap(),
    );
    // The secrets are all there, for the code that uses them...
    assert_eq!(signing.expose(), SIGNING_KEY.as_bytes());
    assert_eq!(admin.expose(), ADMIN_TOKEN.as_bytes());
    let hs256 = config.tokens.hs256_secret.as_ref().unwrap();
    assert_eq!(hs256.expose(), common::TEST_SECRET.as_bytes());
    // ... and nothing of them shows, however they are printed.
    for secret in [signing, admin, hs256] {
        assert_eq!(format!("{secret}"), "[redacted]");
        assert_eq!(format!("{secret:?}"), "Secret(redacted)");
    }
    let shown = format!("{config:?} {config:#?} {:?}", config.database);
    assert_no_secret("the configuration", &shown);
    assert!(
        shown.contains("postgres://hoard:***@db:5432/hoard"),
        "{shown}"
    );
}

/// The flags as clap parses them (`ServeArgs`) derive `Debug` with the signing key, the admin
/// token and the database URL as plain strings: nothing prints them today, but one `{:?}` of
/// them would.
#[test]
fn the_flags_as_parsed_print_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("postgres://hoard:{DB_PASSWORD}@db:5432/hoard");
    let mut argv = vec!["hoard".to_owned(), "--database-url".into(), db];
    argv.extend(flags(dir.path()));
    let args = Cli::try_parse_from(argv).unwrap().serve;
    assert_no_secret("ServeArgs", &format!("{args:?}"));
}

/// A server given every secret (flags and environment, metadata on PostgreSQL with a password)
/// serves saves, restores, admin calls with the right and a wrong token, readiness and metrics,
/// and its whole log shows none of the secrets.
#[test]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs PostgreSQL"
)]
fn no_secret_reaches_the_log_of_a_running_server() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(db) = rt.block_on(TestDatabase::create(Server::Postgres)) else {
        return;
    };
    // The local server trusts its logins, so a password in the URL is carried and unused; a
    // server that checks passwords has its own in HOARD_TEST_POSTGRES_URL, which is kept.
    let mut url = url::Url::parse(&db.url).unwrap();
    let password = match url.password() {
        Some(p) => p.to_owned(),
        None => {
            url.set_password(Some(DB_PASSWORD)).unwrap();
            DB_PASSWORD.to_owned()
        }
    };
    let data = tempfile::tempdir().unwrap();
    let args = flags(data.path());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env = [("HOARD_DATABASE_URL".to_owned(), url.to_string())];
    let hoard = Hoard::start_with_env(data.path(), &args, &env);
    rt.block_on(async {
        let http = reqwest::Client::new();
        let base = hoard.base.clone();
        let t = common::main_token();
        let (status, body) = common::twirp_at(
            &http,
            &base,
            &t,
            "CreateCacheEntry",
            json!({ "key": "k", "version": common::VERSION }),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let link = body["signed_upload_url"].as_str().unwrap();
        let res = http
            .put(link)
            .header("x-ms-blob-type", "BlockBlob")
            .body("abc")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 201);
        let forged = link.replace("sig=", "sig=AAAA");
        let res = http.put(forged).body("x").send().await.unwrap();
        assert_eq!(res.status(), 403);
        let (_, body) = common::twirp_at(
            &http,
            &base,
            &t,
            "FinalizeCacheEntryUpload",
            json!({ "key": "k", "version": common::VERSION, "size_bytes": "3" }),
        )
        .await;
        assert_eq!(body["ok"], true, "{body}");
        for (token, status) in [(ADMIN_TOKEN, 200), ("wrong-admin-token", 401)] {
            let res = http
                .get(format!("{base}/_hoard/api/v1/caches"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), status);
        }
        for path in ["/readyz", "/metrics"] {
            let res = http.get(format!("{base}{path}")).send().await.unwrap();
            assert_eq!(res.status(), 200, "{path}");
            assert_no_secret(path, &res.text().await.unwrap());
        }
        let logged = common::eventually(Duration::from_secs(10), || {
            let log = hoard.log.lock().unwrap();
            log.iter().any(|l| l.contains("wrong admin token"))
                && log.iter().any(|l| l.contains("/metrics"))
        })
        .await;
        assert!(logged, "{:#?}", hoard.log.lock().unwrap());
    });
    let log = hoard.log.lock().unwrap().join("\n");
    assert_no_secret("the log", &log);
    assert!(!log.contains(&password), "the database password: {log}");
    assert!(log.contains("metadata in postgres://"), "{log}");
    assert!(log.contains(":***@"), "the URL is shown redacted: {log}");
}

/// Start-up failures name the option at fault, never its secret value; `--help` shows no
/// secret set in the environment.
#[test]
fn start_up_errors_and_help_print_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let serve = |args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_hoard"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "debug")
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status, all)
    };
    let hs256 = common::secret_file(dir.path());
    let hs256 = hs256.to_str().unwrap();
    let short_key = "short-signing-key-value";
    let spaced_token = "admin token-value with spaces";
    let cases: [(Vec<String>, &str, &str); 4] = [
        (
            vec![format!("postgres://hoard:{DB_PASSWORD}@127.0.0.1:1/hoard")],
            "cannot open the metadata database postgres://hoard:***@127.0.0.1:1/hoard",
            DB_PASSWORD,
        ),
        (
            vec![format!("mysql://hoard:{DB_PASSWORD}@127.0.0.1:1/hoard")],
            "cannot open the metadata database mysql://hoard:***@127.0.0.1:1/hoard",
            DB_PASSWORD,
        ),
        (
            vec!["--signing-key".into(), short_key.into()],
            "--signing-key (HOARD_SIGNING_KEY) must be at least 32 characters",
            short_key,
        ),
        (
            vec!["--admin-token".into(), spaced_token.into()],
            "must not contain spaces or control characters",
            spaced_token,
        ),
    ];
    for (extra, needle, secret) in cases {
        let mut args = vec!["--token-hs256-secret-file", hs256];
        if extra.len() == 1 {
            args.extend(["--database-url", extra[0].as_str()]);
        } else {
            args.extend(extra.iter().map(String::as_str));
        }
        let (status, out) = serve(&args, &[]);
        assert!(!status.success(), "{args:?}: {out}");
        assert!(out.contains(needle), "{args:?}: {out}");
        assert!(!out.contains(secret), "{args:?} shows its secret: {out}");
        assert_no_secret("a start-up error", &out);
    }

    let db_url = format!("postgres://hoard:{DB_PASSWORD}@db/hoard");
    let env = [
        ("HOARD_SIGNING_KEY", SIGNING_KEY),
        ("HOARD_ADMIN_TOKEN", ADMIN_TOKEN),
        ("HOARD_DATABASE_URL", db_url.as_str()),
    ];
    let (status, help) = serve(&["--help"], &env);
    assert!(status.success(), "{help}");
    assert!(help.contains("HOARD_ADMIN_TOKEN"), "{help}");
    assert_no_secret("--help", &help);
}
