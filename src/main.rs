use clap::Parser;

fn main() -> std::process::ExitCode {
    stockade::install_tls_provider();
    stockade::cli::Cli::parse().run()
}
