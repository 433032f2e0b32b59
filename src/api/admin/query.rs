//! The admin API's query strings: the entry filter, the sort and its direction, page sizes and
//! the cursors of a listing. Each bad parameter is refused with a sentence (400).

use axum::http::Uri;

use super::AdminError;
use crate::cache::admin::MAX_PAGE;
use crate::model::{CacheKey, EntryFilter, EntryId, EntryOrder, Scope};

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

    /// The first value of `name`; an empty value counts as absent.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }

    /// The entry filter: `repository`, `ref`, `key` (a prefix) and `version`.
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
        Ok(EntryFilter {
            repository: bounded("repository")?,
            repository_id: None,
            scope: bounded("ref")?.map(Scope::new),
            folded_key_prefix: key,
            version: bounded("version")?,
            ..EntryFilter::default()
        })
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
        match self.param(name) {
            None => Ok(default),
            Some(raw) => raw
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_PAGE).contains(n))
                .ok_or_else(|| {
                    AdminError::bad(format!("{name} must be a number from 1 to {MAX_PAGE}"))
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
