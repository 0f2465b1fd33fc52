//! `kubectl scaledown`: see `statefulset_scaledown_controller::plugin`.

use clap::Parser;
use statefulset_scaledown_controller::plugin::{self, PluginArgs};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    match plugin::run(PluginArgs::parse()).await {
        Ok(out) => print!("{out}"),
        Err(e) => {
            eprintln!("kubectl scaledown: {e}");
            std::process::exit(1);
        }
    }
}
