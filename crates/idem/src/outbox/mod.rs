//! What a run sends: an outbox for the messages a handler emits.
//!
//! A handler that publishes directly publishes again when a takeover runs
//! it a second time, and loses the message when its process dies between
//! storing the outcome and publishing. Through the outbox the messages are
//! part of the run's outcome instead:
//!
//! 1. the handler hands them to [`Context::send`](crate::Context::send);
//!    nothing leaves the process while it runs;
//! 2. they are stored **with the completion, in the same write** (inside
//!    the stored response's envelope, so on every store at once), and
//!    only if the run completes: a failed or taken-over run sends nothing;
//! 3. only then are they dispatched through the executor's [`Sender`],
//!    each with its own id — a UUIDv7 minted by [`Message::new`] and
//!    stored with it — which the sender passes as the broker's
//!    deduplication id (`Nats-Msg-Id`, RabbitMQ's `message_id`, …) and
//!    which consumers downstream take as their idempotency key;
//! 4. a duplicate delivery of the input is **replayed, never re-run**,
//!    and re-dispatches the messages if they are not yet confirmed sent;
//!    a process that died before confirming leaves them to the
//!    [dispatcher](crate::Idempotency::spawn_outbox_dispatcher), which
//!    finds them through the store's pending index or a marker written
//!    before the completion.
//!
//! Dispatch is at least once, each message under its stable id: a message
//! whose broker confirmation was lost is sent again with the same id.
//!
//! ## What it costs, and where it is kept
//!
//! On a store that keeps a pending index
//! ([`PendingSends`](crate::store::PendingSends): PostgreSQL, Redis, the
//! memory store), the completion's own write marks the run pending, held
//! by its process for a lease, and one more write clears the mark once
//! every message is confirmed (in the background on a networked store):
//! a sending run writes once more than a run that sends nothing. On any
//! other store it writes two more records beside its own: a *marker* (claimed before the completion, completed — or
//! released, by a dispatcher or a replay — once every message is
//! confirmed) in the scope `idem.outbox/` followed by a digest of the
//! run's scope. Either way, once per process and scope, the scope's entry
//! in `idem.outbox`, through which the dispatcher finds the runs. A run
//! that sends nothing writes nothing more. Markers and entries are
//! ordinary records, seen and purged like any other.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use idem::outbox::{Message, MemorySender};
//! use idem::{Idempotency, MemoryStore, RecordId};
//!
//! let sent = MemorySender::new();
//! let idem = Idempotency::builder(MemoryStore::new()).outbox(sent.clone()).build()?;
//! let id = RecordId::parse("orders", "order-7:charge")?;
//!
//! for _delivery in 0..3 {
//!     idem.run(&id, None, |ctx| async move {
//!         ctx.send(Message::new("order-events", r#"{"charged":"order-7"}"#))?;
//!         Ok::<_, idem::HandlerError>(String::from("charged"))
//!     })
//!     .await?;
//! }
//! // Three deliveries, one run, one message.
//! assert_eq!(sent.messages().len(), 1);
//! assert_eq!(sent.messages()[0].destination(), "order-events");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

mod dispatch;
mod frame;
mod marker;
mod memory;
mod message;
mod outgoing;
mod sweep;
pub mod table;

pub use memory::MemorySender;
pub use message::{Message, SendError, SendFuture, Sender, KEY_HEADER, MAX_MESSAGES_BYTES};
pub(crate) use outgoing::Outgoing;
pub use sweep::{DispatchPass, DEFAULT_DISPATCH_INTERVAL};
pub use table::OutboxPass;

pub use dispatch::HeldMarker;
pub(crate) use dispatch::{OutboxConfig, SentBy};

use crate::codec::AtRest;
use crate::key::RecordId;

/// The messages stored with `id`'s response `stored` (none if the run
/// sent none), opened as `at_rest` keeps them: for tools that read
/// records (`idem inspect`), as the dispatcher does.
pub fn stored_messages(
    at_rest: &AtRest,
    id: &RecordId,
    stored: &[u8],
) -> Result<Vec<Message>, String> {
    match at_rest.open_messages(id, stored)? {
        Some(bytes) => decode_messages(&bytes),
        None => Ok(Vec::new()),
    }
}
pub(crate) use frame::decode as decode_messages;
pub use frame::encode as encode_messages;
pub(crate) use marker::{
    marker_id, marker_scope, registry_id, run_scope_of, MARKER_SCOPE_PREFIX, REGISTRY_SCOPE,
};
