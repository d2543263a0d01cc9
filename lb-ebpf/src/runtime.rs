//! The agent's run-time settings of the programs (LB_CONFIG: log level,
//! tracing, event rate, the host namespace, the load-balancing mode, ...)
//! and the generic per-CPU counters (LB_COUNTERS).
use lb_common::config::{
    CFG_HOST_NETNS_COOKIE_HI, CFG_HOST_NETNS_COOKIE_LO, CFG_HOST_NS_ONLY, CFG_LOG_LEVEL, CFG_TRACE,
};

use crate::maps::{LB_CONFIG, LB_COUNTERS};

/// A setting (`CFG_*`); 0 when unset.
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
    let host = u64::from(config(CFG_HOST_NETNS_COOKIE_HI)) << 32
        | u64::from(config(CFG_HOST_NETNS_COOKIE_LO));
    netns_cookie != host
}

/// Is this socket in the host's network namespace (the agent's, whose
/// cookie it writes at start)? False while no cookie was written.
#[inline(always)]
pub fn in_host_namespace(netns_cookie: u64) -> bool {
    let host = u64::from(config(CFG_HOST_NETNS_COOKIE_HI)) << 32
        | u64::from(config(CFG_HOST_NETNS_COOKIE_LO));
    host != 0 && netns_cookie == host
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

/// Adds one to a counter (`CNT_*`) on this CPU.
#[inline(always)]
pub fn bump(counter: u32) {
    if let Some(c) = LB_COUNTERS.get_ptr_mut(counter) {
        // SAFETY: a per-CPU slot from get_ptr_mut: no other CPU writes it, the pointer is valid for this run.
        unsafe { *c += 1 };
    }
}
