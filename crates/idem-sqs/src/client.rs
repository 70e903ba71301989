//! Building a client without `aws-config`.

use std::time::Duration;

use aws_sdk_sqs::config::timeout::TimeoutConfig;
use aws_sdk_sqs::Client;

pub use idem_aws::ConfigError;

/// The SDK's standard retries and a 30 s limit per attempt (a receive
/// long-polls for up to 20 s).
fn timeouts() -> TimeoutConfig {
    TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(3))
        .operation_attempt_timeout(Duration::from_secs(30))
        .build()
}

/// A client for `endpoint` (`None`: AWS's own for the region) in
/// `region`, signing with static credentials, over HTTPS with rustls, with
/// the SDK's standard retries and a 30 s limit per attempt (a receive
/// long-polls for up to 20 s). Applications on AWS usually build their
/// client with `aws-config` instead.
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

/// A client as an idem URL's query names it ([`idem_aws::UrlOptions`]:
/// `endpoint=`, `region=`), credentials from the environment.
pub fn client_from_options(options: &idem_aws::UrlOptions) -> Result<Client, ConfigError> {
    Ok(Client::new(&options.sdk_config(timeouts())?))
}
