//! # idem-s3: an S3 blob store for idem
//!
//! [`S3Blobs`] keeps response bodies kept by reference
//! (`ReplayPolicy::Reference` in `idem-http`, `--keep PREFIX=reference`
//! in the gateway) as objects in a bucket of Amazon S3 or any
//! S3-compatible service (MinIO, Ceph, moto), under a prefix:
//!
//! ```no_run
//! # async fn demo() -> Result<(), idem_s3::ConnectError> {
//! let blobs = idem_s3::S3Blobs::connect(
//!     "s3://my-bucket/idem/?endpoint=http://127.0.0.1:9000&region=us-east-1",
//! )
//! .await?;
//! let blobs = idem::blob::Blobs::new(blobs);
//! # Ok(()) }
//! ```
//!
//! An object exists only once it is whole: a body up to 8 MiB is one
//! `PutObject`, a larger one a multipart upload completed last; S3 answers
//! either only once the object is durable. Each object carries its owner
//! (the record and fence that wrote it) in its metadata, for the sweep.
//! A multipart upload cut off by a crash is not an object and is not
//! listed: give the bucket a lifecycle rule that aborts incomplete
//! multipart uploads after a day (`AbortIncompleteMultipartUpload`), as
//! for any writer of large objects.

mod blobs;
mod url;

pub use blobs::S3Blobs;
pub use url::{ConnectError, S3BlobsBuilder};
