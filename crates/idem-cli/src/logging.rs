//! Where the binary's logs go and how they look: standard error, as text
//! (coloured only on a terminal, and never under `NO_COLOR`) or as one
//! JSON object per line for log collectors. `IDEM_LOG` filters them
//! (`info` by default; e.g. `IDEM_LOG=idem=debug`).

use std::io::IsTerminal;

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines; colour only when standard error is a terminal.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `message`
    /// and the event's fields).
    Json,
}

/// Installs the process's log subscriber. Call once, first thing.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_env("IDEM_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(colour()).init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// Colour only for a person at a terminal who has not asked for none
/// (<https://no-color.org>): never in a file, a pipe or a journal.
fn colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}
