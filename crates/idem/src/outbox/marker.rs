//! Where the outbox keeps what is pending: for a run `(scope, key)` that
//! sent messages, a marker record `(idem.outbox/DIGEST, key)` — `DIGEST`
//! the first 16 bytes of SHA-256 of the scope, in hex — claimed before
//! the run's completion and completed (or released, by a dispatcher or a
//! replay) once its messages are confirmed; and
//! for each such scope, an entry `(idem.outbox, DIGEST)` completed with
//! the scope's name, through which the dispatcher finds the markers.

use sha2::{Digest as _, Sha256};

use crate::key::{Key, RecordId, Scope};

/// The scope of the entries naming the scopes that have markers.
pub(crate) const REGISTRY_SCOPE: &str = "idem.outbox";
/// What the scope of every marker begins with.
pub(crate) const MARKER_SCOPE_PREFIX: &str = "idem.outbox/";

fn digest(scope: &Scope) -> String {
    hex::encode(&Sha256::digest(scope.as_str().as_bytes())[..16])
}

/// The scope of the markers of runs in `scope`.
pub(crate) fn marker_scope(scope: &Scope) -> Scope {
    Scope::new(&format!("{MARKER_SCOPE_PREFIX}{}", digest(scope)))
        .expect("a fixed prefix and hex digits make a valid scope")
}

/// The marker of the run `run`: the run's key, in a scope of its own.
pub(crate) fn marker_id(run: &RecordId) -> RecordId {
    RecordId::new(marker_scope(run.scope()), run.key().clone())
}

/// The entry that names `scope` to the dispatcher.
pub(crate) fn registry_id(scope: &Scope) -> RecordId {
    RecordId::new(
        Scope::new(REGISTRY_SCOPE).expect("a valid scope"),
        Key::new(&digest(scope)).expect("hex digits make a valid key"),
    )
}

/// The run scope an entry of the registry names, if its bytes name one
/// whose digest is the entry's key.
pub(crate) fn run_scope_of(entry: &RecordId, named: &[u8]) -> Option<Scope> {
    let scope = Scope::new(std::str::from_utf8(named).ok()?).ok()?;
    (registry_id(&scope) == *entry).then_some(scope)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_and_entries_lead_back_to_the_run() {
        let run = RecordId::parse("POST /orders tenant=a", "order-7").expect("valid");
        let marker = marker_id(&run);
        assert!(marker.scope().as_str().starts_with(MARKER_SCOPE_PREFIX));
        assert_eq!(marker.key(), run.key());
        let entry = registry_id(run.scope());
        assert_eq!(entry.scope().as_str(), REGISTRY_SCOPE);
        assert_eq!(
            run_scope_of(&entry, run.scope().as_str().as_bytes()),
            Some(run.scope().clone())
        );
        assert_eq!(run_scope_of(&entry, b"another scope"), None);
        assert_eq!(
            marker_id(&RecordId::parse("POST /orders tenant=b", "order-7").expect("valid")).key(),
            run.key()
        );
        assert_ne!(
            marker_id(&RecordId::parse("POST /orders tenant=b", "order-7").expect("valid")),
            marker
        );
    }
}
