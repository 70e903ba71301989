//! The outbox on a store with a pending index: a sending run is marked
//! by its completion instead of holding a marker record, and a replay
//! re-sends what the record holds now.

mod common;

use idem::outbox::{MemorySender, Message};
use idem::{GetRecord, HandlerError, Idempotency, Outcome, State, Store};
use idem_testkit::doubles::{Double, Hooks};

use common::{executor, payloads, run_id, store, Hangs, LEASE};

/// Hides the memory store's pending index, as a store without one.
#[derive(Clone, Copy)]
struct NoIndex;

impl<S: Store> Hooks<S> for NoIndex {}

#[tokio::test]
async fn a_store_with_a_pending_index_marks_the_run_instead_of_writing_a_marker() {
    for indexed in [true, false] {
        let (store, clock) = store();
        let sender = MemorySender::new();
        sender.fail(true);
        let id = run_id("counted");
        let send_one = |ctx: idem::Context| async move {
            ctx.send(Message::new("events", "charged"))?;
            Ok::<_, HandlerError>(7u32)
        };
        let ran = if indexed {
            executor(store.clone(), sender.clone())
                .run(&id, None, send_one)
                .await
        } else {
            let idem = executor(Double::new(store.clone(), NoIndex), sender.clone());
            idem.run(&id, None, send_one).await
        };
        assert!(matches!(ran, Ok(Outcome::Executed { .. })), "{ran:?}");
        // The run's record and its scope's entry in the registry; a
        // marker record beside them only without the index.
        let records = if indexed { 2 } else { 3 };
        assert_eq!(store.len(), records, "indexed: {indexed}");

        // Either way the dispatcher finds the run once its hold ran out,
        // and sends it once.
        sender.fail(false);
        let idem = executor(store.clone(), sender.clone());
        clock.advance(LEASE);
        let pass = idem.dispatch_pending().await.expect("a pass");
        assert_eq!(
            (pass.runs, pass.messages),
            (1, 1),
            "indexed {indexed}: {pass:?}"
        );
        clock.advance(LEASE);
        let pass = idem.dispatch_pending().await.expect("a pass");
        assert_eq!(pass.runs, 0, "indexed {indexed}: {pass:?}");
        assert_eq!(sender.messages().len(), 1);
    }
}

#[tokio::test]
async fn a_replay_from_an_earlier_runs_cached_answer_sends_the_current_runs_messages() {
    let (store, clock) = store();
    let id = run_id("deleted-and-run-again");
    let sender = MemorySender::new();
    // This executor remembers the answers of the runs it completed.
    let caching = Idempotency::builder(store.clone())
        .lease(LEASE)
        .replay_cache_bytes(1 << 20)
        .outbox(sender.clone())
        .build()
        .expect("a valid executor");
    let send = |what: &'static str| {
        move |ctx: idem::Context| async move {
            ctx.send(Message::new("events", what))?;
            Ok::<_, HandlerError>(what.to_owned())
        }
    };
    caching.run(&id, None, send("first")).await.expect("runs");
    assert_eq!(payloads(&sender), ["first"]);

    // An operator deletes the record; another process runs the key again
    // and dies before its message is confirmed.
    assert!(idem::DeleteRecord::delete(&store, &id)
        .await
        .expect("deleted"));
    let dying = executor(store.clone(), Hangs);
    let second = dying.run(&id, None, send("second"));
    let stored = async {
        while !matches!(store.get(&id).await, Ok(Some(r)) if matches!(r.state, State::Completed { .. }))
        {
            tokio::task::yield_now().await;
        }
    };
    tokio::select! {
        _ = second => panic!("the run returned while its broker hangs"),
        () = stored => {}
    }
    clock.advance(LEASE);

    // A duplicate reaches the first executor, which answers from its
    // cache with the first run's bytes: what it sends again is the
    // second run's message, the one never confirmed.
    let replayed = caching
        .run(&id, None, send("never"))
        .await
        .expect("replayed");
    assert_eq!(
        replayed,
        Outcome::Replayed {
            value: "first".to_owned()
        }
    );
    assert_eq!(payloads(&sender), ["first", "second"]);
    clock.advance(LEASE);
    let pass = caching.dispatch_pending().await.expect("a pass");
    assert_eq!(pass.runs, 0, "the second run's mark was left: {pass:?}");
}
