//! # idem: exactly-once effects over at-least-once delivery
//!
//! Brokers redeliver, HTTP clients retry, consumers crash after the work
//! and before the ack. `idem` makes "process this again" safe: each
//! operation carries an idempotency key; the first delivery claims it,
//! runs the handler and stores the outcome; every duplicate gets the stored
//! outcome instead of a second run.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use idem::{Fingerprint, Idempotency, MemoryStore, Outcome, RecordId, RunError};
//! use std::sync::atomic::{AtomicU32, Ordering};
//!
//! let charges = AtomicU32::new(0);
//! let idem = Idempotency::builder(MemoryStore::new()).build()?;
//! let id = RecordId::parse("payments", "order-7:charge:v1")?;
//! let body = br#"{"amount": 1250, "currency": "EUR"}"#;
//! let fp = Fingerprint::of_json(body)?;
//!
//! for _delivery in 0..3 {
//!     let charges = &charges;
//!     let receipt = idem
//!         .run(&id, Some(fp), |ctx| async move {
//!             let fence = ctx.checked_fence()?; // still ours: about to do something irreversible
//!             charges.fetch_add(1, Ordering::SeqCst);
//!             Ok::<_, idem::HandlerError>(format!("charged with fence {fence}"))
//!         })
//!         .await?;
//!     assert!(receipt.value().starts_with("charged"));
//! }
//! assert_eq!(charges.load(Ordering::SeqCst), 1);
//!
//! // Same key, different payload: refused, never silently replayed.
//! let other = Fingerprint::of_json(br#"{"amount": 9999, "currency": "EUR"}"#)?;
//! let err = idem.run(&id, Some(other), |_| async { Ok::<u8, idem::HandlerError>(0) }).await;
//! assert!(matches!(err, Err(RunError::Mismatch)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! ## Map of the crate
//!
//! - Identity: [`Key`], [`Scope`], [`RecordId`]; [`Fingerprint`] over
//!   canonical JSON or bytes; key helpers in [`derive`](mod@derive).
//! - The record and its pure state machine: [`Record`], [`State`],
//!   [`machine::decide_claim`], [`machine::decide_write`].
//! - The store contract: [`Store`] (claim, complete, fail, extend,
//!   release) and capability traits [`GetRecord`], [`DeleteRecord`],
//!   [`ListRecords`], [`PurgeExpired`], [`ClaimMany`], [`CompleteMany`],
//!   [`FindAbandoned`].
//! - Journaled steps for side effects that cannot be rolled back:
//!   [`Context::step`] with the in-doubt policies of [`step`], on stores
//!   with a [`StepJournal`].
//! - What a run sends: [`outbox`] ([`Context::send`], stored with the
//!   outcome, dispatched after it); producer keys with [`key::new_v7`].
//! - Work that finishes when its worker dies: [`durable`] handlers, whose
//!   abandoned runs a [`durable::Completer`] re-drives; the reaper
//!   [`spawn_purger`] removes expired records.
//! - [`MemoryStore`], sharded and bounded, with a [`Clock`] you can
//!   replace by a [`ManualClock`] in tests.
//! - The executor [`Idempotency`]: heartbeats, lease-loss signal,
//!   retryable vs terminal failures, backoff, max attempts, compression,
//!   size limits, fail-closed by default.
//!   Handlers see their run through [`Context`] ([`Context::checked_fence`]
//!   before a fenced write); [`HandlerError`] is an error type for
//!   handlers that have none of their own.
//! - For store implementers: [`group`], group commit (calls made at the
//!   same time sent as one batch).
//! - Metric names in [`metrics`].
//!
//! The guarantees every store keeps are in [`contract`]; `idem-testkit`
//! holds the conformance suite every store passes.
//!
//! ## What a run returns
//!
#![doc = include_str!("../docs/outcomes.md")]
//!
//! ## Choosing a store
//!
#![doc = include_str!("../docs/stores.md")]

pub mod blob;
pub mod cache;
mod capabilities;
mod chain;
mod clock;
#[doc = include_str!("../docs/contract.md")]
pub mod contract {}
pub mod codec;
pub mod derive;
pub mod durable;
mod executor;
mod fingerprint;
pub mod group;
pub mod horizon;
pub mod key;
pub mod key_hash;
pub mod machine;
mod memory;
pub mod metrics;
pub mod outbox;
mod purger;
mod record;
pub mod step;
pub mod store;
pub mod url;
pub mod wake;

pub use chain::error_chain;
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use codec::{Codec, Json};
pub use executor::{
    default_classifier, effect_in_doubt_of, effect_mark, effect_mark_fence, Backoff, Begun,
    ClaimedAhead, Classifier, ConfigError, Context, HandlerError, Heartbeats, HeldRun, Idempotency,
    IdempotencyBuilder, OpenStep, Outcome, RunError, StepStart, Terminal, DEFAULT_LEASE,
    DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_REPLAY_CACHE_BYTES, DEFAULT_REPLAY_CACHE_TTL,
    DEFAULT_RETENTION, EFFECT_STEP, STORE_RETRY_AFTER,
};
pub use fingerprint::{canonical_json, Fingerprint, FingerprintError};
pub use key::{Key, KeyError, KeyRules, RecordId, Scope, DEFAULT_MAX_KEY_LEN, MAX_SCOPE_LEN};
pub use machine::LeaseLost;
pub use memory::{MemoryStore, MemoryStoreBuilder, DEFAULT_MAX_RECORDS, DEFAULT_SHARDS};
pub use purger::{spawn_every, spawn_purger, PurgerHandle};
pub use record::{
    Failure, FailureClass, InboxOutcome, Record, Resolution, Resolved, State, StateKind, StepEntry,
    StepState,
};
pub use store::{
    BoxError, ClaimMany, CompleteMany, DeleteRecord, FindAbandoned, GetRecord, ListPage, ListQuery,
    ListRecords, PurgeExpired, RecordTtl, StepJournal, Store, StoreError,
};
