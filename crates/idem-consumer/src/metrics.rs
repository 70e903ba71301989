//! Metric names of the consumer layer, all labelled `consumer`.
//!
//! Duplicate rate over any window in Prometheus:
//! `rate(idem_consumer_deliveries_total{disposition="replayed"}[5m]) /
//! rate(idem_consumer_deliveries_total{disposition=~"executed|replayed"}[5m])`;
//! the gauge [`DUPLICATE_RATIO`] holds it since start.

use std::time::Duration;

/// Counter of deliveries by `disposition`: `executed`, `replayed`,
/// `unguarded`, `in_progress` (in-flight conflicts), `retry`,
/// `dead_letter`.
pub const DELIVERIES: &str = "idem_consumer_deliveries_total";
/// Histogram of handler run time in seconds (runs only, not replays).
pub const HANDLER_SECONDS: &str = "idem_consumer_handler_seconds";
/// Gauge: replayed / (executed + replayed) since the consumer started.
pub const DUPLICATE_RATIO: &str = "idem_consumer_duplicate_ratio";
/// Counter of deliveries keyed by an id the broker assigns at each send
/// (SQS's `MessageId`, a Kafka record's position), which catches the
/// broker's redeliveries but not a producer sending a message twice:
/// above zero, some producer does not send an `Idempotency-Key`.
pub const KEYED_BY_SEND_ID: &str = "idem_consumer_keyed_by_send_id_total";

pub(crate) fn delivery(consumer: &str, disposition: &'static str, duplicate_ratio: f64) {
    let consumer = consumer.to_owned();
    metrics::counter!(DELIVERIES, "consumer" => consumer.clone(), "disposition" => disposition)
        .increment(1);
    metrics::gauge!(DUPLICATE_RATIO, "consumer" => consumer).set(duplicate_ratio);
}

pub(crate) fn keyed_by_send_id(consumer: &str) {
    metrics::counter!(KEYED_BY_SEND_ID, "consumer" => consumer.to_owned()).increment(1);
}

pub(crate) fn handler_seconds(consumer: &str, took: Duration) {
    metrics::histogram!(HANDLER_SECONDS, "consumer" => consumer.to_owned())
        .record(took.as_secs_f64());
}
