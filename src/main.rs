use clap::Parser;
use statefulset_scaledown_controller::{app, cli::Args};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    app::init_logging(&args);
    let client = app::client(&args).await?;
    app::run(args, client, app::shutdown_signal()).await?;
    Ok(())
}
