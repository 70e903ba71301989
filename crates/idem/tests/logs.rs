//! What a run writes to the log at `info`, the level the binaries run at:
//! no span per run (the `idem.run` span is at DEBUG, as the request and
//! store spans are), and warnings that name their run's scope and key
//! themselves, hashed unless the executor logs keys. Alone in its binary:
//! a subscriber set for one test thread must not race other tests over
//! the spans' cached interest.

use std::time::Duration;

use idem::store::ClaimParams;
use idem::{Idempotency, MemoryStore, RecordId, Store};
use idem_testkit::logs::Captured;
use idem_testkit::TokioClock;
use serde_json::Value;

/// Runs `key` once after an earlier claim of it was abandoned (its lease
/// ran out), with an `info` subscriber; what it logged.
async fn takeover_logged(log_keys: bool, key: &str) -> Vec<Value> {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .json()
        .with_span_list(true)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_writer(captured.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let store = MemoryStore::builder().clock(TokioClock::new()).build();
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_secs(3))
        .log_keys(log_keys)
        .build()
        .expect("config");
    let id = RecordId::parse("payments", key).expect("id");
    let params = ClaimParams::new(Duration::from_secs(3), Duration::from_secs(60));
    store
        .claim(&id, &params)
        .await
        .expect("the abandoned claim");
    tokio::time::sleep(Duration::from_secs(4)).await;
    idem.run(&id, None, |ctx| async move {
        tracing::info!("inside the run");
        Ok::<_, std::io::Error>(ctx.attempt())
    })
    .await
    .expect("the takeover runs");
    captured.lines()
}

fn event<'a>(lines: &'a [Value], message: &str) -> &'a Value {
    lines
        .iter()
        .find(|line| line["fields"]["message"] == message)
        .unwrap_or_else(|| panic!("no {message:?} in {lines:#?}"))
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn at_info_a_run_opens_no_span_and_its_warnings_name_the_hashed_key() {
    let lines = takeover_logged(false, "order-7").await;
    let spans: Vec<&Value> = lines.iter().filter_map(|line| line.get("span")).collect();
    assert!(spans.is_empty(), "no span at info: {lines:#?}");
    let warning = event(
        &lines,
        "took over an expired lease; an earlier attempt may have partly run",
    );
    assert_eq!(warning["level"], "WARN");
    assert_eq!(warning["fields"]["scope"], "payments");
    assert_eq!(warning["fields"]["attempt"], 2);
    let id = RecordId::parse("payments", "order-7").expect("id");
    assert_eq!(warning["fields"]["key"], id.log_hash());
    assert!(!lines.iter().any(|l| l.to_string().contains("order-7")));
    assert!(event(&lines, "inside the run")["spans"]
        .as_array()
        .is_none_or(Vec::is_empty));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_executor_that_logs_keys_names_them_plainly_in_its_warnings() {
    let lines = takeover_logged(true, "order-8").await;
    let warning = event(
        &lines,
        "took over an expired lease; an earlier attempt may have partly run",
    );
    assert_eq!(warning["fields"]["key"], "order-8");
    assert_eq!(warning["fields"]["scope"], "payments");
}
