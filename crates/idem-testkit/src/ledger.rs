//! An effects ledger for consumer tests: handlers append one line per
//! effect to a file, from any number of worker processes, and the test
//! counts lines per key to prove one effect per message and none lost.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::{Duration, Instant};

use idem::{LeaseLost, Terminal};
use idem_consumer::{Job, Message};

/// A directory holding a test's ledger files.
#[derive(Debug)]
pub struct Ledger {
    dir: PathBuf,
    owned: bool,
}

impl Ledger {
    /// A ledger in a fresh directory under the system temporary directory.
    pub fn create(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("idem-ledger-{name}"));
        std::fs::create_dir_all(&dir).expect("ledger directory");
        Self { dir, owned: true }
    }

    /// The ledger in `dir`, as a worker process is told; only the
    /// ledger's creator removes it.
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            owned: false,
        }
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Keys whose effect was applied, with how many times.
    pub fn effects(&self) -> BTreeMap<String, usize> {
        counts(&self.dir.join("effects"))
    }

    /// Keys whose effect was applied, in the order the effects were.
    pub fn effects_in_order(&self) -> Vec<String> {
        let text = std::fs::read_to_string(self.dir.join("effects")).unwrap_or_default();
        text.lines().map(str::to_owned).collect()
    }

    /// Keys whose handler started, with how many times.
    pub fn started(&self) -> BTreeMap<String, usize> {
        counts(&self.dir.join("started"))
    }

    /// Records an effect.
    pub fn effect(&self, key: &str) {
        append(&self.dir.join("effects"), key);
    }

    /// Records a handler start.
    pub fn start(&self, key: &str) {
        append(&self.dir.join("started"), key);
    }
}

impl Clone for Ledger {
    fn clone(&self) -> Self {
        Self::at(self.dir.clone())
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// One line appended with one `write` on an `O_APPEND` file, so lines from
/// several processes never interleave.
fn append(path: &Path, line: &str) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open ledger");
    file.write_all(format!("{line}\n").as_bytes())
        .expect("append to ledger");
}

fn counts(path: &Path) -> BTreeMap<String, usize> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        *counts.entry(line.to_owned()).or_default() += 1;
    }
    counts
}

/// Polls `check` every 50 ms until it holds or `limit` passes; the last
/// answer.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check()
}

/// What the order handler fails with: terminal for poison, retryable
/// otherwise.
#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    /// A message no retry can fix.
    #[error("poison: {0}")]
    Poison(#[from] Terminal),
    /// A downstream hiccup on the first attempt.
    #[error("flaky downstream on attempt {0}")]
    Flaky(u32),
    /// The claim was lost before the effect.
    #[error("lease lost before the effect")]
    LeaseLost(#[from] LeaseLost),
}

/// The handler the consumer tests run, on payloads `{"id": .., "poison":
/// bool, "flaky": bool}`: notes its start, sleeps for an hour on the key
/// `slow` (to be killed there), fails terminally on poison and retryably
/// on the first attempt of a flaky message, and otherwise records exactly
/// one effect.
pub async fn order_handler<M: Message>(
    job: Job<M>,
    ledger: Ledger,
    slow: Option<String>,
) -> Result<(), OrderError> {
    let body: serde_json::Value = job.json()?;
    let key = job.key().as_str().to_owned();
    ledger.start(&key);
    if slow.as_deref() == Some(key.as_str()) {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    if body["poison"] == true {
        return Err(Terminal::new("cannot ship to the moon").into());
    }
    if body["flaky"] == true && job.ctx().attempt() == 1 {
        return Err(OrderError::Flaky(1));
    }
    job.ctx().ensure_lease()?;
    ledger.effect(&key);
    Ok(())
}

/// What an order handler returns for one delivery.
pub type Handled = Pin<Box<dyn Future<Output = Result<(), OrderError>> + Send>>;

/// [`order_handler`] as the handler a consumer's `run` takes, writing to
/// `ledger` and hanging on `slow`.
pub fn orders<M: Message>(
    ledger: Ledger,
    slow: Option<String>,
) -> impl Fn(Job<M>) -> Handled + Send + Sync + 'static {
    move |job| Box::pin(order_handler(job, ledger.clone(), slow.clone()))
}
