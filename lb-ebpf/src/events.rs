//! Events to user space through the `LB_EVENTS` ring buffer, behind a per-CPU
//! token bucket so that a flood of drops cannot turn into a flood of events
//! (the counters in LB_DROPS stay exact either way). Also the run-time
//! configuration and the generic counters.
use aya_ebpf::helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns};
use lb_common::{
    config::{
        CFG_EVENT_RATE, CFG_HOST_NETNS_COOKIE_HI, CFG_HOST_NETNS_COOKIE_LO, CFG_HOST_NS_ONLY,
        CFG_LOG_LEVEL, CFG_TRACE, CNT_EVENTS_LOST, CNT_EVENTS_RATE_LIMITED, CNT_EVENTS_SENT,
        DEFAULT_EVENT_RATE,
    },
    event::Event,
};

use crate::maps::{LB_CONFIG, LB_COUNTERS, LB_EVENTS, LB_EVENT_RATE};

const NS_PER_SEC: u64 = 1_000_000_000;

#[inline(always)]
pub fn config(index: u32) -> u32 {
    LB_CONFIG.get(index).copied().unwrap_or(0)
}

/// With host-namespace-only socket LB, is this socket out of scope?
#[inline(always)]
pub fn outside_host_namespace(netns_cookie: u64) -> bool {
    if config(CFG_HOST_NS_ONLY) == 0 {
        return false;
    }
    let host =
        (config(CFG_HOST_NETNS_COOKIE_HI) as u64) << 32 | config(CFG_HOST_NETNS_COOKIE_LO) as u64;
    netns_cookie != host
}

#[inline(always)]
pub fn tracing() -> bool {
    config(CFG_TRACE) != 0
}

/// aya-log levels: 1 error .. 5 trace (aya_log_common::Level).
#[inline(always)]
pub fn log_enabled(level: u32) -> bool {
    level <= config(CFG_LOG_LEVEL)
}

#[inline(always)]
pub fn bump(counter: u32) {
    if let Some(c) = LB_COUNTERS.get_ptr_mut(counter) {
        // SAFETY: a per-CPU slot from get_ptr_mut: no other CPU writes it, the pointer is valid for this run.
        unsafe { *c += 1 };
    }
}

/// Takes one token from this CPU's bucket; a bucket holds at most one
/// second's worth of events.
#[inline(always)]
fn admit(now: u64) -> bool {
    let rate = match config(CFG_EVENT_RATE) {
        0 => DEFAULT_EVENT_RATE as u64,
        r => r as u64,
    };
    let Some(state) = LB_EVENT_RATE.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: a per-CPU slot from get_ptr_mut, valid for this run; no other CPU touches it.
    let state = unsafe { &mut *state };
    let cap = rate * NS_PER_SEC;
    let elapsed = now.saturating_sub(state.last_ns);
    // budget is in token-nanoseconds: one event costs NS_PER_SEC of it.
    let refill = if elapsed >= NS_PER_SEC {
        cap
    } else {
        elapsed * rate
    };
    let budget = if state.budget + refill > cap {
        cap
    } else {
        state.budget + refill
    };
    state.last_ns = now;
    if budget < NS_PER_SEC {
        state.budget = budget;
        return false;
    }
    state.budget = budget - NS_PER_SEC;
    true
}

/// Whether the rate allows another event (counted when not); stamps the
/// time on the event when it does.
#[inline(always)]
fn admit_event(event: &mut Event) -> bool {
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    if !admit(now) {
        bump(CNT_EVENTS_RATE_LIMITED);
        return false;
    }
    event.ktime_ns = now;
    true
}

/// Fills in time and process, then sends the event if the rate allows.
#[inline(always)]
pub fn emit(event: &mut Event) {
    if admit_event(event) {
        event.pid = (bpf_get_current_pid_tgid() >> 32) as u32;
        event.comm = bpf_get_current_comm().unwrap_or([0; 16]);
        send(event);
    }
}

/// For packet programs: the current task is whoever the softirq
/// interrupted, so no pid or comm (the helpers are not even allowed there).
#[inline(always)]
pub fn emit_packet(event: &mut Event) {
    if admit_event(event) {
        send(event);
    }
}

#[inline(always)]
fn send(event: &Event) {
    match LB_EVENTS.output::<Event>(event, 0) {
        Ok(()) => bump(CNT_EVENTS_SENT),
        Err(_) => bump(CNT_EVENTS_LOST),
    }
}
