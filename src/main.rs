use clap::Parser;

fn main() -> std::process::ExitCode {
    stockade::cli::Cli::parse().run()
}
