//! # idem-kafka: exactly-once effects for Kafka consumers
//!
//! Consumes one or more topics as a member of a consumer group, runs every
//! record through [`idem_consumer::Consumer`] and carries out its
//! [`Disposition`](idem_consumer::Disposition) the way Kafka allows:
//!
//! | disposition | what happens |
//! |---|---|
//! | ack | the partition's next offset is stored for commit |
//! | retry after *d* | the partition waits *d* and runs the record again, in place: no later record of that partition passes it |
//! | dead-letter | the record is produced to the dead-letter topic (default `<topic>.dead`, created if missing) with its key, payload and headers plus `Idem-Reason`, `Idem-Key`, `Idem-Consumer`, `Idem-Source-Topic`, `Idem-Source-Partition` and `Idem-Source-Offset`; once the broker has acknowledged the copy, the offset moves past it |
//!
//! ## Offsets and order
//!
//! Each assigned partition has its own worker (a *lane*) that takes the
//! partition's records in offset order, one at a time, so per-partition
//! order is kept; partitions run concurrently. An offset is stored only
//! after its record was acked or dead-lettered, and auto-commit commits
//! only stored offsets (`enable.auto.offset.store=false`): **the committed
//! offset never passes a record that was not processed**. A crash
//! redelivers at most the records after the last commit, and the
//! idempotency records turn those into replays.
//!
//! With [`PartitionOrder::Keys`], records of one partition with different
//! record keys run concurrently (up to a bound), and only records with the
//! same key keep their order: a record waiting for a retry then holds
//! back its own key, not the partition. The committed offset is still the
//! lowest record not yet settled.
//!
//! In offset order, [`KafkaConsumerBuilder::claim_ahead`] claims a
//! partition's waiting records in one round trip (the store's
//! `claim_many`); each still runs, completes and commits one at a time.
//!
//! A lane that has many records waiting pauses its partition, so a
//! partition stuck on retries holds back only itself, and the consumer
//! keeps polling (it never exceeds `max.poll.interval.ms` however long a
//! handler runs).
//!
//! ## Rebalances
//!
//! When the group takes partitions away, their lanes drop the records they
//! still hold and store no more offsets; librdkafka commits what was
//! stored. A handler already running finishes and stores its outcome under
//! its claim; the partition's new owner meets that claim (in progress:
//! retried after the lease) and then its stored outcome (a replay). A
//! claim whose worker died is taken over once its lease runs out. So a
//! rebalance can delay a record, never run it twice or skip it.
//!
//! ## Dead-letters
//!
//! A dead-letter copy is produced (and acknowledged by the broker) before
//! the record's offset is stored. A worker that dies between the two
//! leaves the record to be delivered again, and the stored failure is
//! dead-lettered again: copies are at least once, never lost. The
//! `Idem-Source-*` headers name the source record, so a reader of the
//! dead-letter topic can drop repeats.
//!
//! ## Keys
//!
//! [`Message::header`](idem_consumer::Message::header) reads Kafka headers
//! (the last one of a name wins). The consumer's default falls back to the
//! record's place, `topic/partition@offset`, which covers redeliveries of
//! one record but not a producer that sends the same content twice: set an
//! `Idempotency-Key` header in producers, or read the key from the payload
//! with a [`KeyExtractor`](idem_consumer::KeyExtractor).
//!
//! ## Start-up checks
//!
//! - every topic must exist;
//! - record retention must exceed each topic's `retention.ms` (how long a
//!   record, and so its redelivery after an offset reset, can come back);
//!   a topic that keeps records without limit (`retention.ms=-1`, or
//!   compaction without deletion) is refused. When the broker does not
//!   report the setting, the check is skipped with a warning; when offsets
//!   are never rewound further than some bound, state that bound with
//!   [`KafkaConsumerBuilder::assume_redelivery_window`] instead;
//! - settings that would commit before processing
//!   (`enable.auto.offset.store=true`) or stop commits
//!   (`enable.auto.commit=false`) are refused.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::{Idempotency, Scope};
//! use idem_consumer::{Consumer, KeyExtractor};
//! use idem_kafka::KafkaConsumer;
//!
//! let store = idem_redis::RedisStore::builder("redis://127.0.0.1:6379")?
//!     .connect()
//!     .await?;
//! let idem = Idempotency::builder(store)
//!     .retention(std::time::Duration::from_secs(8 * 24 * 3600))
//!     .build()?;
//! let consumer = Consumer::builder(idem, Scope::new("billing")?)
//!     .keys(KeyExtractor::header("Idempotency-Key"))
//!     .build();
//! let kafka = KafkaConsumer::builder("127.0.0.1:9092", "billing", &["orders"], consumer)
//!     .connect()
//!     .await?;
//! kafka
//!     .run(
//!         |job| async move {
//!             let order: serde_json::Value = job.json()?;
//!             Ok::<_, idem::Terminal>(order["id"].clone())
//!         },
//!         async { tokio::signal::ctrl_c().await.ok(); },
//!     )
//!     .await?;
//! # Ok(())
//! # }
//! ```

mod builder;
mod consumer;
mod dead_letter;
mod error;
mod lane;
mod message;
mod order;
mod run;
mod sender;
mod shared;

pub use builder::{KafkaConsumerBuilder, DEFAULT_MAX_BUFFERED, DEFAULT_SETUP_TIMEOUT};
pub use consumer::KafkaConsumer;
pub use dead_letter::{
    DEAD_LETTER_SUFFIX, SOURCE_OFFSET_HEADER, SOURCE_PARTITION_HEADER, SOURCE_TOPIC_HEADER,
};
pub use error::KafkaConsumerError;
pub use idem_consumer::{CONSUMER_HEADER, KEY_HEADER, REASON_HEADER};
pub use message::KafkaMessage;
pub use order::PartitionOrder;
pub use sender::KafkaSender;
