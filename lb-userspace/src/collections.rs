//! Hash maps of the reconcile path. A full sync of 10 000 services × 10
//! endpoints hashes small keys (map keys, ids, addresses) millions of times;
//! std's SipHash made hashing and rehashing a third of that time. foldhash
//! (the default hasher of hashbrown) is several times faster on such keys
//! and still seeded per map, so colliding keys cannot be precomputed from
//! outside (Service addresses and ports come from the apiserver).
pub type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
