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
//! Only entries whose value changes are written.
use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
};

use lb_common::service::{SVC_FLAG_CLUSTER_IP, SVC_FLAG_VIP_MARKER};

use crate::{
    desired::Desired,
    maps::{
        state::{is_marker, vip_marker_key},
        Family, MapOp, MapState, ServiceValue, SvcKey,
    },
};

/// `replaced`: master keys of the frontends the desired state replaces (all
/// frontends of the services being reconciled). `full`: also sweep entries no
/// frontend accounts for (after a restart or a failed apply).
pub fn diff(current: &MapState, replaced: &HashSet<SvcKey>, desired: &Desired, full: bool) -> Vec<MapOp> {
    let mut first = Vec::new(); // backends, revnat, markers to add
    let mut frontends = Vec::new(); // per-frontend slot/master/slot-delete sequences
    let mut removals = Vec::new(); // removed frontends
    let mut last = Vec::new(); // markers and backends to delete

    // Backend references and ClusterIP users after this change, as deltas.
    let mut ref_delta: HashMap<u32, i64> = HashMap::new();
    let mut vip_delta: HashMap<IpAddr, i64> = HashMap::new();

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
            *vip_delta.entry(fe.key.address).or_default() += 1;
        }
        let old_master = current.services.get(&fe.key);
        let old_total = old_master.map_or(0, |m| m.count as usize + m.terminating_count as usize);
        for slot in 1..=fe.slots.len() {
            let key = fe.key.with_slot(slot as u16);
            let want = fe.slot_value(slot);
            let have = current.services.get(&key);
            if have != Some(&want) {
                frontends.push(MapOp::UpsertService(key, want));
            }
            if have.map(|v| v.backend_id) != Some(want.backend_id) {
                *ref_delta.entry(want.backend_id).or_default() += 1;
                if let Some(h) = have {
                    *ref_delta.entry(h.backend_id).or_default() -= 1;
                }
            }
        }
        if old_master != Some(&fe.value) {
            frontends.push(MapOp::UpsertService(fe.key, fe.value));
        }
        for slot in fe.slots.len() + 1..=old_total {
            let key = fe.key.with_slot(slot as u16);
            if let Some(h) = current.services.get(&key) {
                frontends.push(MapOp::DeleteService(key));
                *ref_delta.entry(h.backend_id).or_default() -= 1;
            }
        }
    }

    let mut gone: Vec<SvcKey> = replaced.iter().filter(|k| !new_keys.contains(k)).copied().collect();
    gone.sort_unstable();
    for key in &gone {
        remove_frontend(current, key, &mut removals, &mut ref_delta, &mut vip_delta);
    }
    // Old ClusterIP users among the replaced frontends that stay.
    for key in replaced.iter().filter(|k| new_keys.contains(k)) {
        if current.services.get(key).is_some_and(|v| v.flags & SVC_FLAG_CLUSTER_IP != 0) {
            *vip_delta.entry(key.address).or_default() -= 1;
        }
    }

    if full {
        sweep_strays(current, replaced, desired, &mut removals, &mut ref_delta);
    }

    // VIP markers: present exactly while some ClusterIP frontend uses the address.
    let mut addresses: Vec<IpAddr> = vip_delta.keys().copied().collect();
    if full {
        addresses.extend(current.services.iter().filter(|(k, v)| is_marker(k, v)).map(|(k, _)| k.address));
        addresses.extend(desired.frontends.iter().filter(|f| f.is_cluster_ip()).map(|f| f.key.address));
    }
    addresses.sort_unstable();
    addresses.dedup();
    for address in addresses {
        let users = current.vip_refs(address) as i64 + vip_delta.get(&address).copied().unwrap_or(0);
        let marker = vip_marker_key(address);
        let has = current.has_marker(address);
        if users > 0 && !has {
            first.push(MapOp::UpsertService(marker, ServiceValue { flags: SVC_FLAG_VIP_MARKER, ..Default::default() }));
        } else if users <= 0 && has {
            last.push(MapOp::DeleteService(marker));
        }
    }

    // Backends nobody names any more.
    let mut candidates: Vec<u32> = ref_delta.keys().copied().collect();
    if full {
        candidates.extend(current.backends.keys().copied());
    }
    candidates.sort_unstable();
    candidates.dedup();
    for id in candidates {
        let refs = current.backend_refs(id) as i64 + ref_delta.get(&id).copied().unwrap_or(0);
        if refs <= 0 && current.backends.contains_key(&id) && !desired.backends.contains_key(&id) {
            last.push(MapOp::DeleteBackend(id, Family::of(&current.backends[&id].address)));
        }
    }

    let mut ops = first;
    ops.extend(frontends);
    ops.extend(removals);
    ops.extend(last);
    ops
}

fn remove_frontend(
    current: &MapState,
    key: &SvcKey,
    out: &mut Vec<MapOp>,
    ref_delta: &mut HashMap<u32, i64>,
    vip_delta: &mut HashMap<IpAddr, i64>,
) {
    let Some(master) = current.services.get(key) else {
        return;
    };
    out.push(MapOp::DeleteService(*key));
    if master.flags & SVC_FLAG_CLUSTER_IP != 0 {
        *vip_delta.entry(key.address).or_default() -= 1;
    }
    let total = master.count as u32 + master.terminating_count as u32;
    for slot in 1..=total {
        let k = key.with_slot(slot as u16);
        if let Some(v) = current.services.get(&k) {
            out.push(MapOp::DeleteService(k));
            *ref_delta.entry(v.backend_id).or_default() -= 1;
        }
    }
    out.push(MapOp::DeleteRevNat(master.service_id, key.family()));
}

/// Full sync only: entries that no frontend accounts for, left by a crash
/// between two writes (a slot past its master's end, a slot without a
/// master, a reverse-NAT entry of no frontend).
fn sweep_strays(
    current: &MapState,
    replaced: &HashSet<SvcKey>,
    desired: &Desired,
    out: &mut Vec<MapOp>,
    ref_delta: &mut HashMap<u32, i64>,
) {
    let old_total = |k: &SvcKey| {
        current.services.get(k).map_or(0, |m| m.count as usize + m.terminating_count as usize)
    };
    // Slots the main diff already writes or deletes, per master.
    let mut covered: HashMap<SvcKey, usize> = HashMap::new();
    for f in &desired.frontends {
        covered.insert(f.key, f.slots.len().max(old_total(&f.key)));
    }
    for k in replaced {
        covered.entry(*k).or_insert_with(|| old_total(k));
    }
    let mut strays: Vec<(SvcKey, u32)> = current
        .services
        .iter()
        .filter(|(k, _)| k.slot > 0)
        .filter(|(k, _)| k.slot as usize > covered.get(&k.with_slot(0)).copied().unwrap_or(0))
        .map(|(k, v)| (*k, v.backend_id))
        .collect();
    strays.sort_unstable();
    for (k, backend_id) in strays {
        out.push(MapOp::DeleteService(k));
        *ref_delta.entry(backend_id).or_default() -= 1;
    }
    // Reverse-NAT entries of desired frontends stay; those of replaced ones are
    // deleted with their frontend; anything else is a stray.
    let mut handled: HashSet<u32> = desired.frontends.iter().map(|f| f.value.service_id).collect();
    handled.extend(replaced.iter().filter_map(|k| current.services.get(k)).map(|m| m.service_id));
    let mut stale: Vec<u32> = current.revnat.keys().filter(|id| !handled.contains(id)).copied().collect();
    stale.sort_unstable();
    out.extend(stale.into_iter().map(|id| MapOp::DeleteRevNat(id, Family::of(&current.revnat[&id].address))));
}
