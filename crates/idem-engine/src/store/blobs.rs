//! Blob store URLs: where bodies kept by reference go.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use idem::blob::{Blobs, DirBlobs};
use idem_postgres::PgStore;

use super::{OpenError, StoreUrl};

/// Where blobs live, as given on the command line (`--blobs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobUrl {
    /// `dir:PATH`: files under a directory (created if missing).
    Dir(PathBuf),
    /// `postgres://…`, `postgresql://…`: tables of their own in
    /// PostgreSQL (created on first use).
    Postgres(String),
    /// `s3://BUCKET[/PREFIX][?endpoint=URL][&region=R][&create=true]`:
    /// objects in S3 or an S3-compatible service (the `s3` feature; the URL
    /// as `idem_s3::S3Blobs::connect` reads it).
    S3(String),
}

/// A blob store URL that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("blob store URL {0:?}: use dir:PATH, postgres://… or s3://BUCKET/PREFIX")]
pub struct BlobUrlError(String);

impl FromStr for BlobUrl {
    type Err = BlobUrlError;

    fn from_str(url: &str) -> Result<Self, BlobUrlError> {
        if let Some(path) = url.strip_prefix("dir:").filter(|p| !p.is_empty()) {
            return Ok(Self::Dir(PathBuf::from(path)));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Self::Postgres(url.to_owned()));
        }
        if url.starts_with("s3://") {
            return Ok(Self::S3(url.to_owned()));
        }
        Err(BlobUrlError(url.to_owned()))
    }
}

impl fmt::Display for BlobUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dir(path) => write!(f, "dir:{}", path.display()),
            Self::Postgres(url) => f.write_str(&idem_postgres::redact_url(url)),
            Self::S3(url) => f.write_str(url),
        }
    }
}

impl BlobUrl {
    /// The blob store that goes with `store` when none is named: a
    /// directory beside the embedded store's file (`idem.db.blobs`), the
    /// same PostgreSQL database; `None` for the others.
    pub fn beside(store: &StoreUrl) -> Option<Self> {
        match store {
            StoreUrl::Sqlite(path) => {
                let mut dir = path.clone().into_os_string();
                dir.push(".blobs");
                Some(Self::Dir(dir.into()))
            }
            StoreUrl::Postgres(url) => Some(Self::Postgres(url.clone())),
            _ => None,
        }
    }

    /// Opens the blob store (connecting, for PostgreSQL).
    pub async fn open(&self) -> Result<Blobs, OpenError> {
        match self {
            Self::Dir(path) => Ok(Blobs::new(DirBlobs::open(path).map_err(|e| {
                OpenError::Connect {
                    store: "directory blob",
                    source: e.into(),
                }
            })?)),
            Self::Postgres(url) => {
                let store = PgStore::connect(url)
                    .await
                    .map_err(|e| OpenError::Connect {
                        store: "PostgreSQL blob",
                        source: e.into(),
                    })?;
                Ok(Blobs::new(store.blobs()))
            }
            Self::S3(url) => open_s3(url).await,
        }
    }
}

#[cfg(feature = "s3")]
async fn open_s3(url: &str) -> Result<Blobs, OpenError> {
    let blobs = idem_s3::S3Blobs::connect(url)
        .await
        .map_err(|e| OpenError::Connect {
            store: "S3 blob",
            source: e.into(),
        })?;
    Ok(Blobs::new(blobs))
}

#[cfg(not(feature = "s3"))]
async fn open_s3(url: &str) -> Result<Blobs, OpenError> {
    Err(OpenError::Connect {
        store: "S3 blob",
        source: format!(
            "{url}: the S3 blob store is not in this build (build with the `s3` feature)"
        )
        .into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_the_embedded_store_gets_a_directory_beside_it() {
        assert_eq!(
            "dir:/var/idem/blobs".parse(),
            Ok(BlobUrl::Dir("/var/idem/blobs".into()))
        );
        assert!(matches!(
            "postgres://localhost/test".parse(),
            Ok(BlobUrl::Postgres(_))
        ));
        assert!(matches!("s3://bucket/p".parse(), Ok(BlobUrl::S3(_))));
        assert!("gs://bucket".parse::<BlobUrl>().is_err());
        assert!("dir:".parse::<BlobUrl>().is_err());
        assert_eq!(
            BlobUrl::beside(&StoreUrl::Sqlite("data/idem.db".into())),
            Some(BlobUrl::Dir("data/idem.db.blobs".into()))
        );
        assert_eq!(BlobUrl::beside(&StoreUrl::Memory), None);
    }
}
