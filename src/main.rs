use clap::Parser;

/// mimalloc rather than the system allocator: a request allocates and frees many small
/// buffers across two worker threads, where glibc's malloc spent a fifth of the server's
/// time (consolidating and unlinking chunks) under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    stockade::install_tls_provider();
    stockade::cli::Cli::parse().run()
}
