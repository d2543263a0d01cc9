//! `LB4_SERVICES`: one master entry (slot 0) and one entry per backend slot.

/// Scope of a service view. With a `Local` traffic policy a service has two
/// views: all backends (external/cluster) and node-local backends only.
pub const SCOPE_ALL: u8 = 0;
pub const SCOPE_LOCAL: u8 = 1;

/// Service type bits in `ServiceValue::flags`.
pub const SVC_FLAG_CLUSTER_IP: u16 = 1 << 0;
pub const SVC_FLAG_NODE_PORT: u16 = 1 << 1;
pub const SVC_FLAG_LOAD_BALANCER: u16 = 1 << 2;
pub const SVC_FLAG_EXTERNAL_IP: u16 = 1 << 3;
/// The scope-0 entry has a scope-1 (node-local) sibling.
pub const SVC_FLAG_TWO_SCOPES: u16 = 1 << 4;
/// sessionAffinity: ClientIP.
pub const SVC_FLAG_AFFINITY: u16 = 1 << 5;
/// Address-only marker entry (port 0, proto 0): the VIP is known, so a connect
/// to a port it does not expose is refused instead of routed.
pub const SVC_FLAG_VIP_MARKER: u16 = 1 << 6;
/// An external IP this node does not own (CVE-2020-8554): a Service's
/// `externalIPs` are written by whoever may edit Services, so sockets on
/// the node and pods' packets leave such an address alone and reach the real
/// destination; packets arriving from outside for it are still served (that
/// is what an external IP is for). Cilium's `sock4_skip_xlate` does the same.
pub const SVC_FLAG_FOREIGN_EXTERNAL_IP: u16 = 1 << 7;
/// A LoadBalancer frontend with `loadBalancerSourceRanges`: a new flow from
/// outside is served only when its source is in `LB4_SRC_RANGES` for the
/// service (kube-proxy's KUBE-FW chain), else dropped as `source-range`.
pub const SVC_FLAG_SOURCE_RANGES: u16 = 1 << 8;
/// The frontend's own forwarding to remote backends, over the agent's
/// `--lb-mode` (the `lb.dev/forwarding-mode` annotation, Cilium's
/// `service.cilium.io/forwarding-mode` idea): SNAT, or DSR (with the
/// agent's `--dsr-dispatch`). Neither: the agent's mode.
pub const SVC_FLAG_FORWARD_SNAT: u16 = 1 << 9;
pub const SVC_FLAG_FORWARD_DSR: u16 = 1 << 10;
/// A NodePort on 127.0.0.1 or ::1: the node's own processes reach it
/// through the socket hooks, as kube-proxy's iptables mode serves
/// localhost NodePorts and Cilium's socket LB does. Only sockets of the
/// host's network namespace (a pod's loopback is its own), and never a
/// packet: one arriving from outside addressed to a loopback address is
/// left to the stack, which drops it as a martian (CVE-2020-8558, which
/// kube-proxy's route_localnet opened).
pub const SVC_FLAG_HOST_LOOPBACK: u16 = 1 << 11;
/// The programs count this frontend's traffic in `LB_SVC_STATS`
/// (`--service-stats on`, the default): without it they skip the lookup.
pub const SVC_FLAG_STATS: u16 = 1 << 12;

/// The data of an `LB4_SRC_RANGES` key (an LPM trie: the kernel's
/// `bpf_lpm_trie_key` is a 32-bit prefix length followed by this). The
/// prefix covers all of `service_id` (32 bits, any byte order: it is always
/// matched whole) and then the leading bits of `address`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct SourceRange4 {
    pub service_id: u32,
    /// Network byte order: the CIDR's leading bits come first.
    pub address: u32,
}

impl SourceRange4 {
    /// The prefix length of a key for a CIDR of `len` bits.
    pub const fn prefix_len(len: u8) -> u32 {
        32 + len as u32
    }
}

/// `LB6_SRC_RANGES` key data: the same shape for an IPv6 network.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct SourceRange6 {
    pub service_id: u32,
    /// Network byte order, as on the wire.
    pub address: crate::Addr6,
}

impl SourceRange6 {
    /// The prefix length of a key for a CIDR of `len` bits.
    pub const fn prefix_len(len: u8) -> u32 {
        32 + len as u32
    }
}

crate::user_pod!(SourceRange4, SourceRange6);

/// Backend selection algorithms (`ServiceValue::algorithm`).
pub const ALG_RANDOM: u8 = 0;
pub const ALG_MAGLEV: u8 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Service4Key {
    /// Frontend address, network byte order.
    pub address: u32,
    /// Frontend port, network byte order.
    pub dport: u16,
    /// 0 for the master entry, 1.. for backend slots.
    pub backend_slot: u16,
    pub proto: u8,
    pub scope: u8,
    pub pad: [u8; 2],
}

impl Service4Key {
    pub const fn new(address: u32, dport: u16, proto: u8, scope: u8, backend_slot: u16) -> Self {
        Self {
            address,
            dport,
            backend_slot,
            proto,
            scope,
            pad: [0; 2],
        }
    }

    /// The same frontend at another slot.
    pub const fn with_slot(&self, backend_slot: u16) -> Self {
        Self {
            backend_slot,
            ..*self
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ServiceValue {
    /// Slot entries: the backend id. Master entry: the number of maintenance
    /// backends, in the slots after the terminating ones: never chosen for a
    /// new flow, kept so that established flows (conntrack) still reach
    /// them (graceful drain; an agent that predates them wrote 0 here).
    pub backend_id: u32,
    /// Stable id of the frontend (reverse NAT index).
    pub service_id: u32,
    /// Master entry: active backends, in slots 1..=count.
    pub count: u16,
    /// Master entry: terminating backends, in the slots after the active ones.
    pub terminating_count: u16,
    /// `SVC_FLAG_*`.
    pub flags: u16,
    /// `ALG_*`.
    pub algorithm: u8,
    /// Master entry of a Maglev service: the size M of its table, as
    /// `maps::maglev_size_code` (1 + its place in `MAGLEV_PRIMES`). 0 (what
    /// agents before per-service sizes wrote here): `CFG_MAGLEV_M`.
    pub maglev_size: u8,
    /// sessionAffinity timeout in seconds (when `SVC_FLAG_AFFINITY`).
    pub affinity_timeout_s: u32,
}

impl ServiceValue {
    /// Of a master entry: every slot it has (active, terminating, maintenance).
    pub const fn master_slots(&self) -> u32 {
        self.count as u32 + self.terminating_count as u32 + self.backend_id
    }
}

/// IPv6 frontend; same layout rules as `Service4Key`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Service6Key {
    /// Frontend address, network byte order.
    pub address: crate::Addr6,
    /// Frontend port, network byte order.
    pub dport: u16,
    pub backend_slot: u16,
    pub proto: u8,
    pub scope: u8,
    pub pad: [u8; 2],
}

impl Service6Key {
    pub const fn new(
        address: crate::Addr6,
        dport: u16,
        proto: u8,
        scope: u8,
        backend_slot: u16,
    ) -> Self {
        Self {
            address,
            dport,
            backend_slot,
            proto,
            scope,
            pad: [0; 2],
        }
    }

    pub const fn with_slot(&self, backend_slot: u16) -> Self {
        Self {
            backend_slot,
            ..*self
        }
    }
}

crate::user_pod!(Service4Key, Service6Key, ServiceValue);
