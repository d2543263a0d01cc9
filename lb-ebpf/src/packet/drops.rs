//! Drops on the packet path: counted per reason, with an event for the
//! drop monitor (`lbctl monitor`).
#[allow(clippy::wildcard_imports)]
use super::*;

#[inline(always)]
pub(super) fn fill_event<C: Hook, I: Ip>(e: &mut Event, ctx: &C, f: &Flow<I>) {
    *e = Event::zeroed();
    e.hook = ctx.hook();
    e.proto = f.proto;
    e.family = I::VERSION;
    e.saddr = I::event_addr(f.saddr);
    e.daddr = I::event_addr(f.daddr);
    e.sport = f.sport;
    e.dport = f.dport;
}

/// Counts a drop (with an event) without deciding the verdict: the packet
/// may still become an ICMP error.
#[inline(never)]
pub fn record_drop<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, reason: DropReason, service_id: u32) {
    match scratch::<I>() {
        Some(s) => {
            // SAFETY: per-CPU scratch; the event field is not the flow.
            let e = unsafe { &mut (*s).event };
            fill_event(e, ctx, f);
            e.service_id = service_id;
            drop::from_packet(reason, Direction::Ingress, e);
        }
        None => drop::count(reason, Direction::Ingress),
    }
}

#[inline(always)]
pub fn drop_packet<C: Hook, I: Ip>(
    ctx: &C,
    f: &Flow<I>,
    reason: DropReason,
    service_id: u32,
) -> Action {
    record_drop(ctx, f, reason, service_id);
    Action::DROP
}
