//! `S3Blobs` passes the blob store suite against moto's S3, and a
//! multipart blob reads back whole.

use idem_testkit::servers::moto::{MotoServer, ACCESS_KEY, REGION, SECRET_KEY};

async fn blobs(prefix: &str) -> idem_s3::S3Blobs {
    let server = MotoServer::shared().expect("moto");
    std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
    let bucket = format!("idem-{:08x}", rand::random::<u32>());
    idem_s3::S3Blobs::connect(&format!(
        "s3://{bucket}/{prefix}?endpoint={}&region={REGION}&create=true",
        server.url()
    ))
    .await
    .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_s3_blob_store_passes_the_blob_store_suite() {
    idem_testkit::blobs::blob_store_suite(
        blobs("replays").await,
        idem_testkit::blobs::Partials::LeftToTheService,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_of_several_parts_is_one_object_once_finished() {
    use idem::blob::{BlobOwner, BlobStore, Blobs};
    let store = blobs("parts").await;
    let blobs = Blobs::new(store.clone());
    let owner = BlobOwner::new(&idem::RecordId::parse("s3 parts", "k").expect("id"), 1);
    let body: Vec<u8> = (0..(20usize << 20)).map(|i| (i % 241) as u8).collect();
    let mut sink = blobs.create(&owner).await.expect("create");
    for chunk in body.chunks(1 << 20) {
        sink.write(bytes::Bytes::copy_from_slice(chunk))
            .await
            .expect("write");
    }
    let page = store.list(None, 10).await.expect("list");
    assert!(
        page.entries.is_empty(),
        "not an object before it is finished"
    );
    let blob = sink.finish().await.expect("finish");
    let read = blobs.read_all(&blob).await.expect("read");
    assert!(read == body, "20 MiB in three parts read back whole");
    let page = store.list(None, 10).await.expect("list");
    assert_eq!(page.entries.len(), 1);
    assert_eq!(page.entries[0].owner.as_ref(), Some(&owner));
}
