//! `idem`: see `idem --help`.

use clap::Parser;

/// mimalloc, not glibc's allocator: a gateway allocates and frees a
/// request's buffers on whichever worker thread runs it, and glibc's
/// per-thread arenas spent a sixth of a unique-key request's CPU in
/// malloc, its arena locks and the `mprotect` calls that grow them
/// (BENCHMARKS.md, "The gateway's allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = idem_cli::Cli::parse();
    idem_cli::logging::init(cli.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("idem: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(idem_cli::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line, each cause once: a cause whose text its error
            // already carries is not said again.
            eprintln!("idem: {}", idem::error_chain(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}
