//! The cheapest program a hook can run (`return PASS`), timed with
//! BPF_PROG_TEST_RUN like ours: the floor of what running anything on tc or
//! XDP costs here, for benchmark rows that say how much more ours costs.
use std::{
    io,
    os::fd::{AsRawFd as _, OwnedFd},
    time::Duration,
};

use crate::xdp_pass::{bpf, bpf_raw, Attr, BPF_PROG_LOAD};

const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;

/// Loads `return TC_ACT_OK` (tc) or `return XDP_PASS` (XDP).
pub fn load(xdp: bool) -> io::Result<OwnedFd> {
    let verdict: u64 = if xdp { 2 } else { 0 };
    // r0 = verdict; exit
    let insns: [u64; 2] = [0x0000_0000_0000_00b7 | verdict << 32, 0x0000_0000_0000_0095];
    let license = b"GPL\0";
    let mut attr = Attr([0; 128]);
    let kind = if xdp {
        BPF_PROG_TYPE_XDP
    } else {
        BPF_PROG_TYPE_SCHED_CLS
    };
    attr.0[0..4].copy_from_slice(&kind.to_ne_bytes());
    attr.0[4..8].copy_from_slice(&2u32.to_ne_bytes());
    attr.0[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr.0[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    if xdp {
        attr.0[68..72].copy_from_slice(&BPF_XDP.to_ne_bytes());
    }
    bpf(BPF_PROG_LOAD, &mut attr)
}

/// The kernel's mean time per run of `prog` on `packet`, `repeat` runs.
pub fn timed(prog: &OwnedFd, packet: &[u8], repeat: u32) -> io::Result<Duration> {
    let mut attr = Attr([0; 128]);
    attr.0[0..4].copy_from_slice(&(prog.as_raw_fd() as u32).to_ne_bytes());
    attr.0[8..12].copy_from_slice(&(packet.len() as u32).to_ne_bytes());
    attr.0[16..24].copy_from_slice(&(packet.as_ptr() as u64).to_ne_bytes());
    attr.0[32..36].copy_from_slice(&repeat.to_ne_bytes());
    bpf_raw(BPF_PROG_TEST_RUN, &mut attr)?;
    let ns = u32::from_ne_bytes(attr.0[36..40].try_into().unwrap());
    Ok(Duration::from_nanos(u64::from(ns)))
}
