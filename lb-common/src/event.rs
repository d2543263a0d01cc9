//! Events sent from the programs to user space through the `LB_EVENTS` ring
//! buffer: drops always (rate-limited), translations when tracing is on.

pub const EVENT_DROP: u8 = 1;
pub const EVENT_TRACE: u8 = 2;

/// Which program raised the event.
pub const HOOK_CONNECT4: u8 = 1;
pub const HOOK_SENDMSG4: u8 = 2;
pub const HOOK_RECVMSG4: u8 = 3;
pub const HOOK_GETPEERNAME4: u8 = 4;
pub const HOOK_CONNECT6: u8 = 5;
pub const HOOK_SENDMSG6: u8 = 6;
pub const HOOK_RECVMSG6: u8 = 7;
pub const HOOK_GETPEERNAME6: u8 = 8;
pub const HOOK_TC_INGRESS: u8 = 9;
pub const HOOK_TC_EGRESS: u8 = 10;
pub const HOOK_XDP: u8 = 11;
/// tc on a pod-facing device (the host end of a pod's veth): packets from
/// the pod (ingress) and to it (egress).
pub const HOOK_TC_POD_INGRESS: u8 = 12;
pub const HOOK_TC_POD_EGRESS: u8 = 13;

pub const fn hook_name(hook: u8) -> &'static str {
    match hook {
        HOOK_CONNECT4 => "connect4",
        HOOK_SENDMSG4 => "sendmsg4",
        HOOK_RECVMSG4 => "recvmsg4",
        HOOK_GETPEERNAME4 => "getpeername4",
        HOOK_CONNECT6 => "connect6",
        HOOK_SENDMSG6 => "sendmsg6",
        HOOK_RECVMSG6 => "recvmsg6",
        HOOK_GETPEERNAME6 => "getpeername6",
        HOOK_TC_INGRESS => "tc-ingress",
        HOOK_TC_EGRESS => "tc-egress",
        HOOK_XDP => "xdp",
        HOOK_TC_POD_INGRESS => "tc-pod-ingress",
        HOOK_TC_POD_EGRESS => "tc-pod-egress",
        _ => "unknown",
    }
}

/// One event. Addresses are `Addr6`; IPv4 fills the first word. Ports and
/// addresses in network order, like the maps.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// bpf_ktime_get_ns() (CLOCK_MONOTONIC).
    pub ktime_ns: u64,
    /// Socket cookie (socket hooks), 0 otherwise.
    pub cookie: u64,
    /// `EVENT_*`.
    pub kind: u8,
    /// `HOOK_*`.
    pub hook: u8,
    pub proto: u8,
    /// 4 or 6.
    pub family: u8,
    /// `DropReason` for drops, 0 for traces.
    pub reason: u32,
    /// Thread group id of the process that made the call.
    pub pid: u32,
    pub service_id: u32,
    pub backend_id: u32,
    /// Source, when known (a bound socket, a packet).
    pub sport: u16,
    /// Original destination port.
    pub dport: u16,
    /// Translated destination port (traces).
    pub xport: u16,
    pub pad: u16,
    pub saddr: crate::Addr6,
    /// Original destination (the service address).
    pub daddr: crate::Addr6,
    /// Translated destination (the backend).
    pub xaddr: crate::Addr6,
    /// Name of the process (`comm`).
    pub comm: [u8; 16],
    /// The tail up to the 8-byte alignment, named (see `layout`).
    pub pad2: u32,
}

impl Event {
    pub const fn zeroed() -> Self {
        Self {
            ktime_ns: 0,
            cookie: 0,
            kind: 0,
            hook: 0,
            proto: 0,
            family: 0,
            reason: 0,
            pid: 0,
            service_id: 0,
            backend_id: 0,
            sport: 0,
            dport: 0,
            xport: 0,
            pad: 0,
            saddr: [0; 4],
            daddr: [0; 4],
            xaddr: [0; 4],
            comm: [0; 16],
            pad2: 0,
        }
    }
}

/// Size of `LB_EVENTS` in bytes (a power of two, as the kernel requires).
pub const EVENTS_RING_BYTES: u32 = 256 * 1024;

crate::user_pod!(Event);
