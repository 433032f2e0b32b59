//! Whether a migrated database has the tables `schema.rs` declares, both ways: every declared
//! column with its kind and nullability, and no column or table that no declaration names (a
//! column left behind by a migration is read by no row and written by no INSERT). For the
//! conformance tests (`tests/meta_conformance`), on every backend.

use super::dialect::Backend;
use super::row::Kind;
use super::schema::{DATABASE_OWN, TABLES};
use super::{DatabaseUrl, MetaError};

/// A column as the database's catalog describes it.
#[derive(Debug)]
struct Found {
    table: String,
    name: String,
    /// The catalog's type name, lower case.
    kind: String,
    nullable: bool,
    /// Filled by the database when an INSERT names it not: a default, an identity or a
    /// generated column.
    filled: bool,
}

/// How the backends' catalogs name the types of each [`Kind`].
fn holds(backend: Backend, kind: Kind, found: &str) -> bool {
    let found = found.to_ascii_lowercase();
    match (backend, kind) {
        (Backend::Sqlite, Kind::Int) => found == "integer",
        (Backend::Sqlite, Kind::Text) => found == "text",
        (Backend::Sqlite, Kind::Bytes) => found == "blob",
        (Backend::Postgres, Kind::Int) => {
            matches!(found.as_str(), "smallint" | "integer" | "bigint")
        }
        (Backend::Postgres, Kind::Text) => found == "text",
        (Backend::Postgres, Kind::Bytes) => found == "bytea",
        (Backend::MySql, Kind::Int) => {
            matches!(found.as_str(), "tinyint" | "smallint" | "int" | "bigint")
        }
        // Strings are kept in binary strings, so that they compare byte-wise; names of chunks
        // and reasons are ASCII text.
        (Backend::MySql, Kind::Text) => matches!(
            found.as_str(),
            "varbinary" | "blob" | "mediumblob" | "longblob" | "varchar" | "text" | "mediumtext"
        ),
        (Backend::MySql, Kind::Bytes) => {
            matches!(
                found.as_str(),
                "binary" | "varbinary" | "blob" | "mediumblob" | "longblob"
            )
        }
    }
}

/// Every disagreement between the declared tables and the database at `url` (migrated by
/// opening a store first); empty when they agree.
pub async fn schema_disagreements(url: &DatabaseUrl) -> Result<Vec<String>, MetaError> {
    let (backend, found) = match url {
        DatabaseUrl::Sqlite(path) => (Backend::Sqlite, sqlite_columns(path)?),
        DatabaseUrl::Postgres(url) => (Backend::Postgres, postgres_columns(url).await?),
        DatabaseUrl::MySql(url) => (Backend::MySql, mysql_columns(url).await?),
    };
    let mut wrong = Vec::new();
    for table in TABLES {
        for column in table.columns.iter().filter(|c| c.exists_on(backend)) {
            let Some(f) = found
                .iter()
                .find(|f| f.table == table.name && f.name == column.name)
            else {
                wrong.push(format!(
                    "{}.{} is declared but missing",
                    table.name, column.name
                ));
                continue;
            };
            if !holds(backend, column.kind, &f.kind) {
                wrong.push(format!(
                    "{}.{} is declared {:?} but is {}",
                    table.name, column.name, column.kind, f.kind
                ));
            }
            // SQLite reports its integer primary keys as nullable; they never hold NULL.
            let nullable = f.nullable && !(backend == Backend::Sqlite && column.name == "id");
            if nullable != column.nullable {
                wrong.push(format!(
                    "{}.{} is declared {} but is {}",
                    table.name,
                    column.name,
                    if column.nullable {
                        "nullable"
                    } else {
                        "NOT NULL"
                    },
                    if nullable { "nullable" } else { "NOT NULL" },
                ));
            }
        }
        for f in found.iter().filter(|f| f.table == table.name) {
            let declared = table
                .columns
                .iter()
                .any(|c| c.name == f.name && c.exists_on(backend))
                || DATABASE_OWN.contains(&(backend, table.name, f.name.as_str()));
            if !declared {
                let trap = if f.filled || f.nullable {
                    ""
                } else {
                    ", and NOT NULL without a default: every INSERT fails"
                };
                wrong.push(format!(
                    "{}.{} is in the database but no row declares it{trap}",
                    table.name, f.name
                ));
            }
        }
    }
    // A set: the catalogs list a table once per column, in whatever order they keep.
    let undeclared: std::collections::BTreeSet<&str> = found
        .iter()
        .map(|f| f.table.as_str())
        .filter(|t| *t != BOOKKEEPING && TABLES.iter().all(|d| d.name != *t))
        .collect();
    for table in undeclared {
        wrong.push(format!("table {table} is in the database but not declared"));
    }
    Ok(wrong)
}

/// The table where PostgreSQL and MySQL keep the schema's version (SQLite: `user_version`).
const BOOKKEEPING: &str = "hoard_schema";

fn sqlite_columns(path: &std::path::Path) -> Result<Vec<Found>, MetaError> {
    let conn = rusqlite::Connection::open(path)?;
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut found = Vec::new();
    for table in tables {
        let mut stmt = conn.prepare(&format!("PRAGMA table_info(\"{table}\")"))?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let default: Option<String> = row.get("dflt_value")?;
            let primary_key: i64 = row.get("pk")?;
            found.push(Found {
                table: table.clone(),
                name: row.get("name")?,
                kind: row.get::<_, String>("type")?.to_ascii_lowercase(),
                nullable: row.get::<_, i64>("notnull")? == 0,
                filled: default.is_some() || primary_key > 0,
            });
        }
    }
    Ok(found)
}

async fn postgres_columns(url: &str) -> Result<Vec<Found>, MetaError> {
    use sqlx::Row;
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(url)
        .await
        .map_err(super::sqlx::from_sqlx)?;
    let rows = sqlx::query(
        "SELECT table_name::text AS table_name, column_name::text AS column_name,
                data_type::text AS data_type, is_nullable = 'YES' AS nullable,
                (column_default IS NOT NULL OR is_identity = 'YES' OR is_generated = 'ALWAYS') AS filled
         FROM information_schema.columns WHERE table_schema = current_schema()
         ORDER BY table_name, ordinal_position",
    )
    .fetch_all(&mut conn)
    .await
    .map_err(super::sqlx::from_sqlx)?;
    rows.iter()
        .map(|r| {
            Ok(Found {
                table: r.try_get("table_name")?,
                name: r.try_get("column_name")?,
                kind: r.try_get("data_type")?,
                nullable: r.try_get("nullable")?,
                filled: r.try_get("filled")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(super::sqlx::from_sqlx)
}

async fn mysql_columns(url: &str) -> Result<Vec<Found>, MetaError> {
    use sqlx::Row;
    let mut conn = <sqlx::MySqlConnection as sqlx::Connection>::connect(url)
        .await
        .map_err(super::sqlx::from_sqlx)?;
    // The catalog's strings come back as binary on some servers: cast each to text.
    let rows = sqlx::query(
        "SELECT CAST(table_name AS CHAR) AS table_name, CAST(column_name AS CHAR) AS column_name,
                CAST(data_type AS CHAR) AS data_type,
                CAST(is_nullable = 'YES' AS SIGNED) AS nullable,
                CAST(column_default IS NOT NULL OR extra LIKE '%auto_increment%'
                     OR extra LIKE '%GENERATED%' AS SIGNED) AS filled
         FROM information_schema.columns WHERE table_schema = DATABASE()
         ORDER BY table_name, ordinal_position",
    )
    .fetch_all(&mut conn)
    .await
    .map_err(super::sqlx::from_sqlx)?;
    rows.iter()
        .map(|r| {
            Ok(Found {
                table: r.try_get("table_name")?,
                name: r.try_get("column_name")?,
                kind: r.try_get::<String, _>("data_type")?.to_ascii_lowercase(),
                nullable: r.try_get::<i64, _>("nullable")? != 0,
                filled: r.try_get::<i64, _>("filled")? != 0,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(super::sqlx::from_sqlx)
}
