//! The one place that wires watches, the controller and shutdown together.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::CancellationToken;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Config, Resource, ResourceExt};
use tracing::{debug, info, warn};

use crate::act::Actor;
use crate::cli::{Args, LogFormat};
use crate::error::{Error, Result};
use crate::http::{self, Probe};
use crate::leader::{self, Leadership};
use crate::metrics::Metrics;
use crate::naming;
use crate::reconcile::{Context, error_policy, reconcile};
use crate::watch::{self, Stores};

/// Name the controller reports Events and writes under.
pub const CONTROLLER_NAME: &str = "statefulset-scaledown-controller";

/// Installs the global tracing subscriber from the flags.
pub fn init_logging(args: &Args) {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal, and never with NO_COLOR set (no escape codes in log files).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

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
    Client::try_from(config).map_err(|e| Error::Config(e.to_string()))
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as Resource>::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Runs the controller until `shutdown` resolves (then drains, releases the Lease and returns Ok)
/// or leadership is lost (then returns `Err`).
pub async fn run(
    args: Args,
    client: Client,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let namespace = args.scope()?;
    let ns = namespace.as_deref();
    let metrics_addr = http::bind_address(&args.metrics_bind_address)?;
    let probe_addr = http::bind_address(&args.health_probe_bind_address)?;
    let election = election_config(&args)?;
    info!(
        namespace = ns.unwrap_or("<all>"),
        dry_run = args.dry_run,
        leader_elect = args.leader_elect,
        "starting"
    );

    let stop = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            shutdown.await;
            stop.cancel();
        }
    });
    let metrics = Arc::new(Metrics::default());
    let leadership = Arc::new(if election.is_some() {
        Leadership::elected()
    } else {
        Leadership::always()
    });
    metrics.set_leader(election.is_none());
    let config = watcher::Config::default();

    let (claims, claims_writer) = reflector::store();
    let claim_events = reflector(
        claims_writer,
        watcher(
            api::<PartialObjectMeta<PersistentVolumeClaim>>(&client, ns),
            config.clone(),
        )
        .modify(|c| watch::prune_meta(c, &[naming::NEXT_ATTEMPT_ANNOTATION])),
    )
    .default_backoff()
    .touched_objects();
    let (pods, pods_writer) = reflector::store();
    let pod_events = reflector(
        pods_writer,
        watcher(api::<Pod>(&client, ns), config.clone()).modify(watch::prune_pod),
    )
    .default_backoff()
    .touched_objects();
    let (cleanup_pods, cleanup_writer) = reflector::store();
    let cleanup_events = reflector(
        cleanup_writer,
        watcher(
            api::<Pod>(&client, ns),
            config.clone().labels(naming::CLEANUP_LABEL),
        )
        .modify(|p| p.managed_fields_mut().clear()),
    )
    .default_backoff()
    .touched_objects();

    let controller = Controller::new(api::<StatefulSet>(&client, ns), config)
        .with_config(controller::Config::default().concurrency(args.concurrency));
    let stores = Stores {
        sets: controller.store(),
        claims,
        pods,
        cleanup_pods,
    };

    // HTTP: metrics and probes; ready once every cache has synced, unready again on shutdown.
    let probe = Probe {
        ready: Arc::new(AtomicBool::new(false)),
        metrics: metrics.clone(),
        stores: stores.clone(),
    };
    let mut servers = Vec::new();
    if let Some(addr) = metrics_addr {
        let listener = http::bind("metrics", addr).await?;
        let app = http::metrics_router(probe.clone());
        servers.push(tokio::spawn(http::serve(
            listener,
            app,
            stop.clone().cancelled_owned(),
        )));
    }
    if let Some(addr) = probe_addr {
        let listener = http::bind("health probes", addr).await?;
        let app = http::probes_router(probe.clone());
        servers.push(tokio::spawn(http::serve(
            listener,
            app,
            stop.clone().cancelled_owned(),
        )));
    }
    tokio::spawn({
        let (stores, ready, stop) = (stores.clone(), probe.ready.clone(), stop.clone());
        async move {
            tokio::select! {
                synced = stores.ready() => if synced.is_ok() {
                    ready.store(true, Ordering::SeqCst);
                    info!("caches synced");
                },
                _ = stop.cancelled() => {}
            }
            stop.cancelled().await;
            ready.store(false, Ordering::SeqCst);
        }
    });

    let reporter = Reporter {
        controller: CONTROLLER_NAME.into(),
        instance: Some(args.identity()),
    };
    let actor = Actor::new(
        client.clone(),
        reporter,
        args.dry_run,
        metrics.clone(),
        leadership.clone(),
    );
    let ctx = Arc::new(Context::new(
        client.clone(),
        stores.clone(),
        args.policy(),
        actor,
        metrics.clone(),
        leadership.clone(),
        args.resync_period,
    ));

    let sets = stores.sets.clone();
    let controller = controller
        .watches_stream(claim_events, move |claim| {
            watch::sets_of_claim(&claim, &sets.state())
        })
        .watches_stream(pod_events, |pod| watch::set_of_pod(&pod))
        .watches_stream(cleanup_events, |pod| watch::set_of_pod(&pod))
        // A new leader looks at every set at once instead of waiting for the resync.
        .reconcile_all_on(became_leader(leadership.subscribe()))
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((set, _)) => debug!(set = %set.name, "reconciled"),
                // Already logged and counted by error_policy.
                Err(controller::Error::ReconcilerFailed(..)) => {}
                Err(controller::Error::ObjectNotFound(set)) => {
                    debug!(set = %set.name, "gone before its reconcile")
                }
                Err(e) => warn!(error = %e, "watch or queue error"),
            }
        });
    tokio::pin!(controller);

    let outcome = match election {
        None => {
            controller.await;
            Ok(())
        }
        Some(config) => {
            let mut election = tokio::spawn({
                let (leadership, metrics, stop) =
                    (leadership.clone(), metrics.clone(), stop.clone());
                async move {
                    leader::run(
                        client,
                        config,
                        &leadership,
                        &metrics,
                        stop.cancelled_owned(),
                    )
                    .await
                }
            });
            let joined = |r: std::result::Result<Result<()>, tokio::task::JoinError>| {
                r.unwrap_or_else(|e| Err(Error::Task(format!("election task: {e}"))))
            };
            tokio::select! {
                _ = &mut controller => joined(election.await),
                result = &mut election => {
                    // Leadership ended first (lost): stop, drain, report.
                    stop.cancel();
                    controller.await;
                    joined(result)
                }
            }
        }
    };
    stop.cancel();
    for server in servers {
        if let Ok(Err(e)) = server.await {
            warn!(error = %e, "http server failed");
        }
    }
    info!("stopped");
    outcome
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

/// Yields once every time `leading` turns true.
fn became_leader(
    leading: tokio::sync::watch::Receiver<bool>,
) -> impl futures::Stream<Item = ()> + Send {
    futures::stream::unfold(leading, |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            if *rx.borrow_and_update() {
                return Some(((), rx));
            }
        }
    })
}

/// Resolves on the first SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => info!("SIGTERM received, shutting down"),
                _ = int.recv() => info!("SIGINT received, shutting down"),
            }
        }
        _ => {
            warn!("cannot listen for signals; running until killed");
            std::future::pending::<()>().await;
        }
    }
}
