//! Keys read from an id the broker assigns at each send (SQS's
//! `MessageId`, a Kafka record's position): counted, and warned about,
//! since they catch the broker's redeliveries but not a producer that
//! sends the same message twice.

use std::sync::atomic::Ordering;

use idem::{Codec, Store};

use super::Consumer;
use crate::key::KeySource;
use crate::metrics as m;

/// What the warnings about keys read from an id the broker assigns at
/// each send say about it, after naming it.
const SEND_ID_IS_NOT_ENOUGH: &str = "which the broker assigns at each send: its redeliveries are \
     caught, but a producer that sends the same message twice is not; have producers mint a key \
     once per operation (idem::key::new_v7) and send it as the Idempotency-Key header, or read \
     the key from the payload";

impl<S: Store, C: Codec> Consumer<S, C> {
    /// For adapters of brokers that assign message ids at each send:
    /// warns at start-up when the consumer's keys come first from the
    /// message id, called `called` there (e.g. `SQS's MessageId`), which
    /// catches the broker's redeliveries but not a producer that sends
    /// the same message twice. (A consumer that reads it only when a
    /// delivery has no producer's key says so at the first such delivery,
    /// and counts them in [`ConsumerStats::keyed_by_send_id`](super::ConsumerStats::keyed_by_send_id).)
    pub fn check_send_id_keys(&self, called: &str) {
        if matches!(
            self.inner.keys.sources().first(),
            Some(KeySource::MessageId)
        ) {
            tracing::warn!(
                consumer = %self.inner.name,
                "keys come from {called}, {SEND_ID_IS_NOT_ENOUGH}"
            );
        }
    }

    /// Counts a delivery keyed by `id`, which the broker assigns at each
    /// send, and says once per consumer what that does not catch.
    pub(super) fn keyed_by_send_id(&self, id: &'static str) {
        let inner = &*self.inner;
        m::keyed_by_send_id(&inner.name);
        if inner
            .counters
            .keyed_by_send_id
            .fetch_add(1, Ordering::Relaxed)
            == 0
        {
            tracing::warn!(
                consumer = %inner.name,
                "a delivery without a producer's key was keyed by {id}, {SEND_ID_IS_NOT_ENOUGH} \
                 (said once per consumer)"
            );
        }
    }
}
