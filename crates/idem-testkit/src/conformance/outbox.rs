//! The outbox on a store: a run's messages are stored with its completion
//! (so they survive a dispatch that never happened), found again by the
//! dispatcher once the run's process is gone, and sent once per run
//! however many dispatchers look at the same time.

use std::collections::HashSet;
use std::sync::Arc;

use idem::outbox::{MemorySender, Message};
use idem::{HandlerError, Idempotency, Outcome, RecordId};

use super::{id, Admin, Fixture, LONG};

fn executor<S: Admin>(f: &Fixture<S>, sender: &MemorySender) -> Idempotency<Arc<S>> {
    Idempotency::builder(Arc::clone(&f.store))
        .lease(f.lease)
        .retention(LONG)
        .replay_cache_bytes(0)
        .outbox(sender.clone())
        .build()
        .expect("a valid executor")
}

async fn send_two<S>(idem: &Idempotency<S>, run: &RecordId, tag: &str) -> Outcome<String>
where
    S: idem::Store,
{
    let tag = tag.to_owned();
    idem.run(run, None, |ctx| async move {
        ctx.send(Message::new("events", format!("{tag}:1")).header("kind", "first"))?;
        ctx.send(Message::new("audit", format!("{tag}:2")))?;
        Ok::<_, HandlerError>(tag)
    })
    .await
    .expect("the run completes")
}

/// A run whose broker was away when it completed: its messages are in
/// the store with the completion, a replay while the marker is held does
/// not send them, and after the marker's lease runs out the dispatcher
/// sends both (ids stable, headers kept) and then nothing more.
pub async fn messages_are_stored_with_the_completion<S: Admin>(f: &Fixture<S>) {
    let scope = f.scope("outbox");
    let run = id(&scope, "order-1");
    let sender = MemorySender::new();
    let idem = executor(f, &sender);
    sender.fail(true);
    let first = send_two(&idem, &run, "order-1").await;
    assert!(matches!(first, Outcome::Executed { .. }), "{first:?}");
    assert!(sender.messages().is_empty());

    sender.fail(false);
    let again = send_two(&idem, &run, "never").await;
    assert_eq!(
        again,
        Outcome::Replayed {
            value: "order-1".to_owned()
        }
    );
    assert!(
        sender.messages().is_empty(),
        "a replay re-dispatched while the marker was still held"
    );
    let early = idem.dispatch_scope(&scope).await.expect("a pass");
    assert_eq!(
        early.runs, 0,
        "the dispatcher took a live marker: {early:?}"
    );

    f.advance(f.lease).await;
    let pass = idem.dispatch_scope(&scope).await.expect("a pass");
    assert_eq!((pass.runs, pass.messages), (1, 2), "{pass:?}");
    let sent = sender.messages();
    let bodies: Vec<_> = sent
        .iter()
        .map(|m| (m.destination(), m.payload().as_ref()))
        .collect();
    assert_eq!(
        bodies,
        [("events", &b"order-1:1"[..]), ("audit", &b"order-1:2"[..])]
    );
    assert_eq!(sent[0].headers(), [("kind".to_owned(), "first".to_owned())]);
    assert_eq!(sent[0].id().len(), 36, "ids are UUIDv7s: {}", sent[0].id());

    f.advance(f.lease).await;
    let after = idem.dispatch_scope(&scope).await.expect("a pass");
    assert_eq!(
        after.runs, 0,
        "a released marker was dispatched again: {after:?}"
    );
    send_two(&idem, &run, "never").await;
    assert_eq!(
        sender.messages().len(),
        2,
        "a replay after the dispatch sent again"
    );
}

/// A replay of a run whose marker's holder is gone re-dispatches its
/// messages (the same ids) itself, without waiting for a dispatcher.
pub async fn a_replay_redispatches_what_was_never_confirmed<S: Admin>(f: &Fixture<S>) {
    let scope = f.scope("outbox");
    let run = id(&scope, "order-2");
    let sender = MemorySender::new();
    let idem = executor(f, &sender);
    sender.fail(true);
    send_two(&idem, &run, "order-2").await;
    sender.fail(false);
    f.advance(f.lease).await;
    let replayed = send_two(&idem, &run, "never").await;
    assert_eq!(
        replayed,
        Outcome::Replayed {
            value: "order-2".to_owned()
        }
    );
    assert_eq!(sender.messages().len(), 2, "the replay did not re-dispatch");
    send_two(&idem, &run, "never").await;
    assert_eq!(sender.messages().len(), 2, "a second replay sent again");
}

/// Runs that send and runs that do not, several dispatchers at once on
/// the same store: each run's messages are sent exactly once, a run that
/// sent nothing leaves no marker.
pub async fn concurrent_dispatchers_send_each_run_once<S: Admin>(f: &Fixture<S>) {
    const RUNS: usize = 12;
    let scope = f.scope("outbox");
    let sender = MemorySender::new();
    let idem = executor(f, &sender);
    sender.fail(true);
    for n in 0..RUNS {
        let run = id(&scope, &format!("order-{n}"));
        if n % 3 == 0 {
            idem.run(&run, None, |_| async { Ok::<_, HandlerError>(()) })
                .await
                .expect("a run that sends nothing");
        } else {
            send_two(&idem, &run, &format!("order-{n}")).await;
        }
    }
    sender.fail(false);
    f.advance(f.lease).await;
    let passes = (0..4).map(|_| {
        let idem = executor(f, &sender);
        let scope = scope.clone();
        tokio::spawn(async move { idem.dispatch_scope(&scope).await.expect("a pass") })
    });
    let mut runs = 0;
    for pass in passes.collect::<Vec<_>>() {
        runs += pass.await.expect("the pass ran").runs;
    }
    let sending = (0..RUNS).filter(|n| n % 3 != 0).count();
    assert_eq!(runs, sending, "runs dispatched by all dispatchers together");
    let sent = sender.messages();
    assert_eq!(sent.len(), 2 * sending, "messages sent: {sent:?}");
    let ids: HashSet<_> = sent.iter().map(Message::id).collect();
    assert_eq!(ids.len(), sent.len(), "a message was sent twice");
}

/// A run whose messages were sent as it completed leaves nothing for a
/// dispatcher or a replay to send again, and once its record has expired
/// the same key runs again and sends its new messages: the marker the
/// first run confirmed is gone no later than its record.
pub async fn a_sent_run_leaves_nothing_pending_and_its_key_reused_sends_anew<S: Admin>(
    f: &Fixture<S>,
) {
    let scope = f.scope("outbox");
    let run = id(&scope, "order-3");
    let sender = MemorySender::new();
    let idem = Idempotency::builder(Arc::clone(&f.store))
        .lease(f.lease)
        .retention(f.lease * 3)
        .replay_cache_bytes(0)
        .outbox(sender.clone())
        .build()
        .expect("a valid executor");
    send_two(&idem, &run, "first").await;
    assert_eq!(sender.messages().len(), 2, "sent as the run completed");
    f.advance(f.lease).await;
    let pass = idem.dispatch_scope(&scope).await.expect("a pass");
    assert_eq!(
        (pass.pending, pass.runs),
        (0, 0),
        "a confirmed marker: {pass:?}"
    );
    send_two(&idem, &run, "never").await;
    assert_eq!(sender.messages().len(), 2, "a replay sent again");

    f.advance(f.lease * 3).await;
    let again = send_two(&idem, &run, "second").await;
    assert!(matches!(again, Outcome::Executed { .. }), "{again:?}");
    let payloads: Vec<_> = sender
        .messages()
        .iter()
        .map(|m| String::from_utf8_lossy(m.payload()).into_owned())
        .collect();
    assert_eq!(payloads, ["first:1", "first:2", "second:1", "second:2"]);
    f.advance(f.lease).await;
    let pass = idem.dispatch_scope(&scope).await.expect("a pass");
    assert_eq!(
        pass.runs, 0,
        "the second run's marker was confirmed: {pass:?}"
    );
}
