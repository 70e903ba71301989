//! An effects ledger for consumer tests: handlers append one line per
//! effect to a file, from any number of worker processes, and the test
//! counts lines per key to prove one effect per message and none lost.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::outbox::{Message as Emitted, SendFuture, Sender};
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

    /// The ledger of a pipeline's second hop, in a directory inside this
    /// one (removed with it).
    pub fn output(&self) -> Self {
        let dir = self.dir.join("out");
        std::fs::create_dir_all(&dir).expect("ledger directory");
        Self::at(dir)
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

    /// Records a handler start under the lease with `fence`, by this
    /// process.
    pub fn start_fenced(&self, key: &str, fence: u64) {
        let pid = std::process::id();
        append(
            &self.dir.join("started-fenced"),
            &format!("{key} {fence} {pid}"),
        );
    }

    /// The process that recorded the latest fenced handler start: one in
    /// the middle of a handler, most likely.
    pub fn latest_starter(&self) -> Option<u32> {
        last_pid(&self.dir.join("started-fenced"))
    }

    /// The process that made the latest fenced write: one between its
    /// effect and its acknowledgement, most likely.
    pub fn latest_writer(&self) -> Option<u32> {
        last_pid(&self.dir.join("writes"))
    }

    /// Records that this process is about to send message `id`.
    pub fn sending(&self, id: &str) {
        let pid = std::process::id();
        append(&self.dir.join("sends"), &format!("{id} {pid}"));
    }

    /// Sends started, counting each attempt.
    pub fn sends(&self) -> usize {
        let text = std::fs::read_to_string(self.dir.join("sends")).unwrap_or_default();
        text.lines().count()
    }

    /// The process that last started a send: one between a stored
    /// completion and its messages' confirmation, most likely.
    pub fn latest_sender(&self) -> Option<u32> {
        last_pid(&self.dir.join("sends"))
    }

    /// Handler starts with their fences, per key, in the order they were
    /// recorded.
    pub fn fenced_starts(&self) -> BTreeMap<String, Vec<u64>> {
        let text = std::fs::read_to_string(self.dir.join("started-fenced")).unwrap_or_default();
        let mut starts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for line in text.lines() {
            let mut parts = line.split(' ');
            if let (Some(key), Some(Ok(fence))) = (parts.next(), parts.next().map(str::parse)) {
                starts.entry(key.to_owned()).or_default().push(fence);
            }
        }
        starts
    }

    /// A fenced write to the downstream kept in the ledger: under an
    /// exclusive lock on the key's lock file, the write with `fence`
    /// replaces what the key holds only if the held fence is lower (a
    /// stale holder's write is refused, as a database's conditional
    /// update would). The new value replaces the old by a rename, so a
    /// writer killed midway leaves the old one. Whether it was applied.
    pub fn fenced_write(&self, key: &str, fence: u64) -> std::io::Result<bool> {
        let dir = self.dir.join("downstream");
        std::fs::create_dir_all(&dir)?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("{key}.lock")))?;
        lock.lock()?;
        let held = self.downstream(key);
        let applied = held.is_none_or(|held| held < fence);
        if applied {
            let partial = dir.join(format!("{key}.{}", std::process::id()));
            std::fs::write(&partial, fence.to_string())?;
            std::fs::rename(&partial, dir.join(key))?;
        }
        let verdict = if applied { "applied" } else { "stale" };
        let pid = std::process::id();
        append(
            &self.dir.join("writes"),
            &format!("{key} {fence} {verdict} {pid}"),
        );
        Ok(applied)
    }

    /// The fence of the write the downstream holds for `key`.
    pub fn downstream(&self, key: &str) -> Option<u64> {
        std::fs::read_to_string(self.dir.join("downstream").join(key))
            .ok()?
            .parse()
            .ok()
    }

    /// Fenced writes refused as stale.
    pub fn stale_writes(&self) -> usize {
        let text = std::fs::read_to_string(self.dir.join("writes")).unwrap_or_default();
        text.lines().filter(|l| l.contains(" stale ")).count()
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

/// The process id ending the last whole line of `path`.
fn last_pid(path: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(path).ok()?;
    text.strip_suffix('\n')?
        .lines()
        .last()?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
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
    #[error("poison")]
    Poison(#[from] Terminal),
    /// A downstream hiccup on the first attempt.
    #[error("flaky downstream on attempt {0}")]
    Flaky(u32),
    /// The claim was lost before the effect.
    #[error("lease lost before the effect")]
    LeaseLost(#[from] LeaseLost),
    /// The downstream write failed.
    #[error("downstream write failed")]
    Downstream(#[from] std::io::Error),
    /// The outbox refused the message to the next hop.
    #[error("the outbox refused the message")]
    Send(#[from] idem::outbox::SendError),
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

/// What a consumer's handler does with each delivery.
#[derive(Debug, Clone)]
pub enum Work {
    /// [`order_handler`], hanging on the key given.
    Orders {
        /// The key to hang on, to be killed there.
        slow: Option<String>,
    },
    /// [`fenced_handler`]: fenced writes, for runs where a stale holder
    /// can wake up mid-handler.
    Fenced,
    /// [`fenced_handler`] emitting each good message to the pipeline's
    /// next hop through the run outbox.
    Pipeline(Hop),
}

/// Where a pipeline's first hop emits: the next hop's destination, and
/// the broker's sender (each send noted in the ledger first, so a kill
/// can aim between a stored completion and its confirmation).
#[derive(Clone)]
pub struct Hop {
    /// The destination messages are addressed to.
    pub to: String,
    /// The sender the run outbox confirms through.
    pub sender: Arc<dyn Sender>,
}

impl Hop {
    /// The hop's sender, noting each send in `ledger` before it starts.
    pub fn noted(&self, ledger: &Ledger) -> Arc<dyn Sender> {
        Arc::new(Noted {
            inner: Arc::clone(&self.sender),
            ledger: ledger.clone(),
        })
    }
}

impl std::fmt::Debug for Hop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hop")
            .field("to", &self.to)
            .finish_non_exhaustive()
    }
}

/// A sender that notes each send in a ledger before it starts.
struct Noted {
    inner: Arc<dyn Sender>,
    ledger: Ledger,
}

impl Sender for Noted {
    /// Notes the send and pauses a few milliseconds before and after it,
    /// so kills aimed at the latest sender land between a stored
    /// completion and the send, and between the send and its
    /// confirmation being recorded.
    fn send<'a>(&'a self, message: &'a Emitted) -> SendFuture<'a> {
        Box::pin(async move {
            self.ledger.sending(message.id());
            pause().await;
            self.inner.send(message).await?;
            pause().await;
            Ok(())
        })
    }
}

impl Work {
    /// The handler a consumer's `run` takes, writing to `ledger`.
    pub fn handler<M: Message>(
        self,
        ledger: Ledger,
    ) -> impl Fn(Job<M>) -> Handled + Send + Sync + 'static {
        move |job| match &self {
            Work::Orders { slow } => Box::pin(order_handler(job, ledger.clone(), slow.clone())),
            Work::Fenced => Box::pin(fenced_handler(job, ledger.clone(), None)),
            Work::Pipeline(hop) => {
                Box::pin(fenced_handler(job, ledger.clone(), Some(hop.to.clone())))
            }
        }
    }
}

/// The handler of the fault-injection runs ([`chaos`](crate::chaos)), on
/// payloads `{"id": .., "poison": bool}`: notes its start with its fence,
/// pauses a few milliseconds (so faults land inside handlers), fails
/// terminally on poison, and otherwise makes a
/// [fenced write](Ledger::fenced_write), emits the payload to `to` when
/// given (through the run outbox: a fresh message id every run) and
/// pauses again (so faults land between the effect and the completion).
pub async fn fenced_handler<M: Message>(
    job: Job<M>,
    ledger: Ledger,
    to: Option<String>,
) -> Result<(), OrderError> {
    let body: serde_json::Value = job.json()?;
    let key = job.key().as_str().to_owned();
    let fence = job.ctx().fence().unwrap_or(0);
    ledger.start_fenced(&key, fence);
    pause().await;
    if body["poison"] == true {
        return Err(Terminal::new("cannot ship to the moon").into());
    }
    let writer = ledger.clone();
    tokio::task::spawn_blocking(move || writer.fenced_write(&key, fence))
        .await
        .map_err(std::io::Error::other)??;
    if let Some(to) = to {
        job.ctx().send(Emitted::new(to, job.payload().to_vec()))?;
    }
    pause().await;
    Ok(())
}

/// A few milliseconds of "work".
async fn pause() {
    tokio::time::sleep(Duration::from_millis(rand::random_range(10..150))).await;
}

/// [`order_handler`] as the handler a consumer's `run` takes, writing to
/// `ledger` and hanging on `slow`.
pub fn orders<M: Message>(
    ledger: Ledger,
    slow: Option<String>,
) -> impl Fn(Job<M>) -> Handled + Send + Sync + 'static {
    Work::Orders { slow }.handler(ledger)
}
