//! idem's spans in OpenTelemetry: a delivery whose handler charges a card
//! in a journaled step, then the broker's duplicate of it, exported
//! through `tracing-opentelemetry`.
//!
//! Each delivery is an `idem.delivery` span (DEBUG) holding the run
//! (`idem.run`), the step (`idem.step`) and every store round trip
//! (`idem.store`, DEBUG). The duplicate's run says `outcome = "replayed"` and has no
//! step: the handler did not run.
//!
//! This prints the spans on standard output. For a collector, replace the
//! stdout exporter with `opentelemetry_otlp::SpanExporter::builder()`.
//! The gateway (`idem proxy`) passes `traceparent` and `tracestate` on to
//! the upstream unchanged, so a service behind it joins the client's
//! trace.
//!
//! Run: `cargo run -p idem-examples --example otel`

use std::sync::Arc;

use idem::step::Retry;
use idem::{Idempotency, Scope};
use idem_consumer::{Consumer, Decision, KeyExtractor, OwnedMessage};
use idem_sqlite::SqliteStore;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::EnvFilter;

/// The layer that hands `tracing` spans to `provider`, for idem's spans
/// down to its store calls.
pub(crate) fn otel_subscriber(
    provider: &SdkTracerProvider,
) -> impl tracing::Subscriber + Send + Sync {
    tracing_subscriber::registry()
        .with(EnvFilter::new("info,idem=debug,idem_consumer=debug"))
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("orders")))
}

/// An order delivered twice (the broker's redelivery), through a
/// consumer whose handler charges in a journaled step; the decisions.
pub(crate) async fn deliver_twice(dir: &std::path::Path) -> Vec<Decision> {
    let store = SqliteStore::open(dir.join("idem.db")).expect("open the store");
    let idem = Idempotency::builder(store).build().expect("config");
    let consumer = Consumer::builder(idem, Scope::new("orders").expect("scope"))
        .keys(KeyExtractor::header("Idempotency-Key"))
        .build();
    let order = Arc::new(
        OwnedMessage::new(r#"{"order":"o-42","cents":1250}"#)
            .with_header("Idempotency-Key", "o-42")
            .with_message_id("m-1"),
    );
    let mut decisions = Vec::new();
    for _ in 0..2 {
        let decision = consumer
            .process(Arc::clone(&order), |job| async move {
                job.ctx()
                    .step("charge", Retry, |step| async move {
                        Ok::<_, std::io::Error>(format!("charged under {}", step.key()))
                    })
                    .await
            })
            .await;
        decisions.push(decision);
    }
    decisions
}

#[tokio::main(flavor = "current_thread")]
#[allow(clippy::print_stdout)]
async fn main() {
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(opentelemetry_stdout::SpanExporter::default())
        .build();
    otel_subscriber(&provider).init();
    let dir = tempfile::tempdir().expect("temporary directory");
    for decision in deliver_twice(dir.path()).await {
        println!("{:?}", decision.disposition);
    }
    provider.shutdown().expect("spans exported");
}
