//! Blob store URLs: where bodies kept by reference go.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use idem::blob::{Blobs, DirBlobs};
use idem_postgres::PgStore;

use super::{AnyStore, OpenError};

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
    /// Opens a blob store that needs no connection (a directory) here,
    /// without a runtime; `None` for those that connect.
    pub fn open_local(&self) -> Option<Result<Blobs, OpenError>> {
        match self {
            Self::Dir(path) => Some(open_dir(path)),
            Self::Postgres(_) | Self::S3(_) => None,
        }
    }

    /// Opens the blob store (connecting, for PostgreSQL).
    pub async fn open(&self) -> Result<Blobs, OpenError> {
        match self {
            Self::Dir(path) => open_dir(path),
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

fn open_dir(path: &std::path::Path) -> Result<Blobs, OpenError> {
    let blobs = DirBlobs::open(path).map_err(|e| OpenError::Connect {
        store: "directory blob",
        source: e.into(),
    })?;
    Ok(Blobs::new(blobs))
}

impl AnyStore {
    /// The blob store that goes with this store when none is named: a
    /// directory beside the embedded store's file (`idem.db.blobs`), or
    /// tables of their own on the PostgreSQL store's pool; `None` for the
    /// others. Opened when `wanted` (a route keeps bodies by reference),
    /// or, for the directory, when it exists already (records kept by
    /// reference before a policy changed still replay).
    pub fn blobs_beside(&self, wanted: bool) -> Result<Option<Blobs>, OpenError> {
        match self {
            AnyStore::Sqlite(sqlite) => {
                let mut dir = sqlite.path().as_os_str().to_owned();
                dir.push(".blobs");
                let dir = PathBuf::from(dir);
                if wanted || dir.is_dir() {
                    open_dir(&dir).map(Some)
                } else {
                    Ok(None)
                }
            }
            AnyStore::Postgres(pg) if wanted => Ok(Some(Blobs::new(pg.blobs()))),
            _ => Ok(None),
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
    fn urls_parse() {
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
    }

    #[test]
    fn the_embedded_store_gets_a_directory_beside_it_when_wanted_or_there() {
        let dir = tempfile::tempdir().expect("dir");
        let store = AnyStore::Sqlite(
            idem_sqlite::SqliteStore::open(dir.path().join("idem.db")).expect("store"),
        );
        assert!(store.blobs_beside(false).expect("opens").is_none());
        assert!(store.blobs_beside(true).expect("opens").is_some());
        assert!(dir.path().join("idem.db.blobs").is_dir());
        assert!(
            store.blobs_beside(false).expect("opens").is_some(),
            "there now"
        );
        assert!(AnyStore::Memory(idem::MemoryStore::new())
            .blobs_beside(true)
            .expect("opens")
            .is_none());
    }
}
