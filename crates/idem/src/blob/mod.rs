//! Blob stores: where an outcome too large to keep in its record is kept,
//! the record holding only a [`BlobRef`] (locator, SHA-256 digest and
//! length).
//!
//! The order is what makes it safe under crashes: a blob is written and
//! synced ([`BlobSink::finish`]) before the record that names it is
//! completed, so no completed record names a blob that was never whole.
//! Blobs that no record names (a run that died after writing one, a record
//! that expired, failed or was taken over) are found by [`sweep`]: each
//! blob knows its [`BlobOwner`], the record and fence that wrote it, and a
//! blob is kept only while that record is live at that fence.
//!
//! Reads are checked: [`Blobs::open`] hands out a [`BlobChunks`] that
//! counts and hashes what it reads and fails at the end if either differs
//! from the reference, so a replay never passes off other bytes as the
//! stored ones.
//!
//! | store | where | crate |
//! |---|---|---|
//! | [`DirBlobs`] | a directory (the embedded default) | `idem` |
//! | `PgBlobs` | a PostgreSQL table of its own | `idem-postgres` |

mod dir;
mod sweep;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use sha2::{Digest, Sha256};

use crate::key::{Key, RecordId, Scope};

pub use dir::DirBlobs;
pub use sweep::{spawn_blob_sweeper, sweep, Swept, UNOWNED_GRACE};

/// What a blob store's operations return.
pub type BlobFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, BlobError>> + Send + 'a>>;

/// Why a blob operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BlobError {
    /// The blob store could not be reached or refused the operation.
    #[error("blob store: {0}")]
    Unavailable(String),
    /// A blob read back is not the one its record names: other length or
    /// digest, or an unreadable header.
    #[error("blob {locator} is corrupt: {reason}")]
    Corrupt {
        /// The blob.
        locator: String,
        /// What differs.
        reason: String,
    },
    /// The blob a record names is not in the blob store.
    #[error("blob {locator} ({len} bytes, {digest}) is missing from the blob store")]
    Missing {
        /// The blob.
        locator: String,
        /// Its length, as its record names it.
        len: u64,
        /// Its digest, as its record names it (`sha256:` and hex).
        digest: String,
    },
    /// The blob grew past the most a blob may hold.
    #[error("blob over the {limit}-byte limit")]
    TooLarge {
        /// The limit, in bytes.
        limit: u64,
    },
}

impl BlobError {
    /// A store error from anything printable.
    pub fn unavailable(error: impl fmt::Display) -> Self {
        Self::Unavailable(error.to_string())
    }
}

/// The record (as stored: its key hashed if keys are) and fence that
/// wrote a blob: what [`sweep`] checks a blob against.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BlobOwner {
    /// The record's scope.
    pub scope: String,
    /// The record's key as stored.
    pub key: String,
    /// The fence of the claim that wrote it.
    pub fence: u64,
}

impl BlobOwner {
    /// The blob of `id`'s claim at `fence`.
    pub fn new(id: &RecordId, fence: u64) -> Self {
        Self {
            scope: id.scope().as_str().to_owned(),
            key: id.key().as_str().to_owned(),
            fence,
        }
    }

    /// The owning record's id, if it still parses.
    pub fn record_id(&self) -> Option<RecordId> {
        Some(RecordId::new(
            Scope::new(&self.scope).ok()?,
            Key::new(&self.key).ok()?,
        ))
    }

    /// A new locator for a blob of this owner: the record's digest (so a
    /// record's blobs sit together and reveal neither scope nor key), the
    /// fence, and a random part, so no two writes share one even when a
    /// record purged and claimed again starts its fences over.
    pub fn new_locator(&self) -> String {
        let mut hash = Sha256::new();
        hash.update(self.scope.as_bytes());
        hash.update([0]);
        hash.update(self.key.as_bytes());
        let record = hex::encode(&hash.finalize()[..16]);
        let nonce: u64 = rand::random();
        format!("{record}/{}-{nonce:016x}", self.fence)
    }
}

/// What a record keeps of a blob.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BlobRef {
    /// Where the blob is, in its store.
    pub locator: String,
    /// The SHA-256 digest of its bytes.
    pub digest: [u8; 32],
    /// Its length in bytes.
    pub len: u64,
}

impl BlobRef {
    /// The digest as `sha256:` and hex.
    pub fn digest_hex(&self) -> String {
        format!("sha256:{}", hex::encode(self.digest))
    }
}

/// A blob as listed, for [`sweep`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobEntry {
    /// What [`BlobStore::delete`] takes to remove it.
    pub locator: String,
    /// Who wrote it; `None` when its owner cannot be read.
    pub owner: Option<BlobOwner>,
    /// Whether it was never finished (a write under way, or one cut off).
    pub partial: bool,
    /// When it was last written.
    pub modified: SystemTime,
}

/// One page of [`BlobStore::list`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlobPage {
    /// The blobs, in locator order.
    pub entries: Vec<BlobEntry>,
    /// Where the next page starts; `None` after the last.
    pub next: Option<String>,
}

/// A blob being written.
pub trait BlobWriter: Send {
    /// Appends `chunk`: through [`Blobs`], chunks of
    /// [`BlobStore::chunk_bytes`] but the last, which may be shorter.
    fn write(&mut self, chunk: Bytes) -> BlobFuture<'_, ()>;

    /// Makes the blob durable and visible under its locator: only after
    /// this returns may a record name it.
    fn finish(self: Box<Self>) -> BlobFuture<'static, ()>;
}

/// A blob being read, chunk by chunk.
pub trait BlobReader: Send {
    /// The next chunk; `None` at the end.
    fn next(&mut self) -> BlobFuture<'_, Option<Bytes>>;
}

/// Where blobs are kept: written whole before they are named, read as a
/// stream, listed and deleted by [`sweep`].
pub trait BlobStore: Send + Sync + fmt::Debug + 'static {
    /// How many bytes the store takes at a time: [`Blobs`] gathers what
    /// it is given into chunks of this size before each
    /// [`BlobWriter::write`] (a file write, a row, an upload part).
    fn chunk_bytes(&self) -> usize {
        256 * 1024
    }

    /// Starts writing a blob at `locator` for `owner`. Nothing is visible
    /// at `locator` until [`BlobWriter::finish`].
    fn create<'a>(
        &'a self,
        locator: &'a str,
        owner: &'a BlobOwner,
    ) -> BlobFuture<'a, Box<dyn BlobWriter>>;

    /// Opens the finished blob at `locator`; `None` if there is none.
    fn open<'a>(&'a self, locator: &'a str) -> BlobFuture<'a, Option<Box<dyn BlobReader>>>;

    /// Removes the blob (finished or partial) at `locator`; `false` if
    /// there was none.
    fn delete<'a>(&'a self, locator: &'a str) -> BlobFuture<'a, bool>;

    /// Up to `limit` blobs after `after`, finished and partial.
    fn list<'a>(&'a self, after: Option<&'a str>, limit: usize) -> BlobFuture<'a, BlobPage>;
}

/// A blob store shared by the parts that write, replay and sweep blobs,
/// with the digest and length checks around it.
#[derive(Clone)]
pub struct Blobs {
    store: Arc<dyn BlobStore>,
    max_bytes: u64,
}

impl fmt::Debug for Blobs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blobs")
            .field("store", &self.store)
            .field("max_bytes", &self.max_bytes)
            .finish()
    }
}

/// The most a blob may hold unless set: 4 GiB.
pub const DEFAULT_MAX_BLOB_BYTES: u64 = 4 << 30;

impl Blobs {
    /// Shares `store`, with blobs of up to [`DEFAULT_MAX_BLOB_BYTES`].
    pub fn new(store: impl BlobStore) -> Self {
        Self::from_arc(Arc::new(store))
    }

    /// Shares a store already behind an `Arc`.
    pub fn from_arc(store: Arc<dyn BlobStore>) -> Self {
        Self {
            store,
            max_bytes: DEFAULT_MAX_BLOB_BYTES,
        }
    }

    /// The most one blob may hold; a longer one fails with
    /// [`BlobError::TooLarge`] while it is written.
    #[must_use]
    pub fn max_bytes(mut self, max: u64) -> Self {
        self.max_bytes = max;
        self
    }

    /// The store underneath.
    pub fn store(&self) -> &dyn BlobStore {
        &*self.store
    }

    /// Starts a blob for `owner` at a new locator.
    pub async fn create(&self, owner: &BlobOwner) -> Result<BlobSink, BlobError> {
        let locator = owner.new_locator();
        let writer = self.store.create(&locator, owner).await?;
        Ok(BlobSink {
            writer,
            locator,
            hash: Sha256::new(),
            len: 0,
            max: self.max_bytes,
            buffer: BytesMut::new(),
            chunk: self.store.chunk_bytes().max(1),
        })
    }

    /// Opens the blob `blob` names, checked against it;
    /// [`BlobError::Missing`] if it is not there.
    pub async fn open(&self, blob: &BlobRef) -> Result<BlobChunks, BlobError> {
        let reader = self
            .store
            .open(&blob.locator)
            .await?
            .ok_or_else(|| BlobError::Missing {
                locator: blob.locator.clone(),
                len: blob.len,
                digest: blob.digest_hex(),
            })?;
        Ok(BlobChunks {
            reader,
            expected: blob.clone(),
            hash: Sha256::new(),
            read: 0,
        })
    }

    /// Reads the blob `blob` names whole, checked: for tools, not replays.
    pub async fn read_all(&self, blob: &BlobRef) -> Result<Vec<u8>, BlobError> {
        let mut chunks = self.open(blob).await?;
        let mut all = Vec::new();
        while let Some(chunk) = chunks.next().await? {
            all.extend_from_slice(&chunk);
        }
        Ok(all)
    }
}

/// A blob being written through [`Blobs`]: counted, hashed, and handed
/// to its store a chunk at a time.
pub struct BlobSink {
    writer: Box<dyn BlobWriter>,
    locator: String,
    hash: Sha256,
    len: u64,
    max: u64,
    buffer: BytesMut,
    chunk: usize,
}

impl fmt::Debug for BlobSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlobSink")
            .field("locator", &self.locator)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl BlobSink {
    /// Appends `chunk`.
    pub async fn write(&mut self, chunk: Bytes) -> Result<(), BlobError> {
        self.len += chunk.len() as u64;
        if self.len > self.max {
            return Err(BlobError::TooLarge { limit: self.max });
        }
        self.hash.update(&chunk);
        self.buffer.extend_from_slice(&chunk);
        while self.buffer.len() >= self.chunk {
            let full = self.buffer.split_to(self.chunk).freeze();
            self.writer.write(full).await?;
        }
        Ok(())
    }

    /// Makes the blob durable; what a record keeps of it.
    pub async fn finish(mut self) -> Result<BlobRef, BlobError> {
        if !self.buffer.is_empty() {
            let last = std::mem::take(&mut self.buffer).freeze();
            self.writer.write(last).await?;
        }
        self.writer.finish().await?;
        Ok(BlobRef {
            locator: self.locator,
            digest: self.hash.finalize().into(),
            len: self.len,
        })
    }
}

/// A blob being read through [`Blobs`]: the last call fails unless its
/// length and digest are the ones its record names.
pub struct BlobChunks {
    reader: Box<dyn BlobReader>,
    expected: BlobRef,
    hash: Sha256,
    read: u64,
}

impl fmt::Debug for BlobChunks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlobChunks")
            .field("expected", &self.expected)
            .field("read", &self.read)
            .finish_non_exhaustive()
    }
}

impl BlobChunks {
    /// The next chunk; `None` at the end, once length and digest matched.
    pub async fn next(&mut self) -> Result<Option<Bytes>, BlobError> {
        let corrupt = |reason: String| BlobError::Corrupt {
            locator: self.expected.locator.clone(),
            reason,
        };
        match self.reader.next().await? {
            Some(chunk) => {
                self.read += chunk.len() as u64;
                if self.read > self.expected.len {
                    return Err(corrupt(format!(
                        "longer than the {} bytes its record names",
                        self.expected.len
                    )));
                }
                self.hash.update(&chunk);
                Ok(Some(chunk))
            }
            None if self.read != self.expected.len => Err(corrupt(format!(
                "{} bytes where its record names {}",
                self.read, self.expected.len
            ))),
            None => {
                let digest: [u8; 32] = std::mem::take(&mut self.hash).finalize().into();
                if digest == self.expected.digest {
                    Ok(None)
                } else {
                    Err(corrupt(format!(
                        "its digest is sha256:{}, its record names {}",
                        hex::encode(digest),
                        self.expected.digest_hex()
                    )))
                }
            }
        }
    }
}
