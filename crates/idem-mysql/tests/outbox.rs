//! The transactional outbox against a real MariaDB: the shared cases of
//! every standalone outbox (`idem_testkit::conformance::outbox_table`: a
//! message exists exactly when the producer's transaction commits, is
//! taken by one of several dispatchers, comes due again after a dead
//! dispatcher or an absent broker), and MySQL's own refusal.

mod common;

use idem::outbox::{MemorySender, Message, OutboxPass};
use idem_mysql::outbox::{Outbox, OutboxError};
use idem_testkit::conformance::outbox_table::{OutboxTable, LEASE};
use mysql_async::prelude::Queryable;
use mysql_async::{Pool, TxOpts};

/// The outbox of a fresh database; dispatchers share the pool, each pass
/// on a connection of its own.
#[derive(Clone)]
struct Table {
    pool: Pool,
    outbox: Outbox,
}

async fn table() -> Table {
    let pool = Pool::new(common::url("outbox").as_str());
    let outbox = Outbox::new().lease(LEASE);
    let mut conn = pool.get_conn().await.expect("connect");
    outbox.setup(&mut conn).await.expect("setup");
    conn.query_drop("CREATE TABLE orders (id BIGINT PRIMARY KEY)")
        .await
        .expect("orders");
    Table { pool, outbox }
}

impl OutboxTable for Table {
    async fn place(&self, id: i64, message: Message, commit: bool) {
        let mut conn = self.pool.get_conn().await.expect("connect");
        let mut tx = conn
            .start_transaction(TxOpts::default())
            .await
            .expect("begin");
        tx.exec_drop("INSERT INTO orders VALUES (?)", (id,))
            .await
            .expect("order");
        self.outbox
            .enqueue(&mut tx, &message)
            .await
            .expect("enqueue");
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
    }

    async fn dispatch(&self, sender: &MemorySender, batch: usize) -> OutboxPass {
        self.outbox
            .dispatch(&self.pool, sender, batch)
            .await
            .expect("dispatch")
    }

    async fn another(&self) -> Self {
        self.clone()
    }

    async fn rows(&self) -> i64 {
        let mut conn = self.pool.get_conn().await.expect("connect");
        conn.query_first("SELECT count(*) FROM idem_outbox")
            .await
            .expect("count")
            .expect("a row")
    }
}

idem_testkit::outbox_table_suite!(table);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_not_set_up_says_so() {
    let pool = Pool::new(common::url("outbox_missing").as_str());
    let missing = Outbox::new().dispatch(&pool, &MemorySender::new(), 1).await;
    assert!(matches!(missing, Err(OutboxError::NotSetUp)), "{missing:?}");
}
