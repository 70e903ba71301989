//! The engine on the embedded store: held runs ended with JSON, failures,
//! steps, and the refusals a binding maps to exceptions.

use idem::FailureClass;
use idem_engine::{
    Begin, Engine, EngineError, EngineOptions, HandlerFailure, StepBegun, StepPolicy,
};

fn engine(dir: &tempfile::TempDir) -> Engine {
    let url = format!("sqlite:{}", dir.path().join("idem.db").display());
    Engine::open(&url, EngineOptions::default()).expect("the store opens")
}

fn run(begin: Begin) -> idem_engine::Run {
    match begin {
        Begin::Run(run) => run,
        Begin::Replayed(json) => panic!("replayed {}", String::from_utf8_lossy(&json)),
    }
}

#[test]
fn a_completed_run_is_replayed_byte_for_byte_and_a_terminal_failure_too() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let engine = engine(&dir);
    let here = engine.here().expect("this process");
    let first = run(here
        .block_on(here.begin("charges", "a", Some(b"{\"n\": 1}"), None))
        .expect("claims"));
    assert_eq!(first.context().fence(), Some(1));
    here.block_on(first.complete(Ok(b"{\"b\": 1,  \"a\": [2]}".to_vec())))
        .expect("completes");
    let twice = here.block_on(first.complete(Ok(b"2".to_vec())));
    assert!(matches!(twice, Err(EngineError::Config(_))), "{twice:?}");
    match here.block_on(here.begin("charges", "a", Some(b"{\"n\":1}"), None)) {
        Ok(Begin::Replayed(json)) => assert_eq!(json, b"{\"b\": 1,  \"a\": [2]}"),
        other => panic!("expected a replay, got {other:?}"),
    }
    let mismatch = here.block_on(here.begin("charges", "a", Some(b"{\"n\":2}"), None));
    assert!(
        matches!(mismatch, Err(EngineError::Mismatch)),
        "{mismatch:?}"
    );

    let doomed = run(here
        .block_on(here.begin("charges", "b", None, None))
        .expect("claims"));
    let failed = here
        .block_on(doomed.fail(HandlerFailure {
            message: "card declined".into(),
            class: FailureClass::Terminal,
        }))
        .expect("recorded");
    assert_eq!(failed.class, FailureClass::Terminal);
    match here.block_on(here.begin("charges", "b", None, None)) {
        Err(EngineError::ReplayedFailure { class, message }) => {
            assert_eq!(class, FailureClass::Terminal);
            assert_eq!(message, "card declined");
        }
        other => panic!("expected the stored failure, got {other:?}"),
    }

    let retry = run(here
        .block_on(here.begin("charges", "c", None, None))
        .expect("claims"));
    here.block_on(retry.fail(HandlerFailure {
        message: "timeout".into(),
        class: FailureClass::Retryable,
    }))
    .expect("recorded");
    let again = run(here
        .block_on(here.begin("charges", "c", None, None))
        .expect("runs again"));
    assert_eq!(again.context().attempt(), 2);
    let invalid = here.block_on(again.complete(Ok(b"{not json".to_vec())));
    assert!(
        matches!(invalid, Err(EngineError::Json { .. })),
        "{invalid:?}"
    );
    match here.block_on(here.begin("charges", "c", None, None)) {
        Err(EngineError::ReplayedFailure { class, message }) => {
            assert_eq!(class, FailureClass::Terminal);
            assert!(message.contains("cannot be stored as JSON"), "{message}");
        }
        other => panic!("a result that cannot be stored ends the key failed, got {other:?}"),
    }
}

#[test]
fn a_step_is_journaled_once_and_cannot_be_begun_twice_in_one_run() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let engine = engine(&dir);
    let here = engine.here().expect("this process");
    let first = run(here
        .block_on(here.begin("orders", "o1", None, None))
        .expect("claims"));
    let StepBegun::Open(step) = here
        .block_on(first.context().begin_step("charge", StepPolicy::Retry))
        .expect("begins")
    else {
        panic!("a new step is open")
    };
    assert_eq!(step.ctx().key().len(), 69);
    here.block_on(step.finish(b"\"ch_1\"".to_vec()))
        .expect("journaled");
    let twice = here.block_on(first.context().begin_step("charge", StepPolicy::Retry));
    assert!(
        matches!(&twice, Err(EngineError::Step(e)) if e.to_string().contains("already used")),
        "{twice:?}"
    );
    here.block_on(first.fail(HandlerFailure {
        message: "later step failed".into(),
        class: FailureClass::Retryable,
    }))
    .expect("recorded");
    let second = run(here
        .block_on(here.begin("orders", "o1", None, None))
        .expect("claims"));
    match here.block_on(second.context().begin_step("charge", StepPolicy::Retry)) {
        Ok(StepBegun::Done(Some(json))) => assert_eq!(&json[..], b"\"ch_1\""),
        other => panic!("expected the journaled result, got {other:?}"),
    }
    let StepBegun::Open(step) = here
        .block_on(second.context().begin_step("ship", StepPolicy::Park))
        .expect("begins")
    else {
        panic!("a new step is open")
    };
    drop(step);
    here.block_on(second.release()).expect("released");
    let third = run(here
        .block_on(here.begin("orders", "o1", None, None))
        .expect("claims"));
    let parked = here.block_on(third.context().begin_step("ship", StepPolicy::Park));
    assert!(
        matches!(&parked, Err(EngineError::Step(e)) if e.to_string().contains("in doubt")),
        "{parked:?}"
    );
}

#[test]
fn bad_urls_and_keys_are_typed_errors() {
    let bad = Engine::open("ftp://x", EngineOptions::default());
    assert!(matches!(&bad, Err(EngineError::Url(_))), "{bad:?}");
    assert_eq!(bad.err().map(|e| e.kind()), Some("InvalidInput"));
    let lease =
        idem_engine::input::duration("leaseMs", Some(-1.0), idem_engine::input::Unit::Millis);
    assert!(
        matches!(&lease, Err(e) if e.kind() == "InvalidInput" && e.to_string().contains("milliseconds")),
        "{lease:?}"
    );
    let missing = Engine::open(
        "sqlite:/nonexistent-dir/x/idem.db",
        EngineOptions::default(),
    );
    assert!(matches!(missing, Err(EngineError::Open(_))), "{missing:?}");
    let dir = tempfile::tempdir().expect("a temporary folder");
    let engine = engine(&dir);
    let here = engine.here().expect("this process");
    let key = here.block_on(here.begin("s", "has space", None, None));
    assert!(matches!(key, Err(EngineError::Key(_))), "{key:?}");
    let fingerprint = here.block_on(here.begin("s", "k", Some(b"{"), None));
    assert!(
        matches!(fingerprint, Err(EngineError::Json { .. })),
        "{fingerprint:?}"
    );
}

/// `settle` answers exactly once: with the work's answer, and with
/// `Unexpected` when the work panics, so a binding's promise never hangs.
#[test]
fn settle_answers_once_also_when_the_work_panics() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let engine = engine(&dir);
    let here = engine.here().expect("this process");
    let (tx, rx) = std::sync::mpsc::channel();
    let answers = tx.clone();
    here.settle(async { Ok(7) }, move |answer| {
        answers.send(answer).expect("the test listens");
    });
    here.settle(
        async {
            if std::env::var_os("IDEM_NEVER_SET").is_none() {
                panic!("the work panics");
            }
            Ok(8)
        },
        move |answer| {
            tx.send(answer).expect("the test listens");
        },
    );
    let mut got: Vec<Result<i32, EngineError>> = (0..2)
        .map(|_| {
            rx.recv_timeout(std::time::Duration::from_secs(10))
                .expect("answered")
        })
        .collect();
    got.sort_by_key(|answer| answer.is_err());
    assert!(matches!(got[0], Ok(7)), "{got:?}");
    assert!(
        matches!(&got[1], Err(EngineError::Unexpected(m)) if m.contains("panicked")),
        "{got:?}"
    );
    assert!(rx
        .recv_timeout(std::time::Duration::from_millis(200))
        .is_err());
}
