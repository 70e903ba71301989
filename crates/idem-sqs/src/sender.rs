//! The outbox's last hop to SQS: [`SqsSender`].

use aws_sdk_sqs::error::ProvideErrorMetadata;
use aws_sdk_sqs::types::MessageAttributeValue;
use aws_sdk_sqs::Client;
use idem::outbox::{Message, SendError, SendFuture, Sender};

/// The header that names a message's group on a FIFO queue; without it
/// each message is a group of its own (no order kept between them).
pub const GROUP_HEADER: &str = "Message-Group-Id";

/// How many message attributes SQS takes on one message.
const MAX_ATTRIBUTES: usize = 10;

/// Sends a run's outbox messages ([`idem::outbox`]) to SQS: the
/// destination is the queue URL, the payload the body (SQS bodies are
/// text: a payload that is not UTF-8 is refused), headers become String
/// message attributes, with `Idempotency-Key` carrying the message's id
/// (what an idem consumer downstream keys on). On a FIFO queue (its URL
/// ends in `.fifo`) the id is also the `MessageDeduplicationId`, so SQS
/// drops a message sent again within its five-minute window, and the
/// [`GROUP_HEADER`] header, if any, is the `MessageGroupId`. A send is
/// confirmed when `SendMessage` answers.
///
/// ```no_run
/// let client = idem_sqs::client_from_env(None)?;
/// let idem = idem::Idempotency::builder(idem::MemoryStore::new())
///     .outbox(idem_sqs::SqsSender::new(client))
///     .build()?;
/// # let _ = idem;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct SqsSender {
    client: Client,
}

impl SqsSender {
    /// Sends with `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

impl Sender for SqsSender {
    fn send<'a>(&'a self, message: &'a Message) -> SendFuture<'a> {
        Box::pin(async move {
            let body = std::str::from_utf8(message.payload())
                .map_err(|_| SendError::Refused("an SQS message body must be UTF-8 text".into()))?;
            let queue = message.destination();
            let mut send = self
                .client
                .send_message()
                .queue_url(queue)
                .message_body(body);
            let mut group = None;
            let mut attributes = 0;
            for (name, value) in message.stamped_headers() {
                if name.eq_ignore_ascii_case(GROUP_HEADER) {
                    group = Some(value);
                    continue;
                }
                attributes += 1;
                if attributes > MAX_ATTRIBUTES {
                    return Err(SendError::Refused(
                        format!("SQS takes at most {MAX_ATTRIBUTES} message attributes").into(),
                    ));
                }
                let value = MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(value)
                    .build()
                    .map_err(|e| SendError::Refused(e.into()))?;
                send = send.message_attributes(name, value);
            }
            if queue.ends_with(".fifo") {
                send = send
                    .message_deduplication_id(message.id())
                    .message_group_id(group.unwrap_or(message.id()));
            }
            match send.send().await {
                Ok(_) => Ok(()),
                Err(error) => {
                    let refused =
                        error
                            .as_service_error()
                            .and_then(|e| e.code())
                            .is_some_and(|code| {
                                [
                                    "NonExistentQueue",
                                    "QueueDoesNotExist",
                                    "InvalidMessageContents",
                                    "InvalidParameterValue",
                                    "InvalidAttributeValue",
                                    "UnsupportedOperation",
                                ]
                                .iter()
                                .any(|refusal| code.contains(refusal))
                            });
                    let error = aws_sdk_sqs::error::DisplayErrorContext(error).to_string();
                    Err(if refused {
                        SendError::Refused(error.into())
                    } else {
                        SendError::Unavailable(error.into())
                    })
                }
            }
        })
    }
}
