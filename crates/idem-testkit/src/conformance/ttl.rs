//! How long a record has left (stores with `RecordTtl`).

use std::time::Duration;

use bytes::Bytes;

use super::{acquire, id, params, Fixture, Ttl, LONG};

/// For stores with [`RecordTtl`](idem::RecordTtl) (the cache tier's system
/// of record; not part of the suite, called by those stores' tests): the
/// time left is given only for a record completed with exactly the response
/// asked about, so a record deleted and claimed again since its response
/// was read is never cached under the new record's life.
pub async fn record_ttl_follows_the_response<S: Ttl>(f: &Fixture<S>) {
    let scope = f.scope("s");
    let p = params(f);
    let id = id(&scope, "ttl");
    assert_eq!(f.store.ttl(&id, b"old").await.expect("ttl"), None, "absent");
    let lease = acquire(f, &id, &p).await;
    assert_eq!(
        f.store.ttl(&id, b"old").await.expect("ttl"),
        None,
        "in progress"
    );
    f.store
        .complete(&lease, Bytes::from_static(b"old"), LONG)
        .await
        .expect("complete");
    let left = f.store.ttl(&id, b"old").await.expect("ttl");
    assert!(
        left.is_some_and(|left| left > LONG - Duration::from_secs(60) && left <= LONG),
        "completed with this response: about its retention left, got {left:?}"
    );
    assert_eq!(
        f.store.ttl(&id, b"other").await.expect("ttl"),
        None,
        "completed with another response"
    );
    assert!(f.store.delete(&id).await.expect("delete"));
    let _new_run = acquire(f, &id, &p).await;
    assert_eq!(
        f.store.ttl(&id, b"old").await.expect("ttl"),
        None,
        "deleted and claimed again: the old response's life is over"
    );
}
