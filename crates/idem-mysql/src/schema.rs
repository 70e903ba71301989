//! The migrations, as `.sql` files in `migrations/` that the `mysql`
//! client reads as they are (`DELIMITER` included), and how idem applies
//! them: statement by statement, in order, once each, recorded in
//! `idem_migrations`, under a named lock so that processes starting
//! together do not race.

use mysql_async::prelude::Queryable;

/// One migration: a version, a name and its SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// Applied in increasing order; recorded once applied.
    pub version: u32,
    /// A short name (the file name without `.sql`).
    pub name: &'static str,
    /// The file, for `mysql < file` or a migration tool that understands
    /// `DELIMITER`.
    pub sql: &'static str,
}

impl Migration {
    /// The statements one by one, as a driver sends them: comments and
    /// `DELIMITER` lines dropped, each statement without its delimiter.
    pub fn statements(&self) -> Vec<String> {
        statements(self.sql)
    }
}

const FILES: &[(u32, &str, &str)] = &[
    (
        1,
        "0001_records",
        include_str!("../migrations/0001_records.sql"),
    ),
    (
        2,
        "0002_steps",
        include_str!("../migrations/0002_steps.sql"),
    ),
    (
        3,
        "0003_inbox",
        include_str!("../migrations/0003_inbox.sql"),
    ),
    (
        4,
        "0004_procedures",
        include_str!("../migrations/0004_procedures.sql"),
    ),
    (
        5,
        "0005_outbox",
        include_str!("../migrations/0005_outbox.sql"),
    ),
    (
        6,
        "0006_horizon",
        include_str!("../migrations/0006_horizon.sql"),
    ),
];

/// Every migration, for projects that apply migrations with their own
/// tool. [`crate::MySqlStore::setup`] applies them itself.
pub fn migrations() -> Vec<Migration> {
    FILES
        .iter()
        .map(|&(version, name, sql)| Migration { version, name, sql })
        .collect()
}

/// Splits a file as the `mysql` client does: statements end with the
/// current delimiter at the end of a line (`;` until a `DELIMITER` line
/// changes it); lines that are only a `--` comment are dropped.
fn statements(sql: &str) -> Vec<String> {
    let mut delimiter = ";".to_owned();
    let mut out = Vec::new();
    let mut current = String::new();
    for line in sql.lines() {
        let trimmed = line.trim();
        if let Some(new) = trimmed.strip_prefix("DELIMITER ") {
            delimiter = new.trim().to_owned();
            continue;
        }
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with("--")) {
            continue;
        }
        let end = line.trim_end();
        if !trimmed.starts_with("--") && end.ends_with(delimiter.as_str()) {
            current.push_str(&end[..end.len() - delimiter.len()]);
            out.push(std::mem::take(&mut current).trim_end().to_owned());
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    out
}

/// Applies the migrations `conn`'s database has not seen; their versions.
pub(crate) async fn apply(conn: &mut impl Queryable) -> Result<Vec<u32>, mysql_async::Error> {
    let lock = "CONCAT('idem-migrations:', DATABASE())";
    let got: Option<i64> = conn
        .query_first(format!("SELECT GET_LOCK({lock}, 60)"))
        .await?;
    if got != Some(1) {
        return Err(mysql_async::Error::Other(
            "another process held the migration lock for 60 s".into(),
        ));
    }
    let result = apply_locked(conn).await;
    let released = conn.query_drop(format!("DO RELEASE_LOCK({lock})")).await;
    let applied = result?;
    released?;
    Ok(applied)
}

async fn apply_locked(conn: &mut impl Queryable) -> Result<Vec<u32>, mysql_async::Error> {
    conn.query_drop(
        "CREATE TABLE IF NOT EXISTS idem_migrations (
             version INT UNSIGNED PRIMARY KEY,
             name VARCHAR(64) NOT NULL,
             applied_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
         ) ENGINE = InnoDB",
    )
    .await?;
    let done: Vec<u32> = conn.query("SELECT version FROM idem_migrations").await?;
    let mut applied = Vec::new();
    for m in migrations() {
        if done.contains(&m.version) {
            continue;
        }
        for statement in m.statements() {
            conn.query_drop(statement).await?;
        }
        conn.exec_drop(
            "INSERT INTO idem_migrations (version, name) VALUES (?, ?)",
            (m.version, m.name),
        )
        .await?;
        applied.push(m.version);
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_in_order() {
        let versions: Vec<u32> = migrations().iter().map(|m| m.version).collect();
        assert_eq!(versions, [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn files_split_as_the_mysql_client_splits_them() {
        let sql = "-- a comment\nCREATE TABLE t (a INT);\n\nDELIMITER $$\n\
                   CREATE PROCEDURE p()\nBEGIN\n    SELECT 1;\nEND$$\nDELIMITER ;\nDROP TABLE t;\n";
        assert_eq!(
            statements(sql),
            [
                "CREATE TABLE t (a INT)",
                "CREATE PROCEDURE p()\nBEGIN\n    SELECT 1;\nEND",
                "DROP TABLE t",
            ]
        );
        let procedures = &migrations()[3];
        let all = procedures.statements();
        assert!(all
            .iter()
            .any(|s| s.starts_with("CREATE PROCEDURE idem_claim_row(")));
        assert!(all
            .iter()
            .all(|s| !s.contains("DELIMITER") && !s.ends_with("$$")));
    }
}
