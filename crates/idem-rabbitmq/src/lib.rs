//! # idem-rabbitmq: exactly-once effects for RabbitMQ consumers
//!
//! Runs every delivery of a queue through [`idem_consumer::Consumer`] and
//! carries out its [`Disposition`](idem_consumer::Disposition) with manual acknowledgements:
//!
//! | disposition | what happens on the broker |
//! |---|---|
//! | ack | `basic.ack` |
//! | retry after *d* | a copy goes to the retry queue `<queue>.retry.<ms>ms` whose TTL is the smallest bucket ≥ *d*; when it expires RabbitMQ dead-letters it back to `<queue>`. The original is acked once the copy is confirmed |
//! | dead-letter | a copy goes to `<queue>.dead` with headers `Idem-Reason`, `Idem-Key` and `Idem-Consumer` (idem's one dead-letter vocabulary); the original is acked once the copy is confirmed |
//!
//! Copies keep the original's properties and headers, so the key is read
//! the same way on every delivery. Every copy is published with publisher
//! confirms and `mandatory`, and the original is acked only once its copy
//! is confirmed. A dead-letter copy that is not confirmed makes the
//! message a retry after the longest delay instead, and a retry copy that
//! is not confirmed requeues the original (`basic.nack` with requeue), so
//! nothing is lost — at worst a message is delivered once more, which the
//! key makes harmless.
//! A worker that dies leaves its unacknowledged deliveries to the broker,
//! which redelivers them; a duplicate whose first delivery is still
//! running elsewhere is retried later, never acked.
//!
//! Retry queues with a fixed TTL each, rather than a per-message
//! expiration on one queue, keep delays exact: RabbitMQ expires messages
//! only at the head of a queue, so a long per-message delay would hold up
//! every shorter one behind it.
//!
//! ## Topology
//!
//! [`RabbitConsumerBuilder::connect`] declares, all durable: `<queue>` (with
//! `x-dead-letter-routing-key = <queue>.dead`, so messages that expire in
//! it are dead-lettered rather than dropped, and `x-message-ttl` when
//! [`message_ttl`](RabbitConsumerBuilder::message_ttl) is set), one
//! `<queue>.retry.<ms>ms` per retry delay, and `<queue>.dead`. A queue that
//! already exists with other arguments is refused with the broker's reason.
//!
//! ## Quorum queues
//!
//! [`quorum`](RabbitConsumerBuilder::quorum) declares all of them as quorum
//! queues (`x-queue-type: quorum`: replicated, and the default type of
//! RabbitMQ 4, where classic mirroring is gone); an existing quorum queue
//! needs it, or the broker refuses the declaration. The queues that
//! dead-letter (`<queue>` into `<queue>.dead`, each retry queue back into
//! `<queue>`) get at-least-once dead-lettering (`x-dead-letter-strategy:
//! at-least-once`, `x-overflow: reject-publish`): a quorum queue's default
//! drops a message whose dead-letter target does not confirm it, and every
//! retry travels that way.
//!
//! A quorum queue counts how often each message came back unacknowledged
//! (a worker that died, a connection lost before the ack, a channel closed
//! by `consumer_timeout`) and, past its `x-delivery-limit`, moves it aside
//! on its own — into `<queue>.dead` here, but without idem's reason.
//! [`delivery_limit`](RabbitConsumerBuilder::delivery_limit) declares the
//! limit and tells the consumer: the broker's last delivery of a message
//! is dead-lettered by idem with `Idem-Reason` saying so, instead of being
//! run once more with nothing but the broker's `x-death` to explain it if
//! it comes back. RabbitMQ 4 gives quorum queues a limit of 20 unless told;
//! give the limit the queue has. A message that keeps killing its worker
//! meets idem's own attempts limit first when the delivery limit is above
//! it (`max_attempts`, 5 by default): dead-lettered as terminal, with the
//! attempts in the reason. The delivery limit counts returns, not time: the
//! redelivery window below still needs a message TTL or a stated window.
//!
//! ## The broker's `consumer_timeout`
//!
//! RabbitMQ closes a channel on which a delivery stays unacknowledged
//! longer than its `consumer_timeout` (30 minutes unless configured) and
//! requeues everything the channel held. A handler that runs that long
//! does not stop the consumer: it opens a new channel on the same
//! connection and goes on. The requeued copy of the long-running message
//! meets its live claim and is retried later, never run twice; once the
//! handler finishes, the copy replays the stored outcome and is acked (the
//! original's ack on the closed channel fails, harmlessly). Each such close
//! costs a redelivery of the whole prefetch window, so set
//! `consumer_timeout` above your longest handler when you can.
//!
//! A lost connection is opened again the same way (the topology declared
//! again), and an ack that was queued on the connection that died is
//! given up after [`idem_consumer::SETTLE_TIMEOUT`]: its message comes
//! back and replays its stored outcome.
//!
//! ## The redelivery window
//!
//! A completed record must outlive every duplicate. Duplicates can wait in
//! `<queue>` as long as its message TTL, plus the longest retry delay, so
//! start-up refuses a retention shorter than that. A queue without a
//! message TTL can hold a message without limit: then state the longest
//! backlog you run with, [`redelivery_window`](RabbitConsumerBuilder::redelivery_window),
//! or start-up refuses it.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use idem::{Idempotency, Scope};
//! use idem_consumer::Consumer;
//! use idem_rabbitmq::RabbitConsumer;
//!
//! let store = idem_redis::RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let idem = Idempotency::builder(store).build()?;
//! let consumer = Consumer::builder(idem, Scope::new("orders")?).build();
//! let rabbit = RabbitConsumer::builder("amqp://guest:guest@127.0.0.1:5672/%2f", "orders", consumer)
//!     .prefetch(32)
//!     .redelivery_window(Duration::from_secs(6 * 3600))
//!     .connect()
//!     .await?;
//! rabbit
//!     .run(
//!         |job| async move {
//!             let order: serde_json::Value = job.json()?;
//!             // charge the order, passing job.ctx().fence() downstream
//!             Ok::<_, idem::Terminal>(order["id"].clone())
//!         },
//!         async { tokio::signal::ctrl_c().await.ok(); },
//!     )
//!     .await?;
//! # Ok(())
//! # }
//! ```

mod broker;
mod builder;
mod connect;
mod consumer;
mod error;
mod message;
mod sender;
mod topology;

pub use builder::{RabbitConsumerBuilder, DEFAULT_PREFETCH, DEFAULT_RETRY_DELAYS};
pub use consumer::RabbitConsumer;
pub use error::RabbitError;
pub use idem_consumer::{CONSUMER_HEADER, KEY_HEADER, REASON_HEADER};
pub use message::{AmqpMessage, RETRIES_HEADER};
pub use sender::RabbitSender;
