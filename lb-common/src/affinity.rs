//! sessionAffinity: ClientIP.
//!
//! `LB_AFFINITY` (LRU, written by the programs) remembers which backend a
//! client last got for a service. In the socket load balancer the client is
//! the network namespace (its cookie): one pod, one client address, like
//! kube-proxy's per-source-IP affinity.
//!
//! `LB_AFFINITY_MATCH` (written by the agent) holds (service, backend) for
//! every backend a service may currently select, so a remembered backend that
//! left the service, or turned terminating while others are ready, is never
//! reused (the idea of Cilium's lb_affinity_match map).

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AffinityKey {
    /// Client identity: the socket's network namespace cookie.
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
