//! The north-south programs loaded for BPF_PROG_TEST_RUN, inside a network
//! namespace of their own (FIB lookups run in the caller's namespace), with
//! maps filled through the real reconciler.
use std::{
    net::{Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use aya::{
    programs::{SchedClassifier, TestRun as _, TestRunOptions, Xdp},
    Ebpf,
};
use lb::{
    datapath::{self, config::RuntimeConfig, MapSizes},
    maps::bpf::BpfMaps,
    model::Model,
    reconcile::Reconciler,
};

use lb::source::file::parse::FileContext;

use crate::{agent::PinDir, netns::Netns, packets::Mac};

/// The test node: `ext0` 192.168.50.2/24, the client 192.168.50.1 and node B
/// 192.168.50.3 as static neighbours, pods of node B (10.244.2.0/24) routed
/// via node B.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 2);
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 1);
pub const NODE_B_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 3);
pub const CLIENT_MAC: Mac = [0x02, 0, 0, 0, 0, 0x01];
pub const NODE_B_MAC: Mac = [0x02, 0, 0, 0, 0, 0x03];
pub const EXT0_MAC: Mac = [0x02, 0, 0, 0, 0, 0x02];
/// The same node over IPv6: `ext0` fd00:50::2/64, the client fd00:50::1
/// and node B fd00:50::3 as static neighbours, node B's pods
/// (fd00:244:2::/64) routed via node B.
pub const NODE_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x50, 0, 0, 0, 0, 0, 2);
pub const CLIENT_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x50, 0, 0, 0, 0, 0, 1);
pub const NODE_B_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x50, 0, 0, 0, 0, 0, 3);

/// tc verdicts and XDP actions.
pub const TC_ACT_OK: u32 = 0;
pub const TC_ACT_SHOT: u32 = 2;
pub const TC_ACT_REDIRECT: u32 = 7;
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;

/// The north-south tests' frontends: a NodePort with a node-local backend,
/// one with a remote backend, a UDP LoadBalancer, a NodePort without
/// backends, a Maglev LoadBalancer, and a NodePort whose backend is behind
/// a path with a 1400-byte MTU.
pub const SERVICES: &str = r#"
services:
  - name: local
    type: NodePort
    clusterIPs: [10.96.0.1]
    ports: [{port: 80, targetPort: 8080, nodePort: 30001}]
    backends: [{address: 10.244.1.10, local: true}]
  - name: remote
    type: NodePort
    clusterIPs: [10.96.0.2]
    ports: [{port: 80, targetPort: 8080, nodePort: 30002}]
    backends: [{address: 10.244.2.10}]
  - name: dns
    type: LoadBalancer
    clusterIPs: [10.96.0.3]
    loadBalancerIPs: [203.0.113.10]
    ports: [{port: 53, protocol: UDP, targetPort: 5353}]
    backends: [{address: 10.244.2.20}]
  - name: empty
    type: NodePort
    clusterIPs: [10.96.0.4]
    ports: [{port: 80, nodePort: 30003}]
  - name: web
    type: LoadBalancer
    algorithm: maglev
    clusterIPs: [10.96.0.5]
    loadBalancerIPs: [203.0.113.20]
    ports: [{port: 80, targetPort: 8080}]
    backends: [{address: 10.244.2.31}, {address: 10.244.2.32}, {address: 10.244.2.33}]
  - name: narrow
    type: NodePort
    clusterIPs: [10.96.0.6]
    ports: [{port: 80, targetPort: 8080, nodePort: 30006}]
    backends: [{address: 10.244.3.10}]
"#;

/// The IPv6 twins of `SERVICES` (NodePorts 31001, 31002, 31007, 31008),
/// a source-ranged LoadBalancer, and an IPv4-only NodePort (31009) that an
/// IPv6 packet must not reach.
pub const SERVICES6: &str = r#"
services:
  - name: local6
    type: NodePort
    clusterIPs: ["fd00:96::1"]
    ports: [{port: 80, targetPort: 8080, nodePort: 31001}]
    backends: [{address: "fd00:244:1::10", local: true}]
  - name: remote6
    type: NodePort
    clusterIPs: ["fd00:96::2"]
    ports: [{port: 80, targetPort: 8080, nodePort: 31002}]
    backends: [{address: "fd00:244:2::10"}]
  - name: dns6
    type: LoadBalancer
    clusterIPs: ["fd00:96::3"]
    loadBalancerIPs: ["2001:db8:113::10"]
    ports: [{port: 53, protocol: UDP, targetPort: 5353}]
    backends: [{address: "fd00:244:2::20"}]
  - name: web6
    type: LoadBalancer
    algorithm: maglev
    clusterIPs: ["fd00:96::5"]
    loadBalancerIPs: ["2001:db8:113::20"]
    ports: [{port: 80, targetPort: 8080}]
    backends: [{address: "fd00:244:2::31"}, {address: "fd00:244:2::32"}, {address: "fd00:244:2::33"}]
  - name: ranged6
    type: LoadBalancer
    clusterIPs: ["fd00:96::6"]
    loadBalancerIPs: ["2001:db8:113::30"]
    loadBalancerSourceRanges: ["fd00:50::/64"]
    ports: [{port: 80, targetPort: 8080}]
    backends: [{address: "fd00:244:2::40"}]
  - name: empty6
    type: NodePort
    clusterIPs: ["fd00:96::7"]
    ports: [{port: 80, nodePort: 31007}]
  - name: narrow6
    type: NodePort
    clusterIPs: ["fd00:96::8"]
    ports: [{port: 80, targetPort: 8080, nodePort: 31008}]
    backends: [{address: "fd00:244:3::10"}]
  - name: v4only
    type: NodePort
    clusterIPs: [10.96.0.9]
    ports: [{port: 80, targetPort: 8080, nodePort: 31009}]
    backends: [{address: 10.244.2.10}]
"#;

/// What the services file needs to serve NodePorts on this node.
pub fn node_context() -> FileContext {
    FileContext {
        nodeport_addresses: vec![NODE_IP.into(), NODE_IP6.into()],
        ..Default::default()
    }
}

pub struct Dataplane {
    pub ebpf: Ebpf,
    pub reconciler: Reconciler<BpfMaps>,
    pub ifindex: u32,
    pub pins: PinDir,
    // Last: the namespace outlives everything that was made in it.
    pub netns: Netns,
}

impl Dataplane {
    /// Builds the namespace, enters it on the calling thread (test_run uses
    /// the caller's namespace for FIB lookups) and loads the programs.
    pub fn new(tag: &str) -> Self {
        Self::with_sizes(tag, &MapSizes::default())
    }

    /// `new` with map capacities of its own (benchmarks at 100 000 services).
    pub fn with_sizes(tag: &str, sizes: &MapSizes) -> Self {
        let netns = Netns::create(&format!("lbt-{tag}-np"));
        netns.ip(&[
            "link",
            "add",
            "ext0",
            "address",
            "02:00:00:00:00:02",
            "type",
            "veth",
            "peer",
            "name",
            "ext0p",
        ]);
        netns.ip(&["addr", "add", "192.168.50.2/24", "dev", "ext0"]);
        netns.ip(&["link", "set", "ext0", "up"]);
        netns.ip(&["link", "set", "ext0p", "up"]);
        netns.ip(&[
            "neigh",
            "add",
            "192.168.50.1",
            "lladdr",
            "02:00:00:00:00:01",
            "dev",
            "ext0",
            "nud",
            "permanent",
        ]);
        netns.ip(&[
            "neigh",
            "add",
            "192.168.50.3",
            "lladdr",
            "02:00:00:00:00:03",
            "dev",
            "ext0",
            "nud",
            "permanent",
        ]);
        netns.ip(&[
            "route",
            "add",
            "10.244.2.0/24",
            "via",
            "192.168.50.3",
            "dev",
            "ext0",
        ]);
        // Node B's other pods sit behind a narrower path (a tunnel, say).
        // Locked: forwarding honours a route's MTU only then
        // (ip_mtu_from_fib_result, with ip_forward_use_pmtu off).
        netns.ip(&[
            "route",
            "add",
            "10.244.3.0/24",
            "via",
            "192.168.50.3",
            "dev",
            "ext0",
            "mtu",
            "lock",
            "1400",
        ]);
        // IPv6: the same shape. `nodad`: usable at once, no duplicate
        // address detection to wait for.
        netns.ip(&["addr", "add", "fd00:50::2/64", "dev", "ext0", "nodad"]);
        for (addr, mac) in [
            ("fd00:50::1", "02:00:00:00:00:01"),
            ("fd00:50::3", "02:00:00:00:00:03"),
        ] {
            netns.ip(&[
                "-6",
                "neigh",
                "add",
                addr,
                "lladdr",
                mac,
                "dev",
                "ext0",
                "nud",
                "permanent",
            ]);
        }
        netns.ip(&[
            "-6",
            "route",
            "add",
            "fd00:244:2::/64",
            "via",
            "fd00:50::3",
            "dev",
            "ext0",
        ]);
        netns.ip(&[
            "-6",
            "route",
            "add",
            "fd00:244:3::/64",
            "via",
            "fd00:50::3",
            "dev",
            "ext0",
            "mtu",
            "lock",
            "1400",
        ]);
        // bpf_fib_lookup answers only where forwarding is on (like the stack).
        for key in [
            "net.ipv4.conf.all.forwarding=1",
            "net.ipv6.conf.all.forwarding=1",
        ] {
            crate::run("ip", &["netns", "exec", &netns.name, "sysctl", "-qw", key]);
        }
        crate::netns::enter(&netns.name).expect("entering the test namespace");

        let pins = PinDir::create(tag);
        let (mut ebpf, _) = datapath::load(&pins.path, sizes).expect("loading the object");
        for name in [
            datapath::TC_INGRESS,
            datapath::TC_EGRESS,
            datapath::pods::TC_POD_INGRESS,
        ] {
            let p: &mut SchedClassifier = ebpf.program_mut(name).unwrap().try_into().unwrap();
            datapath::load_retrying(|| p.load()).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        }
        let x: &mut Xdp = ebpf.program_mut(datapath::XDP).unwrap().try_into().unwrap();
        datapath::load_retrying(|| x.load()).expect("lb_xdp");
        datapath::write_devices(&pins.path, &["ext0".to_string()]).expect("LB_DEVICES");
        let reconciler = Reconciler::restore(BpfMaps::open(&pins.path).unwrap()).unwrap();
        let ifindex = lb::sys::netdev::ifindex("ext0").unwrap();
        let dp = Self {
            ebpf,
            reconciler,
            ifindex,
            pins,
            netns,
        };
        dp.config(
            lb_common::config::CFG_MAGLEV_M,
            lb_common::maps::DEFAULT_MAGLEV_M,
        );
        dp.config(lb_common::config::CFG_SNAT_PORT_MIN, 61000);
        dp.config(lb_common::config::CFG_SNAT_PORT_MAX, 65535);
        dp
    }

    /// `new`, with a services file applied (`SERVICES` in most tests).
    pub fn with_services(tag: &str, services: &str) -> Self {
        let mut dp = Self::new(tag);
        dp.apply(
            &lb::source::file::parse::parse_with(services, &node_context()).expect("services file"),
        );
        dp
    }

    pub fn config(&self, index: u32, value: u32) {
        use lb::datapath::config::ConfigSlots as _;
        RuntimeConfig::open(&self.pins.path)
            .unwrap()
            .set(index, value)
            .unwrap();
    }

    pub fn apply(&mut self, model: &Model) {
        self.reconciler.reconcile(model).expect("reconcile");
    }

    /// From now on frontends are written with per-frontend counters on or
    /// off (`--service-stats`): a new reconciler over the same pins, as an
    /// agent restarted with the flag; its next `apply` is a full sync.
    pub fn restart_with_service_stats(&mut self, on: bool) {
        let maps = BpfMaps::open(&self.pins.path)
            .unwrap()
            .with_service_stats(on);
        self.reconciler =
            Reconciler::restore(maps)
                .unwrap()
                .with_config(lb::desired::BuildConfig {
                    service_stats: on,
                    ..Default::default()
                });
    }

    /// The standard `SERVICES` plus the services of `extra` (a services
    /// file of more services), as this node's services file.
    pub fn apply_with_extra(&mut self, extra: &str) {
        self.apply_with_extra_to(SERVICES, extra);
    }

    /// `base` (a services file, as `SERVICES6`) plus the services of
    /// `extra`, as this node's services file.
    pub fn apply_with_extra_to(&mut self, base: &str, extra: &str) {
        let ctx = node_context();
        let mut model = lb::source::file::parse::parse_with(base, &ctx).unwrap();
        model.services.extend(
            lb::source::file::parse::parse_with(extra, &ctx)
                .unwrap()
                .services,
        );
        self.apply(&model);
    }

    fn skb_ctx(&self) -> Vec<u8> {
        self.skb_ctx_on(self.ifindex)
    }

    /// A packet that came in on `ingress` (the program still runs on ext0).
    fn skb_ctx_on(&self, ingress: u32) -> Vec<u8> {
        // struct __sk_buff: ingress_ifindex at 36, ifindex at 40; the kernel
        // accepts those (and a few others) from user space and rejects the rest.
        let mut ctx = vec![0u8; 192];
        ctx[36..40].copy_from_slice(&ingress.to_ne_bytes());
        ctx[40..44].copy_from_slice(&self.ifindex.to_ne_bytes());
        ctx
    }

    fn run_tc(&self, name: &str, packet: &[u8], repeat: u32) -> (u32, Vec<u8>, Duration) {
        self.run_tc_on(self.ifindex, name, packet, repeat)
    }

    fn run_tc_on(
        &self,
        ingress: u32,
        name: &str,
        packet: &[u8],
        repeat: u32,
    ) -> (u32, Vec<u8>, Duration) {
        let p: &SchedClassifier = self.ebpf.program(name).unwrap().try_into().unwrap();
        let mut out = vec![0u8; packet.len() + 64];
        let ctx = self.skb_ctx_on(ingress);
        let r = p
            .test_run(TestRunOptions {
                data_in: Some(packet),
                data_out: Some(&mut out),
                ctx_in: Some(&ctx),
                repeat,
                ..Default::default()
            })
            .unwrap_or_else(|e| panic!("test_run {name} ({} bytes): {e:?}", packet.len()));
        out.truncate(r.data_size_out as usize);
        (r.return_value, out, r.duration)
    }

    pub fn tc_ingress(&self, packet: &[u8]) -> (u32, Vec<u8>) {
        let (rc, out, _) = self.run_tc(datapath::TC_INGRESS, packet, 1);
        (rc, out)
    }

    /// `tc_ingress` for a packet that came in on device `ingress`.
    pub fn tc_ingress_on(&self, ingress: u32, packet: &[u8]) -> (u32, Vec<u8>) {
        let (rc, out, _) = self.run_tc_on(ingress, datapath::TC_INGRESS, packet, 1);
        (rc, out)
    }

    /// The pod-facing program: a packet as it leaves a pod on this node.
    pub fn pod_ingress(&self, packet: &[u8]) -> (u32, Vec<u8>) {
        let (rc, out, _) = self.run_tc(datapath::pods::TC_POD_INGRESS, packet, 1);
        (rc, out)
    }

    pub fn tc_egress(&self, packet: &[u8]) -> (u32, Vec<u8>) {
        let (rc, out, _) = self.run_tc(datapath::TC_EGRESS, packet, 1);
        (rc, out)
    }

    /// ns/packet over `repeat` runs (the kernel's own average).
    /// tc ingress on `packet` handed over as CHECKSUM_COMPLETE (as a NIC
    /// that sums every frame does), with BPF_F_TEST_SKB_CHECKSUM_COMPLETE:
    /// the kernel sets skb->csum from the packet before the run and, after
    /// it, fails the run with EBADMSG when skb->csum no longer matches the
    /// packet (net/bpf/test_run.c, Linux 6.17). aya 0.14 sets no test-run
    /// flags but XDP's live frames, hence the raw bpf(2) call.
    pub fn tc_ingress_checksum_complete(&self, packet: &[u8]) -> std::io::Result<(u32, Vec<u8>)> {
        use std::os::fd::{AsFd as _, AsRawFd as _};
        const BPF_PROG_TEST_RUN: libc::c_long = 10;
        const BPF_F_TEST_SKB_CHECKSUM_COMPLETE: u32 = 1 << 2;
        let p: &SchedClassifier = self
            .ebpf
            .program(datapath::TC_INGRESS)
            .unwrap()
            .try_into()
            .unwrap();
        let fd = p.fd().unwrap().as_fd().as_raw_fd();
        let mut out = vec![0u8; packet.len() + 64];
        let ctx = self.skb_ctx();
        #[repr(C, align(8))]
        struct Attr([u8; 128]);
        let mut attr = Attr([0; 128]);
        let mut put32 = |off: usize, v: u32| attr.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        put32(0, fd as u32);
        put32(8, packet.len() as u32);
        put32(12, out.len() as u32);
        put32(32, 1);
        put32(40, ctx.len() as u32);
        put32(64, BPF_F_TEST_SKB_CHECKSUM_COMPLETE);
        let mut put64 = |off: usize, v: u64| attr.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        put64(16, packet.as_ptr() as u64);
        put64(24, out.as_mut_ptr() as u64);
        put64(48, ctx.as_ptr() as u64);
        // SAFETY: a zero-padded bpf_attr whose pointers name live buffers of
        // the sizes given, for the duration of the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_TEST_RUN,
                &mut attr as *mut Attr,
                std::mem::size_of::<Attr>(),
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let retval = u32::from_ne_bytes(attr.0[4..8].try_into().unwrap());
        let size_out = u32::from_ne_bytes(attr.0[12..16].try_into().unwrap());
        out.truncate(size_out as usize);
        Ok((retval, out))
    }

    pub fn tc_ingress_timed(&self, packet: &[u8], repeat: u32) -> Duration {
        self.run_tc(datapath::TC_INGRESS, packet, repeat).2
    }

    /// `tc_ingress_timed` for a packet that came in on device `ingress`.
    pub fn tc_ingress_timed_on(&self, ingress: u32, packet: &[u8], repeat: u32) -> Duration {
        self.run_tc_on(ingress, datapath::TC_INGRESS, packet, repeat)
            .2
    }

    pub fn tc_egress_timed(&self, packet: &[u8], repeat: u32) -> Duration {
        self.run_tc(datapath::TC_EGRESS, packet, repeat).2
    }

    pub fn xdp(&self, packet: &[u8]) -> (u32, Vec<u8>) {
        let (rc, out, _) = self.run_xdp(self.ifindex, packet, 1);
        (rc, out)
    }

    /// `xdp` for a frame received on device `ingress`.
    pub fn xdp_on(&self, ingress: u32, packet: &[u8]) -> (u32, Vec<u8>) {
        let (rc, out, _) = self.run_xdp(ingress, packet, 1);
        (rc, out)
    }

    pub fn xdp_timed(&self, packet: &[u8], repeat: u32) -> Duration {
        self.run_xdp(self.ifindex, packet, repeat).2
    }

    /// `xdp_timed` for a frame received on device `ingress`.
    pub fn xdp_timed_on(&self, ingress: u32, packet: &[u8], repeat: u32) -> Duration {
        self.run_xdp(ingress, packet, repeat).2
    }

    fn run_xdp(&self, ingress: u32, packet: &[u8], repeat: u32) -> (u32, Vec<u8>, Duration) {
        let p: &Xdp = self
            .ebpf
            .program(datapath::XDP)
            .unwrap()
            .try_into()
            .unwrap();
        let mut out = vec![0u8; packet.len() + 64];
        // struct xdp_md: data 0, data_end = length, data_meta 0, ingress_ifindex.
        let mut ctx = vec![0u8; 24];
        ctx[4..8].copy_from_slice(&(packet.len() as u32).to_ne_bytes());
        ctx[12..16].copy_from_slice(&ingress.to_ne_bytes());
        let r = p
            .test_run(TestRunOptions {
                data_in: Some(packet),
                data_out: Some(&mut out),
                ctx_in: Some(&ctx),
                repeat,
                ..Default::default()
            })
            .unwrap_or_else(|e| panic!("test_run xdp: {e:#}"));
        out.truncate(r.data_size_out as usize);
        (r.return_value, out, r.duration)
    }

    /// A counter of the data path (`lb_common::config::CNT_*`), summed over CPUs.
    pub fn counter(&self, index: u32) -> u64 {
        use aya::maps::{MapData, PerCpuArray};
        let map: PerCpuArray<MapData, u64> = PerCpuArray::try_from(
            lb::maps::bpf::open_pinned(&self.pins.path, lb_common::maps::LB_COUNTERS).unwrap(),
        )
        .unwrap();
        map.get(&index, 0).unwrap().iter().sum()
    }

    /// A conntrack entry, as the programs left it.
    pub fn ct(&self, key: &lb_common::conntrack::Ct4Key) -> Option<lb_common::conntrack::Ct4Value> {
        use aya::maps::{HashMap, MapData};
        let map: HashMap<MapData, lb_common::conntrack::Ct4Key, lb_common::conntrack::Ct4Value> =
            HashMap::try_from(
                lb::maps::bpf::open_pinned(&self.pins.path, lb_common::maps::LB4_CT).unwrap(),
            )
            .unwrap();
        map.get(key, 0).ok()
    }

    /// An IPv6 conntrack entry, as the programs left it.
    pub fn ct6(
        &self,
        key: &lb_common::conntrack::Ct6Key,
    ) -> Option<lb_common::conntrack::Ct6Value> {
        use aya::maps::{HashMap, MapData};
        let map: HashMap<MapData, lb_common::conntrack::Ct6Key, lb_common::conntrack::Ct6Value> =
            HashMap::try_from(
                lb::maps::bpf::open_pinned(&self.pins.path, lb_common::maps::LB6_CT).unwrap(),
            )
            .unwrap();
        map.get(key, 0).ok()
    }

    /// Packets counted for a drop reason (ingress).
    pub fn drops(&self, reason: &str) -> u64 {
        lb::maps::bpf::read_drops(&self.pins.path)
            .unwrap()
            .iter()
            .filter(|d| d.reason == reason && d.direction == "ingress")
            .map(|d| d.packets)
            .sum()
    }
}
