//! # idem-lambda: exactly-once effects for AWS Lambda functions
//!
//! Lambda delivers every event at least once: an SQS message comes back
//! after a visibility timeout, a Kinesis or DynamoDB stream batch is
//! retried whole after one bad record, a client retries an API call whose
//! answer timed out. This crate puts idem's executor in front of the
//! function's work, on the [`lambda_runtime`] crate:
//!
//! - [`BatchHandler`] for SQS, Kinesis and DynamoDB Streams: each record
//!   claimed and run through [`idem_consumer::Consumer`], and only the
//!   records to deliver again reported back ([`BatchResponse`], Lambda's
//!   partial batch response); a duplicate, in the same batch or a later
//!   one, replays its stored outcome instead of running again;
//! - [`run_http`] for API Gateway, an Application Load Balancer or a
//!   function URL, where `idem_http::IdempotencyLayer` answers as it does
//!   on a server;
//! - the invocation's remaining time bounds every batch run: one that cannot
//!   finish is stopped [`margin`](BatchHandler::margin) before the
//!   deadline and its claim released ([`Interrupted::OutOfTime`]), so its
//!   redelivery runs instead of waiting out a lease Lambda's kill would
//!   have left;
//! - [`store_from_env`]: DynamoDB by default, or any store URL idem reads.
//!
//! ```no_run
//! use idem::{Idempotency, Scope, Terminal};
//! use idem_consumer::{Consumer, KeyExtractor};
//! use idem_lambda::{store_from_env, BatchHandler, SqsEvent};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_runtime::Error> {
//!     let idem = Idempotency::builder(store_from_env().await?).build()?;
//!     let consumer = Consumer::builder(idem, Scope::new("orders")?)
//!         .keys(KeyExtractor::json_pointer("/order_id"))
//!         .build();
//!     BatchHandler::new(consumer, |job| async move {
//!         let order: serde_json::Value = job.json()?;
//!         // charge the order, fenced with job.ctx().fence()
//!         Ok::<_, Terminal>(order["order_id"].clone())
//!     })
//!     .run::<SqsEvent>()
//!     .await
//! }
//! ```
//!
//! The event source mapping needs `ReportBatchItemFailures` in its
//! function response types, or Lambda reads the answer as "all done".
//! A record that fails for good (a terminal failure, no usable key) is
//! reported too, and its stored failure replayed on every redelivery: the
//! queue's redrive policy, or the stream mapping's retry limit and
//! on-failure destination, is where it ends up.

mod batch;
mod deadline;
mod http;
mod record;
mod store;

pub use aws_lambda_events::event::dynamodb::Event as DynamoDbEvent;
pub use aws_lambda_events::event::kinesis::KinesisEvent;
pub use aws_lambda_events::event::sqs::SqsEvent;
pub use batch::{BatchError, BatchEvent, BatchHandler, BatchResponse, ItemFailure};
pub use deadline::{Interrupted, DEFAULT_MARGIN};
pub use http::run_http;
pub use record::{Record, Source};
pub use store::{store_from_env, EnvStoreError, DEFAULT_STORE, STORE_ENV};
