//! Seeds `LB_SOCK_FILTER` and `LB_SOCK_COOKIES` from the reverse LRU at
//! every start.
//!
//! connect4/6 flag a backend's slot and the socket's cookie slot before
//! they index a socket under it, and sock_release skips the LRU when either
//! is clear (`lb_common::filter`). Entries an older build made (before the
//! filters existed, or with a filter since recreated) have no flags: left
//! so, their sockets' entries would stay until the LRU evicted them. So the
//! agent flags the slots of every entry it finds, after the new programs
//! are in the hooks: an entry the old programs add before the swap is in
//! the map by then, and the new programs flag their own. `LB_SOCK_TCP`'s
//! slots need no seeding: every build that claims them flags them.
use aya::maps::{Array, HashMap, MapData};
use lb_common::{
    filter::{fold6, sock_cookie_slot, sock_cookie_tag, sock_filter_slot, SOCK_COOKIE_SHARED},
    maps as names,
    revnat::{SockRevNat4Key, SockRevNat4Value, SockRevNat6Key, SockRevNat6Value},
};

use crate::maps::bpf::open_pinned;

/// The slots of the LRUs' entries, set in the filters; `capacity` is the
/// LRUs' size (the walk reads at most four times that). Returns how many
/// entries were read (a slot already set is not written again). Best
/// effort: an entry the walk misses (see below) only ages out of the LRU,
/// as every entry did before sock_release deleted them.
pub fn seed(pin_dir: &std::path::Path, capacity: u32) -> anyhow::Result<usize> {
    let walk_max = 4 * capacity as usize;
    let mut slots = std::collections::BTreeMap::new();
    let mut sockets = std::collections::BTreeMap::new();
    // A socket's tag in its slot, or "shared" for a slot of two.
    let mut note = |cookie: u64| {
        let tag = sock_cookie_tag(cookie);
        sockets
            .entry(sock_cookie_slot(cookie))
            .and_modify(|t| {
                if *t != tag {
                    *t = SOCK_COOKIE_SHARED;
                }
            })
            .or_insert(tag);
    };
    let v4: HashMap<MapData, SockRevNat4Key, SockRevNat4Value> =
        HashMap::try_from(open_pinned(pin_dir, names::LB4_SOCK_REVNAT)?)?;
    let mut entries = 0;
    // The walk is bounded: when the key to continue from is deleted under
    // it, the kernel starts again at the first (kernel/bpf/hashtab.c,
    // htab_map_get_next_key), which busy sockets closing could repeat.
    // Entries made after the swap need no seeding: the programs flag them.
    for key in v4.keys().map_while(Result::ok).take(walk_max) {
        entries += 1;
        slots.insert(sock_filter_slot(key.address, key.port), 1);
        note(key.cookie);
    }
    let v6: HashMap<MapData, SockRevNat6Key, SockRevNat6Value> =
        HashMap::try_from(open_pinned(pin_dir, names::LB6_SOCK_REVNAT)?)?;
    for key in v6.keys().map_while(Result::ok).take(walk_max) {
        entries += 1;
        slots.insert(sock_filter_slot(fold6(key.address), key.port), 1);
        note(key.cookie);
    }
    flag(pin_dir, names::LB_SOCK_FILTER, slots)?;
    flag(pin_dir, names::LB_SOCK_COOKIES, sockets)?;
    Ok(entries)
}

/// Sets these slots of a filter to these flags, as the programs do: a
/// clear slot takes the flag, one that holds another becomes "shared"
/// (`LB_SOCK_FILTER`'s flags are all 1, so a set slot stays as it is).
fn flag(
    pin_dir: &std::path::Path,
    name: &str,
    slots: std::collections::BTreeMap<u32, u8>,
) -> anyhow::Result<()> {
    let mut filter: Array<MapData, u8> = Array::try_from(open_pinned(pin_dir, name)?)?;
    for (slot, want) in slots {
        let now = filter.get(&slot, 0)?;
        if now == 0 {
            filter.set(slot, want, 0)?;
        } else if now != want && now != SOCK_COOKIE_SHARED {
            filter.set(slot, SOCK_COOKIE_SHARED, 0)?;
        }
    }
    Ok(())
}
