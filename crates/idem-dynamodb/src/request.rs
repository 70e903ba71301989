//! One request as DynamoDB takes it: the conditional `PutItem` and
//! `UpdateItem` every transition is made of, and the consistent read.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use idem::{Lease, Record, RecordId, StoreError, Timestamp};

use crate::encode::{self, n, s, Item, Stored};
use crate::error::{map_err, ItemTooLarge};
use crate::store::DynamoStore;

/// What a conditional write came to.
pub(crate) enum Written {
    /// The condition held; the attributes asked for with `ReturnValues`.
    Done(Option<Item>),
    /// The condition failed; the item as it was (`None`: there was none).
    Refused(Option<Item>),
}

impl DynamoStore {
    pub(crate) fn key(id: &RecordId) -> HashMap<String, AttributeValue> {
        HashMap::from([("pk".to_owned(), s(encode::pk(id)))])
    }

    pub(crate) fn encode(
        &self,
        id: &RecordId,
        record: &Record,
        version: u64,
        nonce: Option<idem::LeaseToken>,
    ) -> Item {
        encode::encode(
            id,
            record,
            version,
            nonce,
            self.grace_secs(),
            self.inner.settings.encoding,
        )
    }

    /// Refuses an item of `size` bytes over DynamoDB's limit.
    pub(crate) fn check_size(id: &RecordId, size: usize) -> Result<(), StoreError> {
        if size > encode::ITEM_LIMIT {
            return Err(StoreError::Backend(Box::new(ItemTooLarge {
                id: id.to_string(),
                size,
                limit: encode::ITEM_LIMIT,
            })));
        }
        Ok(())
    }

    /// `PutItem` of `item` on `condition`.
    pub(crate) async fn put(
        &self,
        item: Item,
        condition: &str,
        values: HashMap<String, AttributeValue>,
    ) -> Result<Written, StoreError> {
        let mut request = self
            .inner
            .client
            .put_item()
            .table_name(&self.inner.table)
            .set_item(Some(item))
            .condition_expression(condition)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if !values.is_empty() {
            request = request.set_expression_attribute_values(Some(values));
        }
        match request.send().await {
            Ok(_) => Ok(Written::Done(None)),
            Err(SdkError::ServiceError(e)) if e.err().is_conditional_check_failed_exception() => {
                let old = match e.into_err() {
                    aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(c) => c.item,
                    _ => None,
                };
                Ok(Written::Refused(old))
            }
            Err(e) => Err(map_err(e)),
        }
    }

    /// `UpdateItem` of `id` with `update` on `condition`.
    pub(crate) async fn update(
        &self,
        id: &RecordId,
        op: Update<'_>,
    ) -> Result<Written, StoreError> {
        let mut request = self
            .inner
            .client
            .update_item()
            .table_name(&self.inner.table)
            .set_key(Some(Self::key(id)))
            .update_expression(op.update)
            .condition_expression(op.condition)
            .set_expression_attribute_values(Some(op.values))
            .return_values(op.returns)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if !op.names.is_empty() {
            request = request.set_expression_attribute_names(Some(op.names));
        }
        match request.send().await {
            Ok(out) => Ok(Written::Done(out.attributes)),
            Err(SdkError::ServiceError(e)) if e.err().is_conditional_check_failed_exception() => {
                let old = match e.into_err() {
                    aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(c) => c.item,
                    _ => None,
                };
                Ok(Written::Refused(old))
            }
            Err(e) => Err(map_err(e)),
        }
    }

    /// The item of `id`, read consistently.
    pub(crate) async fn read(&self, id: &RecordId) -> Result<Option<Stored>, StoreError> {
        let out = self
            .inner
            .client
            .get_item()
            .table_name(&self.inner.table)
            .set_key(Some(Self::key(id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(map_err)?;
        out.item.map(|i| encode::decode(&i, Some(id))).transpose()
    }

    /// The live record of `id`, or `None`.
    pub(crate) async fn live(&self, id: &RecordId) -> Result<Option<Stored>, StoreError> {
        let now = self.now();
        Ok(self.read(id).await?.filter(|s| !s.record.is_expired(now)))
    }

    /// Writes `record` over the item `seen` (keeping its journal, or with
    /// `journal`), on the condition that the item is still at `seen`'s
    /// version (or still absent).
    pub(crate) async fn replace(
        &self,
        id: &RecordId,
        seen: Option<&Stored>,
        record: &Record,
        nonce: Option<idem::LeaseToken>,
        journal: HashMap<String, AttributeValue>,
    ) -> Result<Written, StoreError> {
        let version = seen.map_or(1, |s| s.version + 1);
        let mut item = self.encode(id, record, version, nonce);
        item.insert("j".into(), AttributeValue::M(journal));
        Self::check_size(id, encode::size(&item))?;
        match seen {
            None => {
                self.put(item, "attribute_not_exists(pk)", HashMap::new())
                    .await
            }
            Some(seen) => {
                let values = HashMap::from([(":v".to_owned(), n(seen.version))]);
                self.put(item, "v = :v", values).await
            }
        }
    }
}

/// The condition of every holder's write: live, in progress, this token.
pub(crate) const HELD: &str = "st = :p AND tk = :tk AND ex > :now";

/// The values [`HELD`] reads, and `:one` for raising the version.
pub(crate) fn held_values(lease: &Lease, now: Timestamp) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (":p".to_owned(), s("p")),
        (":tk".to_owned(), s(lease.token.to_hex())),
        (":now".to_owned(), n(now.as_millis())),
        (":one".to_owned(), n(1)),
    ])
}

/// One `UpdateItem`.
pub(crate) struct Update<'a> {
    pub(crate) update: &'a str,
    pub(crate) condition: &'a str,
    pub(crate) values: HashMap<String, AttributeValue>,
    pub(crate) names: HashMap<String, String>,
    pub(crate) returns: ReturnValue,
}
