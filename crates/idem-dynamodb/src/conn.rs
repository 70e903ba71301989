//! Building a client without `aws-config`.

use std::time::Duration;

use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::Client;

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
pub(crate) fn timeouts() -> TimeoutConfig {
    TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(3))
        .operation_attempt_timeout(ATTEMPT_TIMEOUT)
        .operation_timeout(OPERATION_TIMEOUT)
        .build()
}
