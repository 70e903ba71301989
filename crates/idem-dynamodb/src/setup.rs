//! Building a client without `aws-config`, and creating the table.

use std::time::Duration;

use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    TimeToLiveSpecification,
};
use aws_sdk_dynamodb::Client;
use idem::StoreError;

pub use idem_aws::ConfigError;

/// How long one attempt of a request may take, and all its retries.
/// DynamoDB answers in milliseconds; a request still open after this is
/// better failed (the store reports it unavailable) than left hanging.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// See [`ATTEMPT_TIMEOUT`].
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(15);

/// A client for `endpoint` (`None`: AWS's own for the region) in
/// `region`, signing with static credentials, over HTTPS with rustls,
/// with the SDK's standard retries and the timeouts above.
/// Applications on AWS usually build their client with `aws-config`
/// instead (`Client::new(&aws_config::load_from_env().await)`), which also
/// finds instance and container credentials.
pub fn client_for(
    endpoint: Option<&str>,
    region: &str,
    access_key: &str,
    secret_key: &str,
    session_token: Option<String>,
) -> Result<Client, ConfigError> {
    let config = idem_aws::sdk_config(
        endpoint,
        region,
        access_key,
        secret_key,
        session_token,
        timeouts(),
    )?;
    Ok(Client::new(&config))
}

/// [`client_for`] with the region and credentials from the standard
/// environment variables: `AWS_REGION` (or `AWS_DEFAULT_REGION`),
/// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and, if set,
/// `AWS_SESSION_TOKEN`.
pub fn client_from_env(endpoint: Option<&str>) -> Result<Client, ConfigError> {
    let config = idem_aws::sdk_config_from_env(endpoint, timeouts())?;
    Ok(Client::new(&config))
}

/// A 3 s connect timeout and [`ATTEMPT_TIMEOUT`] and [`OPERATION_TIMEOUT`].
fn timeouts() -> TimeoutConfig {
    TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(3))
        .operation_attempt_timeout(ATTEMPT_TIMEOUT)
        .operation_timeout(OPERATION_TIMEOUT)
        .build()
}

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
        Err(e) => return Err(super::map_err(e)),
    }
    for _ in 0..600 {
        let described = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(super::map_err)?;
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
                Err(super::map_err(e))
            }
        })
}
