//! eBPF programs of the load balancer. One module per hook family:
//!
//! * `sock::forward4`: cgroup/connect4 and cgroup/sendmsg4 pick a backend and
//!   rewrite the socket's destination;
//! * `sock::reverse4`: cgroup/recvmsg4 and cgroup/getpeername4 give the
//!   application back the service address.
//!
//! The map layout is documented in docs/datapath.md.
#![no_std]
#![no_main]

mod drop;
mod lb4;
mod maps;
mod sock;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// Several helpers used here (socket cookies, `bpf_set_retval`) are GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
