//! What a full sync's writes cost the kernel, by how the maps are made and
//! written: a hash map of the services map's key and value sizes, filled
//! from empty with N elements, preallocated or not (`BPF_F_NO_PREALLOC`,
//! what the agent-written maps use), one update per syscall or batches
//! (`BPF_MAP_UPDATE_BATCH`), from one thread or two. The issue asked for
//! these before choosing; the table is the evidence.
use std::{
    os::fd::AsFd as _,
    time::{Duration, Instant},
};

use aya::maps::MapData;
use lb_common::service::{Service4Key, ServiceValue, SCOPE_ALL};

const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_F_NO_PREALLOC: u32 = 1;

#[derive(Clone, Debug)]
pub struct MapWriteResult {
    pub elements: usize,
    pub prealloc: bool,
    pub batch: usize,
    pub threads: usize,
    pub per_element: Duration,
}

fn hash_map(max_entries: u32, flags: u32) -> MapData {
    let obj = aya_obj::Map::new_from_params(
        BPF_MAP_TYPE_HASH,
        size_of::<Service4Key>() as u32,
        size_of::<ServiceValue>() as u32,
        max_entries,
        flags,
    );
    MapData::create(obj, "bench_writes", None).expect("creating a hash map")
}

fn entries(n: usize) -> (Vec<Service4Key>, Vec<ServiceValue>) {
    let keys = (0..n)
        .map(|i| {
            Service4Key::new(
                u32::from_ne_bytes([10, 96, (i >> 8) as u8, i as u8]),
                80u16.to_be(),
                6,
                SCOPE_ALL,
                (i >> 16) as u16,
            )
        })
        .collect();
    let values = (0..n)
        .map(|i| ServiceValue {
            backend_id: i as u32,
            ..Default::default()
        })
        .collect();
    (keys, values)
}

fn fill(map: &MapData, keys: &[Service4Key], values: &[ServiceValue], batch: usize) {
    let fd = map.fd().as_fd();
    for (k, v) in keys.chunks(batch).zip(values.chunks(batch)) {
        lb::sys::bpf::map_update_batch_of(fd, k, v).expect("batch update");
    }
}

/// One BPF_MAP_UPDATE_ELEM per element.
fn fill_one_by_one(map: MapData, keys: &[Service4Key], values: &[ServiceValue]) {
    let mut h: aya::maps::HashMap<MapData, Service4Key, ServiceValue> =
        aya::maps::HashMap::try_from(aya::maps::Map::HashMap(map)).expect("hash map");
    for (k, v) in keys.iter().zip(values) {
        h.insert(k, v, 0).expect("update");
    }
}

pub fn run(n: usize) -> Vec<MapWriteResult> {
    let (keys, values) = entries(n);
    let max = (n as u32).next_power_of_two();
    let mut out = Vec::new();
    for prealloc in [false, true] {
        for (batch, threads) in [(1, 1), (16, 1), (256, 1), (4096, 1), (n, 1), (16, 2)] {
            let map = hash_map(max, if prealloc { 0 } else { BPF_F_NO_PREALLOC });
            let t = Instant::now();
            if batch == 1 {
                fill_one_by_one(map, &keys, &values);
            } else if threads == 1 {
                fill(&map, &keys, &values, batch);
            } else {
                let half = n / 2;
                std::thread::scope(|s| {
                    s.spawn(|| fill(&map, &keys[..half], &values[..half], batch));
                    s.spawn(|| fill(&map, &keys[half..], &values[half..], batch));
                });
            }
            out.push(MapWriteResult {
                elements: n,
                prealloc,
                batch: batch.min(n),
                threads,
                per_element: t.elapsed() / n as u32,
            });
        }
    }
    out
}
