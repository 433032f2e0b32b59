//! The runner's `.env` edit, as pure text in and text out. The runner reads `<root>/.env` line by
//! line at start (`KEY=VALUE`, split at the first `=`, no quoting, lines without `=` ignored) and
//! sets each in its own environment in order, so a later line wins over an earlier one.
//!
//! `hoard runner setup` therefore never changes a line that is there: it appends one block,
//! between two comment lines, whose `NODE_OPTIONS` is the value already in effect plus the
//! preload, and whose `ACTIONS_RUNNER_HOOK_JOB_STARTED` is hoard's hook, with the hook already in
//! effect kept in `HOARD_CHAINED_JOB_STARTED_HOOK` (hoard's hook runs it). The invariant:
//! [`undo`] of [`setup`] of a file is that file, byte for byte; and [`setup`] of its own output
//! is that output (a second run changes nothing).

use std::fmt::Write as _;

/// The first line of hoard's block; the rest of the line may say more.
const BEGIN: &str = "# >>> hoard runner setup";
/// The same, when the file before the block did not end with a newline.
const BEGIN_NO_NEWLINE: &str = "# >>> hoard runner setup (no newline before)";
const BEGIN_NOTE: &str =
    ": written by hoard runner setup; hoard runner undo removes it and leaves the rest";
const END: &str = "# <<< hoard runner setup";

pub const NODE_OPTIONS: &str = "NODE_OPTIONS";
pub const HOOK: &str = "ACTIONS_RUNNER_HOOK_JOB_STARTED";
pub const CHAINED_HOOK: &str = "HOARD_CHAINED_JOB_STARTED_HOOK";
pub const RESULTS_URL: &str = "HOARD_RESULTS_URL";
pub const CACHE_URL: &str = "HOARD_CACHE_URL";

/// What `setup` puts in `.env`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvChange {
    /// The `NODE_OPTIONS` option that loads the preload (`--require /…/preload.cjs`).
    pub require: String,
    /// Absolute path of hoard's job-started hook.
    pub hook: String,
    /// hoard's URL for `ACTIONS_RESULTS_URL` (cache v2 and the results service).
    pub results_url: Option<String>,
    /// hoard's URL for `ACTIONS_CACHE_URL` (cache v1, GHES).
    pub cache_url: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("hoard's block in .env has a first line ({BEGIN}) but no last line ({END}); remove the block by hand")]
    Unterminated,
    #[error("hoard's block appears twice in .env; remove both by hand and run setup again")]
    Twice,
}

/// `--require PATH`, quoted the way Node splits `NODE_OPTIONS` if the path has a space. `None`
/// for a path Node could not read back from `NODE_OPTIONS` (a quote, a backslash, a newline).
pub fn require_option(path: &str) -> Option<String> {
    if path.contains(['"', '\\', '\n', '\r']) {
        return None;
    }
    Some(if path.contains([' ', '\t']) {
        format!("--require \"{path}\"")
    } else {
        format!("--require {path}")
    })
}

/// The `NODE_OPTIONS` value that keeps `existing` and adds `require` (once).
pub fn merge_node_options(existing: &str, require: &str) -> String {
    let trimmed = existing.trim();
    if trimmed.is_empty() {
        require.to_owned()
    } else if existing.contains(require) {
        existing.to_owned()
    } else {
        format!("{existing} {require}")
    }
}

/// The value of the last `KEY=` line of `text`: the one the runner ends up with.
pub fn last_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .filter_map(|line| line.trim_end_matches('\r').split_once('='))
        .filter(|(k, _)| *k == key)
        .map(|(_, v)| v)
        .next_back()
}

/// Where hoard's block is: the byte range to remove (with the newline added before it, if any).
fn block_range(text: &str) -> Result<Option<std::ops::Range<usize>>, EnvError> {
    let mut found = None;
    let mut offset = 0;
    let mut start: Option<usize> = None;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        if start.is_none() && bare.starts_with(BEGIN) {
            if found.is_some() {
                return Err(EnvError::Twice);
            }
            // The newline setup added before the block belongs to the block.
            let begin = if bare.starts_with(BEGIN_NO_NEWLINE) && offset > 0 {
                offset - 1
            } else {
                offset
            };
            start = Some(begin);
        } else if bare == END {
            if let Some(begin) = start.take() {
                found = Some(begin..offset + line.len());
            }
        }
        offset += line.len();
    }
    if start.is_some() {
        return Err(EnvError::Unterminated);
    }
    Ok(found)
}

/// Whether `text` holds hoard's block.
pub fn has_block(text: &str) -> bool {
    matches!(block_range(text), Ok(Some(_)))
}

/// The lines of hoard's block (without its two comment lines), for `runner doctor`.
pub fn block_lines(text: &str) -> Vec<&str> {
    match block_range(text) {
        Ok(Some(range)) => text[range]
            .lines()
            .map(|l| l.trim_end_matches('\r'))
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect(),
        _ => Vec::new(),
    }
}

/// `text` without hoard's block: the file as it was before `setup`.
pub fn undo(text: &str) -> Result<String, EnvError> {
    Ok(match block_range(text)? {
        Some(range) => {
            let mut out = String::with_capacity(text.len());
            out.push_str(&text[..range.start]);
            out.push_str(&text[range.end..]);
            out
        }
        None => text.to_owned(),
    })
}

/// `text` with hoard's block for `change` (replacing a block already there).
pub fn setup(text: &str, change: &EnvChange) -> Result<String, EnvError> {
    let clean = undo(text)?;
    let newline = if clean.contains("\r\n") { "\r\n" } else { "\n" };
    let mut out = clean.clone();
    let begin = if clean.is_empty() || clean.ends_with('\n') {
        BEGIN
    } else {
        out.push_str(newline);
        BEGIN_NO_NEWLINE
    };
    let mut line = |s: String| {
        out.push_str(&s);
        out.push_str(newline);
    };
    line(format!("{begin}{BEGIN_NOTE}"));
    if let Some(url) = &change.results_url {
        line(format!("{RESULTS_URL}={url}"));
    }
    if let Some(url) = &change.cache_url {
        line(format!("{CACHE_URL}={url}"));
    }
    let node_options = merge_node_options(
        last_value(&clean, NODE_OPTIONS).unwrap_or(""),
        &change.require,
    );
    line(format!("{NODE_OPTIONS}={node_options}"));
    match last_value(&clean, HOOK).filter(|v| !v.trim().is_empty()) {
        Some(existing) if existing != change.hook => line(format!("{CHAINED_HOOK}={existing}")),
        _ => {}
    }
    line(format!("{HOOK}={}", change.hook));
    line(END.to_owned());
    Ok(out)
}

/// A line-by-line account of what `setup` changes, for its report and `--dry-run`.
pub fn describe(before: &str, after: &str) -> String {
    let mut out = String::new();
    let old: Vec<&str> = before.lines().collect();
    let new: Vec<&str> = after.lines().collect();
    // The block is appended (or replaced) at the end of the common start.
    let common = old.iter().zip(&new).take_while(|(a, b)| a == b).count();
    for l in &old[common..] {
        let _ = writeln!(out, "  - {l}");
    }
    for l in &new[common..] {
        let _ = writeln!(out, "  + {l}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change() -> EnvChange {
        EnvChange {
            require: "--require /r/.hoard/preload.cjs".into(),
            hook: "/r/.hoard/job-started.sh".into(),
            results_url: Some("http://cache.internal:3000/".into()),
            cache_url: Some("http://cache.internal:3000/".into()),
        }
    }

    const FRESH: &str = "LANG=C.UTF-8\nPATH=/usr/local/bin:/usr/bin:/bin\n";

    #[test]
    fn setup_appends_one_block_and_undo_gives_the_same_bytes_back() {
        for before in [
            "",
            FRESH,
            "LANG=C.UTF-8",            // no final newline
            "LANG=C.UTF-8\r\nA=b\r\n", // CRLF
            "\n\n# a comment\nA=b\n",
        ] {
            let after = setup(before, &change()).unwrap();
            assert!(
                after.starts_with(before.trim_end_matches('\n')),
                "{after:?}"
            );
            assert!(has_block(&after));
            assert_eq!(undo(&after).unwrap(), before, "{after:?}");
            // Idempotent: a second run changes nothing.
            assert_eq!(setup(&after, &change()).unwrap(), after);
        }
    }

    #[test]
    fn the_block_sets_the_urls_the_preload_and_the_hook() {
        let after = setup(FRESH, &change()).unwrap();
        assert_eq!(
            last_value(&after, NODE_OPTIONS),
            Some("--require /r/.hoard/preload.cjs")
        );
        assert_eq!(last_value(&after, HOOK), Some("/r/.hoard/job-started.sh"));
        assert_eq!(
            last_value(&after, RESULTS_URL),
            Some("http://cache.internal:3000/")
        );
        assert_eq!(last_value(&after, CHAINED_HOOK), None);
        // No comment line of the block holds '=', which the runner would read as a variable.
        for l in after.lines().filter(|l| l.starts_with('#')) {
            assert!(!l.contains('='), "{l}");
        }
    }

    #[test]
    fn an_existing_node_options_is_kept_and_extended() {
        let before = "NODE_OPTIONS=--max-old-space-size=4096\nA=b\n";
        let after = setup(before, &change()).unwrap();
        assert_eq!(
            last_value(&after, NODE_OPTIONS),
            Some("--max-old-space-size=4096 --require /r/.hoard/preload.cjs")
        );
        // The line that was there stays as it was.
        assert!(after.starts_with(before));
        assert_eq!(undo(&after).unwrap(), before);
        // The last of several lines is the one in effect.
        let two = "NODE_OPTIONS=--a\nNODE_OPTIONS=--b\n";
        let after = setup(two, &change()).unwrap();
        assert_eq!(
            last_value(&after, NODE_OPTIONS),
            Some("--b --require /r/.hoard/preload.cjs")
        );
    }

    #[test]
    fn node_options_merge() {
        let r = "--require /p.cjs";
        assert_eq!(merge_node_options("", r), r);
        assert_eq!(merge_node_options("  ", r), r);
        assert_eq!(merge_node_options("--x", r), "--x --require /p.cjs");
        assert_eq!(
            merge_node_options("--require /p.cjs --x", r),
            "--require /p.cjs --x"
        );
    }

    #[test]
    fn an_existing_hook_is_chained() {
        let before = "ACTIONS_RUNNER_HOOK_JOB_STARTED=/opt/hooks/start.sh\n";
        let after = setup(before, &change()).unwrap();
        assert_eq!(last_value(&after, HOOK), Some("/r/.hoard/job-started.sh"));
        assert_eq!(
            last_value(&after, CHAINED_HOOK),
            Some("/opt/hooks/start.sh")
        );
        assert_eq!(undo(&after).unwrap(), before);
        assert_eq!(setup(&after, &change()).unwrap(), after);
    }

    #[test]
    fn a_changed_url_replaces_the_block() {
        let first = setup(FRESH, &change()).unwrap();
        let mut other = change();
        other.results_url = Some("http://elsewhere:3000/".into());
        let second = setup(&first, &other).unwrap();
        assert_eq!(
            last_value(&second, RESULTS_URL),
            Some("http://elsewhere:3000/")
        );
        assert_eq!(second.matches(BEGIN).count(), 1);
        assert_eq!(undo(&second).unwrap(), FRESH);
    }

    #[test]
    fn lines_added_after_the_block_survive_undo() {
        let after = setup(FRESH, &change()).unwrap();
        let edited = format!("{after}EXTRA=1\n");
        assert_eq!(undo(&edited).unwrap(), format!("{FRESH}EXTRA=1\n"));
    }

    #[test]
    fn a_damaged_block_is_refused() {
        let after = setup(FRESH, &change()).unwrap();
        let cut = after.replace(END, "");
        assert_eq!(undo(&cut), Err(EnvError::Unterminated));
        let twice = format!("{after}{after}");
        assert_eq!(undo(&twice), Err(EnvError::Twice));
    }

    #[test]
    fn require_paths_are_quoted_or_refused() {
        assert_eq!(
            require_option("/a/b.cjs").as_deref(),
            Some("--require /a/b.cjs")
        );
        assert_eq!(
            require_option("/a b/c.cjs").as_deref(),
            Some("--require \"/a b/c.cjs\"")
        );
        assert_eq!(require_option("/a\"b/c.cjs"), None);
        assert_eq!(require_option("C:\\r\\p.cjs"), None);
    }
}
