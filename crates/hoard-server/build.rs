//! Lists each database's migrations from its folder, `src/meta/migrations/<database>/`: a file
//! `NNNN_what.sql` is migration NNNN by being there, and the folder is the only list. The
//! numbers must run from 1 without a gap, or the build stops and says which is missing.

use std::path::{Path, PathBuf};

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let mut out = String::new();
    for database in ["sqlite", "postgres", "mysql"] {
        let dir = root.join("src/meta/migrations").join(database);
        // A file added or removed changes the folder; a file's text is tracked by include_str.
        println!("cargo:rerun-if-changed={}", dir.display());
        let migrations = numbered(&dir);
        out.push_str(&format!(
            "/// The migrations of `src/meta/migrations/{database}/`, in order.\n\
             pub(crate) const {}: &[(i64, &str)] = &[\n",
            database.to_uppercase()
        ));
        for (version, path) in migrations {
            out.push_str(&format!(
                "    ({version}, include_str!({:?})),\n",
                path.display()
            ));
        }
        out.push_str("];\n");
    }
    let target = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    std::fs::write(target.join("migrations.rs"), out).expect("write the migration lists");
}

/// The `.sql` files of `dir` with their numbers, in order; panics on a gap or a bad name.
fn numbered(dir: &Path) -> Vec<(i64, PathBuf)> {
    let mut found: Vec<(i64, PathBuf)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a readable folder").path())
        .filter(|path| path.extension().is_some_and(|e| e == "sql"))
        .map(|path| {
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let version = name
                .split('_')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| {
                    panic!("{}: a migration is named NNNN_what.sql", path.display())
                });
            (version, path)
        })
        .collect();
    found.sort();
    for (expected, (version, path)) in (1..).zip(&found) {
        assert_eq!(
            *version,
            expected,
            "{}: migration {expected} is missing or taken twice",
            path.display()
        );
    }
    found
}
