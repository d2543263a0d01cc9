//! The agent process: from its flags to a running agent. Chooses the
//! source and the devices, installs the data path (root), restores the
//! reconciler from the pinned maps, starts every part (the reconcile
//! worker, the source, the metrics and health servers, the conntrack
//! collector, the pod-device watch) and on a stop signal lets go of them
//! without tearing the data path down.
use std::{
    path::PathBuf,
    sync::{atomic::AtomicBool, Arc},
    time::Duration,
};

use anyhow::Context as _;
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{signal, SignalKind},
    sync::mpsc,
};
use tracing::{info, warn};

use super::{
    assembly::{Agent, Endpoints, Source},
    flags::{ConntrackArgs, DatapathArgs, MapArgs, RunArgs, ServiceArgs, SourceArgs},
    plan::{self, DevicePlan, SourcePlan},
    router::Control,
    worker::Worker,
};
use crate::{
    datapath::{self, config::RuntimeConfig, DatapathConfig},
    health::NodeEligibility,
    maps::bpf::BpfMaps,
    metrics::Metrics,
    reconcile::Reconciler,
    source::{
        self,
        kubernetes::{
            api_traffic::{ApiTraffic, TallyLayer},
            watch::{ApiServer, WatchConfig},
        },
        nodeports::NodePortAddresses,
    },
    sys,
};

/// Every address of this node (of the agent's network namespace): the
/// external IPs that sockets may translate (CVE-2020-8554).
fn node_addresses() -> anyhow::Result<std::collections::BTreeSet<std::net::IpAddr>> {
    Ok(sys::netdev::all_addresses()?
        .into_iter()
        .map(|(_, a)| a)
        .collect())
}

/// Follows this node's addresses (`super::addresses`), or says loudly why
/// it cannot: NodePorts then stay on the addresses read at start.
fn follow_addresses() -> Option<tokio::sync::watch::Receiver<super::addresses::Addresses>> {
    match super::addresses::follow(node_addresses) {
        Ok(rx) => Some(rx),
        Err(e) => {
            warn!("{e:#}: NodePorts stay on the addresses read at start and do not follow changes");
            None
        }
    }
}

/// Standalone mode: the services file's context made again when the
/// node's addresses change (the devices' addresses, read afresh).
fn file_follow(args: &RunArgs, devices: &[String]) -> Option<crate::source::file::Follow> {
    let addresses = follow_addresses()?;
    let flags = args.source.nodeport_addresses.clone();
    let devices = devices.to_vec();
    let algorithm: crate::model::Algorithm = args.service.lb_algorithm.into();
    Some(crate::source::file::Follow {
        addresses,
        context: Box::new(move || source::file::node_context(&flags, &devices, algorithm)),
    })
}

/// Standalone mode: NodePorts listen on the devices' addresses (filtered
/// like kube-proxy's --nodeport-addresses).
fn file_context(
    args: &RunArgs,
    devices: &[String],
) -> anyhow::Result<crate::source::file::parse::FileContext> {
    source::file::node_context(
        &args.source.nodeport_addresses,
        devices,
        args.service.lb_algorithm.into(),
    )
}

enum Mode {
    File(PathBuf),
    Kubernetes(WatchConfig),
}

/// The source the plan names, with what it needs from the node (its
/// addresses, for the NodePorts).
fn mode(
    plan: SourcePlan,
    args: &RunArgs,
    node_eligibility: &Arc<NodeEligibility>,
) -> anyhow::Result<Mode> {
    Ok(match plan {
        SourcePlan::File(path) => Mode::File(path),
        SourcePlan::Kubernetes { node_name } => {
            let local_addresses = follow_addresses();
            let local = match &local_addresses {
                Some(rx) => rx.borrow().clone(),
                None => node_addresses()?,
            };
            Mode::Kubernetes(WatchConfig {
                node_name,
                nodeports: NodePortAddresses::from_flags(
                    &args.source.nodeport_addresses,
                    local.into_iter().collect(),
                ),
                local_addresses,
                debounce: args.source.min_sync_period,
                node_eligibility: node_eligibility.clone(),
                default_algorithm: args.service.lb_algorithm.into(),
                changes: Default::default(),
            })
        }
    })
}

/// The devices the plan names, detected where it says so. None at all is
/// said loudly: traffic from outside the node to NodePorts, LoadBalancer
/// and external IPs is then not served.
fn external_devices(
    plan: DevicePlan,
    mode: &Mode,
    client: Option<&kube::Client>,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<Vec<String>> {
    match plan {
        DevicePlan::None => return Ok(Vec::new()),
        DevicePlan::Given(devices) => return Ok(devices),
        DevicePlan::Detect => {}
    }
    let internal = match (mode, client) {
        (Mode::Kubernetes(cfg), Some(client)) => {
            rt.block_on(node_internal_ips(client, &cfg.node_name))
        }
        _ => Vec::new(),
    };
    let found = sys::netdev::detect_external_devices(&internal)?;
    if found.is_empty() {
        warn!(
            "no external devices: no default route and no device holds the Node's InternalIP ({internal:?}); NodePort, LoadBalancer and external-IP traffic from outside this node is not served (set --devices / LB_DEVICES)"
        );
    } else {
        info!(devices = ?found, "external devices detected (default routes, InternalIP); --devices to choose");
    }
    Ok(found)
}

/// The Node's InternalIP addresses, read once (5 s at most: the agent
/// starts without them when the apiserver is unreachable).
async fn node_internal_ips(client: &kube::Client, node: &str) -> Vec<std::net::IpAddr> {
    let api = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client.clone());
    match tokio::time::timeout(Duration::from_secs(5), api.get(node)).await {
        Ok(Ok(n)) => n
            .status
            .and_then(|s| s.addresses)
            .into_iter()
            .flatten()
            .filter(|a| a.type_ == "InternalIP")
            .filter_map(|a| a.address.parse().ok())
            .collect(),
        Ok(Err(e)) => {
            warn!("reading Node {node} to find its devices: {e}; using the default-route devices");
            Vec::new()
        }
        Err(_) => {
            warn!("reading Node {node} to find its devices timed out; using the default-route devices");
            Vec::new()
        }
    }
}

/// A client for each apiserver of `--k8s-api-server` (one with the
/// kubeconfig's or in-cluster address when none is given), with the
/// credentials of `--kubeconfig` or the pod's.
async fn kube_clients(
    args: &SourceArgs,
    traffic: &ApiTraffic,
) -> anyhow::Result<Vec<source::kubernetes::watch::ApiServer>> {
    let servers = plan::apiserver_urls(&args.k8s_api_server);
    let config = if let Some(path) = &args.kubeconfig {
        let kubeconfig = kube::config::Kubeconfig::read_from(path)
            .with_context(|| format!("reading {}", path.display()))?;
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
    } else {
        match kube::Config::infer().await {
            Ok(c) => c,
            // No credentials anywhere: an explicit server (a test apiserver, an
            // open local port) is still usable.
            Err(e) => match servers.first() {
                Some(url) => kube::Config::new(url.parse().with_context(|| format!("--k8s-api-server {url}"))?),
                None => return Err(e).context("no Kubernetes credentials found (in-cluster, $KUBECONFIG, ~/.kube/config); pass --kubeconfig"),
            },
        }
    };
    let mut config = config;
    // kube's default retry layer retries 503s for minutes, silently; the
    // watchers' own backoff retries too, and reports every failure (counted
    // in lb_source_errors_total), so an outage is visible at once.
    config.default_retry = false;
    let urls = if servers.is_empty() {
        vec![config.cluster_url.to_string()]
    } else {
        servers
    };
    let mut out = Vec::new();
    for url in urls {
        let mut c = config.clone();
        c.cluster_url = url
            .parse()
            .with_context(|| format!("--k8s-api-server {url}"))?;
        info!(server = %c.cluster_url, "apiserver");
        out.push(source::kubernetes::watch::ApiServer {
            url,
            client: kube::client::ClientBuilder::try_from(c)?
                .with_layer(&TallyLayer(traffic.clone()))
                .build(),
        });
    }
    Ok(out)
}

/// Runs the agent until SIGTERM or SIGINT; never returns on success (the
/// process exits without dropping its state, `exit_without_teardown`).
/// The phases, in order: choose (source, settings, devices; nothing changes
/// yet), install the data path, restore the reconciler from the pinned
/// maps, start the background parts and the worker, serve until stopped,
/// let go.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    // Decided from the flags alone (agent::plan): a bad flag changes nothing.
    let source_plan = SourcePlan::from_flags(&args.source)?;
    let device_plan = DevicePlan::from_flags(&args.datapath.devices, &source_plan)?;
    let (pod_devices, pods_unserved) = plan::pod_devices(&args.datapath, &source_plan);
    if pods_unserved {
        warn!("--socket-lb-host-namespace-only without --pod-devices: pods' own sockets are not translated and nothing translates their packets either; pods will not reach services");
    }
    let node_eligibility = Arc::new(NodeEligibility::default());
    let mode = mode(source_plan, &args, &node_eligibility)?;
    // Checked before anything is installed: a bad flag changes nothing.
    let settings = args.start_settings(sys::fs::own_netns_cookie()?)?;
    // And so is a missing capability: refused whole, not half installed.
    super::privileges::check()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let api_traffic = ApiTraffic::default();
    let (servers, client) = rt.block_on(connect(&args, &mode, &api_traffic))?;
    let devices = external_devices(device_plan, &mode, client.as_ref(), &rt)?;
    let cfg = datapath_config(&args.datapath, &args.maps, pod_devices, devices.clone())?;
    let report = install(&args, &mode, &cfg, &settings, &devices)?;

    let cancel = Arc::new(AtomicBool::new(false));
    let external_ips =
        crate::desired::ExternalIpsInCluster::from(args.service.external_ips_in_cluster);
    let reconciler = restore(&args.service, &cfg, external_ips, cancel.clone())?;
    let (metrics, mut registry) = Metrics::new(cfg.pin_dir.clone());
    if let Mode::Kubernetes(watch) = &mode {
        api_traffic.register(registry.sub_registry_with_prefix("lb"));
        watch.changes.register(&mut registry);
    }
    metrics.health.lock().unwrap().installed = true;
    let background = Background::start(&args.conntrack, &cfg, &metrics)?;
    let udp_scans = Arc::new(crate::agent::worker::UdpScans::default());
    let worker = worker(&cfg, reconciler, &metrics, external_ips, udp_scans.clone());
    let source = match mode {
        // The follower first: a change after the context is read is heard.
        Mode::File(path) => Source::File {
            follow: file_follow(&args, &devices),
            context: file_context(&args, &devices)?,
            path,
        },
        Mode::Kubernetes(watch) => Source::Kubernetes { servers, watch },
    };
    let endpoints = Endpoints {
        metrics: args.servers.metrics_address,
        healthz: args.servers.healthz_address.0,
        healthz_grace: args.servers.healthz_grace,
    };
    let mut agent = Agent::new(
        worker,
        cancel,
        source,
        endpoints,
        (metrics, registry),
        node_eligibility,
    );
    if let Some(logger) = report.logger {
        agent = agent.with_bpf_logs(Box::pin(forward_bpf_logs(logger)));
    }
    // Stopped with the worker, before it is waited for.
    agent = agent.with_stop_flag(background.gc_stop.clone());
    let outcome = rt.block_on(async {
        let control = signals()?;
        agent.run(control).await.map(|_| ())
    });
    // Sockets still pinned to removed backends: the list is not kept
    // anywhere, so a scan cut short stays undone after a restart.
    if !udp_scans.wait_idle(Duration::from_millis(500)) {
        warn!("stopping during a scan for connected UDP sockets to removed backends: some may stay connected to them");
    }
    background.join_if_finished();
    exit_without_teardown(outcome)
}

/// In Kubernetes mode, a client for every apiserver, made first: the
/// Node's InternalIP helps choose the devices before anything is attached;
/// and the client of the first that answers, to read the Node from.
async fn connect(
    args: &RunArgs,
    mode: &Mode,
    traffic: &ApiTraffic,
) -> anyhow::Result<(Vec<ApiServer>, Option<kube::Client>)> {
    let servers = match mode {
        Mode::Kubernetes(_) => kube_clients(&args.source, traffic).await?,
        Mode::File(_) => Vec::new(),
    };
    for s in &servers {
        let answered =
            tokio::time::timeout(Duration::from_secs(2), s.client.apiserver_version()).await;
        if answered.is_ok_and(|r| r.is_ok()) {
            let client = s.client.clone();
            return Ok((servers, Some(client)));
        }
    }
    let client = servers.first().map(|s| s.client.clone());
    Ok((servers, client))
}

/// Where and how the data path is installed.
fn datapath_config(
    args: &DatapathArgs,
    maps: &MapArgs,
    pod_devices: crate::datapath::pods::PodDevices,
    devices: Vec<String>,
) -> anyhow::Result<DatapathConfig> {
    let cgroup = match &args.cgroup {
        Some(c) => c.clone(),
        None => sys::fs::cgroup2_mount()?,
    };
    Ok(DatapathConfig {
        pin_dir: args.pin_dir.clone(),
        cgroup,
        sizes: maps.map_sizes(),
        devices,
        acceleration: args.acceleration,
        pod_devices,
    })
}

/// Installs (or takes over) the data path and writes the start settings.
fn install(
    args: &RunArgs,
    mode: &Mode,
    cfg: &DatapathConfig,
    settings: &super::settings::StartSettings,
    devices: &[String],
) -> anyhow::Result<datapath::InstallReport> {
    if let Mode::File(path) = mode {
        // "Keep the last good state" needs one: with nothing pinned, a
        // missing or invalid file is a mistake to stop at, not an empty
        // load balancer that looks like success.
        if !datapath::pins::has_state(&cfg.pin_dir) {
            source::file::load(path, &file_context(args, devices)?).with_context(|| {
                format!(
                    "no load-balancer state is pinned in {} to keep serving, so the agent stops; \
                     fix the services file and start again",
                    cfg.pin_dir.display()
                )
            })?;
        }
    }
    let report = datapath::install(cfg)?;
    info!(pin_dir = %cfg.pin_dir.display(), maps_reused = report.maps_reused, "data path installed");
    settings.write(&mut RuntimeConfig::open(&cfg.pin_dir)?)?;
    if args.datapath.socket_lb_host_namespace_only {
        info!(
            netns_cookie = settings.host_netns_cookie,
            "socket LB applies to the host network namespace only"
        );
    }
    Ok(report)
}

/// The reconciler over the pinned maps, with what they hold.
fn restore(
    args: &ServiceArgs,
    cfg: &DatapathConfig,
    external_ips: crate::desired::ExternalIpsInCluster,
    cancel: Arc<AtomicBool>,
) -> anyhow::Result<Reconciler<BpfMaps>> {
    info!(
        external_ips_in_cluster = ?external_ips,
        "external IPs for the node's sockets and pods"
    );
    let mut maps = BpfMaps::open(&cfg.pin_dir)?.with_service_stats(args.service_stats.is_on());
    // Frontends from before this agent (pins of a build without per-service
    // counters, or a crash between a frontend's two writes) get their
    // stats entry now; entries of no frontend go (all, with
    // --service-stats off). Counters never keep services from the maps.
    match maps.adopt_service_stats() {
        Ok((0, 0)) => {}
        Ok((made, deleted)) => {
            info!(
                made,
                deleted, "per-service counters adopted for the frontends in the maps"
            );
        }
        Err(e) => warn!(
            "{}: {e:#}; per-service counters may be missing until the next start",
            lb_common::maps::LB_SVC_STATS
        ),
    }
    let reconciler = Reconciler::restore(maps)?
        .with_config(crate::desired::BuildConfig {
            maglev_m: args.maglev_table_size,
            external_ips_in_cluster: external_ips,
            node_addresses: Arc::new(if external_ips.needs_node_addresses() {
                node_addresses()?
            } else {
                Default::default()
            }),
            maglev_seed: crate::desired::maglev::Seed::from_text(&args.maglev_hash_seed),
            service_stats: args.service_stats.is_on(),
        })
        .with_cancel(cancel)
        .with_progress_every(args.reconcile_progress_every);
    info!(
        entries = reconciler.state().services.len(),
        backends = reconciler.state().backends.len(),
        "restored state from pinned maps"
    );
    Ok(reconciler)
}

/// What runs beside the worker on threads of its own: the pod-device watch
/// and the conntrack collector.
struct Background {
    _pod_watch: Option<std::thread::JoinHandle<()>>,
    gc: Option<std::thread::JoinHandle<()>>,
    gc_stop: Arc<AtomicBool>,
}

impl Background {
    fn start(
        args: &ConntrackArgs,
        cfg: &DatapathConfig,
        metrics: &Metrics,
    ) -> anyhow::Result<Self> {
        let pod_watch = if cfg.pod_devices.is_none() {
            None
        } else {
            Some(datapath::pods::watch(
                cfg.pin_dir.clone(),
                cfg.pod_devices.clone(),
                cfg.devices.clone(),
                Arc::new(AtomicBool::new(false)),
            )?)
        };
        // Conntrack is only written by the tc programs.
        let gc_stop = Arc::new(AtomicBool::new(false));
        let gc = (!cfg.devices.is_empty() || pod_watch.is_some()).then(|| {
            crate::conntrack::gc::spawn(
                cfg.pin_dir.clone(),
                args.conntrack_gc_interval,
                metrics.conntrack_gc.clone(),
                gc_stop.clone(),
            )
        });
        Ok(Self {
            _pod_watch: pod_watch,
            gc,
            gc_stop,
        })
    }

    /// After the stop (`gc_stop` set with the agent's): joins the
    /// collector if it is done already; the process exits either way.
    fn join_if_finished(self) {
        if let Some(gc) = self.gc {
            if gc.is_finished() {
                let _ = gc.join();
            }
        }
    }
}

/// The reconcile worker over the pinned maps.
fn worker(
    cfg: &DatapathConfig,
    reconciler: Reconciler<BpfMaps>,
    metrics: &Metrics,
    external_ips: crate::desired::ExternalIpsInCluster,
    udp_scans: Arc<crate::agent::worker::UdpScans>,
) -> Worker<BpfMaps> {
    let seed = reconciler.config().maglev_seed.fingerprint().to_string();
    info!(fingerprint = %seed, "Maglev seed (the same on every node, or flows change backends between nodes)");
    metrics
        .maglev_seed
        .get_or_create(&crate::metrics::SeedLabels { fingerprint: seed })
        .set(1);
    let worker = Worker::new(
        reconciler,
        metrics.clone(),
        super::worker::terminate_stale_udp(cfg.pin_dir.clone(), metrics.clone(), udp_scans),
    )
    .with_status_file(super::status_file(&cfg.pin_dir));
    // Only `owned-only` depends on them: with `translate` nothing is read
    // every round.
    if !external_ips.needs_node_addresses() {
        return worker;
    }
    worker.with_node_addresses(Box::new(|| match node_addresses() {
        Ok(a) => Some(a),
        Err(e) => {
            // Keep what was known: an empty set would stop sockets from
            // reaching the node's own external IPs.
            warn!("reading this node's addresses: {e:#}");
            None
        }
    }))
}

/// Signals become control messages for the agent's loop: SIGHUP re-reads
/// the source, SIGTERM and SIGINT stop it.
fn signals() -> anyhow::Result<mpsc::Receiver<Control>> {
    let (control_tx, control) = mpsc::channel(4);
    let mut hup = signal(SignalKind::hangup())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        loop {
            let c = tokio::select! {
                _ = hup.recv() => Control::Reload,
                _ = term.recv() => Control::Stop,
                _ = int.recv() => Control::Stop,
            };
            if control_tx.send(c).await.is_err() || c == Control::Stop {
                return;
            }
        }
    });
    Ok(control)
}

/// Ends the process without dropping what the agent holds: the worker's
/// model and map mirror, the services file's cache and the runtime's tasks
/// (a socket scan) take longer to free at 100 000 services than a stop may
/// take (kubelet and systemd give a grace period, tests a second), and
/// nothing in them needs saving: the data path is pinned and keeps
/// forwarding, logs go to stderr unbuffered.
fn exit_without_teardown(outcome: anyhow::Result<()>) -> ! {
    let code = match outcome {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("Error: {e:?}");
            1
        }
    };
    let _ = std::io::Write::flush(&mut std::io::stdout());
    std::process::exit(code)
}

/// Forwards the programs' aya-log records to tracing (through the `log` crate).
async fn forward_bpf_logs(logger: aya_log::EbpfLogger<&'static dyn log::Log>) {
    // SAFETY: the logger owns the ring buffer's fd for its whole life and
    // always returns that same fd.
    let mut fd =
        match unsafe { AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE) } {
            Ok(fd) => fd,
            Err(e) => {
                warn!("cannot poll eBPF logs: {e}");
                return;
            }
        };
    loop {
        let Ok(mut guard) = fd.readable_mut().await else {
            return;
        };
        guard.get_inner_mut().flush();
        guard.clear_ready();
    }
}
