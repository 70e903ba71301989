//! The table: one string partition key, TTL on `sweep_at`.

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    TimeToLiveSpecification,
};
use aws_sdk_dynamodb::Client;
use idem::StoreError;

use crate::error::map_err;

/// Creates `table` as the store needs it, if it does not exist: a string
/// partition key `pk`, on-demand capacity, and DynamoDB's TTL on the `sweep_at`
/// attribute (clean-up only; expiry is decided by the store). Waits until
/// the table is active.
pub async fn create_table(client: &Client, table: &str) -> Result<(), StoreError> {
    let created = client
        .create_table()
        .table_name(table)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .map_err(|e| StoreError::Backend(e.into()))?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()
                .map_err(|e| StoreError::Backend(e.into()))?,
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await;
    match created {
        Ok(_) => {}
        Err(e)
            if e.as_service_error()
                .is_some_and(|e| e.is_resource_in_use_exception()) => {}
        Err(e) => return Err(map_err(e)),
    }
    for _ in 0..600 {
        let described = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(map_err)?;
        let active = described
            .table()
            .and_then(|t| t.table_status())
            .is_some_and(|s| *s == aws_sdk_dynamodb::types::TableStatus::Active);
        if active {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    client
        .update_time_to_live()
        .table_name(table)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .attribute_name("sweep_at")
                .enabled(true)
                .build()
                .map_err(|e| StoreError::Backend(e.into()))?,
        )
        .send()
        .await
        .map(|_| ())
        .or_else(|e| {
            // Enabling TTL twice is refused; the table already has it.
            let already = e
                .as_service_error()
                .and_then(|s| aws_sdk_dynamodb::error::ProvideErrorMetadata::message(s))
                .is_some_and(|m| m.contains("already enabled"));
            if already {
                Ok(())
            } else {
                Err(map_err(e))
            }
        })
}
