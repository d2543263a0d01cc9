//! North-south data path: traffic entering the node for NodePort,
//! LoadBalancer and external-IP frontends (tc and XDP programs): how a flow
//! to a remote backend is forwarded, the DSR options, and the flow hash
//! that picks a Maglev slot. Its conntrack is `crate::conntrack`, its
//! devices `crate::devices`, its fragments `crate::fragments`.

/// How traffic to a remote backend is forwarded (`LB_CONFIG[CFG_LB_MODE]`).
pub const MODE_SNAT: u32 = 0;
/// Direct server return: the client's address is kept and the backend's node
/// replies straight to the client from the service address.
pub const MODE_DSR: u32 = 1;
/// DSR for TCP, SNAT for UDP (UDP DSR would add the option to every datagram).
pub const MODE_HYBRID: u32 = 2;

/// How a DSR flow's frontend reaches the backend's node (`--dsr-dispatch`),
/// kept in `LB_CONFIG[CFG_LB_MODE]` above the mode (bits 8-15: the
/// config array has no free slot, and growing it would change the pinned
/// layout). `option`: the IPv4 option / IPv6 destination option on the
/// packet itself. `ipip`: the same packet, option and all, inside an outer
/// IPv4 (IPIP) or IPv6 (IP6IP6) header from this node to the backend, for
/// fabrics that drop IPv4 options or IPv6 extension headers: they see the
/// outer header only. Only the packets that carry the option (a TCP SYN,
/// every UDP datagram) are encapsulated; the others of the flow are plain.
pub const DSR_DISPATCH_OPTION: u32 = 0;
pub const DSR_DISPATCH_IPIP: u32 = 1;
const DSR_DISPATCH_SHIFT: u32 = 8;

/// `LB_CONFIG[CFG_LB_MODE]`: the mode and the DSR dispatch.
#[inline(always)]
pub const fn lb_mode_word(mode: u32, dispatch: u32) -> u32 {
    (mode & 0xff) | (dispatch & 0xff) << DSR_DISPATCH_SHIFT
}

/// The mode (`MODE_*`) of a `CFG_LB_MODE` word.
#[inline(always)]
pub const fn mode_of(word: u32) -> u32 {
    word & 0xff
}

/// The DSR dispatch (`DSR_DISPATCH_*`) of a `CFG_LB_MODE` word.
#[inline(always)]
pub const fn dsr_dispatch_of(word: u32) -> u32 {
    (word >> DSR_DISPATCH_SHIFT) & 0xff
}

/// The outer header of `DSR_DISPATCH_IPIP`: IPv4 (protocol 4, RFC 2003)
/// and IPv6 (next header 41, RFC 2473), no options.
pub const IPIP_HLEN: u8 = 20;
pub const IP6IP6_HLEN: u8 = 40;
pub const IPPROTO_IPIP: u8 = 4;
pub const IPPROTO_IPV6: u8 = 41;

/// IPv4 option carrying the service address to the backend's node in DSR
/// mode: copied flag set (RFC 791, so fragments keep it), class 0, number 26
/// (unassigned), like Cilium's DSR option. Length 8: type, length, port, address.
pub const DSR_OPT_TYPE: u8 = 0x80 | 0x1a;
pub const DSR_OPT_LEN: u8 = 8;

/// IPv6 DSR: a Destination Options header (next header 60) right after the
/// IPv6 header, holding one option of this type with the frontend's port
/// and address, like Cilium's (same type, DSR_IPV6_OPT_TYPE; Cilium puts
/// the address before the port: the two do not interoperate). The type's top two
/// bits are 00: a node that does not know it skips it (RFC 8200 §4.2), so
/// a backend's node without our programs still delivers the packet. Layout
/// (24 bytes): next header, length 2 ((2 + 1) × 8), type, length 20, port,
/// 2 bytes of padding, address.
pub const DSR6_OPT_TYPE: u8 = 0x1b;
pub const DSR6_OPT_LEN: u8 = 20;
pub const DSR6_HDR_LEN: u8 = 24;

/// Seed of the flow hash; part of the contract between nodes: every node must
/// use the same one, so a flow maps to the same Maglev slot everywhere.
pub const FLOW_HASH_SEED: u32 = 0x6c62_2d31; // "lb-1"

/// Hash of a flow for Maglev, identical in the programs and in user space
/// (tests compute the expected backend with it). The mixing is the
/// finalizer of MurmurHash3 (Appleby), applied to each word in turn.
#[inline(always)]
pub const fn flow_hash(saddr: u32, daddr: u32, sport: u16, dport: u16, proto: u8) -> u32 {
    let mut h = FLOW_HASH_SEED;
    h = mix(h ^ saddr);
    h = mix(h ^ daddr);
    h = mix(h ^ ((sport as u32) << 16 | dport as u32));
    mix(h ^ proto as u32)
}

/// `flow_hash` for IPv6: every word of both addresses goes through the mix.
#[inline(always)]
pub const fn flow_hash6(
    saddr: crate::Addr6,
    daddr: crate::Addr6,
    sport: u16,
    dport: u16,
    proto: u8,
) -> u32 {
    let mut h = FLOW_HASH_SEED;
    let mut i = 0;
    while i < 4 {
        h = mix(h ^ saddr[i]);
        i += 1;
    }
    i = 0;
    while i < 4 {
        h = mix(h ^ daddr[i]);
        i += 1;
    }
    h = mix(h ^ ((sport as u32) << 16 | dport as u32));
    mix(h ^ proto as u32)
}

#[inline(always)]
const fn mix(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}
