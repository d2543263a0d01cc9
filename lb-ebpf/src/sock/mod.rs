//! Socket-level load balancing on cgroup sock_addr hooks.
//!
//! The kernel only accepts full-width loads of some `bpf_sock_addr` fields and
//! full-width stores to all of them (net/core/filter.c,
//! `sock_addr_is_valid_access`), so every access goes through the volatile
//! helpers below: LLVM may not narrow or merge them.
pub mod forward4;
pub mod reverse4;

use aya_ebpf::bindings::bpf_sock_addr;

/// cgroup sock_addr verdicts (include/uapi/linux/bpf.h).
pub const ALLOW: i32 = 1;
pub const DENY: i32 = 0;

pub const ECONNREFUSED: i32 = 111;

pub struct SockAddr(*mut bpf_sock_addr);

impl SockAddr {
    #[inline(always)]
    pub fn new(ptr: *mut bpf_sock_addr) -> Self {
        Self(ptr)
    }

    #[inline(always)]
    pub fn protocol(&self) -> u32 {
        unsafe { core::ptr::read_volatile(&(*self.0).protocol) }
    }

    /// Destination (connect, sendmsg) or peer (recvmsg, getpeername) address, network order.
    #[inline(always)]
    pub fn user_ip4(&self) -> u32 {
        unsafe { core::ptr::read_volatile(&(*self.0).user_ip4) }
    }

    /// Port in network order (the kernel keeps it in the low 16 bits).
    #[inline(always)]
    pub fn user_port(&self) -> u16 {
        unsafe { core::ptr::read_volatile(&(*self.0).user_port) as u16 }
    }

    #[inline(always)]
    pub fn set_user_ip4(&self, address: u32) {
        unsafe { core::ptr::write_volatile(&mut (*self.0).user_ip4, address) }
    }

    #[inline(always)]
    pub fn set_user_port(&self, port: u16) {
        unsafe { core::ptr::write_volatile(&mut (*self.0).user_port, port as u32) }
    }
}
