//! Conntrack (`LB4_CT`, `LB6_CT`: `Ip::ct`): which backend a flow went to, and how to translate
//! its replies. Entries carry the time they last saw a packet; an entry past
//! its lifetime counts as absent here, and the agent's garbage collector
//! deletes it (lb-userspace `conntrack::gc`), which also gives its SNAT port
//! back.
//!
//! TCP state is kept coarse, like Cilium's CT_SERVICE entries
//! (bpf/lib/conntrack.h): a SYN opens, any other packet marks the flow
//! established, a FIN or RST in either direction marks it closing, and a SYN
//! on a closing flow's tuple starts a new flow (`ct_reset_closing`): the
//! tuple is being reused, it must choose a backend afresh.
use aya_ebpf::helpers::bpf_ktime_get_coarse_ns;
use lb_common::conntrack::{ct_lifetime_setting, CtKey, CtValue, CT_F_CLOSING, CT_F_ESTABLISHED};

use super::{
    access::{IPPROTO_TCP, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
    family::Ip,
};
use crate::runtime::config;

pub const NS: u64 = 1_000_000_000;

/// CLOCK_MONOTONIC at the scheduler tick's resolution (a few ms): what
/// conntrack lifetimes in seconds, SNAT port reuse after a second and the
/// ICMP token bucket need, and the clock the agent's garbage collector reads
/// (`clock_gettime(CLOCK_MONOTONIC)`). bpf_ktime_get_coarse_ns (Linux 5.11)
/// reads the timekeeper's last tick instead of the clocksource: about 12 ns
/// less per packet here than bpf_ktime_get_ns (the established-flow rows of
/// `cargo xtask bench`).
#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: a helper without arguments.
    unsafe { bpf_ktime_get_coarse_ns() }
}

/// Whether an entry has outlived its lifetime at `t`. An entry seen within
/// the last second has not: every lifetime is a whole number of seconds,
/// at least one (0 in the settings means the default). That spares the
/// packets of a busy flow, whose entry `lookup` refreshes every second,
/// the read of the setting.
#[inline(always)]
pub fn expired<A>(proto: u8, entry: &CtValue<A>, t: u64) -> bool {
    let age = t.saturating_sub(entry.last_seen_ns);
    if age <= NS {
        return false;
    }
    let (setting, default) = ct_lifetime_setting(proto, entry.flags);
    let life = match config(setting) {
        0 => default,
        v => v,
    };
    age > u64::from(life) * NS
}

/// What a lookup found.
pub enum Hit<A: 'static> {
    Miss,
    /// A live entry, refreshed. The entry itself, not a copy (the stack is
    /// short): read it right away. (Mutable: `known_flow` notes the
    /// backends' generation in it.)
    Live(&'static mut CtValue<A>),
    /// A SYN on a closing flow's tuple: the caller starts a new flow and
    /// overwrites the entry.
    Reopen,
}

/// Looks a packet's tuple up, keeping the entry's state in step with the
/// packet's TCP flags.
#[inline(always)]
pub fn lookup<I: Ip>(key: &CtKey<I::Addr>, proto: u8, tcp_flags: u8) -> Hit<I::Addr> {
    let Some(entry) = I::ct().get_ptr_mut(key) else {
        return Hit::Miss;
    };
    // SAFETY: a map value stays valid for the program's run (RCU); races
    // with other CPUs on these plain fields are benign (flags only gain bits).
    let entry = unsafe { &mut *entry };
    let t = now();
    if expired(proto, entry, t) {
        return Hit::Miss;
    }
    if proto == IPPROTO_TCP {
        let closing = entry.flags & CT_F_CLOSING != 0;
        if closing && tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN {
            return Hit::Reopen;
        }
        if tcp_flags & (TCP_FIN | TCP_RST) != 0 && !closing {
            entry.flags |= CT_F_CLOSING;
        }
        if tcp_flags & TCP_SYN == 0 && entry.flags & CT_F_ESTABLISHED == 0 {
            entry.flags |= CT_F_ESTABLISHED;
        }
    }
    // Refresh at most once a second (fewer writes to a shared entry), but
    // on every packet of a closing flow: its last packets are few, and SNAT
    // port reuse (snat.rs) needs to know exactly when it went quiet.
    if entry.flags & CT_F_CLOSING != 0 || t.saturating_sub(entry.last_seen_ns) > NS {
        entry.last_seen_ns = t;
    }
    Hit::Live(entry)
}

/// A read-only look at an entry (no refresh): None when missing or expired.
#[inline(always)]
pub fn peek<I: Ip>(key: &CtKey<I::Addr>, proto: u8) -> Option<&'static CtValue<I::Addr>> {
    let entry = I::ct().get_ptr(key)?;
    // SAFETY: as in `lookup`.
    let entry = unsafe { &*entry };
    if expired(proto, entry, now()) {
        return None;
    }
    Some(entry)
}

/// Creates or replaces an entry.
#[inline(always)]
pub fn put<I: Ip>(key: &CtKey<I::Addr>, value: &CtValue<I::Addr>) -> bool {
    I::ct().insert(key, value, 0).is_ok()
}
