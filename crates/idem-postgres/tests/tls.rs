//! `postgres://` over TLS against a real PostgreSQL serving `ssl=on` with
//! a private CA made by `openssl` for this run: each `sslmode` encrypts
//! (or not) and checks the server's certificate as libpq's does, and every
//! refusal is a typed error that says why.

#![cfg(feature = "tls")]

use std::error::Error as _;
use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{RecordId, Store};
use idem_postgres::{ConnectError, PgStore};
use idem_testkit::servers::postgres::PgServer;
use idem_testkit::servers::tls::certificates;

fn params() -> ClaimParams {
    ClaimParams::new(Duration::from_secs(30), Duration::from_secs(600))
}

async fn connect(url: &str) -> Result<PgStore, ConnectError> {
    PgStore::builder(url)?
        .pool_size(2)
        .connect_timeout(Duration::from_secs(3))
        .connect()
        .await
}

/// The whole error chain, for asserting on the cause.
fn chain(e: &ConnectError) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// How many of the server's connections named `app` are (and are not)
/// encrypted, as the server sees them.
fn encrypted(server: &PgServer, app: &str) -> (u32, u32) {
    let out = server
        .psql(
            "postgres",
            &format!(
                "SELECT count(*) FILTER (WHERE s.ssl) || ' ' || count(*) FILTER (WHERE NOT s.ssl) \
                 FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
                 WHERE a.application_name = '{app}'"
            ),
        )
        .expect("psql");
    let mut counts = out.split_whitespace().map(|n| n.parse().expect("count"));
    (counts.next().expect("ssl"), counts.next().expect("plain"))
}

async fn round_trip(store: &PgStore, key: &str) {
    let id = RecordId::parse("tls", key).expect("valid");
    let ClaimOutcome::Acquired(lease) = store.claim(&id, &params()).await.expect("claim") else {
        panic!("a fresh key is acquired");
    };
    store
        .complete(&lease, Bytes::from_static(b"over tls"), params().retention)
        .await
        .expect("complete");
    assert_eq!(
        store.claim(&id, &params()).await.expect("replay"),
        ClaimOutcome::Completed(Bytes::from_static(b"over tls"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sslmode_encrypts_and_verifies_as_libpq_does() {
    let dir = tempfile::tempdir().expect("dir");
    let certs = certificates(dir.path()).expect("make certificates");
    let server = PgServer::start_tls(&certs).expect("start postgres with ssl=on");
    let port = server.port();
    let ca = certs.ca.display();
    let url = |host: &str, params: &str| {
        format!("postgres://postgres@{host}:{port}/postgres?schema=tls&{params}")
    };

    // verify-full: trusted chain and the right name; really encrypted.
    let store = connect(&url(
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={ca}&application_name=full"),
    ))
    .await
    .expect("verify-full with the CA");
    round_trip(&store, "full").await;
    let (tls, plain) = encrypted(&server, "full");
    assert!(
        tls >= 1 && plain == 0,
        "verify-full: {tls} TLS, {plain} plain"
    );

    // The certificate names 127.0.0.1 only: verify-full refuses another
    // name for the same server, verify-ca (chain only) accepts it.
    let wrong_name = connect(&url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ))
    .await
    .expect_err("verify-full with a name the certificate does not carry");
    assert!(
        matches!(wrong_name, ConnectError::Unavailable { .. }),
        "{wrong_name:?}"
    );
    assert!(
        chain(&wrong_name).contains("not valid for name"),
        "{}",
        chain(&wrong_name)
    );
    let any_name = connect(&url(
        "localhost",
        &format!("sslmode=verify-ca&sslrootcert={ca}&application_name=ca"),
    ))
    .await
    .expect("verify-ca ignores the name");
    round_trip(&any_name, "ca").await;
    let (tls, plain) = encrypted(&server, "ca");
    assert!(
        tls >= 1 && plain == 0,
        "verify-ca: {tls} TLS, {plain} plain"
    );

    // The platform's roots do not hold the test CA.
    let untrusted = connect(&url("127.0.0.1", "sslmode=verify-full"))
        .await
        .expect_err("verify-full with the platform's roots");
    assert!(
        chain(&untrusted).contains("UnknownIssuer"),
        "{}",
        chain(&untrusted)
    );

    // require: encrypted, certificate unchecked (libpq's meaning)...
    let store = connect(&url("127.0.0.1", "sslmode=require&application_name=req"))
        .await
        .expect("require does not check the certificate");
    round_trip(&store, "require").await;
    let (tls, plain) = encrypted(&server, "req");
    assert!(tls >= 1 && plain == 0, "require: {tls} TLS, {plain} plain");
    // ...unless a root certificate is given: then the chain is checked.
    let other_dir = tempfile::tempdir().expect("dir");
    let other = certificates(other_dir.path()).expect("another CA");
    let wrong_ca = connect(&url(
        "127.0.0.1",
        &format!("sslmode=require&sslrootcert={}", other.ca.display()),
    ))
    .await
    .expect_err("require with a root certificate that did not sign the server's");
    assert!(
        chain(&wrong_ca).contains("UnknownIssuer") || chain(&wrong_ca).contains("BadSignature"),
        "{}",
        chain(&wrong_ca)
    );

    // disable: plain, even though the server offers TLS.
    let store = connect(&url("127.0.0.1", "sslmode=disable&application_name=plain"))
        .await
        .expect("disable");
    round_trip(&store, "plain").await;
    let (tls, plain) = encrypted(&server, "plain");
    assert!(tls == 0 && plain >= 1, "disable: {tls} TLS, {plain} plain");

    // prefer with a root certificate file checks the chain too.
    let prefer_wrong_ca = connect(&url(
        "127.0.0.1",
        &format!("sslmode=prefer&sslrootcert={}", other.ca.display()),
    ))
    .await
    .expect_err("prefer with a root certificate that did not sign the server's");
    assert!(
        matches!(prefer_wrong_ca, ConnectError::Unavailable { .. }),
        "{prefer_wrong_ca:?}"
    );

    // A root certificate file that cannot be read is a URL problem.
    let missing = connect(&url(
        "127.0.0.1",
        "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
    ))
    .await
    .expect_err("unreadable sslrootcert");
    assert!(
        matches!(&missing, ConnectError::InvalidUrl { reason, .. } if reason.contains("/nonexistent/ca.pem")),
        "{missing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_against_a_server_without_tls_is_refused() {
    let server = PgServer::start().expect("start postgres");
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=require",
        server.port()
    );
    let refused = connect(&url).await.expect_err("no TLS to be had");
    assert!(
        matches!(refused, ConnectError::Unavailable { .. }),
        "{refused:?}"
    );
    assert!(
        chain(&refused).contains("TLS"),
        "the cause names TLS: {}",
        chain(&refused)
    );
    let prefer = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=prefer&schema=prefer",
        server.port()
    );
    let store = connect(&prefer).await.expect("prefer falls back to plain");
    round_trip(&store, "prefer").await;
}
