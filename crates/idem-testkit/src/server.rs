//! What the test servers share: their error, free ports, and finding
//! programs.

use std::net::{Ipv4Addr, TcpListener};

/// Why a server could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A program the server needs is not installed (`scripts/test`
    /// installs them: `redis-server`, `redis-tools`, `postgresql`).
    #[error("{0} is not installed")]
    NotInstalled(&'static str),
    /// Starting or talking to the server failed.
    #[error("{what}")]
    Failed {
        /// What went wrong.
        what: String,
    },
}

pub(crate) fn failed(what: impl Into<String>) -> ServerError {
    ServerError::Failed { what: what.into() }
}

pub(crate) fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// A free loopback port (free when asked; bind it soon).
pub fn free_port() -> Result<u16, ServerError> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| failed(format!("no free port: {e}")))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| failed(format!("no free port: {e}")))
}
