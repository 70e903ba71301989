//! `PgBlobs` (migration 0007) passes the blob store suite against the
//! real server.

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_blob_store_passes_the_blob_store_suite() {
    let store = common::store("blobs").await;
    idem_testkit::blobs::blob_store_suite(store.blobs(), idem_testkit::blobs::Partials::Listed)
        .await;
}
