use clap::Parser;
use statefulset_scaledown_controller::{app, cli::Args, telemetry};

/// jemalloc gives freed pages back to the kernel (settings: .cargo/config.toml), where glibc's
/// allocator kept the pages of the initial lists and of every burst (BENCHMARKS.md, memory).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() {
    let args = Args::parse();
    telemetry::init_logging(&args);
    // Exits without waiting for tasks that are still running (a request to an API server that never
    // answers): `app::start` has already given them their grace.
    std::process::exit(app::start(args).await);
}
