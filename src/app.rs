//! Wiring only: which controllers run, on which caches, with HTTP, election and shutdown around
//! them. [`start`] is the process after flag parsing: signals, client, [`run`]; `run` reads as its
//! steps: settings ([`crate::settings`]), the controllers on their caches ([`controllers`]), HTTP
//! ([`crate::http`]), the election ([`crate::leader`]), then a bounded shutdown ([`crate::shutdown`]).

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::Client;
use kube::runtime::reflector;
use prometheus_client::registry::Registry;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::caches::{Caches, Claim};
use crate::cli::Args;
use crate::error::Result;
use crate::fence;
use crate::http::{self, Liveness, Probe};
use crate::leader::{self, Leadership};
use crate::metrics::{self, Metrics};
use crate::settings::{self, Settings};
use crate::shutdown::{self, SHUTDOWN_GRACE};
use crate::{podbound, releaser, scaledown};

/// The process after flag parsing: listens for signals, builds the client, runs. Returns the exit
/// code: 0 after a signal, 1 on an error (configuration, lost leadership).
pub async fn start(args: Args) -> i32 {
    let stop = shutdown::on_signals();
    let result = match settings::client(&args).await {
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

/// Runs the controllers until `shutdown` resolves (then stops within [`SHUTDOWN_GRACE`], releases
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
    let stop = shutdown::stop_on(shutdown);
    let metrics = Arc::new(Metrics::default());
    let leadership = Arc::new(match settings.election {
        Some(_) => Leadership::elected(),
        None => Leadership::always(),
    });
    metrics.set_leader(settings.election.is_none());
    // The controllers' writes go through the fence; the election's own requests do not.
    let fenced = fence::client(&client, &leadership);
    let wired = Wiring {
        args: &args,
        client: &fenced,
        metrics: &metrics,
        leadership: &leadership,
        stop: &stop,
    };
    let Controllers {
        work,
        synced,
        gauges,
        idle,
        live,
    } = controllers(&wired, &settings);
    let probe = Probe {
        ready: http::readiness(synced, &stop),
        live: Arc::new(live),
        metrics: metrics.clone(),
        gauges: Arc::new(gauges),
    };
    let servers = http::start([settings.metrics, settings.probes], probe, &stop).await?;
    // Fused: shutdown polls it again after it may have ended during `until_stopped`.
    let work = work.fuse();
    tokio::pin!(work);
    let mut election = settings
        .election
        .map(|config| leader::spawn(client, config, &leadership, &metrics, &stop));

    let lost = shutdown::until_stopped(work.as_mut(), &mut election, &stop).await;
    stop.cancel();
    let deadline = Instant::now() + SHUTDOWN_GRACE;
    let idle = futures::future::join_all(idle).map(|_| ());
    let outcome = shutdown::wind_down(work, election, lost, idle, deadline).await;
    shutdown::stop_servers(servers, deadline).await;
    info!("stopped");
    outcome
}

/// What every controller is built with.
struct Wiring<'a> {
    args: &'a Args,
    client: &'a Client,
    metrics: &'a Arc<Metrics>,
    leadership: &'a Arc<Leadership>,
    stop: &'a CancellationToken,
}

/// The controllers this process runs, as one future that ends after `stop` once their running
/// passes have; the waits for their caches (readiness); their scrape-time gauges; waits until
/// no pass runs; and their passes as liveness looks at them.
struct Controllers {
    work: BoxFuture<'static, ()>,
    synced: Vec<BoxFuture<'static, bool>>,
    gauges: Registry,
    idle: Vec<BoxFuture<'static, ()>>,
    live: Liveness,
}

/// The shared caches and the controllers on them (the scale-down controller unless
/// `--disable-scaledown`, pod-bound claims with `--pod-bound-claims`), and the PV releaser (with
/// `--pv-releaser-id`) on its own.
fn controllers(wired: &Wiring, settings: &Settings) -> Controllers {
    let mut work = Vec::new();
    let mut built = Controllers {
        work: futures::future::ready(()).boxed(),
        synced: Vec::new(),
        gauges: Registry::with_prefix(metrics::PREFIX),
        idle: Vec::new(),
        live: Liveness::default(),
    };
    if settings.scaledown || settings.pod_bound {
        let ns = settings.namespace.as_deref();
        // Pod-bound's Controller reads claims from a kube store: the shared claims, not a copy.
        let (claims, claim_writer) = if settings.pod_bound {
            let (reader, writer) = reflector::store::<Claim>();
            (Some(reader), Some(writer))
        } else {
            (None, None)
        };
        // Only the scale-down controller reads the sets' scheduling fields.
        let inherit = settings.scaledown && wired.args.inherit_scheduling;
        let (caches, feeds) = Caches::new(wired.client, ns, claim_writer, inherit);
        if settings.scaledown {
            work.push(with_scaledown(wired, &caches, ns, &mut built));
        }
        if let Some(claims) = claims {
            work.push(with_podbound(wired, &caches, claims, &mut built));
        }
        let shared = caches.clone();
        built
            .synced
            .push(async move { shared.ready().await.is_ok() }.boxed());
        // Last: every subscription to the caches' changes is made before the feeds run.
        work.push(feeds.run(wired.stop.clone()).boxed());
    }
    if let Some(id) = &settings.pv_releaser {
        work.push(with_releaser(wired, id, &mut built));
    }
    built.work = futures::future::join_all(work).map(|_| ()).boxed();
    built
}

fn with_scaledown(
    wired: &Wiring,
    caches: &Caches,
    ns: Option<&str>,
    built: &mut Controllers,
) -> BoxFuture<'static, ()> {
    let watches = scaledown::watch::Watches::new(wired.client, ns, caches);
    let stores = watches.stores.clone();
    let ctx = scaledown::context(
        wired.args,
        wired.client,
        stores.clone(),
        wired.metrics,
        wired.leadership,
    );
    let woken = leader::became_leader(wired.leadership.subscribe());
    let controller = scaledown::controller(watches, caches, ctx.clone(), woken, wired.stop);
    built
        .gauges
        .register_collector(Box::new(scaledown::gauges::Gauges(stores.clone())));
    built
        .synced
        .push(async move { stores.ready().await.is_ok() }.boxed());
    let passes = ctx.clone();
    built.live.pass(ctx.runner.controller().as_str(), move || {
        passes.runner.longest_pass()
    });
    built
        .idle
        .push(async move { ctx.runner.idle().await }.boxed());
    controller.boxed()
}

fn with_podbound(
    wired: &Wiring,
    caches: &Caches,
    claims: reflector::Store<Claim>,
    built: &mut Controllers,
) -> BoxFuture<'static, ()> {
    let ctx = podbound::context(
        wired.args,
        wired.client,
        (caches, claims),
        wired.metrics,
        wired.leadership,
    );
    let woken = leader::became_leader(wired.leadership.subscribe());
    let controller = podbound::controller(caches, ctx.clone(), woken, wired.stop);
    let passes = ctx.clone();
    built.live.pass(ctx.runner.controller().as_str(), move || {
        passes.runner.longest_pass()
    });
    built
        .idle
        .push(async move { ctx.runner.idle().await }.boxed());
    controller.boxed()
}

fn with_releaser(wired: &Wiring, id: &str, built: &mut Controllers) -> BoxFuture<'static, ()> {
    let args = wired.args;
    let scrub_ns = args
        .pv_scrub_namespace
        .clone()
        .or_else(|| args.own_namespace());
    let watches = releaser::watch::Watches::new(wired.client, scrub_ns.as_deref());
    let pool = watches.pool(id);
    let scrub = (watches.scrub_pods.clone(), scrub_ns);
    let ctx = releaser::context(
        args,
        wired.client,
        &pool,
        scrub,
        wired.metrics,
        wired.leadership,
    );
    let woken = leader::became_leader(wired.leadership.subscribe());
    let controller = releaser::controller(watches, ctx.clone(), woken, wired.stop);
    built.gauges.register_collector(Box::new(pool.clone()));
    built.synced.push(
        async move {
            pool.ready().await;
            true
        }
        .boxed(),
    );
    let passes = ctx.clone();
    built.live.pass(ctx.runner.controller().as_str(), move || {
        passes.runner.longest_pass()
    });
    built
        .idle
        .push(async move { ctx.runner.idle().await }.boxed());
    controller.boxed()
}
