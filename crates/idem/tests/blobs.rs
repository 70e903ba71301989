//! The directory blob store passes the blob store suite, and refuses
//! locators that would leave its directory.

use idem::blob::{BlobOwner, BlobStore, DirBlobs};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_directory_store_passes_the_blob_store_suite() {
    let dir = tempfile::tempdir().expect("dir");
    let blobs = DirBlobs::open(dir.path().join("blobs")).expect("open");
    idem_testkit::blobs::blob_store_suite(blobs, idem_testkit::blobs::Partials::Listed).await;
}

#[tokio::test]
async fn locators_that_leave_the_directory_are_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let blobs = DirBlobs::open(dir.path()).expect("open");
    let owner = BlobOwner::new(&idem::RecordId::parse("s", "k").expect("id"), 1);
    for bad in [
        "../x/1",
        "a/../../b",
        "/etc/passwd",
        "a",
        "a/b/c",
        "a/.hidden",
        "",
    ] {
        assert!(blobs.create(bad, &owner).await.is_err(), "{bad}");
        assert!(blobs.open(bad).await.is_err(), "{bad}");
        assert!(blobs.delete(bad).await.is_err(), "{bad}");
    }
}
