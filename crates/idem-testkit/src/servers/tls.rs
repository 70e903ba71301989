//! Certificates for TLS tests: a private CA and a server certificate for
//! 127.0.0.1 signed by it, made by `openssl` for one run.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::servers::{failed, ServerError};

/// The files [`certificates`] wrote.
#[derive(Debug, Clone)]
pub struct Certificates {
    /// The CA certificate (PEM): what clients trust.
    pub ca: PathBuf,
    /// The server certificate (PEM), valid for `IP:127.0.0.1`.
    pub cert: PathBuf,
    /// The server's private key (PEM, unencrypted).
    pub key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) -> Result<(), ServerError> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| failed(format!("running openssl (apt-get install -y openssl): {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(failed(format!(
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

/// Writes `ca.crt`, `server.crt` and `server.key` into `dir`: a CA valid
/// for two days and a server certificate for `IP:127.0.0.1` signed by it.
pub fn certificates(dir: &Path) -> Result<Certificates, ServerError> {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-subj",
            "/CN=idem test CA",
            "-days",
            "2",
        ],
    )?;
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    )?;
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n")
        .map_err(|e| failed(format!("writing san.ext: {e}")))?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-extfile",
            "san.ext",
            "-days",
            "2",
        ],
    )?;
    Ok(Certificates {
        ca: dir.join("ca.crt"),
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
    })
}
