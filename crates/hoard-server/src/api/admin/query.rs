//! The admin API's query strings: the entry filter, the sort and its direction, page sizes and
//! the cursors of a listing. Each bad parameter is refused with a sentence (400).

use axum::http::Uri;

use super::AdminError;
use crate::cache::admin::MAX_PAGE;
use crate::model::{CacheKey, CallerKind, EntryFilter, EntryId, EntryOrder, Millis, Scope};

/// The last millisecond of the year 9999: the latest time a query may name.
pub const LAST_TIME: Millis = 253_402_300_799_999;

/// The parameters of the entry filter ([`Query::filter`]).
pub const FILTER: &[&str] = &[
    "repository",
    "ref",
    "scope",
    "key",
    "version",
    "run_id",
    "subject",
    "kind",
    "written_after",
    "written_before",
    "digest",
    "state",
    "promoted_by",
];
/// `GET restores`: the parts of the entry filter a restore record keeps, and the answer's size.
pub const RESTORES: &[&str] = &[
    "repository",
    "ref",
    "scope",
    "run_id",
    "subject",
    "kind",
    "written_after",
    "written_before",
    "per_page",
];
/// A listing's order and page.
pub const PAGE: &[&str] = &["sort", "direction", "cursor", "per_page"];
/// A deletion's: see what would go, or select everything.
pub const DELETION: &[&str] = &["dry_run", "all", "quarantine", "restores"];
/// `GET usage`.
pub const USAGE: &[&str] = &["limit", "repository"];
/// The period of `GET stats` and `GET stats/families`.
pub const PERIOD: &[&str] = &["bucket", "since", "until", "repository", "scope_class"];
/// `GET stats`' own.
pub const SERIES: &[&str] = &["family"];
/// `GET stats/families`' own.
pub const FAMILIES: &[&str] = &["sort", "limit"];

/// Entries a page lists unless asked otherwise (GitHub's default).
pub const DEFAULT_PAGE: usize = 30;

/// A query string as pairs, percent-decoded.
pub struct Query(Vec<(String, String)>);

impl Query {
    pub fn of(uri: &Uri) -> Self {
        Self(
            url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// Refuses (400) a parameter that none of `allowed` names, and one given twice: a misspelt
    /// filter beside a real one must not widen what a purge selects, and two values of one
    /// filter must not be read as one of them.
    pub fn only(&self, allowed: &[&[&str]]) -> Result<(), AdminError> {
        for (i, (name, _)) in self.0.iter().enumerate() {
            if !allowed.iter().any(|group| group.contains(&name.as_str())) {
                let known: Vec<&str> = allowed.iter().flat_map(|g| g.iter().copied()).collect();
                let known = if known.is_empty() {
                    "this endpoint takes none".to_owned()
                } else {
                    format!("this endpoint takes {}", known.join(", "))
                };
                return Err(AdminError::bad(format!(
                    "unknown query parameter {:?}: {known}",
                    crate::model::LogSafe(name).to_string()
                )));
            }
            if self.0[..i].iter().any(|(earlier, _)| earlier == name) {
                return Err(AdminError::bad(format!(
                    "query parameter {name} is given more than once"
                )));
            }
        }
        Ok(())
    }

    /// The first value of `name`; an empty value counts as absent.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }

    /// The entry filter: `repository`, `ref` (or `scope`), `key` (a prefix), `version`, and
    /// who wrote the entries: `run_id`, `subject`, `kind`, `written_after`, `written_before`.
    pub fn filter(&self) -> Result<EntryFilter, AdminError> {
        let bounded = |name: &str| -> Result<Option<String>, AdminError> {
            match self.param(name) {
                Some(v) if v.len() > 1024 || v.chars().any(char::is_control) => {
                    Err(AdminError::bad(format!(
                        "{name} must be at most 1024 bytes without control characters"
                    )))
                }
                other => Ok(other.map(str::to_owned)),
            }
        };
        let key = match self.param("key") {
            // A prefix of a valid key is itself a valid key (no commas, no control characters).
            Some(k) => Some(
                CacheKey::parse(k)
                    .map_err(|e| AdminError::bad(e.0))?
                    .folded(),
            ),
            None => None,
        };
        let scope = match (bounded("ref")?, bounded("scope")?) {
            (Some(a), Some(b)) if a != b => {
                return Err(AdminError::bad(
                    "ref and scope name the same filter; give one, or the same value",
                ))
            }
            (a, b) => a.or(b),
        };
        let kind = self
            .param("kind")
            .map(|k| k.parse::<CallerKind>().map_err(|e| AdminError::bad(e.0)))
            .transpose()?;
        let (written_after, written_before) =
            (self.time("written_after")?, self.time("written_before")?);
        if let (Some(after), Some(before)) = (written_after, written_before) {
            if after >= before {
                return Err(AdminError::bad(
                    "written_after must be earlier than written_before",
                ));
            }
        }
        Ok(EntryFilter {
            repository: bounded("repository")?,
            repository_id: None,
            scope: scope.map(Scope::new),
            folded_key_prefix: key,
            folded_key: None,
            version: bounded("version")?,
            id: None,
            run_id: bounded("run_id")?,
            subject: bounded("subject")?,
            kind,
            written_after,
            written_before,
            digest: self.digest()?,
            promoted_by: bounded("promoted_by")?,
            chunk: None,
            quarantined: match self.param("state") {
                None | Some("live") => false,
                Some("quarantined") => true,
                Some(other) => {
                    return Err(AdminError::bad(format!(
                        "state must be live or quarantined, not {:?}",
                        crate::model::LogSafe(other).to_string()
                    )))
                }
            },
        })
    }

    /// `digest`: an entry digest as hoard shows it, `sha256:` or `sha256-chunks:` and 64 hex
    /// digits (either case; kept lower case, as stored).
    fn digest(&self) -> Result<Option<String>, AdminError> {
        let Some(raw) = self.param("digest") else {
            return Ok(None);
        };
        let raw = raw.to_ascii_lowercase();
        let hex = raw
            .strip_prefix("sha256:")
            .or_else(|| raw.strip_prefix("sha256-chunks:"));
        match hex {
            Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
                Ok(Some(raw))
            }
            _ => Err(AdminError::bad(
                "digest must be sha256:<64 hex digits> or sha256-chunks:<64 hex digits>, as entries show it",
            )),
        }
    }

    /// A time parameter: RFC 3339 (`2026-05-04T12:00:00Z`), or seconds since the Unix epoch;
    /// from 1970 to the end of year 9999, so that no arithmetic on it can wrap.
    pub fn time(&self, name: &str) -> Result<Option<Millis>, AdminError> {
        let Some(raw) = self.param(name) else {
            return Ok(None);
        };
        if let Ok(seconds) = raw.parse::<i64>() {
            return seconds
                .checked_mul(1000)
                .filter(|ms| (0..=LAST_TIME).contains(ms))
                .map(Some)
                .ok_or_else(|| {
                    AdminError::bad(format!(
                        "{name} is out of range: seconds from 0 (1970) to {} (year 9999)",
                        LAST_TIME / 1000
                    ))
                });
        }
        let at = humantime::parse_rfc3339_weak(raw).map_err(|_| {
            AdminError::bad(format!(
                "{name} must be an RFC 3339 time such as 2026-05-04T12:00:00Z, or seconds since 1970"
            ))
        })?;
        let millis = at
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| AdminError::bad(format!("{name} is before 1970")))?
            .as_millis();
        if millis > LAST_TIME as u128 {
            return Err(AdminError::bad(format!("{name} is after the year 9999")));
        }
        Ok(Some(millis as Millis))
    }

    /// A yes/no parameter: `true`/`1` or `false`/`0` (absent: no).
    pub fn flag(&self, name: &str) -> Result<bool, AdminError> {
        match self.param(name) {
            None | Some("false" | "0") => Ok(false),
            Some("true" | "1") => Ok(true),
            Some(other) => Err(AdminError::bad(format!(
                "{name} must be true or false, not {:?}",
                crate::model::LogSafe(other).to_string()
            ))),
        }
    }

    /// `sort` as GitHub names it.
    pub fn order(&self) -> Result<EntryOrder, AdminError> {
        match self.param("sort") {
            None | Some("last_accessed_at") => Ok(EntryOrder::LastUsed),
            Some("size_in_bytes") => Ok(EntryOrder::Size),
            Some("created_at") => Ok(EntryOrder::Created),
            Some(other) => Err(AdminError::bad(format!(
                "sort must be last_accessed_at, size_in_bytes or created_at, not {other:?}"
            ))),
        }
    }

    /// `direction`: descending unless `asc`.
    pub fn descending(&self) -> Result<bool, AdminError> {
        match self.param("direction") {
            None | Some("desc") => Ok(true),
            Some("asc") => Ok(false),
            Some(other) => Err(AdminError::bad(format!(
                "direction must be asc or desc, not {other:?}"
            ))),
        }
    }

    /// A page size `name`, 1 to [`MAX_PAGE`].
    pub fn page_size(&self, name: &str, default: usize) -> Result<usize, AdminError> {
        self.count_up_to(name, default, MAX_PAGE)
    }

    /// A count from 1 to `most`, `default` when absent.
    pub fn count_up_to(
        &self,
        name: &str,
        default: usize,
        most: usize,
    ) -> Result<usize, AdminError> {
        match self.param(name) {
            None => Ok(default),
            Some(raw) => raw
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=most).contains(n))
                .ok_or_else(|| {
                    AdminError::bad(format!("{name} must be a number from 1 to {most}"))
                }),
        }
    }
}

fn order_name(order: EntryOrder) -> &'static str {
    match order {
        EntryOrder::LastUsed => "last_accessed_at",
        EntryOrder::Size => "size_in_bytes",
        EntryOrder::Created => "created_at",
    }
}

/// A cursor names the sort it belongs to, so one from another sort is refused, not misread.
pub fn cursor(order: EntryOrder, descending: bool, (value, id): (i64, EntryId)) -> String {
    format!("{}{value}.{id}", cursor_prefix(order, descending))
}

fn cursor_prefix(order: EntryOrder, descending: bool) -> String {
    let direction = if descending { "desc" } else { "asc" };
    format!("{}.{direction}.", order_name(order))
}

pub fn parse_cursor(
    raw: &str,
    order: EntryOrder,
    descending: bool,
) -> Result<(i64, EntryId), AdminError> {
    let bad = || {
        AdminError::bad(
            "cursor is not one this listing returned (the sort, direction or filter changed?)",
        )
    };
    let numbers = raw
        .strip_prefix(&cursor_prefix(order, descending))
        .ok_or_else(bad)?;
    let (value, id) = numbers.split_once('.').ok_or_else(bad)?;
    Ok((
        value.parse().map_err(|_| bad())?,
        EntryId::new(id.parse().map_err(|_| bad())?),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(q: &str) -> Query {
        Query::of(&format!("/x?{q}").parse::<Uri>().unwrap())
    }

    #[test]
    fn writer_filters_are_read_and_bad_ones_refused_with_a_sentence() {
        let f = query("run_id=42&subject=repo:o/r&kind=github&scope=refs/pull/1/merge&written_after=2026-05-04T12:00:00Z&written_before=1777899600")
            .filter()
            .unwrap();
        assert_eq!(f.run_id.as_deref(), Some("42"));
        assert_eq!(f.subject.as_deref(), Some("repo:o/r"));
        assert_eq!(f.kind, Some(CallerKind::Github));
        assert_eq!(f.scope, Some(Scope::new("refs/pull/1/merge")));
        assert_eq!(f.written_after, Some(1_777_896_000_000));
        assert_eq!(f.written_before, Some(1_777_899_600_000));
        let message = |q: &str| query(q).filter().unwrap_err().1;
        assert!(message("kind=token").contains("is no caller kind"));
        assert!(message("written_after=yesterday").contains("RFC 3339"));
        let hex = "Ab".repeat(32);
        let f = query(&format!("digest=sha256-chunks:{hex}"))
            .filter()
            .unwrap();
        assert_eq!(
            f.digest,
            Some(format!("sha256-chunks:{}", hex.to_lowercase()))
        );
        for bad in [
            "sha256:abc",
            "md5:00",
            &format!("sha256:{}", "zz".repeat(32)),
        ] {
            assert!(
                message(&format!("digest={bad}")).contains("64 hex digits"),
                "{bad}"
            );
        }
        assert!(message("written_after=20&written_before=10").contains("earlier than"));
        assert!(message("ref=a&scope=b").contains("give one"));
        assert!(query("dry_run=maybe").flag("dry_run").is_err());
        for out_of_range in [
            "-1",
            "9223372036854775807",
            "253402300800",
            "-9223372036854775808",
        ] {
            let m = query(&format!("until={out_of_range}"))
                .time("until")
                .unwrap_err()
                .1;
            assert!(m.contains("out of range"), "{out_of_range}: {m}");
        }
        assert_eq!(
            query("until=253402300799").time("until").unwrap(),
            Some(253_402_300_799_000)
        );
        assert!(query("dry_run=true").flag("dry_run").unwrap());
    }

    #[test]
    fn unknown_and_repeated_parameters_are_refused_by_name() {
        let message = |q: &str| query(q).only(&[FILTER, DELETION]).unwrap_err().1;
        for misspelt in ["runid", "run-id", "runId", "keys"] {
            let m = message(&format!("repository=octo/a&{misspelt}=2&dry_run=true"));
            assert!(m.contains(&format!("\"{misspelt}\"")), "{m}");
            assert!(m.contains("run_id"), "the known ones are listed: {m}");
        }
        assert!(message("run_id=1&run_id=2").contains("run_id is given more than once"));
        assert!(message("run_id=1&dry_run=true&dry_run=false").contains("more than once"));
        assert!(query("repository=octo/a&run_id=2&dry_run=true")
            .only(&[FILTER, DELETION])
            .is_ok());
        assert!(query("").only(&[]).is_ok());
        assert!(query("x=1").only(&[]).unwrap_err().1.contains("takes none"));
        let hostile = message("a%0Ab=1");
        assert!(!hostile.contains('\n'), "{hostile}");
    }

    #[test]
    fn cursors_round_trip_and_belong_to_their_sort() {
        let c = cursor(EntryOrder::Size, true, (1234, EntryId::new(56)));
        assert_eq!(
            parse_cursor(&c, EntryOrder::Size, true).unwrap(),
            (1234, EntryId::new(56))
        );
        let negative = cursor(EntryOrder::Created, false, (-5, EntryId::new(7)));
        assert_eq!(
            parse_cursor(&negative, EntryOrder::Created, false).unwrap(),
            (-5, EntryId::new(7))
        );
        assert!(parse_cursor(&c, EntryOrder::Size, false).is_err());
        assert!(parse_cursor(&c, EntryOrder::Created, true).is_err());
        assert!(parse_cursor("size_in_bytes.desc.x.1", EntryOrder::Size, true).is_err());
        assert!(parse_cursor("", EntryOrder::Size, true).is_err());
    }
}
