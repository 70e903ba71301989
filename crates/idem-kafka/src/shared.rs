//! What the dispatcher and the lanes share: the connection, the producer
//! for dead-letter copies, the idem consumer, and the claims made ahead.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use idem::ClaimedAhead;
use idem_consumer::Consumer;
use rdkafka::producer::FutureProducer;

use crate::lane::{Kafka, LogContext};
use crate::message::KafkaMessage;
use crate::order::PartitionOrder;

/// The consumer's state, shared by the dispatcher and every lane.
pub(crate) struct Shared<S, C> {
    pub(crate) kafka: Arc<Kafka>,
    pub(crate) producer: FutureProducer<LogContext>,
    pub(crate) consumer: Consumer<S, C>,
    pub(crate) dead_letters: HashMap<String, String>,
    pub(crate) max_buffered: usize,
    pub(crate) order: PartitionOrder,
    pub(crate) ahead: Option<(usize, Ahead)>,
}

/// Claims records ahead of their runs, in one round trip.
pub(crate) type Ahead = Arc<
    dyn Fn(Vec<Arc<KafkaMessage>>) -> BoxFuture<'static, Vec<Option<ClaimedAhead>>> + Send + Sync,
>;
