//! Packets for BPF_PROG_TEST_RUN: crafted with etherparse, and read back
//! with their checksums verified independently of the code under test.
use std::net::{Ipv4Addr, Ipv6Addr};

use etherparse::{Ipv4Header, Ipv6Header, PacketBuilder, PacketBuilderStep, TcpHeader, UdpHeader};

pub type Mac = [u8; 6];

pub const SYN: u8 = 0x02;
pub const ACK: u8 = 0x10;
pub const FIN: u8 = 0x01;

/// An Ethernet/IPv4/TCP frame: every field a test varies, as arguments.
#[allow(clippy::too_many_arguments)]
pub fn tcp(
    src: Mac,
    dst: Mac,
    saddr: Ipv4Addr,
    daddr: Ipv4Addr,
    sport: u16,
    dport: u16,
    flags: u8,
    payload: &[u8],
) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(src, dst)
        .ipv4(saddr.octets(), daddr.octets(), 64)
        .tcp(sport, dport, 1000, 65535);
    write_tcp(b, flags, payload)
}

/// Sets `flags` (SYN, ACK, FIN) on a TCP builder of either family and
/// writes the frame.
fn write_tcp(mut b: PacketBuilderStep<TcpHeader>, flags: u8, payload: &[u8]) -> Vec<u8> {
    if flags & SYN != 0 {
        b = b.syn();
    }
    if flags & ACK != 0 {
        b = b.ack(1);
    }
    if flags & FIN != 0 {
        b = b.fin();
    }
    let mut out = Vec::new();
    b.write(&mut out, payload).unwrap();
    out
}

pub fn udp(
    src: Mac,
    dst: Mac,
    saddr: Ipv4Addr,
    daddr: Ipv4Addr,
    sport: u16,
    dport: u16,
    payload: &[u8],
) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(src, dst)
        .ipv4(saddr.octets(), daddr.octets(), 64)
        .udp(sport, dport);
    let mut out = Vec::new();
    b.write(&mut out, payload).unwrap();
    out
}

/// An Ethernet/IPv6/TCP frame (hop limit 64).
#[allow(clippy::too_many_arguments)]
pub fn tcp6(
    src: Mac,
    dst: Mac,
    saddr: Ipv6Addr,
    daddr: Ipv6Addr,
    sport: u16,
    dport: u16,
    flags: u8,
    payload: &[u8],
) -> Vec<u8> {
    tcp6_hop(src, dst, saddr, daddr, sport, dport, flags, payload, 64)
}

/// `tcp6` with a hop limit of its own.
#[allow(clippy::too_many_arguments)]
pub fn tcp6_hop(
    src: Mac,
    dst: Mac,
    saddr: Ipv6Addr,
    daddr: Ipv6Addr,
    sport: u16,
    dport: u16,
    flags: u8,
    payload: &[u8],
    hop_limit: u8,
) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(src, dst)
        .ipv6(saddr.octets(), daddr.octets(), hop_limit)
        .tcp(sport, dport, 1000, 65535);
    write_tcp(b, flags, payload)
}

pub fn udp6(
    src: Mac,
    dst: Mac,
    saddr: Ipv6Addr,
    daddr: Ipv6Addr,
    sport: u16,
    dport: u16,
    payload: &[u8],
) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(src, dst)
        .ipv6(saddr.octets(), daddr.octets(), 64)
        .udp(sport, dport);
    let mut out = Vec::new();
    b.write(&mut out, payload).unwrap();
    out
}

/// `inspect6` for a packet that may carry the IPv6 DSR header (a
/// Destination Options header right after the IPv6 header): returns the
/// option's frontend (address, port) when present, and the view of the
/// packet with the L4 checksum checked against the upper-layer length
/// (RFC 8200 §8.1: extension headers are not part of it).
pub fn inspect6_dsr(frame: &[u8]) -> (View6, Option<(Ipv6Addr, u16)>) {
    assert_eq!(&frame[12..14], &[0x86, 0xdd], "not IPv6");
    if frame[14 + 6] != 60 {
        return (inspect6(frame), None);
    }
    let h = &frame[54..78];
    assert_eq!((h[1], h[2], h[3]), (2, 0x1b, 20), "the DSR header's layout");
    let port = u16::from_be_bytes([h[4], h[5]]);
    let addr: [u8; 16] = h[8..24].try_into().unwrap();
    let payload = u16::from_be_bytes([frame[18], frame[19]]) as usize;
    assert_eq!(
        payload,
        frame.len() - 54,
        "payload length counts the header"
    );
    // The same packet without the header, for the L4 view and checksum.
    let mut plain = frame[..54].to_vec();
    plain[20] = h[0];
    plain[18..20].copy_from_slice(&((payload - 24) as u16).to_be_bytes());
    plain.extend_from_slice(&frame[78..]);
    (inspect6(&plain), Some((Ipv6Addr::from(addr), port)))
}

/// An IPv6 packet as it came out of a program.
#[derive(Debug, Clone)]
pub struct View6 {
    pub eth_dst: Mac,
    pub eth_src: Mac,
    pub saddr: Ipv6Addr,
    pub daddr: Ipv6Addr,
    pub hop_limit: u8,
    pub sport: u16,
    pub dport: u16,
    pub payload: Vec<u8>,
}

/// Parses an Ethernet/IPv6/TCP-or-UDP packet and checks its TCP/UDP
/// checksum (pseudo-header included, RFC 8200 §8.1), computed from scratch
/// with etherparse. A UDP checksum of zero is refused: IPv6 requires one.
pub fn inspect6(frame: &[u8]) -> View6 {
    let eth_dst: Mac = frame[0..6].try_into().unwrap();
    let eth_src: Mac = frame[6..12].try_into().unwrap();
    assert_eq!(&frame[12..14], &[0x86, 0xdd], "not IPv6");
    let (ip, rest) = Ipv6Header::from_slice(&frame[14..]).expect("IPv6 header");
    let l4 = &rest[..ip.payload_length as usize];
    let (sport, dport, payload) = match ip.next_header.0 {
        6 => {
            let (tcp, payload) = TcpHeader::from_slice(l4).expect("TCP header");
            let want = tcp.calc_checksum_ipv6(&ip, payload).unwrap();
            assert_eq!(tcp.checksum, want, "TCP checksum");
            (tcp.source_port, tcp.destination_port, payload.to_vec())
        }
        17 => {
            let (udp, payload) = UdpHeader::from_slice(l4).expect("UDP header");
            let want = udp.calc_checksum_ipv6(&ip, payload).unwrap();
            assert_eq!(udp.checksum, want, "UDP checksum");
            (udp.source_port, udp.destination_port, payload.to_vec())
        }
        p => panic!("unexpected next header {p}"),
    };
    View6 {
        eth_dst,
        eth_src,
        saddr: Ipv6Addr::from(ip.source),
        daddr: Ipv6Addr::from(ip.destination),
        hop_limit: ip.hop_limit,
        sport,
        dport,
        payload,
    }
}

/// The ICMPv6 checksum (RFC 4443 §2.3) of `msg` from `saddr` to `daddr`,
/// computed here, independently of the programs.
pub fn icmp6_checksum(saddr: Ipv6Addr, daddr: Ipv6Addr, msg: &[u8]) -> u16 {
    let mut pseudo = Vec::with_capacity(40 + msg.len());
    pseudo.extend_from_slice(&saddr.octets());
    pseudo.extend_from_slice(&daddr.octets());
    pseudo.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, 58]);
    pseudo.extend_from_slice(msg);
    internet_checksum(&pseudo)
}

/// An ICMPv6 error (`ty`, `code`, the 4-byte field after the checksum) from
/// `saddr` to `daddr`, quoting `quote` (an IPv6 packet, as much as fits).
#[allow(clippy::too_many_arguments)]
pub fn icmp6_error(
    src: Mac,
    dst: Mac,
    saddr: Ipv6Addr,
    daddr: Ipv6Addr,
    ty: u8,
    code: u8,
    rest: [u8; 4],
    quote: &[u8],
) -> Vec<u8> {
    let mut msg = vec![ty, code, 0, 0];
    msg.extend_from_slice(&rest);
    msg.extend_from_slice(quote);
    let c = icmp6_checksum(saddr, daddr, &msg);
    msg[2..4].copy_from_slice(&c.to_be_bytes());
    let mut out = Vec::new();
    out.extend_from_slice(&dst);
    out.extend_from_slice(&src);
    out.extend_from_slice(&[0x86, 0xdd]);
    out.extend_from_slice(&[0x60, 0, 0, 0]);
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(&[58, 64]);
    out.extend_from_slice(&saddr.octets());
    out.extend_from_slice(&daddr.octets());
    out.extend_from_slice(&msg);
    out
}

/// An ICMPv6 error as it came out of a program, its checksum verified.
#[derive(Debug, Clone)]
pub struct Icmp6View {
    pub eth_dst: Mac,
    pub saddr: Ipv6Addr,
    pub daddr: Ipv6Addr,
    pub ty: u8,
    pub code: u8,
    pub rest: [u8; 4],
    /// The quoted packet's addresses and ports.
    pub quoted_saddr: Ipv6Addr,
    pub quoted_daddr: Ipv6Addr,
    pub quoted_sport: u16,
    pub quoted_dport: u16,
}

/// Reads an ICMPv6 error: its checksum checked over the pseudo-header, and,
/// when the whole quoted TCP segment is there, the quoted TCP checksum too
/// (a translation that rewrote the quoted addresses must have kept it right).
pub fn inspect_icmp6(frame: &[u8]) -> Icmp6View {
    assert_eq!(&frame[12..14], &[0x86, 0xdd], "not IPv6");
    let (ip, rest) = Ipv6Header::from_slice(&frame[14..]).expect("IPv6 header");
    assert_eq!(ip.next_header.0, 58, "ICMPv6");
    let msg = &rest[..ip.payload_length as usize];
    let saddr = Ipv6Addr::from(ip.source);
    let daddr = Ipv6Addr::from(ip.destination);
    assert_eq!(icmp6_checksum(saddr, daddr, msg), 0, "ICMPv6 checksum");
    let quote = &msg[8..];
    let (qip, ql4) = Ipv6Header::from_slice(quote).expect("quoted IPv6 header");
    if qip.next_header.0 == 6 && ql4.len() >= qip.payload_length as usize {
        let seg = &ql4[..qip.payload_length as usize];
        let (tcp, payload) = TcpHeader::from_slice(seg).expect("quoted TCP header");
        assert_eq!(
            tcp.checksum,
            tcp.calc_checksum_ipv6(&qip, payload).unwrap(),
            "quoted TCP checksum"
        );
    }
    Icmp6View {
        eth_dst: frame[0..6].try_into().unwrap(),
        saddr,
        daddr,
        ty: msg[0],
        code: msg[1],
        rest: msg[4..8].try_into().unwrap(),
        quoted_saddr: Ipv6Addr::from(qip.source),
        quoted_daddr: Ipv6Addr::from(qip.destination),
        quoted_sport: u16::from_be_bytes([ql4[0], ql4[1]]),
        quoted_dport: u16::from_be_bytes([ql4[2], ql4[3]]),
    }
}

/// A packet as it came out of a program.
#[derive(Debug, Clone)]
pub struct View {
    pub eth_dst: Mac,
    pub eth_src: Mac,
    pub ip: Ipv4Header,
    pub saddr: Ipv4Addr,
    pub daddr: Ipv4Addr,
    pub sport: u16,
    pub dport: u16,
    /// IPv4 options, raw.
    pub options: Vec<u8>,
    pub payload: Vec<u8>,
}

/// Parses an Ethernet/IPv4/TCP-or-UDP packet and checks that the IPv4
/// header checksum and the TCP/UDP checksum are right, computing them from
/// scratch with etherparse.
pub fn inspect(frame: &[u8]) -> View {
    let eth_dst: Mac = frame[0..6].try_into().unwrap();
    let eth_src: Mac = frame[6..12].try_into().unwrap();
    assert_eq!(&frame[12..14], &[0x08, 0x00], "not IPv4");
    let (ip, rest) = Ipv4Header::from_slice(&frame[14..]).expect("IPv4 header");
    assert_eq!(
        ip.header_checksum,
        ip.calc_header_checksum(),
        "IPv4 header checksum"
    );
    let l4_len = ip.total_len as usize - ip.header_len();
    let l4 = &rest[..l4_len];
    let (sport, dport, payload) = match ip.protocol.0 {
        6 => {
            let (tcp, payload) = TcpHeader::from_slice(l4).expect("TCP header");
            let want = tcp.calc_checksum_ipv4(&ip, payload).unwrap();
            assert_eq!(tcp.checksum, want, "TCP checksum");
            (tcp.source_port, tcp.destination_port, payload.to_vec())
        }
        17 => {
            let (udp, payload) = UdpHeader::from_slice(l4).expect("UDP header");
            if udp.checksum != 0 {
                let want = udp.calc_checksum_ipv4(&ip, payload).unwrap();
                assert_eq!(udp.checksum, want, "UDP checksum");
            }
            (udp.source_port, udp.destination_port, payload.to_vec())
        }
        p => panic!("unexpected protocol {p}"),
    };
    View {
        eth_dst,
        eth_src,
        saddr: Ipv4Addr::from(ip.source),
        daddr: Ipv4Addr::from(ip.destination),
        options: ip.options.as_slice().to_vec(),
        ip,
        sport,
        dport,
        payload,
    }
}

/// RFC 1071 Internet checksum of `data` (an odd last byte padded with zero).
pub fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for chunk in data.chunks(2) {
        let word = if chunk.len() == 2 {
            u16::from_be_bytes([chunk[0], chunk[1]])
        } else {
            u16::from_be_bytes([chunk[0], 0])
        };
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An ICMPv4 error (`ty`, `code`, the 4-byte rest-of-header word) from
/// `saddr` to `daddr`, quoting `quote` (an IP header and what follows).
#[allow(clippy::too_many_arguments)]
pub fn icmp_error(
    src: Mac,
    dst: Mac,
    saddr: Ipv4Addr,
    daddr: Ipv4Addr,
    ty: u8,
    code: u8,
    rest: [u8; 4],
    quote: &[u8],
) -> Vec<u8> {
    let mut icmp = vec![ty, code, 0, 0];
    icmp.extend_from_slice(&rest);
    icmp.extend_from_slice(quote);
    let c = internet_checksum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let mut ip = Ipv4Header::new(
        icmp.len() as u16,
        64,
        etherparse::IpNumber::ICMP,
        saddr.octets(),
        daddr.octets(),
    )
    .unwrap();
    ip.header_checksum = ip.calc_header_checksum();
    let mut out = Vec::new();
    out.extend_from_slice(&dst);
    out.extend_from_slice(&src);
    out.extend_from_slice(&[0x08, 0x00]);
    ip.write(&mut out).unwrap();
    out.extend_from_slice(&icmp);
    out
}

/// An ICMPv4 error as it came out of a program, checked: the IPv4 header
/// checksum (options included) and the ICMP checksum, computed here.
#[derive(Debug, Clone)]
pub struct IcmpView {
    pub eth_dst: Mac,
    pub eth_src: Mac,
    pub saddr: Ipv4Addr,
    pub daddr: Ipv4Addr,
    pub ty: u8,
    pub code: u8,
    /// The rest-of-header word (the next-hop MTU of "fragmentation needed"
    /// in its low 16 bits).
    pub rest: [u8; 4],
    /// The quoted IP header, parsed (its checksum checked too).
    pub quoted: Ipv4Header,
    /// The quoted packet's first 8 L4 bytes (the ports first).
    pub quoted_l4: [u8; 8],
    /// Where the ICMP message starts in the frame.
    pub icmp_offset: usize,
}

pub fn inspect_icmp(frame: &[u8]) -> IcmpView {
    assert_eq!(&frame[12..14], &[0x08, 0x00], "not IPv4");
    let (ip, _) = Ipv4Header::from_slice(&frame[14..]).expect("IPv4 header");
    assert_eq!(ip.protocol, etherparse::IpNumber::ICMP, "not ICMP");
    assert_eq!(
        ip.header_checksum,
        ip.calc_header_checksum(),
        "IPv4 header checksum"
    );
    let off = 14 + ip.header_len();
    let icmp = &frame[off..14 + ip.total_len as usize];
    assert_eq!(internet_checksum(icmp), 0, "ICMP checksum");
    let (quoted, rest) = Ipv4Header::from_slice(&icmp[8..]).expect("quoted IPv4 header");
    assert_eq!(
        quoted.header_checksum,
        quoted.calc_header_checksum(),
        "quoted IPv4 header checksum"
    );
    IcmpView {
        eth_dst: frame[0..6].try_into().unwrap(),
        eth_src: frame[6..12].try_into().unwrap(),
        saddr: Ipv4Addr::from(ip.source),
        daddr: Ipv4Addr::from(ip.destination),
        ty: icmp[0],
        code: icmp[1],
        rest: icmp[4..8].try_into().unwrap(),
        quoted,
        quoted_l4: rest[..8].try_into().unwrap(),
        icmp_offset: off,
    }
}
