//! The frontend filter's words (`lb_common::filter`) around a list of
//! writes: part of the diff, so the diff's output is the whole write list
//! and the reconciler only makes it.
//!
//! The rule the packet programs rely on: a frontend's bit is set while the
//! frontend is in the maps. So the bits of frontends a list adds are set
//! before it, and the bits its deletes leave without any user are cleared
//! after it. A bit two frontends share stays until the last one goes.
use std::collections::{BTreeMap, BTreeSet};

use crate::{
    collections::HashMap,
    maps::{state::filter_bit, MapOp, MapState, SvcKey},
};

/// `ops` with the filter words they need: sets before, clears after.
/// `current` is the state before `ops`.
pub fn guard(current: &MapState, ops: Vec<MapOp>) -> Vec<MapOp> {
    let sets = sets_before(current, &ops);
    let clears = clears_after(current, &ops, &sets);
    if sets.is_empty() && clears.is_empty() {
        return ops;
    }
    let mut out = Vec::with_capacity(sets.len() + ops.len() + clears.len());
    out.extend(sets.iter().map(|(w, v)| MapOp::SetFilterWord(*w, *v)));
    out.extend(ops);
    out.extend(clears.into_iter().map(|(w, v)| MapOp::SetFilterWord(w, v)));
    out
}

/// The words that must gain the bits of the frontends `ops` upserts, with
/// their new values (the word as written, plus those bits).
fn sets_before(current: &MapState, ops: &[MapOp]) -> BTreeMap<u32, u64> {
    let mut words = BTreeMap::new();
    for op in ops {
        let MapOp::UpsertService(k, _) = op else {
            continue;
        };
        let Some(bit) = filter_bit(k) else { continue };
        if current.filter_bit_set(bit) {
            continue;
        }
        let (w, mask) = lb_common::filter::word_and_mask(bit);
        *words.entry(w).or_insert_with(|| written(current, w)) |= mask;
    }
    words
}

/// The words that can lose the bits of the frontends `ops` deletes, once
/// every op is made: the bit is set (as written, or by `sets`) and no entry
/// left after `ops` is on it.
fn clears_after(
    current: &MapState,
    ops: &[MapOp],
    sets: &BTreeMap<u32, u64>,
) -> BTreeMap<u32, u64> {
    // Whether each filtered key `ops` touches is present after them.
    let mut present: HashMap<SvcKey, bool> = HashMap::default();
    let mut deleted_bits = BTreeSet::new();
    for op in ops {
        let (k, now) = match op {
            MapOp::UpsertService(k, _) => (k, true),
            MapOp::DeleteService(k) => (k, false),
            _ => continue,
        };
        let Some(bit) = filter_bit(k) else { continue };
        if !now {
            deleted_bits.insert(bit);
        }
        present.insert(*k, now);
    }
    if deleted_bits.is_empty() {
        return BTreeMap::new();
    }
    // Users of each bit after `ops`: the users now, plus the keys that
    // appear, minus the keys that go.
    let mut users: HashMap<u32, i64> = HashMap::default();
    for (k, now) in &present {
        let Some(bit) = filter_bit(k) else { continue };
        if !deleted_bits.contains(&bit) {
            continue;
        }
        let was = current.services.contains_key(k);
        *users
            .entry(bit)
            .or_insert_with(|| i64::from(current.filter_users(bit))) +=
            i64::from(*now) - i64::from(was);
    }
    let mut words = BTreeMap::new();
    for bit in deleted_bits {
        let (w, mask) = lb_common::filter::word_and_mask(bit);
        let word_then = sets.get(&w).copied().unwrap_or_else(|| written(current, w));
        let in_use = users.get(&bit).is_some_and(|n| *n > 0);
        if word_then & mask == 0 || in_use {
            continue;
        }
        *words.entry(w).or_insert(word_then) &= !mask;
    }
    words
}

/// A word as written (absent: zero).
fn written(current: &MapState, word: u32) -> u64 {
    current.filter_words.get(&word).copied().unwrap_or(0)
}

/// After a full sync: the filter made exactly what the entries in `current`
/// need (every word that lacks a bit first, then every word with a bit too
/// many), then trusted by the programs.
pub fn repair(current: &MapState) -> Vec<MapOp> {
    let wanted = current.filter_wanted();
    let want = |w: &u32| wanted.get(w).copied().unwrap_or(0);
    let have = |w: &u32| written(current, *w);
    // In word order, for a log that reads the same every time.
    let words: BTreeSet<u32> = wanted
        .keys()
        .chain(current.filter_words.keys())
        .copied()
        .collect();
    let sets = words
        .iter()
        .filter(|w| have(w) | want(w) != have(w))
        .map(|w| MapOp::SetFilterWord(*w, have(w) | want(w)));
    // After the sets, a word holds have | want: clear what is not wanted.
    let clears = words
        .iter()
        .filter(|w| have(w) | want(w) != want(w))
        .map(|w| MapOp::SetFilterWord(*w, want(w)));
    let mut ops: Vec<MapOp> = sets.chain(clears).collect();
    if !current.filter_trusted {
        ops.push(MapOp::TrustFilter(true));
    }
    ops
}
