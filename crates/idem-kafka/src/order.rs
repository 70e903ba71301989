//! How the records of one partition may overlap: [`PartitionOrder`] and
//! the chains it makes.

use crate::message::KafkaMessage;

/// Records that must not overlap: under [`PartitionOrder::Offsets`] the
/// whole partition, under [`PartitionOrder::Keys`] one record key (a record
/// without a key overlaps with anything).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Chain {
    Partition,
    Key(Vec<u8>),
    Alone(i64),
}

/// How the records of one partition may overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PartitionOrder {
    /// One record at a time, in offset order: the partition's order is
    /// the order of effects (the default).
    Offsets,
    /// Records with different record keys run concurrently, up to
    /// `max_in_flight` of the partition at once; records with the same key
    /// run one at a time in offset order (a record waiting for a retry
    /// holds back only its key). Records without a key have no order. The
    /// committed offset still never passes an unsettled record.
    Keys {
        /// How many records of one partition may be taken at once.
        max_in_flight: usize,
    },
}

impl PartitionOrder {
    pub(crate) fn window(self) -> usize {
        match self {
            PartitionOrder::Offsets => 1,
            PartitionOrder::Keys { max_in_flight } => max_in_flight.max(1),
        }
    }

    pub(crate) fn chain(self, record: &KafkaMessage) -> Chain {
        match (self, record.record_key()) {
            (PartitionOrder::Offsets, _) => Chain::Partition,
            (PartitionOrder::Keys { .. }, Some(key)) => Chain::Key(key.to_vec()),
            (PartitionOrder::Keys { .. }, None) => Chain::Alone(record.offset()),
        }
    }
}
