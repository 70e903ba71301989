//! `rediss://` against a real redis-server serving TLS with a private CA
//! made by `openssl` for this run.

#![cfg(feature = "tls")]

use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{RecordId, Store};
use idem_redis::{ConnectError, RedisStore};
use idem_testkit::servers::redis::{free_port, RedisServer};
use idem_testkit::servers::tls::certificates;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_private_ca_works_and_an_untrusted_server_is_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let certs = certificates(dir.path()).expect("make certificates");
    let tls_port = free_port().expect("port");
    let file = |path: &std::path::Path| path.to_string_lossy().into_owned();
    let tls_port_arg = tls_port.to_string();
    let (cert, key, ca) = (file(&certs.cert), file(&certs.key), file(&certs.ca));
    let _server = RedisServer::start_with(
        free_port().expect("port"),
        &[
            "--tls-port",
            &tls_port_arg,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            "no",
        ],
    )
    .expect("start redis-server with TLS");

    let url = format!("rediss://127.0.0.1:{tls_port}/?tls_ca_file={ca}&namespace=tls");
    let store = RedisStore::connect(&url).await.expect("connect over TLS");
    let id = RecordId::parse("tls", "k").expect("valid");
    let params = ClaimParams::new(Duration::from_secs(30), Duration::from_secs(60));
    let ClaimOutcome::Acquired(lease) = store.claim(&id, &params).await.expect("claim") else {
        panic!("a fresh key is acquired");
    };
    store
        .complete(
            &lease,
            Bytes::from_static(b"over tls"),
            Duration::from_secs(60),
        )
        .await
        .expect("complete");
    assert_eq!(
        store.claim(&id, &params).await.expect("claim"),
        ClaimOutcome::Completed(Bytes::from_static(b"over tls"))
    );

    // The platform's roots do not include the test CA: refused, quickly.
    let untrusted = tokio::time::timeout(
        Duration::from_secs(10),
        RedisStore::connect(&format!("rediss://127.0.0.1:{tls_port}")),
    )
    .await
    .expect("connect returns");
    assert!(
        matches!(untrusted, Err(ConnectError::Unavailable { .. })),
        "{untrusted:?}"
    );
    // A CA file that cannot be read is a clear error naming it.
    let missing = RedisStore::connect(&format!(
        "rediss://127.0.0.1:{tls_port}/?tls_ca_file=/nonexistent/ca.pem"
    ))
    .await;
    assert!(
        matches!(&missing, Err(ConnectError::InvalidUrl { reason, .. }) if reason.contains("/nonexistent/ca.pem")),
        "{missing:?}"
    );
}
