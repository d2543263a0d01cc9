//! Drop accounting shared by every program: a per-CPU counter by reason and
//! direction, and a (rate-limited) event for `lbctl monitor --type drop`.
use lb_common::{
    drop::{drop_index, Direction, DropReason},
    event::{Event, EVENT_DROP},
};

use crate::{events, maps::LB_DROPS};

#[inline(always)]
pub fn count(reason: DropReason, direction: Direction) {
    if let Some(counter) = LB_DROPS.get_ptr_mut(drop_index(reason, direction)) {
        // Per-CPU slot: no other CPU writes it, a plain add is enough.
        // SAFETY: a per-CPU slot (see above), valid for this run.
        unsafe { *counter += 1 };
    }
}

/// Counts the drop and marks the event as one.
#[inline(always)]
fn record(reason: DropReason, direction: Direction, event: &mut Event) {
    count(reason, direction);
    event.kind = EVENT_DROP;
    event.reason = reason as u32;
}

/// A socket hook's drop: counted and reported with the calling task;
/// `event` carries the flow and hook.
#[inline(always)]
pub fn from_socket(reason: DropReason, direction: Direction, event: &mut Event) {
    record(reason, direction, event);
    events::emit(event);
}

/// A packet program's drop (tc, XDP): no task context to report.
#[inline(always)]
pub fn from_packet(reason: DropReason, direction: Direction, event: &mut Event) {
    record(reason, direction, event);
    events::emit_packet(event);
}
