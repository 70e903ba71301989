//! The reply decoders, fed raw RESP bytes by the fuzz target
//! `fuzz/fuzz_targets/redis_reply.rs` (feature `fuzzing`; not an API).

use idem::{RecordId, StoreError};

use idem::store::LeaseToken;

/// Parses `resp` as one server reply and decodes it as each script's
/// reply would be. Every decoder answers a value or
/// [`StoreError::Corrupt`]; anything else (a panic, another error) is a
/// bug.
pub fn decode_reply(resp: &[u8]) {
    let Ok(reply) = redis::parse_redis_value(resp) else {
        return;
    };
    let id = RecordId::parse("fuzz", "reply").expect("a valid id");
    let corrupt_only = |error: StoreError| {
        assert!(
            matches!(error, StoreError::Corrupt { .. }),
            "a reply of the wrong shape is Corrupt, got {error:?}"
        );
    };
    let token = LeaseToken::from_u128(7);
    if let Err(e) = crate::encode::claim_outcome(&id, token, reply.clone()) {
        corrupt_only(e);
    }
    if let Err(e) = crate::encode::record(Some(&id), reply.clone()) {
        corrupt_only(e);
    }
    if let Err(e) = crate::encode::record(None, reply.clone()) {
        corrupt_only(e);
    }
    if let Err(e) = crate::encode::step_begin(&id, 2, reply.clone()) {
        corrupt_only(e);
    }
    if let Err(e) = crate::encode::steps(&id, reply.clone()) {
        corrupt_only(e);
    }
    if let Err(e) = crate::encode::resolved(&id, reply) {
        corrupt_only(e);
    }
}
