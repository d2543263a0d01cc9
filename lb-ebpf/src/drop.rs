//! Drop accounting shared by every program.
use lb_common::drop::{drop_index, Direction, DropReason};

use crate::maps::LB_DROPS;

#[inline(always)]
pub fn count(reason: DropReason, direction: Direction) {
    if let Some(counter) = LB_DROPS.get_ptr_mut(drop_index(reason, direction)) {
        // Per-CPU slot: no other CPU writes it, a plain add is enough.
        unsafe { *counter += 1 };
    }
}
