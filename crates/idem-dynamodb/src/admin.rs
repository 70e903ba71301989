//! Reading, deleting, listing and purging records, and finding abandoned
//! ones: by key where a key is given, by a consistent scan otherwise.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use idem::{
    DeleteRecord, FindAbandoned, GetRecord, ListPage, ListQuery, ListRecords, PurgeExpired, Record,
    RecordId, RecordTtl, Scope, State, StoreError, Timestamp,
};

use crate::encode::{self, n, s, Stored};
use crate::error::map_err;
use crate::horizon::TTL_LAG;
use crate::request::{Update, Written};
use crate::store::DynamoStore;

impl DynamoStore {
    /// Scans the whole table for live records matching `filter` (an
    /// expression over `:now` and `values`), consistently, a page at a
    /// time.
    pub(crate) async fn scan_live(
        &self,
        filter: &str,
        mut values: HashMap<String, AttributeValue>,
        now: Timestamp,
    ) -> Result<Vec<Stored>, StoreError> {
        values.insert(":now".into(), n(now.as_millis()));
        let mut pages = self
            .inner
            .table
            .client
            .scan()
            .table_name(&self.inner.table.name)
            .consistent_read(true)
            .filter_expression(format!("ex > :now AND ({filter})"))
            .set_expression_attribute_values(Some(values))
            .into_paginator()
            .items()
            .send();
        let mut found = Vec::new();
        while let Some(next) = pages.next().await {
            found.push(encode::decode(&next.map_err(map_err)?, None)?);
        }
        Ok(found)
    }
}

impl GetRecord for DynamoStore {
    async fn get(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        Ok(self.live(id).await?.map(|s| s.record))
    }
}

impl RecordTtl for DynamoStore {
    async fn ttl(&self, id: &RecordId, response: &[u8]) -> Result<Option<Duration>, StoreError> {
        let now = self.now();
        Ok(self
            .live(id)
            .await?
            .filter(|s| s.record.state.completed_with(response))
            .map(|s| s.record.expires_at.since(now)))
    }
}

impl DeleteRecord for DynamoStore {
    /// Leaves a tombstone (expired, released, empty journal) that keeps the
    /// fence, so the next claim's fence is higher; DynamoDB's TTL removes
    /// it after the grace, and so does [`PurgeExpired`]. Deleting a live
    /// record forgets its key's memory ([`idem::horizon`]: its retry is
    /// to run again); an expired record that remembers is left to the
    /// purge, which keeps the memory.
    async fn delete(&self, id: &RecordId) -> Result<bool, StoreError> {
        let now = self.now();
        let values = HashMap::from([
            (":r".to_owned(), s("r")),
            (":zero".to_owned(), n(0)),
            (":now".to_owned(), n(now.as_millis())),
            (":ttl".to_owned(), n(encode::ttl(now, self.grace_secs()))),
            (":one".to_owned(), n(1)),
            (":empty".to_owned(), AttributeValue::M(HashMap::new())),
        ]);
        let op = Update {
            update:
                "SET st = :r, ex = :zero, sweep_at = :ttl, ua = :now, j = :empty, v = v + :one \
                     REMOVE tk, lu, rs, rz, fc, fm, wn, hd, hf, hu",
            condition: "attribute_exists(pk) AND (ex > :now OR attribute_not_exists(hu))",
            values,
            names: HashMap::new(),
            returns: ReturnValue::AllOld,
        };
        match self.inner.table.update(id, op).await? {
            Written::Done(old) => {
                let old = old.map(|i| encode::decode(&i, Some(id))).transpose()?;
                Ok(old.is_some_and(|o| !o.record.is_expired(now)))
            }
            Written::Refused(_) => Ok(false),
        }
    }
}

impl ListRecords for DynamoStore {
    /// Lists with a consistent scan of the whole table, filtered by
    /// DynamoDB and sorted here: each page costs a full scan, so this is
    /// for administration, not hot paths.
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        let mut filter = vec!["attribute_exists(pk)".to_owned()];
        let mut values = HashMap::new();
        if let Some(scope) = &query.scope {
            filter.push("s = :s".into());
            values.insert(":s".to_owned(), s(scope.as_str()));
        }
        if let Some(state) = query.state {
            filter.push("st = :st".into());
            values.insert(":st".to_owned(), s(state_code(state)));
        }
        let found = self
            .scan_live(&filter.join(" AND "), values, self.now())
            .await?
            .into_iter()
            .map(|s| (s.id, s.record))
            .filter(|(id, _)| query.after.as_ref().is_none_or(|after| id > after))
            .collect();
        Ok(ListPage::first_of(found, query.limit))
    }
}

fn state_code(state: idem::StateKind) -> &'static str {
    match state {
        idem::StateKind::InProgress => "p",
        idem::StateKind::Completed => "c",
        idem::StateKind::Failed => "f",
        idem::StateKind::Released => "r",
    }
}

impl PurgeExpired for DynamoStore {
    /// Deletes expired items (tombstones included), each on the condition
    /// that it is still expired at the version seen, and that its fence is
    /// older than `grace` by this clock: a later claim takes its fence from
    /// its own clock, which must then still be past the fence even if it
    /// runs behind this one (by less than `grace`), as for DynamoDB's TTL.
    /// An expired item that remembers its key ([`idem::horizon`]) is
    /// stripped to its memory instead, at once (a tombstone keeping the
    /// fence, so the grace does not apply); a
    /// memory that ended is deleted two days later (DynamoDB's TTL may lag
    /// that long), where DynamoDB's
    /// TTL has not done it already. Successive calls walk the table from
    /// where the last one stopped; a call that reaches the end starts the
    /// next walk over. DynamoDB's TTL does the deleting for free, later.
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let now = self.now();
        let floor = now
            .saturating_sub(self.inner.settings.grace)
            .as_millis()
            .saturating_mul(1000);
        let gone = now.saturating_sub(TTL_LAG).as_millis();
        let mut purged = 0;
        let mut from = self.inner.purge_from.lock().take();
        while purged < limit {
            let out = self
                .inner
                .table
                .client
                .scan()
                .table_name(&self.inner.table.name)
                .consistent_read(true)
                .filter_expression(
                    "ex <= :now AND ((ex > :zero AND hu > :now) OR (fe < :floor \
                     AND (ex > :zero OR attribute_not_exists(hu) OR hu <= :gone)))",
                )
                .projection_expression("pk, v, hu")
                .expression_attribute_values(":now", n(now.as_millis()))
                .expression_attribute_values(":floor", n(floor))
                .expression_attribute_values(":zero", n(0))
                .expression_attribute_values(":gone", n(gone))
                .set_exclusive_start_key(
                    from.take()
                        .map(|pk| HashMap::from([("pk".to_owned(), s(pk))])),
                )
                .limit(500)
                .send()
                .await
                .map_err(map_err)?;
            for found in out.items() {
                if purged == limit {
                    break;
                }
                let (Some(pk), Some(v)) = (
                    found.get("pk").and_then(|v| v.as_s().ok()),
                    found.get("v").and_then(|v| v.as_n().ok()),
                ) else {
                    continue;
                };
                from = Some(pk.clone());
                let until = found
                    .get("hu")
                    .and_then(|v| v.as_n().ok())
                    .and_then(|raw| raw.parse::<u64>().ok());
                let ended = match until {
                    Some(until) if until > now.as_millis() => self.strip(pk, v, until).await,
                    // A memory that ended, not yet TTL's to delete.
                    Some(until) if until > gone => continue,
                    _ => self.drop_expired(pk, v, now, floor).await,
                };
                match ended {
                    Ok(true) => purged += 1,
                    Ok(false) => {}
                    Err(e) => {
                        *self.inner.purge_from.lock() = from;
                        return Err(e);
                    }
                }
            }
            let Some(last) = out
                .last_evaluated_key
                .and_then(|k| k.get("pk").and_then(|v| v.as_s().ok()).cloned())
            else {
                // The end of the table: the next call starts over.
                return Ok(purged);
            };
            if purged < limit {
                from = Some(last);
            }
        }
        *self.inner.purge_from.lock() = from;
        Ok(purged)
    }
}

impl DynamoStore {
    /// Deletes the expired item `pk` if it is still at version `v`, expired
    /// and fenced below `floor`; `false` if it changed since the scan.
    async fn drop_expired(
        &self,
        pk: &str,
        v: &str,
        now: Timestamp,
        floor: u64,
    ) -> Result<bool, StoreError> {
        let deleted = self
            .inner
            .table
            .client
            .delete_item()
            .table_name(&self.inner.table.name)
            .key("pk", s(pk))
            .condition_expression("v = :v AND ex <= :now AND fe < :floor")
            .expression_attribute_values(":v", AttributeValue::N(v.to_owned()))
            .expression_attribute_values(":now", n(now.as_millis()))
            .expression_attribute_values(":floor", n(floor))
            .send()
            .await;
        match deleted {
            Ok(_) => Ok(true),
            Err(SdkError::ServiceError(e)) if e.err().is_conditional_check_failed_exception() => {
                Ok(false)
            }
            Err(e) => Err(map_err(e)),
        }
    }

    /// Strips the expired item `pk`, if it is still at version `v`, to the
    /// memory it keeps: a tombstone (released, expired, no response, no
    /// journal; the scope and key only in `pk`) that keeps the fence and
    /// the memory's attributes, and that DynamoDB's TTL keeps until the
    /// memory `until` ends (a write that carried the memory under a later
    /// request may have set `sweep_at` by that request's retention).
    async fn strip(&self, pk: &str, v: &str, until: u64) -> Result<bool, StoreError> {
        let stripped = self
            .inner
            .table
            .client
            .update_item()
            .table_name(&self.inner.table.name)
            .key("pk", s(pk))
            .update_expression(
                "SET st = :r, ex = :zero, j = :empty, sweep_at = :sweep, v = v + :one \
                 REMOVE s, k, tk, lu, rs, rz, fc, fm, wn, fp",
            )
            .condition_expression("v = :v")
            .expression_attribute_values(":sweep", n(until.div_ceil(1000)))
            .expression_attribute_values(":v", AttributeValue::N(v.to_owned()))
            .expression_attribute_values(":r", s("r"))
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":empty", AttributeValue::M(HashMap::new()))
            .send()
            .await;
        match stripped {
            Ok(_) => Ok(true),
            Err(SdkError::ServiceError(e)) if e.err().is_conditional_check_failed_exception() => {
                Ok(false)
            }
            Err(e) => Err(map_err(e)),
        }
    }
}

impl FindAbandoned for DynamoStore {
    /// Scans the table for the scope's in-progress records whose lease ran
    /// out, longest-abandoned first. A full scan per call: run it on the
    /// completer's schedule, not per request.
    async fn abandoned(
        &self,
        scope: &Scope,
        limit: usize,
    ) -> Result<Vec<(RecordId, Record)>, StoreError> {
        let values = HashMap::from([
            (":s".to_owned(), s(scope.as_str())),
            (":p".to_owned(), s("p")),
        ]);
        let mut found = self
            .scan_live("s = :s AND st = :p AND lu <= :now", values, self.now())
            .await?;
        found.sort_by_key(|s| match s.record.state {
            State::InProgress { lease_until, .. } => lease_until,
            _ => Timestamp::ZERO,
        });
        Ok(found
            .into_iter()
            .take(limit)
            .map(|s| (s.id, s.record))
            .collect())
    }
}
