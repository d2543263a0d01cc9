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

/// The client of a packet from an IPv4 source (network byte order): the
/// programs' key, and `lbctl trace`'s to find it.
#[inline(always)]
pub const fn address_client4(saddr: u32) -> u64 {
    CLIENT_IS_ADDRESS | saddr as u64
}

/// The client of a packet from an IPv6 source: the address folded to the
/// 63 bits below `CLIENT_IS_ADDRESS`.
#[inline(always)]
pub const fn address_client6(saddr: crate::Addr6) -> u64 {
    let hi = (saddr[0] ^ saddr[2]) as u64;
    let lo = (saddr[1] ^ saddr[3]) as u64;
    CLIENT_IS_ADDRESS | ((hi << 32 | lo) & !CLIENT_IS_ADDRESS)
}

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
