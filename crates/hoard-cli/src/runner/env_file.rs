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
/// The names some actions (cirruslabs/cache, cache-nix-action) and forked runners read before
/// `ACTIONS_RESULTS_URL` / `ACTIONS_CACHE_URL`: set to hoard's URLs too, so they agree with hoard
/// (the preload makes them follow the job to GitHub when hoard is down).
pub const CUSTOM_RESULTS_URL: &str = "CUSTOM_ACTIONS_RESULTS_URL";
pub const CUSTOM_CACHE_URL: &str = "CUSTOM_ACTIONS_CACHE_URL";
/// The build tools the preload sets up in each job (`--build-tools`), comma-separated.
pub const BUILD_TOOLS: &str = "HOARD_BUILD_TOOLS";
/// The command line the preload gives Go as `GOCACHEPROG`: this hoard's `gocache`.
pub const GOCACHEPROG: &str = "HOARD_GOCACHEPROG";

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
    /// The build tools the preload sets up (`turbo,nx,…`), if any.
    pub build_tools: Option<String>,
    /// `GOCACHEPROG`'s command line, with `go` among them.
    pub gocacheprog: Option<String>,
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

/// `NODE_OPTIONS` split into arguments as Node splits it: at spaces outside double quotes, a
/// backslash inside quotes escaping the next character.
fn node_args(options: &str) -> Vec<String> {
    let mut args: Vec<String> = Vec::new();
    let mut quoted = false;
    let mut new_arg = true;
    let mut chars = options.chars();
    while let Some(mut c) = chars.next() {
        if c == '\\' && quoted {
            match chars.next() {
                Some(next) => c = next,
                None => break,
            }
        } else if c == ' ' && !quoted {
            new_arg = true;
            continue;
        } else if c == '"' {
            quoted = !quoted;
            continue;
        }
        match args.last_mut() {
            Some(last) if !new_arg => last.push(c),
            _ => args.push(c.to_string()),
        }
        new_arg = false;
    }
    args
}

/// The files `NODE_OPTIONS` loads with `--require PATH`, `--require=PATH` or `-r PATH`.
fn required(options: &str) -> Vec<String> {
    let args = node_args(options);
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--require" || arg == "-r" {
            out.extend(it.next().cloned());
        } else if let Some(path) = arg.strip_prefix("--require=") {
            out.push(path.to_owned());
        }
    }
    out
}

/// Whether the `NODE_OPTIONS` value `options` already loads what `require` (as
/// [`require_option`] makes it) loads: whole options compared, so `--require /p.cjs.old` is
/// not `--require /p.cjs`.
pub fn loads(options: &str, require: &str) -> bool {
    let wanted = required(require);
    let have = required(options);
    !wanted.is_empty() && wanted.iter().all(|w| have.contains(w))
}

/// The `NODE_OPTIONS` value that keeps `existing` and adds `require` (once).
pub fn merge_node_options(existing: &str, require: &str) -> String {
    if existing.trim().is_empty() {
        require.to_owned()
    } else if loads(existing, require) {
        existing.to_owned()
    } else {
        format!("{existing} {require}")
    }
}

/// One line of `.env` as the runner splits it.
struct Line<'a> {
    /// Byte offset of the line in the text.
    start: usize,
    /// The line without its ending.
    body: &'a str,
    /// `"\r\n"`, `"\n"`, `"\r"`, or `""` for a last line without one.
    ending: &'a str,
}

/// The lines of `text` as the runner reads them (.NET's `File.ReadAllLines`): split at CRLF, LF
/// or a lone CR. A UTF-8 BOM stays in the first line's body: see [`without_bom`].
fn lines(text: &str) -> impl Iterator<Item = Line<'_>> {
    let bytes = text.as_bytes();
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= bytes.len() {
            return None;
        }
        let from = start;
        let (end, len) = match bytes[from..]
            .iter()
            .position(|b| matches!(b, b'\n' | b'\r'))
        {
            None => (bytes.len(), 0),
            Some(i) if bytes[from + i] == b'\r' && bytes.get(from + i + 1) == Some(&b'\n') => {
                (from + i, 2)
            }
            Some(i) => (from + i, 1),
        };
        start = end + len;
        Some(Line {
            start: from,
            body: &text[from..end],
            ending: &text[end..end + len],
        })
    })
}

/// `text` without a leading UTF-8 BOM, which the runner's reader drops.
fn without_bom(text: &str) -> &str {
    text.strip_prefix('\u{feff}').unwrap_or(text)
}

/// The value of the last `KEY=` line of `text`: the one the runner ends up with.
pub fn last_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    lines(without_bom(text))
        .filter_map(|line| line.body.split_once('='))
        .filter(|(k, _)| *k == key)
        .map(|(_, v)| v)
        .last()
}

/// Where hoard's block is: the byte range to remove (with the line ending added before it, if
/// any).
fn block_range(text: &str) -> Result<Option<std::ops::Range<usize>>, EnvError> {
    let mut found = None;
    let mut start: Option<usize> = None;
    let mut previous_ending = "";
    for line in lines(text) {
        let bare = line.body;
        if start.is_none() && bare.starts_with(BEGIN) {
            if found.is_some() {
                return Err(EnvError::Twice);
            }
            // The line ending setup added before the block belongs to the block.
            let begin = if bare.starts_with(BEGIN_NO_NEWLINE) {
                line.start - previous_ending.len()
            } else {
                line.start
            };
            start = Some(begin);
        } else if bare == END {
            if let Some(begin) = start.take() {
                found = Some(begin..line.start + bare.len() + line.ending.len());
            }
        }
        previous_ending = line.ending;
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
        Ok(Some(range)) => lines(&text[range])
            .map(|l| l.body)
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
    // The file's own line ending: that of its last line that has one.
    let newline = lines(&clean)
        .map(|l| l.ending)
        .filter(|e| !e.is_empty())
        .last()
        .unwrap_or("\n");
    let mut out = clean.clone();
    let begin = if clean.is_empty() || clean.ends_with(['\n', '\r']) {
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
    if let Some(url) = &change.results_url {
        line(format!("{CUSTOM_RESULTS_URL}={url}"));
    }
    if let Some(url) = &change.cache_url {
        line(format!("{CUSTOM_CACHE_URL}={url}"));
    }
    if let Some(tools) = &change.build_tools {
        line(format!("{BUILD_TOOLS}={tools}"));
    }
    if let Some(command) = &change.gocacheprog {
        line(format!("{GOCACHEPROG}={command}"));
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
    let old: Vec<&str> = lines(before).map(|l| l.body).collect();
    let new: Vec<&str> = lines(after).map(|l| l.body).collect();
    // The block is appended (or replaced) at the end of the common start.
    let common = old.iter().zip(&new).take_while(|(a, b)| a == b).count();
    for l in &old[common..] {
        let _ = writeln!(out, "  - {}", printable(l));
    }
    for l in &new[common..] {
        let _ = writeln!(out, "  + {}", printable(l));
    }
    out
}

/// `line` with control characters (a terminal's escape sequences) written as `\u{…}`: `.env` is
/// the runner's user's file, and the report goes to the operator's terminal.
fn printable(line: &str) -> String {
    line.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
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
            build_tools: None,
            gocacheprog: None,
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

    /// What the runner reads from `text`: .NET's `File.ReadAllLines` (a UTF-8 BOM dropped, lines
    /// split at CRLF, LF or a lone CR), then `KEY=VALUE` at the first `=`, a later line winning.
    fn as_the_runner_reads(text: &str) -> Vec<(String, String)> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut env: Vec<(String, String)> = Vec::new();
        for line in text.replace("\r\n", "\n").replace('\r', "\n").split('\n') {
            if let Some((k, v)) = line.split_once('=').filter(|(k, _)| !k.is_empty()) {
                env.retain(|(old, _)| old != k);
                env.push((k.to_owned(), v.to_owned()));
            }
        }
        env
    }

    #[test]
    fn every_line_form_is_given_back_exactly_and_read_as_the_runner_reads_it() {
        for before in [
            "A=b\r\nC=d",         // CRLF, no final newline
            "A=b\r\nC=d\r",       // CRLF, a final lone CR
            "A=b\rC=d\r",         // CR only
            "A=b\rC=d",           // CR only, no final newline
            "\u{feff}A=b\nC=d\n", // UTF-8 BOM
            "\u{feff}",           // a BOM alone
            "\u{feff}A=b",        // BOM, no final newline
            "A=b\n\rC=d\r\n",     // mixed
        ] {
            let after = setup(before, &change()).unwrap();
            assert_eq!(undo(&after).unwrap(), before, "{before:?} -> {after:?}");
            assert_eq!(setup(&after, &change()).unwrap(), after, "{before:?}");
            // Undo, then setup again: no byte gained or lost.
            let again = setup(&undo(&after).unwrap(), &change()).unwrap();
            assert_eq!(again, after, "{before:?}");
            let env = as_the_runner_reads(&after);
            let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
            let a = before.contains("A=b").then_some("b");
            assert_eq!(get("A"), a, "{after:?}");
            assert_eq!(
                get(NODE_OPTIONS),
                Some("--require /r/.hoard/preload.cjs"),
                "{after:?}"
            );
            assert_eq!(get(HOOK), Some("/r/.hoard/job-started.sh"), "{after:?}");
            // No value gained a stray CR.
            assert!(env.iter().all(|(_, v)| !v.contains('\r')), "{env:?}");
            // No line of the block can be mistaken for one of the file's.
            assert!(has_block(&after), "{after:?}");
        }
    }

    #[test]
    fn node_options_behind_a_bom_or_cr_only_endings_is_seen_and_kept() {
        for before in [
            "\u{feff}NODE_OPTIONS=--max-old-space-size=4096\n",
            "A=b\rNODE_OPTIONS=--max-old-space-size=4096\r",
            "A=b\rNODE_OPTIONS=--max-old-space-size=4096",
            "A=b\r\nNODE_OPTIONS=--max-old-space-size=4096",
        ] {
            let after = setup(before, &change()).unwrap();
            let env = as_the_runner_reads(&after);
            let node = env.iter().find(|(n, _)| n == NODE_OPTIONS).unwrap();
            assert_eq!(
                node.1, "--max-old-space-size=4096 --require /r/.hoard/preload.cjs",
                "{before:?}"
            );
            assert_eq!(
                last_value(&after, NODE_OPTIONS),
                Some(node.1.as_str()),
                "{before:?}"
            );
        }
    }

    #[test]
    fn node_options_are_matched_as_whole_options() {
        let r = "--require /r/.hoard/preload.cjs";
        for other in [
            "--require /r/.hoard/preload.cjs.old",
            "--require /r/.hoard/preload.cjs-x --x",
            "--require=/r/.hoard/preload.cjs.old",
            "--x=--require /r/.hoard/preload.cjs",
            "--title=\"--require /r/.hoard/preload.cjs\"",
        ] {
            assert_eq!(
                merge_node_options(other, r),
                format!("{other} {r}"),
                "{other}"
            );
            assert!(!loads(other, r), "{other}");
        }
        for same in [
            "--require /r/.hoard/preload.cjs",
            "--x --require /r/.hoard/preload.cjs --y",
            "--require=/r/.hoard/preload.cjs",
            "-r /r/.hoard/preload.cjs",
            "--require  \"/r/.hoard/preload.cjs\"",
        ] {
            assert_eq!(merge_node_options(same, r), same, "{same}");
            assert!(loads(same, r), "{same}");
        }
        let quoted = "--require \"/a b/.hoard/preload.cjs\"";
        assert!(loads("--x --require \"/a b/.hoard/preload.cjs\"", quoted));
        assert!(!loads("--require /a b/.hoard/preload.cjs", quoted));
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
