//! Stored HTTP responses read back as a replay: whatever bytes a record
//! holds (a damaged record, another writer's), the executor's envelope and
//! the gateway's codec answer a decode error or a response, never a panic
//! or an unbounded inflation; a decoded response encodes back to itself.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{Codec, Idempotency, MemoryStore, Outcome, RecordId, RunError, Store};
use idem_http::{Binary, StoredResponse};
use libfuzzer_sys::fuzz_target;

/// The most a replay may inflate to (the executor's `max_response_bytes`).
const LIMIT: usize = 1 << 16;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    runtime().block_on(async {
        let store = MemoryStore::new();
        let id = RecordId::parse("fuzz", "replay").expect("valid id");
        let keep = Duration::from_secs(60);
        let ClaimOutcome::Acquired(lease) = store
            .claim(&id, &ClaimParams::new(keep, keep))
            .await
            .expect("claim")
        else {
            panic!("a new key is acquired");
        };
        store
            .complete(&lease, Bytes::copy_from_slice(data), keep)
            .await
            .expect("complete");
        let idem = Idempotency::builder(store)
            .codec(Binary)
            .max_response_bytes(LIMIT)
            .build()
            .expect("config");
        let replay = idem
            .run(&id, None, |_| async {
                Err::<StoredResponse, _>(std::io::Error::other("a completed key never runs"))
            })
            .await;
        match replay {
            Ok(Outcome::Replayed { value }) => {
                let _ = value.to_response();
                let encoded = Binary.encode(&value).expect("encodes");
                let again: StoredResponse = Binary.decode(&encoded).expect("decodes");
                assert_eq!(again, value, "a decoded response encodes back to itself");
            }
            Err(RunError::Decode { .. }) => {}
            other => panic!("a stored record is replayed or refused as undecodable: {other:?}"),
        }
    });
});
