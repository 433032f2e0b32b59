//! Imports point one way (issue 22). Between crates Cargo enforces it, and the manifests are
//! checked here: the server (`hoard-server`) depends on the vocabulary (`hoard-model`) and never
//! on the command-line clients (`hoard-cli`) or the benchmark (`hoard-bench`); the vocabulary and
//! the clients depend on no other crate of hoard but `hoard-model`.
//!
//! Inside the server, a module may use the modules below it in [`LAYERS`], never one above, so
//! that the vocabulary at the bottom can change without the layers above it pulling each other
//! along. `api` is narrower still: it turns HTTP into domain calls and may use only
//! [`API_MAY_USE`], never the stores (`meta`, `blob`) the domain hides.
//!
//! The check reads the source text of `crates/hoard-server/src/**/*.rs`: every `crate::X` path (in `use` lines,
//! `use crate::{a, b::c}` groups over several lines, and paths written inline) names module `X`.
//! `super::` and `self::` stay inside a module and are free. Comments and string literals are
//! not read. A path to an item of the crate root (`crate::open_cache`) names `lib`.

#![allow(clippy::unwrap_used)]

use std::fmt;
use std::path::{Path, PathBuf};

/// The allowed order, lowest first: a module may use modules of lower layers only.
const LAYERS: &[&[&str]] = &[
    &["secret"],
    &["model"],
    &["metrics"],
    &["auth", "blob", "meta"],
    &["cache"],
    &["config"],
    &["api"],
    &["lib", "tls", "conn"],
];

/// What `api` may use besides itself.
const API_MAY_USE: &[&str] = &["cache", "auth", "model", "config", "metrics", "secret"];

/// Imports within one layer that are allowed, as (from, to): a connection may be a TLS one.
const SAME_LAYER: &[(&str, &str)] = &[("conn", "tls")];

/// A module using one it may not.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Violation {
    file: String,
    line: usize,
    from: String,
    to: String,
    why: &'static str,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: `{}` imports `{}` ({})",
            self.file, self.line, self.from, self.to, self.why
        )
    }
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The top-level module a file under `src/` belongs to: `src/lib.rs` is `lib`, `src/main.rs`
/// is `main`, `src/cache.rs` and everything under `src/cache/` is `cache`.
fn module_of(path: &str) -> Option<String> {
    let relative = path.replace('\\', "/");
    let relative = relative
        .rsplit_once("src/")
        .map_or(relative.as_str(), |(_, r)| r);
    let first = relative.split('/').next()?;
    Some(first.strip_suffix(".rs").unwrap_or(first).to_owned())
}

/// Why `from` may not use `to`, or `None` when it may.
fn refusal(from: &str, to: &str) -> Option<&'static str> {
    if from == to {
        return None;
    }
    let (Some(low), Some(high)) = (layer_of(to), layer_of(from)) else {
        return Some("a module missing from the written order: give it a layer in LAYERS");
    };
    if from == "api" && !API_MAY_USE.contains(&to) {
        return Some("api may use only cache, auth, model, config, metrics and secret");
    }
    if low > high {
        return Some("a lower layer imports a higher one");
    }
    if low == high && !SAME_LAYER.contains(&(from, to)) {
        return Some("modules of one layer import each other without being listed in SAME_LAYER");
    }
    None
}

/// `text` with comments, string literals and character literals blanked out (newlines kept,
/// so offsets still give the right line).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let prev = i.checked_sub(1).map(|p| chars[p]);
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            // Block comments nest in Rust.
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
        } else if c == 'r'
            && !prev.is_some_and(|p| is_ident(p) && p != 'b')
            && matches!(next, Some('"' | '#'))
        {
            // A raw string r"…", r#"…"#, br"…": ends at a quote followed by as many hashes.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            while j < chars.len() {
                if chars[j] == '"' && (1..=hashes).all(|h| chars.get(j + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &skipped in &chars[i..j.min(chars.len())] {
                blank(&mut out, skipped);
            }
            i = j;
        } else if c == '"' {
            blank(&mut out, c);
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
                if i < chars.len() {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
            if i < chars.len() {
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '\'' && !prev.is_some_and(is_ident) {
            // A character literal ('x', '\n', '\u{..}'), or else a lifetime ('a), kept.
            let end = if next == Some('\\') {
                chars[i + 2..]
                    .iter()
                    .position(|&ch| ch == '\'')
                    .map(|p| i + 2 + p)
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(end) => {
                    for &skipped in &chars[i..=end] {
                        blank(&mut out, skipped);
                    }
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Every top-level name a `crate::` path of `text` reaches, with its line: `crate::a::b` gives
/// `a`; `crate::{a, b::{c, d}}` gives `a` and `b`. A name that is no module in [`LAYERS`] or
/// [`ROOT_MODULES`] is an item of the crate root and counts as `lib`.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let code: Vec<char> = code_only(text).chars().collect();
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let line_at = |at: usize| 1 + code[..at].iter().filter(|&&c| c == '\n').count();
    let skip_space = |mut at: usize| {
        while at < code.len() && code[at].is_whitespace() {
            at += 1;
        }
        at
    };
    let ident_at = |at: usize| {
        let end = (at..code.len())
            .find(|&j| !is_ident(code[j]))
            .unwrap_or(code.len());
        code[at..end].iter().collect::<String>()
    };
    let mut found = Vec::new();
    let name = |at: usize, found: &mut Vec<(usize, String)>| {
        let ident = ident_at(at);
        match ident.as_str() {
            "" | "self" => {}
            _ => found.push((line_at(at), ident)),
        }
    };
    let mut i = 0;
    while i + 5 <= code.len() {
        let word: String = code[i..i + 5].iter().collect();
        let starts_word = i == 0 || !is_ident(code[i - 1]);
        let ends_word = code.get(i + 5).is_none_or(|&c| !is_ident(c));
        if word != "crate" || !starts_word || !ends_word {
            i += 1;
            continue;
        }
        let at = skip_space(i + 5);
        if code.get(at) != Some(&':') || code.get(at + 1) != Some(&':') {
            i += 5;
            continue;
        }
        let at = skip_space(at + 2);
        if code.get(at) == Some(&'{') {
            // A group: the first name of every item at its top level.
            let mut j = skip_space(at + 1);
            let mut depth = 1;
            let mut item_start = true;
            while j < code.len() && depth > 0 {
                match code[j] {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => item_start = true,
                    c if item_start && depth == 1 && is_ident(c) => {
                        name(j, &mut found);
                        item_start = false;
                    }
                    c if item_start && !c.is_whitespace() => item_start = false,
                    _ => {}
                }
                j += 1;
            }
            i = j;
        } else {
            name(at, &mut found);
            i = at;
        }
    }
    found
        .into_iter()
        .map(|(line, ident)| {
            let module = if layer_of(&ident).is_some() || ROOT_MODULES.contains(&ident.as_str()) {
                ident
            } else {
                "lib".to_owned()
            };
            (line, module)
        })
        .collect()
}

/// Modules the crate root declares that [`LAYERS`] must place: a module declared in
/// `src/lib.rs` but missing here makes [`every_module_of_the_crate_has_a_layer`] fail.
const ROOT_MODULES: &[&str] = &[
    "api", "auth", "blob", "cache", "config", "conn", "meta", "metrics", "model", "secret", "tls",
];

/// The violations in one file of `src/`, given its path and text.
fn check(path: &str, text: &str) -> Vec<Violation> {
    let Some(from) = module_of(path) else {
        return Vec::new();
    };
    crate_paths(text)
        .into_iter()
        .filter_map(|(line, to)| {
            refusal(&from, &to).map(|why| Violation {
                file: path.to_owned(),
                line,
                from: from.clone(),
                to,
                why,
            })
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The server crate's directory.
fn server() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/hoard-server")
}

fn source_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(&server().join("src"), &mut files);
    files.sort();
    assert!(files.len() > 20, "found the sources: {files:?}");
    files
}

#[test]
fn every_import_points_down() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut violations = Vec::new();
    for file in source_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let shown = file.strip_prefix(root).unwrap().display().to_string();
        violations.extend(check(&shown, &text));
    }
    let list: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert!(
        list.is_empty(),
        "{} import(s) against the order {LAYERS:?}:\n{}",
        list.len(),
        list.join("\n")
    );
}

#[test]
fn every_module_of_the_crate_has_a_layer() {
    let lib = std::fs::read_to_string(server().join("src/lib.rs")).unwrap();
    let declared: Vec<String> = code_only(&lib)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l
                .strip_prefix("pub mod ")
                .or_else(|| l.strip_prefix("pub(crate) mod "))
                .or_else(|| l.strip_prefix("mod "))?;
            Some(rest.trim_end_matches(';').trim().to_owned())
        })
        .collect();
    assert!(!declared.is_empty());
    for module in &declared {
        assert!(
            layer_of(module).is_some() && ROOT_MODULES.contains(&module.as_str()),
            "the server's lib.rs declares `mod {module}`: place it in LAYERS and ROOT_MODULES"
        );
    }
}

// The checker itself: shown to fail on what it must catch.

#[test]
fn an_upward_import_is_caught_with_file_line_and_modules() {
    let text = "//! The vocabulary.\n\nuse std::fmt;\nuse crate::cache::Cache;\n";
    assert_eq!(
        check("src/model.rs", text),
        [Violation {
            file: "src/model.rs".into(),
            line: 4,
            from: "model".into(),
            to: "cache".into(),
            why: "a lower layer imports a higher one",
        }]
    );
    let shown = check("src/model.rs", text)[0].to_string();
    assert!(
        shown.starts_with("src/model.rs:4: `model` imports `cache`"),
        "{shown}"
    );
    // Inline paths count as much as `use` lines.
    let inline = "fn f() -> u64 { crate::config::parse_size(\"1\").unwrap() }";
    assert_eq!(check("src/cache/lifecycle.rs", inline)[0].to, "config");
}

#[test]
fn groups_and_multi_line_uses_are_read() {
    let text = "use crate::{\n    model::Totals,\n    secret::{Secret, SecretText},\n    meta::{\n        MetaStore,\n    },\n};\n";
    let found = crate_paths(text);
    assert_eq!(
        found,
        [
            (2, "model".to_owned()),
            (3, "secret".to_owned()),
            (4, "meta".to_owned())
        ]
    );
    let v = check("src/metrics.rs", text);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!((v[0].line, v[0].to.as_str()), (4, "meta"));
    assert_eq!(
        crate_paths("use crate :: { self as root, cache :: Cache };"),
        [(1, "cache".to_owned())]
    );
}

#[test]
fn api_may_not_reach_the_stores_even_though_they_are_lower() {
    let v = check(
        "src/api/blob.rs",
        "use crate::blob::BlobError;\nuse crate::cache::Cache;\n",
    );
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!((v[0].from.as_str(), v[0].to.as_str()), ("api", "blob"));
    assert!(check("src/api/mod.rs", "use crate::config::Limits;").is_empty());
}

#[test]
fn one_layer_may_not_import_itself_unless_listed() {
    assert_eq!(check("src/auth/verify.rs", "use crate::meta::X;").len(), 1);
    assert!(check("src/conn.rs", "use crate::tls::Reloadable;").is_empty());
    assert_eq!(check("src/tls.rs", "use crate::conn::App;").len(), 1);
    assert_eq!(check("src/tls.rs", "use crate::bench::Y;").len(), 1);
}

#[test]
fn comments_strings_super_and_self_are_not_imports() {
    let text = r##"
        //! Unlike `crate::api`, this module ...
        /* crate::cache::Cache /* nested crate::api */ */
        use super::Cache;
        use self::inner::Thing;
        const HINT: &str = "see crate::api::router";
        const RAW: &str = r#"crate::cache "quoted" crate::api"#;
        const QUOTE: char = '"';
        fn f<'a>(x: &'a str) -> &'a str { x }
        use crate::secret::Secret;
    "##;
    assert_eq!(crate_paths(text), [(10, "secret".to_owned())]);
    assert!(check("src/model.rs", text).is_empty());
    assert_eq!(crate_paths("pub(crate) fn f() {}"), []);
}

#[test]
fn files_belong_to_their_top_level_module() {
    assert_eq!(module_of("src/lib.rs").as_deref(), Some("lib"));
    assert_eq!(
        module_of("src/cache/lifecycle.rs").as_deref(),
        Some("cache")
    );
    assert_eq!(
        module_of("src/meta/sqlite/store.rs").as_deref(),
        Some("meta")
    );
    assert_eq!(module_of("src/model.rs").as_deref(), Some("model"));
}

// Between crates.

/// The crates of hoard (`hoard-…`) the manifest at `dir` depends on, in any of its dependency
/// tables (normal, dev and build).
fn hoard_dependencies(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    let manifest: toml::Table = toml::from_str(&text).unwrap();
    let mut found: Vec<String> = ["dependencies", "dev-dependencies", "build-dependencies"]
        .iter()
        .filter_map(|table| manifest.get(*table).and_then(toml::Value::as_table))
        .flat_map(|deps| deps.keys().cloned())
        .filter(|name| name.starts_with("hoard"))
        .collect();
    found.sort();
    found.dedup();
    found
}

#[test]
fn the_server_depends_on_neither_the_clients_nor_the_benchmark() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates");
    // The vocabulary depends on nothing of hoard: the server's dependencies on hoard are then
    // all of its transitive ones.
    assert_eq!(hoard_dependencies(&crates.join("hoard-model")), [""; 0]);
    assert_eq!(hoard_dependencies(&server()), ["hoard-model"]);
    // The clients share only the vocabulary with the server.
    assert_eq!(
        hoard_dependencies(&crates.join("hoard-cli")),
        ["hoard-model"]
    );
    // The benchmark drives and preloads a server, and the edge speaks its protocols (their
    // paths, ranges, the transfer memory): the only crates beside the binary that may.
    assert_eq!(
        hoard_dependencies(&crates.join("hoard-bench")),
        ["hoard-model", "hoard-server"]
    );
    assert_eq!(
        hoard_dependencies(&crates.join("hoard-edge")),
        ["hoard-model", "hoard-server"]
    );
}

#[test]
fn the_manifest_check_sees_a_dependency() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("Cargo.toml"),
        "[package]\nname = \"x\"\n[dependencies]\nhoard-cli.workspace = true\nserde = \"1\"\n[dev-dependencies]\nhoard-bench = { path = \"../b\" }\n",
    )
    .unwrap();
    assert_eq!(hoard_dependencies(dir.path()), ["hoard-bench", "hoard-cli"]);
}
