//! Natural idempotency, runnable (see `docs/natural.md`): a conditional
//! state transition and a versioned upsert, each delivered many times and
//! out of order against a real PostgreSQL, with no dedup table at all.

mod common;

use tokio_postgres::{Client, NoTls};

async fn client() -> (Client, String) {
    let (client, connection) = tokio_postgres::connect(&common::url(), NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let schema = format!("natural_{:016x}", rand::random::<u64>());
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .expect("schema");
    (client, schema)
}

#[tokio::test]
async fn a_conditional_transition_applies_once() {
    let (c, s) = client().await;
    c.batch_execute(&format!(
        "CREATE TABLE {s}.orders (id int PRIMARY KEY, status text NOT NULL, paid_at timestamptz);
         INSERT INTO {s}.orders VALUES (1, 'CREATED', NULL)"
    ))
    .await
    .expect("orders");
    let pay = format!(
        "UPDATE {s}.orders SET status = 'PAID', paid_at = now() WHERE id = $1 AND status = 'CREATED'"
    );
    let mut applied = 0;
    for _delivery in 0..5 {
        applied += c.execute(&pay, &[&1i32]).await.expect("pay");
    }
    assert_eq!(applied, 1, "only the first delivery changed a row");
    let status: String = c
        .query_one(&format!("SELECT status FROM {s}.orders WHERE id = 1"), &[])
        .await
        .expect("status")
        .get(0);
    assert_eq!(status, "PAID");
}

#[tokio::test]
async fn a_versioned_upsert_keeps_the_newest_whatever_the_order() {
    let (c, s) = client().await;
    c.batch_execute(&format!(
        "CREATE TABLE {s}.prices (sku text PRIMARY KEY, cents int NOT NULL, updated_at bigint NOT NULL)"
    ))
    .await
    .expect("prices");
    let upsert = format!(
        "INSERT INTO {s}.prices AS p (sku, cents, updated_at) VALUES ($1, $2, $3)
         ON CONFLICT (sku) DO UPDATE SET cents = excluded.cents, updated_at = excluded.updated_at
         WHERE p.updated_at < excluded.updated_at"
    );
    // Version 3 arrives first, then a redelivery of 3, then the stale 1 and 2.
    for (cents, version) in [(300, 3i64), (300, 3), (100, 1), (200, 2), (100, 1)] {
        c.execute(&upsert, &[&"sku-1", &cents, &version])
            .await
            .expect("upsert");
    }
    let row = c
        .query_one(&format!("SELECT cents, updated_at FROM {s}.prices"), &[])
        .await
        .expect("price");
    assert_eq!((row.get::<_, i32>(0), row.get::<_, i64>(1)), (300, 3));
}
