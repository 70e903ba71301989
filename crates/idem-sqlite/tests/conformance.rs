//! The conformance suite against a real SQLite file, on a manual clock.

use std::time::Duration;

use idem::ManualClock;
use idem_sqlite::SqliteStore;
use idem_testkit::Fixture;

async fn fixture(case: &'static str) -> Fixture<SqliteStore<ManualClock>> {
    opened(case, None)
}

/// A store that remembers expired keys, for the horizon cases.
async fn remembering(case: &'static str) -> Fixture<SqliteStore<ManualClock>> {
    opened(case, Some(idem_testkit::conformance::horizon::MEMORY))
}

fn opened(case: &'static str, memory: Option<Duration>) -> Fixture<SqliteStore<ManualClock>> {
    // The directory must outlive the store (read connections reopen the
    // path), so it is kept under cargo's per-target temporary directory.
    let dir = tempfile::Builder::new()
        .prefix(case)
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temporary directory")
        .keep();
    let clock = ManualClock::default();
    let mut builder = SqliteStore::builder(dir.join("idem.db")).clock(clock.clone());
    if let Some(memory) = memory {
        builder = builder.remember_expired(memory);
    }
    Fixture::manual(builder.open().expect("open store"), clock, case)
}

idem_testkit::conformance_suite!(fixture);

mod horizon {
    use super::remembering;
    idem_testkit::conformance_suite!(remembering; horizon, horizon_days);
}
