//! The agent once the data path is in place: the reconcile worker (over
//! any `LbMaps`: the pinned maps, or the fake ones in tests), the source,
//! the metrics and health servers and the event loop, run until a `Stop`
//! arrives. `process` builds one over the pinned maps; the tests in
//! lb-userspace/tests/agent.rs build one over the fake maps, without root.
use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use super::{
    mailbox::Mailbox,
    router::{Control, Router},
    worker::Worker,
};
use crate::{
    health::{proxy::ProxyHealth, NodeEligibility},
    maps::LbMaps,
    metrics::Metrics,
    source::{
        self,
        file::parse::FileContext,
        kubernetes::watch::{ApiServer, WatchConfig},
    },
};

/// How long a stopping agent waits for a reconcile in progress to reach
/// the end of its current service.
pub const WORKER_STOP_WAIT: Duration = Duration::from_millis(800);

/// Where the agent's changes come from.
pub enum Source {
    /// Standalone mode: a services file, followed as it changes.
    File {
        path: PathBuf,
        context: FileContext,
        /// The node's addresses as they change (None: read once).
        follow: Option<crate::source::file::Follow>,
    },
    /// Kubernetes mode: the apiservers, the first that answers watched.
    Kubernetes {
        servers: Vec<ApiServer>,
        watch: WatchConfig,
    },
}

/// The agent's HTTP servers.
#[derive(Clone, Copy, Debug)]
pub struct Endpoints {
    /// `/metrics` and `/healthz`.
    pub metrics: SocketAddr,
    /// kube-proxy's health server (`/healthz`, `/livez`); None: off.
    pub healthz: Option<SocketAddr>,
    /// How late a change may reach the maps before `/healthz` says so.
    pub healthz_grace: Duration,
}

/// A forwarder of the programs' log records (`process`: aya-log).
pub type BpfLogs = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

pub struct Agent<M: LbMaps> {
    worker: Worker<M>,
    source: Source,
    endpoints: Endpoints,
    metrics: Metrics,
    registry: Registry,
    node_eligibility: Arc<NodeEligibility>,
    /// Shared with the reconciler (`Reconciler::with_cancel`): set on stop,
    /// a reconcile in progress stops at the next service.
    cancel: Arc<AtomicBool>,
    /// Set on stop too: the parts beside the agent (the conntrack
    /// collector).
    stop_flags: Vec<Arc<AtomicBool>>,
    bpf_logs: Option<BpfLogs>,
}

/// How the agent stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stopped {
    /// The worker let go of its state within `WORKER_STOP_WAIT` (false: it
    /// was still writing and was left to the process's exit).
    pub worker_stopped: bool,
}

impl<M: LbMaps + Send + 'static> Agent<M> {
    /// `cancel` must be the flag the worker's reconciler was given.
    pub fn new(
        worker: Worker<M>,
        cancel: Arc<AtomicBool>,
        source: Source,
        endpoints: Endpoints,
        (metrics, registry): (Metrics, Registry),
        node_eligibility: Arc<NodeEligibility>,
    ) -> Self {
        Self {
            worker,
            source,
            endpoints,
            metrics,
            registry,
            node_eligibility,
            cancel,
            stop_flags: Vec::new(),
            bpf_logs: None,
        }
    }

    /// Sets `flag` when the agent stops, with the reconciler's cancel flag
    /// and before the worker is waited for.
    pub fn with_stop_flag(mut self, flag: Arc<AtomicBool>) -> Self {
        self.stop_flags.push(flag);
        self
    }

    /// Runs `forward` beside the agent (the programs' log records).
    pub fn with_bpf_logs(mut self, forward: BpfLogs) -> Self {
        self.bpf_logs = Some(forward);
        self
    }

    /// Serves until `control` says `Stop` (or closes); then stops the
    /// worker, waiting at most `WORKER_STOP_WAIT` for it. The data path is
    /// left as it is: it keeps forwarding.
    pub async fn run(self, control: mpsc::Receiver<Control>) -> anyhow::Result<Stopped> {
        let Self {
            worker,
            source,
            endpoints,
            metrics,
            registry,
            node_eligibility,
            cancel,
            stop_flags,
            bpf_logs,
        } = self;
        // The reconciler runs on a thread of its own, fed through a mailbox
        // that never makes a source wait.
        let mailbox = Arc::new(Mailbox::default());
        let worker = worker.spawn(mailbox.clone());

        let health = metrics.health.clone();
        tokio::spawn(async move {
            if let Err(e) = crate::metrics::server::serve(
                endpoints.metrics,
                registry,
                health,
                endpoints.healthz_grace,
            )
            .await
            {
                error!("{e:#}");
            }
        });
        let proxy_health = ProxyHealth {
            health: metrics.health.clone(),
            node: node_eligibility,
            grace: endpoints.healthz_grace,
        };
        if let Some(addr) = endpoints.healthz {
            let state = proxy_health.clone();
            tokio::spawn(async move {
                if let Err(e) = crate::health::proxy::serve(addr, state).await {
                    error!("{e:#}");
                }
            });
        }
        let (checks_tx, checks_rx) = tokio::sync::watch::channel(Default::default());
        tokio::spawn(crate::health::services::run(
            checks_rx,
            proxy_health,
            metrics.health_check_listen_errors.clone(),
        ));
        if let Some(forward) = bpf_logs {
            tokio::spawn(forward);
        }

        let (tx, events) = mpsc::channel(64);
        let (reload_tx, reload_rx) = mpsc::channel(1);
        match source {
            Source::File {
                path,
                context,
                follow,
            } => {
                tokio::spawn(source::file::run(path, context, tx, reload_rx, follow));
            }
            Source::Kubernetes { servers, watch } => {
                info!(node = %watch.node_name, apiservers = servers.len(), "following the apiserver");
                tokio::spawn(source::kubernetes::watch::run(servers, watch, tx));
            }
        }
        let router = Router {
            mailbox: mailbox.clone(),
            checks: checks_tx,
            reload: reload_tx,
            tracker: crate::health::services::Tracker::default(),
        };
        router.run(events, control).await;

        info!("stopping; the data path stays installed and keeps forwarding");
        // What a reconcile in progress wrote stays; the next start syncs
        // the rest.
        cancel.store(true, Ordering::Relaxed);
        mailbox.close();
        for flag in &stop_flags {
            flag.store(true, Ordering::Relaxed);
        }
        // The worker says so before it frees its state (`worker_stopped`);
        // waited for off the runtime's threads.
        let said =
            tokio::task::spawn_blocking(move || mailbox.wait_worker_stopped(WORKER_STOP_WAIT))
                .await
                .unwrap_or(false);
        let worker_stopped = said || worker.is_finished();
        if !worker_stopped {
            warn!("the reconcile worker is still writing; leaving it (the maps stay consistent per service)");
        }
        Ok(Stopped { worker_stopped })
    }
}
