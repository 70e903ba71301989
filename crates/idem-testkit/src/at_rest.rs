//! The proof that a dump of a store shows neither payloads nor keys when
//! the executor seals and hashes (docs/design.md §11): [`write_secrets`]
//! runs a handler whose step result and response hold [`SECRETS`], under
//! a key that is one of them, with a keyring and a key secret; each
//! store's test then dumps the store its own way (SQL `SELECT *`, Redis
//! `SCAN` and every value, a DynamoDB scan, the SQLite file's bytes) and
//! calls [`assert_hidden`].

use std::convert::Infallible;

use idem::codec::{Keyring, KEY_BYTES};
use idem::key_hash::{KeyHasher, SECRET_BYTES};
use idem::step::Retry;
use idem::{Idempotency, RecordId, Store};

/// The key the client sends: an email, which a dump must not show.
pub const SECRET_KEY: &str = "customer-4242@example.com";

/// What a dump must not show, in any form: the key, a minted token (a
/// step's result) and a card number (the response).
pub const SECRETS: [&str; 3] = [SECRET_KEY, "tok_live_s3cret", "4242424242424242"];

/// Runs a sealed, key-hashed run in `scope` on `store` (a step that mints
/// a token, a response that holds a card number), then checks that it
/// replays whole: what a dump of the store must then hide.
pub async fn write_secrets<S: Store + Clone>(store: S, scope: &str) {
    let idem = Idempotency::builder(store)
        .replay_cache_bytes(0)
        .keyring(Keyring::new("dump-test", [0x6b; KEY_BYTES]).expect("a valid key"))
        .hash_keys(KeyHasher::new([0x6c; SECRET_BYTES]))
        .build()
        .expect("valid configuration");
    let id = RecordId::parse(scope, SECRET_KEY).expect("a valid id");
    for _ in 0..2 {
        let answer = idem
            .run(&id, None, |ctx| async move {
                let token: String = ctx
                    .step("mint", Retry, |_| async {
                        Ok::<_, Infallible>(SECRETS[1].to_owned())
                    })
                    .await
                    .expect("the step runs or replays");
                Ok::<_, Infallible>(serde_json::json!({ "token": token, "card": SECRETS[2] }))
            })
            .await
            .expect("runs, then replays")
            .into_value();
        assert_eq!(answer["card"], SECRETS[2], "the replay opens whole");
    }
}

/// Fails if `dump` shows any of [`SECRETS`], as text or as hex (SQL
/// dumps print bytes in hex); and if it does not show `scope`, which
/// stays readable: a dump that missed the record would prove nothing.
pub fn assert_hidden(dump: &[u8], scope: &str) {
    let shows = |needle: &[u8]| dump.windows(needle.len()).any(|w| w == needle);
    assert!(
        shows(scope.as_bytes()),
        "the dump ({} bytes) does not hold the record's scope {scope:?}: it missed the record",
        dump.len()
    );
    for secret in SECRETS {
        assert!(!shows(secret.as_bytes()), "the dump shows {secret:?}");
        let hex = hex_of(secret.as_bytes());
        assert!(!shows(hex.as_bytes()), "the dump shows {secret:?} in hex");
    }
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
