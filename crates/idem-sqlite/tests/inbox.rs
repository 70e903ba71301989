//! The transactional inbox with real concurrent connections to one file.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use idem::{Fingerprint, ManualClock, RecordId};
use idem_sqlite::inbox::{Inbox, InboxError, InboxOutcome};
use rusqlite::{Connection, TransactionBehavior};

const KEEP: Duration = Duration::from_secs(3600);

fn database() -> std::path::PathBuf {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("tempdir")
        .keep();
    let path = dir.join("app.db");
    let conn = connect(&path);
    conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE ledger (msg TEXT NOT NULL, worker INTEGER NOT NULL)")
        .expect("schema");
    Inbox::new(KEEP).setup(&conn).expect("inbox setup");
    path
}

fn connect(path: &std::path::Path) -> Connection {
    let conn = Connection::open(path).expect("open");
    conn.busy_timeout(Duration::from_secs(30))
        .expect("busy timeout");
    conn
}

fn id(msg: usize) -> RecordId {
    RecordId::parse("orders-consumer", &format!("msg-{msg}")).expect("valid")
}

#[test]
fn concurrent_duplicates_commit_their_effect_exactly_once() {
    const MESSAGES: usize = 200;
    const WORKERS: usize = 8;
    let path = database();
    let barrier = Arc::new(Barrier::new(WORKERS));
    let fresh = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (path, barrier, fresh) = (path.clone(), Arc::clone(&barrier), Arc::clone(&fresh));
            std::thread::spawn(move || {
                let mut conn = connect(&path);
                let inbox = Inbox::new(KEEP);
                barrier.wait();
                for i in 0..MESSAGES {
                    let msg = (i + w * 29) % MESSAGES;
                    let tx = conn
                        .transaction_with_behavior(TransactionBehavior::Immediate)
                        .expect("begin");
                    match inbox.claim(&tx, &id(msg), None).expect("claim") {
                        InboxOutcome::New => {
                            tx.execute(
                                "INSERT INTO ledger (msg, worker) VALUES (?1, ?2)",
                                (msg.to_string(), w as i64),
                            )
                            .expect("effect");
                            inbox
                                .set_response(&tx, &id(msg), format!("done by {w}").as_bytes())
                                .expect("response");
                            tx.commit().expect("commit");
                            fresh.fetch_add(1, Ordering::SeqCst);
                        }
                        InboxOutcome::Duplicate { response } => {
                            assert!(response.is_some_and(|r| r.starts_with(b"done by ")));
                        }
                        InboxOutcome::Mismatch => panic!("no fingerprints here"),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("worker");
    }
    let conn = connect(&path);
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM ledger", [], |r| r.get(0))
        .expect("count");
    let distinct: i64 = conn
        .query_row("SELECT count(DISTINCT msg) FROM ledger", [], |r| r.get(0))
        .expect("count");
    assert_eq!(
        (rows, distinct),
        (MESSAGES as i64, MESSAGES as i64),
        "one effect per message"
    );
    assert_eq!(fresh.load(Ordering::SeqCst), MESSAGES);
}

#[test]
fn a_rolled_back_transaction_leaves_no_record() {
    let path = database();
    let mut conn = connect(&path);
    let inbox = Inbox::new(KEEP);
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .expect("begin");
    assert_eq!(
        inbox.claim(&tx, &id(1), None).expect("claim"),
        InboxOutcome::New
    );
    tx.execute("INSERT INTO ledger VALUES ('1', 0)", [])
        .expect("effect");
    drop(tx); // the handler failed: roll back both
    assert!(!inbox.contains(&conn, &id(1)).expect("lookup"));
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .expect("begin");
    assert_eq!(
        inbox.claim(&tx, &id(1), None).expect("claim"),
        InboxOutcome::New,
        "redelivery runs it"
    );
    tx.execute("INSERT INTO ledger VALUES ('1', 1)", [])
        .expect("effect");
    tx.commit().expect("commit");
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM ledger", [], |r| r.get(0))
        .expect("count");
    assert_eq!(rows, 1);
}

#[test]
fn a_duplicate_waits_for_the_first_transaction_then_sees_its_result() {
    let path = database();
    let about_to_commit = Arc::new(AtomicBool::new(false));
    let claimed = Arc::new(Barrier::new(2));
    let first = {
        let (path, flag, claimed) = (
            path.clone(),
            Arc::clone(&about_to_commit),
            Arc::clone(&claimed),
        );
        std::thread::spawn(move || {
            let mut conn = connect(&path);
            let inbox = Inbox::new(KEEP);
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .expect("begin");
            assert_eq!(
                inbox.claim(&tx, &id(7), None).expect("claim"),
                InboxOutcome::New
            );
            claimed.wait();
            std::thread::sleep(Duration::from_millis(100));
            inbox.set_response(&tx, &id(7), b"first").expect("response");
            flag.store(true, Ordering::SeqCst);
            tx.commit().expect("commit");
        })
    };
    claimed.wait();
    let mut conn = connect(&path);
    let inbox = Inbox::new(KEEP);
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .expect("begin waits for the lock");
    let outcome = inbox.claim(&tx, &id(7), None).expect("claim");
    assert!(
        about_to_commit.load(Ordering::SeqCst),
        "the duplicate got in before the first transaction ended"
    );
    assert_eq!(
        outcome,
        InboxOutcome::Duplicate {
            response: Some(b"first".to_vec())
        }
    );
    first.join().expect("first");
}

#[test]
fn fingerprints_expiry_and_misuse() {
    let path = database();
    let mut conn = connect(&path);
    let clock = ManualClock::default();
    let inbox = Inbox::with_clock(Duration::from_secs(60), clock.clone());
    let a = Some(Fingerprint::of_bytes(b"a"));
    let b = Some(Fingerprint::of_bytes(b"b"));
    let tx = conn.transaction().expect("begin");
    assert_eq!(
        inbox.claim(&tx, &id(1), a).expect("claim"),
        InboxOutcome::New
    );
    assert_eq!(
        inbox.claim(&tx, &id(1), b).expect("claim"),
        InboxOutcome::Mismatch
    );
    assert_eq!(
        inbox.claim(&tx, &id(1), a).expect("claim"),
        InboxOutcome::Duplicate { response: None }
    );
    assert!(matches!(
        inbox.set_response(&tx, &id(2), b"x"),
        Err(InboxError::NotClaimed { .. })
    ));
    tx.commit().expect("commit");

    clock.advance(Duration::from_secs(60));
    assert!(
        !inbox.contains(&conn, &id(1)).expect("lookup"),
        "expired records are absent"
    );
    let tx = conn.transaction().expect("begin");
    assert_eq!(
        inbox.claim(&tx, &id(1), b).expect("claim"),
        InboxOutcome::New,
        "expired: new, any fingerprint"
    );
    tx.commit().expect("commit");

    for i in 10..15 {
        let tx = conn.transaction().expect("begin");
        inbox.claim(&tx, &id(i), None).expect("claim");
        tx.commit().expect("commit");
    }
    clock.advance(Duration::from_secs(61));
    assert_eq!(inbox.purge_expired(&conn, 4).expect("purge"), 4, "bounded");
    assert_eq!(inbox.purge_expired(&conn, 100).expect("purge"), 2);

    let tx = conn.transaction().expect("begin");
    assert_eq!(
        inbox.claim(&tx, &id(20), None).expect("claim"),
        InboxOutcome::New
    );
    inbox
        .set_response(&tx, &id(20), b"first")
        .expect("response");
    assert!(
        matches!(
            inbox.set_response(&tx, &id(20), b"second"),
            Err(InboxError::NotClaimed { .. })
        ),
        "a stored response is never overwritten"
    );
    tx.commit().expect("commit");
    let err = inbox
        .claim(&conn, &id(21), None)
        .expect_err("outside a transaction");
    assert!(matches!(err, InboxError::NotInTransaction), "{err:?}");
    assert!(
        !inbox.contains(&conn, &id(21)).expect("lookup"),
        "nothing was written"
    );

    let mut bare = Connection::open_in_memory().expect("open");
    let tx = bare.transaction().expect("begin");
    let err = Inbox::new(KEEP)
        .claim(&tx, &id(1), None)
        .expect_err("no table");
    assert!(matches!(err, InboxError::NotSetUp(_)), "{err:?}");
    assert!(err.to_string().contains("Inbox::setup"), "{err}");
}
