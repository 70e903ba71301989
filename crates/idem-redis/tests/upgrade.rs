//! Records that builds before 2026-11-26 kept as hashes (the packed fields
//! in `m`, the response in `rs`, each step in `j:<name>`) still count after
//! an upgrade: a completed one replays, a parked journal is found again,
//! and the first write turns the record into today's string, its journal
//! moved beside it, without losing the key's expiry.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod common;

use bytes::Bytes;
use common::query;
use idem::store::{ClaimOutcome, ClaimParams, StepBegin};
use idem::{GetRecord, RecordId, State, StepJournal, Store};

fn params() -> ClaimParams {
    ClaimParams::new(Duration::from_secs(30), Duration::from_secs(3600))
}

fn now_ms() -> f64 {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis();
    u64::try_from(ms).expect("fits") as f64
}

/// A record as the earlier builds packed it into the hash field `m`
/// (their `lua/prelude.lua`), with no fingerprint and no failure.
struct Old<'a> {
    st: u8,
    attempt: u32,
    fence: f64,
    retention_until: f64,
    lease_until: f64,
    token: &'a str,
    id: &'a RecordId,
}

impl Old<'_> {
    fn packed(&self) -> Vec<u8> {
        let mut m = vec![self.st];
        m.extend(self.attempt.to_be_bytes());
        let created = now_ms() - 10_000.0;
        for n in [
            self.fence,
            created,
            created,
            self.retention_until,
            self.lease_until,
        ] {
            m.extend(n.to_be_bytes());
        }
        let short = |m: &mut Vec<u8>, text: &str| {
            m.push(u8::try_from(text.len()).expect("short"));
            m.extend(text.as_bytes());
        };
        short(&mut m, self.token);
        short(&mut m, "");
        short(&mut m, "");
        for text in ["", self.id.scope().as_str(), self.id.key().as_str()] {
            m.extend(u32::try_from(text.len()).expect("short").to_be_bytes());
            m.extend(text.as_bytes());
        }
        m
    }
}

/// Writes the hash an earlier build would hold for `old`, with further
/// fields, and gives it an expiry a minute past its retention.
async fn write_old(key: &str, old: &Old<'_>, fields: &[(&str, &[u8])]) {
    let mut hset = redis::cmd("HSET");
    hset.arg(key).arg("m").arg(old.packed());
    for (field, value) in fields {
        hset.arg(*field).arg(*value);
    }
    let _: i64 = query(&hset).await;
    let until = format!("{}", old.retention_until + 60_000.0);
    let _: i64 = query(redis::cmd("PEXPIREAT").arg(key).arg(until)).await;
}

async fn key_type(key: &str) -> String {
    let value: redis::Value = query(redis::cmd("TYPE").arg(key)).await;
    match value {
        redis::Value::SimpleString(t) => t,
        other => panic!("TYPE replied {other:?}"),
    }
}

#[tokio::test]
async fn a_completed_hash_record_replays_and_stays_as_it_is() {
    let store = common::store("upgrade").await;
    let id = RecordId::parse("orders", "order-1").expect("valid");
    let key = store.record_key(&id);
    let old = Old {
        st: b'c',
        attempt: 1,
        fence: 7.0,
        retention_until: now_ms() + 3_600_000.0,
        lease_until: 0.0,
        token: "",
        id: &id,
    };
    write_old(&key, &old, &[("rs", b"ch_1")]).await;
    let before: Vec<u8> = query(redis::cmd("DUMP").arg(&key)).await;

    let claim = store.claim(&id, &params()).await.expect("claim");
    assert!(
        matches!(&claim, ClaimOutcome::Completed(r) if r == &Bytes::from_static(b"ch_1")),
        "{claim:?}"
    );
    let record = store.get(&id).await.expect("get").expect("present");
    assert!(
        matches!(&record.state, State::Completed { response, .. } if response == &Bytes::from_static(b"ch_1")),
        "{record:?}"
    );
    let after: Vec<u8> = query(redis::cmd("DUMP").arg(&key)).await;
    assert_eq!(before, after, "a replay writes nothing");
}

#[tokio::test]
async fn an_abandoned_hash_record_is_taken_over_with_its_journal() {
    let store = common::store("upgrade").await;
    let id = RecordId::parse("orders", "order-2").expect("valid");
    let key = store.record_key(&id);
    let old = Old {
        st: b'p',
        attempt: 1,
        fence: 7.0,
        retention_until: now_ms() + 3_600_000.0,
        lease_until: now_ms() - 1_000.0,
        token: "0123456789abcdef0123456789abcdef",
        id: &id,
    };
    write_old(&key, &old, &[("j:charge", b"dch_1"), ("j:ship", b"s1")]).await;
    let old_expiry: i64 = query(redis::cmd("PEXPIRETIME").arg(&key)).await;

    let lease = match store.claim(&id, &params()).await.expect("claim") {
        ClaimOutcome::Acquired(lease) => lease,
        other => panic!("expected a takeover, got {other:?}"),
    };
    assert!(lease.takeover, "{lease:?}");
    assert_eq!(lease.attempt, 2);
    assert!(lease.fence > 7, "fences rise past the old record's");
    assert_eq!(
        key_type(&key).await,
        "string",
        "the write turned it into a string"
    );
    let expiry: i64 = query(redis::cmd("PEXPIRETIME").arg(&key)).await;
    assert!(expiry >= old_expiry, "{expiry} < {old_expiry}");

    assert_eq!(
        store.begin_step(&lease, "charge").await.expect("begin"),
        StepBegin::Done(Bytes::from_static(b"ch_1")),
        "the finished step is found in the moved journal"
    );
    assert_eq!(
        store.begin_step(&lease, "ship").await.expect("begin"),
        StepBegin::InDoubt { attempt: 1 }
    );
    let journals: Vec<String> = query(redis::cmd("KEYS").arg(format!("{key}:j*"))).await;
    assert_eq!(journals, [format!("{key}:j")], "the declared journal alone");
    let journal_expiry: i64 = query(redis::cmd("PEXPIRETIME").arg(&journals[0])).await;
    assert_eq!(journal_expiry, expiry, "the journal goes with the record");

    store
        .complete(
            &lease,
            Bytes::from_static(b"ch_1"),
            Duration::from_secs(3600),
        )
        .await
        .expect("complete");
    let completed: i64 = query(redis::cmd("PEXPIRETIME").arg(&key)).await;
    let journal_expiry: i64 = query(redis::cmd("PEXPIRETIME").arg(&journals[0])).await;
    assert_eq!(
        journal_expiry, completed,
        "the journal follows the record's new expiry"
    );
    assert!(matches!(
        store.claim(&id, &params()).await.expect("claim"),
        ClaimOutcome::Completed(r) if r == Bytes::from_static(b"ch_1")
    ));
}

#[tokio::test]
async fn a_new_record_on_the_same_key_starts_an_empty_journal() {
    let store = common::store("upgrade").await;
    let id = RecordId::parse("orders", "order-3").expect("valid");
    let short = ClaimParams::new(Duration::from_millis(300), Duration::from_millis(300));
    let ClaimOutcome::Acquired(first) = store.claim(&id, &short).await.expect("claim") else {
        panic!("a fresh key is acquired");
    };
    assert_eq!(
        store.begin_step(&first, "charge").await.expect("begin"),
        StepBegin::Fresh
    );
    store
        .finish_step(&first, "charge", Bytes::from_static(b"\"ch_1\""))
        .await
        .expect("finish");
    tokio::time::sleep(Duration::from_millis(400)).await;

    let ClaimOutcome::Acquired(second) = store.claim(&id, &params()).await.expect("claim") else {
        panic!("an expired record is claimed anew");
    };
    assert_eq!(second.attempt, 1, "a new record");
    assert_eq!(
        store.begin_step(&second, "charge").await.expect("begin"),
        StepBegin::Fresh,
        "the old record's journal is not the new one's"
    );
    let key = store.record_key(&id);
    let journals: Vec<String> = query(redis::cmd("KEYS").arg(format!("{key}:j*"))).await;
    assert_eq!(
        journals,
        [format!("{key}:j")],
        "the old journal went with its record"
    );
}

/// Builds before 2026-11-27 named a record's journal after its generation
/// (`<record>:j:<fence of its first claim>`); such a journal is found,
/// and moved to the name the scripts declare.
#[tokio::test]
async fn a_journal_under_its_generations_name_is_found_and_moved() {
    let store = common::store("upgrade").await;
    let id = RecordId::parse("orders", "order-4").expect("valid");
    let ClaimOutcome::Acquired(lease) = store.claim(&id, &params()).await.expect("claim") else {
        panic!("a fresh key is acquired");
    };
    store.begin_step(&lease, "charge").await.expect("begin");
    store
        .finish_step(&lease, "charge", Bytes::from_static(b"\"ch_1\""))
        .await
        .expect("finish");
    let key = store.record_key(&id);
    let old_name = format!("{key}:j:{}", lease.fence);
    let _: () = query(redis::cmd("RENAME").arg(format!("{key}:j")).arg(&old_name)).await;

    assert_eq!(
        store.begin_step(&lease, "charge").await.expect("begin"),
        StepBegin::Done(Bytes::from_static(b"\"ch_1\"")),
        "the step journaled under the old name is found"
    );
    let journals: Vec<String> = query(redis::cmd("KEYS").arg(format!("{key}:j*"))).await;
    assert_eq!(journals, [format!("{key}:j")], "moved to the declared name");
}
