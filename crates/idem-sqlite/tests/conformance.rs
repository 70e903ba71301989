//! The conformance suite against a real SQLite file, on a manual clock.

use idem::ManualClock;
use idem_sqlite::SqliteStore;
use idem_testkit::Fixture;

async fn fixture(case: &'static str) -> Fixture<SqliteStore<ManualClock>> {
    // The directory must outlive the store (read connections reopen the
    // path), so it is kept under cargo's per-target temporary directory.
    let dir = tempfile::Builder::new()
        .prefix(case)
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temporary directory")
        .keep();
    let clock = ManualClock::default();
    let store = SqliteStore::builder(dir.join("idem.db"))
        .clock(clock.clone())
        .open()
        .expect("open store");
    Fixture::manual(store, clock, case)
}

idem_testkit::conformance_suite!(fixture);
