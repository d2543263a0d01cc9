//! The north-south data path's conntrack (`LB4_CT`, `LB6_CT`): what an
//! entry holds, how long it lives, and the backends' generation it checks.

/// `LB4_CT` entry kinds (part of the key).
/// A flow from a client to a service frontend, as it arrives.
pub const CT_SERVICE: u8 = 1;
/// A reply that must be translated back: from a local backend, to a SNAT
/// port, or (on a backend's node, with `CT_F_DSR`) a pod's reply to a DSR client.
pub const CT_REVERSE: u8 = 2;

/// `Ct4Value::flags`
pub const CT_F_SNAT: u16 = 1 << 0;
pub const CT_F_DSR: u16 = 1 << 1;
pub const CT_F_LOCAL: u16 = 1 << 2;
/// FIN or RST seen: the entry lives only a short while longer, and a SYN
/// on the same tuple starts a new flow (Cilium's `ct_reset_closing`).
pub const CT_F_CLOSING: u16 = 1 << 3;
/// A TCP packet other than a SYN was seen: the flow got past its handshake
/// and lives `CT_LIFETIME_TCP`, not `CT_LIFETIME_TCP_SYN`.
pub const CT_F_ESTABLISHED: u16 = 1 << 4;
/// With `CT_F_SNAT`: a connection of this node's own (a host process)
/// whose tuple a SNAT flow already held, moved to another source port
/// (`packet::host_flow`). The forward entry is keyed by the host's tuple
/// (node:port → peer), the reverse one by the port it was given.
pub const CT_F_HOST: u16 = 1 << 5;
/// With `CT_F_DSR`: the packets that carry the DSR option go inside an
/// outer header to the backend (`DSR_DISPATCH_IPIP`); `nat_addr` holds the
/// outer source (this node's address on the route's device).
pub const CT_F_DSR_ENCAP: u16 = 1 << 6;
/// `CT_SERVICE`: the frontend counted its traffic when the flow started
/// (`SVC_FLAG_STATS`): its packets are counted in `LB_SVC_STATS` under
/// `service_id` without looking the frontend up again.
pub const CT_F_COUNTED: u16 = 1 << 7;

/// Default lifetimes of conntrack entries without traffic, in seconds (the
/// agent can change them: `LB_CONFIG[CFG_CT_*]`). The values are Cilium's
/// (bpf/lib/conntrack.h): an established TCP flow 6 h, a handshake that
/// never completed 60 s, a closing flow 10 s, anything else 60 s.
pub const CT_LIFETIME_TCP: u32 = 21_600;
pub const CT_LIFETIME_TCP_SYN: u32 = 60;
pub const CT_LIFETIME_CLOSING: u32 = 10;
pub const CT_LIFETIME_UDP: u32 = 60;
/// A SNAT port whose flow is closing may go to a new flow once the old one
/// has been quiet this long: long enough for its last ACK to pass, much
/// shorter than the closing lifetime, so short connections do not run the
/// port range dry.
pub const SNAT_REUSE_CLOSING_NS: u64 = 1_000_000_000;

/// Which lifetime an entry with these flags lives by: the index of its
/// setting (`LB_CONFIG[CFG_CT_*_S]`, 0 = the default) and the default. The
/// programs read that one setting only (a config read is about fifteen
/// instructions on every packet of every flow).
#[inline(always)]
pub const fn ct_lifetime_setting(proto: u8, flags: u16) -> (u32, u32) {
    use crate::config::{CFG_CT_CLOSING_S, CFG_CT_TCP_S, CFG_CT_TCP_SYN_S, CFG_CT_UDP_S};
    if flags & CT_F_CLOSING != 0 {
        (CFG_CT_CLOSING_S, CT_LIFETIME_CLOSING)
    } else if proto == crate::proto::TCP {
        if flags & CT_F_ESTABLISHED != 0 {
            (CFG_CT_TCP_S, CT_LIFETIME_TCP)
        } else {
            (CFG_CT_TCP_SYN_S, CT_LIFETIME_TCP_SYN)
        }
    } else {
        (CFG_CT_UDP_S, CT_LIFETIME_UDP)
    }
}

/// The lifetime, in seconds, of an entry with these flags, given the
/// configured values (0 = the default).
#[inline(always)]
pub const fn ct_lifetime_s(proto: u8, flags: u16, cfg: &CtTimeouts) -> u32 {
    use crate::config::{CFG_CT_CLOSING_S, CFG_CT_TCP_S, CFG_CT_TCP_SYN_S};
    let (setting, default) = ct_lifetime_setting(proto, flags);
    let v = match setting {
        CFG_CT_CLOSING_S => cfg.closing,
        CFG_CT_TCP_S => cfg.tcp,
        CFG_CT_TCP_SYN_S => cfg.tcp_syn,
        _ => cfg.udp,
    };
    if v == 0 {
        default
    } else {
        v
    }
}

/// Conntrack lifetimes as configured (seconds; 0 = the default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtTimeouts {
    pub tcp: u32,
    pub tcp_syn: u32,
    pub closing: u32,
    pub udp: u32,
}

/// Conntrack key: the tuple as seen on the wire in one direction. `A` is
/// the address: `u32` for IPv4 (`LB4_CT`), `Addr6` for IPv6 (`LB6_CT`),
/// both in network byte order as on the wire, so one generic body in the
/// programs serves both families.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct CtKey<A> {
    /// Network byte order.
    pub saddr: A,
    pub daddr: A,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    /// `CT_*`
    pub kind: u8,
    pub pad: [u8; 2],
}

pub type Ct4Key = CtKey<u32>;
pub type Ct6Key = CtKey<crate::Addr6>;

impl<A: Copy> CtKey<A> {
    /// Addresses and ports in network byte order, as on the wire.
    #[inline(always)]
    pub const fn new(saddr: A, daddr: A, sport: u16, dport: u16, proto: u8, kind: u8) -> Self {
        Self {
            saddr,
            daddr,
            sport,
            dport,
            proto,
            kind,
            pad: [0; 2],
        }
    }
}

/// Conntrack value. For `CT_SERVICE`: where the flow goes (`addr`/`port`:
/// the backend; `nat_addr`/`nat_port`: the SNAT source, when `CT_F_SNAT`).
/// For `CT_REVERSE`: what a reply's source (`addr`/`port`) and,
/// for SNAT, destination (`nat_addr`/`nat_port`: the client) become.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct CtValue<A> {
    pub backend_id: u32,
    pub service_id: u32,
    pub addr: A,
    pub nat_addr: A,
    pub port: u16,
    pub nat_port: u16,
    pub flags: u16,
    /// `CT_SERVICE`: the low 16 bits of `LB_BACKENDS_GEN` when this entry's
    /// backend was last seen in the backends map. While the generation has
    /// not moved, no backend has been deleted since, and the programs skip
    /// looking it up again (0 elsewhere).
    pub backends_gen: u16,
    pub last_seen_ns: u64,
}

/// The backends' generation after `g`: one more, skipping values whose low
/// 16 bits are 0. A conntrack entry keeps those 16 bits (`backends_gen`),
/// and 0 there means "never checked" (an entry from an agent before the
/// generation existed, or any entry that is not `CT_SERVICE`), which must
/// never pass for the current generation.
#[inline(always)]
pub const fn next_backends_gen(g: u32) -> u32 {
    let n = g.wrapping_add(1);
    if n as u16 == 0 {
        n.wrapping_add(1)
    } else {
        n
    }
}

pub type Ct4Value = CtValue<u32>;
pub type Ct6Value = CtValue<crate::Addr6>;

crate::user_pod!(Ct4Key, Ct4Value, Ct6Key, Ct6Value);
