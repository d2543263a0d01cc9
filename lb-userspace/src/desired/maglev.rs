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

/// Seeds of the two hashes (offset and skip). Part of the cross-node
/// contract; a cluster-wide seed (`Seed`) is mixed into both.
const SEED_OFFSET: u64 = 0x6d61_676c_6576_3031; // "maglev01"
const SEED_SKIP: u64 = 0x6d61_676c_6576_3032; // "maglev02"

/// A cluster-wide seed for the tables (`--maglev-hash-seed`, Cilium's
/// `maglev.hashSeed`): every node must use the same one, or a flow that
/// reaches two nodes gets two backends. Without one (the default) the
/// tables are what they always were. With one, which backend a slot holds
/// cannot be worked out from the backends' names alone, so an outsider
/// cannot aim flows at one backend. The flow hash that picks the slot in
/// the programs keeps its fixed seed (`lb_common::nodeport::flow_hash`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seed {
    value: u64,
    fingerprint: Option<String>,
}

impl Seed {
    /// From the operator's text; empty: none.
    pub fn from_text(text: &str) -> Self {
        if text.is_empty() {
            return Self::default();
        }
        let value = xxh64(text.as_bytes(), 0);
        // Shown and exported instead of the seed, to compare nodes.
        let fingerprint = format!("{:08x}", xxh64(text.as_bytes(), SEED_OFFSET) >> 32);
        Self {
            value,
            fingerprint: Some(fingerprint),
        }
    }

    /// What `lbctl status` and `lb_maglev_seed_info` show: the seed's
    /// fingerprint, or `built-in`.
    pub fn fingerprint(&self) -> &str {
        self.fingerprint.as_deref().unwrap_or("built-in")
    }
}

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
    build_seeded(backends, m, &Seed::default())
}

/// `build` with a cluster-wide seed mixed into both hashes.
pub fn build_seeded(backends: &[MaglevBackend], m: u32, seed: &Seed) -> Vec<u32> {
    let mut bs: Vec<&MaglevBackend> = backends.iter().filter(|b| b.weight > 0).collect();
    bs.sort_by(|a, b| a.name.cmp(&b.name));
    bs.dedup_by(|a, b| a.name == b.name);
    if bs.is_empty() || m < 2 {
        return Vec::new();
    }
    let m64 = u64::from(m);
    let prefs: Vec<Preference> = bs
        .iter()
        .map(|b| Preference {
            offset: xxh64(b.name.as_bytes(), SEED_OFFSET ^ seed.value) % m64,
            skip: xxh64(b.name.as_bytes(), SEED_SKIP ^ seed.value) % (m64 - 1) + 1,
            id: b.id,
            weight: b.weight,
        })
        .collect();
    populate(&prefs, m)
}

/// A backend's permutation of the table (its j-th preferred slot is
/// `(offset + j·skip) mod M`), what it stores and its weight.
#[derive(Clone, Copy, Debug)]
struct Preference {
    offset: u64,
    skip: u64,
    id: u32,
    weight: u32,
}

/// The paper's Pseudocode 1, with the permutations kept incrementally (the
/// next preference as `pos`) instead of as an N×M matrix.
fn populate(prefs: &[Preference], m: u32) -> Vec<u32> {
    let m64 = u64::from(m);
    let mut pos: Vec<u64> = prefs.iter().map(|p| p.offset).collect();
    let skip: Vec<u64> = prefs.iter().map(|p| p.skip).collect();
    let bs = prefs;
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

/// Whether `m` is a table size the agent accepts: one a master entry can
/// name (`maglev_size_code`).
pub fn valid_size(m: u32) -> bool {
    lb_common::maps::maglev_size_code(m).is_some()
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

    /// The seed is a cluster-wide setting: equal seeds (on two nodes) give
    /// equal tables, another seed another table, none the built-in one;
    /// a seeded table is still a balanced Maglev table.
    #[test]
    fn a_seed_permutes_the_table_alike_on_every_node_and_none_keeps_the_built_in_one() {
        let bs = backends(10);
        let none = Seed::from_text("");
        assert_eq!(none, Seed::default());
        assert_eq!(none.fingerprint(), "built-in");
        assert_eq!(build_seeded(&bs, 1021, &none), build(&bs, 1021));
        let a = Seed::from_text("Zm9vYmFyYmF6cXV4");
        let a_again = Seed::from_text("Zm9vYmFyYmF6cXV4");
        let b = Seed::from_text("cXV4YmF6Zm9vYmFy");
        let ta = build_seeded(&bs, 1021, &a);
        assert_eq!(
            ta,
            build_seeded(&bs, 1021, &a_again),
            "another node, the same seed"
        );
        assert_ne!(ta, build(&bs, 1021), "seeded differs from built-in");
        assert_ne!(
            ta,
            build_seeded(&bs, 1021, &b),
            "seeds differ, tables differ"
        );
        let moved = ta
            .iter()
            .zip(build_seeded(&bs, 1021, &b))
            .filter(|(x, y)| **x != *y)
            .count();
        assert!(
            moved > 1021 / 2,
            "another seed reshuffles most slots: {moved}"
        );
        for c in counts(&ta).values() {
            assert!((92..=112).contains(c), "balanced: {:?}", counts(&ta));
        }
        assert_eq!(a.fingerprint(), a_again.fingerprint());
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint().len(), 8);
        assert!(!"Zm9vYmFyYmF6cXV4".contains(a.fingerprint()));
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
            let moved =
                before.iter().zip(&after).filter(|(a, b)| a != b).count() as f64 / f64::from(m);
            let ideal = 1.0 / f64::from(n);
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

    /// xxHash64 as the reference implementation computes it: the published
    /// vectors of xxhsum's sanity test, and our two seeds on a backend name
    /// computed outside this code base (the C library, xxHash 0.8.4, through
    /// python-xxhash 4.1.0).
    #[test]
    fn xxh64_matches_the_reference_implementation() {
        assert_eq!(xxh64(b"", 0), 0xef46_db37_51d8_e999);
        assert_eq!(xxh64(b"abc", 0), 0x44bc_2cf5_ad77_0999);
        assert_eq!(
            xxh64(b"10.244.0.1:8080/TCP", SEED_OFFSET),
            0xe0af_9e43_7f06_06b9
        );
        assert_eq!(
            xxh64(b"10.244.0.1:8080/TCP", SEED_SKIP),
            0xb354_1a0d_c031_5ac3
        );
    }

    /// Pseudocode 1 of the paper, literally: the N×M permutation matrix and
    /// the `next` indices. The implementation keeps neither; the two must
    /// fill the same table.
    fn paper_populate(perms: &[Vec<u64>], m: usize) -> Vec<usize> {
        let n = perms.len();
        let mut next = vec![0usize; n];
        let mut entry: Vec<Option<usize>> = vec![None; m];
        let mut filled = 0;
        loop {
            for i in 0..n {
                let mut c = perms[i][next[i]] as usize;
                while entry[c].is_some() {
                    next[i] += 1;
                    c = perms[i][next[i]] as usize;
                }
                entry[c] = Some(i);
                next[i] += 1;
                filled += 1;
                if filled == m {
                    return entry.into_iter().map(|e| e.unwrap()).collect();
                }
            }
        }
    }

    fn permutation(offset: u64, skip: u64, m: u64) -> Vec<u64> {
        (0..m).map(|j| (offset + j * skip) % m).collect()
    }

    #[test]
    fn the_construction_fills_the_papers_table_1_and_agrees_with_pseudocode_1() {
        // NSDI'16 Table 1: M = 7; B0 offset 3 skip 4, B1 offset 0 skip 2,
        // B2 offset 3 skip 1; the lookup table is B1 B0 B1 B0 B2 B2 B0.
        let pref = |offset, skip, id| Preference {
            offset,
            skip,
            id,
            weight: 1,
        };
        let table = populate(&[pref(3, 4, 0), pref(0, 2, 1), pref(3, 1, 2)], 7);
        assert_eq!(table, [1, 0, 1, 0, 2, 2, 0]);
        // B1 removed: what the pseudocode gives for B0 and B2.
        let perms = [permutation(3, 4, 7), permutation(3, 1, 7)];
        let want: Vec<u32> = paper_populate(&perms, 7)
            .into_iter()
            .map(|i| [0, 2][i])
            .collect();
        assert_eq!(populate(&[pref(3, 4, 0), pref(3, 1, 2)], 7), want);

        // Many more: offsets and skips from a fixed LCG, M prime.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut rand = || {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            x >> 33
        };
        for (n, m) in [(2, 7), (3, 13), (5, 13), (10, 251), (40, 251), (7, 1021)] {
            let prefs: Vec<Preference> = (0..n)
                .map(|i| pref(rand() % m, rand() % (m - 1) + 1, i as u32))
                .collect();
            let perms: Vec<Vec<u64>> = prefs
                .iter()
                .map(|p| permutation(p.offset, p.skip, m))
                .collect();
            let want: Vec<u32> = paper_populate(&perms, m as usize)
                .into_iter()
                .map(|i| i as u32)
                .collect();
            assert_eq!(populate(&prefs, m as u32), want, "n={n} m={m}");
        }
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
