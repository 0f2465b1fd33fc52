//! `kubectl scaledown`: a kubectl plugin (the binary `kubectl-scaledown`) that shows what the
//! controller sees and would do, from the cluster and the controller's own rules, and releases the
//! controller's finalizers when it is uninstalled.
//!
//! - `status [-n NS | -A] [SET] [-o wide|json]`: per opted-in StatefulSet the wanted ordinals,
//!   orphaned claims, cleanup pods (phase, attempt), give-ups, look-alike pods, the native
//!   retention-policy conflict, what the controller would write next, and the newest Warning.
//! - `release-finalizers [-n NS | -A] [SET] [--dry-run]`: removes the finalizer
//!   `statefulsets.kubernetes.io/scaledown` (uninstall: a set keeping it cannot be deleted).

use clap::{Parser, Subcommand, ValueEnum};
use kube::Client;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};

use crate::error::{Error, Result};
use crate::scaledown::decide::Policy;

pub mod read;
pub mod status;

pub use read::Scope;

#[derive(Debug, Parser)]
#[command(name = "kubectl-scaledown", bin_name = "kubectl scaledown", version = crate::cli::VERSION)]
/// What the StatefulSet scale-down controller sees and would do.
pub struct PluginArgs {
    #[command(subcommand)]
    pub command: Command,
    /// Path to a kubeconfig (default: $KUBECONFIG or ~/.kube/config).
    #[arg(long, global = true, env = "KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The namespace (default: the context's namespace).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long, global = true, conflicts_with = "namespace")]
    pub all_namespaces: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show each opted-in StatefulSet: orphaned claims, cleanup pods, give-ups, what comes next.
    Status {
        /// Only this StatefulSet.
        set: Option<String>,
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// Attempts before the controller gives up (its --cleanup-attempts).
        #[arg(long, default_value_t = 3)]
        cleanup_attempts: u32,
    },
    /// Remove the controller's finalizer from StatefulSets (after uninstalling the controller).
    ReleaseFinalizers {
        /// Only this StatefulSet.
        set: Option<String>,
        /// Print what would be released, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Wide,
    Json,
}

/// Runs the command; returns what to print.
pub async fn run(args: PluginArgs) -> Result<String> {
    let (client, default_ns) = connect(&args).await?;
    let scope = if args.all_namespaces {
        Scope::All
    } else {
        Scope::Namespace(args.namespace.clone().unwrap_or(default_ns))
    };
    match args.command {
        Command::Status {
            set,
            output,
            cleanup_attempts,
        } => {
            let policy = Policy {
                max_attempts: cleanup_attempts.max(1),
                ..Policy::default()
            };
            let sets = read::statuses(&client, &scope, set.as_deref(), &policy).await?;
            match output {
                Output::Json => serde_json::to_string_pretty(&sets)
                    .map(|s| s + "\n")
                    .map_err(|source| Error::Encode {
                        what: "status",
                        source,
                    }),
                Output::Table => Ok(status::render(&sets, false)),
                Output::Wide => Ok(status::render(&sets, true)),
            }
        }
        Command::ReleaseFinalizers { set, dry_run } => {
            let lines = read::release_finalizers(&client, &scope, set.as_deref(), dry_run).await?;
            Ok(lines.join("\n") + "\n")
        }
    }
}

async fn connect(args: &PluginArgs) -> Result<(Client, String)> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| Error::Config(format!("kubeconfig {}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kubeconfig, &options).await
        }
        None => Config::from_kubeconfig(&options).await,
    }
    .map_err(|e| Error::Config(format!("kubeconfig: {e}")))?;
    let namespace = config.default_namespace.clone();
    let client = Client::try_from(config).map_err(|e| Error::Config(format!("client: {e}")))?;
    Ok((client, namespace))
}
