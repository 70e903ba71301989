//! The `otel` example's deliveries, exported through OpenTelemetry into
//! memory: the spans an operator's collector would get, read back and
//! checked for names, nesting and what they say.

#[allow(dead_code)]
#[path = "../otel.rs"]
mod example;

use std::collections::HashMap;

use idem_consumer::{Acked, Disposition};
use opentelemetry::trace::SpanId;
use opentelemetry::Value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};

fn attribute<'a>(span: &'a SpanData, name: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == name)
        .map(|kv| &kv.value)
}

fn text(span: &SpanData, name: &str) -> String {
    attribute(span, name).map_or_else(String::new, |v| v.as_str().into_owned())
}

#[tokio::test]
async fn a_delivery_its_run_its_step_and_its_store_calls_are_exported_as_one_tree() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let _subscriber = tracing::subscriber::set_default(example::otel_subscriber(&provider));
    let dir = tempfile::tempdir().expect("tempdir");
    let decisions = example::deliver_twice(dir.path()).await;
    assert_eq!(
        decisions
            .iter()
            .map(|d| d.disposition.clone())
            .collect::<Vec<_>>(),
        [
            Disposition::Ack(Acked::Executed),
            Disposition::Ack(Acked::Replayed)
        ]
    );
    provider.force_flush().expect("flushed");
    let spans = exporter.get_finished_spans().expect("spans");
    let by_id: HashMap<SpanId, &SpanData> = spans
        .iter()
        .map(|s| (s.span_context.span_id(), s))
        .collect();
    let parent = |span: &SpanData| by_id.get(&span.parent_span_id).copied();
    let named =
        |name: &str| -> Vec<&SpanData> { spans.iter().filter(|s| s.name == name).collect() };

    let deliveries = named("idem.delivery");
    assert_eq!(deliveries.len(), 2, "{spans:#?}");
    for (delivery, disposition) in deliveries.iter().zip(["executed", "replayed"]) {
        assert_eq!(text(delivery, "disposition"), disposition);
        assert_eq!(text(delivery, "message_id"), "m-1");
        assert!(parent(delivery).is_none(), "a delivery is a root");
    }
    let runs = named("idem.run");
    assert_eq!(runs.len(), 2);
    for (run, (delivery, outcome)) in runs
        .iter()
        .zip(deliveries.iter().zip(["executed", "replayed"]))
    {
        assert_eq!(
            parent(run).map(|p| p.span_context.span_id()),
            Some(delivery.span_context.span_id()),
            "each run inside its delivery"
        );
        assert_eq!(
            run.span_context.trace_id(),
            delivery.span_context.trace_id()
        );
        assert_eq!(text(run, "outcome"), outcome);
        assert_eq!(text(run, "scope"), "orders");
    }

    // The step ran once, in the first run; the duplicate never reached it.
    let steps = named("idem.step");
    assert_eq!(steps.len(), 1, "{steps:#?}");
    assert_eq!(text(steps[0], "step"), "charge");
    assert_eq!(attribute(steps[0], "replayed"), Some(&Value::Bool(false)));
    assert_eq!(
        parent(steps[0]).map(|p| p.span_context.span_id()),
        Some(runs[0].span_context.span_id())
    );

    // Store calls nest where they were made: the claim in each run, the
    // journal's writes in the step.
    let ops = |under: &SpanData| -> Vec<String> {
        named("idem.store")
            .into_iter()
            .filter(|s| s.parent_span_id == under.span_context.span_id())
            .map(|s| text(s, "op"))
            .collect()
    };
    assert_eq!(ops(runs[0]), ["claim", "complete"]);
    assert_eq!(ops(steps[0]), ["step_begin", "step_finish"]);
    assert_eq!(
        ops(runs[1]),
        Vec::<String>::new(),
        "the executor's replay cache answered the duplicate: no round trip"
    );
}
