//! Parsing a packet into the flow the packet programs act on: `parse4`
//! for IPv4, `parse6` for IPv6, one `Flow` for both.
use lb_common::Addr6;
use lb_common::{
    conntrack::CtKey,
    nodeport::{DSR6_HDR_LEN, DSR6_OPT_LEN, DSR6_OPT_TYPE, DSR_OPT_LEN, DSR_OPT_TYPE},
};

use super::{access::*, family::Ip};

/// Where a packet sits in an IPv4 datagram.
pub const FRAG_NONE: u8 = 0;
/// The first fragment: it has the L4 header.
pub const FRAG_FIRST: u8 = 1;
/// A later fragment: no L4 header; its ports come from `LB4_FRAGS`.
pub const FRAG_LATER: u8 = 2;

/// The packet an ICMP or ICMPv6 error quotes (RFC 792, RFC 4443: its IP
/// header and at least the first 8 bytes of its payload, so the ports).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Quoted<I: Ip> {
    pub saddr: I::Addr,
    pub daddr: I::Addr,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub icmp_type: u8,
    pub icmp_code: u8,
    /// The quoted IP header's length in bytes (IPv4 20..60, IPv6 40).
    pub ip_len: usize,
}

/// What the programs need of a TCP/UDP packet (or an ICMPv4 error about
/// one). Lives in the per-CPU scratch map, not on the stack.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Flow<I: Ip> {
    pub saddr: I::Addr,
    pub daddr: I::Addr,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub tcp_flags: u8,
    pub ttl: u8,
    /// `FRAG_*`.
    pub frag: u8,
    /// Don't Fragment is set.
    pub df: bool,
    /// IP header length in bytes (IPv4: 20..60; IPv6: 40).
    pub ip_len: usize,
    /// L4 header length (TCP data offset, 8 for UDP): with the GSO size it
    /// gives the size of each segment on the wire.
    pub l4_len: usize,
    /// The L3 length: IPv4 total length, IPv6 40 + payload length.
    pub tot_len: u16,
    /// Identification, network byte order.
    pub ip_id: u16,
    /// The DSR option (frontend address and port) when the packet carries
    /// it (`dsr_port` != 0). Plain fields, not an Option: LLVM stores an
    /// Option's payload even when it is None, from a register the verifier
    /// knows is unset (R3 !read_ok).
    pub dsr_addr: I::Addr,
    pub dsr_port: u16,
    /// For an ICMP error: the packet it quotes.
    pub quoted: Quoted<I>,
}

impl<I: Ip> Flow<I> {
    /// Offset of the L4 header. Masked: the flow lives in a map value, which
    /// the verifier treats as any number, and a packet offset must be bounded.
    #[inline(always)]
    pub fn l4(&self) -> usize {
        ETH_HLEN + (self.ip_len & I::IP_LEN_MASK)
    }

    /// Offset of the quoted IP header inside an ICMP error.
    #[inline(always)]
    pub fn quoted_ip(&self) -> usize {
        self.l4() + ICMP_HLEN
    }

    /// Offset of the quoted L4 header inside an ICMP error.
    #[inline(always)]
    pub fn quoted_l4(&self) -> usize {
        self.quoted_ip() + (self.quoted.ip_len & 0x3c)
    }

    /// The conntrack key of this packet's tuple, as it was seen.
    #[inline(always)]
    pub fn ct_key(&self, kind: u8) -> CtKey<I::Addr> {
        CtKey::new(
            self.saddr, self.daddr, self.sport, self.dport, self.proto, kind,
        )
    }

    /// The conntrack key of the tuple going the other way (its reply).
    #[inline(always)]
    pub fn reply_ct_key(&self, kind: u8) -> CtKey<I::Addr> {
        CtKey::new(
            self.daddr, self.saddr, self.dport, self.sport, self.proto, kind,
        )
    }

    /// Whether the L4 header is in this packet (not a later fragment).
    #[inline(always)]
    pub fn has_l4(&self) -> bool {
        self.frag != FRAG_LATER
    }

    /// The conntrack key of the reply to the quoted packet: the flow an ICMP
    /// error is about, seen from the other end.
    #[inline(always)]
    pub fn quoted_reply_key(&self, kind: u8) -> CtKey<I::Addr> {
        let q = &self.quoted;
        CtKey::new(q.daddr, q.saddr, q.dport, q.sport, q.proto, kind)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// Not TCP/UDP, or headers we leave to the stack.
    Other,
    /// IPv4 TCP/UDP with readable ports (or a first fragment).
    Flow,
    /// A later fragment: addresses and protocol known, ports not yet.
    LaterFragment,
    /// An ICMP destination unreachable, time exceeded or parameter problem
    /// quoting a TCP or UDP packet (`Flow::quoted`).
    IcmpError,
    /// The IP header is sound but the L4 header is cut short or the lengths
    /// disagree; `true` when the ports could be read.
    Invalid(bool),
}

/// Written as straight-line code with an early return per field: aggregate
/// temporaries (an Option of a tuple) let LLVM mix packet pointers into
/// integer arithmetic, which the verifier rejects.
#[inline(always)]
pub fn parse4<P: Pkt>(p: &P, f: &mut Flow<crate::select::V4>) -> Parsed {
    let Some(eth_proto) = load::<u16, P>(p, 12) else {
        return Parsed::Other;
    };
    // A VLAN-tagged frame (XDP sees the tag; tc usually gets it stripped and
    // checks skb->vlan_present) belongs to the VLAN device: left alone.
    if eth_proto != ETH_P_IP.to_be() {
        return Parsed::Other;
    }
    let ip = ETH_HLEN;
    let Some(vihl) = load::<u8, P>(p, ip) else {
        return Parsed::Other;
    };
    if vihl >> 4 != 4 {
        return Parsed::Other;
    }
    let ip_len = ((vihl & 0x0f) as usize) * 4;
    if ip_len < 20 {
        return Parsed::Other; // the stack drops a broken IP header itself
    }
    let Some(l4proto) = load::<u8, P>(p, ip + IP_PROTO) else {
        return Parsed::Other;
    };
    if l4proto != IPPROTO_TCP && l4proto != IPPROTO_UDP && l4proto != IPPROTO_ICMP {
        return Parsed::Other;
    }
    let Some(saddr) = load::<u32, P>(p, ip + IP_SADDR) else {
        return Parsed::Other;
    };
    let Some(daddr) = load::<u32, P>(p, ip + IP_DADDR) else {
        return Parsed::Other;
    };
    let Some(tot_len) = load::<u16, P>(p, ip + IP_TOT_LEN) else {
        return Parsed::Other;
    };
    let Some(frag_off) = load::<u16, P>(p, ip + IP_FRAG_OFF) else {
        return Parsed::Other;
    };
    let Some(ip_id) = load::<u16, P>(p, ip + IP_ID) else {
        return Parsed::Other;
    };
    let Some(ttl) = load::<u8, P>(p, ip + IP_TTL) else {
        return Parsed::Other;
    };
    let tot_len = u16::from_be(tot_len);
    let fragment = frag_off & IP_MF_OR_OFFSET != 0;
    let first = frag_off & IP_OFFSET == 0;
    // Field by field, `quoted` left as it is: only an ICMP error's parse
    // reads it, and writes it first. A whole-struct write zeroes it and the
    // padding through byte-wise memset calls on every packet.
    f.saddr = saddr;
    f.daddr = daddr;
    f.sport = 0;
    f.dport = 0;
    f.proto = l4proto;
    f.tcp_flags = 0;
    f.ttl = ttl;
    f.frag = if !fragment {
        FRAG_NONE
    } else if first {
        FRAG_FIRST
    } else {
        FRAG_LATER
    };
    f.df = frag_off & IP_DF != 0;
    f.ip_len = ip_len;
    f.l4_len = 0;
    f.tot_len = tot_len;
    f.ip_id = ip_id;
    f.dsr_addr = 0;
    f.dsr_port = 0;
    if ip_len > 20 {
        dsr_option(p, ip, f);
    }
    if l4proto == IPPROTO_ICMP {
        if fragment {
            return Parsed::Other;
        }
        return parse_icmp_error(p, f);
    }
    if fragment && !first {
        return Parsed::LaterFragment;
    }
    let l4 = ip + ip_len;
    let (Some(sp), Some(dp)) = (
        load::<u16, P>(p, l4 + L4_SPORT),
        load::<u16, P>(p, l4 + L4_DPORT),
    ) else {
        return Parsed::Invalid(false);
    };
    f.sport = sp;
    f.dport = dp;
    l4_fields(p, f, l4, tot_len as usize, ip_len)
}

/// The L4 part both families share: lengths checked against the packet,
/// TCP flags and header length.
#[inline(always)]
fn l4_fields<P: Pkt, I: Ip>(
    p: &P,
    f: &mut Flow<I>,
    l4: usize,
    tot_len: usize,
    ip_len: usize,
) -> Parsed {
    let l4_min = if f.proto == IPPROTO_TCP { 20 } else { 8 };
    // Headers must be directly readable; the IP length must fit the whole
    // packet (linear part and fragments). Only comparisons with the packet
    // end: the verifier forbids arithmetic on it.
    if p.data() + l4 + l4_min > p.data_end()
        || tot_len < ip_len + l4_min
        || !p.covers(ETH_HLEN + tot_len)
    {
        return Parsed::Invalid(true);
    }
    if f.proto == IPPROTO_TCP {
        f.tcp_flags = load::<u8, P>(p, l4 + TCP_FLAGS).unwrap_or(0);
        let doff = load::<u8, P>(p, l4 + TCP_DOFF).unwrap_or(0x50);
        f.l4_len = ((doff >> 4) as usize) * 4;
    } else {
        f.l4_len = 8;
    }
    Parsed::Flow
}

/// An IPv6 packet whose next header is TCP or UDP (after our DSR header, on
/// a backend's node), or an ICMPv6 error about such a packet. Anything else
/// goes to the stack untouched (`Other`): other extension headers
/// (fragments included, counted: a fragmented IPv6 datagram to a frontend
/// is reassembled by the stack, not translated here), the rest of ICMPv6
/// (neighbour discovery above all), and a payload length of 0 (a
/// jumbogram, RFC 2675).
#[inline(always)]
pub fn parse6<P: Pkt>(p: &P, f: &mut Flow<crate::select::V6>) -> Parsed {
    let Some(eth_proto) = load::<u16, P>(p, 12) else {
        return Parsed::Other;
    };
    if eth_proto != ETH_P_IPV6.to_be() {
        return Parsed::Other;
    }
    let ip = ETH_HLEN;
    let Some(vtc) = load::<u8, P>(p, ip) else {
        return Parsed::Other;
    };
    if vtc >> 4 != 6 {
        return Parsed::Other;
    }
    let Some(mut next) = load::<u8, P>(p, ip + IP6_NEXT_HEADER) else {
        return Parsed::Other;
    };
    // Our DSR header (on a backend's node): the one extension header read.
    let mut ip_len = IPV6_HLEN;
    let mut dsr_port = 0;
    // Written into the flow here, not through a zeroed local: LLVM merges
    // the zeroing of a 16-byte array into a memset, and the BPF backend
    // emits that as a call to a byte-by-byte subprogram (on every IPv6
    // packet). Volatile stores are never merged.
    for w in &mut f.dsr_addr {
        // SAFETY: a word of the flow we hold by reference.
        unsafe { core::ptr::write_volatile(w, 0) };
    }
    if next == IPPROTO_DSTOPTS {
        // The header and the TCP header after it must be directly readable
        // (tc pulled only what a packet without it needs).
        p.pull(ip + IPV6_HLEN + DSR6_HDR_LEN as usize + 20);
        let l = ip + IPV6_HLEN;
        let (Some(hdr), Some(port)) = (load::<[u8; 4], P>(p, l), load::<u16, P>(p, l + 4)) else {
            return Parsed::Other;
        };
        if hdr[1] != 2 || hdr[2] != DSR6_OPT_TYPE || hdr[3] != DSR6_OPT_LEN || port == 0 {
            return Parsed::Other;
        }
        next = hdr[0];
        ip_len += DSR6_HDR_LEN as usize;
        dsr_port = port;
        // Word by word, as above (a whole-array copy became a memmove call).
        for (i, w) in f.dsr_addr.iter_mut().enumerate() {
            let Some(a) = load::<u32, P>(p, l + 8 + 4 * i) else {
                return Parsed::Other;
            };
            // SAFETY: a word of the flow we hold by reference.
            unsafe { core::ptr::write_volatile(w, a) };
        }
    }
    if next != IPPROTO_TCP && next != IPPROTO_UDP && next != IPPROTO_ICMPV6 {
        if next == IPPROTO_FRAGMENT {
            crate::runtime::bump(lb_common::config::CNT_IPV6_FRAGMENTS_PASSED);
        }
        return Parsed::Other;
    }
    let Some(payload) = load::<u16, P>(p, ip + IP6_PAYLOAD_LEN) else {
        return Parsed::Other;
    };
    let (Some(saddr), Some(daddr)) = (load::<Addr6, P>(p, ip + 8), load::<Addr6, P>(p, ip + 24))
    else {
        return Parsed::Other;
    };
    let Some(hop) = load::<u8, P>(p, ip + IP6_HOP_LIMIT) else {
        return Parsed::Other;
    };
    let payload = u16::from_be(payload) as usize;
    if payload == 0 {
        return Parsed::Other;
    }
    let tot_len = IPV6_HLEN + payload;
    // Field by field, as in `parse4`.
    f.saddr = saddr;
    f.daddr = daddr;
    f.sport = 0;
    f.dport = 0;
    f.proto = next;
    f.tcp_flags = 0;
    f.ttl = hop;
    f.frag = FRAG_NONE;
    // IPv6 routers never fragment (RFC 8200 §5): every packet is DF.
    f.df = true;
    f.ip_len = ip_len;
    f.l4_len = 0;
    f.tot_len = if tot_len > 0xffff {
        0xffff
    } else {
        tot_len as u16
    };
    f.ip_id = 0;
    f.dsr_port = dsr_port;
    if next == IPPROTO_ICMPV6 {
        if dsr_port != 0 {
            return Parsed::Other;
        }
        return parse_icmp6_error(p, f);
    }
    let l4 = ip + (ip_len & 0x7c);
    let (Some(sp), Some(dp)) = (
        load::<u16, P>(p, l4 + L4_SPORT),
        load::<u16, P>(p, l4 + L4_DPORT),
    ) else {
        return Parsed::Invalid(false);
    };
    f.sport = sp;
    f.dport = dp;
    // IPv6 makes the UDP checksum mandatory: a receiver discards a zero one
    // (RFC 8200 §8.1), so such a datagram is broken, not a flow to set up.
    if next == IPPROTO_UDP && load::<u16, P>(p, l4 + UDP_CHECK) == Some(0) {
        return Parsed::Invalid(true);
    }
    l4_fields(p, f, l4, tot_len, ip_len)
}

/// An ICMP error quoting a TCP or UDP packet; anything else (echo, errors
/// about other protocols) is left to the stack.
#[inline(always)]
fn parse_icmp_error<P: Pkt>(p: &P, f: &mut Flow<crate::select::V4>) -> Parsed {
    let icmp = f.l4();
    // The quoted headers may sit beyond the linear part of an skb.
    p.pull(icmp + ICMP_HLEN + 60 + 8);
    let Some(ty) = load::<u8, P>(p, icmp + ICMP_TYPE) else {
        return Parsed::Other;
    };
    if ty != ICMP_DEST_UNREACH && ty != ICMP_TIME_EXCEEDED && ty != ICMP_PARAMETER_PROB {
        return Parsed::Other;
    }
    let Some(code) = load::<u8, P>(p, icmp + 1) else {
        return Parsed::Other;
    };
    let q = icmp + ICMP_HLEN;
    let Some(vihl) = load::<u8, P>(p, q) else {
        return Parsed::Other;
    };
    let qlen = ((vihl & 0x0f) as usize) * 4;
    if vihl >> 4 != 4 || qlen < 20 {
        return Parsed::Other;
    }
    let Some(qproto) = load::<u8, P>(p, q + IP_PROTO) else {
        return Parsed::Other;
    };
    if qproto != IPPROTO_TCP && qproto != IPPROTO_UDP {
        return Parsed::Other;
    }
    let (Some(qs), Some(qd)) = (
        load::<u32, P>(p, q + IP_SADDR),
        load::<u32, P>(p, q + IP_DADDR),
    ) else {
        return Parsed::Other;
    };
    let ql4 = q + (qlen & 0x3c);
    let (Some(qsp), Some(qdp)) = (
        load::<u16, P>(p, ql4 + L4_SPORT),
        load::<u16, P>(p, ql4 + L4_DPORT),
    ) else {
        return Parsed::Other;
    };
    f.quoted = Quoted {
        saddr: qs,
        daddr: qd,
        sport: qsp,
        dport: qdp,
        proto: qproto,
        icmp_type: ty,
        icmp_code: code,
        ip_len: qlen,
    };
    Parsed::IcmpError
}

/// An ICMPv6 error (RFC 4443: destination unreachable, packet too big,
/// time exceeded, parameter problem) quoting a TCP or UDP packet whose
/// IPv6 header has no extension header. Everything else of ICMPv6 goes to
/// the stack untouched: neighbour discovery above all, and echo.
#[inline(always)]
fn parse_icmp6_error<P: Pkt>(p: &P, f: &mut Flow<crate::select::V6>) -> Parsed {
    let icmp = ETH_HLEN + IPV6_HLEN;
    let Some(ty) = load::<u8, P>(p, icmp + ICMP_TYPE) else {
        return Parsed::Other;
    };
    // Error messages are types 0..127 (RFC 4443 §2.1); we translate 1..4.
    if !(ICMPV6_DEST_UNREACH..=ICMPV6_PARAM_PROB).contains(&ty) {
        return Parsed::Other;
    }
    // The quoted headers may sit beyond the linear part of an skb: the
    // IPv6 header and a whole TCP header (its checksum is translated too).
    p.pull(icmp + ICMP_HLEN + IPV6_HLEN + 20);
    let Some(code) = load::<u8, P>(p, icmp + 1) else {
        return Parsed::Other;
    };
    let q = icmp + ICMP_HLEN;
    let (Some(vtc), Some(qproto)) = (load::<u8, P>(p, q), load::<u8, P>(p, q + IP6_NEXT_HEADER))
    else {
        return Parsed::Other;
    };
    if vtc >> 4 != 6 || (qproto != IPPROTO_TCP && qproto != IPPROTO_UDP) {
        return Parsed::Other;
    }
    let (Some(qs), Some(qd)) = (load::<Addr6, P>(p, q + 8), load::<Addr6, P>(p, q + 24)) else {
        return Parsed::Other;
    };
    let ql4 = q + IPV6_HLEN;
    let (Some(qsp), Some(qdp)) = (
        load::<u16, P>(p, ql4 + L4_SPORT),
        load::<u16, P>(p, ql4 + L4_DPORT),
    ) else {
        return Parsed::Other;
    };
    f.quoted = Quoted {
        saddr: qs,
        daddr: qd,
        sport: qsp,
        dport: qdp,
        proto: qproto,
        icmp_type: ty,
        icmp_code: code,
        ip_len: IPV6_HLEN,
    };
    Parsed::IcmpError
}

/// Our DSR option, when it is the first option (where we put it).
#[inline(always)]
fn dsr_option<P: Pkt>(p: &P, ip: usize, f: &mut Flow<crate::select::V4>) {
    let (Some(ty), Some(len)) = (load::<u8, P>(p, ip + 20), load::<u8, P>(p, ip + 21)) else {
        return;
    };
    if ty != DSR_OPT_TYPE || len != DSR_OPT_LEN {
        return;
    }
    if let (Some(port), Some(addr)) = (load::<u16, P>(p, ip + 22), load::<u32, P>(p, ip + 24)) {
        if port != 0 {
            f.dsr_port = port;
            f.dsr_addr = addr;
        }
    }
}
