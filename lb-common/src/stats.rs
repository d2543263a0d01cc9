//! `LB_SVC_STATS`: traffic per frontend, counted by the programs on each
//! CPU (a per-CPU hash map keyed by service id), summed by `lbctl` and the
//! agent's metrics.
//!
//! The agent makes a frontend's entry with its reverse-NAT entry and
//! deletes it with it, so memory follows the frontends. The programs count
//! only frontends whose master entry carries `SVC_FLAG_STATS` (and the
//! flows those started, `CT_F_COUNTED`): with `--service-stats off` the
//! agent leaves the flag off and the programs do not even look the map up.

/// What the data path did for one frontend on one CPU, since the frontend
/// was created (counters never go back; a new frontend, even on an old
/// address, starts from zero: its id is new).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ServiceStats {
    /// Packet path (tc, XDP): packets of clients' flows to the frontend,
    /// the first included, as they are on the wire (a GRO-merged packet
    /// counts its segments). Replies are not counted.
    pub packets: u64,
    /// Their bytes, IP header included (the IP total length).
    pub bytes: u64,
    /// Packet path: flows the frontend started (a conntrack entry made).
    pub flows: u64,
    /// Socket path: connect() and unconnected sendmsg() calls the socket
    /// hooks sent to one of its backends.
    pub connects: u64,
}

impl ServiceStats {
    /// The sum of the CPUs' values.
    pub fn add(&mut self, other: &Self) {
        self.packets = self.packets.wrapping_add(other.packets);
        self.bytes = self.bytes.wrapping_add(other.bytes);
        self.flows = self.flows.wrapping_add(other.flows);
        self.connects = self.connects.wrapping_add(other.connects);
    }
}

crate::user_pod!(ServiceStats);
