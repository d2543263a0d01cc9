//! Traffic per frontend (`LB_SVC_STATS`, `lb_common::stats`): each CPU adds
//! to its own copy of the frontend's entry, so counting takes no atomic
//! operation and no cache line moves between CPUs. The agent makes the
//! entries; a frontend without one (or without `SVC_FLAG_STATS`, then not
//! looked up at all) is not counted.
use lb_common::stats::ServiceStats;

use crate::maps::LB_SVC_STATS;

#[inline(always)]
fn entry(service_id: u32) -> Option<*mut ServiceStats> {
    LB_SVC_STATS.get_ptr_mut(&service_id)
}

/// A packet of a client's flow to the frontend (`segments` wire packets of
/// `bytes` in all); `new_flow`: its first, which made a conntrack entry.
#[inline(always)]
pub fn count_packet(service_id: u32, segments: u32, bytes: u32, new_flow: bool) {
    if let Some(s) = entry(service_id) {
        // SAFETY: this CPU's copy of the value (a per-CPU map), valid for
        // this run; a program runs to completion on its CPU, and tc and
        // XDP do not nest into each other there.
        unsafe {
            (*s).packets += u64::from(segments);
            (*s).bytes += u64::from(bytes);
            if new_flow {
                (*s).flows += 1;
            }
        }
    }
}

/// A connect() or unconnected sendmsg() the socket hooks sent to one of the
/// frontend's backends.
#[inline(always)]
pub fn count_connect(service_id: u32) {
    if let Some(s) = entry(service_id) {
        // SAFETY: as in `count_packet`. The socket hooks run with migration
        // disabled (kernel/bpf/cgroup.c, bpf_prog_run_array_cg), so the
        // copy stays this CPU's; a hook preempted by another task's on the
        // same CPU may lose one increment, as every per-CPU counter here.
        unsafe { (*s).connects += 1 };
    }
}
