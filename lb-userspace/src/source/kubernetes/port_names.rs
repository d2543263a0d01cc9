//! Port names, one shared copy of each. Every Service port and every
//! EndpointSlice port has a name (`http`, `dns-tcp`, `metrics`...), and a
//! cluster uses a handful of them over and over: kept one heap block per
//! port, they were two blocks per service of the store (about 100 B of RSS
//! each at 100 000 services). The records hold an `Arc<str>` from here.
//!
//! Names no record holds any longer are let go at `prune` (the store calls
//! it after each full output), and whenever the set has doubled since the
//! last prune, so that a stream of distinct names cannot grow it without
//! bound between relists: it holds at most about twice the names in use.
use std::{collections::HashSet, sync::Arc};

#[derive(Debug, Default)]
pub struct PortNames {
    names: HashSet<Arc<str>>,
    /// How many names were left at the last prune.
    kept: usize,
}

impl PortNames {
    /// The shared copy of `name`.
    pub fn get(&mut self, name: &str) -> Arc<str> {
        if let Some(shared) = self.names.get(name) {
            return shared.clone();
        }
        if self.names.len() >= 2 * self.kept.max(64) {
            self.prune();
        }
        let shared: Arc<str> = name.into();
        self.names.insert(shared.clone());
        shared
    }

    /// Lets go of the names only this set still holds.
    pub fn prune(&mut self) {
        self.names.retain(|n| Arc::strong_count(n) > 1);
        self.kept = self.names.len();
        // A table once grown for many names (a cluster that had them) would
        // otherwise keep its size for good.
        let room = 2 * self.kept.max(64);
        if self.names.capacity() > 2 * room {
            self.names.shrink_to(room);
        }
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_copy_per_name_and_unheld_names_pruned() {
        let mut names = PortNames::default();
        let a = names.get("http");
        let b = names.get("http");
        assert!(Arc::ptr_eq(&a, &b), "the same name shares one copy");
        let other = names.get("dns");
        assert_eq!(names.len(), 2);
        drop(other);
        names.prune();
        assert_eq!(names.len(), 1, "dns is held by nobody: let go");
        drop((a, b));
        names.prune();
        assert!(names.is_empty());
    }

    #[test]
    fn a_stream_of_distinct_names_keeps_the_set_bounded_by_the_names_in_use() {
        let mut names = PortNames::default();
        let held: Vec<Arc<str>> = (0..10).map(|i| names.get(&format!("held-{i}"))).collect();
        for i in 0..10_000 {
            // Made, used, then let go by its record.
            drop(names.get(&format!("gone-{i}")));
            assert!(names.len() <= 2 * 64 + 1, "{} names after {i}", names.len());
        }
        names.prune();
        assert_eq!(names.len(), held.len());
    }

    #[test]
    fn a_table_grown_for_many_names_shrinks_when_they_are_let_go() {
        let mut names = PortNames::default();
        let many: Vec<Arc<str>> = (0..10_000).map(|i| names.get(&format!("p-{i}"))).collect();
        assert!(names.names.capacity() >= 10_000);
        drop(many);
        names.prune();
        assert!(names.is_empty());
        assert!(
            names.names.capacity() <= 4 * 64,
            "capacity {} after every name was let go",
            names.names.capacity()
        );
    }
}
