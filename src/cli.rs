//! Command-line flags. Names follow the Go original where it had the flag, Kubernetes controller
//! conventions elsewhere; every flag has a default and an environment fallback where one is usual.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::error::Error;
use crate::scaledown::decide::Policy;
pub use crate::telemetry::LogFormat;

/// File where Kubernetes mounts the namespace of a pod's ServiceAccount.
const SERVICEACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// `--version`: the crate version and the commit it was built from (build.rs).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SCALEDOWN_GIT_COMMIT"),
    ")"
);

/// The controller's flags (see docs/reference.md, generated from them).
#[derive(Clone, Debug, Parser)]
#[command(name = "statefulset-scaledown-controller", version = VERSION, about, long_about = None)]
pub struct Args {
    /// Path to a kubeconfig; without it, in-cluster config or $KUBECONFIG is used.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// API server URL, overriding the one in the kubeconfig.
    #[arg(long)]
    pub master: Option<String>,

    /// Watch and act in this namespace only (default: all namespaces).
    #[arg(long, conflicts_with = "local_only")]
    pub namespace: Option<String>,

    /// Watch and act only in the controller's own namespace (the Go original's flag).
    #[arg(long = "localOnly")]
    pub local_only: bool,

    /// The controller's own namespace, for --localOnly (downward API).
    #[arg(long, env = "POD_NAMESPACE", hide = true)]
    pub pod_namespace: Option<String>,

    /// The controller's own pod name, used as the Event reporting instance (downward API).
    #[arg(long, env = "POD_NAME", hide = true)]
    pub pod_name: Option<String>,

    /// Write nothing but Events: every write a controller would make is reported as an Event
    /// `DryRun` on the object it concerns, with a log line and a count.
    #[arg(long)]
    pub dry_run: bool,

    /// Cleanup pods allowed in flight at once across everything watched; 0 = no cap.
    #[arg(long, default_value_t = 0)]
    pub max_concurrent_cleanups: usize,

    /// Attempts of one ordinal's cleanup before the controller gives up and keeps the failed pod.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub cleanup_attempts: u32,

    /// Wait after the first failed attempt; it doubles with every further attempt.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub cleanup_backoff: Duration,

    /// The longest wait between attempts.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub cleanup_backoff_max: Duration,

    /// A cleanup pod still Pending after this long gets a Warning `CleanupPodStuck`.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub cleanup_pending_timeout: Duration,

    /// Every StatefulSet is looked at again after this long even without a change.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub resync_period: Duration,

    /// StatefulSets reconciled at once (0: no bound). A pass waits on the API server most of its
    /// time (a create, a record, a release, Events), so many sets scaled at once need many passes
    /// in flight; one waiting for a live list of its namespace, shared with other passes, gives
    /// its slot back meanwhile.
    #[arg(long, default_value_t = 32)]
    pub concurrency: u16,

    /// Cleanup pods inherit their StatefulSet's tolerations, nodeSelector, node affinity,
    /// priorityClassName, imagePullSecrets and pod securityContext, where the cleanup template does
    /// not set them, unless the set is annotated `statefulsets.kubernetes.io/scaledown-pod-inherit:
    /// none` (without this flag, only sets annotated `...: scheduling` do).
    #[arg(long)]
    pub inherit_scheduling: bool,

    /// Bind claims annotated `statefulsets.kubernetes.io/bound-to-pod: <pod>` to that pod's life.
    #[arg(long)]
    pub pod_bound_claims: bool,

    /// A claim whose pod is gone before it was bound is deleted once it has waited this long for
    /// that pod (from the first time the controller saw it wait).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub pod_bound_grace: Duration,

    /// Namespace of the PV releaser's scrub pods and temporary claims (default: the controller's).
    #[arg(long)]
    pub pv_scrub_namespace: Option<String>,

    /// Do not run the scale-down controller (only the companions, e.g. the PV releaser).
    #[arg(long)]
    pub disable_scaledown: bool,

    /// Run the PV pool releaser for StorageClasses annotated
    /// `reclaimable-pv-releaser.kubernetes.io/controller-id: ID` (off when unset; needs cluster scope).
    #[arg(long, value_name = "ID")]
    pub pv_releaser_id: Option<String>,

    /// Run only while holding the leader Lease; standbys keep warm caches and write nothing.
    #[arg(long)]
    pub leader_elect: bool,

    /// Namespace of the leader Lease (default: the controller's own namespace).
    #[arg(long)]
    pub leader_election_namespace: Option<String>,

    /// Name of the leader Lease.
    #[arg(long, default_value = "statefulset-scaledown-controller")]
    pub leader_election_id: String,

    /// How long a Lease stays valid after its last renewal.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub leader_elect_lease_duration: Duration,

    /// A leader that has not renewed for this long stops writing and exits (must be < lease duration).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub leader_elect_renew_deadline: Duration,

    /// How often the leader checks its Lease.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub leader_elect_retry_period: Duration,

    /// Accepted for compatibility with the Go original; the lock is always a coordination.k8s.io Lease.
    #[arg(long, hide = true)]
    pub leader_elect_resource_lock: Option<String>,

    /// Address serving /metrics: HOST:PORT, or :PORT for every interface of every address family
    /// (IPv4 and IPv6, as controller-runtime); "0" turns it off.
    #[arg(long, default_value = ":8080")]
    pub metrics_bind_address: String,

    /// Address serving /healthz and /readyz: HOST:PORT or :PORT (every address family); "0" turns
    /// it off.
    #[arg(long, default_value = ":8081")]
    pub health_probe_bind_address: String,

    /// Log format on stderr; text has colours only on a terminal and without NO_COLOR.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter in tracing's EnvFilter syntax, every directive with a level (e.g. "info",
    /// "info,statefulset_scaledown_controller=debug"); an unknown level is a start-up error.
    #[arg(long, env = "RUST_LOG", default_value = "info", value_parser = crate::telemetry::parse_log_level)]
    pub log_level: String,

    /// Accepted for compatibility with the Go original's glog flags; ignored.
    #[arg(long = "alsologtostderr", hide = true)]
    pub also_log_to_stderr: bool,
    /// Accepted for compatibility with the Go original's glog flags; ignored.
    #[arg(long = "logtostderr", hide = true)]
    pub log_to_stderr: bool,
    /// Accepted for compatibility with the Go original's glog `-v`; ignored (see `--log-level`).
    #[arg(long = "v", hide = true)]
    pub glog_verbosity: Option<u8>,
}

impl Args {
    /// The namespace to watch, or `None` for all of them.
    pub fn scope(&self) -> Result<Option<String>, Error> {
        if let Some(ns) = &self.namespace {
            return Ok(Some(ns.clone()));
        }
        if !self.local_only {
            return Ok(None);
        }
        if let Some(ns) = self.pod_namespace.as_ref().filter(|n| !n.is_empty()) {
            return Ok(Some(ns.clone()));
        }
        std::fs::read_to_string(SERVICEACCOUNT_NAMESPACE)
            .map(|ns| Some(ns.trim().to_string()))
            .map_err(|e| {
                Error::Config(format!(
                    "--localOnly needs the controller's namespace: set POD_NAMESPACE or run in a pod ({SERVICEACCOUNT_NAMESPACE}: {e})"
                ))
            })
    }

    /// The PV releaser's id, if it runs; an error in namespace scope (PVs and StorageClasses are
    /// cluster objects).
    pub fn pv_releaser(&self) -> Result<Option<String>, Error> {
        let Some(id) = self.pv_releaser_id.as_ref() else {
            if self.disable_scaledown && !self.pod_bound_claims {
                return Err(Error::Config(
                    "--disable-scaledown leaves nothing to run without --pv-releaser-id or --pod-bound-claims".into(),
                ));
            }
            return Ok(None);
        };
        if id.trim().is_empty() {
            return Err(Error::Config("--pv-releaser-id must not be empty".into()));
        }
        if self.namespace.is_some() || self.local_only {
            return Err(Error::Config(
                "the PV releaser (--pv-releaser-id) needs cluster scope: PersistentVolumes and StorageClasses are cluster objects; drop --namespace/--localOnly or --pv-releaser-id".into(),
            ));
        }
        Ok(Some(id.clone()))
    }

    /// The controller's own namespace: `POD_NAMESPACE`, else the ServiceAccount's namespace file.
    pub fn own_namespace(&self) -> Option<String> {
        self.pod_namespace
            .clone()
            .filter(|n| !n.is_empty())
            .or_else(|| {
                std::fs::read_to_string(SERVICEACCOUNT_NAMESPACE)
                    .ok()
                    .map(|n| n.trim().to_string())
            })
    }

    /// The controller's identity for the Lease and Events: `POD_NAME`, else `<host name>-<pid>`.
    pub fn identity(&self) -> String {
        self.pod_name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
                format!("{}-{}", host.trim(), std::process::id())
            })
    }

    /// The scale-down rules' settings from the flags (attempts, backoff, inheritance, in-flight cap).
    pub fn policy(&self) -> Policy {
        Policy {
            max_attempts: self.cleanup_attempts,
            backoff_base: self.cleanup_backoff,
            backoff_max: self.cleanup_backoff_max.max(self.cleanup_backoff),
            max_in_flight: (self.max_concurrent_cleanups > 0)
                .then_some(self.max_concurrent_cleanups),
            pending_timeout: self.cleanup_pending_timeout,
            inherit_scheduling: self.inherit_scheduling,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_compat_flags() {
        let args = Args::try_parse_from(["c", "--alsologtostderr", "--v", "3"]).expect("parses");
        assert_eq!(args.scope().expect("scope"), None);
        assert_eq!(args.policy(), Policy::default());
        let args =
            Args::try_parse_from(["c", "--localOnly", "--pod-namespace", "apps"]).expect("parses");
        assert_eq!(args.scope().expect("scope").as_deref(), Some("apps"));
        let args = Args::try_parse_from([
            "c",
            "--namespace",
            "x",
            "--max-concurrent-cleanups",
            "2",
            "--cleanup-backoff",
            "1s",
        ])
        .expect("parses");
        assert_eq!(args.scope().expect("scope").as_deref(), Some("x"));
        assert_eq!(args.policy().max_in_flight, Some(2));
        assert_eq!(args.policy().backoff_base, Duration::from_secs(1));
        assert!(!args.policy().inherit_scheduling, "off unless asked for");
        let args = Args::try_parse_from(["c", "--inherit-scheduling"]).expect("parses");
        assert!(args.policy().inherit_scheduling);
        assert!(Args::try_parse_from(["c", "--namespace", "x", "--localOnly"]).is_err());
        assert!(Args::try_parse_from(["c", "--cleanup-attempts", "0"]).is_err());
    }

    #[test]
    fn the_pv_releaser_needs_cluster_scope() {
        let parse = |a: &[&str]| Args::try_parse_from(a).expect("parses").pv_releaser();
        assert_eq!(parse(&["c"]).expect("off"), None);
        assert_eq!(
            parse(&["c", "--pv-releaser-id", "ci"])
                .expect("on")
                .as_deref(),
            Some("ci")
        );
        let err = parse(&["c", "--pv-releaser-id", "ci", "--namespace", "x"]).expect_err("scope");
        assert!(err.to_string().contains("needs cluster scope"), "{err}");
        assert!(parse(&["c", "--pv-releaser-id", " "]).is_err());
        assert!(
            parse(&["c", "--disable-scaledown"]).is_err(),
            "nothing to run"
        );
        assert!(parse(&["c", "--disable-scaledown", "--pv-releaser-id", "ci"]).is_ok());
    }

    /// The commit of the checkout as git tells it now, if git can.
    fn head_of_checkout() -> Option<String> {
        let out = std::process::Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// `--version` names the version and the commit the binary was built from: the checkout's
    /// HEAD, asked of git independently of build.rs (so a stale build after a commit fails).
    #[test]
    fn version_names_the_commit() {
        let err = Args::try_parse_from(["c", "--version"]).expect_err("--version exits");
        let text = err.to_string();
        let commit = match env!("SCALEDOWN_GIT_COMMIT_SOURCE") {
            "git" => head_of_checkout().expect("built from git, so git works here"),
            "none" => "unknown".to_string(),
            // Set by hack/image.sh or the Dockerfile, and so in the environment of the test too.
            _ => std::env::var("SCALEDOWN_GIT_COMMIT").expect("SCALEDOWN_GIT_COMMIT is set"),
        };
        assert_eq!(
            text.trim_end(),
            format!(
                "statefulset-scaledown-controller {} (commit {commit})",
                env!("CARGO_PKG_VERSION")
            )
        );
    }

    /// The flags table of docs/reference.md: one row per flag of `--help`, from clap's model of
    /// the flags (name, value, default, environment variable, help text).
    #[test]
    fn the_flags_table_is_generated_from_the_flags() {
        use clap::CommandFactory;
        let mut command = Args::command();
        command.build();
        let mut table =
            String::from("| Flag | Default | Environment | Meaning |\n|---|---|---|---|\n");
        for arg in command.get_arguments().filter(|a| !a.is_hide_set()) {
            let long = arg.get_long().expect("every flag has a long name");
            let mut flag = match arg.get_short() {
                Some(short) => format!("-{short}, --{long}"),
                None => format!("--{long}"),
            };
            let takes_value = arg.get_action().takes_values();
            // A value name of its own (`ID`), not the one clap derives from the field's name.
            let named = arg
                .get_value_names()
                .and_then(|v| v.first())
                .filter(|v| v.as_str() != arg.get_id().as_str().to_uppercase());
            if let Some(value) = named.filter(|_| takes_value) {
                flag.push_str(&format!(" {value}"));
            }
            let default = match arg.get_default_values().first() {
                Some(v) if takes_value => format!("`{}`", v.to_string_lossy()),
                _ if matches!(arg.get_action(), clap::ArgAction::SetTrue) => "off".to_string(),
                _ => "–".to_string(),
            };
            let env = arg
                .get_env()
                .map_or("–".to_string(), |e| format!("`{}`", e.to_string_lossy()));
            let mut help = arg
                .get_long_help()
                .or(arg.get_help())
                .map(ToString::to_string)
                .unwrap_or_default();
            let values: Vec<String> = arg
                .get_possible_values()
                .iter()
                .filter(|_| takes_value)
                .map(|v| format!("`{}`", v.get_name()))
                .collect();
            if !values.is_empty() {
                if !help.ends_with('.') {
                    help.push('.');
                }
                help.push_str(&format!(" One of {}.", values.join(", ")));
            }
            let help = crate::docs::cell(&help);
            table.push_str(&format!("| `{flag}` | {default} | {env} | {help} |\n"));
        }
        crate::docs::check_generated("flags", &table);
    }
}
