//! A sealed, key-hashed run leaves nothing readable in the store's files:
//! the database and its WAL, byte for byte (docs/design.md §11).

use idem_sqlite::SqliteStore;
use idem_testkit::at_rest::{assert_hidden, write_secrets};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_files_show_no_sealed_payload_and_no_hashed_key() {
    let dir = tempfile::tempdir().expect("dir");
    let store = SqliteStore::open(dir.path().join("idem.db")).expect("open");
    write_secrets(store.clone(), "pay").await;
    drop(store);
    let mut dump = Vec::new();
    for entry in std::fs::read_dir(dir.path()).expect("dir") {
        dump.extend(std::fs::read(entry.expect("entry").path()).expect("read"));
    }
    assert_hidden(&dump, "pay");
}
