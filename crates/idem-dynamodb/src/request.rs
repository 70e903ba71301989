//! One request as DynamoDB takes it: the conditional `PutItem` and
//! `UpdateItem` every transition is made of, and the consistent read.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use aws_sdk_dynamodb::Client;
use idem::store::Lease;
use idem::{RecordId, StoreError, Timestamp};

use crate::encode::{self, n, s, Item, Stored};
use crate::error::map_err;

/// What a conditional write came to.
pub(crate) enum Written {
    /// The condition held; the attributes asked for with `ReturnValues`.
    Done(Option<Item>),
    /// The condition failed; the item as it was (`None`: there was none).
    Refused(Option<Item>),
}

/// The table: the client and the table's name, and the requests every
/// transition is made of.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    pub(crate) client: Client,
    pub(crate) name: String,
}

impl Table {
    pub(crate) fn key(id: &RecordId) -> HashMap<String, AttributeValue> {
        HashMap::from([("pk".to_owned(), s(encode::pk(id)))])
    }

    /// `PutItem` of `item` on `condition`.
    pub(crate) async fn put(
        &self,
        item: Item,
        condition: &str,
        values: HashMap<String, AttributeValue>,
    ) -> Result<Written, StoreError> {
        let mut request = self
            .client
            .put_item()
            .table_name(&self.name)
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
            .client
            .update_item()
            .table_name(&self.name)
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
            .client
            .get_item()
            .table_name(&self.name)
            .set_key(Some(Self::key(id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(map_err)?;
        out.item.map(|i| encode::decode(&i, Some(id))).transpose()
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
