//! The migrations, as `.sql` files in `migrations/`, and how they are
//! applied: in order, once each, recorded in `<schema>.idem_migrations`,
//! under an advisory lock so that processes starting together do not race.

use tokio_postgres::Client;

/// One migration: a version, a name and its SQL for a given schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// Applied in increasing order; recorded once applied.
    pub version: i32,
    /// A short name (the file name without `.sql`).
    pub name: &'static str,
    /// The statements, with the schema filled in.
    pub sql: String,
}

const FILES: &[(i32, &str, &str)] = &[
    (
        1,
        "0001_records",
        include_str!("../migrations/0001_records.sql"),
    ),
    (
        2,
        "0002_inbox",
        include_str!("../migrations/0002_inbox.sql"),
    ),
    (
        3,
        "0003_steps",
        include_str!("../migrations/0003_steps.sql"),
    ),
    (
        4,
        "0004_abandoned",
        include_str!("../migrations/0004_abandoned.sql"),
    ),
    (
        5,
        "0005_inbox_partitioned",
        include_str!("../migrations/0005_inbox_partitioned.sql"),
    ),
    (
        6,
        "0006_waiters",
        include_str!("../migrations/0006_waiters.sql"),
    ),
    (
        7,
        "0007_blobs",
        include_str!("../migrations/0007_blobs.sql"),
    ),
    (
        8,
        "0008_outbox",
        include_str!("../migrations/0008_outbox.sql"),
    ),
    (
        9,
        "0009_outbox_announce",
        include_str!("../migrations/0009_outbox_announce.sql"),
    ),
    (
        10,
        "0010_abandoned_by_lease",
        include_str!("../migrations/0010_abandoned_by_lease.sql"),
    ),
    (
        11,
        "0011_horizon",
        include_str!("../migrations/0011_horizon.sql"),
    ),
    (
        12,
        "0012_pending",
        include_str!("../migrations/0012_pending.sql"),
    ),
];

/// Whether `name` can be used as a schema unquoted: 1 to 63 characters of
/// lowercase ASCII letters, digits and `_`, not starting with a digit.
pub(crate) fn valid_schema(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// `schema`, checked to be a plain identifier.
///
/// # Panics
///
/// If it is not (see [`valid_schema`]): a schema name is the program's own
/// constant.
pub(crate) fn checked(schema: &str) -> &str {
    assert!(
        valid_schema(schema),
        "invalid schema name {schema:?}: use 1 to 63 characters of a-z 0-9 _"
    );
    schema
}

/// Fills `{schema}` in an SQL text.
pub(crate) fn render(sql: &str, schema: &str) -> String {
    sql.replace("{schema}", schema)
}

/// Every migration for `schema`, for projects that apply migrations with
/// their own tool. [`crate::PgStore::setup`] applies them itself.
///
/// # Panics
///
/// If `schema` is not 1 to 63 characters of `a-z 0-9 _` (not starting
/// with a digit): a schema name is the program's own constant.
pub fn migrations(schema: &str) -> Vec<Migration> {
    assert!(
        valid_schema(schema),
        "invalid schema name {schema:?}: use 1 to 63 characters of a-z 0-9 _"
    );
    FILES
        .iter()
        .map(|(version, name, sql)| Migration {
            version: *version,
            name,
            sql: render(sql, schema),
        })
        .collect()
}

/// Applies the migrations `client` has not seen, in one transaction.
pub(crate) async fn apply(
    client: &mut Client,
    schema: &str,
) -> Result<Vec<i32>, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('idem-migrations:' || $1::text))",
        &[&schema],
    )
    .await?;
    let exists = tx
        .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = $1", &[&schema])
        .await?
        .is_some();
    if !exists {
        tx.batch_execute(&render("CREATE SCHEMA IF NOT EXISTS {schema}", schema))
            .await?;
    }
    tx.batch_execute(&render(
        "CREATE TABLE IF NOT EXISTS {schema}.idem_migrations (
             version integer PRIMARY KEY,
             name text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now())",
        schema,
    ))
    .await?;
    let done: Vec<i32> = tx
        .query(
            &render("SELECT version FROM {schema}.idem_migrations", schema),
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut applied = Vec::new();
    for m in migrations(schema) {
        if done.contains(&m.version) {
            continue;
        }
        tx.batch_execute(&m.sql).await?;
        tx.execute(
            &render(
                "INSERT INTO {schema}.idem_migrations (version, name) VALUES ($1, $2)",
                schema,
            ),
            &[&m.version, &m.name],
        )
        .await?;
        applied.push(m.version);
    }
    tx.commit().await?;
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_in_order_and_fill_the_schema() {
        let all = migrations("billing");
        let versions: Vec<i32> = all.iter().map(|m| m.version).collect();
        assert_eq!(versions, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        assert!(all.iter().all(|m| !m.sql.contains("{schema}")));
        assert!(all[0].sql.contains("billing.idem_records"));
    }

    #[test]
    fn schema_names_are_plain_identifiers() {
        for ok in ["public", "idem", "a_1"] {
            assert!(valid_schema(ok), "{ok}");
        }
        for bad in ["", "1abc", "Idem", "a-b", "a;drop", &"x".repeat(64)] {
            assert!(!valid_schema(bad), "{bad}");
        }
    }
}
