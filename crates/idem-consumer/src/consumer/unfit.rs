//! Why a delivery is dead-lettered before its key is claimed.

use idem::Key;

use crate::key::KeyProblem;

/// Why a delivery is dead-lettered before any claim, with the reason its
/// dead-letter carries.
#[derive(Debug, thiserror::Error)]
pub(super) enum Unfit {
    /// It has no usable key.
    #[error(transparent)]
    Key(#[from] KeyProblem),
    /// It is the last delivery the broker makes of the message
    /// ([`Message::last_delivery`](crate::Message::last_delivery)): run
    /// and returned once more (a worker that died, a connection lost
    /// before the ack), the broker would move it aside without a reason.
    #[error(
        "delivery {count} is the last the broker makes of this message (its delivery limit): \
         dead-lettered with this reason rather than run, since the broker would move it aside \
         without one if it came back once more"
    )]
    LastDelivery {
        /// The delivery's number, 1 for the first.
        count: u32,
        /// The delivery's key, for the dead-letter.
        key: Key,
    },
}

impl Unfit {
    /// The key the dead-letter names, when the delivery had one.
    pub(super) fn key(&self) -> Option<Key> {
        match self {
            Self::Key(_) => None,
            Self::LastDelivery { key, .. } => Some(key.clone()),
        }
    }
}
