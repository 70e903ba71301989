//! Every acknowledged write's log is fsynced before its answer, on both of
//! a write's paths: through the writer (answered by the syncer thread) and
//! committed on its caller's thread. A child process (this test binary run
//! again, in the ignored `child` test) claims and completes one key at a
//! time and prints a line after each answer; it runs under `strace`, and
//! the trace must show, before each printed line, an fsync of the log that
//! began after the log's last write ended.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{RecordId, Store};
use idem_sqlite::SqliteStore;

const CHILD_PATH: &str = "IDEM_SQLITE_SYNCS_PATH";
const CHILD_FLAVOR: &str = "IDEM_SQLITE_SYNCS_FLAVOR";
const KEYS: usize = 20;

/// The child's system calls that write or sync, as `strace -f -y` wrote
/// them, one per line.
fn trace(flavor: &str) -> String {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let out = dir.path().join("trace");
    let status = Command::new("strace")
        .args([
            "-f",
            "-y",
            "-qq",
            "-e",
            "trace=pwrite64,write,fdatasync,fsync",
            "-o",
        ])
        .arg(&out)
        .arg(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_PATH, dir.path().join("idem.db"))
        .env(CHILD_FLAVOR, flavor)
        .stdout(Stdio::null())
        .status()
        .expect("run strace (scripts/test installs it)");
    assert!(status.success(), "the child failed: {status}");
    std::fs::read_to_string(out).expect("the trace")
}

/// What a line of the trace says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// A write to the log ended.
    LogWritten,
    /// An fsync of the log began.
    SyncBegun,
    /// An fsync of the log ended.
    Synced,
    /// The child began to print that an answer came.
    Answered,
}

/// The events of a trace, in order. A call cut in two by another thread's
/// (`<unfinished ...>`, then `<... resumed>`) begins at its first half and
/// ends at its second.
fn events(trace: &str) -> Vec<Event> {
    let mut open: HashMap<&str, Event> = HashMap::new();
    let mut events = Vec::new();
    for line in trace.lines() {
        let Some((pid, call)) = line.split_once(' ') else {
            continue;
        };
        let call = call.trim_start();
        if call.starts_with("<...") {
            if let Some(ended) = open.remove(pid) {
                events.push(ended);
            }
            continue;
        }
        let on_log = call.contains("-wal>");
        let (begun, ended) =
            if on_log && (call.starts_with("fdatasync(") || call.starts_with("fsync(")) {
                (Some(Event::SyncBegun), Some(Event::Synced))
            } else if on_log && call.starts_with("pwrite64(") {
                (None, Some(Event::LogWritten))
            } else if call.starts_with("write(1") && call.contains("\"ACK") {
                (Some(Event::Answered), None)
            } else {
                (None, None)
            };
        events.extend(begun);
        if let Some(ended) = ended {
            if call.ends_with("<unfinished ...>") {
                open.insert(pid, ended);
            } else {
                events.push(ended);
            }
        }
    }
    events
}

/// How many answers were printed, checking that before each one an fsync
/// of the log began after the log's last write ended, and ended.
fn answers_after_syncs(events: &[Event]) -> usize {
    let mut answers = 0;
    // Since the log's last write: whether an fsync has begun, and ended.
    let (mut begun, mut synced) = (true, true);
    for (at, event) in events.iter().enumerate() {
        match event {
            Event::LogWritten => (begun, synced) = (false, false),
            Event::SyncBegun => {
                begun = true;
                synced = false;
            }
            Event::Synced => synced = begun,
            Event::Answered => {
                assert!(
                    synced,
                    "answer {answers} was printed before the log's last write was fsynced \
                     (event {at} of {events:?})"
                );
                answers += 1;
            }
        }
    }
    answers
}

#[test]
fn answers_through_the_writer_wait_for_the_logs_fsync() {
    let events = events(&trace("writer"));
    assert!(events.contains(&Event::LogWritten), "{events:?}");
    assert_eq!(answers_after_syncs(&events), 2 * KEYS);
}

#[test]
fn answers_committed_on_the_callers_thread_wait_for_the_logs_fsync() {
    let events = events(&trace("inline"));
    assert!(events.contains(&Event::LogWritten), "{events:?}");
    assert_eq!(answers_after_syncs(&events), 2 * KEYS);
}

#[test]
fn the_check_fails_an_answer_before_the_fsync() {
    use Event::*;
    let written = [SyncBegun, Synced, LogWritten, Answered];
    assert!(std::panic::catch_unwind(|| answers_after_syncs(&written)).is_err());
    let begun_before = [SyncBegun, LogWritten, Synced, Answered];
    assert!(std::panic::catch_unwind(|| answers_after_syncs(&begun_before)).is_err());
    let still_running = [LogWritten, SyncBegun, Answered, Synced];
    assert!(std::panic::catch_unwind(|| answers_after_syncs(&still_running)).is_err());
    assert_eq!(
        answers_after_syncs(&[LogWritten, SyncBegun, Synced, Answered]),
        1
    );
}

/// The child side: does nothing unless started by the tests above. The
/// writer's flavor runs on a current-thread runtime, where every write
/// goes to the writer; the inline flavor on two workers, where a write
/// alone on a quiet store commits on its caller's thread.
#[test]
#[ignore = "child process of the syncs tests"]
#[allow(clippy::print_stdout)]
fn child() {
    let (Ok(path), Ok(flavor)) = (std::env::var(CHILD_PATH), std::env::var(CHILD_FLAVOR)) else {
        return;
    };
    let runtime = match flavor.as_str() {
        "writer" => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build(),
    }
    .expect("runtime");
    runtime.block_on(async move {
        let store = SqliteStore::open(PathBuf::from(path)).expect("open");
        let params = ClaimParams::new(Duration::from_secs(60), Duration::from_secs(3600));
        for i in 0..KEYS {
            let id = RecordId::parse("syncs", &format!("key-{i}")).expect("valid");
            let ClaimOutcome::Acquired(lease) = store.claim(&id, &params).await.expect("claim")
            else {
                panic!("key {i} is new");
            };
            println!("ACK claim {i}");
            store
                .complete(
                    &lease,
                    Bytes::from_static(b"done"),
                    Duration::from_secs(3600),
                )
                .await
                .expect("complete");
            println!("ACK complete {i}");
        }
    });
}
