//! Every acknowledged write's log is fsynced before its answer, on each of
//! a write's paths: committed on its caller's thread, synced by the writer
//! (nothing queued behind it) and handed to the syncer thread (the next
//! batch queued). A child process (this test binary run again, in the
//! ignored `child` test) claims and completes keys on a file it reopened
//! and prints a line after each answer; it runs under `strace`. One key at
//! a time, the trace must show before each printed line an fsync of the log
//! that began after the log's last write ended. With many keys at once,
//! each completion's response ends in a mark of its own that lands on a
//! page only its commit writes, and the trace must show, before the line
//! saying it completed, an fsync of the log that began after that page was
//! written.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{RecordId, Store};
use idem_sqlite::SqliteStore;

const CHILD_PATH: &str = "IDEM_SQLITE_SYNCS_PATH";
const CHILD_FLAVOR: &str = "IDEM_SQLITE_SYNCS_FLAVOR";
/// Keys the sequential flavors write, one after another.
const KEYS: usize = 20;
/// Tasks of the concurrent flavor, and the keys each writes.
const TASKS: usize = 32;
const KEYS_PER_TASK: usize = 2;

/// The child's system calls that write or sync, as `strace -f -y` wrote
/// them, one per line.
fn trace(flavor: &str) -> String {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let out = dir.path().join("trace");
    let status = Command::new("strace")
        .args(["-f", "-y", "-qq", "-s", "8192"])
        .args(["-e", "trace=pwrite64,write,fdatasync,fsync", "-o"])
        .arg(&out)
        .arg(std::env::current_exe().expect("test binary"))
        .args(idem_testkit::rerun::only_ignored("child"))
        .env(CHILD_PATH, dir.path().join("idem.db"))
        .env(CHILD_FLAVOR, flavor)
        .stdout(Stdio::null())
        .status()
        .expect("run strace (scripts/test installs it)");
    assert!(status.success(), "the child failed: {status}");
    std::fs::read_to_string(out).expect("the trace")
}

/// What a line of the trace says happened, and on which thread.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    /// A write to the log ended: the thread, then the call as strace shows
    /// it.
    LogWritten(String),
    /// A thread began an fsync of the log.
    SyncBegun(String),
    /// A thread's fsync of the log ended.
    Synced(String),
    /// The child began to print a line saying an answer came.
    Answered(String),
}

/// The events of a trace, in order. A call cut in two by another thread's
/// (`<unfinished ...>`, then `<... resumed>`) begins at its first half and
/// ends at its second.
fn events(trace: &str) -> Vec<Event> {
    let mut open: HashMap<&str, Event> = HashMap::new();
    let mut events = Vec::new();
    for line in trace.lines() {
        let Some((tid, call)) = line.split_once(' ') else {
            continue;
        };
        let call = call.trim_start();
        if call.starts_with("<...") {
            if let Some(ended) = open.remove(tid) {
                events.push(ended);
            }
            continue;
        }
        let on_log = call.contains("-wal>");
        let (begun, ended) =
            if on_log && (call.starts_with("fdatasync(") || call.starts_with("fsync(")) {
                (
                    Some(Event::SyncBegun(tid.to_owned())),
                    Some(Event::Synced(tid.to_owned())),
                )
            } else if on_log && call.starts_with("pwrite64(") {
                (None, Some(Event::LogWritten(format!("{tid} {call}"))))
            } else if call.starts_with("write(1") && call.contains("\"ACK ") {
                (Some(Event::Answered(call.to_owned())), None)
            } else {
                (None, None)
            };
        events.extend(begun);
        if let Some(ended) = ended {
            if call.ends_with("<unfinished ...>") {
                open.insert(tid, ended);
            } else {
                events.push(ended);
            }
        }
    }
    events
}

/// One key at a time: how many answers were printed, checking that before
/// each an fsync of the log began after the log's last write ended, and
/// ended.
fn answers_after_syncs(events: &[Event]) -> usize {
    let mut answers = 0;
    // Since the log's last write: whether an fsync has begun, and ended.
    let (mut begun, mut synced) = (true, true);
    for (at, event) in events.iter().enumerate() {
        match event {
            Event::LogWritten(_) => (begun, synced) = (false, false),
            Event::SyncBegun(_) => (begun, synced) = (true, false),
            Event::Synced(_) => synced = begun,
            Event::Answered(_) => {
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

/// The mark that ends key `i`'s response.
fn mark(i: usize) -> String {
    format!("mark-{i};")
}

/// Many keys at once: how many completions were printed, checking that
/// before each an fsync of the log began after the write of its response's
/// last page ended, and ended.
fn completions_after_their_syncs(events: &[Event]) -> usize {
    // Each fsync's place in the trace: where it began and ended.
    let mut syncs = Vec::new();
    let mut running: HashMap<&str, usize> = HashMap::new();
    for (at, event) in events.iter().enumerate() {
        match event {
            Event::SyncBegun(tid) => {
                running.insert(tid, at);
            }
            Event::Synced(tid) => syncs.extend(running.remove(tid.as_str()).map(|from| (from, at))),
            _ => {}
        }
    }
    let mut completions = 0;
    for (at, event) in events.iter().enumerate() {
        let Event::Answered(line) = event else {
            continue;
        };
        let Some(i) = line.split("ACK complete ").nth(1) else {
            continue;
        };
        let i: usize = i
            .split('\\')
            .next()
            .and_then(|i| i.parse().ok())
            .expect("a key");
        let written = events[..at]
            .iter()
            .rposition(|e| matches!(e, Event::LogWritten(w) if w.contains(&mark(i))))
            .unwrap_or_else(|| panic!("key {i}'s response was not written before its answer"));
        assert!(
            syncs.iter().any(|&(from, to)| from > written && to < at),
            "key {i} was answered (event {at}) before an fsync of its write (event {written})"
        );
        completions += 1;
    }
    completions
}

#[test]
fn answers_synced_by_the_writer_wait_for_the_logs_fsync() {
    let events = events(&trace("writer"));
    assert_eq!(answers_after_syncs(&events), 2 * KEYS);
}

#[test]
fn answers_committed_on_the_callers_thread_wait_for_the_logs_fsync() {
    let events = events(&trace("inline"));
    assert_eq!(answers_after_syncs(&events), 2 * KEYS);
}

#[test]
fn answers_handed_to_the_syncer_wait_for_their_fsync() {
    let events = events(&trace("concurrent"));
    assert_eq!(
        completions_after_their_syncs(&events),
        TASKS * KEYS_PER_TASK
    );
    // The syncer thread syncs the log and never writes it.
    let writers: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            Event::LogWritten(line) => line.split(' ').next(),
            _ => None,
        })
        .collect();
    let syncer = events.iter().any(|e| match e {
        Event::Synced(tid) => !writers.contains(&tid.as_str()),
        _ => false,
    });
    assert!(
        syncer,
        "no fsync of the log by a thread that does not write it"
    );
}

#[test]
fn the_checks_fail_an_answer_before_its_fsync() {
    use Event::*;
    let w = || LogWritten("1 pwrite64(7</x/idem.db-wal>, \"mark-3;\"".to_owned());
    let (b, s) = (|| SyncBegun("2".to_owned()), || Synced("2".to_owned()));
    let a = || Answered("write(1</dev/null>, \"ACK complete 3\\n\"".to_owned());
    for events in [
        vec![b(), s(), w(), a()],
        vec![b(), w(), s(), a()],
        vec![w(), b(), a(), s()],
    ] {
        let sequential = events.clone();
        assert!(std::panic::catch_unwind(|| answers_after_syncs(&sequential)).is_err());
        assert!(std::panic::catch_unwind(|| completions_after_their_syncs(&events)).is_err());
    }
    let good = [w(), b(), s(), a()];
    assert_eq!(answers_after_syncs(&good), 1);
    assert_eq!(completions_after_their_syncs(&good), 1);
}

/// The child side: does nothing unless started by the tests above. The
/// writer's flavor runs on a current-thread runtime, where every write goes
/// to the writer; the inline flavor on two workers, where a write alone on
/// a quiet store commits on its caller's thread; the concurrent flavor on
/// two workers with many writes at once, which queue behind each other.
#[test]
#[ignore = "child process of the syncs tests"]
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
        // Opened once and closed first (which removes the log), so that
        // the store syncs the log of a file it did not make.
        drop(SqliteStore::open(PathBuf::from(&path)).expect("create"));
        let store = Arc::new(SqliteStore::open(PathBuf::from(path)).expect("open"));
        if flavor == "concurrent" {
            let tasks: Vec<_> = (0..TASKS)
                .map(|t| {
                    let store = Arc::clone(&store);
                    tokio::spawn(async move {
                        for k in 0..KEYS_PER_TASK {
                            write(&store, t * KEYS_PER_TASK + k).await;
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.expect("task");
            }
        } else {
            for i in 0..KEYS {
                write(&store, i).await;
            }
        }
    });
}

/// Claims and completes key `i`, printing a line after each answer. The
/// response is longer than a page, so its end (the mark) is on an overflow
/// page that only this completion's commit writes.
#[allow(clippy::print_stdout)]
async fn write(store: &SqliteStore, i: usize) {
    let params = ClaimParams::new(Duration::from_secs(60), Duration::from_secs(3600));
    let id = RecordId::parse("syncs", &format!("key-{i}")).expect("valid");
    let ClaimOutcome::Acquired(lease) = store.claim(&id, &params).await.expect("claim") else {
        panic!("key {i} is new");
    };
    println!("ACK claim {i}");
    let mut response = vec![b'.'; 6000];
    response.extend_from_slice(mark(i).as_bytes());
    store
        .complete(&lease, Bytes::from(response), Duration::from_secs(3600))
        .await
        .expect("complete");
    println!("ACK complete {i}");
}
