//! Socket-level load balancing on cgroup sock_addr hooks.
//!
//! * `forward`: connect4/6 and sendmsg4/6 pick a backend and rewrite the
//!   socket's destination;
//! * `reverse`: recvmsg4/6 and getpeername4/6 give the application back the
//!   service address;
//! * `release`: sock_release frees a closing socket's `tcp_table` slot and
//!   takes its entries out of the shared reverse-translation LRU.
//!
//! An IPv6 socket dialing a v4-mapped address (`::ffff:10.96.0.10`, a
//! dual-stack socket) is translated through the IPv4 maps, as the kernel
//! routes it as IPv4.
//!
//! The kernel only accepts full-width loads of some `bpf_sock_addr` fields and
//! full-width stores to all of them (net/core/filter.c,
//! `sock_addr_is_valid_access`), so every access goes through the volatile
//! helpers below: LLVM may not narrow or merge them.
pub mod family;
pub mod forward;
pub mod lru_filter;
pub mod peers;
pub mod release;
pub mod reverse;
pub mod tcp_table;
pub mod udp_choice;

use aya_ebpf::bindings::bpf_sock_addr;
use lb_common::Addr6;

/// cgroup sock_addr verdicts (include/uapi/linux/bpf.h).
pub const ALLOW: i32 = 1;
pub const DENY: i32 = 0;

pub const ECONNREFUSED: i32 = 111;

/// Third word of a v4-mapped IPv6 address (::ffff:a.b.c.d) as it sits in memory.
const V4_MAPPED_WORD: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

/// The hook's `bpf_sock_addr` context. Invariant: the pointer is the one the
/// kernel passed to this program run, valid (and only used) until it returns.
pub struct SockAddr(*mut bpf_sock_addr);

impl SockAddr {
    #[inline(always)]
    pub fn new(ptr: *mut bpf_sock_addr) -> Self {
        Self(ptr)
    }

    #[inline(always)]
    pub fn protocol(&self) -> u32 {
        // SAFETY: `self.0` is this run's context (see `SockAddr`); a full-width
        // volatile access, as sock_addr_is_valid_access asks.
        unsafe { core::ptr::read_volatile(&(*self.0).protocol) }
    }

    /// Destination (connect, sendmsg) or peer (recvmsg, getpeername) address, network order.
    #[inline(always)]
    pub fn user_ip4(&self) -> u32 {
        // SAFETY: `self.0` is this run's context (see `SockAddr`); a full-width
        // volatile access, as sock_addr_is_valid_access asks.
        unsafe { core::ptr::read_volatile(&(*self.0).user_ip4) }
    }

    #[inline(always)]
    pub fn user_ip6_words(&self) -> Addr6 {
        // SAFETY: `self.0` is this run's context (see `SockAddr`); a full-width
        // volatile access, as sock_addr_is_valid_access asks.
        unsafe {
            [
                core::ptr::read_volatile(&(*self.0).user_ip6[0]),
                core::ptr::read_volatile(&(*self.0).user_ip6[1]),
                core::ptr::read_volatile(&(*self.0).user_ip6[2]),
                core::ptr::read_volatile(&(*self.0).user_ip6[3]),
            ]
        }
    }

    /// Port in network order (the kernel keeps it in the low 16 bits).
    #[inline(always)]
    pub fn user_port(&self) -> u16 {
        // SAFETY: `self.0` is this run's context (see `SockAddr`); a full-width
        // volatile access, as sock_addr_is_valid_access asks.
        unsafe { core::ptr::read_volatile(&(*self.0).user_port) as u16 }
    }

    #[inline(always)]
    pub fn set_user_ip4(&self, address: u32) {
        // SAFETY: `self.0` is this run's context (see `SockAddr`); a full-width
        // volatile access, as sock_addr_is_valid_access asks.
        unsafe { core::ptr::write_volatile(&mut (*self.0).user_ip4, address) }
    }

    #[inline(always)]
    pub fn set_user_ip6_words(&self, w: Addr6) {
        // SAFETY: `self.0` is this run's context (see `SockAddr`); a full-width
        // volatile access, as sock_addr_is_valid_access asks.
        unsafe {
            core::ptr::write_volatile(&mut (*self.0).user_ip6[0], w[0]);
            core::ptr::write_volatile(&mut (*self.0).user_ip6[1], w[1]);
            core::ptr::write_volatile(&mut (*self.0).user_ip6[2], w[2]);
            core::ptr::write_volatile(&mut (*self.0).user_ip6[3], w[3]);
        }
    }

    #[inline(always)]
    pub fn set_user_port(&self, port: u16) {
        // SAFETY: `self.0` is this run's context (see `SockAddr`); a full-width
        // volatile access, as sock_addr_is_valid_access asks.
        unsafe { core::ptr::write_volatile(&mut (*self.0).user_port, u32::from(port)) }
    }
}

/// Where the hook found the address, and so how to write one back.
#[derive(Clone, Copy)]
pub enum Dest {
    /// `user_ip4` of an IPv4 socket.
    Ip4,
    /// A v4-mapped address in `user_ip6` of an IPv6 socket.
    Mapped,
    /// An IPv6 address in `user_ip6`.
    Ip6,
}

impl Dest {
    /// Writes `address` (IPv4 in the first word) and `port` where the hook
    /// found them.
    #[inline(always)]
    pub fn write(self, sa: &SockAddr, address: Addr6, port: u16) {
        match self {
            Dest::Ip4 => sa.set_user_ip4(address[0]),
            Dest::Mapped => sa.set_user_ip6_words(map_v4(address[0])),
            Dest::Ip6 => sa.set_user_ip6_words(address),
        }
        sa.set_user_port(port);
    }
}

/// `Some(ipv4)` when the IPv6 words hold a v4-mapped address.
#[inline(always)]
pub fn v4_mapped(w: &Addr6) -> Option<u32> {
    (w[0] == 0 && w[1] == 0 && w[2] == V4_MAPPED_WORD).then_some(w[3])
}

#[inline(always)]
pub fn map_v4(address: u32) -> Addr6 {
    [0, 0, V4_MAPPED_WORD, address]
}
