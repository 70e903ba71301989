//! [`store_capabilities!`](crate::store_capabilities): a store's optional
//! capabilities wired into its `impl Store` from one declaration.

/// Wires the optional capabilities a store implements into its
/// [`Store`](crate::Store) impl, so that the executor finds them: write it
/// once inside `impl Store for …`, naming each capability the store has.
///
/// | name | the store implements | what the executor gets |
/// |---|---|---|
/// | `peek` | [`GetRecord`](crate::GetRecord) | [`Store::peek`](crate::Store::peek) answers with [`GetRecord::get`](crate::GetRecord::get): a write whose answer was lost is read back instead of reported unknown |
/// | `steps` | [`StepJournal`](crate::StepJournal) (and `Clone`) | [`Store::step_journal`](crate::Store::step_journal) returns the journal: [`Context::step`](crate::Context::step) works |
/// | `pending` | [`PendingSends`](crate::store::PendingSends) (and `Clone`) | [`Store::pending_sends`](crate::Store::pending_sends) returns the index: a run that sends marks itself pending in its completion instead of holding a marker record |
///
/// A store that implements a capability's trait but does not name it here
/// still compiles, and the executor then behaves as if the store lacked
/// it; the conformance suite (`idem-testkit`) fails for such a store.
///
/// ```
/// use std::time::Duration;
///
/// use bytes::Bytes;
/// use idem::store::{ClaimOutcome, ClaimParams, Lease};
/// use idem::{Failure, GetRecord, MemoryStore, Record, RecordId, Store, StoreError, Timestamp};
///
/// /// A store that adds nothing to the one it wraps.
/// #[derive(Clone)]
/// struct Wrapped(MemoryStore);
///
/// impl GetRecord for Wrapped {
///     async fn get(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
///         self.0.get(id).await
///     }
/// }
///
/// impl Store for Wrapped {
///     idem::store_capabilities!(peek);
///
///     async fn claim(&self, id: &RecordId, p: &ClaimParams) -> Result<ClaimOutcome, StoreError> {
///         self.0.claim(id, p).await
///     }
///     async fn complete(&self, l: &Lease, r: Bytes, keep: Duration) -> Result<(), StoreError> {
///         self.0.complete(l, r, keep).await
///     }
///     async fn fail(&self, l: &Lease, f: Failure, keep: Duration) -> Result<(), StoreError> {
///         self.0.fail(l, f, keep).await
///     }
///     async fn extend(&self, l: &Lease, d: Duration) -> Result<Timestamp, StoreError> {
///         self.0.extend(l, d).await
///     }
///     async fn release(&self, l: &Lease) -> Result<(), StoreError> {
///         self.0.release(l).await
///     }
/// }
/// ```
#[macro_export]
macro_rules! store_capabilities {
    ($($capability:ident),+ $(,)?) => {
        $( $crate::__store_capability!($capability); )+
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __store_capability {
    (peek) => {
        fn peek(
            &self,
            id: &$crate::RecordId,
        ) -> impl ::core::future::Future<
            Output = ::core::result::Result<
                ::core::option::Option<$crate::Record>,
                $crate::StoreError,
            >,
        > + ::core::marker::Send {
            <Self as $crate::GetRecord>::get(self, id)
        }
    };
    (steps) => {
        fn step_journal(
            &self,
        ) -> ::core::option::Option<::std::sync::Arc<dyn $crate::store::DynStepJournal>> {
            ::core::option::Option::Some($crate::store::journal_of(::core::clone::Clone::clone(
                self,
            )))
        }
    };
    (pending) => {
        fn pending_sends(
            &self,
        ) -> ::core::option::Option<::std::sync::Arc<dyn $crate::store::DynPendingSends>> {
            ::core::option::Option::Some($crate::store::pending_of(::core::clone::Clone::clone(
                self,
            )))
        }
    };
    ($other:ident) => {
        ::core::compile_error!(::core::concat!(
            "unknown store capability `",
            ::core::stringify!($other),
            "` (store_capabilities! takes peek, steps and pending)"
        ));
    };
}
