//! What every blob store must do ([`idem::blob::BlobStore`]), proved the
//! same way for each: a store crate calls [`blob_store_suite`] with its
//! store, and the [`idem::blob::sweep()`] rules are checked against it with
//! a [`idem::MemoryStore`] holding the records.

use std::time::Duration;

use bytes::Bytes;
use idem::blob::{BlobError, BlobOwner, BlobRef, BlobStore, Blobs};
use idem::{Fingerprint, MemoryStore, RecordId, Store};

fn owner(case: &str, fence: u64) -> BlobOwner {
    let scope = format!("blobs {case} {:016x}", rand::random::<u64>());
    BlobOwner::new(&RecordId::parse(&scope, "k").expect("id"), fence)
}

/// `len` bytes of a pattern.
fn pattern(len: usize) -> Bytes {
    (0..len)
        .map(|i| (i % 253) as u8)
        .collect::<Vec<u8>>()
        .into()
}

async fn put(blobs: &Blobs, owner: &BlobOwner, body: &Bytes, chunk: usize) -> BlobRef {
    let mut sink = blobs.create(owner).await.expect("create");
    for part in body.chunks(chunk.max(1)) {
        sink.write(Bytes::copy_from_slice(part))
            .await
            .expect("write");
    }
    sink.finish().await.expect("finish")
}

/// Whether a store lists the blobs being written (or cut off) beside the
/// finished ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partials {
    /// Listed, as partial, so the sweep removes those cut off.
    Listed,
    /// Not listed: the service cleans up writes cut off (an S3 bucket's
    /// lifecycle rule for incomplete multipart uploads).
    LeftToTheService,
}

/// Runs every case against `store` (blobs left behind are the cases'
/// own, under random owners).
pub async fn blob_store_suite(store: impl BlobStore + Clone, partials: Partials) {
    written_whole_read_back_checked(store.clone()).await;
    invisible_until_finished_and_deletable(store.clone()).await;
    listed_in_pages(store.clone(), partials).await;
    swept_by_their_records(store).await;
}

/// Bytes written in chunks of any size come back the same, checked
/// against the digest and length; other digests and lengths are
/// [`BlobError::Corrupt`], never silently passed off.
async fn written_whole_read_back_checked(store: impl BlobStore) {
    let blobs = Blobs::new(store);
    for (len, chunk) in [(0, 1), (1, 1), (70_000, 4096), (3 << 20, 300_000)] {
        let body = pattern(len);
        let blob = put(&blobs, &owner("whole", 1), &body, chunk).await;
        assert_eq!(blob.len, len as u64);
        let read = blobs.read_all(&blob).await.expect("read");
        assert_eq!(read.len(), len, "length of a {len}-byte blob");
        assert!(read == body[..], "bytes of a {len}-byte blob");
    }
    let body = pattern(10_000);
    let blob = put(&blobs, &owner("whole", 1), &body, 999).await;
    let mut other = blob.clone();
    other.digest[0] ^= 1;
    assert!(matches!(
        blobs.read_all(&other).await,
        Err(BlobError::Corrupt { .. })
    ));
    let shorter = BlobRef {
        len: blob.len - 1,
        ..blob.clone()
    };
    assert!(matches!(
        blobs.read_all(&shorter).await,
        Err(BlobError::Corrupt { .. })
    ));
    let longer = BlobRef {
        len: blob.len + 1,
        ..blob
    };
    assert!(matches!(
        blobs.read_all(&longer).await,
        Err(BlobError::Corrupt { .. })
    ));
    let limited = blobs.clone().max_bytes(100);
    let mut sink = limited.create(&owner("whole", 1)).await.expect("create");
    assert!(matches!(
        sink.write(pattern(101)).await,
        Err(BlobError::TooLarge { limit: 100 })
    ));
}

/// Nothing is read at a locator until its blob is finished; a deleted
/// blob reads as missing.
async fn invisible_until_finished_and_deletable(store: impl BlobStore) {
    let owner = owner("visible", 3);
    let locator = owner.new_locator();
    let mut writer = store.create(&locator, &owner).await.expect("create");
    writer.write(pattern(5000)).await.expect("write");
    assert!(
        store.open(&locator).await.expect("open").is_none(),
        "an unfinished blob is not read"
    );
    writer.finish().await.expect("finish");
    assert!(store.open(&locator).await.expect("open").is_some());
    assert!(store.delete(&locator).await.expect("delete"));
    assert!(store.open(&locator).await.expect("open").is_none());
    assert!(!store.delete(&locator).await.expect("delete again"));
}

/// Every blob is listed once, in locator order, a page at a time, with
/// its owner and whether it is finished.
async fn listed_in_pages(store: impl BlobStore + Clone, partials: Partials) {
    let owner = owner("listed", 4);
    let blobs = Blobs::new(store.clone());
    let mut mine = Vec::new();
    for _ in 0..5 {
        mine.push(put(&blobs, &owner, &pattern(10), 10).await.locator);
    }
    let partial = owner.new_locator();
    let mut writer = store.create(&partial, &owner).await.expect("create");
    writer.write(pattern(10)).await.expect("write");
    if partials == Partials::Listed {
        mine.push(partial.clone());
    }
    mine.sort();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.list(after.as_deref(), 2).await.expect("list");
        assert!(page.entries.len() <= 2);
        for entry in &page.entries {
            if entry.owner.as_ref() == Some(&owner) {
                assert_eq!(entry.partial, entry.locator == partial, "{}", entry.locator);
                seen.push(entry.locator.clone());
            }
        }
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, mine, "each once, in order");
    drop(writer);
}

/// The sweep keeps a blob while its record is in progress or completed at
/// the blob's fence, and removes it once the record is gone, failed, or at
/// another fence.
async fn swept_by_their_records(store: impl BlobStore + Clone) {
    let records = MemoryStore::new();
    let blobs = Blobs::new(store.clone());
    let lease = Duration::from_secs(60);
    let claim = |id: RecordId| {
        let records = records.clone();
        async move {
            let params = idem::store::ClaimParams::new(lease, Duration::from_secs(600))
                .fingerprint(Fingerprint::of_bytes(b"x"));
            match records.claim(&id, &params).await.expect("claim") {
                idem::store::ClaimOutcome::Acquired(lease) => lease,
                other => panic!("{other:?}"),
            }
        }
    };
    let scope = format!("sweep {:016x}", rand::random::<u64>());
    let id = |key: &str| RecordId::parse(&scope, key).expect("id");
    let running = claim(id("running")).await;
    let done = claim(id("done")).await;
    records
        .complete(&done, Bytes::from_static(b"ok"), Duration::from_secs(600))
        .await
        .expect("complete");
    let cases = [
        (BlobOwner::new(&id("running"), running.fence), true),
        (BlobOwner::new(&id("done"), done.fence), true),
        (BlobOwner::new(&id("done"), done.fence + 1), false),
        (BlobOwner::new(&id("absent"), 1), false),
    ];
    let mut locators = Vec::new();
    for (owner, _) in &cases {
        locators.push(put(&blobs, owner, &pattern(3), 3).await.locator);
    }
    let mut after: Option<String> = None;
    loop {
        let swept = idem::blob::sweep(&records, &store, after.as_deref(), 50)
            .await
            .expect("sweep");
        match swept.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    for ((owner, kept), locator) in cases.iter().zip(&locators) {
        let there = store.open(locator).await.expect("open").is_some();
        assert_eq!(there, *kept, "{owner:?}");
    }
}
