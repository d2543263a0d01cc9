//! What the packet path needs to know of an address family, so that one
//! body (`mod.rs`, `ct`, `snat`, `nat`, `fib`) serves IPv4 and IPv6, the
//! way Katran's `process_packet` and Cilium's `lib/nodeport.h` share their
//! flow logic and differ only in headers, maps and checksums.
//!
//! Addresses stay in network byte order as on the wire: `u32` for IPv4,
//! `Addr6` for IPv6 (four words, so checksum updates and copies use
//! 32-bit loads and stores, not sixteen byte ones).
//!
//! Differences that remain, by design:
//! * IPv4 has a header checksum, IPv6 none (RFC 8200 §3); the L4
//!   checksum's pseudo-header holds the addresses in both (RFC 793,
//!   RFC 8200 §8.1), so an address rewrite updates it word by word.
//! * The hop limit sits at byte 7 of the IPv6 header and is not covered by
//!   any checksum.
//! * IPv6 packets with extension headers (fragments included) are not
//!   handled (`parse6`): they are left to the stack. The one exception is
//!   our own DSR header (`dsr.rs`).
use aya_ebpf::{
    bindings::{bpf_fib_lookup, bpf_sock, bpf_sock_tuple},
    maps::{LruHashMap, PerCpuArray},
};
use lb_common::{
    backend::{Backend4, Backend6},
    conntrack::{CtKey, CtValue},
    nodeport::{flow_hash, flow_hash6},
    service::{
        Service4Key, Service6Key, ServiceValue, SourceRange4, SourceRange6, SVC_FLAG_SOURCE_RANGES,
    },
    Addr6,
};

use super::{access::Pkt, parse, parse::Flow, route_cache::CachedRoute, Parsed, Scratch};
use crate::{
    maps::{
        LB4_BACKENDS, LB4_CT, LB4_SRC_RANGES, LB6_BACKENDS, LB6_CT, LB6_DEVICES, LB6_SRC_RANGES,
        LB_DEVICES, LB_ROUTES4, LB_ROUTES6, LB_SCRATCH, LB_SCRATCH6,
    },
    select::{ServiceFamily, V4, V6},
};

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// An address family of the packet path.
pub trait Ip: ServiceFamily + Sized + 'static {
    type Addr: Copy + PartialEq + Default;
    const IS_V6: bool;
    /// 4 or 6, as events and `lbctl monitor` show it.
    const VERSION: u8;
    /// AF_INET / AF_INET6, for the FIB and bpf_redirect_neigh.
    const AF: u8;
    /// Offsets of the source and destination address and of the TTL / hop
    /// limit, from the start of the IP header.
    const SADDR: usize;
    const DADDR: usize;
    const HOP_LIMIT: usize;
    /// 32-bit words of an address (for the L4 checksum's pseudo-header).
    const WORDS: usize;
    /// Masks `Flow::ip_len` (the IP header with what the programs parse of
    /// its options or extension headers) into a bounded packet offset:
    /// IPv4 20..60, IPv6 40 or 64 (with our DSR header).
    const IP_LEN_MASK: usize;
    /// Bytes the DSR option adds to a packet.
    const DSR_LEN: u16;
    /// The outer header of DSR's IPIP / IP6IP6 dispatch.
    const ENCAP_LEN: u16;

    fn word(a: Self::Addr, i: usize) -> u32;
    fn scratch() -> Option<*mut Scratch<Self>>;
    fn route_cache() -> &'static PerCpuArray<CachedRoute<Self::Addr>>;
    fn ct() -> &'static LruHashMap<CtKey<Self::Addr>, CtValue<Self::Addr>>;
    fn parse<P: Pkt>(p: &P, f: &mut Flow<Self>) -> Parsed;
    fn service_key(addr: Self::Addr, port: u16, proto: u8, scope: u8) -> Self::Key;
    /// A backend's address, port and flags.
    fn backend_target(b: &Self::Backend) -> (Self::Addr, u16, u8);
    /// Whether backend `id` exists and is still at `addr`:`port` (an id
    /// freed and given to another backend no longer matches). Compared in
    /// the map value, without copying it to the stack.
    fn backend_is(id: u32, addr: &Self::Addr, port: u16) -> bool;
    /// The SNAT source of packets leaving `ifindex` (LB_DEVICES / LB6_DEVICES).
    fn device_address(ifindex: u32) -> Option<Self::Addr>;
    /// sessionAffinity: ClientIP's key for a source address.
    fn client(saddr: Self::Addr) -> u64;
    fn flow_hash(f: &Flow<Self>) -> u32;
    /// loadBalancerSourceRanges: whether `saddr` may use the frontend.
    fn source_allowed(service_id: u32, saddr: Self::Addr) -> bool;
    /// Whether `svc` admits `saddr`: open without ranges, else only a
    /// source they hold. New flows and the DSR options a backend's node
    /// learns both ask it.
    #[inline(always)]
    fn admits(svc: &ServiceValue, saddr: Self::Addr) -> bool {
        svc.flags & SVC_FLAG_SOURCE_RANGES == 0 || Self::source_allowed(svc.service_id, saddr)
    }
    /// The address as an event holds either family's (`Addr6`).
    fn event_addr(a: Self::Addr) -> Addr6;
    fn set_fib_addrs(p: &mut bpf_fib_lookup, saddr: Self::Addr, daddr: Self::Addr);
    /// The next hop a FIB lookup left in `p` (for bpf_redirect_neigh).
    fn fib_next_hop(p: &bpf_fib_lookup) -> Self::Addr;
    /// Fills a socket lookup tuple; returns its size.
    fn sock_tuple(key: &CtKey<Self::Addr>, t: &mut bpf_sock_tuple) -> u32;
    /// Whether the socket's source address (`src_ip4` / `src_ip6`) is
    /// `addr`.
    ///
    /// # Safety
    /// `sk` is a non-null socket the kernel gave the program (skb->sk).
    unsafe fn sock_source_is(sk: *const bpf_sock, addr: &Self::Addr) -> bool;
    /// The flow as IPv4, for what only IPv4 has (its header checksum,
    /// options, fragments, ICMP errors, DSR): None for IPv6.
    fn as_v4(f: &Flow<Self>) -> Option<&Flow<V4>>;
    fn as_v4_mut(f: &mut Flow<Self>) -> Option<&mut Flow<V4>>;
    /// The flow as IPv6, for ICMPv6: None for IPv4.
    fn as_v6(f: &Flow<Self>) -> Option<&Flow<V6>>;
}

impl Ip for V4 {
    type Addr = u32;
    const IS_V6: bool = false;
    const VERSION: u8 = 4;
    const AF: u8 = AF_INET;
    const SADDR: usize = 12;
    const DADDR: usize = 16;
    const HOP_LIMIT: usize = 8;
    const WORDS: usize = 1;
    const IP_LEN_MASK: usize = 0x3c;
    const DSR_LEN: u16 = lb_common::nodeport::DSR_OPT_LEN as u16;
    const ENCAP_LEN: u16 = lb_common::nodeport::IPIP_HLEN as u16;

    #[inline(always)]
    fn word(a: u32, _i: usize) -> u32 {
        a
    }
    #[inline(always)]
    fn scratch() -> Option<*mut Scratch<V4>> {
        LB_SCRATCH.get_ptr_mut(0)
    }
    #[inline(always)]
    fn route_cache() -> &'static PerCpuArray<CachedRoute<u32>> {
        &LB_ROUTES4
    }
    #[inline(always)]
    fn ct() -> &'static LruHashMap<CtKey<u32>, CtValue<u32>> {
        &LB4_CT
    }
    #[inline(always)]
    fn parse<P: Pkt>(p: &P, f: &mut Flow<V4>) -> Parsed {
        parse::parse4(p, f)
    }
    #[inline(always)]
    fn service_key(addr: u32, port: u16, proto: u8, scope: u8) -> Service4Key {
        Service4Key::new(addr, port, proto, scope, 0)
    }
    #[inline(always)]
    fn backend_target(b: &Backend4) -> (u32, u16, u8) {
        (b.address, b.port, b.flags)
    }
    #[inline(always)]
    fn backend_is(id: u32, addr: &u32, port: u16) -> bool {
        match LB4_BACKENDS.get_ptr(&id) {
            // SAFETY: a map value, valid for this run; two fields read.
            Some(b) => unsafe { (*b).address == *addr && (*b).port == port },
            None => false,
        }
    }
    #[inline(always)]
    fn device_address(ifindex: u32) -> Option<u32> {
        // SAFETY: a map value, copied at once.
        unsafe { LB_DEVICES.get(&ifindex) }.map(|d| d.address)
    }
    #[inline(always)]
    fn client(saddr: u32) -> u64 {
        lb_common::affinity::address_client4(saddr)
    }
    #[inline(always)]
    fn flow_hash(f: &Flow<V4>) -> u32 {
        flow_hash(f.saddr, f.daddr, f.sport, f.dport, f.proto)
    }
    /// One longest-prefix lookup on (service id, address) in LB4_SRC_RANGES.
    #[inline(always)]
    fn source_allowed(service_id: u32, saddr: u32) -> bool {
        let key = aya_ebpf::maps::lpm_trie::Key::new(
            SourceRange4::prefix_len(32),
            SourceRange4 {
                service_id,
                address: saddr,
            },
        );
        LB4_SRC_RANGES.get(&key).is_some()
    }
    #[inline(always)]
    fn event_addr(a: u32) -> Addr6 {
        [a, 0, 0, 0]
    }
    #[inline(always)]
    fn set_fib_addrs(p: &mut bpf_fib_lookup, saddr: u32, daddr: u32) {
        p.__bindgen_anon_3.ipv4_src = saddr;
        p.__bindgen_anon_4.ipv4_dst = daddr;
    }
    #[inline(always)]
    fn fib_next_hop(p: &bpf_fib_lookup) -> u32 {
        // SAFETY: an IPv4 lookup wrote the IPv4 member.
        unsafe { p.__bindgen_anon_4.ipv4_dst }
    }
    #[inline(always)]
    unsafe fn sock_source_is(sk: *const bpf_sock, addr: &u32) -> bool {
        // SAFETY: the caller's.
        unsafe { core::ptr::read_volatile(&(*sk).src_ip4) == *addr }
    }
    #[inline(always)]
    fn sock_tuple(key: &CtKey<u32>, t: &mut bpf_sock_tuple) -> u32 {
        use aya_ebpf::bindings::bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1 as V4Tuple;
        t.__bindgen_anon_1.ipv4 = V4Tuple {
            saddr: key.saddr,
            daddr: key.daddr,
            sport: key.sport,
            dport: key.dport,
        };
        core::mem::size_of::<V4Tuple>() as u32
    }
    #[inline(always)]
    fn as_v4(f: &Flow<V4>) -> Option<&Flow<V4>> {
        Some(f)
    }
    #[inline(always)]
    fn as_v4_mut(f: &mut Flow<V4>) -> Option<&mut Flow<V4>> {
        Some(f)
    }
    #[inline(always)]
    fn as_v6(_f: &Flow<V4>) -> Option<&Flow<V6>> {
        None
    }
}

impl Ip for V6 {
    type Addr = Addr6;
    const IS_V6: bool = true;
    const VERSION: u8 = 6;
    const AF: u8 = AF_INET6;
    const SADDR: usize = 8;
    const DADDR: usize = 24;
    const HOP_LIMIT: usize = 7;
    const WORDS: usize = 4;
    const IP_LEN_MASK: usize = 0x7c;
    const DSR_LEN: u16 = lb_common::nodeport::DSR6_HDR_LEN as u16;
    const ENCAP_LEN: u16 = lb_common::nodeport::IP6IP6_HLEN as u16;

    #[inline(always)]
    fn word(a: Addr6, i: usize) -> u32 {
        a[i & 3]
    }
    #[inline(always)]
    fn scratch() -> Option<*mut Scratch<V6>> {
        LB_SCRATCH6.get_ptr_mut(0)
    }
    #[inline(always)]
    fn route_cache() -> &'static PerCpuArray<CachedRoute<Addr6>> {
        &LB_ROUTES6
    }
    #[inline(always)]
    fn ct() -> &'static LruHashMap<CtKey<Addr6>, CtValue<Addr6>> {
        &LB6_CT
    }
    #[inline(always)]
    fn parse<P: Pkt>(p: &P, f: &mut Flow<V6>) -> Parsed {
        parse::parse6(p, f)
    }
    #[inline(always)]
    fn service_key(addr: Addr6, port: u16, proto: u8, scope: u8) -> Service6Key {
        Service6Key::new(addr, port, proto, scope, 0)
    }
    #[inline(always)]
    fn backend_target(b: &Backend6) -> (Addr6, u16, u8) {
        (b.address, b.port, b.flags)
    }
    #[inline(always)]
    fn backend_is(id: u32, addr: &Addr6, port: u16) -> bool {
        match LB6_BACKENDS.get_ptr(&id) {
            // SAFETY: a map value, valid for this run; read in place.
            Some(b) => unsafe { (*b).port == port && (*b).address == *addr },
            None => false,
        }
    }
    #[inline(always)]
    fn device_address(ifindex: u32) -> Option<Addr6> {
        // SAFETY: a map value, copied at once.
        unsafe { LB6_DEVICES.get(&ifindex) }.map(|d| d.address)
    }
    /// The address folded to 63 bits: two clients whose folds collide
    /// share their memory of a backend, which affinity tolerates (the
    /// backend stays one the service may choose).
    #[inline(always)]
    fn client(saddr: Addr6) -> u64 {
        lb_common::affinity::address_client6(saddr)
    }
    #[inline(always)]
    fn flow_hash(f: &Flow<V6>) -> u32 {
        flow_hash6(f.saddr, f.daddr, f.sport, f.dport, f.proto)
    }
    /// One longest-prefix lookup on (service id, address) in LB6_SRC_RANGES.
    #[inline(always)]
    fn source_allowed(service_id: u32, saddr: Addr6) -> bool {
        let key = aya_ebpf::maps::lpm_trie::Key::new(
            SourceRange6::prefix_len(128),
            SourceRange6 {
                service_id,
                address: saddr,
            },
        );
        LB6_SRC_RANGES.get(&key).is_some()
    }
    #[inline(always)]
    fn event_addr(a: Addr6) -> Addr6 {
        a
    }
    #[inline(always)]
    fn set_fib_addrs(p: &mut bpf_fib_lookup, saddr: Addr6, daddr: Addr6) {
        p.__bindgen_anon_3.ipv6_src = saddr;
        p.__bindgen_anon_4.ipv6_dst = daddr;
    }
    #[inline(always)]
    fn fib_next_hop(p: &bpf_fib_lookup) -> Addr6 {
        // SAFETY: an IPv6 lookup wrote the IPv6 member.
        unsafe { p.__bindgen_anon_4.ipv6_dst }
    }
    #[inline(always)]
    unsafe fn sock_source_is(sk: *const bpf_sock, addr: &Addr6) -> bool {
        // Word by word: the verifier allows 4-byte reads of src_ip6.
        let mut i = 0;
        while i < 4 {
            // SAFETY: the caller's.
            if unsafe { core::ptr::read_volatile(&(*sk).src_ip6[i]) } != addr[i] {
                return false;
            }
            i += 1;
        }
        true
    }
    #[inline(always)]
    fn sock_tuple(key: &CtKey<Addr6>, t: &mut bpf_sock_tuple) -> u32 {
        use aya_ebpf::bindings::bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2 as V6Tuple;
        t.__bindgen_anon_1.ipv6 = V6Tuple {
            saddr: key.saddr,
            daddr: key.daddr,
            sport: key.sport,
            dport: key.dport,
        };
        core::mem::size_of::<V6Tuple>() as u32
    }
    #[inline(always)]
    fn as_v4(_f: &Flow<V6>) -> Option<&Flow<V4>> {
        None
    }
    #[inline(always)]
    fn as_v4_mut(_f: &mut Flow<V6>) -> Option<&mut Flow<V4>> {
        None
    }
    #[inline(always)]
    fn as_v6(f: &Flow<V6>) -> Option<&Flow<V6>> {
        Some(f)
    }
}
