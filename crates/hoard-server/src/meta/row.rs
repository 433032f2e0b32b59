//! The vocabulary the table declarations (`schema.rs`) are written in: a column typed by the
//! Rust value it holds ([`Col`]), a table's columns ([`Table`]), the [`table!`] macro that turns
//! one declaration into a typed row, its columns and its INSERT, and [`SqlRow`], a result row read
//! by column name. Nothing here knows a particular table.

use std::marker::PhantomData;
use std::sync::OnceLock;

use super::dialect::{Backend, Upsert};
use super::MetaError;

/// A parameter of a statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    Text(String),
    Int(i64),
    Bytes(Vec<u8>),
    /// SQL NULL, bound as a missing integer (the only nullable columns hold integers).
    Null,
}

impl Param {
    /// A count, bound as [`stored_count`] stores it.
    pub fn count(n: u64) -> Self {
        Self::Int(stored_count(n))
    }
}

/// A count as the signed 64-bit integer every backend stores (saturating: no count reaches it).
pub fn stored_count(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}

/// What a column holds, as every backend stores it: PostgreSQL's and MySQL's integer widths are
/// all `Int`; MySQL keeps `Text` in binary strings, so that it compares byte-wise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Int,
    Text,
    Bytes,
}

/// Where a column's value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The row written: in every INSERT.
    Written,
    /// The database (an id, a default, or a later UPDATE): in no INSERT.
    Database,
    /// The row written, and only the networked databases have the column (the fixed-size index
    /// hashes PostgreSQL and MySQL look slots up by; SQLite indexes the columns themselves).
    Networked,
}

/// One column of a [`Table`].
#[derive(Debug)]
pub struct Column {
    pub name: &'static str,
    pub kind: Kind,
    /// Read by the schema check (`schema_check.rs`), a test's tool.
    #[cfg_attr(not(any(test, feature = "test-util")), allow(dead_code))]
    pub nullable: bool,
    pub source: Source,
}

impl Column {
    /// Whether `backend`'s table has this column.
    pub fn exists_on(&self, backend: Backend) -> bool {
        self.source != Source::Networked || backend != Backend::Sqlite
    }

    /// Whether an INSERT on `backend` names this column.
    pub fn inserted_on(&self, backend: Backend) -> bool {
        self.source != Source::Database && self.exists_on(backend)
    }
}

/// A table: its name, its columns in declaration order, and its INSERT per backend, built once.
#[derive(Debug)]
pub struct Table {
    pub name: &'static str,
    pub columns: &'static [Column],
    inserts: [OnceLock<String>; 3],
    replaces: [OnceLock<String>; 3],
}

impl Table {
    pub const fn new(name: &'static str, columns: &'static [Column]) -> Self {
        Self {
            name,
            columns,
            inserts: [OnceLock::new(), OnceLock::new(), OnceLock::new()],
            replaces: [OnceLock::new(), OnceLock::new(), OnceLock::new()],
        }
    }

    /// The columns an INSERT on `backend` names, in order.
    pub fn inserted(&self, backend: Backend) -> impl Iterator<Item = &'static Column> + '_ {
        self.columns.iter().filter(move |c| c.inserted_on(backend))
    }

    /// `name, name, …` of the inserted columns, spelled for `backend`.
    pub fn inserted_list(&self, backend: Backend) -> String {
        self.inserted(backend)
            .map(|c| backend.quote(c.name))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `alias.name, …` of every column but the networked ones: what a statement selects for
    /// the reader [`table!`] generates (`EntryRow::read`), the same on every backend.
    pub fn selected(&self, alias: &str) -> String {
        self.columns
            .iter()
            .filter(|c| c.source != Source::Networked)
            .map(|c| format!("{alias}.{}", c.name))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `INSERT INTO table (columns) VALUES (…)`, one parameter per inserted column.
    pub fn insert(&self, backend: Backend) -> &str {
        self.inserts[backend as usize].get_or_init(|| {
            let count = self.inserted(backend).count();
            format!(
                "INSERT INTO {} ({}) VALUES ({})",
                self.name,
                self.inserted_list(backend),
                backend.placeholders(1, count)
            )
        })
    }

    /// [`Table::insert`] that replaces the row holding the same primary key, which is the
    /// table's first `key_columns` columns.
    pub fn replace(&self, backend: Backend, key_columns: usize) -> &str {
        self.replaces[backend as usize].get_or_init(|| {
            format!(
                "{} {}",
                self.insert(backend),
                self.on_existing_replace(backend, key_columns)
            )
        })
    }

    /// What an INSERT adds to replace the row holding the same primary key (the first
    /// `key_columns` columns): every other inserted column takes the new value.
    pub fn on_existing_replace(&self, backend: Backend, key_columns: usize) -> String {
        let keys: Vec<&str> = self.columns[..key_columns].iter().map(|c| c.name).collect();
        let others = self.inserted(backend).filter(|c| !keys.contains(&c.name));
        match backend.upsert() {
            Upsert::OnConflict => format!(
                "ON CONFLICT ({}) DO UPDATE SET {}",
                keys.join(", "),
                others
                    .map(|c| format!("{} = excluded.{}", c.name, c.name))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Upsert::OnDuplicateKey => format!(
                "ON DUPLICATE KEY UPDATE {}",
                others
                    .map(|c| {
                        let name = backend.quote(c.name);
                        format!("{name} = VALUES({name})")
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// A typed row of a [`Table`], declared by [`table!`].
pub trait Row: Sized {
    fn table() -> &'static Table;

    /// Every column's value, in declaration order (what tests hold [`Row::inserted_values`]
    /// against).
    #[cfg(test)]
    fn into_values(self) -> Vec<Param>;

    /// The values an INSERT on `backend` binds ([`Table::insert`]), in its order: those of
    /// [`Row::into_values`] whose columns the INSERT names.
    fn inserted_values(self, backend: Backend) -> Vec<Param>;

    /// The value of the column `name`, if the row has one.
    fn value(&self, name: &str) -> Option<Param>;
}

/// A Rust type a column is read into and written from.
pub trait Value: Sized {
    const KIND: Kind;
    const NULLABLE: bool = false;
    fn into_param(self) -> Param;
    fn read(row: &(impl SqlRow + ?Sized), name: &str) -> Result<Self, MetaError>;
}

impl Value for i64 {
    const KIND: Kind = Kind::Int;
    fn into_param(self) -> Param {
        Param::Int(self)
    }
    fn read(row: &(impl SqlRow + ?Sized), name: &str) -> Result<Self, MetaError> {
        row.int(name)
    }
}

impl Value for Option<i64> {
    const KIND: Kind = Kind::Int;
    const NULLABLE: bool = true;
    fn into_param(self) -> Param {
        self.map_or(Param::Null, Param::Int)
    }
    fn read(row: &(impl SqlRow + ?Sized), name: &str) -> Result<Self, MetaError> {
        row.opt_int(name)
    }
}

impl Value for String {
    const KIND: Kind = Kind::Text;
    fn into_param(self) -> Param {
        Param::Text(self)
    }
    fn read(row: &(impl SqlRow + ?Sized), name: &str) -> Result<Self, MetaError> {
        row.text(name)
    }
}

impl Value for Vec<u8> {
    const KIND: Kind = Kind::Bytes;
    fn into_param(self) -> Param {
        Param::Bytes(self)
    }
    fn read(row: &(impl SqlRow + ?Sized), name: &str) -> Result<Self, MetaError> {
        row.opt_bytes(name)?.ok_or_else(|| null(name))
    }
}

/// A column of a declared table, typed by the value it holds: `row.read(entries::size)` reads an
/// `i64` from the result column named `size`.
#[derive(Debug)]
pub struct Col<T> {
    pub name: &'static str,
    kind: PhantomData<fn() -> T>,
}

impl<T> Col<T> {
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            kind: PhantomData,
        }
    }
}

impl<T> Clone for Col<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Col<T> {}

/// A result row, read by column name. Each driver decodes its own column types (SQLite's
/// dynamic ones, PostgreSQL's strict integer widths, MySQL's binary strings). A statement names
/// every column it selects that is not a plain column of a table (`COUNT(*) AS n`), so no
/// value is ever read by its position.
pub trait SqlRow {
    fn opt_int(&self, name: &str) -> Result<Option<i64>, MetaError>;
    fn opt_text(&self, name: &str) -> Result<Option<String>, MetaError>;
    fn opt_bytes(&self, name: &str) -> Result<Option<Vec<u8>>, MetaError>;

    fn int(&self, name: &str) -> Result<i64, MetaError> {
        self.opt_int(name)?.ok_or_else(|| null(name))
    }
    fn text(&self, name: &str) -> Result<String, MetaError> {
        self.opt_text(name)?.ok_or_else(|| null(name))
    }
    /// A count or a size: never below zero.
    fn count(&self, name: &str) -> Result<u64, MetaError> {
        Ok(self.int(name)?.max(0) as u64)
    }
    /// A declared column's value.
    fn read<T: Value>(&self, col: Col<T>) -> Result<T, MetaError> {
        T::read(self, col.name)
    }
}

pub fn null(name: &str) -> MetaError {
    MetaError::Corrupt(format!("column {name} is NULL"))
}

/// A result row whose column `.1` is read under the name `.2`: for a join that selects two
/// columns of one name, one of them renamed (`c.size AS chunk_size`).
pub struct Renamed<'r, R>(pub &'r R, pub &'static str, pub &'static str);

impl<R: SqlRow> Renamed<'_, R> {
    fn name<'n>(&self, name: &'n str) -> &'n str {
        if name == self.1 {
            self.2
        } else {
            name
        }
    }
}

impl<R: SqlRow> SqlRow for Renamed<'_, R> {
    fn opt_int(&self, name: &str) -> Result<Option<i64>, MetaError> {
        self.0.opt_int(self.name(name))
    }
    fn opt_text(&self, name: &str) -> Result<Option<String>, MetaError> {
        self.0.opt_text(self.name(name))
    }
    fn opt_bytes(&self, name: &str) -> Result<Option<Vec<u8>>, MetaError> {
        self.0.opt_bytes(self.name(name))
    }
}

/// A decoder asked for a column its statement does not select.
pub fn not_selected(name: &str) -> MetaError {
    MetaError::Internal(format!("no column {name} in the row"))
}

/// The value of column `col` of a row that selects [`Table::selected`]: a networked column is
/// not selected there, and reads as empty.
pub fn read_selected<T: Value + Default>(
    r: &(impl SqlRow + ?Sized),
    col: Col<T>,
    source: Source,
) -> Result<T, MetaError> {
    match source {
        Source::Networked => Ok(T::default()),
        Source::Written | Source::Database => T::read(r, col.name),
    }
}

/// Where a declared column's value comes from (`table!`'s `= database` and `= networked`).
macro_rules! column_source {
    () => {
        $crate::meta::row::Source::Written
    };
    (database) => {
        $crate::meta::row::Source::Database
    };
    (networked) => {
        $crate::meta::row::Source::Networked
    };
}
pub(super) use column_source;

/// Declares a table once: a row struct `$row` with a field per column, and a module `$table`
/// with a typed [`Col`] per column and the [`Table`] (`$table::TABLE`). A column marked
/// `= database` is filled by the database (ids, defaults, later updates) and left out of
/// INSERTs; `= networked` exists only on PostgreSQL and MySQL.
macro_rules! table {
    (
        $(#[$doc:meta])*
        $row:ident in $table:ident {
            $( $(#[$cdoc:meta])* $col:ident : $ty:ty $(= $source:ident)? ),* $(,)?
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        // Some tables are written only by statements that add to their rows.
        #[allow(dead_code)]
        pub struct $row {
            $( $(#[$cdoc])* pub $col: $ty, )*
        }

        #[allow(non_upper_case_globals, dead_code)]
        pub mod $table {
            use $crate::meta::row::{Col, Column, Table, Value};

            $( pub const $col: Col<$ty> = Col::new(stringify!($col)); )*

            pub static TABLE: Table = Table::new(
                stringify!($table),
                &[$(Column {
                    name: stringify!($col),
                    kind: <$ty as Value>::KIND,
                    nullable: <$ty as Value>::NULLABLE,
                    source: $crate::meta::row::column_source!($($source)?),
                },)*],
            );
        }

        #[allow(dead_code)]
        impl $row {
            /// The row from a result row that selects [`Table::selected`] of its table (the
            /// networked columns stay empty): a new column is read where it is declared.
            pub fn read(
                r: &(impl $crate::meta::row::SqlRow + ?Sized),
            ) -> Result<Self, $crate::meta::MetaError> {
                Ok(Self {
                    $( $col: $crate::meta::row::read_selected(
                        r,
                        $table::$col,
                        $crate::meta::row::column_source!($($source)?),
                    )?, )*
                })
            }
        }

        impl $crate::meta::row::Row for $row {
            fn table() -> &'static $crate::meta::row::Table {
                &$table::TABLE
            }

            #[cfg(test)]
            fn into_values(self) -> Vec<$crate::meta::row::Param> {
                vec![$( $crate::meta::row::Value::into_param(self.$col), )*]
            }

            // One vector, filled in place: this runs for every row a save writes.
            fn inserted_values(self, backend: $crate::meta::dialect::Backend) -> Vec<$crate::meta::row::Param> {
                let mut columns = $table::TABLE.columns.iter();
                let mut values = Vec::with_capacity($table::TABLE.columns.len());
                $(
                    if columns.next().is_some_and(|c| c.inserted_on(backend)) {
                        values.push($crate::meta::row::Value::into_param(self.$col));
                    }
                )*
                values
            }

            fn value(&self, name: &str) -> Option<$crate::meta::row::Param> {
                match name {
                    $( stringify!($col) => Some($crate::meta::row::Value::into_param(self.$col.clone())), )*
                    _ => None,
                }
            }
        }
    };
}
pub(super) use table;
