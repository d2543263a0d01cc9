//! Drop reasons and directions: one enum for kernel and user space.
//!
//! `LB_DROPS` is indexed by `reason as u32 * DIRECTIONS + direction`.

#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// The service has no active and no terminating backend.
    NoBackend = 1,
    /// Known service address, but not a port the service exposes.
    NoServicePort = 2,
    /// A backend slot names an id missing from the backends map.
    BackendMissing = 3,
    /// Recording the reverse translation for a socket failed.
    RevNatUpdateFailed = 4,
    /// A fragment addressed to a service frontend (ports are not in every fragment).
    Fragment = 5,
    /// Truncated or inconsistent headers on a packet to a service frontend.
    InvalidPacket = 6,
    /// No free source port for SNAT (collisions in LB4_CT).
    SnatPortsExhausted = 7,
    /// The conntrack table refused a new entry.
    CtFull = 8,
    /// No route to the backend (FIB lookup failed).
    FibLookupFailed = 9,
    /// No Maglev table for a service that asks for Maglev.
    MaglevMissing = 10,
}

impl DropReason {
    pub const ALL: [DropReason; 10] = [
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
