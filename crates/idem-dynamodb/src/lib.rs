//! The DynamoDB store for idem.
//!
//! Every transition is one conditional write (`PutItem` or `UpdateItem`
//! with a condition expression), and a write whose condition fails gets
//! the item back in the same answer (`ReturnValuesOnConditionCheckFailure
//! = ALL_OLD`), so no extra read is needed to learn what is there. The
//! rules themselves are [`idem::machine`]'s, shared with every other store.
//!
//! * **Claims.** A claim first tries to create the item, on the condition
//!   that it is absent *or expired* (`attribute_not_exists(pk) OR ex <=
//!   :now`): an expired record is claimable whether or not DynamoDB's TTL
//!   sweeper (which may lag by up to 48 hours) has deleted it. If the
//!   condition fails, the returned item is decided on by
//!   [`idem::machine::decide_claim`]: a replay, a conflict or a mismatch is
//!   answered at once from it; a takeover or a release is written on the
//!   condition that the item's version (`v`, raised by every write) is
//!   still the one decided on.
//! * **Holder writes** (complete, fail, release, heartbeat, step journal)
//!   are one `UpdateItem` on the condition that the record is live, in
//!   progress and carries the lease's token. A write whose condition fails
//!   is `LeaseLost`, unless the returned item shows that the write had
//!   already happened: the SDK retries a request whose answer was lost, and
//!   the retry must not report a lost lease for a write that landed.
//! * **Time.** DynamoDB has no clock that a condition can read, so `:now`
//!   comes from the store's [`Clock`](idem::Clock) ([`SystemClock`](idem::SystemClock) by default, so
//!   clients' clocks must agree to well within a lease; NTP does that).
//!   Tests inject a [`ManualClock`](idem::ManualClock). What clocks that
//!   disagree by more than that do: a client ahead sees a live lease as
//!   run out and takes the record over while its holder still works, and a
//!   client behind writes leases that the others see as run out already;
//!   either way a handler can run twice at once. Neither lets two
//!   completions be accepted or a stale holder write: every holder write
//!   is conditioned on the token, and fences rise with the stored one. Use
//!   the fence for downstream writes (`RELIABILITY.md`, `dynamodb-lease`:
//!   skews of up to half a lease between workers and jumps of up to three
//!   leases, 0 violations).
//! * **Fences** rise per key: past the stored one, and past the clock in
//!   microseconds for a key with no item. An expired item, and a deleted
//!   one (a tombstone), keeps its fence until DynamoDB removes it, `grace`
//!   after its retention, or [`PurgeExpired`](idem::PurgeExpired) does, once its fence is older
//!   than `grace` by the purging clock. So clocks that disagree by less
//!   than `grace` (an hour by default) cannot make a fence fall; clocks
//!   further apart can, for a key claimed again after its item is gone.
//! * **Keys after the retention** ([`idem::horizon`]). A store built with
//!   [`remember_expired`](DynamoStoreBuilder::remember_expired) (or the
//!   URL's `remember=30d`) keeps, in the item of each record it ends, the
//!   day its retention ends, its fingerprint and until when that is
//!   remembered (written by the ending write itself), and the purge strips
//!   an expired item that remembers to that memory instead of deleting it.
//!   A claim's first write refuses an item whose memory still runs, so
//!   every client of the table honours a memory; the item that comes back
//!   decides whether the claim is a late retry (`Forgotten`) or another
//!   request under the key (which runs, carrying the memory).
//! * **Size.** Responses longer than 1 KiB are stored zstd-compressed when
//!   that is shorter; a response that would still pass DynamoDB's 400 KB
//!   limit is refused with [`ItemTooLarge`] before anything is sent. The
//!   step journal shares the record's item and is not read before a
//!   write, so a response that fits alone but not beside large step
//!   results is refused by DynamoDB itself (a `ValidationException`).
//!   Either way the executor records the run as failed with the reason,
//!   and it is replayed as such: the handler does not run again.
//!
//! The table needs only a string partition key `pk`; [`create_table`]
//! (or a URL's `create=true`) makes one (on-demand capacity, TTL on the
//! `sweep_at` attribute). The item layout is below.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_dynamodb::{DynamoStore, DynamoStoreBuilder};
//!
//! // Region and credentials from the environment (AWS_REGION, AWS_ACCESS_KEY_ID, …).
//! let store = DynamoStore::connect("dynamodb://idem_records?endpoint=http://127.0.0.1:5000&create=true").await?;
//! // Or with a client from aws-config in the application:
//! // let client = aws_sdk_dynamodb::Client::new(&aws_config::load_from_env().await);
//! # let client = idem_dynamodb::client_from_env(None)?;
//! let store = DynamoStoreBuilder::new(client, "idem_records").connect().await?;
//! # let _ = store; Ok(()) }
//! ```
//!
#![doc = include_str!("../docs/items.md")]

mod admin;
mod builder;
mod conn;
mod encode;
mod error;
mod horizon;
mod many;
mod request;
mod schema;
mod steps;
mod store;

pub use builder::DynamoStoreBuilder;
pub use conn::{client_for, client_from_env, ConfigError, ATTEMPT_TIMEOUT, OPERATION_TIMEOUT};
pub use error::{ConnectError, ItemTooLarge};
pub use schema::create_table;
pub use store::{DynamoStore, DEFAULT_COMPRESS_ABOVE, DEFAULT_GRACE};
