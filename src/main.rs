use clap::Parser;
use statefulset_scaledown_controller::{app, cli::Args, telemetry};

/// jemalloc gives freed pages back to the kernel (settings: .cargo/config.toml), where glibc's
/// allocator kept the pages of the initial lists and of every burst (BENCHMARKS.md, memory).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Err(e) = telemetry::init_logging(&args.log_level, args.log_format) {
        // clap has checked --log-level already; this is the same check, for the same message.
        eprintln!("error: --log-level: {e}");
        std::process::exit(2);
    }
    // Exits without waiting for tasks that are still running (a request to an API server that never
    // answers): `app::start` has already given them their grace.
    std::process::exit(app::start(args).await);
}
