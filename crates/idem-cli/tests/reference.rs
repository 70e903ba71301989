//! Bodies kept by reference (`--keep PREFIX=reference`), end to end over
//! the embedded store and a blob directory: replays stream the blob byte
//! for byte, a blob that is missing or corrupt is a clear 500 or a cut-off
//! body and never a second run, blobs no record names are swept, and a
//! gateway SIGKILLed at any point of a large response leaves no record
//! naming a missing blob and runs nothing twice. The 50 MB case measures
//! the gateway process's peak memory.

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::{routing, Router};
use common::process::GatewayProcess;
use common::*;
use idem::blob::{BlobOwner, BlobStore, Blobs, DirBlobs};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;

/// The upstream of these tests: `POST /blob/{mib}` answers `mib` MiB of a
/// pattern, in 64 KiB chunks, `x-pace-ms` apart if asked; counted.
#[derive(Clone, Default)]
struct Sized {
    runs: Arc<AtomicU64>,
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

async fn sized(
    State(up): State<Sized>,
    Path(kib): Path<usize>,
    headers: axum::http::HeaderMap,
) -> Response {
    up.runs.fetch_add(1, Ordering::SeqCst);
    let pace = headers
        .get("x-pace-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis);
    let body = bytes::Bytes::from(pattern(kib * 1024));
    let chunks: Vec<bytes::Bytes> = (0..body.len())
        .step_by(64 * 1024)
        .map(|at| body.slice(at..(at + 64 * 1024).min(body.len())))
        .collect();
    let stream = futures_util::stream::iter(chunks).then(move |chunk| async move {
        if let Some(pace) = pace {
            tokio::time::sleep(pace).await;
        }
        Ok::<_, std::convert::Infallible>(chunk)
    });
    (
        [("content-type", "application/octet-stream")],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}

use futures_util::StreamExt as _;

async fn sized_upstream() -> (Sized, std::net::SocketAddr) {
    let up = Sized::default();
    let app = Router::new()
        .route("/blob/{kib}", routing::post(sized))
        .with_state(up.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (up, addr)
}

fn blob_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Ok(records) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<_> = records
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .flat_map(|e| {
            std::fs::read_dir(e.path())
                .expect("dir")
                .filter_map(Result::ok)
        })
        .map(|e| e.path())
        .collect();
    files.sort();
    files
}

/// The owner a blob file's header names, if it is whole.
fn owner_of(file: &std::path::Path) -> Option<BlobOwner> {
    use std::io::Read as _;
    let mut head = Vec::new();
    std::fs::File::open(file)
        .ok()?
        .take(4096)
        .read_to_end(&mut head)
        .ok()?;
    let line = head.split(|b| *b == b'\n').nth(1)?;
    serde_json::from_slice(line).ok()
}

/// Each blob file with its owner (from its header) and that record's
/// state and fence, for a failure message.
async fn describe_blobs(
    store: &impl idem::store::GetRecord,
    files: &[std::path::PathBuf],
) -> String {
    let mut out = String::new();
    for file in files {
        let bytes = std::fs::metadata(file).map_or(0, |m| m.len());
        let owner = owner_of(file);
        let record = match owner.as_ref().and_then(BlobOwner::record_id) {
            Some(id) => format!(
                "{:?}",
                store.get(&id).await.map(|r| r.map(|r| (r.state, r.fence)))
            ),
            None => "no owner".to_owned(),
        };
        out.push_str(&format!(
            "{} ({bytes} bytes): {owner:?}, its record {record}\n",
            file.display(),
        ));
    }
    out
}

async fn in_process(dir: &tempfile::TempDir, keep: &str) -> (Sized, Gateway) {
    let (up, addr) = sized_upstream().await;
    let mut config = config(addr);
    config.keep = idem_http::KeepRules::parse(keep).expect("valid --keep");
    config.blobs = Some(Blobs::new(
        DirBlobs::open(dir.path().join("blobs")).expect("blob dir"),
    ));
    let gw = Gateway::start(sqlite(dir), config).await;
    (up, gw)
}

async fn send(url: &str, key: &str) -> reqwest::Response {
    client()
        .post(url)
        .header("idempotency-key", key)
        .body("{}")
        .send()
        .await
        .expect("sent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn referenced_bodies_replay_byte_for_byte_and_small_ones_stay_inline() {
    let dir = tempfile::tempdir().expect("dir");
    let (up, gw) = in_process(&dir, "/blob=reference:16KiB").await;
    let url = format!("{}/blob/300", gw.url);
    let first = send(&url, "big-1").await;
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["content-length"], "307200");
    let whole = first.bytes().await.expect("body");
    assert_eq!(&whole[..], &pattern(300 * 1024)[..]);
    let again = send(&url, "big-1").await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert!(again.headers().get("idempotent-replay-kept").is_none());
    assert_eq!(again.bytes().await.expect("body"), whole);
    assert_eq!(
        up.runs.load(Ordering::SeqCst),
        1,
        "replayed, never run again"
    );
    assert_eq!(blob_files(&dir.path().join("blobs")).len(), 1);

    // Under the threshold: kept in the record, no blob.
    let small = format!("{}/blob/8", gw.url);
    let body = send(&small, "small-1").await.bytes().await.expect("body");
    assert_eq!(
        send(&small, "small-1").await.bytes().await.expect("body"),
        body
    );
    assert_eq!(blob_files(&dir.path().join("blobs")).len(), 1);
    gw.shutdown().await;

    // The admin view names the blob, and the record holds no body.
    let store = sqlite(&dir);
    let plain = idem_cli::admin::Secrets::read(None, None).expect("none");
    let id = idem::RecordId::parse("http POST /blob/300", "big-1").expect("id");
    let record = idem_cli::admin::inspect(&store, &id, &plain)
        .await
        .expect("inspect")
        .expect("record");
    let http = &record["response"]["http"];
    assert_eq!(http["kept"], "reference");
    assert_eq!(http["body_bytes"], 0);
    assert_eq!(http["blob"]["bytes"], 300 * 1024);
    let digest: String = Sha256::digest(&whole)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let digest = format!("sha256:{digest}");
    assert_eq!(http["blob"]["digest"], digest);

    // `idem inspect --body` reads it back from the blob, checked.
    let out = dir.path().join("body.out");
    let inspect = |body: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_idem"))
            .args([
                "--store",
                &format!("sqlite:{}", dir.path().join("idem.db").display()),
            ])
            .args(["inspect", "http POST /blob/300", "big-1", "--body"])
            .arg(body)
            .args([
                "--blobs",
                &format!("dir:{}", dir.path().join("blobs").display()),
            ])
            .output()
            .expect("idem inspect")
    };
    let done = inspect(&out);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(std::fs::read(&out).expect("written") == whole);
    for file in blob_files(&dir.path().join("blobs")) {
        std::fs::remove_file(file).expect("removed");
    }
    let missing = inspect(&out);
    assert!(!missing.status.success());
    let said = String::from_utf8_lossy(&missing.stderr);
    assert!(said.contains("is missing"), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_blob_is_a_500_and_a_corrupt_one_a_cut_off_body_never_a_rerun() {
    let dir = tempfile::tempdir().expect("dir");
    let (up, gw) = in_process(&dir, "reference:1KiB").await;
    let url = format!("{}/blob/64", gw.url);
    assert_eq!(send(&url, "gone").await.status(), 200);
    let url2 = format!("{}/blob/65", gw.url);
    assert_eq!(send(&url2, "bent").await.status(), 200);
    let files = blob_files(&dir.path().join("blobs"));
    assert_eq!(files.len(), 2);
    // Which file is which: 64 KiB and 65 KiB of data after the header.
    let size = |p: &std::path::PathBuf| std::fs::metadata(p).expect("meta").len();
    let (small, large) = if size(&files[0]) < size(&files[1]) {
        (&files[0], &files[1])
    } else {
        (&files[1], &files[0])
    };
    std::fs::remove_file(small).expect("removed");
    let detail = problem(send(&url, "gone").await, 500, "stored-response-unreadable").await;
    assert!(detail.contains("is missing"), "{detail}");

    let mut bytes = std::fs::read(large).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(large, bytes).expect("write");
    // The blob is read before its last chunk is sent: the connection is
    // cut before the head when the whole body is one chunk, after it
    // otherwise. Either way the client never gets the bytes whole.
    let bent = client()
        .post(&url2)
        .header("idempotency-key", "bent")
        .body("{}")
        .send()
        .await;
    if let Ok(bent) = bent {
        assert_eq!(
            bent.status(),
            200,
            "the head goes before the digest is known"
        );
        assert!(
            bent.bytes().await.is_err(),
            "a body whose digest differs is cut off, never passed off whole"
        );
    }
    assert_eq!(up.runs.load(Ordering::SeqCst), 2, "neither ran again");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_no_record_names_are_swept_and_named_ones_kept() {
    let dir = tempfile::tempdir().expect("dir");
    let (_up, gw) = in_process(&dir, "reference:1KiB").await;
    let url = format!("{}/blob/32", gw.url);
    let whole = send(&url, "kept").await.bytes().await.expect("body");
    gw.shutdown().await;

    let store = sqlite(&dir);
    let blobs = DirBlobs::open(dir.path().join("blobs")).expect("dir");
    // Written for a record that is not there, for another fence of the
    // kept record, and cut off (partial) for a record never completed.
    let kept = idem::RecordId::parse("http POST /blob/32", "kept").expect("id");
    let orphans = [
        BlobOwner::new(
            &idem::RecordId::parse("http POST /x", "never").expect("id"),
            1,
        ),
        BlobOwner::new(&kept, 7),
    ];
    for owner in &orphans {
        let mut sink = Blobs::new(blobs.clone())
            .create(owner)
            .await
            .expect("create");
        sink.write(bytes::Bytes::from_static(b"orphan"))
            .await
            .expect("write");
        sink.finish().await.expect("finish");
    }
    let partial = BlobOwner::new(&kept, 9);
    let mut writer = blobs
        .create(&partial.new_locator(), &partial)
        .await
        .expect("create");
    writer
        .write(bytes::Bytes::from_static(b"cut off"))
        .await
        .expect("write");
    std::mem::forget(writer);
    assert_eq!(blob_files(blobs.root()).len(), 4);

    let swept = idem::blob::sweep(&store, &blobs, None, 100)
        .await
        .expect("sweep");
    assert_eq!((swept.checked, swept.removed), (4, 3));
    assert_eq!(blob_files(blobs.root()).len(), 1);

    // The named one still replays.
    let (_up, gw) = in_process(&dir, "reference:1KiB").await;
    let again = send(&format!("{}/blob/32", gw.url), "kept").await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.bytes().await.expect("body"), whole);
    gw.shutdown().await;
}

/// The `idem` binary as a gateway process keeping `/blob` by reference.
async fn blob_gateway(upstream: std::net::SocketAddr, dir: &std::path::Path) -> GatewayProcess {
    let store = format!("sqlite:{}", dir.join("idem.db").display());
    let upstream = format!("http://{upstream}");
    GatewayProcess::start(
        &store,
        &[
            "--upstream",
            &upstream,
            "--lease",
            "1s",
            "--keep",
            "/blob=reference",
        ],
    )
    .await
}

/// Reads a response's body chunk by chunk, as a streaming client does;
/// its digest and length.
async fn digest_of(mut response: reqwest::Response) -> Result<(Vec<u8>, usize), reqwest::Error> {
    let mut hash = Sha256::new();
    let mut len = 0;
    while let Some(chunk) = response.chunk().await? {
        len += chunk.len();
        hash.update(&chunk);
    }
    Ok((hash.finalize().to_vec(), len))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_megabytes_are_kept_and_replayed_streamed_in_bounded_memory() {
    let dir = tempfile::tempdir().expect("dir");
    let (up, addr) = sized_upstream().await;
    let gw = blob_gateway(addr, dir.path()).await;
    let small = format!("{}/blob/1", gw.url);
    assert_eq!(send(&small, "warm-up").await.status(), 200);
    let baseline = gw.peak_rss();
    let url = format!("{}/blob/{}", gw.url, 50 * 1024);
    let expected = Sha256::digest(pattern(50 << 20)).to_vec();
    let first = digest_of(send(&url, "fifty").await).await.expect("body");
    assert_eq!(first, (expected.clone(), 50 << 20));
    for _ in 0..2 {
        let again = send(&url, "fifty").await;
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(
            digest_of(again).await.expect("body"),
            (expected.clone(), 50 << 20)
        );
    }
    assert_eq!(up.runs.load(Ordering::SeqCst), 2, "the warm-up and one run");
    let peak = gw.peak_rss();
    eprintln!(
        "gateway peak RSS: {} MiB after one small request, {} MiB after 50 MiB kept and \
         replayed twice",
        baseline >> 20,
        peak >> 20
    );
    assert!(
        peak < baseline + (24 << 20),
        "the gateway grew by {} MiB: the body was not streamed",
        (peak - baseline) >> 20
    );
}

/// The gateway SIGKILLed at random points while a 4 MiB response is
/// written to its blob, stored and answered: whatever the point, a retry
/// through the next gateway gets the one run's body byte for byte or 422
/// (outcome unknown), never a second run; and once swept, every blob left
/// is named by a completed record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_anywhere_leaves_no_record_naming_a_missing_blob() {
    let dir = tempfile::tempdir().expect("dir");
    let (up, addr) = sized_upstream().await;
    let expected = Sha256::digest(pattern(4 << 20)).to_vec();
    // Replayed, outcome unknown, killed before its claim (run by the retry).
    let mut outcomes = (0, 0, 0);
    for round in 0..10u64 {
        let at_start = up.runs.load(Ordering::SeqCst);
        let gw = blob_gateway(addr, dir.path()).await;
        let key = format!("killed-{round}");
        let url = format!("{}/blob/4096", gw.url);
        let request = {
            let (url, key) = (url.clone(), key.clone());
            tokio::spawn(async move {
                client()
                    .post(url)
                    .header("idempotency-key", key)
                    .header("x-pace-ms", "4")
                    .body("{}")
                    .send()
                    .await
            })
        };
        // 64 chunks 4 ms apart: killed before, during or after the blob.
        tokio::time::sleep(Duration::from_millis(20 + round * 120)).await;
        drop(gw);
        let _ = request.await;

        let gw = blob_gateway(addr, dir.path()).await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let url = format!("{}/blob/4096", gw.url);
        let runs_before = up.runs.load(Ordering::SeqCst);
        assert!(
            runs_before <= at_start + 1,
            "round {round} ran once at most"
        );
        let retry = send(&url, &key).await;
        let replayed = retry.headers().contains_key("idempotent-replayed");
        // Killed before its claim: the retry is the request's one run.
        let first_run = retry.status() == 200 && !replayed;
        match retry.status().as_u16() {
            200 => {
                assert_eq!(
                    digest_of(retry).await.expect("body"),
                    (expected.clone(), 4 << 20)
                );
                if replayed {
                    outcomes.0 += 1;
                } else {
                    assert_eq!(runs_before, at_start, "round {round}: a first run only");
                    outcomes.2 += 1;
                }
            }
            422 => outcomes.1 += 1,
            other => panic!("round {round}: {other}"),
        }
        assert_eq!(
            up.runs.load(Ordering::SeqCst),
            runs_before + u64::from(first_run),
            "round {round}: never run again"
        );
        drop(gw);
    }
    eprintln!(
        "replayed {} times, outcome unknown {} times, first run on the retry {} times",
        outcomes.0, outcomes.1, outcomes.2
    );

    let store = sqlite(&dir);
    let blobs = DirBlobs::open(dir.path().join("idem.db.blobs")).expect("dir");
    idem::blob::sweep(&store, &blobs, None, 1000)
        .await
        .expect("sweep");
    let left = blob_files(blobs.root());
    let listing = describe_blobs(&store, &left).await;
    // A gateway killed between creating a blob's file and writing its
    // header leaves a partial file naming no owner, which the sweep keeps
    // for `UNOWNED_GRACE` (DirBlobs' docs): allowed, and only that.
    let (owned, unowned): (Vec<_>, Vec<_>) = left.iter().partition(|p| owner_of(p).is_some());
    assert!(
        unowned
            .iter()
            .all(|p| p.to_string_lossy().ends_with(".partial")),
        "a whole blob without an owner; left:\n{listing}"
    );
    assert_eq!(
        owned.len(),
        outcomes.0 + outcomes.2,
        "one blob per completed key, no orphan; left:\n{listing}"
    );
    assert!(
        owned
            .iter()
            .all(|p| !p.to_string_lossy().ends_with(".partial")),
        "a partial blob kept; left:\n{listing}"
    );
}

/// The same 50 MiB kept in S3 (moto): replayed byte for byte, streamed.
#[cfg(feature = "s3")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_megabytes_kept_in_s3_replay_byte_for_byte() {
    use idem_testkit::servers::moto::{MotoServer, ACCESS_KEY, REGION, SECRET_KEY};
    let server = MotoServer::shared().expect("moto");
    std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
    let s3 = idem_s3::S3Blobs::connect(&format!(
        "s3://idem-gateway-{:08x}/replays?endpoint={}&region={REGION}&create=true",
        rand::random::<u32>(),
        server.url()
    ))
    .await
    .expect("bucket");
    let dir = tempfile::tempdir().expect("dir");
    let (up, addr) = sized_upstream().await;
    let mut config = config(addr);
    config.keep = idem_http::KeepRules::parse("/blob=reference").expect("valid --keep");
    config.blobs = Some(Blobs::new(s3.clone()));
    let gw = Gateway::start(sqlite(&dir), config).await;
    let url = format!("{}/blob/{}", gw.url, 50 * 1024);
    let expected = (Sha256::digest(pattern(50 << 20)).to_vec(), 50 << 20);
    assert_eq!(
        digest_of(send(&url, "s3-fifty").await).await.expect("body"),
        expected
    );
    let again = send(&url, "s3-fifty").await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(digest_of(again).await.expect("body"), expected);
    assert_eq!(up.runs.load(Ordering::SeqCst), 1);
    let listed = s3.list(None, 10).await.expect("list");
    assert_eq!(listed.entries.len(), 1, "one object, named by the record");
    gw.shutdown().await;
}
