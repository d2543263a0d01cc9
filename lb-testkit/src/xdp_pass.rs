//! A two-instruction XDP program (`return XDP_PASS`) for the far end of a
//! veth whose near end runs XDP that transmits (XDP_TX, redirect).
//!
//! veth hands such frames to the peer's ring, but only schedules the peer to
//! read that ring when the peer has an XDP program of its own
//! (drivers/net/veth.c, veth_xdp_flush: "xdp_ring is initialized on receive
//! side?"); with NAPI alone (GRO on) the frames wait for some other packet to
//! come by. A real NIC has no such peer. The program is loaded and attached
//! with raw bpf(2) calls: it needs no object file, maps or pins.
use std::{
    io,
    os::fd::{FromRawFd as _, OwnedFd},
};

pub(crate) const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_XDP: u32 = 37;

#[repr(C, align(8))]
pub(crate) struct Attr(pub(crate) [u8; 128]);

/// bpf(2); the kernel's non-negative result.
pub(crate) fn bpf_raw(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: attr is a zero-padded bpf_attr of the size passed.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut Attr, 128usize) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// bpf(2) for a command that returns a new file descriptor.
pub(crate) fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<OwnedFd> {
    let r = bpf_raw(cmd, attr)?;
    // SAFETY: the kernel returned a new file descriptor we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// Attaches `return XDP_PASS` to `dev` in network namespace `netns`. The
/// program stays attached while the returned link is open.
pub fn attach(netns: &str, dev: &str) -> OwnedFd {
    let (ns, dev) = (netns.to_string(), dev.to_string());
    std::thread::spawn(move || {
        crate::netns::enter(&ns).expect("entering the namespace");
        let ifindex = lb::sys::netdev::ifindex(&dev).expect("device");
        let prog = crate::empty_program::load(true).expect("loading xdp-pass");
        let mut attr = Attr([0; 128]);
        use std::os::fd::AsRawFd as _;
        attr.0[0..4].copy_from_slice(&(prog.as_raw_fd() as u32).to_ne_bytes());
        attr.0[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        attr.0[8..12].copy_from_slice(&BPF_XDP.to_ne_bytes());
        bpf(BPF_LINK_CREATE, &mut attr).expect("attaching xdp-pass")
    })
    .join()
    .expect("xdp-pass thread")
}
