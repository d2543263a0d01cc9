//! sessionAffinity: ClientIP.
//!
//! `LB_AFFINITY` (LRU, written by the programs) remembers which backend a
//! client last got for a service. In the socket load balancer the client is
//! the network namespace (its cookie): one pod, one client address, like
//! kube-proxy's per-source-IP affinity. On the packet path (tc, XDP) it is
//! the packet's source address.
//!
//! `LB_AFFINITY_MATCH` (written by the agent) holds (service, backend) for
//! every backend a service may currently select, so a remembered backend that
//! left the service, or turned terminating while others are ready, is never
//! reused (the idea of Cilium's lb_affinity_match map).

/// `AffinityKey::client` of a packet-path client: its IPv4 address (network
/// order) with this bit set. Network namespace cookies count up from 1 and
/// never reach it, so the two kinds of client cannot collide.
pub const CLIENT_IS_ADDRESS: u64 = 1 << 63;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AffinityKey {
    /// Client identity: the socket's network namespace cookie (socket
    /// hooks), or `CLIENT_IS_ADDRESS | source address` (tc and XDP, as
    /// kube-proxy's per-source-IP affinity).
    pub client: u64,
    pub service_id: u32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AffinityValue {
    pub backend_id: u32,
    pub pad: u32,
    /// bpf_ktime_get_ns() of the last use; the entry expires after the
    /// service's timeout without use.
    pub last_used_ns: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct AffinityMatchKey {
    pub service_id: u32,
    pub backend_id: u32,
}

crate::user_pod!(AffinityKey, AffinityValue, AffinityMatchKey);
