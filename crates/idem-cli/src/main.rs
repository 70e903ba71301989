//! `idem`: see `idem --help`.

use clap::Parser;

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
            eprintln!("idem: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
