//! [`MemoryStore`]: a sharded in-process store. Fast and exact, but it
//! forgets everything when the process exits: use it for tests, for
//! single-process deduplication of transient work, and as the reference
//! implementation of the contract.

mod admin;
mod builder;
mod horizon;
mod many;
mod pending;
mod shard;
mod steps;
mod store;

pub use builder::{MemoryStoreBuilder, DEFAULT_MAX_RECORDS, DEFAULT_SHARDS};
pub use store::MemoryStore;
