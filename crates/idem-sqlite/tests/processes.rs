//! Several processes on one store file: SIGKILL at random moments loses no
//! acknowledged completion and leaves no half-written record; two processes
//! racing over the same keys acquire each key exactly once; processes that
//! start at once on a new file all open it.
//!
//! The child processes are this test binary run again in a child mode
//! (the ignored `child` test, selected by an environment variable). They
//! are started as `std::process::Child` and stopped with `Child::kill`
//! (SIGKILL to that PID) and `wait`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{Failure, FailureClass, GetRecord, ListQuery, ListRecords, RecordId, State, Store};
use idem_sqlite::SqliteStore;
use rand::Rng;

const CHILD_MODE: &str = "IDEM_SQLITE_CHILD_MODE";
const CHILD_PATH: &str = "IDEM_SQLITE_CHILD_PATH";
const RACE_KEYS: usize = 1000;

fn claim_params() -> ClaimParams {
    ClaimParams::new(Duration::from_secs(60), Duration::from_secs(3600))
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// What the crash child stores for `key`: a completion whose bytes the
/// parent can recompute, or (one key in ten) a terminal failure.
fn expected(key: &str) -> State {
    let h = fnv(key);
    if h.is_multiple_of(10) {
        return State::Failed {
            failure: Failure::new(FailureClass::Terminal, format!("declined {key}")),
        };
    }
    let len = (h % 3000) as usize + 1;
    let bytes: Vec<u8> = key.bytes().cycle().take(len).collect();
    State::Completed {
        response: Bytes::from(bytes),
    }
}

fn spawn_child(mode: &str, path: &Path) -> Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args(idem_testkit::rerun::only_ignored("child"))
        .env(CHILD_MODE, mode)
        .env(CHILD_PATH, path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child")
}

/// Complete lines the child printed (a line cut off by the kill is not
/// counted: the child had not finished reporting it).
fn reported_lines(child: &mut Child) -> std::thread::JoinHandle<Vec<String>> {
    let stdout = child.stdout.take().expect("piped stdout");
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut lines = Vec::new();
        let mut buf = Vec::new();
        while reader.read_until(b'\n', &mut buf).unwrap_or(0) > 0 {
            if buf.ends_with(b"\n") {
                lines.push(String::from_utf8_lossy(&buf).trim_end().to_owned());
            }
            buf.clear();
        }
        lines
    })
}

/// The payload after `tag` in a line. libtest prints `test child ... `
/// without a newline before the child runs, so the first report shares its
/// line.
fn report<'a>(line: &'a str, tag: &str) -> Option<&'a str> {
    line.find(tag).map(|at| &line[at + tag.len()..])
}

fn new_store_file(name: &str) -> PathBuf {
    let dir = tempfile::Builder::new()
        .prefix(name)
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("tempdir")
        .keep();
    let path = dir.join("idem.db");
    drop(SqliteStore::open(&path).expect("create the store"));
    path
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn acknowledged_outcomes_survive_sigkill_at_random_moments() {
    let path = new_store_file("crash");
    let mut reported: Vec<(String, State)> = Vec::new();
    let mut rng = rand::rng();
    let rt = runtime();
    for round in 0..50 {
        let mut child = spawn_child("crash", &path);
        let lines = reported_lines(&mut child);
        std::thread::sleep(Duration::from_millis(rng.random_range(20..250)));
        child.kill().expect("SIGKILL the child");
        child.wait().expect("reap the child");
        let earlier = reported.len();
        for line in lines.join().expect("reader") {
            if let Some(key) = report(&line, "DONE ") {
                reported.push((key.to_owned(), expected(key)));
            }
        }

        let check: String = rusqlite::Connection::open(&path)
            .and_then(|c| c.query_row("PRAGMA integrity_check", [], |r| r.get(0)))
            .expect("integrity check runs");
        assert_eq!(check, "ok", "round {round}: integrity_check");

        // This round's outcomes, and a sample of all earlier ones.
        let sample: Vec<&(String, State)> = reported[earlier..]
            .iter()
            .chain((0..100.min(earlier)).map(|_| &reported[rng.random_range(0..earlier)]))
            .collect();
        rt.block_on(verify(&path, sample, round));
    }
    assert!(
        reported.len() > 200,
        "the children made progress: {} outcomes",
        reported.len()
    );
    rt.block_on(async {
        verify(&path, reported.iter().collect(), 50).await;
        // Every row decodes: nothing half-written.
        let store = SqliteStore::open(&path).expect("reopen");
        let mut query = ListQuery::new(1000);
        let mut rows = 0;
        loop {
            let page = store.list(&query).await.expect("every row decodes");
            rows += page.records.len();
            match page.next {
                Some(next) => query = query.after(next),
                None => break,
            }
        }
        assert!(rows >= reported.len());
    });
}

/// Reopens the store and checks each acknowledged outcome is there, as it
/// was acknowledged.
async fn verify(path: &Path, outcomes: Vec<&(String, State)>, round: usize) {
    let store = SqliteStore::open(path).expect("reopen after the kill");
    for (key, state) in outcomes {
        let id = RecordId::parse("crash", key).expect("valid");
        let record = store
            .get(&id)
            .await
            .expect("readable")
            .unwrap_or_else(|| panic!("round {round}: acknowledged {key} is missing"));
        assert_eq!(&record.state, state, "round {round}: {key} changed");
    }
}

#[test]
fn two_processes_acquire_each_key_exactly_once() {
    let path = new_store_file("race");
    let go = path.with_extension("go");
    let mut children: Vec<_> = (0..2).map(|_| spawn_child("race", &path)).collect();
    let readers: Vec<_> = children.iter_mut().map(reported_lines).collect();
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&go, b"go").expect("start signal");
    for child in &mut children {
        let status = child.wait().expect("child finishes");
        assert!(status.success(), "child failed: {status}");
    }
    // Each child claimed every key (it exits with an error otherwise).
    // Which process wins how many is up to SQLite's busy handler, which
    // backs off by sleeping and is not fair, so only the totals are checked.
    let mut acquired: HashMap<String, usize> = HashMap::new();
    for reader in readers {
        let lines = reader.join().expect("reader");
        for key in lines.iter().filter_map(|l| report(l, "ACQ ")) {
            *acquired.entry(key.to_owned()).or_default() += 1;
        }
    }
    let twice: Vec<_> = acquired.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "acquired by both processes: {twice:?}");
    let missing: Vec<String> = (0..RACE_KEYS)
        .map(|i| format!("k{i}"))
        .chain(["hot".to_owned()])
        .filter(|k| !acquired.contains_key(k))
        .collect();
    assert!(
        missing.is_empty(),
        "never acquired by either process: {missing:?}"
    );
    assert_eq!(acquired.get("hot"), Some(&1));
}

/// Processes started together (several workers, or two gateways) on a
/// file that does not exist yet all open it: one creates the schema, the
/// others wait for it, none fails as locked.
#[test]
fn processes_opening_a_new_file_at_once_all_open_it() {
    for round in 0..10 {
        let dir = tempfile::Builder::new()
            .prefix("open")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("tempdir");
        let path = dir.path().join("idem.db");
        let go = path.with_extension("go");
        let mut children: Vec<_> = (0..6).map(|_| spawn_child("open", &path)).collect();
        let readers: Vec<_> = children.iter_mut().map(reported_lines).collect();
        std::thread::sleep(Duration::from_millis(300));
        std::fs::write(&go, b"go").expect("start signal");
        let mut acquired = 0;
        for (child, reader) in children.iter_mut().zip(readers) {
            let status = child.wait().expect("child finishes");
            let lines = reader.join().expect("reader");
            let opened = lines.iter().find_map(|l| report(l, "OPEN "));
            assert_eq!(opened, Some("ok"), "round {round}: {lines:?} ({status})");
            acquired += lines.iter().filter(|l| report(l, "ACQ ").is_some()).count();
        }
        assert_eq!(acquired, 1, "round {round}: one process acquires the key");
    }
}

/// The child side: does nothing unless started by the tests above.
#[test]
#[ignore = "child process of the multi-process tests"]
fn child() {
    let (Ok(mode), Ok(path)) = (std::env::var(CHILD_MODE), std::env::var(CHILD_PATH)) else {
        return;
    };
    let path = PathBuf::from(path);
    if mode == "open" {
        return runtime().block_on(open_child(&path));
    }
    runtime().block_on(async move {
        let store = Arc::new(SqliteStore::open(&path).expect("child opens the store"));
        match mode.as_str() {
            "crash" => crash_child(store).await,
            "race" => race_child(store, &path.with_extension("go")).await,
            other => panic!("unknown child mode {other}"),
        }
    });
}

/// Opens the store when the parent says go, and claims one shared key.
#[allow(clippy::print_stdout)]
async fn open_child(path: &Path) {
    let go = path.with_extension("go");
    while !go.exists() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let store = match SqliteStore::open(path) {
        Ok(store) => store,
        Err(error) => {
            println!("OPEN {error}");
            return;
        }
    };
    println!("OPEN ok");
    let id = RecordId::parse("open", "shared").expect("valid");
    if let ClaimOutcome::Acquired(_) = store.claim(&id, &claim_params()).await.expect("claim") {
        println!("ACQ shared");
    }
}

#[allow(clippy::print_stdout)]
async fn crash_child(store: Arc<SqliteStore>) {
    let pid = std::process::id();
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                for i in 0.. {
                    let key = format!("{pid}-{t}-{i}");
                    let id = RecordId::parse("crash", &key).expect("valid");
                    let ClaimOutcome::Acquired(lease) =
                        store.claim(&id, &claim_params()).await.expect("claim")
                    else {
                        panic!("fresh keys are acquired");
                    };
                    match expected(&key) {
                        State::Completed { response } => {
                            store
                                .complete(&lease, response, Duration::from_secs(3600))
                                .await
                        }
                        State::Failed { failure } => {
                            store.fail(&lease, failure, Duration::from_secs(3600)).await
                        }
                        _ => unreachable!(),
                    }
                    .expect("outcome stored");
                    println!("DONE {key}");
                }
            })
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
}

#[allow(clippy::print_stdout)]
async fn race_child(store: Arc<SqliteStore>, go: &Path) {
    while !go.exists() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut keys: Vec<String> = (0..RACE_KEYS).map(|i| format!("k{i}")).collect();
    keys.extend(std::iter::repeat_n("hot".to_owned(), 64));
    let keys = Arc::new(keys);
    // One rotation per process, so its 32 tasks split every key between
    // them while the two processes meet the keys in different orders.
    let offset = rand::random_range(0..keys.len());
    let tasks: Vec<_> = (0..32)
        .map(|t| {
            let (store, keys) = (Arc::clone(&store), Arc::clone(&keys));
            tokio::spawn(async move {
                let mut won = Vec::new();
                for i in (0..keys.len()).filter(|i| i % 32 == t) {
                    let key = &keys[(i + offset) % keys.len()];
                    let id = RecordId::parse("race", key).expect("valid");
                    if let ClaimOutcome::Acquired(_) =
                        store.claim(&id, &claim_params()).await.expect("claim")
                    {
                        won.push(key.clone());
                    }
                }
                won
            })
        })
        .collect();
    for task in tasks {
        for key in task.await.expect("task") {
            println!("ACQ {key}");
        }
    }
}
