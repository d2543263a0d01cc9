//! Events to user space through the `LB_EVENTS` ring buffer, behind a per-CPU
//! token bucket so that a flood of drops cannot turn into a flood of events
//! (the counters in LB_DROPS stay exact either way).
use aya_ebpf::helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns};
use lb_common::{
    config::{
        CFG_EVENT_RATE, CNT_EVENTS_LOST, CNT_EVENTS_RATE_LIMITED, CNT_EVENTS_SENT,
        DEFAULT_EVENT_RATE,
    },
    event::Event,
};

use crate::{
    maps::{LB_EVENTS, LB_EVENT_RATE},
    runtime::{bump, config},
};

const NS_PER_SEC: u64 = 1_000_000_000;

/// Takes one token from this CPU's bucket; a bucket holds at most one
/// second's worth of events.
#[inline(always)]
fn admit(now: u64) -> bool {
    let rate = match config(CFG_EVENT_RATE) {
        0 => u64::from(DEFAULT_EVENT_RATE),
        r => u64::from(r),
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
