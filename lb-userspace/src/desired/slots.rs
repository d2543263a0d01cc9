//! Slot layout of one frontend: which backend sits in which slot.
//!
//! Slots 1..=A hold the active backends and A+1..=A+T the terminating ones.
//! A backend that stays in the same region keeps its slot; a hole left by a
//! removed backend is filled by one that has to move anyway (typically the
//! one from the old last slot). So removing one of N backends rewrites one
//! slot instead of renumbering N-1 of them, and an unchanged service produces
//! no write at all (which is what makes an agent restart invisible).

use crate::collections::HashSet;

/// `previous`: backend ids in their current slot order.
/// `active`, `terminating`: the new sets, in a deterministic order.
pub fn plan(previous: &[u32], active: &[u32], terminating: &[u32]) -> Vec<u32> {
    let a = active.len();
    let total = a + terminating.len();
    let active_set: HashSet<u32> = active.iter().copied().collect();
    let terminating_set: HashSet<u32> = terminating.iter().copied().collect();

    let mut layout: Vec<Option<u32>> = vec![None; total];
    let mut placed = HashSet::default();
    for (i, id) in previous.iter().enumerate() {
        let stays = if i < a {
            active_set.contains(id)
        } else {
            i < total && terminating_set.contains(id)
        };
        if stays && placed.insert(*id) {
            layout[i] = Some(*id);
        }
    }
    let mut fill = |range: std::ops::Range<usize>, ids: &[u32]| {
        let mut missing = ids.iter().filter(|id| !placed.contains(*id));
        for slot in &mut layout[range] {
            if slot.is_none() {
                *slot = missing.next().copied();
            }
        }
    };
    fill(0..a, active);
    fill(a..total, terminating);
    layout
        .into_iter()
        .map(|s| s.expect("every slot filled"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::plan;

    #[test]
    fn unchanged_set_keeps_every_slot() {
        assert_eq!(plan(&[3, 1, 2], &[1, 2, 3], &[]), vec![3, 1, 2]);
    }

    #[test]
    fn removing_a_middle_backend_moves_only_the_last_one() {
        assert_eq!(plan(&[1, 2, 3, 4], &[1, 3, 4], &[]), vec![1, 4, 3]);
    }

    #[test]
    fn removing_the_last_backend_moves_nothing() {
        assert_eq!(plan(&[1, 2, 3], &[1, 2], &[]), vec![1, 2]);
    }

    #[test]
    fn added_backend_goes_to_the_end() {
        assert_eq!(plan(&[1, 2], &[1, 2, 9], &[]), vec![1, 2, 9]);
    }

    #[test]
    fn terminating_backends_follow_the_active_ones() {
        assert_eq!(plan(&[1, 2, 3], &[1, 3], &[2]), vec![1, 3, 2]);
        assert_eq!(plan(&[1, 3, 2], &[], &[1, 2, 3]), vec![1, 3, 2]);
    }

    #[test]
    fn empty_sets_give_no_slots() {
        assert!(plan(&[1, 2], &[], &[]).is_empty());
        assert_eq!(plan(&[], &[5, 6], &[7]), vec![5, 6, 7]);
    }
}
