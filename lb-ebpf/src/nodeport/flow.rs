//! Parsing a packet into the flow the north-south programs act on.
use lb_common::nodeport::Ct4Key;

use super::packet::*;

/// What the programs need of an IPv4 TCP/UDP packet. Lives in the per-CPU
/// scratch map, not on the stack.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Flow {
    pub saddr: u32,
    pub daddr: u32,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    /// IPv4 header length in bytes (20..60).
    pub ip_len: usize,
    pub tcp_flags: u8,
    pub tot_len: u16,
    /// The DSR option (service address and port) when the packet carries it.
    pub dsr: Option<(u32, u16)>,
}

impl Flow {
    /// Offset of the L4 header. Masked: the flow lives in a map value, which
    /// the verifier treats as any number, and a packet offset must be bounded.
    #[inline(always)]
    pub fn l4(&self) -> usize {
        ETH_HLEN + (self.ip_len & 0x3c)
    }

    /// The conntrack key of this packet's tuple, as it was seen.
    #[inline(always)]
    pub fn ct_key(&self, kind: u8) -> Ct4Key {
        Ct4Key::new(
            self.saddr, self.daddr, self.sport, self.dport, self.proto, kind,
        )
    }

    /// The conntrack key of the tuple going the other way (its reply).
    #[inline(always)]
    pub fn reply_ct_key(&self, kind: u8) -> Ct4Key {
        Ct4Key::new(
            self.daddr, self.saddr, self.dport, self.sport, self.proto, kind,
        )
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// Not IPv4 TCP/UDP, or headers we leave to the stack.
    Other,
    /// IPv4 TCP/UDP with readable ports.
    Flow,
    /// A fragment; `true` when it is the first one and has ports (so the
    /// caller can tell whether it was addressed to a service).
    Fragment(bool),
    /// The IP header is sound but the L4 header is cut short or the lengths
    /// disagree; `true` when the ports could be read.
    Invalid(bool),
}

/// Written as straight-line code with an early return per field: aggregate
/// temporaries (an Option of a tuple) let LLVM mix packet pointers into
/// integer arithmetic, which the verifier rejects.
#[inline(always)]
pub fn parse<P: Pkt>(p: &P, f: &mut Flow) -> Parsed {
    let Some(eth_proto) = load::<u16, P>(p, 12) else {
        return Parsed::Other;
    };
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
    if l4proto != IPPROTO_TCP && l4proto != IPPROTO_UDP {
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
    let Some(frag) = load::<u16, P>(p, ip + IP_FRAG_OFF) else {
        return Parsed::Other;
    };
    let tot_len = u16::from_be(tot_len);
    *f = Flow {
        saddr,
        daddr,
        sport: 0,
        dport: 0,
        proto: l4proto,
        ip_len,
        tcp_flags: 0,
        tot_len,
        dsr: None,
    };
    if ip_len == 28 {
        f.dsr = dsr_option(p, ip);
    }
    let l4 = ip + ip_len;
    let fragment = frag & IP_MF_OR_OFFSET != 0;
    let first = frag & (0x1fffu16).to_be() == 0;
    // Ports: only in an unfragmented packet or the first fragment.
    let ports = if !fragment || first {
        match (
            load::<u16, P>(p, l4 + L4_SPORT),
            load::<u16, P>(p, l4 + L4_DPORT),
        ) {
            (Some(sp), Some(dp)) => {
                f.sport = sp;
                f.dport = dp;
                true
            }
            _ => false,
        }
    } else {
        false
    };
    if fragment {
        return Parsed::Fragment(ports);
    }
    if !ports {
        return Parsed::Invalid(false);
    }
    let l4_min = if l4proto == IPPROTO_TCP { 20 } else { 8 };
    // Headers must be directly readable; the IP length must fit the whole
    // packet (linear part and fragments). Only comparisons with the packet
    // end: the verifier forbids arithmetic on it.
    if p.data() + l4 + l4_min > p.data_end()
        || (tot_len as usize) < ip_len + l4_min
        || !p.covers(ETH_HLEN + tot_len as usize)
    {
        return Parsed::Invalid(true);
    }
    if l4proto == IPPROTO_TCP {
        f.tcp_flags = load::<u8, P>(p, l4 + TCP_FLAGS).unwrap_or(0);
    }
    Parsed::Flow
}

/// Our DSR option, when it is the first option (where we put it).
#[inline(always)]
fn dsr_option<P: Pkt>(p: &P, ip: usize) -> Option<(u32, u16)> {
    let ty = load::<u8, P>(p, ip + 20)?;
    let len = load::<u8, P>(p, ip + 21)?;
    if ty != lb_common::nodeport::DSR_OPT_TYPE || len != lb_common::nodeport::DSR_OPT_LEN {
        return None;
    }
    let port = load::<u16, P>(p, ip + 22)?;
    let addr = load::<u32, P>(p, ip + 24)?;
    Some((addr, port))
}
