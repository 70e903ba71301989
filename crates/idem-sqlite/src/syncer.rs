//! The syncer thread: answers the writer's batches once the log's fsync
//! covers them (`durable.rs` says when the writer hands one over).

use std::sync::mpsc::Receiver;

use idem::StoreError;
use tokio::sync::oneshot;

use crate::durable::{broken, Durable};
use crate::jobs::Done;

/// Replies and the answers they carry.
pub(crate) type Answers = Vec<(
    oneshot::Sender<Result<Done, StoreError>>,
    Result<Done, StoreError>,
)>;

/// A batch that ended (committed or rolled back), its answers waiting for
/// the log's fsync.
pub(crate) struct Committed {
    /// Its number ([`Durable::begin`]).
    pub(crate) number: u64,
    pub(crate) answers: Answers,
}

impl Committed {
    /// Sends the answers, or the sync's failure in their place.
    pub(crate) fn answer(self, synced: &Result<(), StoreError>) {
        for (reply, done) in self.answers {
            let _ = reply.send(match synced {
                Ok(()) => done,
                Err(_) => Err(broken()),
            });
        }
    }
}

/// Fsyncs the log once for every batch committed before the fsync began,
/// then answers them; ends when the writer does.
pub(crate) fn run(durable: &Durable, committed: Receiver<Committed>) {
    while let Ok(first) = committed.recv() {
        let mut ready = vec![first];
        ready.extend(committed.try_iter());
        let upto = ready.iter().map(|batch| batch.number).max().unwrap_or(0);
        let synced = durable.sync(upto);
        for batch in ready {
            batch.answer(&synced);
        }
    }
}
