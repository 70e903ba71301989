//! Building a client without `aws-config`.

use std::time::Duration;

use aws_sdk_sqs::config::timeout::TimeoutConfig;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::Client;
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};

/// A client configuration that cannot work.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A required environment variable is not set.
    #[error("environment variable {0} is not set (set it, or build the client with aws-config)")]
    MissingEnv(&'static str),
    /// The endpoint is not an `http://` or `https://` URL.
    #[error("endpoint {0:?} is not an http:// or https:// URL")]
    BadEndpoint(String),
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
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https();
    let mut config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region.to_owned()))
        .credentials_provider(Credentials::new(
            access_key,
            secret_key,
            session_token,
            None,
            "idem-static",
        ))
        .http_client(http)
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(3))
                .operation_attempt_timeout(Duration::from_secs(30))
                .build(),
        );
    if let Some(endpoint) = endpoint {
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(ConfigError::BadEndpoint(endpoint.to_owned()));
        }
        config = config.endpoint_url(endpoint);
    }
    Ok(Client::from_conf(config.build()))
}

/// [`client_for`] with the region and credentials from the standard
/// environment variables: `AWS_REGION` (or `AWS_DEFAULT_REGION`),
/// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and, if set,
/// `AWS_SESSION_TOKEN`.
pub fn client_from_env(endpoint: Option<&str>) -> Result<Client, ConfigError> {
    let var = |name: &'static str| std::env::var(name).map_err(|_| ConfigError::MissingEnv(name));
    let region = var("AWS_REGION").or_else(|_| var("AWS_DEFAULT_REGION"))?;
    client_for(
        endpoint,
        &region,
        &var("AWS_ACCESS_KEY_ID")?,
        &var("AWS_SECRET_ACCESS_KEY")?,
        std::env::var("AWS_SESSION_TOKEN").ok(),
    )
}
