//! Sealing at rest through the executor: keys rotate without a flag day,
//! a record sealed under a key the keyring no longer holds is a clear
//! decode error (never a second run), durable inputs are sealed too, and
//! a store that re-encodes responses refuses a keyring.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem::codec::{Keyring, KEY_BYTES};
use idem::{ConfigError, GetRecord, Idempotency, MemoryStore, RecordId, RunError, State};
use idem_testkit::doubles::{Double, Hooks};

fn keys(text: &[(&str, u8)]) -> Keyring {
    let mut ring = Keyring::new(text[0].0, [text[0].1; KEY_BYTES]).expect("key");
    for (id, byte) in &text[1..] {
        ring = ring.with_key(id, [*byte; KEY_BYTES]).expect("key");
    }
    ring
}

fn executor(store: &MemoryStore, keyring: Option<Keyring>) -> Idempotency<MemoryStore> {
    let mut builder = Idempotency::builder(store.clone()).replay_cache_bytes(0);
    if let Some(keyring) = keyring {
        builder = builder.keyring(keyring);
    }
    builder.build().expect("valid configuration")
}

#[tokio::test]
async fn keys_rotate_and_a_missing_key_is_a_decode_error_not_a_rerun() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicU32::new(0));
    let run = |idem: Idempotency<MemoryStore>, key: &'static str| {
        let runs = runs.clone();
        async move {
            let id = RecordId::parse("pay", key).expect("id");
            idem.run(&id, None, |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Infallible>(format!("receipt for {key}"))
            })
            .await
        }
    };
    let old = executor(&store, Some(keys(&[("2026-05", 1)])));
    assert!(!run(old, "a").await.expect("runs").is_replayed());
    let plain = executor(&store, None);
    assert!(!run(plain, "b").await.expect("runs").is_replayed());

    // The new key seals; the old one still opens; so do records stored
    // before sealing was turned on.
    let rotated = executor(&store, Some(keys(&[("2026-11", 2), ("2026-05", 1)])));
    for key in ["a", "b"] {
        let outcome = run(rotated.clone(), key).await.expect("replays");
        assert!(outcome.is_replayed());
        assert_eq!(outcome.into_value(), format!("receipt for {key}"));
    }
    assert!(!run(rotated, "c").await.expect("runs").is_replayed());
    let record = store
        .get(&RecordId::parse("pay", "c").expect("id"))
        .await
        .expect("get")
        .expect("a record");
    let State::Completed { response } = &record.state else {
        panic!("completed expected");
    };
    assert_eq!(
        &response[..9],
        b"\x02\x072026-11",
        "sealed under the new key's id"
    );

    // The old key dropped: its records do not open, and nothing runs again.
    let dropped = executor(&store, Some(keys(&[("2026-11", 2)])));
    match run(dropped, "a").await {
        Err(RunError::Decode { reason }) => {
            assert!(
                reason.contains("\"2026-05\""),
                "names the missing key: {reason}"
            );
        }
        other => panic!("expected a decode error, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3, "one run per key, ever");
}

/// A store that keeps responses in another form (as the remote store
/// keeps JSON).
struct ReEncodes;

impl Hooks<MemoryStore> for ReEncodes {
    fn keeps_bytes(&self, _: &MemoryStore) -> bool {
        false
    }
}

#[test]
fn a_store_that_re_encodes_responses_refuses_a_keyring() {
    let store = Double::new(MemoryStore::new(), ReEncodes);
    let refused = Idempotency::builder(store)
        .keyring(keys(&[("k", 1)]))
        .build()
        .expect_err("refused");
    assert_eq!(refused, ConfigError::SealingUnsupported);
}

#[tokio::test]
async fn hashed_keys_are_what_the_store_holds_and_callers_never_see_them() {
    use idem::key_hash::{is_hashed, KeyHasher, SECRET_BYTES};
    use idem::{ListQuery, ListRecords};

    let store = MemoryStore::new();
    let idem = Idempotency::builder(store.clone())
        .replay_cache_bytes(0)
        .hash_keys(KeyHasher::new([4; SECRET_BYTES]))
        .build()
        .expect("valid configuration");
    let id = RecordId::parse("pay", "customer@example.com").expect("id");
    let runs = &AtomicU32::new(0);
    for _ in 0..2 {
        let value = idem
            .run(&id, None, |ctx| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let charge: String = ctx
                    .step("charge", idem::step::Retry, |_| async {
                        Ok::<_, Infallible>("ch_1".to_owned())
                    })
                    .await
                    .expect("step");
                Ok::<_, Infallible>(charge)
            })
            .await
            .expect("runs or replays")
            .into_value();
        assert_eq!(value, "ch_1");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let page = store
        .list(&ListQuery {
            state: None,
            scope: None,
            after: None,
            limit: 10,
        })
        .await
        .expect("list");
    assert_eq!(page.records.len(), 1);
    let (stored, _) = &page.records[0];
    assert!(is_hashed(stored.key()), "stored as {stored}");
    assert_eq!(stored, &*idem.stored_id(&id));
    assert!(
        store.get(&id).await.expect("get").is_none(),
        "not under the clear key"
    );
    assert!(
        idem.delete(&id).await.expect("delete"),
        "callers name records by their clear key"
    );
    assert!(store
        .get(&idem.stored_id(&id))
        .await
        .expect("get")
        .is_none());
}
