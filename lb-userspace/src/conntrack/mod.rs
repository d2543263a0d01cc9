//! North-south conntrack (`LB4_CT`, `LB6_CT`) seen from user space: which
//! entries are over, and the garbage collector that deletes them. Written
//! once over the address type (`u32` or `[u32; 4]`), like the programs.
//!
//! The programs treat an entry past its lifetime as absent, but nothing in
//! the kernel deletes it: the tables are LRUs, which only evict under
//! pressure. The collector (`gc`) deletes expired entries, so SNAT ports and
//! memory come back and `lbctl ct list` shows what is live, the way
//! Cilium's agent sweeps its CT maps (pkg/maps/ctmap/gc).
pub mod gc;

use lb_common::{
    config::{CFG_CT_CLOSING_S, CFG_CT_TCP_S, CFG_CT_TCP_SYN_S, CFG_CT_UDP_S},
    conntrack::{
        ct_lifetime_s, CtKey, CtTimeouts, CtValue, CT_F_LOCAL, CT_F_SNAT, CT_REVERSE, CT_SERVICE,
    },
};

use crate::collections::{HashMap, HashSet};

/// The lifetimes the programs use, from LB_CONFIG.
pub fn timeouts(config: &crate::datapath::config::RuntimeConfig) -> anyhow::Result<CtTimeouts> {
    use crate::datapath::config::ConfigSlots as _;
    Ok(CtTimeouts {
        tcp: config.get(CFG_CT_TCP_S)?,
        tcp_syn: config.get(CFG_CT_TCP_SYN_S)?,
        closing: config.get(CFG_CT_CLOSING_S)?,
        udp: config.get(CFG_CT_UDP_S)?,
    })
}

/// Seconds an entry has left at `now_ns` (negative: expired), as the
/// programs judge it (lb-ebpf `packet::ct::expired`).
pub fn remaining_s<A>(key: &CtKey<A>, value: &CtValue<A>, now_ns: u64, t: &CtTimeouts) -> i64 {
    let life = i64::from(ct_lifetime_s(key.proto, value.flags, t));
    let idle = (now_ns.saturating_sub(value.last_seen_ns) / 1_000_000_000) as i64;
    life - idle
}

/// Whether an entry is past its lifetime at `now_ns`, as the programs
/// judge it to the nanosecond (`remaining_s` rounds, for display).
pub fn expired<A>(key: &CtKey<A>, value: &CtValue<A>, now_ns: u64, t: &CtTimeouts) -> bool {
    let life = u64::from(ct_lifetime_s(key.proto, value.flags, t)) * 1_000_000_000;
    now_ns.saturating_sub(value.last_seen_ns) > life
}

/// The forward (client → frontend) entry a reverse entry of a SNAT or
/// local-backend flow belongs to. DSR entries learned on a backend's node
/// have none there.
pub fn forward_of<A: Copy>(key: &CtKey<A>, value: &CtValue<A>) -> Option<CtKey<A>> {
    if key.kind != CT_REVERSE {
        return None;
    }
    if value.flags & CT_F_SNAT != 0 {
        // backend → node:port; the client is nat_addr:nat_port.
        return Some(CtKey::new(
            value.nat_addr,
            value.addr,
            value.nat_port,
            value.port,
            key.proto,
            CT_SERVICE,
        ));
    }
    if value.flags & CT_F_LOCAL != 0 {
        // backend → client.
        return Some(CtKey::new(
            key.daddr, value.addr, key.dport, value.port, key.proto, CT_SERVICE,
        ));
    }
    None
}

/// The entries to delete: forward entries past their lifetime; reverse
/// entries of SNAT and local flows with their forward entry (they are only
/// refreshed by replies, and a one-way flow must keep its translation while
/// it sends); other reverse entries (DSR) past their own lifetime.
/// Reverse entries come first in the list: see `gc::sweep_table`.
pub fn expired_keys<A: Copy + Eq + std::hash::Hash>(
    entries: &[(CtKey<A>, CtValue<A>)],
    now_ns: u64,
    t: &CtTimeouts,
) -> Vec<CtKey<A>> {
    let live_forward: HashMap<CtKey<A>, &CtValue<A>> = entries
        .iter()
        .filter(|(k, v)| k.kind == CT_SERVICE && !expired(k, v, now_ns, t))
        .map(|(k, v)| (*k, v))
        .collect();
    let mut out = Vec::new();
    let mut seen = HashSet::default();
    for (k, v) in entries {
        let gone = if k.kind == CT_SERVICE {
            !live_forward.contains_key(k)
        } else {
            match forward_of(k, v) {
                Some(fk) => match live_forward.get(&fk) {
                    // Still the flow this entry translates for (a SNAT port
                    // can have moved on to another flow of the same client
                    // tuple after a reopen).
                    Some(fwd) => v.flags & CT_F_SNAT != 0 && fwd.nat_port != k.dport,
                    None => true,
                },
                None => expired(k, v, now_ns, t),
            }
        };
        if gone && seen.insert(*k) {
            out.push(*k);
        }
    }
    // Stable: the order within each kind stays the table's.
    out.sort_by_key(|k| k.kind == CT_SERVICE);
    out
}

/// The second look before deleting: `gone` was decided on a snapshot that
/// took a while to read, while the programs kept writing. A client that
/// reuses its port as its old flow expires gets a new flow under the same
/// keys; the snapshot may hold the new flow's reverse entry beside the old
/// flow's forward one (read before it was replaced), and deleting that
/// reverse entry leaves the new flow's packets translated one way only:
/// the backend's replies reach the node's stack, which answers RST, until
/// the client gives up. So every entry of `gone` and the forward entry it
/// depends on are read again (`read`), the decision is made again on those
/// values, and what is still to go is returned with the value it must still
/// hold when deleted (reverse entries first, as `expired_keys` lists them).
pub fn confirm_expired<A: Copy + Eq + std::hash::Hash>(
    gone: &[CtKey<A>],
    mut read: impl FnMut(&CtKey<A>) -> Option<CtValue<A>>,
    now_ns: u64,
    t: &CtTimeouts,
) -> Vec<(CtKey<A>, CtValue<A>)> {
    let mut fresh: HashMap<CtKey<A>, CtValue<A>> = HashMap::default();
    for k in gone {
        let Some(v) = read(k) else {
            continue; // deleted or evicted meanwhile
        };
        if let Some(fk) = forward_of(k, &v) {
            if let std::collections::hash_map::Entry::Vacant(e) = fresh.entry(fk) {
                if let Some(fv) = read(&fk) {
                    e.insert(fv);
                }
            }
        }
        fresh.insert(*k, v);
    }
    let entries: Vec<(CtKey<A>, CtValue<A>)> = fresh.iter().map(|(k, v)| (*k, *v)).collect();
    let was_gone: HashSet<CtKey<A>> = gone.iter().copied().collect();
    expired_keys(&entries, now_ns, t)
        .into_iter()
        .filter(|k| was_gone.contains(k))
        .map(|k| (k, fresh[&k]))
        .collect()
}

#[cfg(test)]
mod tests {
    use lb_common::conntrack::{
        Ct4Key, Ct4Value, CT_F_CLOSING, CT_F_DSR, CT_F_ESTABLISHED, CT_F_HOST,
    };

    use super::*;

    const S: u64 = 1_000_000_000;

    fn key(s: u32, d: u32, sp: u16, dp: u16, kind: u8) -> Ct4Key {
        Ct4Key::new(s, d, sp, dp, 6, kind)
    }

    fn val(addr: u32, port: u16, nat_addr: u32, nat_port: u16, flags: u16, seen: u64) -> Ct4Value {
        Ct4Value {
            backend_id: 1,
            service_id: 1,
            addr,
            nat_addr,
            port,
            nat_port,
            flags,
            backends_gen: 0,
            last_seen_ns: seen,
        }
    }

    /// A SNAT flow: client 1:100 → frontend 2:80, backend 3:8080 via node 2:6000.
    fn snat_flow(flags: u16, seen: u64) -> [(Ct4Key, Ct4Value); 2] {
        [
            (
                key(1, 2, 100, 80, CT_SERVICE),
                val(3, 8080, 2, 6000, CT_F_SNAT | flags, seen),
            ),
            (
                key(3, 2, 8080, 6000, CT_REVERSE),
                val(2, 80, 1, 100, CT_F_SNAT | flags, seen),
            ),
        ]
    }

    #[test]
    fn a_live_flow_stays_and_an_idle_one_goes_with_its_reverse_entry() {
        let t = CtTimeouts::default();
        let flow = snat_flow(CT_F_ESTABLISHED, 10 * S);
        assert!(expired_keys(&flow, 20 * S, &t).is_empty());
        // Established TCP lives 6 h; at 6 h + 11 s both entries go.
        let gone = expired_keys(&flow, (21_600 + 11) * S, &t);
        assert_eq!(gone.len(), 2, "{gone:?}");
    }

    /// A host connection node 2:100 → peer 3:8080 whose tuple clashed,
    /// moved to port 6001 (lb-ebpf `packet::host_flow`): the programs key
    /// its entries like a SNAT flow's, the node's tuple in the client's
    /// place, so the sweep ages them as one.
    #[test]
    fn a_moved_host_connection_ages_like_a_snat_flow() {
        let t = CtTimeouts::default();
        let flags = CT_F_SNAT | CT_F_HOST | CT_F_ESTABLISHED;
        let fwd = (
            key(2, 3, 100, 8080, CT_SERVICE),
            val(3, 8080, 2, 6001, flags, 10 * S),
        );
        let rev = (
            key(3, 2, 8080, 6001, CT_REVERSE),
            val(3, 8080, 2, 100, flags, 10 * S),
        );
        assert_eq!(forward_of(&rev.0, &rev.1), Some(fwd.0));
        assert!(expired_keys(&[fwd, rev], 20 * S, &t).is_empty());
        // Its forward entry gone (reopened on its own port): the reverse goes.
        assert_eq!(expired_keys(&[rev], 20 * S, &t), [rev.0]);
    }

    #[test]
    fn a_flow_reopened_after_the_snapshot_keeps_both_entries() {
        let t = CtTimeouts::default();
        // The snapshot: the old flow's forward entry, closed long ago, and
        // the new flow's reverse entry under the same key (the client
        // reused its port; the new flow wrote the reverse entry first).
        let [(fk, old_fwd), (rk, _)] = snat_flow(CT_F_ESTABLISHED | CT_F_CLOSING, 10 * S);
        let [(_, new_fwd), (_, new_rev)] = snat_flow(0, 1_000 * S);
        let snapshot = [(fk, old_fwd), (rk, new_rev)];
        let gone = expired_keys(&snapshot, 1_000 * S, &t);
        assert_eq!(gone.len(), 2, "the snapshot alone condemns both: {gone:?}");
        // Read again, the forward entry is the new flow's: nothing goes.
        let now = [(fk, new_fwd), (rk, new_rev)];
        let read = |k: &Ct4Key| now.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        assert!(confirm_expired(&gone, read, 1_000 * S, &t).is_empty());
        // Still the old flow when read again: both go, reverse first.
        let old = snat_flow(CT_F_ESTABLISHED | CT_F_CLOSING, 10 * S);
        let read = |k: &Ct4Key| old.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        let confirmed = confirm_expired(&gone, read, 1_000 * S, &t);
        assert_eq!(
            confirmed.iter().map(|(k, _)| k.kind).collect::<Vec<_>>(),
            [CT_REVERSE, CT_SERVICE]
        );
        assert_eq!(
            confirmed[0].1, old[1].1,
            "deleted only if it still holds this"
        );
    }

    #[test]
    fn reverse_entries_are_listed_before_forward_ones() {
        // The table lists the forward entry first; the sweep must delete
        // the reverse one first (gc::sweep_table says why).
        let t = CtTimeouts::default();
        let flow = snat_flow(CT_F_ESTABLISHED | CT_F_CLOSING, 10 * S);
        let gone = expired_keys(&flow, 1_000 * S, &t);
        assert_eq!(
            gone.iter().map(|k| k.kind).collect::<Vec<_>>(),
            [CT_REVERSE, CT_SERVICE],
            "{gone:?}"
        );
    }

    #[test]
    fn a_closing_flow_goes_after_the_closing_timeout_not_the_established_one() {
        let t = CtTimeouts::default();
        let flow = snat_flow(CT_F_ESTABLISHED | CT_F_CLOSING, 10 * S);
        assert!(expired_keys(&flow, 19 * S, &t).is_empty());
        assert_eq!(expired_keys(&flow, 21 * S, &t).len(), 2);
        // Configured lifetimes win over the defaults.
        let short = CtTimeouts {
            closing: 2,
            ..Default::default()
        };
        assert_eq!(expired_keys(&flow, 13 * S, &short).len(), 2);
    }

    #[test]
    fn a_reverse_entry_lives_as_long_as_its_forward_flow_however_old_itself() {
        let t = CtTimeouts::default();
        let mut flow = snat_flow(CT_F_ESTABLISHED, 10 * S);
        // One-way traffic: only the forward entry gets refreshed.
        flow[0].1.last_seen_ns = 100_000 * S;
        assert!(expired_keys(&flow, 100_001 * S, &t).is_empty());
    }

    #[test]
    fn a_reverse_entry_whose_port_moved_on_goes() {
        let t = CtTimeouts::default();
        let mut flow = snat_flow(0, 10 * S);
        flow[0].1.nat_port = 6001; // the client tuple now uses another port
        assert_eq!(expired_keys(&flow, 11 * S, &t), vec![flow[1].0]);
    }

    #[test]
    fn a_dsr_entry_on_the_backends_node_expires_on_its_own() {
        let t = CtTimeouts {
            udp: 5,
            ..Default::default()
        };
        let mut k = key(3, 1, 8080, 100, CT_REVERSE);
        k.proto = 17;
        let e = [(k, val(2, 80, 0, 0, CT_F_DSR, 10 * S))];
        assert!(expired_keys(&e, 14 * S, &t).is_empty());
        assert_eq!(expired_keys(&e, 16 * S, &t), vec![k]);
    }

    #[test]
    fn an_unfinished_handshake_goes_after_the_syn_timeout() {
        let t = CtTimeouts::default();
        let flow = snat_flow(0, 0);
        assert!(expired_keys(&flow, 59 * S, &t).is_empty());
        assert_eq!(expired_keys(&flow, 61 * S, &t).len(), 2);
    }
}
