//! # idem-aws: the SDK configuration idem's AWS crates share
//!
//! `idem-dynamodb` and `idem-sqs` build their clients from one
//! [`SdkConfig`]: static credentials, HTTPS with rustls (ring, no
//! aws-lc), the SDK's standard retries and the caller's timeouts, without
//! `aws-config`. Applications on AWS usually load their configuration with
//! `aws-config` instead, which also finds instance and container
//! credentials, and pass it to `Client::new`.

use aws_credential_types::provider::SharedCredentialsProvider;
use aws_credential_types::Credentials;
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
use aws_smithy_runtime_api::client::behavior_version::BehaviorVersion;
use aws_types::region::Region;
use aws_types::sdk_config::TimeoutConfig;
pub use aws_types::SdkConfig;

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

/// A configuration for `endpoint` (`None`: AWS's own for the region) in
/// `region`, signing with static credentials, over HTTPS with rustls, with
/// the SDK's standard retries and `timeouts`.
pub fn sdk_config(
    endpoint: Option<&str>,
    region: &str,
    access_key: &str,
    secret_key: &str,
    session_token: Option<String>,
    timeouts: TimeoutConfig,
) -> Result<SdkConfig, ConfigError> {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https();
    let credentials = Credentials::new(access_key, secret_key, session_token, None, "idem-static");
    let mut config = SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region.to_owned()))
        .credentials_provider(SharedCredentialsProvider::new(credentials))
        .http_client(http)
        .timeout_config(timeouts);
    if let Some(endpoint) = endpoint {
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(ConfigError::BadEndpoint(endpoint.to_owned()));
        }
        config = config.endpoint_url(endpoint);
    }
    Ok(config.build())
}

/// What an idem URL for an AWS service takes after its `?`
/// (`dynamodb://TABLE?…`, `s3://BUCKET/PREFIX?…`): `endpoint=URL` (a
/// compatible server: DynamoDB Local, MinIO, moto), `region=R`, and
/// `create=true` (make the table or bucket if it is missing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UrlOptions {
    /// `endpoint=`: another server than AWS's own for the region.
    pub endpoint: Option<String>,
    /// `region=`: else `AWS_REGION`.
    pub region: Option<String>,
    /// `create=true`: create what the URL names if it is missing.
    pub create: bool,
}

impl UrlOptions {
    /// Reads a URL's query; an unknown parameter or a `create` that is
    /// not `true` or `false` is refused, in words.
    pub fn parse(query: &str) -> Result<Self, String> {
        Self::parse_with(query, &[]).map(|(options, _)| options)
    }

    /// [`parse`](Self::parse), handing back the parameters named in `own`
    /// (a service's own, such as DynamoDB's `remember`), in order, instead
    /// of refusing them.
    pub fn parse_with(query: &str, own: &[&str]) -> Result<(Self, Vec<(String, String)>), String> {
        let mut options = Self::default();
        let mut kept = Vec::new();
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            match &*name {
                "endpoint" => options.endpoint = Some(value.into_owned()),
                "region" => options.region = Some(value.into_owned()),
                "create" => {
                    options.create = value
                        .parse()
                        .map_err(|_| format!("create={value} is not true or false"))?;
                }
                mine if own.contains(&mine) => kept.push((name.into_owned(), value.into_owned())),
                other => {
                    let taken: Vec<&str> = ["endpoint", "region", "create"]
                        .into_iter()
                        .chain(own.iter().copied())
                        .collect();
                    return Err(format!(
                        "unknown parameter {other:?} ({} are taken)",
                        taken.join(", ")
                    ));
                }
            }
        }
        Ok((options, kept))
    }

    /// The configuration these options name: in `region=` with the
    /// environment's credentials, or with the region from the environment
    /// too ([`sdk_config_from_env`]).
    pub fn sdk_config(&self, timeouts: TimeoutConfig) -> Result<SdkConfig, ConfigError> {
        let Some(region) = &self.region else {
            return sdk_config_from_env(self.endpoint.as_deref(), timeouts);
        };
        let var =
            |name: &'static str| std::env::var(name).map_err(|_| ConfigError::MissingEnv(name));
        sdk_config(
            self.endpoint.as_deref(),
            region,
            &var("AWS_ACCESS_KEY_ID")?,
            &var("AWS_SECRET_ACCESS_KEY")?,
            std::env::var("AWS_SESSION_TOKEN").ok(),
            timeouts,
        )
    }
}

/// [`sdk_config`] with the region and credentials from the standard
/// environment variables: `AWS_REGION` (or `AWS_DEFAULT_REGION`),
/// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and, if set,
/// `AWS_SESSION_TOKEN`.
pub fn sdk_config_from_env(
    endpoint: Option<&str>,
    timeouts: TimeoutConfig,
) -> Result<SdkConfig, ConfigError> {
    let var = |name: &'static str| std::env::var(name).map_err(|_| ConfigError::MissingEnv(name));
    let region = var("AWS_REGION").or_else(|_| var("AWS_DEFAULT_REGION"))?;
    sdk_config(
        endpoint,
        &region,
        &var("AWS_ACCESS_KEY_ID")?,
        &var("AWS_SECRET_ACCESS_KEY")?,
        std::env::var("AWS_SESSION_TOKEN").ok(),
        timeouts,
    )
}
