//! The transactional outbox on a real SQLite file: the shared cases of
//! every standalone outbox (`idem_testkit::conformance::outbox_table`: a
//! message exists exactly when the producer's transaction commits, is
//! taken by one of several dispatchers, each with a connection of its
//! own, comes due again after a dead dispatcher or an absent broker), and
//! SQLite's own refusals.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::outbox::{MemorySender, Message, OutboxPass};
use idem_sqlite::outbox::{Outbox, OutboxError};
use idem_testkit::conformance::outbox_table::{OutboxTable, LEASE};
use rusqlite::{Connection, TransactionBehavior};

/// A connection to `path` as a producer or dispatcher opens one: WAL, and
/// waiting for the write lock rather than failing at once.
fn open(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("open");
    conn.busy_timeout(Duration::from_secs(10))
        .expect("busy timeout");
    conn.pragma_update(None, "journal_mode", "WAL")
        .expect("WAL");
    conn
}

/// The outbox of a fresh file, each dispatcher with a connection of its
/// own.
struct Table {
    outbox: Outbox,
    path: PathBuf,
    conn: Mutex<Connection>,
    _dir: Arc<tempfile::TempDir>,
}

async fn table() -> Table {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("shop.db");
    let outbox = Outbox::new().lease(LEASE);
    let conn = open(&path);
    outbox.setup(&conn).expect("setup");
    conn.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        .expect("orders");
    Table {
        outbox,
        path,
        conn: Mutex::new(conn),
        _dir: Arc::new(dir),
    }
}

impl OutboxTable for Table {
    async fn place(&self, id: i64, message: Message, commit: bool) {
        let mut conn = self.conn.lock().expect("lock");
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("begin");
        tx.execute("INSERT INTO orders VALUES (?1)", [id])
            .expect("order");
        self.outbox.enqueue(&tx, &message).expect("enqueue");
        if commit {
            tx.commit().expect("commit");
        } else {
            tx.rollback().expect("rollback");
        }
    }

    async fn dispatch(&self, sender: &MemorySender, batch: usize) -> OutboxPass {
        self.outbox
            .dispatch(&self.conn, sender, batch)
            .await
            .expect("dispatch")
    }

    async fn another(&self) -> Self {
        Table {
            outbox: self.outbox.clone(),
            path: self.path.clone(),
            conn: Mutex::new(open(&self.path)),
            _dir: Arc::clone(&self._dir),
        }
    }

    async fn rows(&self) -> i64 {
        self.conn
            .lock()
            .expect("lock")
            .query_row("SELECT count(*) FROM idem_outbox", [], |r| r.get(0))
            .expect("count")
    }
}

idem_testkit::outbox_table_suite!(table);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_not_set_up_or_outside_a_transaction_says_so() {
    let outbox = Outbox::new();
    let conn = Connection::open_in_memory().expect("open");
    let message = Message::new("d", "p");
    assert!(matches!(
        outbox.enqueue(&conn, &message),
        Err(OutboxError::NotInTransaction)
    ));
    let conn = Mutex::new(conn);
    let missing = outbox.dispatch(&conn, &MemorySender::new(), 1).await;
    assert!(
        matches!(missing, Err(OutboxError::NotSetUp(_))),
        "{missing:?}"
    );
}
