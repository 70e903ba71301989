//! `mysql://` over TLS against a real MariaDB offering TLS with a private
//! CA made by `openssl` for this run: each `ssl-mode` encrypts (or not)
//! and checks the server's certificate as the `mysql` client does, and
//! every refusal is a typed error that says why.

#![cfg(feature = "tls")]

use std::error::Error as _;
use std::time::Duration;

use idem::{RecordId, Store};

use idem::store::{ClaimOutcome, ClaimParams};
use idem_mysql::{ConnectError, MySqlStore};
use idem_testkit::servers::mysql::MySqlServer;
use idem_testkit::servers::tls::certificates;

async fn connect(url: &str) -> Result<MySqlStore, ConnectError> {
    MySqlStore::builder(url)?
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

/// How many TLS handshakes the server has finished so far.
fn handshakes(server: &MySqlServer) -> u64 {
    server
        .admin("", "SHOW GLOBAL STATUS LIKE 'Ssl_finished_accepts'")
        .expect("status")
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("a count")
}

async fn round_trip(store: &MySqlStore, key: &str) {
    let id = RecordId::parse("tls", key).expect("valid");
    let params = ClaimParams::new(Duration::from_secs(30), Duration::from_secs(600));
    let ClaimOutcome::Acquired(lease) = store.claim(&id, &params).await.expect("claim") else {
        panic!("a fresh key is acquired");
    };
    store
        .complete(&lease, "done".into(), Duration::from_secs(600))
        .await
        .expect("complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_ssl_mode_encrypts_and_checks_as_the_mysql_client_does() {
    let dir = tempfile::tempdir().expect("dir");
    let certs = certificates(dir.path()).expect("certificates");
    let server = tokio::task::spawn_blocking(move || MySqlServer::start_tls(&certs))
        .await
        .expect("join")
        .expect("start mariadb with TLS");
    let db = server.create_database("tls").expect("database");
    let base = server.url(&db);
    let ca = dir.path().join("ca.crt");

    // The default: plain TCP, no handshake.
    let before = handshakes(&server);
    let plain = connect(&base).await.expect("plain");
    round_trip(&plain, "plain").await;
    assert_eq!(handshakes(&server), before, "DISABLED does not encrypt");

    for mode in [
        "ssl-mode=REQUIRED".to_owned(),
        format!("ssl-mode=VERIFY_CA&ssl-ca={}", ca.display()),
        format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={}", ca.display()),
    ] {
        let before = handshakes(&server);
        let store = connect(&format!("{base}?{mode}")).await.expect(&mode);
        round_trip(&store, &mode.replace(['=', '&', '/', '.'], "-")).await;
        assert!(handshakes(&server) > before, "{mode} encrypts");
    }

    // Another CA's roots: the server's certificate does not chain to them.
    let other = tempfile::tempdir().expect("dir");
    certificates(other.path()).expect("other certificates");
    let url = format!(
        "{base}?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        other.path().join("ca.crt").display()
    );
    let refused = connect(&url).await.expect_err("an unknown CA");
    assert!(
        matches!(refused, ConnectError::Unavailable { .. }),
        "{refused:?}"
    );
    let why = chain(&refused).to_lowercase();
    assert!(why.contains("certificate") || why.contains("tls"), "{why}");

    let refused = connect(&format!("{base}?ssl-mode=VERIFY_CA"))
        .await
        .expect_err("no CA file");
    assert!(
        matches!(&refused, ConnectError::InvalidUrl { reason, .. } if reason.contains("ssl-ca")),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_tls_against_a_plain_server_is_refused_not_downgraded() {
    let server = tokio::task::spawn_blocking(MySqlServer::start)
        .await
        .expect("join")
        .expect("start mariadb");
    let db = server.create_database("plain").expect("database");
    let refused = connect(&format!("{}?ssl-mode=REQUIRED", server.url(&db)))
        .await
        .expect_err("the server offers no TLS");
    assert!(
        matches!(refused, ConnectError::Unavailable { .. }),
        "{refused:?}"
    );
}
