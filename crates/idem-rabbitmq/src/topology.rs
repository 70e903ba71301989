//! The queues the consumer declares (retry queues by delay, the
//! dead-letter queue), and the rules its settings must keep.

use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::Channel;

use crate::error::RabbitError;

pub(crate) fn validate(
    queue: &str,
    prefetch: u16,
    delays: &[Duration],
    kind: QueueKind,
) -> Result<(), RabbitError> {
    if let (false, Some(limit)) = (kind.quorum, kind.delivery_limit) {
        return Err(RabbitError::Config(format!(
            "a delivery limit ({limit}) needs a quorum queue: call quorum() as well \
             (classic queues have no x-delivery-limit)"
        )));
    }
    if queue.is_empty() || queue.len() > 200 {
        return Err(RabbitError::Config(format!(
            "queue name must be 1..=200 bytes (the retry and dead-letter queues add a suffix), \
             got {} bytes",
            queue.len()
        )));
    }
    if prefetch == 0 {
        return Err(RabbitError::Config(
            "prefetch must be at least 1 (0 means unlimited in AMQP)".to_owned(),
        ));
    }
    if delays.is_empty() {
        return Err(RabbitError::Config(
            "at least one retry delay is needed".to_owned(),
        ));
    }
    if let Some(bad) = delays
        .iter()
        .find(|d| d.as_millis() == 0 || d.as_millis() > u128::from(u32::MAX))
    {
        return Err(RabbitError::Config(format!(
            "retry delay {bad:?} must be 1 ms to {} ms",
            u32::MAX
        )));
    }
    Ok(())
}

/// The type of the queues the consumer declares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct QueueKind {
    /// Quorum queues (`x-queue-type: quorum`), not classic ones (the
    /// type when none is given).
    pub(crate) quorum: bool,
    /// The queue's `x-delivery-limit`; only a quorum queue has one, which
    /// [`validate`] checks.
    pub(crate) delivery_limit: Option<u32>,
}

pub(crate) struct Topology {
    pub(crate) queue: String,
    pub(crate) retries: Vec<Duration>,
    pub(crate) message_ttl: Option<Duration>,
    pub(crate) kind: QueueKind,
}

impl Topology {
    pub(crate) fn dead(&self) -> String {
        format!("{}.dead", self.queue)
    }

    pub(crate) fn retry_queue(&self, delay: Duration) -> String {
        format!("{}.retry.{}ms", self.queue, delay.as_millis())
    }

    /// The retry queue for a delay: the smallest at least as long, or the
    /// longest.
    pub(crate) fn retry_for(&self, after: Duration) -> String {
        let delay = self
            .retries
            .iter()
            .copied()
            .find(|d| *d >= after)
            .or_else(|| self.retries.last().copied())
            .unwrap_or(after);
        self.retry_queue(delay)
    }

    /// The number of the broker's last delivery of a message from the
    /// queue (see [`idem_consumer::Message::last_delivery`]): a quorum
    /// queue moves a message aside once it has been returned more often
    /// than its delivery limit, so the last delivery is the limit's plus
    /// one.
    pub(crate) fn last_delivery(&self) -> Option<u32> {
        self.kind
            .delivery_limit
            .map(|limit| limit.saturating_add(1))
    }

    /// `args` with the arguments of the queue type: for a quorum queue its
    /// type and, where it dead-letters (`dead_letters`), at-least-once
    /// dead-lettering (a quorum queue's default drops a message whose
    /// target does not confirm it, and its retry queues dead-letter every
    /// retry back to the queue).
    fn typed(&self, mut args: FieldTable, dead_letters: bool) -> FieldTable {
        if self.kind.quorum {
            args.insert("x-queue-type".into(), long_string("quorum"));
            if dead_letters {
                args.insert(
                    "x-dead-letter-strategy".into(),
                    long_string("at-least-once"),
                );
                args.insert("x-overflow".into(), long_string("reject-publish"));
            }
        }
        args
    }

    pub(crate) async fn declare(&self, channel: &Channel) -> Result<(), RabbitError> {
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        let declare = |name: String, args: FieldTable| async move {
            channel
                .queue_declare(name.as_str().into(), durable, args)
                .await
                .map_err(|source| RabbitError::Declare {
                    queue: name.clone(),
                    source,
                })
        };
        declare(self.dead(), self.typed(FieldTable::default(), false)).await?;
        let mut main = dead_letter_to(&self.dead());
        if let Some(ttl) = self.message_ttl {
            main.insert("x-message-ttl".into(), millis(ttl));
        }
        if let Some(limit) = self.kind.delivery_limit {
            main.insert(
                "x-delivery-limit".into(),
                AMQPValue::LongLongInt(limit.into()),
            );
        }
        declare(self.queue.clone(), self.typed(main, true)).await?;
        for delay in &self.retries {
            let mut args = dead_letter_to(&self.queue);
            args.insert("x-message-ttl".into(), millis(*delay));
            declare(self.retry_queue(*delay), self.typed(args, true)).await?;
        }
        Ok(())
    }
}

pub(crate) fn dead_letter_to(queue: &str) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-dead-letter-exchange".into(), long_string(""));
    args.insert("x-dead-letter-routing-key".into(), long_string(queue));
    args
}

pub(crate) fn millis(d: Duration) -> AMQPValue {
    AMQPValue::LongLongInt(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

pub(crate) fn long_string(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DEFAULT_RETRY_DELAYS;

    #[test]
    fn a_retry_goes_to_the_smallest_queue_at_least_as_long() {
        let t = Topology {
            queue: "q".to_owned(),
            retries: DEFAULT_RETRY_DELAYS.to_vec(),
            message_ttl: None,
            kind: QueueKind::default(),
        };
        assert_eq!(t.retry_for(Duration::from_millis(1)), "q.retry.1000ms");
        assert_eq!(t.retry_for(Duration::from_secs(1)), "q.retry.1000ms");
        assert_eq!(t.retry_for(Duration::from_millis(1001)), "q.retry.5000ms");
        assert_eq!(t.retry_for(Duration::from_secs(3600)), "q.retry.600000ms");
    }

    #[test]
    fn bad_configuration_is_refused_with_the_rule() {
        let ok = [Duration::from_secs(1)];
        let classic = QueueKind::default();
        let quorum = QueueKind {
            quorum: true,
            delivery_limit: Some(5),
        };
        assert!(validate("q", 16, &ok, classic).is_ok());
        assert!(validate("q", 16, &ok, quorum).is_ok());
        let limited_classic = QueueKind {
            quorum: false,
            delivery_limit: Some(5),
        };
        for (queue, prefetch, delays, kind, needle) in [
            ("", 16, &ok[..], classic, "1..=200 bytes"),
            ("q", 0, &ok[..], classic, "prefetch"),
            ("q", 16, &[][..], classic, "at least one retry delay"),
            ("q", 16, &[Duration::ZERO][..], classic, "must be 1 ms"),
            ("q", 16, &ok[..], limited_classic, "needs a quorum queue"),
        ] {
            let err = validate(queue, prefetch, delays, kind).expect_err("refused");
            assert!(err.to_string().contains(needle), "{err}");
        }
    }
}
