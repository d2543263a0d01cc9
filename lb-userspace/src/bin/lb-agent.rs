//! lb-agent: the node agent. Installs the data path, then keeps the maps in
//! line with a source: a services file (standalone mode) or the Kubernetes
//! apiserver. The data path stays when the agent stops.
use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::{bail, Context as _};
use clap::{Args, Parser, Subcommand};
use lb::{
    agent::{
        mailbox::Mailbox,
        router::{Control, Router},
        settings::{StartSettings, Timeouts},
        worker::Worker,
    },
    datapath::{self, config::RuntimeConfig, DatapathConfig, MapSizes},
    health::{proxy::ProxyHealth, NodeEligibility},
    maps::bpf::BpfMaps,
    metrics::{self, Metrics},
    net::Cidr,
    reconcile::Reconciler,
    source::{
        self,
        kubernetes::{
            api_traffic::{ApiTraffic, TallyLayer},
            watch::WatchConfig,
        },
        nodeports::{NodePortAddr, NodePortAddresses},
    },
    sys,
};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{signal, SignalKind},
    sync::mpsc,
};
use tracing::{error, info, warn};

#[derive(Parser)]
#[command(
    name = "lb-agent",
    version,
    about = "eBPF service load balancer: node agent"
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    /// Log lines as text (coloured only on a terminal, and never with
    /// NO_COLOR set) or as JSON objects for log shippers.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "LB_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Install the data path and follow the source (the default).
    Run(Box<RunArgs>),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion { shell: clap_complete::Shell },
    /// Detach every program and remove every pinned map and link.
    Uninstall {
        #[arg(long, default_value_os_t = datapath::pins::default_pin_dir(), env = "LB_PIN_DIR")]
        pin_dir: PathBuf,
    },
    /// Remove kube-proxy's leftovers from this node once kube-proxy is
    /// stopped: KUBE-* iptables chains (legacy and nft), its nftables
    /// tables, the kube-ipvs0 device, and conntrack entries of service addresses.
    CleanupKubeProxy {
        /// The cluster's service CIDRs (kube-apiserver --service-cluster-ip-range):
        /// conntrack entries DNATed to them are deleted.
        #[arg(long, value_delimiter = ',', value_name = "CIDR,...")]
        service_cidr: Vec<Cidr>,
        /// Only report what would be removed.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Args, Clone)]
struct RunArgs {
    /// Standalone mode: services from this YAML file.
    #[arg(long, value_name = "FILE", conflicts_with = "kubernetes")]
    services: Option<PathBuf>,
    /// Kubernetes mode: Services, EndpointSlices and this Node from the apiserver.
    #[arg(long, env = "LB_KUBERNETES")]
    kubernetes: bool,
    /// Apiserver address (host:port or URL), or several separated by
    /// commas: the watches use the first and move to the next when it stops
    /// answering (as Cilium's k8s.apiServerURLs). Needed without kube-proxy:
    /// a pod's KUBERNETES_SERVICE_HOST is a ClusterIP nobody translates yet.
    #[arg(
        long,
        value_name = "HOST:PORT,...",
        value_delimiter = ',',
        env = "LB_K8S_API_SERVER"
    )]
    k8s_api_server: Vec<String>,
    /// kubeconfig file [default: in-cluster credentials, then $KUBECONFIG / ~/.kube/config].
    #[arg(long, value_name = "FILE", env = "LB_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// This node's name (downward API: spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Node addresses that serve NodePorts: CIDRs, or `primary` for the
    /// node's InternalIP per family [default: every local address of the
    /// node, as kube-proxy].
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "CIDR,...|primary",
        env = "LB_NODEPORT_ADDRESSES"
    )]
    nodeport_addresses: Vec<NodePortAddr>,
    /// Gather Kubernetes changes this long before applying them.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration, env = "LB_MIN_SYNC_PERIOD")]
    min_sync_period: Duration,
    /// How often a long reconcile logs how far it got.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration, env = "LB_RECONCILE_PROGRESS_EVERY")]
    reconcile_progress_every: Duration,
    /// cgroup v2 directory to attach the socket hooks to [default: the cgroup2 root from /proc/mounts].
    #[arg(long, value_name = "DIR", env = "LB_CGROUP")]
    cgroup: Option<PathBuf>,
    /// Where maps and links are pinned (on bpffs).
    #[arg(long, value_name = "DIR", default_value_os_t = datapath::pins::default_pin_dir(), env = "LB_PIN_DIR")]
    pin_dir: PathBuf,
    /// Capacity of LB4/6_SERVICES (one entry per frontend plus one per backend slot) and LB4/6_REVNAT.
    #[arg(long, default_value_t = MapSizes::default().services, env = "LB_MAP_SIZE_SERVICES")]
    map_size_services: u32,
    /// Capacity of LB4/6_BACKENDS.
    #[arg(long, default_value_t = MapSizes::default().backends, env = "LB_MAP_SIZE_BACKENDS")]
    map_size_backends: u32,
    /// Capacity of LB4/6_SOCK_REVNAT (sockets with a translated peer); LB_SOCK_TCP (translated TCP sockets by cookie) gets a quarter, rounded up to a power of two.
    #[arg(long, default_value_t = MapSizes::default().sock_revnat, env = "LB_MAP_SIZE_SOCK_REVNAT")]
    map_size_sock_revnat: u32,
    /// Translate only sockets of the host network namespace; pods keep the
    /// original service address (for service meshes), like Cilium's
    /// socketLB.hostNamespaceOnly.
    #[arg(long, env = "LB_SOCKET_LB_HOST_NAMESPACE_ONLY")]
    socket_lb_host_namespace_only: bool,
    /// External devices: tc (and XDP) programs serve NodePort, LoadBalancer
    /// and external-IP traffic arriving there; their addresses serve NodePorts.
    /// `auto`: the devices of the default routes and of the Node's
    /// InternalIP (as Cilium detects them); `none` for none.
    /// [default: auto in Kubernetes mode, none standalone]
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "DEV,...",
        env = "LB_DEVICES"
    )]
    devices: Vec<String>,
    /// Pod-facing devices (the host ends of pods' veths): pods' packets to
    /// ClusterIPs and every other frontend are translated there, for pods
    /// whose sockets socket LB leaves alone. Names or prefixes ending in *
    /// (veth*, cali*, lxc*), `auto` (every veth that is not in --devices),
    /// or `none`. [default: auto with --socket-lb-host-namespace-only in
    /// Kubernetes mode, else none]
    #[arg(long, value_name = "DEV,...|auto|none", env = "LB_POD_DEVICES")]
    pod_devices: Option<datapath::pods::PodDevices>,
    /// How traffic to a backend on another node is forwarded.
    #[arg(long, value_enum, default_value_t = LbMode::Snat, env = "LB_MODE")]
    lb_mode: LbMode,
    /// Backend selection of services that do not choose one (the
    /// `algorithm` field of the services file, the lb.dev/algorithm
    /// annotation in Kubernetes): random, or maglev (consistent hashing: a
    /// flow keeps its backend on every node and across backend changes).
    #[arg(long, value_enum, default_value_t = AlgorithmArg::Random, env = "LB_ALGORITHM")]
    lb_algorithm: AlgorithmArg,
    /// XDP acceleration on the devices.
    #[arg(long, value_enum, default_value_t = datapath::Acceleration::Disabled, env = "LB_ACCELERATION")]
    acceleration: datapath::Acceleration,
    /// Size M of the Maglev tables of services that do not ask for their
    /// own (`maglevTableSize` in the services file, the
    /// lb.dev/maglev-table-size annotation), a prime (251, 509, 1021, 2039,
    /// 4093, 8191, 16381, 32749, 65521, 65537, 131071). A table costs 4·M
    /// bytes; a bigger M moves fewer flows when a backend goes
    /// (docs/benchmarks.md, section 4). A change applies service by service
    /// at the next sync.
    #[arg(long, default_value_t = lb_common::maps::DEFAULT_MAGLEV_M, env = "LB_MAGLEV_TABLE_SIZE")]
    maglev_table_size: u32,
    /// Source ports for SNAT to remote backends. A client's own port is kept
    /// when it lies in the range (as Linux NAT and Cilium do), which keeps
    /// busy clients clear of their backends' TIME_WAIT; keep the range clear
    /// of the NodePort range.
    #[arg(long, default_value = "32768-65535", env = "LB_SNAT_PORT_RANGE")]
    snat_port_range: PortRange,
    /// Conntrack lifetime of an established TCP flow without traffic.
    #[arg(long, default_value = "6h", value_parser = humantime::parse_duration, env = "LB_CT_TIMEOUT_TCP")]
    conntrack_timeout_tcp: Duration,
    /// Conntrack lifetime of a TCP flow whose handshake did not complete.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration, env = "LB_CT_TIMEOUT_TCP_SYN")]
    conntrack_timeout_tcp_syn: Duration,
    /// Conntrack lifetime of a TCP flow after a FIN or RST.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, env = "LB_CT_TIMEOUT_TCP_FIN")]
    conntrack_timeout_tcp_fin: Duration,
    /// Conntrack lifetime of a UDP flow without traffic.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration, env = "LB_CT_TIMEOUT_UDP")]
    conntrack_timeout_udp: Duration,
    /// Sweep expired conntrack entries at this interval [default: adaptive,
    /// 10 s to 10 min by how much each sweep finds].
    #[arg(long, value_parser = humantime::parse_duration, env = "LB_CT_GC_INTERVAL")]
    conntrack_gc_interval: Option<Duration>,
    /// Capacity of LB4_CT and of LB6_CT (north-south conntrack; one or two entries per flow).
    #[arg(long, default_value_t = MapSizes::default().ct, env = "LB_MAP_SIZE_CT")]
    map_size_ct: u32,
    /// Capacity of LB_MAGLEV (services using Maglev at once).
    #[arg(long, default_value_t = MapSizes::default().maglev, env = "LB_MAP_SIZE_MAGLEV")]
    map_size_maglev: u32,
    /// Capacity of LB4_SRC_RANGES and of LB6_SRC_RANGES, each
    /// (loadBalancerSourceRanges networks of all LoadBalancer frontends
    /// together, per family).
    #[arg(long, default_value_t = MapSizes::default().source_ranges, env = "LB_MAP_SIZE_SOURCE_RANGES")]
    map_size_source_ranges: u32,
    /// Capacity of LB_AFFINITY (remembered client → backend choices for sessionAffinity).
    #[arg(long, default_value_t = MapSizes::default().affinity, env = "LB_MAP_SIZE_AFFINITY")]
    map_size_affinity: u32,
    /// Make the services, backends and reverse-NAT maps preallocated, like
    /// Cilium's --preallocate-bpf-maps: their whole capacity is reserved at
    /// once (about 36 MiB at the default sizes) and a full sync's inserts
    /// cost the kernel about half as much. Chosen when the maps are first
    /// made; a restart must keep it (an uninstall starts over).
    #[arg(long, env = "LB_PREALLOCATE_MAPS")]
    preallocate_maps: bool,
    /// Address of /metrics and /healthz. Loopback unless you choose otherwise.
    #[arg(long, default_value = "127.0.0.1:9967", env = "LB_METRICS_ADDRESS")]
    metrics_address: SocketAddr,
    /// The proxy health server (/healthz, /livez), kube-proxy's
    /// --healthz-bind-address: what cloud load balancers and probes ask. 'off' disables it.
    #[arg(long, default_value = "0.0.0.0:10256", value_parser = parse_optional_addr, env = "LB_HEALTHZ_ADDRESS")]
    healthz_address: OptionalAddr,
    /// /healthz turns unhealthy when an observed change is not in the maps after this long.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    healthz_grace: Duration,
    /// What the node's own sockets and pods get for a Service's external
    /// IPs: `translate` (kube-proxy's semantics, the default: every external
    /// IP leads to the Service, wherever it is routed) or `owned-only` (only
    /// the addresses this node holds; any other stays the real address it
    /// names, as Cilium does against CVE-2020-8554). Traffic from outside the
    /// node is served either way. docs/security.md weighs the two.
    #[arg(long, value_enum, default_value_t = ExternalIpsArg::Translate, env = "LB_EXTERNAL_IPS_IN_CLUSTER")]
    external_ips_in_cluster: ExternalIpsArg,
    /// Log level of the eBPF programs (off, error, warn, info, debug, trace); debug covers hot paths.
    #[arg(long, default_value = "warn", env = "LB_BPF_LOG_LEVEL")]
    bpf_log_level: String,
    /// Drop/trace events per second per CPU before rate limiting.
    #[arg(long, default_value_t = lb_common::config::DEFAULT_EVENT_RATE)]
    event_rate: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum AlgorithmArg {
    Random,
    Maglev,
}

impl From<AlgorithmArg> for lb::model::Algorithm {
    fn from(a: AlgorithmArg) -> Self {
        match a {
            AlgorithmArg::Random => Self::Random,
            AlgorithmArg::Maglev => Self::Maglev,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ExternalIpsArg {
    Translate,
    OwnedOnly,
}

impl From<ExternalIpsArg> for lb::desired::ExternalIpsInCluster {
    fn from(a: ExternalIpsArg) -> Self {
        match a {
            ExternalIpsArg::Translate => Self::Translate,
            ExternalIpsArg::OwnedOnly => Self::OwnedOnly,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn init_logging(format: LogFormat) {
    use std::io::IsTerminal as _;
    // Records from the eBPF programs (target lb_ebpf::...) are filtered at the
    // source by --bpf-log-level / `lbctl config set bpf-log-level`; let all of
    // them through here unless LB_LOG says otherwise.
    let mut filter = std::env::var("LB_LOG").unwrap_or_else(|_| "info".into());
    if !filter.contains("lb_ebpf") {
        filter.push_str(",lb_ebpf=trace");
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => {
            // Colour codes only for a person at a terminal (https://no-color.org).
            let colour = std::io::stderr().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
            builder.with_ansi(colour).init();
        }
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Some(Command::CleanupKubeProxy {
            service_cidr,
            dry_run,
        }) => {
            let r = lb::migrate::cleanup(&service_cidr, dry_run)?;
            let verb = if dry_run { "would remove" } else { "removed" };
            for line in &r.iptables {
                println!("{verb} iptables: {line}");
            }
            for t in &r.nftables_tables {
                println!("{verb} nftables table {t}");
            }
            if r.ipvs_device {
                println!("{verb} the kube-ipvs0 device");
            }
            for c in &r.conntrack {
                println!("{verb} conntrack entries to {c}");
            }
            for s in &r.skipped {
                println!("skipped {s}");
            }
            if r.iptables.is_empty() && r.nftables_tables.is_empty() && !r.ipvs_device {
                println!("no kube-proxy rules or devices found");
            }
            Ok(())
        }
        Some(Command::Uninstall { pin_dir }) => {
            let report = datapath::uninstall(&pin_dir)?;
            println!(
                "removed links [{}] and maps [{}] from {}",
                report.links.join(", "),
                report.maps.join(", "),
                pin_dir.display()
            );
            Ok(())
        }
        Some(Command::Completion { shell }) => {
            use clap::CommandFactory as _;
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "lb-agent",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Some(Command::Run(args)) => run(*args),
        None => run(cli.run),
    }
}

/// Every address of this node (of the agent's network namespace): the
/// external IPs that sockets may translate (CVE-2020-8554).
fn node_addresses() -> anyhow::Result<std::collections::BTreeSet<std::net::IpAddr>> {
    Ok(sys::netdev::all_addresses()?
        .into_iter()
        .map(|(_, a)| a)
        .collect())
}

/// Standalone mode: NodePorts listen on the devices' addresses (filtered
/// like kube-proxy's --nodeport-addresses).
fn file_context(
    args: &RunArgs,
    devices: &[String],
) -> anyhow::Result<lb::source::file::parse::FileContext> {
    source::file::node_context(&args.nodeport_addresses, devices, args.lb_algorithm.into())
}

enum Mode {
    File(PathBuf),
    Kubernetes(WatchConfig),
}

fn mode(args: &RunArgs, node_eligibility: &Arc<NodeEligibility>) -> anyhow::Result<Mode> {
    match (&args.services, args.kubernetes) {
        (Some(path), false) => Ok(Mode::File(path.clone())),
        (None, true) => {
            let node_name = args.node_name.clone().context(
                "Kubernetes mode needs this node's name: --node-name or NODE_NAME (downward API spec.nodeName)",
            )?;
            NodePortAddresses::check_flags(&args.nodeport_addresses).map_err(anyhow::Error::msg)?;
            Ok(Mode::Kubernetes(WatchConfig {
                node_name,
                nodeports: NodePortAddresses::from_flags(
                    &args.nodeport_addresses,
                    sys::netdev::all_addresses()?
                        .into_iter()
                        .map(|(_, a)| a)
                        .collect(),
                ),
                debounce: args.min_sync_period,
                node_eligibility: node_eligibility.clone(),
                default_algorithm: args.lb_algorithm.into(),
            }))
        }
        _ => bail!("choose a source: --services FILE (standalone) or --kubernetes"),
    }
}

/// --devices, or in Kubernetes mode when unset the detected ones. None at
/// all is said loudly: traffic from outside the node to NodePorts,
/// LoadBalancer and external IPs is then not served.
fn external_devices(
    args: &RunArgs,
    mode: &Mode,
    client: Option<&kube::Client>,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<Vec<String>> {
    let given: Vec<String> = args
        .devices
        .iter()
        .filter(|d| !d.is_empty())
        .cloned()
        .collect();
    let special = given.iter().find(|d| *d == "none" || *d == "auto");
    if let Some(word) = special {
        if given.len() > 1 {
            bail!(
                "--devices: '{word}' cannot be listed with devices ({})",
                given.join(",")
            );
        }
    }
    let auto = match special.map(String::as_str) {
        Some("none") => return Ok(Vec::new()),
        Some(_) => true,
        None if given.is_empty() => matches!(mode, Mode::Kubernetes(_)),
        None => return Ok(given),
    };
    if !auto {
        return Ok(Vec::new());
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
    args: &RunArgs,
    traffic: &ApiTraffic,
) -> anyhow::Result<Vec<source::kubernetes::watch::ApiServer>> {
    let servers: Vec<String> = args
        .k8s_api_server
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(|s| {
            if s.contains("://") {
                s.to_string()
            } else {
                format!("https://{s}")
            }
        })
        .collect();
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LbMode {
    /// SNAT to this node's address; replies come back through this node.
    Snat,
    /// Direct server return: the client's address is kept, replies go straight back.
    Dsr,
    /// DSR for TCP, SNAT for UDP.
    Hybrid,
}

/// A listen address, or none ('off').
#[derive(Clone, Copy, Debug)]
struct OptionalAddr(Option<SocketAddr>);

fn parse_optional_addr(s: &str) -> Result<OptionalAddr, String> {
    if s == "off" {
        return Ok(OptionalAddr(None));
    }
    s.parse()
        .map(|a| OptionalAddr(Some(a)))
        .map_err(|e| format!("{s}: {e}; write ADDRESS:PORT (e.g. 0.0.0.0:10256) or off"))
}

#[derive(Clone, Copy, Debug)]
struct PortRange(u16, u16);

impl std::str::FromStr for PortRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, b) = s
            .split_once('-')
            .ok_or("write the range as MIN-MAX, e.g. 61000-65535")?;
        let (a, b): (u16, u16) = (
            a.parse().map_err(|_| "not a port")?,
            b.parse().map_err(|_| "not a port")?,
        );
        if a == 0 || b < a {
            return Err(format!(
                "{a}-{b}: the range must be non-empty and start above 0"
            ));
        }
        Ok(PortRange(a, b))
    }
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let node_eligibility = Arc::new(NodeEligibility::default());
    let mode = mode(&args, &node_eligibility)?;
    if !lb::desired::maglev::valid_size(args.maglev_table_size) {
        bail!(
            "--maglev-table-size {} is not one of the supported primes: {:?}",
            args.maglev_table_size,
            lb_common::maps::MAGLEV_PRIMES
        );
    }
    let log_level = datapath::config::parse_value(
        datapath::config::setting("bpf-log-level")?,
        &args.bpf_log_level,
    )
    .context("--bpf-log-level")?;
    let settings = StartSettings {
        log_level,
        event_rate: args.event_rate,
        host_netns_cookie: sys::fs::own_netns_cookie()?,
        host_namespace_only: args.socket_lb_host_namespace_only,
        lb_mode: match args.lb_mode {
            LbMode::Snat => lb_common::nodeport::MODE_SNAT,
            LbMode::Dsr => lb_common::nodeport::MODE_DSR,
            LbMode::Hybrid => lb_common::nodeport::MODE_HYBRID,
        },
        maglev_m: args.maglev_table_size,
        snat_ports: (args.snat_port_range.0, args.snat_port_range.1),
        conntrack: Timeouts {
            tcp: args.conntrack_timeout_tcp,
            tcp_syn: args.conntrack_timeout_tcp_syn,
            tcp_fin: args.conntrack_timeout_tcp_fin,
            udp: args.conntrack_timeout_udp,
        },
    };
    // Before anything is installed: a bad flag changes nothing.
    settings.check()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // In Kubernetes mode the client is made first: the Node's InternalIP
    // helps choose the devices before anything is attached.
    let api_traffic = ApiTraffic::default();
    let servers = match &mode {
        Mode::Kubernetes(_) => rt.block_on(kube_clients(&args, &api_traffic))?,
        Mode::File(_) => Vec::new(),
    };
    // The Node is read from the first apiserver that answers.
    let client = rt.block_on(async {
        for s in &servers {
            let answered =
                tokio::time::timeout(Duration::from_secs(2), s.client.apiserver_version()).await;
            if answered.is_ok_and(|r| r.is_ok()) {
                return Some(s.client.clone());
            }
        }
        servers.first().map(|s| s.client.clone())
    });
    let devices = external_devices(&args, &mode, client.as_ref(), &rt)?;
    let cgroup = match &args.cgroup {
        Some(c) => c.clone(),
        None => sys::fs::cgroup2_mount()?,
    };
    let cfg = DatapathConfig {
        pin_dir: args.pin_dir.clone(),
        cgroup,
        sizes: MapSizes {
            services: args.map_size_services,
            backends: args.map_size_backends,
            revnat: args.map_size_services,
            sock_revnat: args.map_size_sock_revnat,
            affinity: args.map_size_affinity,
            ct: args.map_size_ct,
            maglev: args.map_size_maglev,
            source_ranges: args.map_size_source_ranges,
            preallocate: args.preallocate_maps,
        },
        devices: devices.clone(),
        acceleration: args.acceleration,
        pod_devices: match (&args.pod_devices, &mode) {
            (Some(p), _) => p.clone(),
            (None, Mode::Kubernetes(_)) if args.socket_lb_host_namespace_only => {
                datapath::pods::PodDevices::Auto
            }
            (None, _) => datapath::pods::PodDevices::None,
        },
    };
    if args.socket_lb_host_namespace_only && cfg.pod_devices.is_none() {
        warn!("--socket-lb-host-namespace-only without --pod-devices: pods' own sockets are not translated and nothing translates their packets either; pods will not reach services");
    }
    if let Mode::File(path) = &mode {
        // "Keep the last good state" needs one: with nothing pinned, a
        // missing or invalid file is a mistake to stop at, not an empty
        // load balancer that looks like success.
        if !datapath::pins::has_state(&cfg.pin_dir) {
            source::file::load(path, &file_context(&args, &devices)?).with_context(|| {
                format!(
                    "no load-balancer state is pinned in {} to keep serving, so the agent stops; \
                     fix the services file and start again",
                    cfg.pin_dir.display()
                )
            })?;
        }
    }
    let report = datapath::install(&cfg)?;
    info!(pin_dir = %cfg.pin_dir.display(), maps_reused = report.maps_reused, "data path installed");
    settings.write(&mut RuntimeConfig::open(&cfg.pin_dir)?)?;
    if args.socket_lb_host_namespace_only {
        info!(
            netns_cookie = settings.host_netns_cookie,
            "socket LB applies to the host network namespace only"
        );
    }

    let external_ips = lb::desired::ExternalIpsInCluster::from(args.external_ips_in_cluster);
    info!(
        external_ips_in_cluster = ?external_ips,
        "external IPs for the node's sockets and pods"
    );
    let maps = BpfMaps::open(&cfg.pin_dir)?;
    let cancel = Arc::new(AtomicBool::new(false));
    let reconciler = Reconciler::restore(maps)?
        .with_config(lb::desired::BuildConfig {
            maglev_m: args.maglev_table_size,
            external_ips_in_cluster: external_ips,
            node_addresses: Arc::new(if external_ips.needs_node_addresses() {
                node_addresses()?
            } else {
                Default::default()
            }),
        })
        .with_cancel(cancel.clone())
        .with_progress_every(args.reconcile_progress_every);
    info!(
        entries = reconciler.state().services.len(),
        backends = reconciler.state().backends.len(),
        "restored state from pinned maps"
    );

    let (metrics, mut registry) = Metrics::new(cfg.pin_dir.clone());
    if matches!(mode, Mode::Kubernetes(_)) {
        api_traffic.register(&mut registry);
    }
    metrics.health.lock().unwrap().installed = true;
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
        lb::conntrack::gc::spawn(
            cfg.pin_dir.clone(),
            args.conntrack_gc_interval,
            metrics.conntrack_gc.clone(),
            gc_stop.clone(),
        )
    });

    // The reconciler runs on a thread of its own, fed through a mailbox that
    // never makes a source wait (lb::agent).
    let mailbox = Arc::new(Mailbox::default());
    let udp_scans = Arc::new(lb::agent::worker::UdpScans::default());
    let worker = Worker {
        reconciler,
        metrics: metrics.clone(),
        on_removed_udp: lb::agent::worker::terminate_stale_udp(
            args.pin_dir.clone(),
            metrics.clone(),
            udp_scans.clone(),
        ),
        status_file: Some(lb::agent::status_file(&cfg.pin_dir)),
        retry_every: lb::agent::worker::RETRY_EVERY,
        unprogrammed: Vec::new(),
        // Only `owned-only` depends on them: with `translate` nothing is
        // read every round.
        node_addresses: external_ips.needs_node_addresses().then(|| {
            Box::new(|| match node_addresses() {
                Ok(a) => Some(a),
                Err(e) => {
                    // Keep what was known: an empty set would stop sockets
                    // from reaching the node's own external IPs.
                    warn!("reading this node's addresses: {e:#}");
                    None
                }
            }) as Box<dyn FnMut() -> _ + Send>
        }),
    }
    .spawn(mailbox.clone());

    let outcome = rt.block_on(async {
        let health = metrics.health.clone();
        let (addr, grace) = (args.metrics_address, args.healthz_grace);
        tokio::spawn(async move {
            if let Err(e) = metrics::server::serve(addr, registry, health, grace).await {
                error!("{e:#}");
            }
        });
        let proxy_health = ProxyHealth {
            health: metrics.health.clone(),
            node: node_eligibility.clone(),
            grace: args.healthz_grace,
        };
        if let Some(addr) = args.healthz_address.0 {
            let state = proxy_health.clone();
            tokio::spawn(async move {
                if let Err(e) = lb::health::proxy::serve(addr, state).await {
                    error!("{e:#}");
                }
            });
        }
        let (checks_tx, checks_rx) = tokio::sync::watch::channel(Default::default());
        tokio::spawn(lb::health::services::run(
            checks_rx,
            proxy_health,
            metrics.health_check_listen_errors.clone(),
        ));
        if let Some(logger) = report.logger {
            tokio::spawn(forward_bpf_logs(logger));
        }

        let (tx, events) = mpsc::channel(64);
        let (reload_tx, reload_rx) = mpsc::channel(1);
        match mode {
            Mode::File(path) => {
                let ctx = file_context(&args, &devices)?;
                tokio::spawn(source::file::run(path, ctx, tx, reload_rx));
            }
            Mode::Kubernetes(watch_cfg) => {
                info!(node = %watch_cfg.node_name, apiservers = servers.len(), "following the apiserver");
                tokio::spawn(source::kubernetes::watch::run(servers, watch_cfg, tx));
            }
        }

        // Signals become control messages for the loop (lb::agent::router).
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
        let router = Router {
            mailbox: mailbox.clone(),
            checks: checks_tx,
            reload: reload_tx,
            tracker: lb::health::services::Tracker::default(),
        };
        router.run(events, control).await;
        anyhow::Ok(())
    });
    info!("stopping; the data path stays installed and keeps forwarding");
    // A reconcile in progress stops at the next service; what it wrote
    // stays, the next start syncs the rest.
    cancel.store(true, Ordering::Relaxed);
    mailbox.close();
    gc_stop.store(true, Ordering::Relaxed);
    // The worker says so before it frees its state (`worker_stopped`).
    if !mailbox.wait_worker_stopped(Duration::from_millis(800)) && !worker.is_finished() {
        warn!("the reconcile worker is still writing; leaving it (the maps stay consistent per service)");
    }
    // Sockets still pinned to removed backends: the list is not kept
    // anywhere, so a scan cut short stays undone after a restart.
    if !udp_scans.wait_idle(Duration::from_millis(500)) {
        warn!("stopping during a scan for connected UDP sockets to removed backends: some may stay connected to them");
    }
    if let Some(gc) = gc {
        if gc.is_finished() {
            let _ = gc.join();
        }
    }
    exit_without_teardown(outcome)
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
