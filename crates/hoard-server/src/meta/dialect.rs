//! What truly differs between SQLite, PostgreSQL and MySQL/MariaDB in the statements hoard
//! writes once for all of them: how a parameter is spelled, how a column name is quoted, the
//! name of a 64-bit integer in a cast, and how a statement adds to a row that exists. Collation
//! (byte-wise everywhere) is the migrations' business; returning a new row's id is each store's.
//!
//! A statement shared by several backends is a [`Shared`]: written once with `?` parameters and
//! `{bigint}`, and spelled for a backend the first time that backend runs it, never again.

use std::sync::OnceLock;

/// A metadata backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    Sqlite = 0,
    Postgres = 1,
    MySql = 2,
}

/// How a statement adds to a row that already exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upsert {
    /// SQLite and PostgreSQL: `ON CONFLICT (…) DO UPDATE SET c = t.c + excluded.c`.
    OnConflict,
    /// MySQL and MariaDB: `ON DUPLICATE KEY UPDATE c = c + VALUES(c)`.
    OnDuplicateKey,
}

impl Backend {
    /// The n-th (1-based) parameter of a statement.
    pub fn placeholder(self, n: usize) -> String {
        match self {
            Backend::Postgres => format!("${n}"),
            Backend::Sqlite | Backend::MySql => "?".to_owned(),
        }
    }

    /// `count` parameters from the `first`-th on, comma-separated.
    pub fn placeholders(self, first: usize, count: usize) -> String {
        (first..first + count)
            .map(|n| self.placeholder(n))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A column name as a statement spells it (MySQL reserves `KEY`; quoting every name is
    /// simpler than knowing which).
    pub fn quote(self, name: &str) -> String {
        match self {
            Backend::MySql => format!("`{name}`"),
            Backend::Sqlite | Backend::Postgres => name.to_owned(),
        }
    }

    /// The type a value is cast to for a 64-bit integer (`CAST(x AS …)`).
    pub fn bigint(self) -> &'static str {
        match self {
            Backend::MySql => "SIGNED",
            Backend::Sqlite => "INTEGER",
            Backend::Postgres => "BIGINT",
        }
    }

    /// The larger and the smaller of two values (SQLite's scalar `MAX` and `MIN`).
    pub fn greatest(self) -> &'static str {
        match self {
            Backend::Sqlite => "MAX",
            Backend::Postgres | Backend::MySql => "GREATEST",
        }
    }
    pub fn least(self) -> &'static str {
        match self {
            Backend::Sqlite => "MIN",
            Backend::Postgres | Backend::MySql => "LEAST",
        }
    }

    pub fn upsert(self) -> Upsert {
        match self {
            Backend::MySql => Upsert::OnDuplicateKey,
            Backend::Sqlite | Backend::Postgres => Upsert::OnConflict,
        }
    }

    /// `template` in this backend: each `?` becomes the next [`Backend::placeholder`] (no
    /// template has a `?` inside a string literal), `{bigint}` becomes [`Backend::bigint`].
    pub fn spell(self, template: &str) -> String {
        let template = template.replace("{bigint}", self.bigint());
        if self != Backend::Postgres {
            return template;
        }
        let mut out = String::with_capacity(template.len() + 16);
        let mut n = 0;
        for c in template.chars() {
            if c == '?' {
                n += 1;
                out.push_str(&self.placeholder(n));
            } else {
                out.push(c);
            }
        }
        out
    }
}

/// A statement written once for every backend, spelled for each on first use.
#[derive(Debug)]
pub struct Shared {
    template: Template,
    spelled: [OnceLock<String>; 3],
}

#[derive(Debug)]
enum Template {
    Text(&'static str),
    /// Built from the table declarations (select lists), the first time it is needed.
    Built(fn() -> String),
    /// Built for each backend: what differs is more than the spelling (an upsert's form).
    PerBackend(fn(Backend) -> String),
}

impl Shared {
    pub const fn new(template: &'static str) -> Self {
        Self {
            template: Template::Text(template),
            spelled: [OnceLock::new(), OnceLock::new(), OnceLock::new()],
        }
    }

    /// A statement whose template `build` makes.
    pub const fn built(build: fn() -> String) -> Self {
        Self {
            template: Template::Built(build),
            spelled: [OnceLock::new(), OnceLock::new(), OnceLock::new()],
        }
    }

    /// A statement whose template `build` makes for each backend.
    pub const fn per_backend(build: fn(Backend) -> String) -> Self {
        Self {
            template: Template::PerBackend(build),
            spelled: [OnceLock::new(), OnceLock::new(), OnceLock::new()],
        }
    }

    /// The statement in `backend`'s spelling.
    pub fn on(&'static self, backend: Backend) -> &'static str {
        self.spelled[backend as usize].get_or_init(|| match self.template {
            Template::Text(text) => backend.spell(text),
            Template::Built(build) => backend.spell(&build()),
            Template::PerBackend(build) => backend.spell(&build(backend)),
        })
    }
}

/// A `&'static` [`Shared`] statement from its template, at the place it is used.
macro_rules! shared {
    ($template:expr) => {{
        static STATEMENT: $crate::meta::dialect::Shared =
            $crate::meta::dialect::Shared::new($template);
        &STATEMENT
    }};
}
pub(super) use shared;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_statements_are_spelled_in_each_dialect() {
        let sql: &'static Shared = shared!(
            "SELECT CAST(x AS {bigint}) AS n FROM t WHERE a = ? AND b IN (?, ?) AND s = 'open'"
        );
        assert_eq!(
            sql.on(Backend::Postgres),
            "SELECT CAST(x AS BIGINT) AS n FROM t WHERE a = $1 AND b IN ($2, $3) AND s = 'open'"
        );
        assert_eq!(
            sql.on(Backend::MySql),
            "SELECT CAST(x AS SIGNED) AS n FROM t WHERE a = ? AND b IN (?, ?) AND s = 'open'"
        );
        assert_eq!(
            sql.on(Backend::Sqlite),
            "SELECT CAST(x AS INTEGER) AS n FROM t WHERE a = ? AND b IN (?, ?) AND s = 'open'"
        );
        // Spelled once: the same string each time.
        assert!(std::ptr::eq(
            sql.on(Backend::Postgres),
            sql.on(Backend::Postgres)
        ));
    }
}
