//! The executor's replay cache over the real in-memory store: duplicates
//! of runs completed here are answered without a claim reaching the store,
//! never past the record's retention (on tokio's clock or the store's),
//! never for another fingerprint, and never after a delete made through
//! the executor.
//!
//! Time runs on tokio's paused clock, with the store's clock driven by it
//! or moved by hand.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{
    ClaimMany, CompleteMany, DeleteRecord, Fingerprint, Idempotency, ManualClock, MemoryStore,
    Outcome, RecordId, RunError, Store, StoreError, Timestamp,
};

use idem::store::{ClaimOutcome, ClaimParams};
use idem_testkit::doubles::{Double, Hooks, ManyHooks};
use idem_testkit::TokioClock;

type Io = std::io::Error;

fn id(key: &str) -> RecordId {
    RecordId::parse("tests", key).expect("valid id")
}

/// Counts the claims that reach the store.
#[derive(Default, Clone)]
struct Claims(Arc<AtomicU32>);

impl Claims {
    fn seen(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
}

impl<S: Store> Hooks<S> for Claims {
    async fn claim(
        &self,
        inner: &S,
        id: &RecordId,
        params: &ClaimParams,
    ) -> Result<ClaimOutcome, StoreError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        inner.claim(id, params).await
    }
}

impl<S: ClaimMany + CompleteMany> ManyHooks<S> for Claims {
    async fn claim_many(
        &self,
        inner: &S,
        claims: &[(RecordId, ClaimParams)],
    ) -> Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError> {
        self.0.fetch_add(claims.len() as u32, Ordering::SeqCst);
        inner.claim_many(claims).await
    }
}

/// A store on tokio's clock that counts the claims reaching it.
fn counted() -> (Double<MemoryStore<TokioClock>, Claims>, Claims) {
    let claims = Claims::default();
    let store = Double::new(
        MemoryStore::builder().clock(TokioClock::new()).build(),
        claims.clone(),
    );
    (store, claims)
}

/// Runs `key` with `fingerprint`, counting executions in `runs`: the value
/// and whether it ran.
async fn run<S: Store>(
    idem: &Idempotency<S>,
    key: &str,
    fingerprint: Option<Fingerprint>,
    runs: &AtomicU32,
) -> Result<(u32, bool), RunError<Io>> {
    let outcome = idem
        .run(&id(key), fingerprint, |_| async {
            Ok::<_, Io>(runs.fetch_add(1, Ordering::SeqCst) + 1)
        })
        .await?;
    Ok(match outcome {
        Outcome::Executed { value, .. } => (value, true),
        Outcome::Replayed { value } => (value, false),
        other => panic!("unexpected {other:?}"),
    })
}

#[tokio::test(start_paused = true)]
async fn duplicates_of_a_run_completed_here_do_not_reach_the_store() {
    let (store, claims) = counted();
    let idem = Idempotency::builder(store).build().expect("config");
    let runs = AtomicU32::new(0);
    let fp = Some(Fingerprint::of_bytes(b"order"));
    assert_eq!(run(&idem, "k", fp, &runs).await.expect("run"), (1, true));
    assert_eq!(claims.seen(), 1);
    for _ in 0..5 {
        assert_eq!(
            run(&idem, "k", fp, &runs).await.expect("replay"),
            (1, false)
        );
    }
    assert_eq!(claims.seen(), 1, "replays answered from memory");

    // Another fingerprint is the store's to judge: a mismatch.
    let other = run(&idem, "k", Some(Fingerprint::of_bytes(b"else")), &runs).await;
    assert!(matches!(other, Err(RunError::Mismatch)), "{other:?}");
    assert_eq!(claims.seen(), 2);

    // Past the cache's 60 s, the store is asked again (and still replays).
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(
        run(&idem, "k", fp, &runs).await.expect("replay"),
        (1, false)
    );
    assert_eq!(claims.seen(), 3);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_delete_through_the_executor_lets_the_key_run_again_at_once() {
    let store = MemoryStore::builder().clock(TokioClock::new()).build();
    let idem = Idempotency::builder(store.clone()).build().expect("config");
    let runs = AtomicU32::new(0);
    assert_eq!(run(&idem, "k", None, &runs).await.expect("run"), (1, true));

    // Deleted behind the executor's back: replayed from memory until the
    // cache's TTL (documented), never run twice meanwhile.
    assert!(store.delete(&id("k")).await.expect("delete"));
    assert_eq!(
        run(&idem, "k", None, &runs).await.expect("replay"),
        (1, false)
    );

    // `forget` drops it: the key runs again.
    idem.forget(&id("k"));
    assert_eq!(run(&idem, "k", None, &runs).await.expect("run"), (2, true));

    // `delete` removes the record and the memory of it together.
    assert!(idem.delete(&id("k")).await.expect("delete"));
    assert_eq!(run(&idem, "k", None, &runs).await.expect("run"), (3, true));
    assert_eq!(
        run(&idem, "k", None, &runs).await.expect("replay"),
        (3, false)
    );
}

#[tokio::test(start_paused = true)]
async fn never_past_the_retention_on_tokio_time() {
    let store = MemoryStore::builder().clock(TokioClock::new()).build();
    let idem = Idempotency::builder(store)
        .retention(Duration::from_secs(40))
        .build()
        .expect("config");
    let runs = AtomicU32::new(0);
    assert_eq!(run(&idem, "k", None, &runs).await.expect("run"), (1, true));
    tokio::time::advance(Duration::from_secs(39)).await;
    assert_eq!(
        run(&idem, "k", None, &runs).await.expect("replay"),
        (1, false)
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(run(&idem, "k", None, &runs).await.expect("run"), (2, true));
}

#[tokio::test(start_paused = true)]
async fn a_store_clock_moved_past_the_retention_ends_the_memory_too() {
    // The store's clock jumps while tokio's stands still: the record has
    // expired for the store, so the cache must not answer for it.
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let idem = Idempotency::builder(store)
        .retention(Duration::from_secs(3600))
        .build()
        .expect("config");
    let runs = AtomicU32::new(0);
    assert_eq!(run(&idem, "k", None, &runs).await.expect("run"), (1, true));
    clock.advance(Duration::from_secs(3599));
    assert_eq!(
        run(&idem, "k", None, &runs).await.expect("replay"),
        (1, false)
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(run(&idem, "k", None, &runs).await.expect("run"), (2, true));
}

#[tokio::test(start_paused = true)]
async fn turned_off_every_duplicate_asks_the_store() {
    let (store, claims) = counted();
    let idem = Idempotency::builder(store)
        .replay_cache_bytes(0)
        .build()
        .expect("config");
    let runs = AtomicU32::new(0);
    for _ in 0..3 {
        run(&idem, "k", None, &runs).await.expect("run");
    }
    assert_eq!(claims.seen(), 3);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn claims_made_ahead_take_remembered_replays_from_memory() {
    let (store, claims) = counted();
    let idem = Idempotency::builder(store).build().expect("config");
    let runs = AtomicU32::new(0);
    run(&idem, "done", None, &runs).await.expect("run");
    let seen = claims.seen();
    let ahead = idem
        .claim_ahead(vec![(id("done"), None), (id("new"), None)])
        .await;
    let mut results = Vec::new();
    for claimed in ahead {
        let outcome = idem
            .run_claimed(claimed, |_| async {
                Ok::<_, Io>(runs.fetch_add(1, Ordering::SeqCst) + 1)
            })
            .await
            .expect("run");
        results.push(outcome);
    }
    assert_eq!(results[0], Outcome::Replayed { value: 1 });
    assert!(matches!(results[1], Outcome::Executed { value: 2, .. }));
    // Only the new key was asked.
    assert_eq!(claims.seen(), seen + 1);
}
