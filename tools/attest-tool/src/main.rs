//! `attest-tool`: see the library crate for what each subcommand does.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = attest_tool::Cli::parse();
    let mut out = std::io::stdout().lock();
    match attest_tool::run(cli, &mut out) {
        Ok(attest_tool::Outcome::Success) => ExitCode::SUCCESS,
        Ok(attest_tool::Outcome::Rejected) => ExitCode::from(1),
        Err(e) => {
            eprintln!("attest-tool: {e:#}");
            ExitCode::from(2)
        }
    }
}
