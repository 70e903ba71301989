//! Why a store could not be set up, and how DynamoDB's errors become
//! [`StoreError`]s.

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use idem::StoreError;

use crate::conn::ConfigError;

/// Why the store could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL cannot be used.
    #[error("invalid DynamoDB URL {url}: {reason}")]
    InvalidUrl {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The client could not be built (a missing credential, a bad
    /// endpoint).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The table could not be created.
    #[error("cannot create the DynamoDB table {table}")]
    CreateTable {
        /// The table.
        table: String,
        /// What DynamoDB answered.
        #[source]
        source: StoreError,
    },
}

/// An item would pass DynamoDB's 400 KB limit even compressed. Nothing
/// was written. Returned inside [`StoreError::Backend`].
#[derive(Debug, thiserror::Error)]
#[error(
    "record {id} would be {size} bytes as a DynamoDB item (response compressed where that helps), \
     over DynamoDB's limit of {limit} bytes per item"
)]
pub struct ItemTooLarge {
    /// The record, as `scope/key`.
    pub id: String,
    /// The item's size, attribute names included.
    pub size: usize,
    /// DynamoDB's limit.
    pub limit: usize,
}

/// DynamoDB error codes after which the request was not applied and a
/// later try can succeed: throttling, the service failing, and a
/// conflict with a transaction on the same item (docs/design.md §5.5).
const TRANSIENT_CODES: &[&str] = &[
    "ThrottlingException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "InternalServerError",
    "ServiceUnavailable",
    "TransactionConflictException",
    "ReplicatedWriteConflictException",
];

/// Whether a DynamoDB error code is transient ([`TRANSIENT_CODES`]).
fn transient_code(code: &str) -> bool {
    TRANSIENT_CODES.contains(&code)
}

/// Maps an SDK error: the service or the network failing (or throttling
/// past the SDK's own retries) is `Unavailable`, so the executor fails
/// closed; anything else (a missing table, a request DynamoDB refused) is
/// `Backend`, with DynamoDB's own message.
pub(crate) fn map_err<E>(e: SdkError<E, HttpResponse>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let context = |e: &SdkError<E, HttpResponse>| -> idem::BoxError {
        format!("{}", aws_sdk_dynamodb::error::DisplayErrorContext(e)).into()
    };
    match &e {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            StoreError::Unavailable(context(&e))
        }
        SdkError::ServiceError(ctx) => {
            let code = ctx.err().code().unwrap_or("");
            let message = format!(
                "DynamoDB refused the request: {}: {}",
                if code.is_empty() {
                    "unknown error"
                } else {
                    code
                },
                ctx.err().message().unwrap_or("no message")
            );
            if matches!(
                code,
                "TransactionConflictException" | "ReplicatedWriteConflictException"
            ) {
                // Another write on the item: the key is busy, not the store
                // down, so never a reason to fail open.
                StoreError::contended(message)
            } else if transient_code(code) || ctx.raw().status().is_server_error() {
                StoreError::Unavailable(message.into())
            } else {
                StoreError::Backend(message.into())
            }
        }
        _ => StoreError::Backend(context(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::transient_code;

    #[test]
    fn throttling_service_failures_and_transaction_conflicts_are_transient() {
        for code in [
            "ThrottlingException",
            "ProvisionedThroughputExceededException",
            "RequestLimitExceeded",
            "InternalServerError",
            "ServiceUnavailable",
            "TransactionConflictException",
            "ReplicatedWriteConflictException",
        ] {
            assert!(transient_code(code), "{code}");
        }
        for code in [
            "ValidationException",
            "ResourceNotFoundException",
            "ConditionalCheckFailedException",
            "ItemCollectionSizeLimitExceededException",
            "AccessDeniedException",
        ] {
            assert!(!transient_code(code), "{code}");
        }
    }
}
