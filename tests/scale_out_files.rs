//! The scale-out files are usable as shipped. `contrib/scale-out/` (Compose, nginx, Kubernetes),
//! the `Dockerfile` and `docs/scale-out.md` name only options and variables that exist, and
//! describe one cache: replicas that share a database, a bucket and a signing key. Docker and
//! Kubernetes are not run here; the files are parsed and checked against `hoard serve --help`
//! and the `object_store` crate's own parsers.
#![allow(clippy::unwrap_used)] // Test helpers fail loudly by design.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use yaml_rust2::{Yaml, YamlLoader};

/// The cloud variables the shipped files and the page may use. Each is one that the
/// `object_store` crate reads (checked against its parsers below, and by hand against the
/// builders' `from_env` in object_store 0.12.5). Switches it also reads that weaken security
/// (unsigned requests, invalid certificates) are left out on purpose.
const CLOUD_VARIABLES: &[&str] = &[
    // Amazon S3 and S3-compatible servers.
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME",
    "AWS_ENDPOINT_URL_STS",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_METADATA_ENDPOINT",
    "AWS_SERVER_SIDE_ENCRYPTION",
    "AWS_SSE_KMS_KEY_ID",
    "AWS_SSE_BUCKET_KEY_ENABLED",
    "AWS_REQUEST_PAYER",
    "AWS_PROXY_URL",
    // Google Cloud Storage.
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_PATH",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_PROXY_URL",
    // Azure Blob Storage.
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_TOKEN",
    "AZURE_STORAGE_ENDPOINT",
    "AZURE_STORAGE_USE_EMULATOR",
    "AZURE_CLIENT_ID",
    "AZURE_CLIENT_SECRET",
    "AZURE_TENANT_ID",
    "AZURE_AUTHORITY_HOST",
    "AZURE_FEDERATED_TOKEN_FILE",
    "AZURE_OBJECT_ID",
    "AZURE_MSI_RESOURCE_ID",
    "AZURE_MSI_ENDPOINT",
    "AZURE_PROXY_URL",
    // Read by the Azure builder from the environment directly, for the emulator's address.
    "AZURITE_BLOB_STORAGE_URL",
];

/// Variables that docs/scale-out.md names only to say that hoard does not read them.
const NAMED_AS_NOT_READ: &[&str] = &["AWS_PROFILE"];

/// Prefixes of the variables that [`CLOUD_VARIABLES`] governs.
const CLOUD_PREFIXES: &[&str] = &["AWS_", "GOOGLE_", "AZURE_", "AZURITE_"];

/// Flags of other programs that docs/scale-out.md shows (aws, gcloud, kubectl, docker).
const OTHER_PROGRAMS_FLAGS: &[&str] = &[
    "--bucket",
    "--lifecycle-configuration",
    "--lifecycle-file",
    "--replicas",
    // podman run's, for the container image.
    "--name",
    "--read-only",
    // helm install's, for the chart.
    "--namespace",
    "--create-namespace",
    "--set",
];

fn repo_file(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// The help text of `hoard <subcommand>`, read once per subcommand.
fn help(subcommand: &'static str) -> &'static str {
    static HELPS: OnceLock<BTreeMap<&'static str, String>> = OnceLock::new();
    let helps = HELPS.get_or_init(|| {
        ["serve", "gc", "caches", "edge"]
            .into_iter()
            .map(|sub| {
                let out = Command::new(env!("CARGO_BIN_EXE_hoard"))
                    .args([sub, "--help"])
                    .output()
                    .unwrap();
                assert!(out.status.success(), "hoard {sub} --help failed");
                (sub, String::from_utf8(out.stdout).unwrap())
            })
            .collect()
    });
    helps
        .get(subcommand)
        .unwrap_or_else(|| panic!("no help read for {subcommand}"))
}

/// Whether `help` documents the environment variable `name` (secret ones show no value).
fn has_variable(help: &str, name: &str) -> bool {
    help.contains(&format!("[env: {name}=")) || help.contains(&format!("[env: {name}]"))
}

/// Whether `help` documents the flag `flag` (`--name`).
fn has_flag(help: &str, flag: &str) -> bool {
    help.lines().any(|line| {
        let line = line.trim_start();
        let line = line
            .split_once(", ")
            .filter(|(short, _)| short.len() == 2 && short.starts_with('-'))
            .map_or(line, |(_, long)| long);
        line == flag || line.starts_with(&format!("{flag} "))
    })
}

/// Parses a YAML file of the repository, all its documents, with merge keys (`<<`) applied.
fn load_yaml(path: &str) -> Vec<Yaml> {
    let docs = YamlLoader::load_from_str(&repo_file(path))
        .unwrap_or_else(|e| panic!("{path} is not valid YAML: {e}"));
    assert!(!docs.is_empty(), "{path} holds no document");
    docs.iter().map(merged).collect()
}

/// `yaml` with every merge key (`<<: *anchor`, `<<: [*a, *b]`) applied, as Compose applies
/// them: keys given beside the merge win.
fn merged(yaml: &Yaml) -> Yaml {
    match yaml {
        Yaml::Array(items) => Yaml::Array(items.iter().map(merged).collect()),
        Yaml::Hash(map) => {
            let mut out = yaml_rust2::yaml::Hash::new();
            let merge_key = Yaml::String("<<".into());
            if let Some(sources) = map.get(&merge_key) {
                let sources = match sources {
                    Yaml::Array(list) => list.clone(),
                    one => vec![one.clone()],
                };
                for source in sources {
                    let Yaml::Hash(source) = merged(&source) else {
                        panic!("a merge key must name a mapping: {source:?}");
                    };
                    for (k, v) in source {
                        out.insert(k, v);
                    }
                }
            }
            for (k, v) in map {
                if *k != merge_key {
                    out.insert(k.clone(), merged(v));
                }
            }
            Yaml::Hash(out)
        }
        other => other.clone(),
    }
}

/// A scalar as the text a program would see (`16`, `true` and `off` included).
fn text(yaml: &Yaml) -> Option<String> {
    match yaml {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

fn hash_entries(yaml: &Yaml) -> Vec<(String, &Yaml)> {
    match yaml {
        Yaml::Hash(map) => map
            .iter()
            .map(|(k, v)| (text(k).unwrap_or_else(|| panic!("key {k:?}")), v))
            .collect(),
        Yaml::BadValue => Vec::new(),
        other => panic!("expected a mapping, found {other:?}"),
    }
}

fn list(yaml: &Yaml) -> &[Yaml] {
    match yaml {
        Yaml::Array(items) => items,
        Yaml::BadValue => &[],
        other => panic!("expected a list, found {other:?}"),
    }
}

/// The words of a command given as a list or as one string.
fn words(yaml: &Yaml) -> Vec<String> {
    match yaml {
        Yaml::Array(items) => items.iter().filter_map(text).collect(),
        Yaml::BadValue | Yaml::Null => Vec::new(),
        one => text(one)
            .unwrap()
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
    }
}

/// Fails with every problem found, one per line.
fn assert_none(problems: &[String], what: &str) {
    assert!(problems.is_empty(), "{what}:\n{}", problems.join("\n"));
}

/// Checks variables set for `hoard serve`: `HOARD_*` must be its options, cloud variables
/// must be in [`CLOUD_VARIABLES`].
fn check_variables<'a>(
    names: impl IntoIterator<Item = &'a String>,
    whose: &str,
    problems: &mut Vec<String>,
) {
    check_variables_of("serve", names, whose, problems);
}

/// [`check_variables`] for `hoard <mode>`.
fn check_variables_of<'a>(
    mode: &'static str,
    names: impl IntoIterator<Item = &'a String>,
    whose: &str,
    problems: &mut Vec<String>,
) {
    for name in names {
        if name.starts_with("HOARD_") {
            if !has_variable(help(mode), name) {
                problems.push(format!("{whose}: {name} is not a variable of hoard {mode}"));
            }
        } else if CLOUD_PREFIXES.iter().any(|p| name.starts_with(p))
            && !CLOUD_VARIABLES.contains(&name.as_str())
        {
            problems.push(format!(
                "{whose}: {name} is not a variable object_store reads"
            ));
        }
    }
}

/// Checks the flags among the words passed to `hoard serve`.
fn check_flags(args: &[String], whose: &str, problems: &mut Vec<String>) {
    check_flags_of("serve", args, whose, problems);
}

/// [`check_flags`] for `hoard <mode>`.
fn check_flags_of(mode: &'static str, args: &[String], whose: &str, problems: &mut Vec<String>) {
    for arg in args.iter().filter(|a| a.starts_with("--")) {
        let flag = arg.split_once('=').map_or(arg.as_str(), |(f, _)| f);
        if !has_flag(help(mode), flag) {
            problems.push(format!("{whose}: {flag} is not a flag of hoard {mode}"));
        }
    }
}

/// The host of a URL such as `postgres://user:pw@host:5432/db`.
fn url_host(raw: &str) -> String {
    url::Url::parse(raw)
        .unwrap_or_else(|e| panic!("{raw} is not a URL: {e}"))
        .host_str()
        .unwrap_or_else(|| panic!("{raw} has no host"))
        .to_owned()
}

/// The port of `HOARD_LISTEN` (the image's default, 3000, when unset).
fn listen_port(env: &BTreeMap<String, String>) -> u16 {
    env.get("HOARD_LISTEN")
        .map_or("0.0.0.0:3000", String::as_str)
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or_else(|| panic!("HOARD_LISTEN is not an address and port: {env:?}"))
}

// ---------------------------------------------------------------------------------------------
// Compose

struct ComposeService {
    name: String,
    env: BTreeMap<String, String>,
    command: Vec<String>,
    body: Yaml,
}

fn compose_services() -> Vec<ComposeService> {
    let docs = load_yaml("contrib/scale-out/compose.yaml");
    assert_eq!(docs.len(), 1, "compose.yaml is one document");
    let services = &docs[0]["services"];
    assert!(!services.is_badvalue(), "compose.yaml has no services");
    hash_entries(services)
        .into_iter()
        .map(|(name, body)| {
            let env = match &body["environment"] {
                Yaml::Array(items) => items
                    .iter()
                    .map(|item| {
                        let item = text(item).unwrap();
                        let (k, v) = item.split_once('=').unwrap_or((&item, ""));
                        (k.to_owned(), v.to_owned())
                    })
                    .collect(),
                other => hash_entries(other)
                    .into_iter()
                    .map(|(k, v)| (k, text(v).unwrap_or_default()))
                    .collect(),
            };
            ComposeService {
                name,
                env,
                command: words(&body["command"]),
                body: body.clone(),
            }
        })
        .collect()
}

/// The image `scripts/image` builds by default: `localhost/hoard:<version>`.
fn built_image() -> String {
    format!("localhost/hoard:{}", env!("CARGO_PKG_VERSION"))
}

/// Services that run the image `scripts/image` builds.
fn of_image(services: &[ComposeService]) -> impl Iterator<Item = &ComposeService> {
    services
        .iter()
        .filter(|s| text(&s.body["image"]).is_some_and(|i| i.starts_with("localhost/hoard:")))
}

/// Replicas are the services that run the image `scripts/image` builds as a server.
fn replicas(services: &[ComposeService]) -> Vec<&ComposeService> {
    of_image(services)
        .filter(|s| s.command.first().map(String::as_str) != Some("edge"))
        .collect()
}

/// Edges are the services that run it as `hoard edge`.
fn edges(services: &[ComposeService]) -> Vec<&ComposeService> {
    of_image(services)
        .filter(|s| s.command.first().map(String::as_str) == Some("edge"))
        .collect()
}

/// The replicas and the edge run the image as built, as its user, on a read-only root, and
/// their health check is the image's own shell-free `hoard health`.
#[test]
fn the_compose_replicas_run_the_built_image_read_only_with_its_health_check() {
    let services = compose_services();
    let replicas: Vec<&ComposeService> = of_image(&services).collect();
    assert!(!replicas.is_empty(), "no service runs the hoard image");
    for replica in replicas {
        let body = &replica.body;
        assert_eq!(
            text(&body["image"]),
            Some(built_image()),
            "{}",
            replica.name
        );
        assert!(
            body["build"].is_badvalue(),
            "{}: the image is built by scripts/image",
            replica.name
        );
        assert_eq!(body["read_only"].as_bool(), Some(true), "{}", replica.name);
        let user = text(&body["user"]).unwrap_or_default();
        assert_eq!(
            user.split(':').next().and_then(|u| u.parse::<u32>().ok()),
            Some(dockerfile_user()),
            "{}: the image's user",
            replica.name
        );
        let test = words(&body["healthcheck"]["test"]);
        assert_eq!(
            test,
            ["CMD", "/usr/local/bin/hoard", "health"],
            "{}",
            replica.name
        );
    }
}

/// Every variable the Compose file sets for hoard, and every flag it passes, exists.
#[test]
fn the_compose_file_sets_only_real_options_and_cloud_variables() {
    let services = compose_services();
    let mut problems = Vec::new();
    let replicas = replicas(&services);
    assert!(!replicas.is_empty(), "no service builds hoard");
    for replica in &replicas {
        check_variables(replica.env.keys(), &replica.name, &mut problems);
        check_flags(&replica.command, &replica.name, &mut problems);
        assert!(
            replica.command.is_empty() || replica.command[0] == "serve",
            "{}: the command must be serve and its flags: {:?}",
            replica.name,
            replica.command
        );
    }
    assert_none(&problems, "compose.yaml");
}

/// The edge runs `hoard edge` with only its real options, in front of the load balancer (a
/// service of the file, on the port it publishes), keeping its copies in a volume at the
/// image's data directory.
#[test]
fn the_compose_edge_sets_only_real_options_and_points_at_the_load_balancer() {
    let services = compose_services();
    let edges = edges(&services);
    assert_eq!(edges.len(), 1, "one edge");
    let edge = edges[0];
    let mut problems = Vec::new();
    check_variables_of("edge", edge.env.keys(), &edge.name, &mut problems);
    check_flags_of("edge", &edge.command[1..], &edge.name, &mut problems);
    assert_none(&problems, "compose.yaml");
    let origin = edge
        .env
        .get("HOARD_ORIGIN")
        .expect("the edge names its origin");
    let url = url::Url::parse(origin).unwrap();
    let host = url.host_str().unwrap();
    assert!(
        services.iter().any(|s| s.name == host),
        "{origin}: no service {host}"
    );
    assert_eq!(url.port(), Some(3000), "{origin}: the load balancer's port");
    let volumes = words(&edge.body["volumes"]);
    assert!(
        volumes.iter().any(|v| v.ends_with(":/data")),
        "the copies are in a volume at /data: {volumes:?}"
    );
}

/// Three replicas share one database (PostgreSQL), one bucket (S3) and one signing key, and in
/// fact every setting; the database, the S3 endpoint and the bucket they name exist in the file.
#[test]
fn the_compose_replicas_share_one_database_one_bucket_and_one_key() {
    let services = compose_services();
    let replicas = replicas(&services);
    assert_eq!(replicas.len(), 3, "compose.yaml should run 3 replicas");
    let first = &replicas[0].env;
    for replica in &replicas[1..] {
        assert_eq!(
            &replica.env, first,
            "{} and {} have different settings",
            replica.name, replicas[0].name
        );
    }
    let get = |name: &str| {
        first
            .get(name)
            .unwrap_or_else(|| panic!("the replicas do not set {name}"))
            .clone()
    };
    let database = get("HOARD_DATABASE_URL");
    assert!(database.starts_with("postgres://"), "{database}");
    let storage = get("HOARD_STORAGE_URL");
    assert!(storage.starts_with("s3://"), "{storage}");
    let key = get("HOARD_SIGNING_KEY");
    assert!(
        key.len() >= 32,
        "HOARD_SIGNING_KEY must have 32 characters or more"
    );

    let service = |name: &str| {
        services
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no service {name} in compose.yaml"))
    };
    // The database: its host is a service whose user, password and database match the URL.
    let db_url = url::Url::parse(&database).unwrap();
    let postgres = service(&url_host(&database));
    assert_eq!(postgres.env["POSTGRES_USER"], db_url.username());
    assert_eq!(
        Some(postgres.env["POSTGRES_PASSWORD"].as_str()),
        db_url.password()
    );
    assert_eq!(
        format!("/{}", postgres.env["POSTGRES_DB"]),
        db_url.path(),
        "the database named in HOARD_DATABASE_URL"
    );
    // The S3 server: the endpoint's host is a service with the replicas' credentials.
    let s3 = service(&url_host(&get("AWS_ENDPOINT_URL")));
    for name in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
        assert_eq!(
            s3.env.get(name),
            Some(&get(name)),
            "{name} of the S3 server"
        );
    }
    // The bucket is created, with the rule that aborts incomplete multipart uploads.
    let bucket = storage
        .trim_start_matches("s3://")
        .split('/')
        .next()
        .unwrap();
    let setup = services
        .iter()
        .map(|s| s.command.join(" "))
        .find(|c| c.contains("create-bucket"))
        .expect("a service creates the bucket");
    assert!(
        setup.contains(&format!("create-bucket --bucket {bucket}")),
        "{setup}"
    );
    assert!(setup.contains("AbortIncompleteMultipartUpload"), "{setup}");
}

/// The load balancer sends requests to exactly the replicas, on hoard's port, and streams
/// bodies instead of buffering them.
#[test]
fn the_load_balancer_streams_to_every_replica() {
    let services = compose_services();
    let replicas = replicas(&services);
    let lb = services
        .iter()
        .find(|s| {
            words(&s.body["volumes"])
                .iter()
                .any(|v| v.starts_with("./nginx.conf:"))
        })
        .expect("a service mounts nginx.conf");
    // Directives without comments, whitespace folded: `proxy_buffering off`.
    let conf = repo_file("contrib/scale-out/nginx.conf");
    let directives: Vec<String> = conf
        .lines()
        .map(|l| l.split_once('#').map_or(l, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n")
        .split([';', '{', '}'])
        .map(|d| d.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|d| !d.is_empty())
        .collect();
    for needed in [
        "client_max_body_size 0",
        "proxy_request_buffering off",
        "proxy_buffering off",
        "proxy_http_version 1.1",
        "proxy_set_header Host $http_host",
        "proxy_set_header X-Forwarded-Proto $scheme",
    ] {
        assert!(
            directives.iter().any(|d| d == needed),
            "nginx.conf lacks `{needed};`"
        );
    }
    let upstreams: BTreeSet<String> = directives
        .iter()
        .filter_map(|d| d.strip_prefix("server "))
        .map(|s| s.split_whitespace().next().unwrap().to_owned())
        .collect();
    let expected: BTreeSet<String> = replicas
        .iter()
        .map(|r| format!("{}:{}", r.name, listen_port(&r.env)))
        .collect();
    assert_eq!(upstreams, expected, "nginx.conf's upstream servers");
    let listen = directives
        .iter()
        .find_map(|d| d.strip_prefix("listen "))
        .expect("nginx.conf listens");
    assert!(
        words(&lb.body["ports"])
            .iter()
            .any(|p| p.ends_with(&format!(":{listen}"))),
        "{} publishes nginx's port {listen}",
        lb.name
    );
}

// ---------------------------------------------------------------------------------------------
// Kubernetes

fn kubernetes_documents() -> Vec<Yaml> {
    let docs = load_yaml("contrib/scale-out/kubernetes.yaml");
    for doc in &docs {
        assert!(
            text(&doc["kind"]).is_some() && text(&doc["apiVersion"]).is_some(),
            "a document without kind or apiVersion: {doc:?}"
        );
    }
    docs
}

fn of_kind<'a>(docs: &'a [Yaml], kind: &str) -> Vec<&'a Yaml> {
    docs.iter()
        .filter(|d| text(&d["kind"]).as_deref() == Some(kind))
        .collect()
}

fn named<'a>(docs: &'a [Yaml], kind: &str, name: &str) -> &'a Yaml {
    of_kind(docs, kind)
        .into_iter()
        .find(|d| text(&d["metadata"]["name"]).as_deref() == Some(name))
        .unwrap_or_else(|| panic!("kubernetes.yaml has no {kind} {name}"))
}

/// The one Deployment's hoard container.
fn hoard_container(docs: &[Yaml]) -> &Yaml {
    let deployments = of_kind(docs, "Deployment");
    assert_eq!(deployments.len(), 1, "one Deployment");
    let containers = list(&deployments[0]["spec"]["template"]["spec"]["containers"]);
    assert_eq!(containers.len(), 1, "one container");
    &containers[0]
}

/// The container's environment: `env` values, and the keys of the Secrets and ConfigMaps it
/// takes with `envFrom` (which must be in the file).
fn container_env(docs: &[Yaml], container: &Yaml) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for source in list(&container["envFrom"]) {
        let (kind, reference) = if !source["secretRef"].is_badvalue() {
            ("Secret", &source["secretRef"])
        } else {
            ("ConfigMap", &source["configMapRef"])
        };
        let doc = named(docs, kind, &text(&reference["name"]).unwrap());
        for field in ["data", "stringData"] {
            for (k, v) in hash_entries(&doc[field]) {
                env.insert(k, text(v).unwrap_or_default());
            }
        }
    }
    for var in list(&container["env"]) {
        env.insert(
            text(&var["name"]).unwrap(),
            text(&var["value"]).unwrap_or_default(),
        );
    }
    env
}

/// Every variable the Deployment gives hoard (directly or from its Secret) and every flag in
/// its arguments exists; the replicas share a database, a bucket and a signing key.
#[test]
fn the_kubernetes_deployment_sets_only_real_options_and_cloud_variables() {
    let docs = kubernetes_documents();
    let container = hoard_container(&docs);
    let env = container_env(&docs, container);
    let mut problems = Vec::new();
    check_variables(env.keys(), "the Deployment", &mut problems);
    let mut args = words(&container["command"]);
    args.extend(words(&container["args"]));
    check_flags(&args, "the Deployment", &mut problems);
    assert_none(&problems, "kubernetes.yaml");

    let deployment = of_kind(&docs, "Deployment")[0];
    assert_eq!(deployment["spec"]["replicas"].as_i64(), Some(3));
    assert!(env["HOARD_DATABASE_URL"].starts_with("postgres://"));
    let storage = &env["HOARD_STORAGE_URL"];
    assert!(
        ["s3://", "gs://", "az://"]
            .iter()
            .any(|s| storage.starts_with(s)),
        "{storage}"
    );
    assert!(env["HOARD_SIGNING_KEY"].len() >= 32);
}

/// Liveness asks /healthz and readiness /readyz, on the port hoard listens on; the Service
/// and the Ingress lead to that port; the pod runs as the image's unprivileged user on a
/// read-only root file system.
#[test]
fn the_kubernetes_probes_ask_healthz_and_readyz_on_hoards_port() {
    let docs = kubernetes_documents();
    let container = hoard_container(&docs);
    let env = container_env(&docs, container);
    let port = listen_port(&env);
    let ports: BTreeMap<String, i64> = list(&container["ports"])
        .iter()
        .map(|p| {
            (
                text(&p["name"]).unwrap_or_default(),
                p["containerPort"].as_i64().unwrap(),
            )
        })
        .collect();
    let resolve = |port: &Yaml| match port {
        Yaml::Integer(n) => *n,
        named => *ports
            .get(&text(named).unwrap())
            .unwrap_or_else(|| panic!("no container port named {named:?}")),
    };
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(text(&get["path"]).as_deref(), Some(path), "{probe}");
        assert_eq!(resolve(&get["port"]), i64::from(port), "{probe}'s port");
    }
    let startup = &container["startupProbe"]["httpGet"];
    if !startup.is_badvalue() {
        assert!(matches!(
            text(&startup["path"]).as_deref(),
            Some("/healthz" | "/readyz")
        ));
        assert_eq!(resolve(&startup["port"]), i64::from(port));
    }

    let service = of_kind(&docs, "Service")[0];
    let service_name = text(&service["metadata"]["name"]).unwrap();
    let service_ports = list(&service["spec"]["ports"]);
    assert!(
        service_ports
            .iter()
            .any(|p| resolve(&p["targetPort"]) == i64::from(port)),
        "the Service leads to hoard's port"
    );
    for ingress in of_kind(&docs, "Ingress") {
        for rule in list(&ingress["spec"]["rules"]) {
            for path in list(&rule["http"]["paths"]) {
                let backend = &path["backend"]["service"];
                assert_eq!(text(&backend["name"]), Some(service_name.clone()));
            }
        }
        let annotations: BTreeMap<String, String> =
            hash_entries(&ingress["metadata"]["annotations"])
                .into_iter()
                .map(|(k, v)| (k, text(v).unwrap()))
                .collect();
        for (name, value) in [
            ("nginx.ingress.kubernetes.io/proxy-body-size", "0"),
            ("nginx.ingress.kubernetes.io/proxy-request-buffering", "off"),
            ("nginx.ingress.kubernetes.io/proxy-buffering", "off"),
        ] {
            assert_eq!(annotations.get(name).map(String::as_str), Some(value));
        }
    }

    let deployment = of_kind(&docs, "Deployment")[0];
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    assert_eq!(
        container["securityContext"]["readOnlyRootFilesystem"].as_bool(),
        Some(true)
    );
    let image_user = dockerfile_user();
    assert_eq!(
        pod["securityContext"]["runAsUser"].as_i64(),
        Some(i64::from(image_user)),
        "the pod's user is the image's"
    );
    // The image as scripts/image tags it, pushed to the user's registry; it has no shell or
    // other program to exec, so no hook or probe may run one.
    let image = text(&container["image"]).unwrap();
    assert!(
        image.ends_with(&format!("/hoard:{}", env!("CARGO_PKG_VERSION"))),
        "{image}"
    );
    for hook in ["preStop", "postStart"] {
        assert!(
            container["lifecycle"][hook]["exec"].is_badvalue(),
            "{hook} execs a program the image does not have"
        );
    }
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        let exec = words(&container[probe]["exec"]["command"]);
        assert!(
            exec.is_empty() || exec == ["/usr/local/bin/hoard", "health"],
            "{probe} execs {exec:?}"
        );
    }
}

/// The edge's DaemonSet runs `hoard edge` with only its real options, in front of the
/// replicas' Service, with its probes on its port, as the image's user on a read-only root,
/// its copies in a volume at the image's data directory.
#[test]
fn the_kubernetes_edge_runs_on_every_node_in_front_of_the_service() {
    let docs = kubernetes_documents();
    let daemonset = named(&docs, "DaemonSet", "hoard-edge");
    let pod = &daemonset["spec"]["template"]["spec"];
    let containers = list(&pod["containers"]);
    assert_eq!(containers.len(), 1, "one container");
    let container = &containers[0];
    let env = container_env(&docs, container);
    let args = words(&container["args"]);
    assert_eq!(args.first().map(String::as_str), Some("edge"));
    let mut problems = Vec::new();
    check_variables_of("edge", env.keys(), "the DaemonSet", &mut problems);
    check_flags_of("edge", &args[1..], "the DaemonSet", &mut problems);
    assert_none(&problems, "kubernetes.yaml");

    let origin = url::Url::parse(&env["HOARD_ORIGIN"]).unwrap();
    let service = named(&docs, "Service", "hoard");
    let namespace = text(&service["metadata"]["namespace"]).unwrap();
    assert_eq!(
        origin.host_str(),
        Some(format!("hoard.{namespace}.svc").as_str()),
        "the edge's origin is the Service"
    );
    let service_ports: Vec<i64> = list(&service["spec"]["ports"])
        .iter()
        .filter_map(|p| p["port"].as_i64())
        .collect();
    assert!(service_ports.contains(&i64::from(origin.port().unwrap_or(80))));

    let port = listen_port(&env);
    let http = list(&container["ports"])
        .iter()
        .find(|p| text(&p["name"]).as_deref() == Some("http"))
        .expect("a port named http");
    assert_eq!(http["containerPort"].as_i64(), Some(i64::from(port)));
    assert!(
        http["hostPort"].as_i64().is_some(),
        "runners reach it on the node's address"
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(text(&get["path"]).as_deref(), Some(path), "{probe}");
        assert_eq!(text(&get["port"]).as_deref(), Some("http"), "{probe}");
    }
    assert_eq!(
        pod["securityContext"]["runAsUser"].as_i64(),
        Some(i64::from(dockerfile_user()))
    );
    assert_eq!(
        container["securityContext"]["readOnlyRootFilesystem"].as_bool(),
        Some(true)
    );
    let mounts = list(&container["volumeMounts"]);
    assert!(
        mounts
            .iter()
            .any(|m| text(&m["mountPath"]).as_deref() == Some("/data")),
        "the copies in a volume at the image's data directory"
    );
}

// ---------------------------------------------------------------------------------------------
// Helm

/// `helm` as scripts/clients builds it (from its Go module).
fn helm() -> std::path::PathBuf {
    let helm = common::clients::clients_dir().join("bin/helm");
    let runs = Command::new(&helm)
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        runs,
        "{} does not run: run scripts/clients (scripts/test does)",
        helm.display()
    );
    helm
}

/// `helm ARGS` on the chart; its standard output.
fn helm_on_chart(args: &[&str]) -> String {
    let out = Command::new(helm())
        .args(args)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/helm/hoard"))
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "helm {args:?}:\n{said}");
    String::from_utf8(out.stdout).unwrap()
}

/// The chart rendered as `helm install hoard` into namespace `ci` would, with `set`.
fn rendered(set: &[&str]) -> Vec<Yaml> {
    let mut args = vec!["template", "hoard", "--namespace", "ci"];
    for s in set {
        args.extend(["--set", s]);
    }
    // The chart's path comes last: `helm template NAME … CHART`.
    let text = helm_on_chart(&args);
    YamlLoader::load_from_str(&text)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// The chart (contrib/helm/hoard) lints clean and renders an origin of replicas and an edge on
/// every node that name only real options, share their settings from one Secret, run as the
/// image's user on a read-only root with probes on their port, and the edge in front of the
/// Service; switches do what they say.
#[test]
#[cfg_attr(
    not(feature = "full-tests"),
    ignore = "full tier (scripts/test): needs helm from scripts/clients"
)]
fn the_helm_chart_lints_and_renders_the_origin_and_an_edge_on_every_node() {
    helm_on_chart(&["lint", "--strict"]);
    let docs = rendered(&[]);
    let deployment = named(&docs, "Deployment", "hoard");
    let daemonset = named(&docs, "DaemonSet", "hoard-edge");
    let service = named(&docs, "Service", "hoard");
    let mut problems = Vec::new();
    for (workload, mode) in [(deployment, "serve"), (daemonset, "edge")] {
        let pod = &workload["spec"]["template"]["spec"];
        let containers = list(&pod["containers"]);
        assert_eq!(containers.len(), 1, "{mode}: one container");
        let container = &containers[0];
        let args = words(&container["args"]);
        assert_eq!(args, [mode]);
        let env = container_env(&docs, container);
        check_variables_of(mode, env.keys(), mode, &mut problems);
        let port = listen_port(&env);
        let http = list(&container["ports"])
            .iter()
            .find(|p| text(&p["name"]).as_deref() == Some("http"))
            .unwrap_or_else(|| panic!("{mode}: a port named http"));
        assert_eq!(
            http["containerPort"].as_i64(),
            Some(i64::from(port)),
            "{mode}"
        );
        for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
            let get = &container[probe]["httpGet"];
            assert_eq!(text(&get["path"]).as_deref(), Some(path), "{mode}: {probe}");
            assert_eq!(
                text(&get["port"]).as_deref(),
                Some("http"),
                "{mode}: {probe}"
            );
        }
        assert_eq!(
            pod["securityContext"]["runAsUser"].as_i64(),
            Some(i64::from(dockerfile_user())),
            "{mode}: the image's user"
        );
        assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
        assert_eq!(
            container["securityContext"]["readOnlyRootFilesystem"].as_bool(),
            Some(true),
            "{mode}"
        );
        let image = text(&container["image"]).unwrap();
        assert!(
            image.ends_with(&format!("/hoard:{}", env!("CARGO_PKG_VERSION"))),
            "{image}"
        );
        if mode == "serve" {
            assert!(env["HOARD_DATABASE_URL"].starts_with("postgres://"));
            assert!(env["HOARD_SIGNING_KEY"].len() >= 32);
            assert!(env["HOARD_STORAGE_URL"].starts_with("s3://"));
        } else {
            let origin = url::Url::parse(&env["HOARD_ORIGIN"]).unwrap();
            assert_eq!(
                origin.host_str(),
                Some("hoard.ci.svc"),
                "the edge's origin is the Service"
            );
            let ports: Vec<i64> = list(&service["spec"]["ports"])
                .iter()
                .filter_map(|p| p["port"].as_i64())
                .collect();
            assert!(ports.contains(&i64::from(origin.port().unwrap_or(80))));
            assert!(
                http["hostPort"].as_i64().is_some(),
                "runners reach it on the node's address"
            );
            let mounts = list(&container["volumeMounts"]);
            assert!(mounts
                .iter()
                .any(|m| text(&m["mountPath"]).as_deref() == Some("/data")));
        }
    }
    assert_none(&problems, "the chart");
    assert_eq!(deployment["spec"]["replicas"].as_i64(), Some(3));

    // Switches.
    let docs = rendered(&[
        "edge.enabled=false",
        "origin.existingSecret=mine",
        "origin.replicas=5",
    ]);
    assert!(of_kind(&docs, "DaemonSet").is_empty(), "no edge");
    assert!(of_kind(&docs, "Secret").is_empty(), "the user's own Secret");
    let deployment = named(&docs, "Deployment", "hoard");
    assert_eq!(deployment["spec"]["replicas"].as_i64(), Some(5));
    let container = &list(&deployment["spec"]["template"]["spec"]["containers"])[0];
    let from = &list(&container["envFrom"])[0]["secretRef"]["name"];
    assert_eq!(text(from).as_deref(), Some("mine"));
}

// ---------------------------------------------------------------------------------------------
// Dockerfile

/// The numeric user of the Dockerfile's last `USER` line.
fn dockerfile_user() -> u32 {
    let dockerfile = repo_file("Dockerfile");
    let user = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("USER "))
        .next_back()
        .expect("the Dockerfile sets a USER");
    user.split(':').next().unwrap().trim().parse().unwrap()
}

/// The image is made FROM scratch out of what scripts/image lays out (a locked release build),
/// runs `hoard serve` as an unprivileged numeric user on port 3000 with /data as its data
/// directory, carries OCI labels and a shell-free health check, sets only real options, and its
/// build context (.dockerignore) holds everything it copies.
#[test]
fn the_dockerfile_runs_the_locked_release_build_unprivileged_from_scratch() {
    let dockerfile = repo_file("Dockerfile");
    // Continuation lines joined: one instruction per entry.
    let joined = dockerfile.replace("\\\n", " ");
    let instructions: Vec<&str> = joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let from: Vec<&str> = instructions
        .iter()
        .filter_map(|l| l.strip_prefix("FROM "))
        .collect();
    assert_eq!(from, ["scratch"], "nothing but what scripts/image lays out");
    let script = repo_file("scripts/image");
    assert!(
        script.contains("cargo build --release --locked"),
        "the build must use Cargo.lock as it is"
    );
    assert!(
        script.contains("ca-certificates.crt"),
        "the image needs CA certificates for the object stores' HTTPS"
    );
    assert!(dockerfile_user() >= 1000, "a non-root, non-system user");
    for expected in [
        r#"ENTRYPOINT ["/usr/local/bin/hoard"]"#,
        r#"CMD ["serve"]"#,
        "WORKDIR /data",
        r#"VOLUME ["/data"]"#,
    ] {
        assert!(instructions.contains(&expected), "{expected}");
    }
    let healthcheck = instructions
        .iter()
        .find_map(|l| l.strip_prefix("HEALTHCHECK "))
        .expect("a HEALTHCHECK");
    assert!(
        healthcheck.ends_with(r#"CMD ["/usr/local/bin/hoard", "health"]"#),
        "{healthcheck}"
    );
    for label in ["source", "version", "licenses"] {
        assert!(
            joined.contains(&format!("org.opencontainers.image.{label}=")),
            "the {label} label"
        );
    }

    let mut env = BTreeMap::new();
    for line in instructions.iter().filter_map(|l| l.strip_prefix("ENV ")) {
        for pair in line.split_whitespace() {
            let (k, v) = pair.split_once('=').expect("ENV NAME=value");
            env.insert(k.to_owned(), v.to_owned());
        }
    }
    assert_eq!(
        env.get("HOARD_LISTEN").map(String::as_str),
        Some("0.0.0.0:3000")
    );
    assert_eq!(env.get("HOARD_DATA_DIR").map(String::as_str), Some("/data"));
    env.remove("SSL_CERT_FILE"); // read by rustls-native-certs, not a hoard option
    let mut problems = Vec::new();
    check_variables(env.keys(), "the Dockerfile", &mut problems);
    assert_none(&problems, "Dockerfile");

    // `*` then `!path` lines: the context is exactly the re-included paths.
    let ignore = repo_file(".dockerignore");
    let kept: Vec<&str> = ignore
        .lines()
        .filter_map(|l| l.trim().strip_prefix('!'))
        .map(|p| p.trim_end_matches('/'))
        .collect();
    assert!(ignore.lines().any(|l| l.trim() == "*"), ".dockerignore");
    for copy in instructions.iter().filter_map(|l| l.strip_prefix("COPY ")) {
        let parts: Vec<&str> = copy
            .split_whitespace()
            .filter(|p| !p.starts_with("--"))
            .collect();
        for source in &parts[..parts.len() - 1] {
            assert!(
                kept.contains(&source.trim_end_matches('/')),
                ".dockerignore leaves {source} out of the build context"
            );
            assert!(
                script.contains(source.trim_end_matches('/')),
                "scripts/image does not lay out {source}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// docs/scale-out.md

/// The words of `text` that start with `prefix` at a word boundary and go on with characters
/// accepted by `more` (trailing `-` and `_` dropped).
fn tokens(text: &str, prefix: &str, more: impl Fn(char) -> bool) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut from = 0;
    while let Some(at) = text[from..].find(prefix) {
        let start = from + at;
        from = start + prefix.len();
        let before = text[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-') {
            continue;
        }
        let rest: String = text[from..].chars().take_while(|&c| more(c)).collect();
        let rest = rest.trim_end_matches(['-', '_']);
        if rest.chars().next().is_some_and(|c| c.is_ascii_alphabetic()) {
            found.insert(format!("{prefix}{rest}"));
        }
    }
    found
}

/// Whether `scripts/image` takes `flag` (an arm of its argument `case`).
fn image_script_flag(flag: &str) -> bool {
    repo_file("scripts/image")
        .lines()
        .any(|l| l.trim_start().starts_with(&format!("{flag})")))
}

/// Every flag, `HOARD_*` variable and cloud variable that docs/scale-out.md names exists: in
/// `hoard serve --help` (`hoard gc` and `hoard caches` for theirs), `scripts/image`, in
/// [`CLOUD_VARIABLES`], or, for flags, in [`OTHER_PROGRAMS_FLAGS`].
#[test]
fn the_scale_out_page_names_only_real_options_and_variables() {
    let page = repo_file("docs/scale-out.md");
    let mut problems = Vec::new();
    let flags = tokens(&page, "--", |c| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
    });
    assert!(flags.len() >= 20, "only {} flags found", flags.len());
    for flag in &flags {
        let known = has_flag(help("serve"), flag)
            || has_flag(help("gc"), flag)
            // The page's section on edges names theirs.
            || has_flag(help("edge"), flag)
            || image_script_flag(flag)
            || OTHER_PROGRAMS_FLAGS.contains(&flag.as_str());
        if !known {
            problems.push(format!("{flag} is not a flag of hoard serve or hoard edge"));
        }
    }
    let variables = tokens(&page, "HOARD_", |c| {
        c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'
    });
    assert!(!variables.is_empty());
    for name in &variables {
        if !has_variable(help("serve"), name)
            && !has_variable(help("caches"), name)
            && !has_variable(help("edge"), name)
        {
            problems.push(format!("{name} is not a variable of hoard"));
        }
    }
    for prefix in CLOUD_PREFIXES {
        let names: Vec<String> = tokens(&page, prefix, |c| {
            c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'
        })
        .into_iter()
        .filter(|n| !NAMED_AS_NOT_READ.contains(&n.as_str()))
        .collect();
        check_variables(names.iter(), "docs/scale-out.md", &mut problems);
    }
    assert_none(&problems, "docs/scale-out.md");
}

/// Each name in [`CLOUD_VARIABLES`] is one the `object_store` crate's configuration parser
/// accepts, as `from_env` passes it (lower case), so the allow-list cannot drift from the crate.
#[test]
fn the_cloud_variable_allow_list_names_only_what_object_store_reads() {
    use object_store::aws::AmazonS3ConfigKey;
    use object_store::azure::AzureConfigKey;
    use object_store::gcp::GoogleConfigKey;
    let mut problems = Vec::new();
    for name in CLOUD_VARIABLES {
        let key = name.to_ascii_lowercase();
        let read = if name.starts_with("AWS_") {
            key.parse::<AmazonS3ConfigKey>().is_ok()
        } else if name.starts_with("GOOGLE_") {
            key.parse::<GoogleConfigKey>().is_ok()
        } else if name.starts_with("AZURE_") {
            key.parse::<AzureConfigKey>().is_ok()
        } else {
            // Read with std::env::var by the Azure builder, not through the parser.
            *name == "AZURITE_BLOB_STORAGE_URL"
        };
        if !read {
            problems.push(format!("{name} is not read by object_store"));
        }
    }
    for name in NAMED_AS_NOT_READ {
        let key = name.to_ascii_lowercase();
        assert!(
            key.parse::<AmazonS3ConfigKey>().is_err(),
            "{name} is read by object_store after all: list it in CLOUD_VARIABLES"
        );
    }
    assert_none(&problems, "CLOUD_VARIABLES");
}
