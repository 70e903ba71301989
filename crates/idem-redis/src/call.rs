//! One call of a store primitive on one record, as the scripts take it:
//! what the batch script (`lua/batch.lua`) and each primitive's own
//! script run.

use bytes::Bytes;

/// A primitive the batch script runs: its code there and how many
/// arguments follow the code (see `lua/batch.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Claim,
    Complete,
    Fail,
    Extend,
    Release,
    /// A completion that marks its run pending (`lua/pending.lua`).
    CompletePending,
    /// A confirmation clearing a run's mark (`lua/pending.lua`).
    Confirm,
}

impl Op {
    /// Every primitive, in the order the batch script defines them.
    pub(crate) const ALL: [Op; 7] = [
        Op::Claim,
        Op::Complete,
        Op::Fail,
        Op::Extend,
        Op::Release,
        Op::CompletePending,
        Op::Confirm,
    ];

    pub(crate) fn code(self) -> &'static [u8] {
        match self {
            Op::Claim => b"c",
            Op::Complete => b"d",
            Op::Fail => b"f",
            Op::Extend => b"x",
            Op::Release => b"r",
            Op::CompletePending => b"p",
            Op::Confirm => b"o",
        }
    }

    pub(crate) fn arity(self) -> usize {
        match self {
            Op::Claim => 8,
            Op::Complete => 5,
            Op::Fail => 6,
            Op::Extend => 3,
            Op::Release => 1,
            Op::CompletePending => 6,
            Op::Confirm => 1,
        }
    }

    /// Whether the primitive touches the record's pending mark, which its
    /// own script call declares beside the record.
    pub(crate) fn marks(self) -> bool {
        matches!(self, Op::CompletePending | Op::Confirm)
    }
}

/// One call of a primitive on one record.
pub(crate) struct Call {
    pub(crate) op: Op,
    pub(crate) key: String,
    pub(crate) args: Vec<Bytes>,
}

impl Call {
    pub(crate) fn bytes(&self) -> usize {
        self.key.len() + self.args.iter().map(Bytes::len).sum::<usize>()
    }

    /// The arguments as a script call takes them.
    pub(crate) fn arg_slices(&self) -> Vec<&[u8]> {
        self.args.iter().map(Bytes::as_ref).collect()
    }
}
