//! The agent's flags (`lb-agent run`), each with its environment variable
//! where the Helm chart sets it, and the values they parse into. The
//! binary only parses them; `process` turns them into each part's config.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context as _;
use clap::Args;

use super::settings::{StartSettings, Timeouts};
use crate::{
    datapath::{self, MapSizes},
    source::nodeports::NodePortAddr,
};

/// `lb-agent run`: the flags, in one section per part of the agent (each
/// part takes only its own section).
#[derive(Args, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub service: ServiceArgs,
    #[command(flatten)]
    pub datapath: DatapathArgs,
    #[command(flatten)]
    pub conntrack: ConntrackArgs,
    #[command(flatten)]
    pub maps: MapArgs,
    #[command(flatten)]
    pub servers: ServerArgs,
}

/// Where the services come from (a file or the apiserver) and which node
/// addresses serve NodePorts: the source's part.
#[derive(Args, Clone)]
#[command(next_help_heading = "Where services come from")]
pub struct SourceArgs {
    /// Standalone mode: services from this YAML file.
    #[arg(long, value_name = "FILE", conflicts_with = "kubernetes")]
    pub services: Option<PathBuf>,
    /// Kubernetes mode: Services, EndpointSlices and this Node from the apiserver.
    #[arg(long, env = "LB_KUBERNETES")]
    pub kubernetes: bool,
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
    pub k8s_api_server: Vec<String>,
    /// kubeconfig file [default: in-cluster credentials, then $KUBECONFIG / ~/.kube/config].
    #[arg(long, value_name = "FILE", env = "LB_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name (downward API: spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Node addresses that serve NodePorts: CIDRs, or `primary` for the
    /// node's InternalIP per family [default: every local address of the
    /// node, as kube-proxy].
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "CIDR,...|primary",
        env = "LB_NODEPORT_ADDRESSES"
    )]
    pub nodeport_addresses: Vec<NodePortAddr>,
    /// Gather Kubernetes changes this long before applying them.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration, env = "LB_MIN_SYNC_PERIOD")]
    pub min_sync_period: Duration,
}

/// How services become map entries: backend selection, external IPs and
/// the reconciler's progress: the model's and reconciler's part.
#[derive(Args, Clone)]
#[command(next_help_heading = "Services")]
pub struct ServiceArgs {
    /// Backend selection of services that do not choose one (the
    /// `algorithm` field of the services file, the lb.dev/algorithm
    /// annotation in Kubernetes): random, or maglev (consistent hashing: a
    /// flow keeps its backend on every node and across backend changes).
    #[arg(long, value_enum, default_value_t = AlgorithmArg::Random, env = "LB_ALGORITHM")]
    pub lb_algorithm: AlgorithmArg,
    /// Size M of the Maglev tables of services that do not ask for their
    /// own (`maglevTableSize` in the services file, the
    /// lb.dev/maglev-table-size annotation), a prime (251, 509, 1021, 2039,
    /// 4093, 8191, 16381, 32749, 65521, 65537, 131071). A table costs 4·M
    /// bytes; a bigger M moves fewer flows when a backend goes
    /// (docs/benchmarks.md, section 4). A change applies service by service
    /// at the next sync.
    #[arg(long, default_value_t = lb_common::maps::DEFAULT_MAGLEV_M, env = "LB_MAGLEV_TABLE_SIZE")]
    pub maglev_table_size: u32,
    /// A cluster-wide seed for the Maglev tables (Cilium's maglev.hashSeed,
    /// e.g. `head -c12 /dev/urandom | base64`): the same on every node, or
    /// a flow gets another backend on each. Without one, built-in seeds.
    /// `lbctl status` and lb_maglev_seed_info show its fingerprint, to
    /// compare nodes. Changing it moves new flows (established ones keep
    /// their backend through conntrack and socket LB).
    #[arg(
        long,
        default_value = "",
        hide_default_value = true,
        env = "LB_MAGLEV_HASH_SEED",
        hide_env_values = true
    )]
    pub maglev_hash_seed: String,
    /// What the node's own sockets and pods get for a Service's external
    /// IPs: `translate` (kube-proxy's semantics, the default: every external
    /// IP leads to the Service, wherever it is routed) or `owned-only` (only
    /// the addresses this node holds; any other stays the real address it
    /// names, as Cilium does against CVE-2020-8554). Traffic from outside the
    /// node is served either way. docs/security.md weighs the two.
    #[arg(long, value_enum, default_value_t = ExternalIpsArg::Translate, env = "LB_EXTERNAL_IPS_IN_CLUSTER")]
    pub external_ips_in_cluster: ExternalIpsArg,
    /// Count each frontend's traffic in the data path (`lbctl service list
    /// --stats`, `lbctl top`, the lb_service_* metrics): `on`, the default,
    /// or `off`, which leaves the programs without the counters' lookup.
    /// Memory: about 88 bytes plus 32 per possible CPU for each frontend.
    #[arg(long, value_enum, default_value_t = Switch::On, env = "LB_SERVICE_STATS")]
    pub service_stats: Switch,
    /// How often a long reconcile logs how far it got.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration, env = "LB_RECONCILE_PROGRESS_EVERY")]
    pub reconcile_progress_every: Duration,
}

/// Where and how the programs run: cgroup, pins, devices, forwarding mode
/// and the programs' own settings: the data path's part.
#[derive(Args, Clone)]
#[command(next_help_heading = "Data path")]
pub struct DatapathArgs {
    /// cgroup v2 directory to attach the socket hooks to [default: the cgroup2 root from /proc/mounts].
    #[arg(long, value_name = "DIR", env = "LB_CGROUP")]
    pub cgroup: Option<PathBuf>,
    /// Where maps and links are pinned (on bpffs).
    #[arg(long, value_name = "DIR", default_value_os_t = datapath::pins::default_pin_dir(), env = "LB_PIN_DIR")]
    pub pin_dir: PathBuf,
    /// Translate only sockets of the host network namespace; pods keep the
    /// original service address (for service meshes), like Cilium's
    /// socketLB.hostNamespaceOnly.
    #[arg(long, env = "LB_SOCKET_LB_HOST_NAMESPACE_ONLY")]
    pub socket_lb_host_namespace_only: bool,
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
    pub devices: Vec<String>,
    /// Pod-facing devices (the host ends of pods' veths): pods' packets to
    /// ClusterIPs and every other frontend are translated there, for pods
    /// whose sockets socket LB leaves alone. Names or prefixes ending in *
    /// (veth*, cali*, lxc*), `auto` (every veth that is not in --devices),
    /// or `none`. [default: auto with --socket-lb-host-namespace-only in
    /// Kubernetes mode, else none]
    #[arg(long, value_name = "DEV,...|auto|none", env = "LB_POD_DEVICES")]
    pub pod_devices: Option<datapath::pods::PodDevices>,
    /// How traffic to a backend on another node is forwarded.
    #[arg(long, value_enum, default_value_t = LbMode::Snat, env = "LB_MODE")]
    pub lb_mode: LbMode,
    /// How a DSR request carries its frontend to the backend's node: an IPv4
    /// option / IPv6 destination option on the packet (`option`), or that
    /// packet inside an IPIP / IP6IP6 header to the backend (`ipip`), for
    /// fabrics that drop IP options or extension headers. Every node must
    /// run the programs, with the same setting. Applies to DSR from --lb-mode
    /// dsr or hybrid and from Services annotated lb.dev/forwarding-mode: dsr.
    #[arg(long, value_enum, default_value_t = DsrDispatch::Option, env = "LB_DSR_DISPATCH")]
    pub dsr_dispatch: DsrDispatch,
    /// XDP acceleration on the devices.
    #[arg(long, value_enum, default_value_t = datapath::Acceleration::Disabled, env = "LB_ACCELERATION")]
    pub acceleration: datapath::Acceleration,
    /// Source ports for SNAT to remote backends. A client's own port is kept
    /// when it lies in the range (as Linux NAT and Cilium do), which keeps
    /// busy clients clear of their backends' TIME_WAIT; keep the range clear
    /// of the NodePort range.
    #[arg(long, default_value = "32768-65535", env = "LB_SNAT_PORT_RANGE")]
    pub snat_port_range: PortRange,
    /// Log level of the eBPF programs (off, error, warn, info, debug, trace); debug covers hot paths.
    #[arg(long, default_value = "warn", env = "LB_BPF_LOG_LEVEL")]
    pub bpf_log_level: String,
    /// Drop/trace events per second per CPU before rate limiting.
    #[arg(long, default_value_t = lb_common::config::DEFAULT_EVENT_RATE, env = "LB_EVENT_RATE")]
    pub event_rate: u32,
}

/// North-south conntrack lifetimes and its sweep: the conntrack part's.
#[derive(Args, Clone)]
#[command(next_help_heading = "Conntrack")]
pub struct ConntrackArgs {
    /// Conntrack lifetime of an established TCP flow without traffic.
    #[arg(long, default_value = "6h", value_parser = humantime::parse_duration, env = "LB_CT_TIMEOUT_TCP")]
    pub conntrack_timeout_tcp: Duration,
    /// Conntrack lifetime of a TCP flow whose handshake did not complete.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration, env = "LB_CT_TIMEOUT_TCP_SYN")]
    pub conntrack_timeout_tcp_syn: Duration,
    /// Conntrack lifetime of a TCP flow after a FIN or RST.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, env = "LB_CT_TIMEOUT_TCP_FIN")]
    pub conntrack_timeout_tcp_fin: Duration,
    /// Conntrack lifetime of a UDP flow without traffic.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration, env = "LB_CT_TIMEOUT_UDP")]
    pub conntrack_timeout_udp: Duration,
    /// Sweep expired conntrack entries at this interval [default: adaptive,
    /// 10 s to 10 min by how much each sweep finds].
    #[arg(long, value_parser = humantime::parse_duration, env = "LB_CT_GC_INTERVAL")]
    pub conntrack_gc_interval: Option<Duration>,
}

/// The maps' capacities (`--map-size-*`, one per `SizeFlag`) and their
/// preallocation.
#[derive(Args, Clone)]
#[command(next_help_heading = "Map sizes")]
pub struct MapArgs {
    /// Capacity of LB4/6_SERVICES (one entry per frontend plus one per backend slot) and LB4/6_REVNAT.
    #[arg(long, default_value_t = MapSizes::default().services, env = "LB_MAP_SIZE_SERVICES")]
    pub map_size_services: u32,
    /// Capacity of LB4/6_BACKENDS.
    #[arg(long, default_value_t = MapSizes::default().backends, env = "LB_MAP_SIZE_BACKENDS")]
    pub map_size_backends: u32,
    /// Capacity of LB4/6_SOCK_REVNAT (sockets with a translated peer); LB_SOCK_TCP (translated TCP sockets by cookie) gets a quarter, rounded up to a power of two.
    #[arg(long, default_value_t = MapSizes::default().sock_revnat, env = "LB_MAP_SIZE_SOCK_REVNAT")]
    pub map_size_sock_revnat: u32,
    /// Capacity of LB4_CT and of LB6_CT (north-south conntrack; one or two entries per flow).
    #[arg(long, default_value_t = MapSizes::default().ct, env = "LB_MAP_SIZE_CT")]
    pub map_size_ct: u32,
    /// Capacity of LB_MAGLEV (services using Maglev at once).
    #[arg(long, default_value_t = MapSizes::default().maglev, env = "LB_MAP_SIZE_MAGLEV")]
    pub map_size_maglev: u32,
    /// Capacity of LB4_SRC_RANGES and of LB6_SRC_RANGES, each
    /// (loadBalancerSourceRanges networks of all LoadBalancer frontends
    /// together, per family).
    #[arg(long, default_value_t = MapSizes::default().source_ranges, env = "LB_MAP_SIZE_SOURCE_RANGES")]
    pub map_size_source_ranges: u32,
    /// Capacity of LB_AFFINITY (remembered client → backend choices for sessionAffinity).
    #[arg(long, default_value_t = MapSizes::default().affinity, env = "LB_MAP_SIZE_AFFINITY")]
    pub map_size_affinity: u32,
    /// Make the services, backends and reverse-NAT maps preallocated, like
    /// Cilium's --preallocate-bpf-maps: their whole capacity is reserved at
    /// once (about 36 MiB at the default sizes) and a full sync's inserts
    /// cost the kernel about half as much. Chosen when the maps are first
    /// made; a restart must keep it (an uninstall starts over).
    #[arg(long, env = "LB_PREALLOCATE_MAPS")]
    pub preallocate_maps: bool,
}

/// The metrics and health servers.
#[derive(Args, Clone)]
#[command(next_help_heading = "Servers")]
pub struct ServerArgs {
    /// Address of /metrics and /healthz. Loopback unless you choose otherwise.
    #[arg(long, default_value = "127.0.0.1:9967", env = "LB_METRICS_ADDRESS")]
    pub metrics_address: SocketAddr,
    /// The proxy health server (/healthz, /livez), kube-proxy's
    /// --healthz-bind-address: what cloud load balancers and probes ask. 'off' disables it.
    #[arg(long, default_value = "0.0.0.0:10256", value_parser = parse_optional_addr, env = "LB_HEALTHZ_ADDRESS")]
    pub healthz_address: OptionalAddr,
    /// /healthz turns unhealthy when an observed change is not in the maps after this long.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, env = "LB_HEALTHZ_GRACE")]
    pub healthz_grace: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AlgorithmArg {
    Random,
    Maglev,
}

impl From<AlgorithmArg> for crate::model::Algorithm {
    fn from(a: AlgorithmArg) -> Self {
        match a {
            AlgorithmArg::Random => Self::Random,
            AlgorithmArg::Maglev => Self::Maglev,
        }
    }
}

/// A feature turned on or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    On,
    Off,
}

impl Switch {
    pub fn is_on(self) -> bool {
        self == Switch::On
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExternalIpsArg {
    Translate,
    OwnedOnly,
}

impl From<ExternalIpsArg> for crate::desired::ExternalIpsInCluster {
    fn from(a: ExternalIpsArg) -> Self {
        match a {
            ExternalIpsArg::Translate => Self::Translate,
            ExternalIpsArg::OwnedOnly => Self::OwnedOnly,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LbMode {
    /// SNAT to this node's address; replies come back through this node.
    Snat,
    /// Direct server return: the client's address is kept, replies go straight back.
    Dsr,
    /// DSR for TCP, SNAT for UDP.
    Hybrid,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DsrDispatch {
    /// An IPv4 option / IPv6 destination option on the request itself.
    Option,
    /// The request inside an outer IPv4 (IPIP) / IPv6 (IP6IP6) header.
    Ipip,
}

/// A listen address, or none ('off').
#[derive(Clone, Copy, Debug)]
pub struct OptionalAddr(pub Option<SocketAddr>);

pub fn parse_optional_addr(s: &str) -> Result<OptionalAddr, String> {
    if s == "off" {
        return Ok(OptionalAddr(None));
    }
    s.parse()
        .map(|a| OptionalAddr(Some(a)))
        .map_err(|e| format!("{s}: {e}; write ADDRESS:PORT (e.g. 0.0.0.0:10256) or off"))
}

#[derive(Clone, Copy, Debug)]
pub struct PortRange(pub u16, pub u16);

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

/// Each part's config, from the flags (no side effects, no root).
impl RunArgs {
    /// The programs' start settings (LB_CONFIG), checked before anything
    /// is installed: a bad flag changes nothing. `host_netns_cookie`: the
    /// agent's network namespace (`sys::fs::own_netns_cookie`).
    pub fn start_settings(&self, host_netns_cookie: u64) -> anyhow::Result<StartSettings> {
        let seed_chars = self.service.maglev_hash_seed.chars().count();
        if seed_chars > 0 && seed_chars < 12 {
            anyhow::bail!(
                "--maglev-hash-seed is {seed_chars} characters: a seed that short can be guessed; use 12 or more (head -c12 /dev/urandom | base64)"
            );
        }
        if !crate::desired::maglev::valid_size(self.service.maglev_table_size) {
            anyhow::bail!(
                "--maglev-table-size {} is not one of the supported primes: {:?}",
                self.service.maglev_table_size,
                lb_common::maps::MAGLEV_PRIMES
            );
        }
        let log_level = datapath::config::parse_value(
            datapath::config::setting("bpf-log-level")?,
            &self.datapath.bpf_log_level,
        )
        .context("--bpf-log-level")?;
        let settings = StartSettings {
            log_level,
            event_rate: self.datapath.event_rate,
            host_netns_cookie,
            host_namespace_only: self.datapath.socket_lb_host_namespace_only,
            lb_mode: self.datapath.lb_mode_word()?,
            maglev_m: self.service.maglev_table_size,
            snat_ports: (
                self.datapath.snat_port_range.0,
                self.datapath.snat_port_range.1,
            ),
            conntrack: Timeouts {
                tcp: self.conntrack.conntrack_timeout_tcp,
                tcp_syn: self.conntrack.conntrack_timeout_tcp_syn,
                tcp_fin: self.conntrack.conntrack_timeout_tcp_fin,
                udp: self.conntrack.conntrack_timeout_udp,
            },
        };
        settings.check()?;
        Ok(settings)
    }
}

impl DatapathArgs {
    /// `LB_CONFIG[CFG_LB_MODE]`: the mode and the DSR dispatch.
    pub fn lb_mode_word(&self) -> anyhow::Result<u32> {
        use lb_common::nodeport::*;
        let mode = match self.lb_mode {
            LbMode::Snat => MODE_SNAT,
            LbMode::Dsr => MODE_DSR,
            LbMode::Hybrid => MODE_HYBRID,
        };
        let dispatch = match self.dsr_dispatch {
            DsrDispatch::Option => DSR_DISPATCH_OPTION,
            DsrDispatch::Ipip => DSR_DISPATCH_IPIP,
        };
        // Allowed with --lb-mode snat too: a Service annotated
        // lb.dev/forwarding-mode: dsr uses the dispatch.
        Ok(lb_mode_word(mode, dispatch))
    }
}

impl MapArgs {
    /// The maps' sizes. The reverse-NAT maps hold one entry per frontend,
    /// and a service has at least one: they take `--map-size-services`
    /// (no flag of their own).
    pub fn map_sizes(&self) -> MapSizes {
        MapSizes {
            services: self.map_size_services,
            backends: self.map_size_backends,
            sock_revnat: self.map_size_sock_revnat,
            affinity: self.map_size_affinity,
            ct: self.map_size_ct,
            maglev: self.map_size_maglev,
            source_ranges: self.map_size_source_ranges,
            preallocate: self.preallocate_maps,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn flags(args: &[&str]) -> RunArgs {
        parse(args).unwrap()
    }

    /// `lb-agent run ARGS` as clap parses it (the other modules' tests
    /// too).
    pub(crate) fn parse(args: &[&str]) -> Result<RunArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("lb-agent").chain(args.iter().copied())).map(|c| c.run)
    }

    #[test]
    fn the_defaults_make_settings_that_pass_their_checks() {
        let s = flags(&["--services", "x.yaml"]).start_settings(7).unwrap();
        assert_eq!(s.host_netns_cookie, 7);
        assert_eq!(s.lb_mode, lb_common::nodeport::MODE_SNAT);
        assert_eq!(s.maglev_m, lb_common::maps::DEFAULT_MAGLEV_M);
    }

    #[test]
    fn a_maglev_size_that_is_not_a_supported_prime_is_refused_by_its_flag() {
        let e = flags(&["--services", "x.yaml", "--maglev-table-size", "1000"])
            .start_settings(1)
            .unwrap_err();
        assert!(
            format!("{e:#}").contains("--maglev-table-size 1000"),
            "{e:#}"
        );
    }

    #[test]
    fn a_bad_bpf_log_level_is_refused_by_its_flag() {
        let e = flags(&["--services", "x.yaml", "--bpf-log-level", "loud"])
            .start_settings(1)
            .unwrap_err();
        assert!(format!("{e:#}").contains("--bpf-log-level"), "{e:#}");
    }

    #[test]
    fn the_snat_range_and_mode_reach_the_settings() {
        let s = flags(&[
            "--services",
            "x.yaml",
            "--snat-port-range",
            "40000-40999",
            "--lb-mode",
            "dsr",
        ])
        .start_settings(1)
        .unwrap();
        assert_eq!(s.snat_ports, (40000, 40999));
        assert_eq!(s.lb_mode, lb_common::nodeport::MODE_DSR);
    }

    #[test]
    fn the_dsr_dispatch_rides_in_the_mode_word_even_with_snat() {
        use lb_common::nodeport::*;
        let s = flags(&[
            "--services",
            "x.yaml",
            "--lb-mode",
            "hybrid",
            "--dsr-dispatch",
            "ipip",
        ])
        .start_settings(1)
        .unwrap();
        assert_eq!(mode_of(s.lb_mode), MODE_HYBRID);
        assert_eq!(dsr_dispatch_of(s.lb_mode), DSR_DISPATCH_IPIP);
        // SNAT by default, DSR's dispatch for annotated Services.
        let s = flags(&["--services", "x.yaml", "--dsr-dispatch", "ipip"])
            .start_settings(1)
            .unwrap();
        assert_eq!(mode_of(s.lb_mode), MODE_SNAT);
        assert_eq!(dsr_dispatch_of(s.lb_mode), DSR_DISPATCH_IPIP);
    }

    #[test]
    fn a_short_maglev_seed_is_refused_by_flag_and_a_long_one_is_taken() {
        let e = flags(&["--services", "x.yaml", "--maglev-hash-seed", "short"])
            .start_settings(1)
            .unwrap_err();
        assert!(
            e.to_string().contains("--maglev-hash-seed is 5 characters"),
            "{e}"
        );
        let long = flags(&[
            "--services",
            "x.yaml",
            "--maglev-hash-seed",
            "Zm9vYmFyYmF6cXV4",
        ]);
        assert!(long.start_settings(1).is_ok());
        assert_eq!(long.service.maglev_hash_seed, "Zm9vYmFyYmF6cXV4");
    }

    #[test]
    fn the_reverse_nat_maps_are_sized_by_the_services_flag() {
        let m = flags(&[
            "--services",
            "x.yaml",
            "--map-size-services",
            "1234",
            "--map-size-backends",
            "999",
        ])
        .maps
        .map_sizes();
        assert_eq!((m.services, m.backends), (1234, 999));
        let revnat = crate::maps::catalog::spec_of(lb_common::maps::LB6_REVNAT).unwrap();
        assert_eq!(revnat.max_entries(&m), Some(1234));
    }

    /// The map table's flag names are this command's: each one given a
    /// value of its own lands in the field the table reads for it.
    #[test]
    fn every_size_flag_of_the_map_table_is_a_flag_that_sets_its_field() {
        use crate::maps::SizeFlag;
        let mut args = vec!["--services".to_string(), "x.yaml".to_string()];
        for (i, f) in SizeFlag::ALL.iter().enumerate() {
            args.push(f.flag().to_string());
            args.push((2048 + i).to_string());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let m = flags(&args).maps.map_sizes();
        for (i, f) in SizeFlag::ALL.iter().enumerate() {
            assert_eq!(f.get(&m), 2048 + u32::try_from(i).unwrap(), "{}", f.flag());
        }
    }
}
