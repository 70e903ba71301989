//! The partitioned layout's upkeep: partitions made ahead of time, and
//! past ones detached and dropped once all their rows have expired.
//!
//! One maintainer works at a time: it holds the single row of
//! `idem_inbox_p_upkeep` as a lease ([`UPKEEP_LEASE`]), not a lock, so one
//! that dies or is cancelled halfway holds nothing once the lease runs
//! out. Every step is also safe to run again: a step that fails because a
//! maintainer whose lease ran out did it first (the partition exists, is
//! detached or is gone) is skipped.

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::Maintenance;

/// How many partition widths past the current one
/// [`Inbox::maintain`](super::Inbox::maintain) makes ahead of time: an
/// inbox keeps working for this long with no maintenance.
pub const PARTITIONS_AHEAD: i64 = 3;

/// How long a maintainer holds the upkeep lease at most.
pub(super) const UPKEEP_LEASE: Duration = Duration::from_secs(600);

/// The widest partition: ten years, which keeps every bound well inside
/// the range of timestamps.
pub(super) const MAX_WIDTH_SECS: u64 = 10 * 366 * 24 * 3600;

/// `idem_inbox_p_<width>_<start>`: the width and the range's start, in
/// seconds since the epoch.
fn partition_name(width: i64, start: i64) -> String {
    format!("idem_inbox_p_{width}_{start}")
}

/// The range of the partition starting at `start`, `width` seconds wide.
fn bounds(start: i64, width: i64) -> String {
    format!(
        "FOR VALUES FROM (to_timestamp({start})) TO (to_timestamp({}))",
        start + width
    )
}

/// The width and start of a partition named by [`partition_name`]; `None`
/// for any other table (left alone).
fn parse_name(name: &str) -> Option<(i64, i64)> {
    let (width, start) = name.strip_prefix("idem_inbox_p_")?.split_once('_')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(width) && digits(start)).then(|| Some((width.parse().ok()?, start.parse().ok()?)))?
}

/// The partitions of `parent`, with whether each is pending detach.
async fn partitions(
    client: &Client,
    parent: &str,
) -> Result<Vec<(String, bool)>, tokio_postgres::Error> {
    Ok(client
        .query(
            "SELECT c.relname::text, i.inhdetachpending
             FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = $1::text::regclass
             ORDER BY c.relname",
            &[&parent],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect())
}

/// Whether `schema.name` holds a row that is live now; `None` when the
/// table is gone (another maintainer dropped it).
async fn holds_live_row(
    client: &Client,
    schema: &str,
    name: &str,
) -> Result<Option<bool>, tokio_postgres::Error> {
    let sql = format!("SELECT EXISTS (SELECT 1 FROM {schema}.{name} WHERE expires_at > now())");
    match client.query_one(&sql, &[]).await {
        Ok(row) => Ok(Some(row.get(0))),
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Drops the partitions done with, then makes the ones ahead. A partition
/// is dropped only once `retention` has passed since its range ended and
/// no row in it is live, checked again once it is detached (no row can
/// arrive after that): a row a long transaction (whose `now()` is its
/// start) writes there late is then already expired, so dropping it loses
/// nothing.
pub(super) async fn maintain(
    client: &Client,
    schema: &str,
    width: u64,
    retention: Duration,
) -> Result<Maintenance, tokio_postgres::Error> {
    let holder = rand::random::<u128>().to_be_bytes();
    let lease_ms = UPKEEP_LEASE.as_secs_f64() * 1000.0;
    let taken = client
        .query_opt(
            &format!(
                "INSERT INTO {schema}.idem_inbox_p_upkeep AS u (id, holder, until)
                 VALUES (true, $1, now() + $2::float8 * interval '1 millisecond')
                 ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, until = excluded.until
                 WHERE u.until <= now()
                 RETURNING true"
            ),
            &[&&holder[..], &lease_ms],
        )
        .await?;
    if taken.is_none() {
        return Ok(Maintenance {
            busy: true,
            ..Maintenance::default()
        });
    }
    let done = upkeep(client, schema, width, retention).await;
    let released = client
        .execute(
            &format!("DELETE FROM {schema}.idem_inbox_p_upkeep WHERE holder = $1"),
            &[&&holder[..]],
        )
        .await;
    let done = done?;
    released?;
    Ok(done)
}

async fn upkeep(
    client: &Client,
    schema: &str,
    width: u64,
    retention: Duration,
) -> Result<Maintenance, tokio_postgres::Error> {
    // At most MAX_WIDTH_SECS (Inbox::partitioned clamps it).
    let width = i64::try_from(width).unwrap_or(i64::MAX);
    let retention = retention.as_secs_f64();
    let now: f64 = client
        .query_one("SELECT extract(epoch FROM now())::float8", &[])
        .await?
        .get(0);
    let parent = format!("{schema}.idem_inbox_p");
    let existing = partitions(client, &parent).await?;
    let mut done = Maintenance::default();

    for (name, pending) in &existing {
        let Some((w, start)) = parse_name(name) else {
            continue;
        };
        if (start + w) as f64 + retention > now
            || holds_live_row(client, schema, name).await? != Some(false)
        {
            continue;
        }
        // CONCURRENTLY takes no lock that blocks business transactions; a
        // detach interrupted before is finished with FINALIZE.
        let how = if *pending { "FINALIZE" } else { "CONCURRENTLY" };
        let detached = client
            .batch_execute(&format!(
                "ALTER TABLE {parent} DETACH PARTITION {schema}.{name} {how}"
            ))
            .await;
        if let Err(e) = detached {
            // Another maintainer may be detaching or have dropped it.
            let still = partitions(client, &parent).await?;
            if still.iter().any(|(n, p)| n == name && !p) {
                return Err(e);
            }
            continue;
        }
        match holds_live_row(client, schema, name).await? {
            None => continue,
            Some(true) => {
                client
                    .batch_execute(&format!(
                        "ALTER TABLE {parent} ATTACH PARTITION {schema}.{name} {}",
                        bounds(start, w)
                    ))
                    .await?;
                continue;
            }
            Some(false) => {}
        }
        client
            .batch_execute(&format!("DROP TABLE IF EXISTS {schema}.{name}"))
            .await?;
        done.dropped.push(name.clone());
    }

    // Truncation toward zero is flooring here: time is past the epoch.
    #[allow(clippy::cast_possible_truncation)]
    let current = (now / width as f64) as i64;
    for bucket in current..=current + PARTITIONS_AHEAD {
        let start = bucket * width;
        let name = partition_name(width, start);
        if existing.iter().any(|(n, _)| *n == name) {
            continue;
        }
        let made = client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {schema}.{name} PARTITION OF {parent} {}",
                bounds(start, width)
            ))
            .await;
        match made {
            Ok(()) => done.created.push(name),
            // Another maintainer made it in the meantime.
            Err(_)
                if partitions(client, &parent)
                    .await?
                    .iter()
                    .any(|(n, _)| *n == name) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_partition_names_are_read() {
        assert_eq!(
            parse_name(&partition_name(86400, 1_700_000_000)),
            Some((86400, 1_700_000_000))
        );
        for other in [
            "idem_inbox_p",
            "idem_inbox_p_1",
            "idem_inbox_p_1_x",
            "idem_inbox_p__5",
            "accounts_1_2",
        ] {
            assert_eq!(parse_name(other), None, "{other}");
        }
    }
}
