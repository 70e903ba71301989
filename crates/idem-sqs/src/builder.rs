//! [`SqsConsumerBuilder`]: defaults, settings, and the start-up checks
//! against the queue.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use aws_sdk_sqs::Client;
use idem::{Codec, Store};
use idem_consumer::{Consumer, RedeliveryWindow};

use crate::broker::Sqs;
use crate::consumer::SqsConsumer;
use crate::error::{request_error, SqsError};
use crate::message::Queue;

/// The concurrency (messages in flight per worker) unless configured.
pub const DEFAULT_CONCURRENCY: usize = 16;

/// How long a receive waits for messages (SQS's longest long poll).
pub const DEFAULT_WAIT: Duration = Duration::from_secs(20);

/// Builds an [`SqsConsumer`].
pub struct SqsConsumerBuilder<S, C> {
    pub(crate) client: Client,
    pub(crate) queue_url: String,
    pub(crate) consumer: Consumer<S, C>,
    pub(crate) concurrency: usize,
    pub(crate) wait: Duration,
    pub(crate) dead_letter_url: Option<String>,
    pub(crate) accept_redrive: bool,
}

impl<S, C> std::fmt::Debug for SqsConsumerBuilder<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqsConsumerBuilder")
            .field("queue_url", &self.queue_url)
            .field("consumer", &self.consumer)
            .field("concurrency", &self.concurrency)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl<S: Store, C: Codec> SqsConsumerBuilder<S, C> {
    /// Messages processed at once (default 16).
    #[must_use]
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// How long a receive waits for messages (default 20 s, at most 20 s).
    #[must_use]
    pub fn wait_time(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Where dead-letter copies go (default: the queue `<queue>-dead`, or
    /// `<queue>-dead.fifo` for a FIFO queue, created if missing).
    #[must_use]
    pub fn dead_letter_queue(mut self, url: impl Into<String>) -> Self {
        self.dead_letter_url = Some(url.into());
        self
    }

    /// Accepts a queue with a `RedrivePolicy` (see the crate docs for why
    /// it is refused by default). Its `maxReceiveCount` is read: the last
    /// receive of a message is dead-lettered with the reason, not run.
    #[must_use]
    pub fn accept_redrive_policy(mut self) -> Self {
        self.accept_redrive = true;
        self
    }

    /// Reads and checks the queue's attributes, and creates the
    /// dead-letter queue if it is missing.
    pub async fn connect(self) -> Result<SqsConsumer<S, C>, SqsError> {
        if self.concurrency == 0 {
            return Err(SqsError::Config(
                "concurrency must be at least 1".to_owned(),
            ));
        }
        if self.wait > DEFAULT_WAIT {
            return Err(SqsError::Config(format!(
                "wait_time {:?} is longer than SQS's longest long poll (20 s)",
                self.wait
            )));
        }
        let url = &self.queue_url;
        let attributes = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .map_err(request_error(format!(
                "reading the attributes of queue {url}"
            )))?
            .attributes
            .unwrap_or_default();
        let number = |name: QueueAttributeName| -> Result<u64, SqsError> {
            let text = attributes.get(&name).ok_or_else(|| {
                SqsError::Config(format!("queue {url} did not report {}", name.as_str()))
            })?;
            text.parse().map_err(|_| {
                SqsError::Config(format!("queue {url} reported {} = {text:?}", name.as_str()))
            })
        };
        self.consumer.check_send_id_keys(crate::message::MESSAGE_ID);
        let retention = Duration::from_secs(number(QueueAttributeName::MessageRetentionPeriod)?);
        let visibility = Duration::from_secs(number(QueueAttributeName::VisibilityTimeout)?);
        self.consumer.check_windows(&[RedeliveryWindow::new(
            format!("queue {url} MessageRetentionPeriod"),
            retention,
        )])?;
        idem_consumer::check_keep_alive(
            self.consumer.idempotency(),
            &format!("queue {url} VisibilityTimeout"),
            visibility,
        )?;
        let mut last_receive = None;
        if let Some(policy) = attributes.get(&QueueAttributeName::RedrivePolicy) {
            if !self.accept_redrive {
                return Err(SqsError::Config(format!(
                    "queue {url} has RedrivePolicy {policy}: SQS moves a message to its \
                     dead-letter queue after maxReceiveCount receives without saying why, \
                     which would also move a message that only met a claim in progress or a \
                     store that was down. Remove it (idem dead-letters poison messages \
                     itself, with the reason) or call accept_redrive_policy()"
                )));
            }
            last_receive = Some(max_receive_count(url, policy)?);
        }
        let fifo = url.ends_with(".fifo");
        let dead_letter_url = match self.dead_letter_url {
            Some(dead) => dead,
            None => create_dead_letter_queue(&self.client, url, fifo).await?,
        };
        Ok(SqsConsumer {
            broker: Arc::new(Sqs {
                queue: Arc::new(Queue {
                    client: self.client,
                    url: self.queue_url,
                    visibility,
                    last_receive,
                }),
                dead_letter_url,
                fifo,
                concurrency: self.concurrency,
                wait: self.wait,
            }),
            consumer: self.consumer,
        })
    }
}

/// The `maxReceiveCount` of queue `url`'s `RedrivePolicy` (a JSON
/// object; SQS gives the count as a string, some tools as a number): the
/// last receive of a message before SQS moves it to the policy's
/// dead-letter queue.
fn max_receive_count(url: &str, policy: &str) -> Result<u32, SqsError> {
    let count = serde_json::from_str::<serde_json::Value>(policy)
        .ok()
        .and_then(|policy| match &policy["maxReceiveCount"] {
            serde_json::Value::String(text) => text.parse().ok(),
            serde_json::Value::Number(number) => number.as_u64()?.try_into().ok(),
            _ => None,
        });
    count.filter(|&c| c > 0).ok_or_else(|| {
        SqsError::Config(format!(
            "queue {url} has RedrivePolicy {policy} without a maxReceiveCount of 1 or more"
        ))
    })
}

/// Creates (or finds) `<queue>-dead`, FIFO if the queue is.
async fn create_dead_letter_queue(
    client: &Client,
    url: &str,
    fifo: bool,
) -> Result<String, SqsError> {
    let name = url.rsplit('/').next().unwrap_or(url);
    let base = name.strip_suffix(".fifo").unwrap_or(name);
    let dead = if fifo {
        format!("{base}-dead.fifo")
    } else {
        format!("{base}-dead")
    };
    let mut request = client
        .create_queue()
        .queue_name(&dead)
        .attributes(QueueAttributeName::MessageRetentionPeriod, "1209600");
    if fifo {
        request = request.attributes(QueueAttributeName::FifoQueue, "true");
    }
    let created = request
        .send()
        .await
        .map_err(request_error(format!("creating dead-letter queue {dead}")))?;
    created.queue_url.ok_or_else(|| SqsError::Request {
        what: format!("creating dead-letter queue {dead}"),
        detail: "SQS returned no queue URL".to_owned(),
    })
}

impl<S: Store> SqsConsumer<S, idem::Json> {
    /// A consumer of the queue at `queue_url`.
    pub fn builder<C: Codec>(
        client: Client,
        queue_url: &str,
        consumer: Consumer<S, C>,
    ) -> SqsConsumerBuilder<S, C> {
        SqsConsumerBuilder {
            client,
            queue_url: queue_url.to_owned(),
            consumer,
            concurrency: DEFAULT_CONCURRENCY,
            wait: DEFAULT_WAIT,
            dead_letter_url: None,
            accept_redrive: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::max_receive_count;

    #[test]
    fn the_max_receive_count_is_read_as_sqs_and_tools_write_it() {
        let arn = "arn:aws:sqs:us-east-1:000000000000:dead";
        for (policy, count) in [
            (
                format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"5"}}"#),
                5,
            ),
            (
                format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":7}}"#),
                7,
            ),
        ] {
            assert_eq!(max_receive_count("q", &policy).expect("read"), count);
        }
        for policy in [
            format!(r#"{{"deadLetterTargetArn":"{arn}"}}"#),
            format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"0"}}"#),
            "not json".to_owned(),
        ] {
            let err = max_receive_count("q", &policy).expect_err("refused");
            assert!(err.to_string().contains("maxReceiveCount"), "{err}");
        }
    }
}
