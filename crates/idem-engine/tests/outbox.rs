//! What a run sends, through the engine's outbox to a real JetStream:
//! sent once after the completion, with its id as `Nats-Msg-Id`, never
//! again for a replayed duplicate, and nothing for a run that failed or
//! was released.
#![cfg(feature = "nats")]

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use futures_util::StreamExt;
use idem::FailureClass;
use idem_engine::{Begin, Engine, EngineError, EngineOptions, HandlerFailure};
use idem_testkit::servers::nats::NatsServer;

fn open(dir: &tempfile::TempDir, outbox: Option<String>) -> Result<Engine, EngineError> {
    let url = format!("sqlite:{}", dir.path().join("idem.db").display());
    Engine::open(
        &url,
        EngineOptions {
            outbox,
            ..EngineOptions::default()
        },
    )
}

fn run(begin: Begin) -> idem_engine::Run {
    match begin {
        Begin::Run(run) => run,
        Begin::Replayed(json) => panic!("replayed {}", String::from_utf8_lossy(&json)),
    }
}

/// Every message in `stream`: (its `Nats-Msg-Id`, a header `h`, payload).
async fn stored(url: &str, name: &str) -> Vec<(String, String, Vec<u8>)> {
    let js = jetstream::new(async_nats::connect(url).await.expect("connects"));
    let stream = js.get_stream(name).await.expect("the stream");
    let reader = stream
        .create_consumer(consumer::pull::Config::default())
        .await
        .expect("a consumer");
    let mut batch = reader
        .fetch()
        .max_messages(100)
        .expires(Duration::from_millis(500))
        .messages()
        .await
        .expect("fetches");
    let mut found = Vec::new();
    while let Some(message) = batch.next().await {
        let message = message.expect("a message");
        let header = |name: &str| {
            message
                .headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default()
        };
        found.push((header("Nats-Msg-Id"), header("h"), message.payload.to_vec()));
    }
    found
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A stream `name` taking the subjects under its name.
async fn create_stream(nats: &str, name: &str) {
    let js = jetstream::new(async_nats::connect(nats).await.expect("connects"));
    js.create_stream(stream::Config {
        name: name.to_owned(),
        subjects: vec![format!("{name}.>")],
        ..Default::default()
    })
    .await
    .expect("the stream");
}

#[test]
fn a_run_sends_once_after_its_completion_and_a_replay_sends_nothing_more() {
    let nats = NatsServer::shared().expect("nats-server").url();
    let name = format!("engine_outbox_{:016x}", rand::random::<u64>());
    let subject = format!("{name}.out");
    let tokio = runtime();
    tokio.block_on(create_stream(&nats, &name));

    let dir = tempfile::tempdir().expect("a temporary folder");
    let engine = open(&dir, Some(nats.clone())).expect("the engine opens with its outbox");
    let here = engine.here().expect("this process");

    let first = run(here
        .block_on(here.begin("orders", "order-1", None, None))
        .expect("claims"));
    let id = first
        .context()
        .send(
            &subject,
            b"charged".to_vec(),
            vec![("h".into(), "v".into())],
        )
        .expect("the message is held");
    assert_eq!(id.len(), 36, "a UUIDv7: {id}");
    here.block_on(first.complete(Ok(b"{\"ok\":true}".to_vec())))
        .expect("completes");
    for _ in 0..3 {
        let again = here
            .block_on(here.begin("orders", "order-1", None, None))
            .expect("answers");
        assert!(matches!(again, Begin::Replayed(ref json) if json == b"{\"ok\":true}"));
    }

    // A run that fails, and one that is released, send nothing.
    let failing = run(here
        .block_on(here.begin("orders", "order-2", None, None))
        .expect("claims"));
    failing
        .context()
        .send(&subject, b"never".to_vec(), Vec::new())
        .expect("held");
    here.block_on(failing.fail(HandlerFailure {
        message: "declined".into(),
        class: FailureClass::Terminal,
    }))
    .expect("fails");
    let released = run(here
        .block_on(here.begin("orders", "order-3", None, None))
        .expect("claims"));
    released
        .context()
        .send(&subject, b"never".to_vec(), Vec::new())
        .expect("held");
    let context = released.context();
    here.block_on(released.release()).expect("releases");
    let late = context.send(&subject, b"late".to_vec(), Vec::new());
    assert!(
        matches!(&late, Err(e @ EngineError::Send(_)) if e.kind() == "InvalidInput"),
        "{late:?}"
    );

    let sent = tokio.block_on(stored(&nats, &name));
    assert_eq!(sent, vec![(id, "v".to_owned(), b"charged".to_vec())]);
}

#[test]
fn what_a_refused_send_left_is_sent_by_the_engines_dispatcher() {
    let nats = NatsServer::shared().expect("nats-server").url();
    let name = format!("engine_later_{:016x}", rand::random::<u64>());
    let dir = tempfile::tempdir().expect("a temporary folder");
    let url = format!("sqlite:{}", dir.path().join("idem.db").display());
    let engine = Engine::open(
        &url,
        EngineOptions {
            outbox: Some(nats.clone()),
            lease: Some(Duration::from_millis(600)),
            ..EngineOptions::default()
        },
    )
    .expect("opens");
    let here = engine.here().expect("this process");
    let held = run(here
        .block_on(here.begin("orders", "order-1", None, None))
        .expect("claims"));
    let id = held
        .context()
        .send(&format!("{name}.out"), b"late".to_vec(), Vec::new())
        .expect("held");
    // No stream takes the subject yet: JetStream refuses the send, and
    // the message stays pending with the completed run.
    here.block_on(held.complete(Ok(b"1".to_vec())))
        .expect("completes");
    let tokio = runtime();
    tokio.block_on(create_stream(&nats, &name));
    // The engine's dispatcher looks every 5 s, once the marker's lease
    // (600 ms) has run out.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut sent = tokio.block_on(stored(&nats, &name));
    while sent.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        sent = tokio.block_on(stored(&nats, &name));
    }
    assert_eq!(sent, vec![(id, String::new(), b"late".to_vec())]);
}

#[test]
fn without_an_outbox_a_send_is_refused_and_a_bad_outbox_url_is_said() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let engine = open(&dir, None).expect("opens");
    let here = engine.here().expect("this process");
    let held = run(here
        .block_on(here.begin("orders", "a", None, None))
        .expect("claims"));
    let refused = held.context().send("somewhere", b"x".to_vec(), Vec::new());
    match refused {
        Err(error @ EngineError::Send(_)) => {
            assert_eq!(error.kind(), "InvalidInput");
            assert!(error.to_string().contains("outbox"), "{error}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    drop(held);

    let other = tempfile::tempdir().expect("a temporary folder");
    let unreachable = open(&other, Some("nats://127.0.0.1:1".into()));
    assert!(
        matches!(&unreachable, Err(EngineError::Config(why)) if why.contains("cannot be reached")),
        "{unreachable:?}"
    );
    let unknown = open(&other, Some("smtp://mail".into()));
    assert!(
        matches!(&unknown, Err(EngineError::Config(why)) if why.contains("not a broker")),
        "{unknown:?}"
    );
}
