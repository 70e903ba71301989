//! `s3://BUCKET[/PREFIX][?endpoint=URL][&region=R][&create=true]`, and
//! the client it makes.

use aws_sdk_s3::config::Builder as ConfigBuilder;
use aws_sdk_s3::Client;

use crate::S3Blobs;

/// Why an S3 blob store could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL does not say what it must.
    #[error("S3 URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The client's configuration cannot work (credentials, endpoint).
    #[error(transparent)]
    Config(#[from] idem_aws::ConfigError),
    /// The bucket could not be created.
    #[error("cannot create the bucket {bucket}: {reason}")]
    CreateBucket {
        /// The bucket.
        bucket: String,
        /// What S3 said.
        reason: String,
    },
}

/// What an `s3://` URL names, before connecting.
#[derive(Debug, Clone)]
pub struct S3BlobsBuilder {
    bucket: String,
    prefix: String,
    options: idem_aws::UrlOptions,
}

impl S3BlobsBuilder {
    /// Reads `s3://BUCKET[/PREFIX][?endpoint=URL][&region=R][&create=true]`:
    /// objects go under `PREFIX` in `BUCKET`; the region comes from
    /// `region=` or `AWS_REGION`, credentials from `AWS_ACCESS_KEY_ID` /
    /// `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`); `endpoint=` names
    /// an S3-compatible service (addressed path-style); `create=true`
    /// creates the bucket if it is missing.
    pub fn parse(url: &str) -> Result<Self, ConnectError> {
        let bad = |reason: String| ConnectError::InvalidUrl {
            url: url.to_owned(),
            reason,
        };
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| bad("the scheme must be s3://".to_owned()))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
        // S3's rule for bucket names.
        if !(3..=63).contains(&bucket.len())
            || !bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.".contains(&b))
        {
            return Err(bad(format!(
                "the bucket name {bucket:?} must be 3 to 63 characters of a-z 0-9 . -"
            )));
        }
        let mut prefix = prefix.to_owned();
        if !prefix.is_empty() && !prefix.ends_with('/') {
            prefix.push('/');
        }
        let options = idem_aws::UrlOptions::parse(query).map_err(bad)?;
        let builder = Self {
            bucket: bucket.to_owned(),
            prefix,
            options,
        };
        Ok(builder)
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The prefix objects go under (empty, or ending with `/`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Connects with a client made from the URL and the environment.
    pub async fn connect(self) -> Result<S3Blobs, ConnectError> {
        let timeouts = aws_sdk_s3::config::timeout::TimeoutConfig::builder()
            .connect_timeout(std::time::Duration::from_secs(5))
            .build();
        let sdk = self.options.sdk_config(timeouts)?;
        let config = ConfigBuilder::from(&sdk)
            .force_path_style(self.options.endpoint.is_some())
            .build();
        self.connect_with(Client::from_conf(config)).await
    }

    /// Connects with `client` (its own endpoint and credentials).
    pub async fn connect_with(self, client: Client) -> Result<S3Blobs, ConnectError> {
        if self.options.create {
            create_bucket(&client, &self.bucket).await?;
        }
        Ok(S3Blobs::new(client, self.bucket, self.prefix))
    }
}

async fn create_bucket(client: &Client, bucket: &str) -> Result<(), ConnectError> {
    match client.create_bucket().bucket(bucket).send().await {
        Ok(_) => Ok(()),
        Err(error)
            if error.as_service_error().is_some_and(|e| {
                e.is_bucket_already_owned_by_you() || e.is_bucket_already_exists()
            }) =>
        {
            Ok(())
        }
        Err(error) => Err(ConnectError::CreateBucket {
            bucket: bucket.to_owned(),
            reason: aws_sdk_s3::error::DisplayErrorContext(error).to_string(),
        }),
    }
}

impl S3Blobs {
    /// Connects to the bucket an `s3://` URL names (see
    /// [`S3BlobsBuilder::parse`]).
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        S3BlobsBuilder::parse(url)?.connect().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_the_bucket_the_prefix_and_the_options() {
        let b = S3BlobsBuilder::parse("s3://bodies/idem/replays?endpoint=http://h:9&create=true")
            .expect("parses");
        assert_eq!((b.bucket(), b.prefix()), ("bodies", "idem/replays/"));
        assert_eq!(b.options.endpoint.as_deref(), Some("http://h:9"));
        assert!(b.options.create);
        assert_eq!(
            S3BlobsBuilder::parse("s3://bodies")
                .expect("parses")
                .prefix(),
            ""
        );
        for bad in [
            "s3://",
            "s3://B",
            "s3://ab",
            "http://x",
            "s3://bodies?colour=red",
        ] {
            assert!(S3BlobsBuilder::parse(bad).is_err(), "{bad}");
        }
    }
}
