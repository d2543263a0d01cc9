//! eBPF programs of the load balancer. One module per hook family:
//!
//! * `sock::forward`: cgroup/connect4/6 and cgroup/sendmsg4/6 pick a backend and
//!   rewrite the socket's destination;
//! * `sock::reverse`: cgroup/recvmsg4/6 and cgroup/getpeername4/6 give the
//!   application back the service address;
//! * `packet`: tc and XDP programs for packets entering the node
//!   (NodePort, LoadBalancer, external IPs) and their replies.
//!
//! The map layout is documented in docs/datapath.md.
//!
//! On the host this binary is an empty stub, so `cargo build --workspace`
//! and clippy work; the real object is built for bpfel-unknown-none.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// Map keys are passed as `&key` though aya-ebpf's map methods take any
// `Borrow<K>`: by value, each call would be free to make another stack copy
// of the key, and the verifier's 512-byte stack is the budget this code is
// written against.
#![allow(clippy::needless_borrows_for_generic_args)]

#[cfg(target_arch = "bpf")]
mod drop;
#[cfg(target_arch = "bpf")]
mod events;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod packet;
#[cfg(target_arch = "bpf")]
mod runtime;
#[cfg(target_arch = "bpf")]
mod select;
#[cfg(target_arch = "bpf")]
mod sock;
#[cfg(target_arch = "bpf")]
mod stats;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// Several helpers used here (socket cookies, `bpf_set_retval`) are
/// GPL-only: the kernel loads the object only with a GPL-compatible license
/// string (kernel/bpf/syscall.c, license_is_gpl_compatible). This crate is
/// "Apache-2.0 OR GPL-2.0" (Cargo.toml); the object is the GPL-2.0 choice.
#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!("lb-ebpf holds eBPF programs; lb-userspace's build script builds them for bpfel-unknown-none");
}
