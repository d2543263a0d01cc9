//! Drop reasons and directions: one enum for kernel and user space.
//!
//! `LB_DROPS` is indexed by `reason as u32 * DIRECTIONS + direction`.

#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// The service has no active and no terminating backend. A connect()
    /// gets ECONNREFUSED; a packet from outside or from a pod gets an ICMP
    /// port unreachable back (kube-proxy's REJECT).
    NoBackend = 1,
    /// Known service address, but not a port the service exposes.
    NoServicePort = 2,
    /// A backend slot names an id missing from the backends map.
    BackendMissing = 3,
    /// Recording the reverse translation for a socket failed.
    RevNatUpdateFailed = 4,
    /// A non-first fragment to a service frontend whose first fragment (the
    /// one with the ports) was not seen.
    Fragment = 5,
    /// Truncated or inconsistent headers on a packet to a service frontend.
    InvalidPacket = 6,
    /// No free source port for SNAT: every port tried belongs to a live flow
    /// to the same backend.
    SnatPortsExhausted = 7,
    /// The conntrack table refused a new entry (LB4_CT is an LRU hash: it
    /// evicts instead, so this only counts kernel allocation failures).
    CtFull = 8,
    /// No route to the backend (FIB lookup failed).
    FibLookupFailed = 9,
    /// No Maglev table for a service that asks for Maglev.
    MaglevMissing = 10,
    /// Too big for the path to the backend (or back to the client). With DF
    /// set, an ICMP "fragmentation needed" went back to the sender.
    FragNeeded = 11,
    /// TTL ran out on a packet this node would forward; an ICMP "time
    /// exceeded" went back to the sender.
    TtlExceeded = 12,
    /// A DSR option naming a frontend this node does not serve, or one that
    /// would take over a live flow: not learned.
    DsrRejected = 13,
    /// externalTrafficPolicy: Local and no endpoint on this node while other
    /// nodes have some: dropped, as kube-proxy does ("has no local
    /// endpoints"); the load balancer's health check steers around the node.
    NoLocalBackend = 14,
    /// A new flow to a LoadBalancer frontend from a source outside its
    /// loadBalancerSourceRanges (kube-proxy's KUBE-FW DROP).
    SourceRange = 15,
}

impl DropReason {
    pub const ALL: [DropReason; 15] = [
        DropReason::NoBackend,
        DropReason::NoServicePort,
        DropReason::BackendMissing,
        DropReason::RevNatUpdateFailed,
        DropReason::Fragment,
        DropReason::InvalidPacket,
        DropReason::SnatPortsExhausted,
        DropReason::CtFull,
        DropReason::FibLookupFailed,
        DropReason::MaglevMissing,
        DropReason::FragNeeded,
        DropReason::TtlExceeded,
        DropReason::DsrRejected,
        DropReason::NoLocalBackend,
        DropReason::SourceRange,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            DropReason::NoBackend => "no-backend",
            DropReason::NoServicePort => "no-service-port",
            DropReason::BackendMissing => "backend-missing",
            DropReason::RevNatUpdateFailed => "revnat-update-failed",
            DropReason::Fragment => "fragment",
            DropReason::InvalidPacket => "invalid-packet",
            DropReason::SnatPortsExhausted => "snat-ports-exhausted",
            DropReason::CtFull => "ct-full",
            DropReason::FibLookupFailed => "fib-lookup-failed",
            DropReason::MaglevMissing => "maglev-missing",
            DropReason::FragNeeded => "frag-needed",
            DropReason::TtlExceeded => "ttl-exceeded",
            DropReason::DsrRejected => "dsr-rejected",
            DropReason::NoLocalBackend => "no-local-backend",
            DropReason::SourceRange => "source-range",
        }
    }

    pub fn from_u32(v: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|r| *r as u32 == v)
    }
}

/// Where the dropped traffic was going.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// Leaving a local socket (connect, sendmsg) or a device.
    Egress = 0,
    /// Arriving at the node or a local socket.
    Ingress = 1,
}

impl Direction {
    pub const ALL: [Direction; 2] = [Direction::Egress, Direction::Ingress];

    pub const fn name(self) -> &'static str {
        match self {
            Direction::Egress => "egress",
            Direction::Ingress => "ingress",
        }
    }
}

pub const DIRECTIONS: u32 = 2;
/// Capacity of `LB_DROPS`: room for reasons added later without a layout bump.
pub const DROP_SLOTS: u32 = 64;

pub const fn drop_index(reason: DropReason, direction: Direction) -> u32 {
    reason as u32 * DIRECTIONS + direction as u32
}
