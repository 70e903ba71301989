//! A response past the server's `max_allowed_packet` would make the
//! server drop the connection, which reads as "unavailable" (retried,
//! then left as a live claim that a takeover runs again). The store
//! declares its limit, so the executor refuses such a response before
//! sending it: the run is recorded failed, and a retry gets that failure.

mod common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};

use idem::{Idempotency, RecordId, RunError, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_past_the_packet_limit_fails_once_and_is_not_run_again() {
    let store = common::store("size").await;
    let limit = store
        .max_stored_bytes()
        .expect("the store declares its limit");
    assert!(
        limit < 16 << 20,
        "below the server's 16 MiB packet: {limit}"
    );
    // Allowed more than the store can keep, the executor still checks
    // each response against the store's limit before sending it.
    let idem = Idempotency::builder(store)
        .max_response_bytes(64 << 20)
        .compress_above(usize::MAX)
        .replay_cache_bytes(0)
        .build()
        .expect("valid");
    let runs = AtomicU32::new(0);
    let id = RecordId::parse("size", "big").expect("id");
    for attempt in 0..2 {
        let result = idem
            .run(&id, None, |_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Infallible>("x".repeat(17 << 20))
            })
            .await;
        match (attempt, result) {
            (0, Err(RunError::ResponseTooLarge { .. })) => {}
            (1, Err(RunError::Failed(failure))) => {
                assert!(failure.message.contains("exceeds the limit"), "{failure:?}");
            }
            (n, other) => panic!("attempt {n}: {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
}
