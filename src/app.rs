//! Wiring: the scale-down controller's watches and controller, the companions (their watches
//! are set up in `releaser` and `podbound`), HTTP, election and shutdown.
//!
//! [`start`] is the process after flag parsing: signals, client, [`run`]. `run` reads as its steps:
//! settings from the flags, the watches, HTTP, the reconcile context, the controller (with or
//! without election), then a bounded shutdown.
//!
//! Shutdown: the first SIGTERM or SIGINT stops new work. Running reconciles, the release of the
//! Lease and the HTTP servers get [`SHUTDOWN_GRACE`] to finish; whatever still runs then is dropped.
//! Cutting a pass short is safe: every write is idempotent and checked again on the next pass, as
//! after a crash. A second signal exits at once with 128 + the signal's number.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use futures::future::Fuse;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Config, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::cli::{Args, LogFormat};
use crate::error::{Error, Result};
use crate::http::{self, Probe};
use crate::index::{Index, Keys};
use crate::leader::{self, Leadership};
use crate::metrics::Metrics;
use crate::naming;
use crate::pass::{Controller as Pass, Runner};
use crate::releaser;
use crate::resuming::WatchBackoff;
use crate::scaledown::act::Actor;
use crate::scaledown::reconcile::{Context, error_policy, reconcile};
use crate::scaledown::watch::{self, PodCache, Stores};

/// Name the controller reports Events and writes under.
pub const CONTROLLER_NAME: &str = "statefulset-scaledown-controller";
/// How long shutdown waits for running reconciles, the release of the Lease and the HTTP servers.
pub const SHUTDOWN_GRACE: Duration = Duration::from_millis(500);

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
    crate::api_metrics::client(config).map_err(|e| Error::Config(e.to_string()))
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

/// The process after flag parsing: listens for signals, builds the client, runs. Returns the exit
/// code: 0 after a signal, 1 on an error (configuration, lost leadership).
pub async fn start(args: Args) -> i32 {
    let stop = on_signals();
    let result = match client(&args).await {
        Ok(client) => run(args, client, stop.cancelled_owned()).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            error!(error = %e, "exiting");
            1
        }
    }
}

/// Listens for SIGTERM and SIGINT: the first cancels the returned token (a graceful stop), a second
/// one exits the process at once with 128 + its number.
pub fn on_signals() -> CancellationToken {
    use tokio::signal::unix::{Signal, SignalKind, signal};
    let token = CancellationToken::new();
    let (term, int) = (SignalKind::terminate(), SignalKind::interrupt());
    let (Ok(mut on_term), Ok(mut on_int)) = (signal(term), signal(int)) else {
        warn!("cannot listen for signals; running until killed");
        return token;
    };
    async fn next(on_term: &mut Signal, on_int: &mut Signal) -> (&'static str, SignalKind) {
        tokio::select! {
            _ = on_term.recv() => ("SIGTERM", SignalKind::terminate()),
            _ = on_int.recv() => ("SIGINT", SignalKind::interrupt()),
        }
    }
    tokio::spawn({
        let token = token.clone();
        async move {
            let (name, _) = next(&mut on_term, &mut on_int).await;
            info!("{name} received, shutting down");
            token.cancel();
            let (name, kind) = next(&mut on_term, &mut on_int).await;
            warn!("{name} received again; exiting at once");
            std::process::exit(128 + kind.as_raw_value());
        }
    });
    token
}

/// What `run` needs from the flags, checked before anything starts.
struct Settings {
    namespace: Option<String>,
    metrics: Option<SocketAddr>,
    probes: Option<SocketAddr>,
    election: Option<leader::ElectionConfig>,
    /// The PV releaser's id, when it runs.
    pv_releaser: Option<String>,
    /// The scale-down controller runs (not `--disable-scaledown`).
    scaledown: bool,
    /// Claims bound to pods (`--pod-bound-claims`).
    pod_bound: bool,
}

impl Settings {
    fn from_args(args: &Args) -> Result<Settings> {
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

/// Runs the controller until `shutdown` resolves (then stops within [`SHUTDOWN_GRACE`], releases
/// the Lease and returns Ok) or leadership is lost (then returns `Err`).
pub async fn run(
    args: Args,
    client: Client,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let settings = Settings::from_args(&args)?;
    info!(
        namespace = settings.namespace.as_deref().unwrap_or("<all>"),
        dry_run = args.dry_run,
        leader_elect = args.leader_elect,
        pv_releaser = settings.pv_releaser.as_deref().unwrap_or("<off>"),
        scaledown = settings.scaledown,
        pod_bound_claims = settings.pod_bound,
        "starting"
    );
    let stop = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            tokio::select! {
                _ = shutdown => stop.cancel(),
                _ = stop.cancelled() => {}
            }
        }
    });
    let metrics = Arc::new(Metrics::default());
    let leadership = Arc::new(match settings.election {
        Some(_) => Leadership::elected(),
        None => Leadership::always(),
    });
    metrics.set_leader(settings.election.is_none());

    let Controllers {
        work,
        stores,
        pool,
        scaledown,
        releaser,
        podbound,
    } = controllers(&args, &settings, &client, &metrics, &leadership, &stop);
    let servers = start_http(&settings, &metrics, stores, pool, &stop).await?;
    // Fused: shutdown polls it again after it may have ended during `until_stopped`.
    let work = futures::FutureExt::fuse(work);
    tokio::pin!(work);
    let mut election = settings
        .election
        .map(|config| spawn_election(client, config, &leadership, &metrics, &stop));

    let lost = until_stopped(work.as_mut(), &mut election, &stop).await;
    stop.cancel();
    let deadline = Instant::now() + SHUTDOWN_GRACE;
    let idle = async {
        if let Some(ctx) = &scaledown {
            ctx.runner.idle().await;
        }
        if let Some(ctx) = &releaser {
            ctx.runner.idle().await;
        }
        if let Some(ctx) = &podbound {
            ctx.runner.idle().await;
        }
    };
    let outcome = wind_down(work, election, lost, idle, deadline).await;
    stop_servers(servers, deadline).await;
    info!("stopped");
    outcome
}

/// The controllers this process runs, as one future that ends after `stop` once their running
/// passes have; what HTTP reads of them; their contexts (to wait until no pass runs).
struct Controllers {
    work: futures::future::BoxFuture<'static, ()>,
    stores: Option<Stores>,
    pool: Option<releaser::Pool>,
    scaledown: Option<Arc<Context>>,
    releaser: Option<Arc<releaser::reconcile::Context>>,
    podbound: Option<Arc<crate::podbound::reconcile::Context>>,
}

/// The scale-down controller (unless `--disable-scaledown`) and the PV releaser (with
/// `--pv-releaser-id`), each with its own watches and pass context.
fn controllers(
    args: &Args,
    settings: &Settings,
    client: &Client,
    metrics: &Arc<Metrics>,
    leadership: &Arc<Leadership>,
    stop: &CancellationToken,
) -> Controllers {
    use futures::FutureExt;
    let mut work = Vec::new();
    let (mut stores, mut scaledown) = (None, None);
    if settings.scaledown {
        let watches = Watches::new(client, settings.namespace.as_deref());
        let ctx = context(args, client, watches.stores.clone(), metrics, leadership);
        stores = Some(watches.stores.clone());
        work.push(controller(watches, ctx.clone(), args.concurrency, leadership, stop).boxed());
        scaledown = Some(ctx);
    }
    let (mut pool, mut releaser) = (None, None);
    if let Some(id) = &settings.pv_releaser {
        let scrub_ns = args
            .pv_scrub_namespace
            .clone()
            .or_else(|| args.own_namespace());
        let watches = releaser::Watches::new(client, scrub_ns.as_deref());
        let scrub = (watches.scrub_pods.clone(), scrub_ns);
        let ctx = pv_context(args, client, &watches.pool(id), scrub, metrics, leadership);
        pool = Some(watches.pool(id));
        let woken = became_leader(leadership.subscribe());
        work.push(releaser::controller(watches, ctx.clone(), woken, stop).boxed());
        releaser = Some(ctx);
    }
    let mut podbound = None;
    if settings.pod_bound {
        let ctx = podbound_context(args, client, metrics, leadership);
        let ns = settings.namespace.as_deref();
        let woken = became_leader(leadership.subscribe());
        work.push(crate::podbound::controller(client, ns, ctx.clone(), woken, stop).boxed());
        podbound = Some(ctx);
    }
    Controllers {
        work: futures::future::join_all(work).map(|_| ()).boxed(),
        stores,
        pool,
        scaledown,
        releaser,
        podbound,
    }
}

/// The pod-bound claims' pass context.
fn podbound_context(
    args: &Args,
    client: &Client,
    metrics: &Arc<Metrics>,
    leadership: &Arc<Leadership>,
) -> Arc<crate::podbound::reconcile::Context> {
    let (reporter, runner) = reporting(Pass::PodBound, args, client, metrics);
    let binder = crate::podbound::act::Binder::new(client.clone(), reporter, leadership.clone());
    Arc::new(crate::podbound::reconcile::Context::new(
        client.clone(),
        binder,
        args.pod_bound_grace,
        leadership.clone(),
        runner,
    ))
}

/// Objects per page of the watches' lists (kube's default is 500). A page is held twice while it
/// is decoded (the body and the objects), so the page bounds the peak at start more than the
/// caches do; 100 costs a few more requests at start.
const LIST_PAGE_SIZE: u32 = 100;

/// The caches and the change streams the controller runs on. Every watch restores itself after an
/// error (`resuming::resuming`), so none of these streams ever yields an error.
struct Watches {
    stores: Stores,
    sets: BoxStream<'static, watcher::Result<StatefulSet>>,
    claims: BoxStream<'static, watcher::Result<PartialObjectMeta<PersistentVolumeClaim>>>,
    pods: BoxStream<'static, watcher::Result<Pod>>,
    cleanup_pods: BoxStream<'static, watcher::Result<Pod>>,
}

impl Watches {
    fn new(client: &Client, ns: Option<&str>) -> Watches {
        let all = watcher::Config::default().page_size(LIST_PAGE_SIZE);
        let cleanup = all.clone().labels(naming::CLEANUP_LABEL);
        let (sets, sets_writer) = reflector::store();
        let sets_stream = resuming(
            "statefulsets",
            api(client, ns),
            all.clone(),
            watch::prune_set,
        );
        let claims_stream = resuming("claims", api(client, ns), all.clone(), prune_claim);
        let pods_stream = resuming("pods", api(client, ns), all, watch::prune_pod);
        let cleanup_stream = resuming("cleanup pods", api(client, ns), cleanup, |p: &mut Pod| {
            p.managed_fields_mut().clear()
        });
        let (claims, pods, cleanup_pods) =
            (Index::default(), PodCache::default(), Index::default());
        Watches {
            sets: reflector(sets_writer, sets_stream)
                .applied_objects()
                .boxed(),
            claims: claims_stream
                .map_ok(indexed(&claims))
                .touched_objects()
                .boxed(),
            pods: pods_stream
                .map_ok({
                    let pods = pods.clone();
                    move |event| {
                        pods.apply(&event);
                        event
                    }
                })
                .touched_objects()
                .boxed(),
            cleanup_pods: cleanup_stream
                .map_ok(indexed(&cleanup_pods))
                .touched_objects()
                .boxed(),
            stores: Stores {
                sets,
                claims,
                pods,
                cleanup_pods,
            },
        }
    }
}

/// A watch of `api` that restores itself, its objects pruned by `prune` before they are cached.
fn resuming<K>(
    what: &'static str,
    api: Api<K>,
    config: watcher::Config,
    prune: fn(&mut K),
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    crate::resuming::resuming(what, move || {
        watcher(api.clone(), config.clone()).modify(prune)
    })
}

fn prune_claim(claim: &mut PartialObjectMeta<PersistentVolumeClaim>) {
    watch::prune_meta(claim, &[naming::NEXT_ATTEMPT_ANNOTATION]);
}

/// Starts the metrics and probe servers that are not turned off, and the readiness flag: ready once
/// every cache has synced, unready again when shutdown begins.
async fn start_http(
    settings: &Settings,
    metrics: &Arc<Metrics>,
    stores: Option<Stores>,
    pool: Option<releaser::Pool>,
    stop: &CancellationToken,
) -> Result<Vec<JoinHandle<Result<()>>>> {
    let probe = Probe {
        ready: Arc::new(AtomicBool::new(false)),
        metrics: metrics.clone(),
        stores: stores.clone(),
        pool: pool.clone(),
    };
    let endpoints = [
        (
            settings.metrics,
            "metrics",
            http::metrics_router(probe.clone()),
        ),
        (
            settings.probes,
            "health probes",
            http::probes_router(probe.clone()),
        ),
    ];
    let mut servers = Vec::new();
    for (addr, what, router) in endpoints {
        let Some(addr) = addr else { continue };
        let listener = http::bind(what, addr).await?;
        let stopped = stop.clone().cancelled_owned();
        servers.push(tokio::spawn(http::serve(listener, router, stopped)));
    }
    tokio::spawn({
        use std::sync::atomic::Ordering;
        let (ready, stop) = (probe.ready, stop.clone());
        let all_synced = async move {
            if let Some(pool) = pool {
                pool.ready().await;
            }
            match stores {
                Some(stores) => stores.ready().await,
                None => Ok(()),
            }
        };
        async move {
            tokio::select! {
                synced = all_synced => if synced.is_ok() {
                    ready.store(true, Ordering::SeqCst);
                    info!("caches synced");
                },
                _ = stop.cancelled() => {}
            }
            stop.cancelled().await;
            ready.store(false, Ordering::SeqCst);
        }
    });
    Ok(servers)
}

/// What every reconcile shares: client, caches, policy, the writer and the per-set memory.
fn context(
    args: &Args,
    client: &Client,
    stores: Stores,
    metrics: &Arc<Metrics>,
    leadership: &Arc<Leadership>,
) -> Arc<Context> {
    let (reporter, runner) = reporting(Pass::Scaledown, args, client, metrics);
    let actor = Actor::new(
        client.clone(),
        reporter,
        metrics.clone(),
        leadership.clone(),
    );
    Arc::new(Context::new(
        client.clone(),
        stores,
        args.policy(),
        actor,
        leadership.clone(),
        args.resync_period,
        runner,
    ))
}

/// The PV releaser's pass context: its writer and the StorageClass cache.
fn pv_context(
    args: &Args,
    client: &Client,
    pool: &releaser::Pool,
    (scrub_pods, scrub_ns): (kube::runtime::reflector::Store<Pod>, Option<String>),
    metrics: &Arc<Metrics>,
    leadership: &Arc<Leadership>,
) -> Arc<releaser::reconcile::Context> {
    let (reporter, runner) = reporting(Pass::Releaser, args, client, metrics);
    let writer = releaser::act::Releaser::new(
        client.clone(),
        reporter,
        metrics.clone(),
        leadership.clone(),
    );
    Arc::new(releaser::reconcile::Context::new(
        client.clone(),
        pool.classes.clone(),
        scrub_pods,
        scrub_ns,
        pool.id.clone(),
        writer,
        leadership.clone(),
        runner,
    ))
}

/// The reporter of one controller (Events under [`CONTROLLER_NAME`] and this replica's identity)
/// and its pass runner.
fn reporting<K>(
    controller: Pass,
    args: &Args,
    client: &Client,
    metrics: &Arc<Metrics>,
) -> (Arc<crate::report::Reporter>, Runner<K>)
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let identity = Reporter {
        controller: CONTROLLER_NAME.into(),
        instance: Some(args.identity()),
    };
    crate::pass::parts(controller, client, identity, metrics, args.dry_run)
}

/// kube's Controller over the watches, as one future; after `stop` it takes no new work and ends
/// once the running reconciles have.
fn controller(
    watches: Watches,
    ctx: Arc<Context>,
    concurrency: u16,
    leadership: &Leadership,
    stop: &CancellationToken,
) -> impl Future<Output = ()> + Send + 'static {
    let Watches {
        stores,
        sets,
        claims,
        pods,
        cleanup_pods,
    } = watches;
    let cached_sets = stores.sets.clone();
    Controller::for_stream(sets, stores.sets)
        .with_config(controller::Config::default().concurrency(concurrency))
        // The watches never yield errors; should one ever reach the Controller, retry soon.
        .trigger_backoff(WatchBackoff::default())
        .watches_stream(claims, move |claim| {
            watch::sets_of_claim(&claim, &cached_sets)
        })
        .watches_stream(pods, |pod| watch::set_of_pod(&pod))
        .watches_stream(cleanup_pods, |pod| watch::set_of_pod(&pod))
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
        })
}

fn spawn_election(
    client: Client,
    config: leader::ElectionConfig,
    leadership: &Arc<Leadership>,
    metrics: &Arc<Metrics>,
    stop: &CancellationToken,
) -> JoinHandle<Result<()>> {
    let (leadership, metrics, stop) = (leadership.clone(), metrics.clone(), stop.clone());
    tokio::spawn(async move {
        leader::run(
            client,
            config,
            &leadership,
            &metrics,
            stop.cancelled_owned(),
        )
        .await
    })
}

fn joined(result: std::result::Result<Result<()>, tokio::task::JoinError>) -> Result<()> {
    result.unwrap_or_else(|source| {
        Err(Error::Joined {
            task: "election task",
            source,
        })
    })
}

/// Runs until `stop`, or until the election ends first (leadership lost): then its result.
async fn until_stopped(
    controller: Pin<&mut Fuse<impl Future<Output = ()>>>,
    election: &mut Option<JoinHandle<Result<()>>>,
    stop: &CancellationToken,
) -> Option<Result<()>> {
    let election_ended = async {
        match election.as_mut() {
            Some(task) => task.await,
            None => std::future::pending().await,
        }
    };
    let lost = tokio::select! {
        _ = stop.cancelled() => None,
        // The controller ends only after `stop`.
        _ = controller => None,
        ended = election_ended => Some(joined(ended)),
    };
    if lost.is_some() {
        *election = None;
    }
    lost
}

/// After `stop`: lets running reconciles finish and the election release the Lease until
/// `deadline`, then drops whatever still runs. The outcome is the election's.
async fn wind_down(
    controller: Pin<&mut Fuse<impl Future<Output = ()>>>,
    election: Option<JoinHandle<Result<()>>>,
    lost: Option<Result<()>>,
    idle: impl Future<Output = ()>,
    deadline: Instant,
) -> Result<()> {
    let drained = tokio::time::timeout_at(deadline, async {
        tokio::select! {
            _ = controller => {},
            _ = idle => {},
        }
    })
    .await;
    if drained.is_err() {
        warn!(grace = ?SHUTDOWN_GRACE, "reconciles still running at the end of the shutdown grace; stopping them");
    }
    match (lost, election) {
        (Some(result), _) => result,
        (None, None) => Ok(()),
        (None, Some(mut task)) => match tokio::time::timeout_at(deadline, &mut task).await {
            Ok(result) => joined(result),
            Err(_) => {
                task.abort();
                warn!(
                    "the Lease was not released within the shutdown grace; it expires on its own"
                );
                Ok(())
            }
        },
    }
}

/// Waits for the HTTP servers until `deadline`, then drops them.
async fn stop_servers(servers: Vec<JoinHandle<Result<()>>>, deadline: Instant) {
    for mut server in servers {
        match tokio::time::timeout_at(deadline, &mut server).await {
            Ok(Ok(Err(e))) => warn!(error = %e, "http server failed"),
            Ok(_) => {}
            Err(_) => server.abort(),
        }
    }
}

/// Passes a watcher event on after applying it to `index`.
fn indexed<K>(index: &Index<K>) -> impl FnMut(watcher::Event<K>) -> watcher::Event<K> + use<K>
where
    K: kube::Resource + Keys + Clone,
{
    let index = index.clone();
    move |event| {
        index.apply(&event);
        event
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use futures::FutureExt;

    use super::*;

    /// A controller future as `run` builds it (a `Map`, which panics if polled after its end),
    /// fused, that sets `ended` when it ends.
    fn controllers(ended: &Arc<AtomicBool>) -> Fuse<impl Future<Output = ()> + use<>> {
        let ended = ended.clone();
        futures::future::ready(())
            .map(move |_| ended.store(true, Ordering::SeqCst))
            .fuse()
    }

    /// The controllers end before `stop` (graceful shutdown finished at once): `until_stopped`
    /// returns for them, and `wind_down` polls them again without panicking (the chaos run caught
    /// a `Map` polled after its end at a SIGTERM) and returns as soon as the reconciles are idle.
    #[tokio::test(start_paused = true)]
    async fn controllers_that_already_ended_are_polled_again_safely() {
        let ended = Arc::new(AtomicBool::new(false));
        let work = controllers(&ended);
        tokio::pin!(work);
        let (stop, mut election) = (CancellationToken::new(), None);
        let lost = until_stopped(work.as_mut(), &mut election, &stop).await;
        assert!(lost.is_none(), "no election, nothing lost");
        assert!(
            ended.load(Ordering::SeqCst),
            "returned because the controllers ended"
        );
        let start = Instant::now();
        let deadline = start + SHUTDOWN_GRACE;
        let outcome = wind_down(work, election, lost, async {}, deadline).await;
        assert!(outcome.is_ok(), "{outcome:?}");
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "idle at once: no wait for the grace"
        );
    }

    /// `stop` before the controllers were polled: `wind_down` drives them to their end.
    #[tokio::test(start_paused = true)]
    async fn wind_down_lets_the_controllers_finish() {
        let ended = Arc::new(AtomicBool::new(false));
        let work = controllers(&ended);
        tokio::pin!(work);
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        let idle = std::future::pending::<()>();
        let outcome = wind_down(work, None, None, idle, deadline).await;
        assert!(outcome.is_ok(), "{outcome:?}");
        assert!(
            ended.load(Ordering::SeqCst),
            "the controllers ran to their end"
        );
    }

    /// Controllers and reconciles that never finish are dropped at the deadline, not before and
    /// not later.
    #[tokio::test(start_paused = true)]
    async fn wind_down_stops_waiting_at_the_deadline() {
        let work = std::future::pending::<()>().fuse();
        tokio::pin!(work);
        let start = Instant::now();
        let idle = std::future::pending::<()>();
        let wound = wind_down(work, None, None, idle, start + SHUTDOWN_GRACE);
        let outcome = tokio::time::timeout(SHUTDOWN_GRACE * 10, wound).await;
        assert!(matches!(outcome, Ok(Ok(()))), "{outcome:?}");
        assert_eq!(start.elapsed(), SHUTDOWN_GRACE);
    }

    /// An election that ends first is leadership lost: its error is the outcome of the shutdown.
    #[tokio::test(start_paused = true)]
    async fn a_lost_election_is_the_outcome() {
        let work = std::future::pending::<()>().fuse();
        tokio::pin!(work);
        let stop = CancellationToken::new();
        let mut election = Some(tokio::spawn(async { Err(Error::LeadershipLost) }));
        let lost = until_stopped(work.as_mut(), &mut election, &stop).await;
        assert!(matches!(lost, Some(Err(Error::LeadershipLost))), "{lost:?}");
        assert!(
            election.is_none(),
            "the ended election is not awaited again"
        );
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        let outcome = wind_down(work, election, lost, async {}, deadline).await;
        assert!(matches!(outcome, Err(Error::LeadershipLost)), "{outcome:?}");
    }
}
