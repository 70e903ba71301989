//! The partitioned layout's upkeep: partitions made ahead of time, and
//! past ones detached and dropped once all their rows have expired.

use tokio_postgres::Client;

use super::Maintenance;

/// How many partition widths past the current one
/// [`Inbox::maintain`](super::Inbox::maintain) makes ahead of time: an
/// inbox keeps working for this long with no maintenance.
pub const PARTITIONS_AHEAD: i64 = 3;

/// `idem_inbox_p_<width>_<start>`: the width and the range's start, in
/// seconds since the epoch.
fn partition_name(width: i64, start: i64) -> String {
    format!("idem_inbox_p_{width}_{start}")
}

/// The width and start of a partition named by [`partition_name`]; `None`
/// for any other table (left alone).
fn parse_name(name: &str) -> Option<(i64, i64)> {
    let (width, start) = name.strip_prefix("idem_inbox_p_")?.split_once('_')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(width) && digits(start)).then(|| Some((width.parse().ok()?, start.parse().ok()?)))?
}

/// Makes the partitions ahead and drops the ones done with. A partition
/// is dropped only once `retention` has passed since its range ended, and
/// no row in it is live: a row a long transaction (whose `now()` is its
/// start) writes there late is then already expired, so dropping it loses
/// nothing.
pub(super) async fn maintain(
    client: &Client,
    schema: &str,
    width: u64,
    retention: std::time::Duration,
) -> Result<Maintenance, tokio_postgres::Error> {
    let lock = format!("idem-inbox-maintain:{schema}");
    let taken: bool = client
        .query_one(
            "SELECT pg_try_advisory_lock(hashtextextended($1, 0))",
            &[&lock],
        )
        .await?
        .get(0);
    if !taken {
        return Ok(Maintenance {
            busy: true,
            ..Maintenance::default()
        });
    }
    let width = i64::try_from(width).unwrap_or(i64::MAX);
    let done = upkeep(client, schema, width, retention.as_secs_f64()).await;
    let unlocked = client
        .execute(
            "SELECT pg_advisory_unlock(hashtextextended($1, 0))",
            &[&lock],
        )
        .await;
    let done = done?;
    unlocked?;
    Ok(done)
}

async fn upkeep(
    client: &Client,
    schema: &str,
    width: i64,
    retention: f64,
) -> Result<Maintenance, tokio_postgres::Error> {
    let now: f64 = client
        .query_one("SELECT extract(epoch FROM now())::float8", &[])
        .await?
        .get(0);
    let parent = format!("{schema}.idem_inbox_p");
    let existing: Vec<(String, bool)> = client
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
        .collect();
    let mut done = Maintenance::default();

    // Truncation toward zero is flooring here: time is past the epoch.
    #[allow(clippy::cast_possible_truncation)]
    let current = (now / width as f64) as i64;
    for bucket in current..=current + PARTITIONS_AHEAD {
        let start = bucket * width;
        let name = partition_name(width, start);
        if existing.iter().any(|(n, _)| *n == name) {
            continue;
        }
        client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {schema}.{name} PARTITION OF {parent}
                 FOR VALUES FROM (to_timestamp({start})) TO (to_timestamp({end}))",
                end = start + width
            ))
            .await?;
        done.created.push(name);
    }

    for (name, pending) in &existing {
        let Some((w, start)) = parse_name(name) else {
            continue;
        };
        if (start + w) as f64 + retention > now {
            continue;
        }
        let live: bool = client
            .query_one(
                &format!("SELECT EXISTS (SELECT 1 FROM {schema}.{name} WHERE expires_at > now())"),
                &[],
            )
            .await?
            .get(0);
        if live {
            continue;
        }
        // CONCURRENTLY takes no lock that blocks business transactions;
        // a detach interrupted before is finished with FINALIZE.
        let how = if *pending { "FINALIZE" } else { "CONCURRENTLY" };
        client
            .batch_execute(&format!(
                "ALTER TABLE {parent} DETACH PARTITION {schema}.{name} {how}"
            ))
            .await?;
        client
            .batch_execute(&format!("DROP TABLE {schema}.{name}"))
            .await?;
        done.dropped.push(name.clone());
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
