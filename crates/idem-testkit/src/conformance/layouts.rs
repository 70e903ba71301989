//! What a store keeps of payloads: the layouts earlier builds wrote come
//! back byte for byte and replay, and sealed payloads show none of what
//! they hold (docs/design.md §11). Run in the `core` and `steps` groups.

use std::convert::Infallible;

use bytes::Bytes;
use idem::codec::{Keyring, KEY_BYTES};
use idem::store::ClaimOutcome;
use idem::{Idempotency, State, StepState};

use super::{acquire, id, params, Core, Fixture, Steps, LONG};
use crate::fixtures;

/// A secret a handler returns; no store may show it once sealed.
const SECRET: &str = "sk_live_4242_secret";

fn keyring() -> Keyring {
    Keyring::new("conformance", [0x5a; KEY_BYTES]).expect("a valid key")
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// A response stored in any layout an earlier build wrote comes back
/// byte for byte, and the executor replays it, with or without a
/// keyring (records from before encryption stay readable).
pub async fn earlier_response_layouts_replay<S: Core>(f: &Fixture<S>) {
    let p = params(f);
    for (name, bytes) in fixtures::RESPONSES {
        let id = id(&f.scope("layouts"), name);
        let lease = acquire(f, &id, &p).await;
        f.store
            .complete(&lease, Bytes::from_static(bytes), LONG)
            .await
            .expect("complete");
        match f.store.claim(&id, &p).await.expect("claim") {
            ClaimOutcome::Completed(stored) => {
                assert_eq!(
                    stored.as_ref(),
                    bytes,
                    "{name} must come back byte for byte"
                );
            }
            other => panic!("{name}: expected the stored response, got {other:?}"),
        }
    }
    let json = id(&f.scope("layouts"), "json-response");
    let expected: serde_json::Value =
        serde_json::from_str(fixtures::JSON_RESPONSE_VALUE).expect("fixture is JSON");
    for sealing in [false, true] {
        let mut builder = Idempotency::builder(f.store.clone()).replay_cache_bytes(0);
        if sealing {
            builder = builder.keyring(keyring());
        }
        let idem = builder.build().expect("valid configuration");
        let outcome = idem
            .run(&json, None, |_| async {
                Ok::<_, Infallible>(serde_json::json!("must not run"))
            })
            .await
            .expect("replays");
        assert!(
            outcome.is_replayed(),
            "a stored record is replayed, never run"
        );
        assert_eq!(outcome.into_value(), expected, "sealing: {sealing}");
    }
}

/// With a keyring, the stored response holds none of the handler's
/// answer, and the executor replays it whole.
pub async fn sealed_responses_show_nothing<S: Core>(f: &Fixture<S>) {
    let id = id(&f.scope("sealed"), "k");
    let idem = Idempotency::builder(f.store.clone())
        .replay_cache_bytes(0)
        .keyring(keyring())
        .build()
        .expect("valid configuration");
    let answer = serde_json::json!({ "token": SECRET, "padding": "x".repeat(2048) });
    let first = idem
        .run(&id, None, |_| async { Ok::<_, Infallible>(answer.clone()) })
        .await
        .expect("runs");
    assert!(!first.is_replayed());
    let record = f.store.get(&id).await.expect("get").expect("a record");
    let State::Completed { response } = &record.state else {
        panic!("expected a completed record, got {:?}", record.state);
    };
    assert!(
        !contains(response, SECRET) && !contains(response, "padding"),
        "the stored response must be sealed"
    );
    let again = idem
        .run(&id, None, |_| async {
            Ok::<_, Infallible>(serde_json::json!("must not run"))
        })
        .await
        .expect("replays");
    assert!(again.is_replayed());
    assert_eq!(again.into_value(), answer);
}

/// A step result journaled bare (every build before sealing) comes back
/// byte for byte and is replayed by an executor with a keyring; a step
/// sealed now shows nothing of its result in the journal.
pub async fn step_layouts_replay_and_sealed_steps_show_nothing<S: Steps>(f: &Fixture<S>) {
    let id = id(&f.scope("steps"), "k");
    let p = params(f);
    let lease = acquire(f, &id, &p).await;
    assert_eq!(
        f.store.begin_step(&lease, "charge").await.expect("begin"),
        idem::store::StepBegin::Fresh
    );
    f.store
        .finish_step(
            &lease,
            "charge",
            Bytes::from_static(fixtures::STEP_RESULT_BARE_JSON),
        )
        .await
        .expect("finish");
    f.store.release(&lease).await.expect("release");

    let idem = Idempotency::builder(f.store.clone())
        .replay_cache_bytes(0)
        .keyring(keyring())
        .build()
        .expect("valid configuration");
    let value = idem
        .run(&id, None, |ctx| async move {
            let charge: serde_json::Value = ctx
                .step("charge", idem::step::Retry, |_| async {
                    Ok::<_, Infallible>(serde_json::json!("must not run"))
                })
                .await
                .expect("replayed");
            let token: String = ctx
                .step("mint", idem::step::Retry, |_| async {
                    Ok::<_, Infallible>(SECRET.to_owned())
                })
                .await
                .expect("runs");
            Ok::<_, Infallible>((charge, token))
        })
        .await
        .expect("runs")
        .into_value();
    let expected: serde_json::Value =
        serde_json::from_slice(fixtures::STEP_RESULT_BARE_JSON).expect("fixture is JSON");
    assert_eq!(value, (expected, SECRET.to_owned()));
    let steps = f.store.steps(&id).await.expect("steps");
    let result = |name: &str| match steps.iter().find(|s| s.name == name).map(|s| &s.state) {
        Some(StepState::Done { result }) => result.clone(),
        other => panic!("step {name}: expected done, got {other:?}"),
    };
    assert_eq!(
        result("charge").as_ref(),
        fixtures::STEP_RESULT_BARE_JSON,
        "a replayed step is not rewritten"
    );
    assert!(
        !contains(&result("mint"), SECRET),
        "a sealed step shows nothing"
    );
}
