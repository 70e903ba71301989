//! Loopback ports for test servers: taken from below the kernel's
//! ephemeral range and reserved for the life of the test process.
//!
//! A port from `bind(…:0)` is an ephemeral one: while a server on it is
//! stopped for a restart, the kernel may give it to any outgoing
//! connection or any other `bind(…:0)` (another test's server), and the
//! restart cannot listen — how a Redis Cluster node once failed to come
//! back in a chaos run. The ports here come from below
//! `ip_local_port_range`, which the kernel never picks by itself, and each
//! is reserved by an exclusive lock on a file in the temporary directory,
//! held until the process exits, so neither two tests of one process nor
//! two test processes get the same port.

use std::fs::{File, OpenOptions};
use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::sync::Mutex;

use crate::servers::{failed, ServerError};

/// The lowest port handed out (below it: well-known services' ports).
const LOW: u16 = 10_000;

/// Random starting points tried before giving up.
const ATTEMPTS: usize = 500;

/// The locks that reserve every port handed out, held until exit.
static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// A free loopback port, reserved for this process (free when asked; bind
/// it soon).
pub fn free_port() -> Result<u16, ServerError> {
    free_run(1, None).map(|ports| ports[0])
}

/// `count` consecutive free loopback ports, reserved for this process; with
/// `twin`, each port's twin `twin` above it (a Redis Cluster node's bus
/// port) is free and reserved as well.
pub(crate) fn free_run(count: u16, twin: Option<u16>) -> Result<Vec<u16>, ServerError> {
    let top = ephemeral_start()
        .saturating_sub(twin.unwrap_or(0))
        .saturating_sub(count);
    if top <= LOW {
        return Err(failed(format!(
            "no room for {count} test ports below the ephemeral range ({})",
            ephemeral_start()
        )));
    }
    for _ in 0..ATTEMPTS {
        let base = LOW + rand::random::<u16>() % (top - LOW);
        let run: Vec<u16> = (base..base + count).collect();
        let all: Vec<u16> = run
            .iter()
            .copied()
            .chain(
                twin.into_iter()
                    .flat_map(|t| run.iter().map(move |p| p + t)),
            )
            .collect();
        if !all.iter().all(|&p| bindable(p)) {
            continue;
        }
        let locks: Vec<File> = all.iter().map_while(|&p| lock(p)).collect();
        if locks.len() == all.len() {
            HELD.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend(locks);
            return Ok(run);
        }
    }
    Err(failed(format!(
        "no {count} free test ports found in {LOW}..{top}"
    )))
}

/// The first port of the kernel's ephemeral range (32768 when it cannot be
/// read).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// The lock on `port`'s file, when no one (this process included) holds it.
fn lock(port: u16) -> Option<File> {
    let dir: PathBuf = std::env::temp_dir().join("idem-ports");
    std::fs::create_dir_all(&dir).ok()?;
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
        .ok()?;
    file.try_lock().ok()?;
    Some(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_and_never_handed_out_twice() {
        let start = ephemeral_start();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let port = free_port().expect("a port");
            assert!(
                (LOW..start).contains(&port),
                "{port} outside {LOW}..{start}"
            );
            assert!(seen.insert(port), "{port} handed out twice");
        }
        let run = free_run(6, Some(10_000)).expect("a run");
        assert_eq!(run.len(), 6);
        assert!(run.windows(2).all(|w| w[1] == w[0] + 1), "{run:?}");
        assert!(run.iter().all(|p| p + 10_000 < start), "{run:?}");
        assert!(run.iter().all(|p| !seen.contains(p)), "{run:?}");
    }

    #[test]
    fn a_reserved_port_cannot_be_locked_again_even_in_this_process() {
        let port = free_port().expect("a port");
        assert!(lock(port).is_none(), "{port} locked twice");
    }
}
