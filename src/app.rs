//! The one place that wires watches, the controller and shutdown together.

use std::sync::Arc;

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
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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

/// Runs the controller until `shutdown` resolves, then drains running reconciles and returns.
pub async fn run(
    args: Args,
    client: Client,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let namespace = args.scope()?;
    let ns = namespace.as_deref();
    info!(
        namespace = ns.unwrap_or("<all>"),
        dry_run = args.dry_run,
        "starting"
    );
    let metrics = Arc::new(Metrics::default());
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
        watcher(api::<PartialObjectMeta<Pod>>(&client, ns), config.clone())
            .modify(|p| watch::prune_meta(p, &[naming::OWNER_ANNOTATION])),
    )
    .default_backoff()
    .touched_objects();
    let (cleanup_pods, cleanup_writer) = reflector::store();
    let cleanup_events = reflector(
        cleanup_writer,
        watcher(
            api::<Pod>(&client, ns),
            config.clone().labels(&watch::cleanup_selector()),
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
    let reporter = Reporter {
        controller: CONTROLLER_NAME.into(),
        instance: args.pod_name.clone(),
    };
    let actor = Actor::new(client.clone(), reporter, args.dry_run, metrics.clone());
    let ctx = Arc::new(Context::new(
        client,
        stores.clone(),
        args.policy(),
        actor,
        metrics,
        args.resync_period,
    ));

    let sets = stores.sets.clone();
    controller
        .watches_stream(claim_events, move |claim| {
            watch::sets_of_claim(&claim, &sets.state())
        })
        .watches_stream(pod_events, |pod| watch::set_of_pod(&pod))
        .watches_stream(cleanup_events, |pod| watch::set_of_pod(&pod))
        .graceful_shutdown_on(shutdown)
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
        })
        .await;
    info!("stopped");
    Ok(())
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
