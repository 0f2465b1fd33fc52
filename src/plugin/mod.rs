//! `kubectl scaledown`: a kubectl plugin (the binary `kubectl-scaledown`) that shows what the
//! controller sees and would do, from the cluster and the controller's own rules, and releases the
//! controller's finalizers when it is uninstalled.
//!
//! - `status [-n NS | -A] [SET] [-o wide|json|yaml] [--no-headers]`: per opted-in StatefulSet the wanted ordinals,
//!   orphaned claims, cleanup pods (phase, attempt), give-ups, look-alike pods, the native
//!   retention-policy conflict, what the controller would write next, and the newest Warning.
//! - `release-finalizers [-n NS | -A] [SET] [--dry-run]`: removes the finalizer
//!   `statefulsets.kubernetes.io/scaledown` (uninstall: a set keeping it cannot be deleted).

use clap::{Parser, Subcommand};
use kube::Client;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};

use crate::error::{Error, Result};
use crate::scaledown::decide::Policy;

pub mod read;
pub mod status;

pub use read::Scope;
pub use status::Output;

/// What the StatefulSet scale-down controller sees and would do.
#[derive(Debug, Parser)]
#[command(name = "kubectl-scaledown", bin_name = "kubectl scaledown", version = crate::cli::VERSION)]
pub struct PluginArgs {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
    /// Path to a kubeconfig (default: the files of $KUBECONFIG, merged as kubectl does, or
    /// ~/.kube/config).
    #[arg(long, global = true)]
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

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show each opted-in StatefulSet: orphaned claims, cleanup pods, give-ups, what comes next.
    Status {
        /// Only this StatefulSet.
        set: Option<String>,
        // No doc comment: clap would print it in --help, which stays as it is.
        #[allow(missing_docs)]
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// Leave out the table's header line (as kubectl's --no-headers).
        #[arg(long)]
        no_headers: bool,
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
            no_headers,
            cleanup_attempts,
        } => {
            let policy = Policy {
                max_attempts: cleanup_attempts.max(1),
                ..Policy::default()
            };
            let sets = read::statuses(&client, &scope, set.as_deref(), &policy).await?;
            status::format(&sets, output, !no_headers)
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
    let listed = std::env::var_os("KUBECONFIG");
    let kubeconfig = match (&args.kubeconfig, &listed) {
        (Some(path), _) => Some(
            Kubeconfig::read_from(path)
                .map_err(|e| Error::Config(format!("kubeconfig {}: {e}", path.display())))?,
        ),
        (None, Some(list)) => merged_kubeconfig(list)?,
        (None, None) => None,
    };
    let config = match kubeconfig {
        Some(kubeconfig) => Config::from_custom_kubeconfig(kubeconfig, &options).await,
        None => Config::from_kubeconfig(&options).await,
    }
    .map_err(|e| Error::Config(format!("kubeconfig: {e}")))?;
    let namespace = config.default_namespace.clone();
    let client = Client::try_from(config).map_err(|e| Error::Config(format!("client: {e}")))?;
    Ok((client, namespace))
}

/// The files of a `KUBECONFIG` list merged as kubectl (client-go) merges them: empty entries and
/// files that do not exist are skipped, the first file to set a value or name an entry wins (kube's
/// `Kubeconfig::merge`), and relative paths stay relative to the file that holds them. `None` when
/// the list names no file at all (then the default `~/.kube/config` applies, as in kubectl); an
/// error when every named file is missing or one cannot be parsed.
pub fn merged_kubeconfig(list: &std::ffi::OsStr) -> Result<Option<Kubeconfig>> {
    let paths: Vec<std::path::PathBuf> = std::env::split_paths(list)
        .filter(|p| !p.as_os_str().is_empty())
        .collect();
    if paths.is_empty() {
        return Ok(None);
    }
    let mut merged: Option<Kubeconfig> = None;
    for path in paths.iter().filter(|p| p.exists()) {
        let next = Kubeconfig::read_from(path)
            .map_err(|e| Error::Config(format!("kubeconfig {}: {e}", path.display())))?;
        merged = Some(match merged {
            Some(m) => m
                .merge(next)
                .map_err(|e| Error::Config(format!("kubeconfig {}: {e}", path.display())))?,
            None => next,
        });
    }
    match merged {
        Some(m) => Ok(Some(m)),
        None => Err(Error::Config(format!(
            "KUBECONFIG names no file that exists: {}",
            list.to_string_lossy()
        ))),
    }
}

#[cfg(test)]
mod tests;
