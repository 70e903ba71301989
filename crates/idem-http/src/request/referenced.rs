//! Bodies kept by reference: written to a blob as they stream from the
//! inner service, before the record names them, and answered from it,
//! streamed and checked.

use bytes::Bytes;
use http::{HeaderMap, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use idem::blob::{BlobError, BlobOwner, BlobRef};
use idem::{BoxError, RecordId, Store};

use crate::body::IdemBody;
use crate::rejection::Rejection;

use super::answer::append_trailers;
use super::{Settings, Unstored};

impl<S: Store> Settings<S> {
    /// Writes a body past its first `prefix` bytes to a new blob of
    /// `id`'s claim at `fence`; the blob and the body's trailers.
    pub(super) async fn to_blob<B>(
        &self,
        id: &RecordId,
        fence: u64,
        status: http::StatusCode,
        prefix: Bytes,
        mut rest: B,
    ) -> Result<(BlobRef, Option<HeaderMap>), Unstored>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        let blobs = self.blobs.as_ref().expect("reference needs blobs");
        let unkept = |error: BlobError| match error {
            BlobError::TooLarge { limit } => Unstored::TooLarge {
                limit: usize::try_from(limit).unwrap_or(usize::MAX),
            },
            error => Unstored::Unkept(error.to_string()),
        };
        let owner = BlobOwner::new(&self.idem.stored_id(id), fence);
        let mut sink = blobs.create(&owner).await.map_err(unkept)?;
        sink.write(prefix).await.map_err(unkept)?;
        let mut trailers: Option<HeaderMap> = None;
        // The body's own error type need not be `Send`: boxed at once.
        while let Some(frame) = next_frame(&mut rest).await {
            let frame = frame.map_err(|error| Unstored::BrokeOff {
                status,
                error: error.to_string(),
            })?;
            match frame.into_data() {
                Ok(data) => sink.write(data).await.map_err(unkept)?,
                Err(frame) => {
                    if let Ok(more) = frame.into_trailers() {
                        append_trailers(trailers.get_or_insert_with(HeaderMap::new), more);
                    }
                }
            }
        }
        Ok((sink.finish().await.map_err(unkept)?, trailers))
    }

    /// A stored response whose body is in a blob, streamed from it.
    pub(super) async fn streamed_from_blob(
        &self,
        head: Response<Bytes>,
        blob: &BlobRef,
        trailers: Option<HeaderMap>,
        executed: bool,
    ) -> Response<IdemBody> {
        let blobs = self.blobs.as_ref();
        let unreadable = |reason: &'static str| {
            metrics::counter!(idem::metrics::BLOBS_UNREADABLE, "reason" => reason).increment(1);
        };
        let rejection = match blobs {
            None => Rejection::StoredUnreadable {
                reason: format!(
                    "its body is kept in blob {}, and no blob store is configured here",
                    blob.locator
                ),
            },
            Some(blobs) => match blobs.open(blob).await {
                Ok(chunks) => {
                    return head.map(|_| IdemBody::from_blob(chunks, blob.len, trailers));
                }
                Err(error @ BlobError::Missing { .. }) => {
                    unreadable("missing");
                    tracing::error!(%error, "a stored response's body is missing");
                    Rejection::StoredUnreadable {
                        reason: format!("its body: {error}"),
                    }
                }
                Err(error @ BlobError::Corrupt { .. }) => {
                    unreadable("corrupt");
                    Rejection::StoredUnreadable {
                        reason: error.to_string(),
                    }
                }
                Err(error) => {
                    unreadable("unavailable");
                    Rejection::StoreUnavailable {
                        error: error.to_string(),
                        executed,
                    }
                }
            },
        };
        rejection.into_response().map(IdemBody::full)
    }
}

/// The next frame of `body`, its error boxed.
async fn next_frame<B>(body: &mut B) -> Option<Result<Frame<Bytes>, BoxError>>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    body.frame().await.map(|frame| frame.map_err(Into::into))
}
