//! [`S3Blobs`]: the [`BlobStore`] over a bucket.

use std::time::SystemTime;

use aws_sdk_s3::operation::head_object::HeadObjectOutput;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use aws_sdk_s3::Client;
use bytes::Bytes;
use idem::blob::{
    BlobEntry, BlobError, BlobFuture, BlobOwner, BlobPage, BlobReader, BlobStore, BlobWriter,
};

/// The metadata field an object's owner is kept in (as hex of its JSON,
/// so any scope survives an HTTP header).
const OWNER: &str = "idem-owner";
/// The size of a multipart upload's parts (S3's least is 5 MiB); a blob
/// no larger is one `PutObject`.
const PART: usize = 8 << 20;

/// Blobs as objects under a prefix of a bucket. Cheap to clone.
#[derive(Debug, Clone)]
pub struct S3Blobs {
    client: Client,
    bucket: String,
    prefix: String,
}

fn unavailable(error: impl std::error::Error) -> BlobError {
    BlobError::unavailable(aws_sdk_s3::error::DisplayErrorContext(error))
}

impl S3Blobs {
    /// Blobs under `prefix` (empty, or ending with `/`) in `bucket`.
    pub fn new(client: Client, bucket: impl Into<String>, prefix: impl Into<String>) -> Self {
        Self {
            client,
            bucket: bucket.into(),
            prefix: prefix.into(),
        }
    }

    fn key(&self, locator: &str) -> String {
        format!("{}{locator}", self.prefix)
    }

    /// The object at `key`'s head; `None` if there is none.
    async fn head(&self, key: &str) -> Result<Option<HeadObjectOutput>, BlobError> {
        match self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(head) => Ok(Some(head)),
            Err(error) if error.as_service_error().is_some_and(|e| e.is_not_found()) => Ok(None),
            Err(error) => Err(unavailable(error)),
        }
    }

    /// The owner kept in an object's metadata, if it reads.
    async fn owner(&self, key: &str) -> Result<Option<BlobOwner>, BlobError> {
        Ok(self
            .head(key)
            .await?
            .as_ref()
            .and_then(|head| head.metadata()?.get(OWNER))
            .and_then(|hex| hex::decode(hex).ok())
            .and_then(|json| serde_json::from_slice(&json).ok()))
    }

    /// The length of the object at `key`; `None` if there is none.
    async fn len_of(&self, key: &str) -> Result<Option<u64>, BlobError> {
        Ok(self.head(key).await?.map(|head| {
            head.content_length()
                .and_then(|len| u64::try_from(len).ok())
                .unwrap_or(0)
        }))
    }
}

struct S3Writer {
    blobs: S3Blobs,
    key: String,
    owner: String,
    /// A chunk shorter than a part: the blob's last, held for `finish`
    /// (one `PutObject` when it is also the first).
    last: Option<Bytes>,
    /// How many bytes were written in all.
    written: u64,
    /// The multipart upload, once the blob outgrew one part.
    upload: Option<Upload>,
}

struct Upload {
    id: String,
    parts: Vec<CompletedPart>,
}

impl S3Writer {
    /// Sends `body` as the next part, starting the upload if needed.
    async fn send_part(&mut self, body: Bytes) -> Result<(), BlobError> {
        let s3 = &self.blobs;
        if self.upload.is_none() {
            let started = s3
                .client
                .create_multipart_upload()
                .bucket(&s3.bucket)
                .key(&self.key)
                .metadata(OWNER, &self.owner)
                .send()
                .await
                .map_err(unavailable)?;
            let id = started
                .upload_id()
                .ok_or_else(|| BlobError::unavailable("S3 started an upload without an id"))?;
            self.upload = Some(Upload {
                id: id.to_owned(),
                parts: Vec::new(),
            });
        }
        let upload = self.upload.as_mut().expect("started");
        let number = i32::try_from(upload.parts.len() + 1).map_err(BlobError::unavailable)?;
        let sent = s3
            .client
            .upload_part()
            .bucket(&s3.bucket)
            .key(&self.key)
            .upload_id(&upload.id)
            .part_number(number)
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(unavailable)?;
        upload.parts.push(
            CompletedPart::builder()
                .set_e_tag(sent.e_tag().map(str::to_owned))
                .part_number(number)
                .build(),
        );
        Ok(())
    }
}

impl Drop for S3Writer {
    fn drop(&mut self) {
        // Cut off before it was finished: abort the upload, best effort
        // (the bucket's lifecycle rule catches what this misses).
        let (Some(upload), Ok(runtime)) =
            (self.upload.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let (client, bucket, key) = (
            self.blobs.client.clone(),
            self.blobs.bucket.clone(),
            self.key.clone(),
        );
        runtime.spawn(async move {
            let _ = client
                .abort_multipart_upload()
                .bucket(bucket)
                .key(key)
                .upload_id(upload.id)
                .send()
                .await;
        });
    }
}

impl BlobWriter for S3Writer {
    fn write(&mut self, chunk: Bytes) -> BlobFuture<'_, ()> {
        Box::pin(async move {
            self.written += chunk.len() as u64;
            // Only the last chunk is shorter than a part.
            if chunk.len() < PART {
                self.last = Some(chunk);
                return Ok(());
            }
            self.send_part(chunk).await
        })
    }

    fn finish(mut self: Box<Self>) -> BlobFuture<'static, ()> {
        Box::pin(async move {
            let last = self.last.take().unwrap_or_default();
            if self.upload.is_none() {
                let body = last;
                let s3 = &self.blobs;
                s3.client
                    .put_object()
                    .bucket(&s3.bucket)
                    .key(&self.key)
                    .metadata(OWNER, &self.owner)
                    .body(ByteStream::from(body))
                    .send()
                    .await
                    .map_err(unavailable)?;
                return Ok(());
            }
            if !last.is_empty() {
                self.send_part(last).await?;
            }
            let upload = self.upload.take().expect("started");
            let s3 = &self.blobs;
            let completed = s3
                .client
                .complete_multipart_upload()
                .bucket(&s3.bucket)
                .key(&self.key)
                .upload_id(&upload.id)
                .multipart_upload(
                    CompletedMultipartUpload::builder()
                        .set_parts(Some(upload.parts))
                        .build(),
                )
                .send()
                .await;
            match completed {
                Ok(_) => Ok(()),
                // The answer was lost or did not parse (some S3-compatible
                // services name its root differently): the object is there
                // whole or the write failed, and its length tells which.
                Err(error) => match s3.len_of(&self.key).await? {
                    Some(len) if len == self.written => Ok(()),
                    _ => Err(unavailable(error)),
                },
            }
        })
    }
}

struct S3Reader {
    body: ByteStream,
}

impl BlobReader for S3Reader {
    fn next(&mut self) -> BlobFuture<'_, Option<Bytes>> {
        Box::pin(async move { self.body.try_next().await.map_err(unavailable) })
    }
}

impl BlobStore for S3Blobs {
    fn chunk_bytes(&self) -> usize {
        PART
    }

    fn create<'a>(
        &'a self,
        locator: &'a str,
        owner: &'a BlobOwner,
    ) -> BlobFuture<'a, Box<dyn BlobWriter>> {
        Box::pin(async move {
            let owner = serde_json::to_vec(owner).map_err(BlobError::unavailable)?;
            Ok(Box::new(S3Writer {
                blobs: self.clone(),
                key: self.key(locator),
                owner: hex::encode(owner),
                last: None,
                written: 0,
                upload: None,
            }) as Box<dyn BlobWriter>)
        })
    }

    fn open<'a>(&'a self, locator: &'a str) -> BlobFuture<'a, Option<Box<dyn BlobReader>>> {
        Box::pin(async move {
            match self
                .client
                .get_object()
                .bucket(&self.bucket)
                .key(self.key(locator))
                .send()
                .await
            {
                Ok(object) => Ok(Some(
                    Box::new(S3Reader { body: object.body }) as Box<dyn BlobReader>
                )),
                Err(error) if error.as_service_error().is_some_and(|e| e.is_no_such_key()) => {
                    Ok(None)
                }
                Err(error) => Err(unavailable(error)),
            }
        })
    }

    fn delete<'a>(&'a self, locator: &'a str) -> BlobFuture<'a, bool> {
        Box::pin(async move {
            let key = self.key(locator);
            if self.len_of(&key).await?.is_none() {
                return Ok(false);
            }
            self.client
                .delete_object()
                .bucket(&self.bucket)
                .key(&key)
                .send()
                .await
                .map_err(unavailable)?;
            Ok(true)
        })
    }

    fn list<'a>(&'a self, after: Option<&'a str>, limit: usize) -> BlobFuture<'a, BlobPage> {
        Box::pin(async move {
            let limit = limit.clamp(1, 1000);
            let mut request = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(&self.prefix)
                .max_keys(i32::try_from(limit).unwrap_or(1000));
            if let Some(after) = after {
                request = request.start_after(self.key(after));
            }
            let listed = request.send().await.map_err(unavailable)?;
            let mut entries = Vec::new();
            for object in listed.contents() {
                let Some(key) = object.key() else { continue };
                let locator = key.strip_prefix(&self.prefix).unwrap_or(key).to_owned();
                let modified = object
                    .last_modified()
                    .and_then(|t| SystemTime::try_from(*t).ok())
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                entries.push(BlobEntry {
                    owner: self.owner(key).await?,
                    locator,
                    partial: false,
                    modified,
                });
            }
            let next = (listed.is_truncated() == Some(true) || entries.len() == limit)
                .then(|| entries.last().map(|e| e.locator.clone()))
                .flatten();
            Ok(BlobPage { entries, next })
        })
    }
}
