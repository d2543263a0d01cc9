//! Maglev consistent hashing (Eisenbud et al., "Maglev: A Fast and Reliable
//! Software Network Load Balancer", NSDI 2016, section 3.4, Pseudocode 1).
//!
//! Every backend gets a permutation of the M table slots from two hashes of
//! its stable name; backends take turns claiming their next free preferred
//! slot until the table is full. The same backend set gives the same table
//! on every node (the hash is xxHash64 with fixed seeds: specified, unlike
//! std's DefaultHasher, and pinned below by golden vectors), so a flow hashes
//! to the same backend whichever node it reaches; removing one of N backends
//! moves only about 1/N of the slots.
//!
//! Weights: in each round a backend claims `weight` slots instead of one, so
//! its share of the table follows its weight.
use xxhash_rust::xxh64::xxh64;

/// Seeds of the two hashes (offset and skip). Part of the cross-node contract.
const SEED_OFFSET: u64 = 0x6d61_676c_6576_3031; // "maglev01"
const SEED_SKIP: u64 = 0x6d61_676c_6576_3032; // "maglev02"

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MaglevBackend {
    /// Stable identity, the same on every node ("10.244.1.2:8080/TCP").
    pub name: String,
    /// What the table stores (the local backend id).
    pub id: u32,
    /// Relative weight, at least 1.
    pub weight: u32,
}

/// Builds the lookup table of size `m` (a prime). Backends are taken in name
/// order, whatever order they come in, so the table depends on the set only.
/// Returns an empty table when there is no backend.
pub fn build(backends: &[MaglevBackend], m: u32) -> Vec<u32> {
    let mut bs: Vec<&MaglevBackend> = backends.iter().filter(|b| b.weight > 0).collect();
    bs.sort_by(|a, b| a.name.cmp(&b.name));
    bs.dedup_by(|a, b| a.name == b.name);
    if bs.is_empty() || m < 2 {
        return Vec::new();
    }
    let m64 = m as u64;
    // offset and skip per backend; the j-th preference is (offset + j*skip) mod M,
    // kept incrementally as `pos`.
    let mut pos: Vec<u64> = Vec::with_capacity(bs.len());
    let mut skip: Vec<u64> = Vec::with_capacity(bs.len());
    for b in &bs {
        pos.push(xxh64(b.name.as_bytes(), SEED_OFFSET) % m64);
        skip.push(xxh64(b.name.as_bytes(), SEED_SKIP) % (m64 - 1) + 1);
    }
    const EMPTY: u32 = u32::MAX;
    let mut table = vec![EMPTY; m as usize];
    let mut filled = 0u64;
    'outer: loop {
        for (i, b) in bs.iter().enumerate() {
            for _ in 0..b.weight {
                // Next preferred slot that is still free.
                let mut c = pos[i];
                while table[c as usize] != EMPTY {
                    c = (c + skip[i]) % m64;
                }
                table[c as usize] = b.id;
                pos[i] = (c + skip[i]) % m64;
                filled += 1;
                if filled == m64 {
                    break 'outer;
                }
            }
        }
    }
    table
}

/// Whether `m` is a table size the agent accepts.
pub fn valid_size(m: u32) -> bool {
    lb_common::maps::MAGLEV_PRIMES.contains(&m)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn backends(n: u32) -> Vec<MaglevBackend> {
        (0..n)
            .map(|i| MaglevBackend {
                name: format!("10.244.{}.{}:8080/TCP", i / 250, i % 250 + 1),
                id: i + 1,
                weight: 1,
            })
            .collect()
    }

    fn counts(t: &[u32]) -> HashMap<u32, usize> {
        let mut c = HashMap::new();
        for id in t {
            *c.entry(*id).or_default() += 1;
        }
        c
    }

    #[test]
    fn every_slot_is_filled_with_a_known_backend() {
        for (n, m) in [(1, 251), (3, 251), (10, 1021), (100, 16_381)] {
            let bs = backends(n);
            let t = build(&bs, m);
            assert_eq!(t.len(), m as usize);
            assert!(t.iter().all(|id| *id >= 1 && *id <= n), "n={n} m={m}");
            assert_eq!(counts(&t).len(), n as usize, "every backend gets slots");
        }
        assert!(build(&[], 251).is_empty());
    }

    #[test]
    fn balance_within_the_papers_bound_when_m_is_at_least_100_n() {
        // NSDI'16 §5.3: with M ≥ 100·N the slot counts differ by a few percent
        // at most. Here: max/min ≤ 1.1 over several sizes.
        for (n, m) in [(10, 1021), (100, 16_381), (163, 16_381), (600, 65_537)] {
            let c = counts(&build(&backends(n), m));
            let (max, min) = (
                *c.values().max().unwrap() as f64,
                *c.values().min().unwrap() as f64,
            );
            assert!(max / min <= 1.1, "n={n} m={m}: max {max} min {min}");
        }
    }

    #[test]
    fn removing_one_of_n_backends_moves_close_to_one_nth_of_the_slots() {
        for (n, m) in [(10, 16_381), (50, 16_381), (100, 65_537)] {
            let all = backends(n);
            let before = build(&all, m);
            let after = build(&all[..n as usize - 1], m);
            let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count() as f64 / m as f64;
            let ideal = 1.0 / n as f64;
            // The removed backend's own slots must move (≈1/N); Maglev moves a
            // little more than that (paper, Fig. 11), never much more.
            assert!(
                moved >= ideal * 0.9 && moved <= ideal * 2.0,
                "n={n}: moved {moved:.4}, ideal {ideal:.4}"
            );
            // Slots of other backends stay where they were.
            let kept = before
                .iter()
                .zip(&after)
                .filter(|(a, _)| **a != n)
                .filter(|(a, b)| a == b)
                .count() as f64;
            let others = before.iter().filter(|a| **a != n).count() as f64;
            assert!(
                kept / others > 0.97,
                "n={n}: {:.4} of the other backends' slots kept",
                kept / others
            );
        }
    }

    #[test]
    fn weights_are_respected() {
        let mut bs = backends(3);
        bs[0].weight = 1;
        bs[1].weight = 2;
        bs[2].weight = 4;
        let c = counts(&build(&bs, 16_381));
        let share = |id| c[&id] as f64 / 16_381.0;
        assert!((share(1) - 1.0 / 7.0).abs() < 0.01, "{c:?}");
        assert!((share(2) - 2.0 / 7.0).abs() < 0.01, "{c:?}");
        assert!((share(3) - 4.0 / 7.0).abs() < 0.01, "{c:?}");
    }

    #[test]
    fn the_table_depends_on_the_set_not_the_order() {
        let bs = backends(20);
        let mut rev = bs.clone();
        rev.reverse();
        assert_eq!(build(&bs, 4093), build(&rev, 4093));
    }

    #[test]
    fn golden_vectors_pin_the_hash_across_builds_and_nodes() {
        // Two agents built differently must fill identical tables: if this
        // fails, the hash or the construction changed, which breaks flows
        // across nodes during a rolling upgrade. Do not update lightly.
        let t = build(&backends(3), 251);
        let head: Vec<u32> = t[..24].to_vec();
        assert_eq!(head, GOLDEN_HEAD, "first slots of a 3-backend, M=251 table");
        let mut c: Vec<(u32, usize)> = counts(&t).into_iter().collect();
        c.sort();
        assert_eq!(c, GOLDEN_COUNTS);
        assert_eq!(
            xxh64(b"10.244.0.1:8080/TCP", SEED_OFFSET) % 251,
            GOLDEN_OFFSET_0
        );
    }

    const GOLDEN_HEAD: [u32; 24] = [
        2, 2, 2, 3, 1, 3, 2, 1, 3, 3, 3, 2, 1, 2, 3, 2, 1, 2, 1, 2, 1, 3, 2, 1,
    ];
    const GOLDEN_COUNTS: [(u32, usize); 3] = [(1, 84), (2, 84), (3, 83)];
    const GOLDEN_OFFSET_0: u64 = 177;
}
