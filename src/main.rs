use clap::Parser;
use statefulset_scaledown_controller::{app, cli::Args};

#[tokio::main]
async fn main() {
    let args = Args::parse();
    app::init_logging(&args);
    // Exits without waiting for tasks that are still running (a request to an API server that never
    // answers): `app::start` has already given them their grace.
    std::process::exit(app::start(args).await);
}
