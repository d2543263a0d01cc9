//! `LB_CONFIG`: run-time settings the agent (or lbctl) writes and every
//! program reads, one `u32` per index.

/// aya-log level for the programs: 0 off, 1 error, 2 warn, 3 info, 4 debug, 5 trace.
/// Hot-path logs are debug; the default (warn) keeps them off.
pub const CFG_LOG_LEVEL: u32 = 0;
/// Non-zero: emit a trace event for every translation.
pub const CFG_TRACE: u32 = 1;
/// Events per second per CPU before rate limiting (drops and traces).
pub const CFG_EVENT_RATE: u32 = 2;

/// Non-zero: translate only sockets of the host network namespace (pods keep
/// the original service address, for meshes that need it), like Cilium's
/// socketLB.hostNamespaceOnly.
pub const CFG_HOST_NS_ONLY: u32 = 3;
/// The host network namespace cookie, low and high 32 bits.
pub const CFG_HOST_NETNS_COOKIE_LO: u32 = 4;
pub const CFG_HOST_NETNS_COOKIE_HI: u32 = 5;

/// `nodeport::MODE_*`.
pub const CFG_LB_MODE: u32 = 6;
/// Size M of the Maglev tables of masters whose `maglev_size` is 0 (written
/// by agents before each master named its own; set once, at the first
/// install, so that such tables keep the size they were built for).
pub const CFG_MAGLEV_M: u32 = 7;
/// SNAT source ports: [min, max].
pub const CFG_SNAT_PORT_MIN: u32 = 8;
pub const CFG_SNAT_PORT_MAX: u32 = 9;
/// Conntrack lifetimes in seconds (0: the default, `nodeport::CT_LIFETIME_*`):
/// established TCP, TCP before its handshake completed, closing TCP, others.
pub const CFG_CT_TCP_S: u32 = 10;
pub const CFG_CT_TCP_SYN_S: u32 = 11;
pub const CFG_CT_CLOSING_S: u32 = 12;
pub const CFG_CT_UDP_S: u32 = 13;
/// Non-zero: `LB4_FE_FILTER` holds every frontend, the packet programs may
/// let a packet whose bit is clear go early. The agent clears it before it
/// attaches programs and sets it once a full sync wrote the filter, so a
/// filter left stale by an older agent (or a fresh, empty one) is never
/// trusted.
pub const CFG_FRONTEND_FILTER: u32 = 14;
/// Every SNAT port range used since install, as one range that holds them
/// all: the lowest port in the high 16 bits, the highest in the low 16.
/// Conntrack entries outlive a restart, so a flow SNATed under an older,
/// other `--snat-port-range` still gets replies on its port: the packet
/// programs' early exit must not let those go.
pub const CFG_SNAT_PORTS_EVER: u32 = 15;

/// `CFG_SNAT_PORTS_EVER` widened by `[min, max]` (0: nothing recorded yet).
pub const fn snat_ports_ever(recorded: u32, min: u16, max: u16) -> u32 {
    if recorded == 0 {
        return (min as u32) << 16 | max as u32;
    }
    let (lo, hi) = ((recorded >> 16) as u16, recorded as u16);
    let lo = if min < lo { min } else { lo };
    let hi = if max > hi { max } else { hi };
    (lo as u32) << 16 | hi as u32
}

pub const CONFIG_SLOTS: u32 = 16;

pub const DEFAULT_LOG_LEVEL: u32 = 2;
pub const DEFAULT_EVENT_RATE: u32 = 1000;

/// `LB_COUNTERS`: per-CPU counters of things that are not drops.
pub const CNT_EVENTS_SENT: u32 = 0;
/// Events not sent because the CPU's rate limit was reached.
pub const CNT_EVENTS_RATE_LIMITED: u32 = 1;
/// Events lost because the ring buffer was full (no reader, or a slow one).
pub const CNT_EVENTS_LOST: u32 = 2;
/// Successful translations by socket hooks (connect/sendmsg).
pub const CNT_SOCK_TRANSLATIONS: u32 = 3;
/// Replies/getpeername rewritten back to the service address.
pub const CNT_SOCK_REVERSE: u32 = 4;
/// Packets forwarded by the tc / XDP programs to a backend (new or known flow).
pub const CNT_NP_FORWARD: u32 = 5;
/// Replies translated back by the tc programs.
pub const CNT_NP_REVERSE: u32 = 6;
/// New conntrack entries.
pub const CNT_CT_CREATED: u32 = 7;
/// DSR flows learned on a backend's node.
pub const CNT_DSR_LEARNED: u32 = 8;
/// ICMP errors the tc programs sent themselves ("fragmentation needed",
/// "time exceeded") for packets they could not forward.
pub const CNT_ICMP_SENT: u32 = 9;
/// ICMP errors about a translated flow, translated in turn (RFC 5508).
pub const CNT_ICMP_TRANSLATED: u32 = 10;
/// A SYN on a closing flow's tuple started a new flow.
pub const CNT_CT_REOPENED: u32 = 11;
/// Packets XDP handed to tc (a DSR option to add, a neighbour to resolve,
/// an ICMP error to send, a frame too big).
pub const CNT_XDP_PUNTED: u32 = 12;
/// Non-first IPv4 fragments that followed their first fragment's flow.
pub const CNT_FRAGMENTS: u32 = 13;
/// A SNAT port was taken over from a flow that had ended.
pub const CNT_SNAT_REUSED: u32 = 14;
/// IPv6 fragments the programs left to the stack untranslated (IPv6
/// fragments are not followed, unlike IPv4's): a fragmented datagram to a
/// frontend reaches the node's own stack instead of a backend.
pub const CNT_IPV6_FRAGMENTS_PASSED: u32 = 15;
/// FIB lookups (bpf_fib_lookup) of the tc and XDP programs: for packets
/// routed to or from remote backends (a flow's first packet on a CPU, then
/// about one a second, and every packet the per-CPU route cache could not
/// answer) and for the ICMP errors they forward.
pub const CNT_FIB_LOOKUPS: u32 = 16;
/// Connections of host processes whose tuple (node address and port, peer)
/// a SNAT flow already held: given another source port on their way out
/// (`CT_F_HOST`), as Linux NAT and Cilium do with a clashing host tuple.
pub const CNT_HOST_PORT_CLASHES: u32 = 17;

pub const COUNTER_SLOTS: u32 = 32;

pub const COUNTER_NAMES: [(u32, &str); 18] = [
    (CNT_EVENTS_SENT, "events_sent"),
    (CNT_EVENTS_RATE_LIMITED, "events_rate_limited"),
    (CNT_EVENTS_LOST, "events_lost"),
    (CNT_SOCK_TRANSLATIONS, "sock_translations"),
    (CNT_SOCK_REVERSE, "sock_reverse_translations"),
    (CNT_NP_FORWARD, "nodeport_forwarded"),
    (CNT_NP_REVERSE, "nodeport_reverse"),
    (CNT_CT_CREATED, "ct_created"),
    (CNT_DSR_LEARNED, "dsr_learned"),
    (CNT_ICMP_SENT, "icmp_errors_sent"),
    (CNT_ICMP_TRANSLATED, "icmp_errors_translated"),
    (CNT_CT_REOPENED, "ct_reopened"),
    (CNT_XDP_PUNTED, "xdp_punted_to_tc"),
    (CNT_FRAGMENTS, "fragments_followed"),
    (CNT_SNAT_REUSED, "snat_ports_reused"),
    (CNT_IPV6_FRAGMENTS_PASSED, "ipv6_fragments_passed"),
    (CNT_FIB_LOOKUPS, "fib_lookups"),
    (CNT_HOST_PORT_CLASHES, "host_port_clashes"),
];

/// Per-CPU token bucket of the event rate limiter (`LB_EVENT_RATE`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateState {
    pub last_ns: u64,
    /// Tokens scaled by 10^9 (token-nanoseconds), so refills need no division.
    pub budget: u64,
}

crate::user_pod!(RateState);

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent reads (and exports) only the counters named here: every
    /// index up to the last one the programs bump has its name, once.
    #[test]
    fn every_counter_the_programs_bump_has_a_name_the_agent_reads() {
        for (i, (index, name)) in COUNTER_NAMES.iter().enumerate() {
            assert_eq!(*index, i as u32, "{name}: names in index order, no gaps");
        }
        assert_eq!(
            COUNTER_NAMES.len() as u32,
            CNT_HOST_PORT_CLASHES + 1,
            "the last counter"
        );
        assert!(COUNTER_NAMES.len() as u32 <= COUNTER_SLOTS);
    }

    #[test]
    fn the_snat_ports_ever_used_only_widen() {
        let r = snat_ports_ever(0, 32768, 65535);
        assert_eq!((r >> 16, r & 0xffff), (32768, 65535));
        let r = snat_ports_ever(r, 20000, 30000);
        assert_eq!((r >> 16, r & 0xffff), (20000, 65535));
        assert_eq!(snat_ports_ever(r, 40000, 50000), r, "inside: unchanged");
    }
}
