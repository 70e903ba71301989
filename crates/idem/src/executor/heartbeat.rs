//! The heartbeat that extends a run's lease while its handler works.

use std::convert::Infallible;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{deadline, Held, Idempotency};
use crate::codec::Codec;
use crate::metrics as m;
use crate::record::Lease;
use crate::store::{Store, StoreError};

impl<S: Store, C: Codec> Idempotency<S, C> {
    /// Extends the lease every heartbeat interval, and raises the lost flag
    /// as soon as the lease is known or feared lost: when the store says so,
    /// or when the lease as last confirmed runs out (measured conservatively
    /// from when the confirming request was sent) before an extension is
    /// confirmed, even if the store has not answered at all.
    pub(super) async fn heartbeat(
        &self,
        lease: &Lease,
        claim_sent: Instant,
        held: watch::Sender<Held>,
    ) -> Infallible {
        let lease_len = self.config.lease;
        let every = self.config.heartbeat;
        let mut confirmed_until = deadline(claim_sent, lease_len);
        let mut next_beat = deadline(claim_sent, every);
        let flag = |why: &'static str| {
            if held.send_if_modified(|h| !std::mem::replace(&mut h.lost, true)) {
                m::count(m::LEASE_LOST, &[("at", "heartbeat")]);
                tracing::warn!(
                    scope = %lease.id.scope(),
                    key = %self.logged_key(&lease.id),
                    why,
                    "lease lost"
                );
            }
        };
        loop {
            let flagged = held.borrow().lost;
            let wake = if flagged {
                next_beat
            } else {
                next_beat.min(confirmed_until)
            };
            tokio::time::sleep_until(wake).await;
            if !flagged && Instant::now() >= confirmed_until {
                flag("no extension was confirmed before the lease ran out");
            }
            if Instant::now() < next_beat {
                continue;
            }
            let sent = Instant::now();
            let extend = m::timed(m::OP_EXTEND, self.store.extend(lease, lease_len));
            tokio::pin!(extend);
            let result = if held.borrow().lost {
                extend.await
            } else {
                tokio::select! {
                    result = &mut extend => result,
                    () = tokio::time::sleep_until(confirmed_until) => {
                        flag("the store did not confirm an extension before the lease ran out");
                        extend.await
                    }
                }
            };
            next_beat = deadline(Instant::now(), every);
            match result {
                Ok(_) => {
                    confirmed_until = deadline(sent, lease_len);
                    if !held.borrow().lost {
                        held.send_modify(|h| {
                            h.beats += 1;
                            h.until = Some(confirmed_until);
                        });
                    }
                }
                Err(StoreError::LeaseLost) => {
                    flag("another worker took over");
                    return std::future::pending().await;
                }
                Err(error) => tracing::warn!(
                    scope = %lease.id.scope(),
                    key = %self.logged_key(&lease.id),
                    %error,
                    "heartbeat failed"
                ),
            }
        }
    }
}
