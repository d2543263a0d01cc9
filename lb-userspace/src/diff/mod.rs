//! Diff: the map operations that turn the current state into the desired one
//! for a set of frontends, in an order that is safe for concurrent readers
//! (docs/datapath.md, "Services: a master entry and one entry per backend slot"):
//!
//! 1. new and changed backends, reverse-NAT entries and VIP markers,
//!    so everything a slot or a socket can name exists first;
//! 2. per frontend: slot writes, then the master entry, then slots past the
//!    new end are deleted, so a reader that saw either master finds its slots;
//! 3. removed frontends: master first, then its slots and reverse-NAT entry;
//! 4. VIP markers and backends nobody references any more.
//!
//! Only entries whose value changes are written. `sweep` removes what no
//! frontend accounts for (after a restart or a failed write). Both wrap
//! their entries in the frontend filter's words (`filter`), so what they
//! return is every write to make, in order; `filter::repair` makes the
//! filter exact after a full sync.
use std::net::IpAddr;

pub mod filter;

use lb_common::service::{SVC_FLAG_CLUSTER_IP, SVC_FLAG_VIP_MARKER};

use crate::{
    collections::{HashMap, HashSet},
    desired::Desired,
    maps::{
        state::{is_marker, vip_marker_key},
        Family, MapOp, MapState, ServiceValue, SvcKey,
    },
    net::Cidr,
};

/// Reference changes a diff makes, to find markers and backends that become unused.
#[derive(Default)]
struct Deltas {
    backend_refs: HashMap<u32, i64>,
    vip_users: HashMap<IpAddr, i64>,
}

/// `replaced`: master keys of the frontends the desired state replaces (the
/// frontends the services being reconciled own now).
pub fn diff(current: &MapState, replaced: &HashSet<SvcKey>, desired: &Desired) -> Vec<MapOp> {
    filter::guard(current, entries(current, replaced, desired))
}

/// `diff` without the filter's words.
fn entries(current: &MapState, replaced: &HashSet<SvcKey>, desired: &Desired) -> Vec<MapOp> {
    let mut early = Vec::new(); // affinity entries to withdraw before anything else
    let mut after_masters = Vec::new(); // Maglev tables that shrink or go
    let mut range_deletes = Vec::new(); // source ranges withdrawn, after the master
    let mut first = Vec::new(); // backends, revnat, affinity entries, markers to add
    let mut frontends = Vec::new(); // per-frontend slot/master/slot-delete sequences
    let mut removals = Vec::new(); // removed frontends
    let mut d = Deltas::default();

    let mut ids: Vec<_> = desired.backends.keys().copied().collect();
    ids.sort_unstable();
    for id in ids {
        let b = desired.backends[&id];
        if current.backends.get(&id) != Some(&b) {
            first.push(MapOp::UpsertBackend(id, b));
        }
    }

    let new_keys: HashSet<SvcKey> = desired.frontends.iter().map(|f| f.key).collect();
    for fe in &desired.frontends {
        if current.revnat.get(&fe.value.service_id) != Some(&fe.revnat) {
            first.push(MapOp::UpsertRevNat(fe.value.service_id, fe.revnat));
        }
        if fe.is_cluster_ip() {
            *d.vip_users.entry(fe.key.address).or_default() += 1;
        }
        // A backend a client may no longer stick to is withdrawn first.
        let id = fe.value.service_id;
        let have = current.affinity.get(&id);
        let want: std::collections::BTreeSet<u32> = fe.affinity.iter().copied().collect();
        for b in have.into_iter().flatten().filter(|b| !want.contains(b)) {
            early.push(MapOp::DeleteAffinityMatch(id, *b));
        }
        for b in want.iter().filter(|b| !have.is_some_and(|h| h.contains(b))) {
            first.push(MapOp::UpsertAffinityMatch(id, *b));
        }
        // The affinity group: a missing or stale one only makes a client's
        // memory per frontend for a moment, so its order is free.
        match (fe.affinity_group, current.affinity_groups.get(&id)) {
            (Some(g), Some(old)) if g == *old => {}
            (Some(g), _) => first.push(MapOp::SetAffinityGroup(id, g)),
            (None, Some(_)) => early.push(MapOp::DeleteAffinityGroup(id)),
            (None, None) => {}
        }
        // A source range is added before the master that turns the check on,
        // and withdrawn after the master that turns it off: a client inside
        // both the old and the new ranges is never dropped.
        let have = current.source_ranges.get(&id);
        for r in &fe.source_ranges {
            if !have.is_some_and(|h| h.contains(r)) {
                first.push(MapOp::UpsertSourceRange(id, *r));
            }
        }
        for r in have.into_iter().flatten() {
            if !fe.source_ranges.contains(r) {
                range_deletes.push(MapOp::DeleteSourceRange(id, *r));
            }
        }
        // The programs read the table size from the master, then index the
        // table: the size must never pass the table's end. A new table, or
        // one at least as big, goes in before the master (the old size
        // indexes inside it); a smaller one after it (the new size indexes
        // inside the old table); a table no longer wanted after the master
        // that stops naming Maglev.
        match (&fe.maglev, current.maglev.get(&id)) {
            (Some(t), Some(old)) if t == old => {}
            (Some(t), Some(old)) if t.len() < old.len() => {
                after_masters.push(MapOp::SetMaglev(id, t.clone()));
            }
            (Some(t), _) => first.push(MapOp::SetMaglev(id, t.clone())),
            (None, Some(_)) => after_masters.push(MapOp::DeleteMaglev(id)),
            (None, None) => {}
        }
        let old_master = current.services.get(&fe.key);
        if old_master.is_some_and(|m| m.flags & SVC_FLAG_CLUSTER_IP != 0) {
            *d.vip_users.entry(fe.key.address).or_default() -= 1;
        }
        let old_total = old_master.map_or(0, |m| m.master_slots() as usize);
        // Maintenance slots (after the selectable ones) are written after
        // the master: before it, the old master may still count such a slot
        // as selectable, and a drained backend would take a new flow.
        let selectable = fe.value.count as usize + fe.value.terminating_count as usize;
        let mut parked = Vec::new();
        for slot in 1..=fe.slots.len() {
            let key = fe.key.with_slot(slot as u16);
            let want = fe.slot_value(slot);
            let have = current.services.get(&key);
            if have != Some(&want) {
                if slot > selectable {
                    parked.push(MapOp::UpsertService(key, want));
                } else {
                    frontends.push(MapOp::UpsertService(key, want));
                }
            }
            if have.map(|v| v.backend_id) != Some(want.backend_id) {
                *d.backend_refs.entry(want.backend_id).or_default() += 1;
                if let Some(h) = have {
                    *d.backend_refs.entry(h.backend_id).or_default() -= 1;
                }
            }
        }
        if old_master != Some(&fe.value) {
            frontends.push(MapOp::UpsertService(fe.key, fe.value));
        }
        frontends.extend(parked);
        for slot in fe.slots.len() + 1..=old_total {
            let key = fe.key.with_slot(slot as u16);
            if let Some(h) = current.services.get(&key) {
                frontends.push(MapOp::DeleteService(key));
                *d.backend_refs.entry(h.backend_id).or_default() -= 1;
            }
        }
    }

    let mut gone: Vec<SvcKey> = replaced
        .iter()
        .filter(|k| !new_keys.contains(k))
        .copied()
        .collect();
    gone.sort_unstable();
    for key in &gone {
        remove_frontend(current, key, &mut removals, &mut d);
    }

    let addresses: Vec<IpAddr> = d.vip_users.keys().copied().collect();
    let (add_markers, del_markers) = markers(current, &d, &addresses);
    let candidates: Vec<u32> = d.backend_refs.keys().copied().collect();
    let del_backends = unreferenced_backends(current, &d, desired, &candidates);

    let mut ops = early;
    ops.extend(add_markers);
    ops.extend(first);
    ops.extend(frontends);
    ops.extend(after_masters);
    ops.extend(range_deletes);
    ops.extend(removals);
    ops.extend(del_markers);
    ops.extend(del_backends);
    ops
}

/// Full-sync cleanup, run after every wanted service is in place: removes the
/// frontends nobody owns (`unowned`) and every entry no remaining frontend
/// accounts for, left by a crash between two writes (a slot past its
/// master's end or without a master, a reverse-NAT entry of no frontend, a
/// VIP marker without a ClusterIP, a backend no slot names).
pub fn sweep(current: &MapState, unowned: &HashSet<SvcKey>) -> Vec<MapOp> {
    filter::guard(current, sweep_entries(current, unowned))
}

/// `sweep` without the filter's words.
fn sweep_entries(current: &MapState, unowned: &HashSet<SvcKey>) -> Vec<MapOp> {
    let mut ops = Vec::new();
    let mut d = Deltas::default();
    let mut gone: Vec<SvcKey> = unowned.iter().copied().collect();
    gone.sort_unstable();
    for key in &gone {
        remove_frontend(current, key, &mut ops, &mut d);
    }

    let total = |k: &SvcKey| {
        current
            .services
            .get(k)
            .map_or(0, |m| m.master_slots() as usize)
    };
    let mut strays: Vec<(SvcKey, u32)> = current
        .services
        .iter()
        .filter(|(k, _)| k.slot > 0)
        .filter(|(k, _)| {
            let master = k.with_slot(0);
            // Slots of removed frontends are deleted with them (up to their total).
            k.slot as usize > total(&master) || !current.services.contains_key(&master)
        })
        .map(|(k, v)| (*k, v.backend_id))
        .collect();
    strays.sort_unstable();
    for (k, backend_id) in strays {
        ops.push(MapOp::DeleteService(k));
        *d.backend_refs.entry(backend_id).or_default() -= 1;
    }

    let live: HashSet<u32> = current
        .frontends()
        .filter(|(k, _)| !unowned.contains(k))
        .map(|(_, v)| v.service_id)
        .collect();
    let removed: HashSet<u32> = gone
        .iter()
        .filter_map(|k| current.services.get(k))
        .map(|m| m.service_id)
        .collect();
    let mut orphans: Vec<(u32, u32)> = current
        .affinity
        .iter()
        .filter(|(id, _)| !live.contains(id) && !removed.contains(id))
        .flat_map(|(id, set)| set.iter().map(move |b| (*id, *b)))
        .collect();
    orphans.sort_unstable();
    ops.extend(
        orphans
            .into_iter()
            .map(|(id, b)| MapOp::DeleteAffinityMatch(id, b)),
    );
    let mut groups: Vec<u32> = current
        .affinity_groups
        .keys()
        .filter(|id| !live.contains(id) && !removed.contains(id))
        .copied()
        .collect();
    groups.sort_unstable();
    ops.extend(groups.into_iter().map(MapOp::DeleteAffinityGroup));
    let mut tables: Vec<u32> = current
        .maglev
        .keys()
        .filter(|id| !live.contains(id) && !removed.contains(id))
        .copied()
        .collect();
    tables.sort_unstable();
    ops.extend(tables.into_iter().map(MapOp::DeleteMaglev));
    let mut ranges: Vec<(u32, Cidr)> = current
        .source_ranges
        .iter()
        .filter(|(id, _)| !live.contains(id) && !removed.contains(id))
        .flat_map(|(id, set)| set.iter().map(move |r| (*id, *r)))
        .collect();
    ranges.sort_unstable();
    ops.extend(
        ranges
            .into_iter()
            .map(|(id, r)| MapOp::DeleteSourceRange(id, r)),
    );
    let mut stale: Vec<u32> = current
        .revnat
        .keys()
        .filter(|id| !live.contains(id) && !removed.contains(id))
        .copied()
        .collect();
    stale.sort_unstable();
    ops.extend(
        stale
            .into_iter()
            .map(|id| MapOp::DeleteRevNat(id, Family::of(&current.revnat[&id].address))),
    );

    // Every address that has or needs a marker.
    let mut addresses: Vec<IpAddr> = current
        .services
        .iter()
        .filter(|(k, v)| is_marker(k, v))
        .map(|(k, _)| k.address)
        .collect();
    addresses.extend(
        current
            .frontends()
            .filter(|(_, v)| v.flags & SVC_FLAG_CLUSTER_IP != 0)
            .map(|(k, _)| k.address),
    );
    let (add_markers, del_markers) = markers(current, &d, &addresses);
    let all_backends: Vec<u32> = current.backends.keys().copied().collect();
    let del_backends = unreferenced_backends(current, &d, &Desired::default(), &all_backends);

    let mut out = add_markers;
    out.extend(ops);
    out.extend(del_markers);
    out.extend(del_backends);
    out
}

fn remove_frontend(current: &MapState, key: &SvcKey, out: &mut Vec<MapOp>, d: &mut Deltas) {
    let Some(master) = current.services.get(key) else {
        return;
    };
    for b in current
        .affinity
        .get(&master.service_id)
        .into_iter()
        .flatten()
    {
        out.push(MapOp::DeleteAffinityMatch(master.service_id, *b));
    }
    if current.affinity_groups.contains_key(&master.service_id) {
        out.push(MapOp::DeleteAffinityGroup(master.service_id));
    }
    out.push(MapOp::DeleteService(*key));
    if master.flags & SVC_FLAG_CLUSTER_IP != 0 {
        *d.vip_users.entry(key.address).or_default() -= 1;
    }
    let total = master.master_slots();
    for slot in 1..=total {
        let k = key.with_slot(slot as u16);
        if let Some(v) = current.services.get(&k) {
            out.push(MapOp::DeleteService(k));
            *d.backend_refs.entry(v.backend_id).or_default() -= 1;
        }
    }
    if current.maglev.contains_key(&master.service_id) {
        out.push(MapOp::DeleteMaglev(master.service_id));
    }
    for r in current
        .source_ranges
        .get(&master.service_id)
        .into_iter()
        .flatten()
    {
        out.push(MapOp::DeleteSourceRange(master.service_id, *r));
    }
    out.push(MapOp::DeleteRevNat(master.service_id, key.family()));
}

/// VIP markers to add and to delete among `addresses`: a marker exists
/// exactly while some ClusterIP frontend uses the address.
fn markers(current: &MapState, d: &Deltas, addresses: &[IpAddr]) -> (Vec<MapOp>, Vec<MapOp>) {
    let mut addresses = addresses.to_vec();
    addresses.sort_unstable();
    addresses.dedup();
    let mut add = Vec::new();
    let mut del = Vec::new();
    for address in addresses {
        let users =
            i64::from(current.vip_refs(address)) + d.vip_users.get(&address).copied().unwrap_or(0);
        let has = current.has_marker(address);
        if users > 0 && !has {
            add.push(MapOp::UpsertService(
                vip_marker_key(address),
                ServiceValue {
                    flags: SVC_FLAG_VIP_MARKER,
                    ..Default::default()
                },
            ));
        } else if users <= 0 && has {
            del.push(MapOp::DeleteService(vip_marker_key(address)));
        }
    }
    (add, del)
}

/// Backends among `candidates` that no slot names after the change.
fn unreferenced_backends(
    current: &MapState,
    d: &Deltas,
    desired: &Desired,
    candidates: &[u32],
) -> Vec<MapOp> {
    let mut ids = candidates.to_vec();
    ids.sort_unstable();
    ids.dedup();
    ids.into_iter()
        .filter(|id| {
            let refs =
                i64::from(current.backend_refs(*id)) + d.backend_refs.get(id).copied().unwrap_or(0);
            refs <= 0 && current.backends.contains_key(id) && !desired.backends.contains_key(id)
        })
        .map(|id| MapOp::DeleteBackend(id, Family::of(&current.backends[&id].address)))
        .collect()
}
