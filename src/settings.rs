//! Settings: the flags checked before anything starts, and the API client they describe.

use std::net::SocketAddr;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tracing::warn;

use crate::cli::Args;
use crate::error::{Error, Result};
use crate::http;
use crate::leader;

/// A client from `--kubeconfig`/`--master`, else the in-cluster or default configuration.
pub async fn client(args: &Args) -> Result<Client> {
    let mut config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| Error::Config(format!("kubeconfig {}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| Error::Config(format!("kubeconfig {}: {e}", path.display())))?
        }
        None => Config::infer()
            .await
            .map_err(|e| Error::Config(e.to_string()))?,
    };
    if let Some(master) = &args.master {
        config.cluster_url = master
            .parse()
            .map_err(|e| Error::Config(format!("--master {master}: {e}")))?;
    }
    crate::api_metrics::client(config).map_err(|e| Error::Config(e.to_string()))
}

/// What `run` needs from the flags, checked before anything starts.
pub struct Settings {
    /// Only this namespace (`--namespace`); `None`: every namespace.
    pub namespace: Option<String>,
    /// Where `/metrics` listens (`None`: off).
    pub metrics: Option<SocketAddr>,
    /// Where the probes listen (`None`: off).
    pub probes: Option<SocketAddr>,
    /// Leader election, when on.
    pub election: Option<leader::ElectionConfig>,
    /// The PV releaser's id, when it runs.
    pub pv_releaser: Option<String>,
    /// The scale-down controller runs (not `--disable-scaledown`).
    pub scaledown: bool,
    /// Claims bound to pods (`--pod-bound-claims`).
    pub pod_bound: bool,
}

impl Settings {
    /// The settings of `args`, or why they are refused.
    pub fn from_args(args: &Args) -> Result<Settings> {
        Ok(Settings {
            namespace: args.scope()?,
            metrics: http::bind_address(&args.metrics_bind_address)?,
            probes: http::bind_address(&args.health_probe_bind_address)?,
            election: election_config(args)?,
            pv_releaser: args.pv_releaser()?,
            scaledown: !args.disable_scaledown,
            pod_bound: args.pod_bound_claims,
        })
    }
}

fn election_config(args: &Args) -> Result<Option<leader::ElectionConfig>> {
    if !args.leader_elect {
        return Ok(None);
    }
    let namespace = args.leader_election_namespace.clone().or_else(|| args.own_namespace()).ok_or_else(|| {
        Error::Config("--leader-elect needs --leader-election-namespace, POD_NAMESPACE or an in-cluster ServiceAccount".into())
    })?;
    if args.leader_elect_renew_deadline >= args.leader_elect_lease_duration {
        return Err(Error::Config(
            "--leader-elect-renew-deadline must be shorter than --leader-elect-lease-duration"
                .into(),
        ));
    }
    if let Some(lock) = args
        .leader_elect_resource_lock
        .as_deref()
        .filter(|l| *l != "leases")
    {
        warn!(
            lock,
            "--leader-elect-resource-lock is ignored: the lock is always a coordination.k8s.io Lease"
        );
    }
    Ok(Some(leader::ElectionConfig {
        namespace,
        lease_name: args.leader_election_id.clone(),
        identity: args.identity(),
        lease_duration: args.leader_elect_lease_duration,
        renew_deadline: args.leader_elect_renew_deadline,
        retry_period: args.leader_elect_retry_period,
    }))
}
