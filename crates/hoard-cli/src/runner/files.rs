//! The two files `runner setup` writes under `<runner>/.hoard/` (and `--arc` puts in a
//! ConfigMap): the Node preload and the job-started hook. Both are embedded in the binary and
//! stamped with hoard's version, so `runner doctor` can tell a file this version wrote from an
//! older or edited one.

pub const PRELOAD_NAME: &str = "preload.cjs";
pub const HOOK_NAME: &str = "job-started.sh";

const PRELOAD: &str = include_str!("preload.cjs");
const HOOK: &str = include_str!("job-started.sh");

fn stamp(text: &str) -> String {
    text.replace(
        "@VERSION@",
        &format!("(hoard {})", env!("CARGO_PKG_VERSION")),
    )
}

/// The preload as this version of hoard writes it.
pub fn preload() -> String {
    stamp(PRELOAD)
}

/// The job-started hook as this version of hoard writes it.
pub fn hook() -> String {
    stamp(HOOK)
}

/// Both files, by name.
pub fn all() -> [(&'static str, String); 2] {
    [(PRELOAD_NAME, preload()), (HOOK_NAME, hook())]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_carry_this_version() {
        let version = format!("(hoard {})", env!("CARGO_PKG_VERSION"));
        for (name, text) in all() {
            assert!(text.contains(&version), "{name}");
            assert!(!text.contains("@VERSION@"), "{name}");
        }
    }

    #[test]
    fn the_preload_needs_nothing_but_node() {
        let text = preload();
        let modules: Vec<&str> = text
            .split("require(")
            .skip(1)
            .filter_map(|rest| rest.split(')').next())
            .collect();
        for module in modules {
            assert!(
                ["'path'", "'fs'", "'child_process'"].contains(&module),
                "{module}"
            );
        }
    }
}
