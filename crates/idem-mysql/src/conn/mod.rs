//! Connections: the URL ([`url`]), TLS ([`tls`]) and the pool, set up
//! for idem's use.

pub(crate) mod tls;
pub(crate) mod url;

use mysql_async::{Opts, OptsBuilder, Pool, PoolConstraints, PoolOpts};

/// The pool for `opts`, at most `size` connections. Each connection runs
/// its transactions `READ COMMITTED` (a claim locks only the row it
/// claims, never a gap beside it), keeps its prepared statements (no reset
/// when it goes back to the pool: a reset would drop them, and cost a round
/// trip each use), and talks over TCP to the host the URL names unless
/// the URL asks for the server's socket (`prefer_socket=true`).
pub(crate) fn pool(opts: Opts, size: usize, prefer_socket: bool) -> Pool {
    let size = size.max(1);
    let constraints = PoolConstraints::new(0, size).unwrap_or_default();
    let builder = OptsBuilder::from_opts(opts)
        .prefer_socket(prefer_socket)
        .tcp_nodelay(true)
        .init(vec![
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        ])
        .pool_opts(
            PoolOpts::new()
                .with_constraints(constraints)
                .with_reset_connection(false),
        );
    Pool::new(builder)
}
