//! The run outbox on the embedded memory store: what a run sends is kept
//! with its outcome and sent only after it, once per run, whatever the
//! run, its process or its broker does meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::outbox::{MemorySender, Message, SendError, MAX_MESSAGES_BYTES};
use idem::store::Lease;
use idem::{
    Begun, GetRecord, HandlerError, Idempotency, MemoryStore, Outcome, RunError, State, Store,
    StoreError, Terminal,
};
use idem_testkit::doubles::{Double, Hooks};
use idem_testkit::DownStore;
use tokio::sync::Notify;

mod common;

use common::{executor, payloads, run_id, store, Hangs, LEASE};

#[tokio::test]
async fn failed_and_taken_over_runs_send_nothing() {
    let (store, clock) = store();
    let sender = MemorySender::new();
    let idem = executor(store.clone(), sender.clone());

    let failed = idem
        .run(&run_id("failed"), None, |ctx| async move {
            ctx.send(Message::new("events", "never"))?;
            Err::<(), _>(HandlerError::new(Terminal::new("declined")))
        })
        .await;
    assert!(
        matches!(failed, Err(RunError::Handler { .. })),
        "{failed:?}"
    );

    // The first holder stalls past its lease; a second takes over and
    // completes; the first then finishes too late.
    let id = run_id("taken-over");
    let (stalled_tx, stalled_rx) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let idem = executor(store.clone(), sender.clone());
        let id = id.clone();
        tokio::spawn(async move {
            idem.run(&id, None, |ctx| async move {
                ctx.send(Message::new("events", "from the stalled holder"))?;
                stalled_tx.send(()).expect("test waits");
                go_rx.await.expect("test resumes");
                Ok::<_, HandlerError>("first".to_owned())
            })
            .await
        })
    };
    stalled_rx.await.expect("the first holder runs");
    clock.advance(LEASE * 2);
    let second = idem
        .run(&id, None, |ctx| async move {
            ctx.send(Message::new("events", "from the new holder"))?;
            Ok::<_, HandlerError>("second".to_owned())
        })
        .await
        .expect("the takeover completes");
    assert!(matches!(second, Outcome::Executed { takeover: true, .. }));
    go_tx.send(()).expect("the first holder waits");
    let late = first.await.expect("joined");
    assert!(matches!(late, Err(RunError::LeaseLost)), "{late:?}");

    let payloads = payloads(&sender);
    assert_eq!(payloads, ["from the new holder"]);

    // The late holder found the run's messages confirmed and held
    // nothing: no dispatcher sends the new holder's message again.
    clock.advance(LEASE * 2);
    let pass = idem.dispatch_pending().await.expect("a pass");
    assert_eq!((pass.pending, pass.messages), (0, 0), "{pass:?}");
    assert_eq!(sender.messages().len(), 1);
}

/// A store whose first completion of a run (scope `orders`) waits for
/// the test's word and then fails as unreachable, unapplied: the holder
/// cannot know whether it landed.
#[derive(Clone)]
struct CompletionInDoubt {
    reached: Arc<Notify>,
    go: Arc<Notify>,
    first: Arc<AtomicBool>,
}

impl<S: Store> Hooks<S> for CompletionInDoubt {
    async fn complete(
        &self,
        inner: &S,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        if lease.id.scope().as_str() == "orders" && self.first.swap(false, Ordering::SeqCst) {
            self.reached.notify_one();
            self.go.notified().await;
            return Err(StoreError::Unavailable("connection reset".into()));
        }
        inner.complete(lease, response, retention).await
    }
}

/// A holder whose completion was in doubt while its lease ran out, and
/// whose takeover stored the same response (with messages of its own),
/// finds its completion refused: the record is the takeover's, so its
/// messages are not sent (a chaos run caught them sent when the
/// stored-already check compared the responses alone).
#[tokio::test]
async fn a_holder_whose_completion_was_in_doubt_sends_nothing_when_a_takeover_stored_the_same_response(
) {
    let (store, clock) = store();
    let sender = MemorySender::new();
    let hooks = CompletionInDoubt {
        reached: Arc::default(),
        go: Arc::default(),
        first: Arc::new(AtomicBool::new(true)),
    };
    let id = run_id("in-doubt");
    let first = {
        let idem = executor(Double::new(store.clone(), hooks.clone()), sender.clone());
        let id = id.clone();
        tokio::spawn(async move {
            idem.run(&id, None, |ctx| async move {
                ctx.send(Message::new("events", "from the holder in doubt"))?;
                Ok::<_, HandlerError>("shipped".to_owned())
            })
            .await
        })
    };
    hooks.reached.notified().await;
    clock.advance(LEASE * 2);
    let idem = executor(store.clone(), sender.clone());
    let second = idem
        .run(&id, None, |ctx| async move {
            ctx.send(Message::new("events", "from the takeover"))?;
            Ok::<_, HandlerError>("shipped".to_owned())
        })
        .await
        .expect("the takeover completes");
    assert!(matches!(second, Outcome::Executed { takeover: true, .. }));
    hooks.go.notify_one();
    let late = first.await.expect("joined");
    assert!(matches!(late, Err(RunError::LeaseLost)), "{late:?}");

    let payloads = payloads(&sender);
    assert_eq!(payloads, ["from the takeover"]);
}

#[tokio::test]
async fn a_process_gone_between_store_and_send_leaves_its_messages_to_the_dispatcher() {
    let (store, clock) = store();
    let id = run_id("killed");
    let dying = executor(store.clone(), Hangs);
    let run = dying.run(&id, None, |ctx| async move {
        ctx.send(Message::new("events", "charged").header("tenant", "a"))?;
        Ok::<_, HandlerError>(42u32)
    });
    // The run stores its completion, then waits on the broker for ever:
    // the process is "killed" there (the future dropped).
    let stored = async {
        loop {
            if let Ok(Some(record)) = store.get(&id).await {
                if matches!(record.state, State::Completed { .. }) {
                    return;
                }
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::select! {
        _ = run => panic!("the run returned while its broker hangs"),
        () = stored => {}
    }

    let sender = MemorySender::new();
    let idem = executor(store.clone(), sender.clone());
    assert_eq!(
        idem.dispatch_pending().await.expect("a pass").runs,
        0,
        "the marker was still held"
    );
    clock.advance(LEASE);
    let pass = idem.dispatch_pending().await.expect("a pass");
    assert_eq!(
        (pass.pending, pass.runs, pass.messages),
        (1, 1, 1),
        "{pass:?}"
    );
    let sent = sender.messages();
    assert_eq!(sent[0].payload().as_ref(), b"charged");
    assert_eq!(sent[0].headers(), [("tenant".to_owned(), "a".to_owned())]);
    // The duplicate delivery is replayed, and sends nothing more.
    let again = idem
        .run(&id, None, |_| async { Ok::<_, HandlerError>(0u32) })
        .await
        .expect("replayed");
    assert_eq!(again, Outcome::Replayed { value: 42 });
    assert_eq!(sender.messages().len(), 1);
}

#[tokio::test]
async fn sealed_runs_keep_their_messages_sealed() {
    let (store, clock) = store();
    let keyring = idem::codec::Keyring::new("k1", [7; idem::codec::KEY_BYTES]).expect("keyring");
    let sender = MemorySender::new();
    let idem = Idempotency::builder(store.clone())
        .lease(LEASE)
        .keyring(keyring)
        .outbox(sender.clone())
        .build()
        .expect("a valid executor");
    let id = run_id("sealed");
    sender.fail(true);
    idem.run(&id, None, |ctx| async move {
        ctx.send(Message::new("card-events", "4111-1111-1111-1111"))?;
        Ok::<_, HandlerError>("ok".to_owned())
    })
    .await
    .expect("completes");
    let Some(State::Completed { response }) = store.get(&id).await.expect("get").map(|r| r.state)
    else {
        panic!("completed")
    };
    let text = String::from_utf8_lossy(&response);
    assert!(
        !text.contains("4111") && !text.contains("card-events"),
        "{text}"
    );
    sender.fail(false);
    clock.advance(LEASE);
    assert_eq!(idem.dispatch_pending().await.expect("a pass").messages, 1);
    assert_eq!(
        sender.messages()[0].payload().as_ref(),
        b"4111-1111-1111-1111"
    );
}

#[tokio::test]
async fn send_refuses_what_cannot_be_kept() {
    let (store, _) = store();
    let plain = Idempotency::builder(store.clone()).build().expect("config");
    let refused = plain
        .run(&run_id("no-outbox"), None, |ctx| async move {
            let refused = ctx.send(Message::new("events", "x"));
            assert!(matches!(refused, Err(SendError::NoOutbox)), "{refused:?}");
            Ok::<_, HandlerError>(())
        })
        .await;
    assert!(refused.is_ok());

    let sender = MemorySender::new();
    let idem = executor(store.clone(), sender.clone());
    let checks = idem
        .run(&run_id("bad"), None, |ctx| async move {
            let empty = ctx.send(Message::new("", "x")).map_err(|e| e.to_string());
            let control = ctx
                .send(Message::new("events", "x").header("bad\nname", "v"))
                .map_err(|e| e.to_string());
            let huge = ctx
                .send(Message::new("events", vec![0u8; MAX_MESSAGES_BYTES]))
                .map_err(|e| e.to_string());
            Ok::<_, HandlerError>((empty, control, huge))
        })
        .await
        .expect("completes");
    let (empty, control, huge) = checks.value().clone();
    assert!(empty.expect_err("empty").contains("destination is empty"));
    assert!(control.expect_err("control").contains("control character"));
    assert!(huge.expect_err("huge").contains("bytes allowed"));

    // Messages count against the response's limit: a run whose response
    // and messages do not fit is a terminal failure and sends nothing.
    let small = Idempotency::builder(store)
        .max_response_bytes(1024)
        .outbox(sender.clone())
        .build()
        .expect("config");
    let too_large = small
        .run(&run_id("large"), None, |ctx| async move {
            ctx.send(Message::new("events", vec![b'x'; 2000]))?;
            Ok::<_, HandlerError>("small".to_owned())
        })
        .await;
    assert!(
        matches!(
            too_large,
            Err(RunError::ResponseTooLarge { limit: 1024, .. })
        ),
        "{too_large:?}"
    );
    assert!(sender.messages().is_empty());
}

#[tokio::test]
async fn held_runs_and_unguarded_runs_send_too() {
    let (store, _) = store();
    let sender = MemorySender::new();
    let idem = executor(store, sender.clone());
    let id = run_id("held");
    let Begun::Held(run) = idem
        .begin::<String, HandlerError>(&id, None, None)
        .await
        .expect("claimed")
    else {
        panic!("the first claim holds")
    };
    run.context()
        .send(Message::new("events", "from a held run"))
        .expect("kept");
    run.complete::<_, HandlerError>("done".to_owned())
        .await
        .expect("stored");
    assert_eq!(sender.messages().len(), 1);
    let replay = idem
        .begin::<String, HandlerError>(&id, None, None)
        .await
        .expect("replayed");
    assert!(matches!(replay, Begun::Replayed(ref v) if v == "done"));
    assert_eq!(sender.messages().len(), 1);

    let open = Idempotency::builder(DownStore)
        .fail_open(true)
        .outbox(sender.clone())
        .build()
        .expect("config");
    let unguarded = open
        .run(&run_id("down"), None, |ctx| async move {
            ctx.send(Message::new("events", "store down"))?;
            Ok::<_, HandlerError>(())
        })
        .await
        .expect("runs unguarded");
    assert!(matches!(unguarded, Outcome::Unguarded { .. }));
    assert_eq!(sender.messages().len(), 2);
}

#[tokio::test]
async fn a_dispatched_run_is_sent_by_no_later_pass_or_replay() {
    let (store, clock) = store();
    let sender = MemorySender::new();
    let idem = executor(store.clone(), sender.clone());
    let id = run_id("raced");
    sender.fail(true);
    idem.run(&id, None, |ctx| async move {
        ctx.send(Message::new("events", "once"))?;
        Ok::<_, HandlerError>(())
    })
    .await
    .expect("completes");
    sender.fail(false);
    clock.advance(LEASE);
    assert_eq!(idem.dispatch_pending().await.expect("a pass").messages, 1);
    let pass = idem.dispatch_pending().await.expect("a pass");
    assert_eq!(pass.messages, 0);
    let replay = idem
        .run(&id, None, |_| async { Ok::<_, HandlerError>(()) })
        .await
        .expect("replayed");
    assert!(matches!(replay, Outcome::Replayed { .. }));
    assert_eq!(sender.messages().len(), 1);
}

#[tokio::test]
async fn a_send_after_the_run_ended_is_refused() {
    let (store, _) = store();
    let sender = MemorySender::new();
    let idem = executor(store, sender.clone());
    let (kept_tx, kept_rx) = tokio::sync::oneshot::channel();
    idem.run(&run_id("late"), None, |ctx| async move {
        kept_tx.send(ctx).expect("the test holds on");
        Ok::<_, HandlerError>(())
    })
    .await
    .expect("completes");
    let ctx = kept_rx.await.expect("the context");
    let late = ctx.send(Message::new("events", "too late"));
    assert!(matches!(late, Err(SendError::Ended)), "{late:?}");
    assert!(sender.messages().is_empty());
}

#[tokio::test]
async fn a_released_run_sends_nothing_and_refuses_later_sends() {
    let (store, _) = store();
    let sender = MemorySender::new();
    let idem = executor(store, sender.clone());
    let id = run_id("released");
    let Begun::Held(run) = idem
        .begin::<String, HandlerError>(&id, None, None)
        .await
        .expect("claimed")
    else {
        panic!("the first claim holds")
    };
    let ctx = run.context().clone();
    ctx.send(Message::new("events", "never")).expect("kept");
    run.release().await.expect("released");
    let late = ctx.send(Message::new("events", "too late"));
    assert!(matches!(late, Err(SendError::Ended)), "{late:?}");
    idem.run(&id, None, |_| async { Ok::<_, HandlerError>(()) })
        .await
        .expect("the next claim runs");
    assert!(sender.messages().is_empty(), "{:?}", sender.messages());
}

#[tokio::test]
async fn runs_whose_messages_a_dispatcher_elsewhere_sends_store_them_and_send_nothing() {
    let (store, clock) = store();
    let runs = Idempotency::builder(store.clone())
        .lease(LEASE)
        .replay_cache_bytes(0)
        .outbox_sent_elsewhere()
        .build()
        .expect("a valid executor");
    let id = run_id("sent-elsewhere");
    for _ in 0..2 {
        let outcome = runs
            .run(&id, None, |ctx| async move {
                ctx.send(Message::new("events", "charged"))?;
                Ok::<_, HandlerError>(7u32)
            })
            .await
            .expect("run, then replayed");
        assert!(matches!(
            outcome,
            Outcome::Executed { value: 7, .. } | Outcome::Replayed { value: 7 }
        ));
    }

    let sender = MemorySender::new();
    let dispatcher = executor(store.clone(), sender.clone());
    let pass = dispatcher.dispatch_pending().await.expect("a pass");
    assert_eq!(
        pass.runs, 0,
        "the run's marker is held for a lease: {pass:?}"
    );
    clock.advance(LEASE);
    let pass = dispatcher.dispatch_pending().await.expect("a pass");
    assert_eq!((pass.runs, pass.messages), (1, 1), "{pass:?}");
    assert_eq!(sender.messages()[0].payload().as_ref(), b"charged");
    clock.advance(LEASE * 2);
    let pass = dispatcher.dispatch_pending().await.expect("a pass");
    assert_eq!(pass.messages, 0, "sent once: {pass:?}");
    assert_eq!(sender.messages().len(), 1);
}

#[test]
fn an_outbox_sent_by_the_store_needs_a_store_that_takes_messages() {
    let refused = Idempotency::builder(MemoryStore::new())
        .outbox_sent_by_store()
        .build();
    assert!(
        matches!(refused, Err(idem::ConfigError::StoreSendsNoMessages)),
        "{:?}",
        refused.err()
    );
}

#[tokio::test]
async fn a_marker_whose_run_ended_without_completing_is_given_back_by_the_dispatcher() {
    let (store, clock) = store();
    let sender = MemorySender::new();
    let idem = executor(store.clone(), sender.clone());
    let id = run_id("refused");
    let params = idem::store::ClaimParams::new(LEASE, LEASE * 10);
    let idem::store::ClaimOutcome::Acquired(lease) =
        store.claim(&id, &params).await.expect("a claim")
    else {
        panic!("a fresh key is acquired");
    };
    // A server completing a caller's run holds the marker, then the
    // store refuses the completion and the run is ended as failed.
    let _marker = idem.hold_outbox_marker(&id).await;
    let failure = idem::Failure::new(idem::FailureClass::Terminal, "result refused");
    store
        .fail(&lease, failure, LEASE * 10)
        .await
        .expect("failed");

    clock.advance(LEASE);
    let pass = idem.dispatch_pending().await.expect("a pass");
    assert_eq!((pass.pending, pass.runs), (1, 0), "{pass:?}");
    clock.advance(LEASE * 2);
    let pass = idem.dispatch_pending().await.expect("a pass");
    assert_eq!(pass.pending, 0, "the marker was given back: {pass:?}");
    assert!(sender.messages().is_empty());
}
