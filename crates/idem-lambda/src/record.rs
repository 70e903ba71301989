//! One record of a batch event, as the consumer layer reads it: SQS
//! messages, Kinesis records and DynamoDB stream records alike.

use std::collections::BTreeMap;

use aws_lambda_events::event::dynamodb::EventRecord;
use aws_lambda_events::event::kinesis::KinesisEventRecord;
use aws_lambda_events::event::sqs::SqsMessage;
use bytes::Bytes;
use idem_consumer::Message;

/// Where a record came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// An SQS standard queue: records are independent.
    Sqs,
    /// An SQS FIFO queue: records are in order within their group.
    SqsFifo,
    /// A Kinesis stream: records are in order within their shard.
    Kinesis,
    /// A DynamoDB stream: records are in order within their shard.
    DynamoDbStreams,
}

impl Source {
    /// Whether the records must be handled in order, so that a failed
    /// record fails every record after it too (Lambda delivers them again
    /// from the first failure).
    pub fn ordered(self) -> bool {
        !matches!(self, Source::Sqs)
    }
}

/// SQS system attributes a key may be read from, after the message
/// attributes.
const SQS_SYSTEM_ATTRIBUTES: [&str; 3] = ["MessageDeduplicationId", "MessageGroupId", "SenderId"];

/// A record of a Lambda batch event, handed to the handler in its
/// [`Job`](idem_consumer::Job).
///
/// | source | [`payload`](Message::payload) | [`header`](Message::header) | [`message_id`](Message::message_id) | [`item_id`](Self::item_id) |
/// |---|---|---|---|---|
/// | SQS | the body | message attributes (string and number), then `MessageDeduplicationId`, `MessageGroupId`, `SenderId` | `messageId` | `messageId` |
/// | Kinesis | the data, decoded | `PartitionKey` | `eventID` | the sequence number |
/// | DynamoDB Streams | the stream record as Lambda sent it (`eventID`, `eventName`, `dynamodb` with `Keys`, `NewImage`, `OldImage`, `SequenceNumber`) | `EventName` (`INSERT`, `MODIFY`, `REMOVE`) | `eventID` | the sequence number |
///
/// Every one of those message ids is assigned per send: a key read from
/// it catches Lambda's redeliveries of the batch, not a producer that
/// sends the same thing twice. Key on something the producer sets (a
/// message attribute, a field of the payload) for that. A DynamoDB
/// stream's `eventID` names one change, the right key for its records: an
/// item's own key would make its next change a duplicate of the first.
#[derive(Debug, Clone)]
pub struct Record {
    source: Source,
    item_id: Option<String>,
    payload: Bytes,
    headers: BTreeMap<String, String>,
    message_id: Option<String>,
    delivery_count: Option<u32>,
}

impl Record {
    /// An SQS message; `fifo` for a FIFO queue's.
    pub fn from_sqs(message: SqsMessage, fifo: bool) -> Self {
        let mut headers = BTreeMap::new();
        for name in SQS_SYSTEM_ATTRIBUTES {
            if let Some(value) = message.attributes.get(name) {
                headers.insert(name.to_owned(), value.clone());
            }
        }
        for (name, value) in message.message_attributes {
            if let Some(text) = value.string_value {
                headers.insert(name, text);
            }
        }
        let delivery_count = message
            .attributes
            .get("ApproximateReceiveCount")
            .and_then(|count| count.parse().ok());
        Self {
            source: if fifo { Source::SqsFifo } else { Source::Sqs },
            item_id: message.message_id.clone(),
            payload: Bytes::from(message.body.unwrap_or_default()),
            headers,
            message_id: message.message_id,
            delivery_count,
        }
    }

    /// A Kinesis record.
    pub fn from_kinesis(record: KinesisEventRecord) -> Self {
        let kinesis = record.kinesis;
        Self {
            source: Source::Kinesis,
            item_id: Some(kinesis.sequence_number),
            payload: Bytes::from(kinesis.data.0),
            headers: BTreeMap::from([("PartitionKey".to_owned(), kinesis.partition_key)]),
            message_id: record.event_id,
            delivery_count: None,
        }
    }

    /// A DynamoDB stream record. The payload is the whole record, as
    /// Lambda sent it: one change, delivered again, is the same bytes;
    /// two changes to one item are not.
    pub fn from_dynamodb(record: EventRecord) -> Self {
        let payload = serde_json::to_vec(&record).unwrap_or_default();
        Self {
            source: Source::DynamoDbStreams,
            item_id: record.change.sequence_number,
            payload: Bytes::from(payload),
            headers: BTreeMap::from([("EventName".to_owned(), record.event_name)]),
            message_id: Some(record.event_id),
            delivery_count: None,
        }
    }

    /// Where it came from.
    pub fn source(&self) -> Source {
        self.source
    }

    /// What Lambda's `batchItemFailures` name it by (`None` when the event
    /// left it out: then only the whole batch can be failed).
    pub fn item_id(&self) -> Option<&str> {
        self.item_id.as_deref()
    }
}

impl Message for Record {
    fn payload(&self) -> &[u8] {
        &self.payload
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    fn message_id(&self) -> Option<&str> {
        self.message_id.as_deref()
    }

    fn message_id_per_send(&self) -> Option<&'static str> {
        Some(match self.source {
            Source::Sqs | Source::SqsFifo => "SQS MessageId",
            Source::Kinesis => "Kinesis eventID",
            Source::DynamoDbStreams => "DynamoDB Streams eventID",
        })
    }

    fn delivery_count(&self) -> Option<u32> {
        self.delivery_count
    }
}
