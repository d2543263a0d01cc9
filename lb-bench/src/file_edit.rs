//! Standalone mode, end to end: one service of an N-service file edited
//! (its first endpoint replaced; the file written beside and renamed over,
//! as editors and config management do) until the agent's map shows the
//! new endpoint. The agent is the real one with its inotify watch; the
//! bench polls the pinned maps. Beside it, in process: the same edit read
//! as the agent reads it (`FileCache::read`: only the changed service is
//! parsed and checked against the others' claims, and the answer is that
//! one change) and parsed whole (what every edit cost before the cache).
use std::{
    net::{Ipv4Addr, SocketAddrV4},
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use lb::source::file::{
    cache::{FileCache, Read},
    parse as file,
};
use lb_common::{
    backend::Backend4,
    service::{Service4Key, ServiceValue, SCOPE_ALL},
};
use lb_testkit::{
    agent::{Agent, PinDir},
    cgroup::ChildCgroup,
    unique,
};

use crate::{
    profile::Profile,
    stats::{median, percentile},
    workload::{agent_map_args, replacement, Workload},
};

#[derive(Clone, Debug)]
pub struct FileEditResult {
    pub services: usize,
    pub samples: usize,
    /// File renamed into place → map entry changed: p50, p99.
    pub to_map: [Duration; 2],
    /// The edited file read as the agent reads it, cache warm (median).
    pub parse_cached: Duration,
    /// The edited file parsed whole (median).
    pub parse_whole: Duration,
}

pub fn run(p: &Profile) -> Vec<FileEditResult> {
    p.file_edit_services
        .iter()
        .map(|&n| one_scale(n, p.file_edit_samples))
        .collect()
}

fn map<K: aya::Pod, V: aya::Pod>(pins: &PinDir, name: &str) -> BpfHashMap<MapData, K, V> {
    let data = MapData::from_pin(pins.path.join(name)).expect("pinned map");
    BpfHashMap::try_from(aya::maps::Map::HashMap(data)).expect("hash map")
}

/// The address behind `vip:port`'s first slot, as the programs would find it.
fn first_backend(
    services: &BpfHashMap<MapData, Service4Key, ServiceValue>,
    backends: &BpfHashMap<MapData, u32, Backend4>,
    vip: Ipv4Addr,
    port: u16,
) -> Option<Ipv4Addr> {
    let key = Service4Key::new(
        u32::from_ne_bytes(vip.octets()),
        port.to_be(),
        lb_common::proto::TCP,
        SCOPE_ALL,
        1,
    );
    let slot = services.get(&key, 0).ok()?;
    let b = backends.get(&slot.backend_id, 0).ok()?;
    Some(Ipv4Addr::from(b.address.to_ne_bytes()))
}

fn one_scale(n: usize, samples: usize) -> FileEditResult {
    eprintln!("lb-bench: services-file edit at {n} services");
    let tag = unique("bench-file");
    let cgroup = ChildCgroup::create(&tag);
    let pins = PinDir::create(&tag);
    let path = std::env::temp_dir().join(format!("lb-services-{tag}.yaml"));
    let tmp = path.with_extension("tmp");
    let mut w = Workload::new(n, 1, &[]);
    std::fs::write(&path, w.services_yaml()).unwrap();
    let args = agent_map_args(n);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::start_slow(
        &path,
        &cgroup.path,
        &pins.path,
        &args,
        Duration::from_secs(600),
    );
    let services = map::<Service4Key, ServiceValue>(&pins, lb_common::maps::LB4_SERVICES);
    let backends = map::<u32, Backend4>(&pins, lb_common::maps::LB4_BACKENDS);

    let idx = n / 2;
    let original = w.services[idx].clone();
    let mut to_map = Vec::with_capacity(samples);
    for i in 0..samples {
        let edited = replacement(&original, i.is_multiple_of(2));
        let want: SocketAddrV4 = edited.endpoints[0];
        let (vip, port) = (edited.vip, edited.port);
        w.services[idx] = edited;
        std::fs::write(&tmp, w.services_yaml()).unwrap();
        let t = Instant::now();
        std::fs::rename(&tmp, &path).unwrap();
        loop {
            if first_backend(&services, &backends, vip, port) == Some(*want.ip()) {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "the edit never reached the maps: {}",
                agent.log_text()
            );
            std::hint::spin_loop();
        }
        to_map.push(t.elapsed());
        // Let the agent settle before the next edit.
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(agent);
    let _ = std::fs::remove_file(&path);

    // In process: the same kind of edit, read both ways.
    let ctx = file::FileContext::default();
    let before = w.services_yaml();
    w.services[idx] = replacement(&original, samples.is_multiple_of(2));
    let after = w.services_yaml();
    let mut cached = Vec::new();
    let mut whole = Vec::new();
    for _ in 0..5 {
        let mut cache = FileCache::default();
        let Ok(Read::Whole(mut model)) = cache.read(&before, &ctx) else {
            panic!("the first read is whole");
        };
        let t = Instant::now();
        let read = cache.read(&after, &ctx).expect("the edit parses");
        cached.push(t.elapsed());
        assert_eq!(cache.last_parsed, 1, "only the edited service is parsed");
        let t = Instant::now();
        let b = file::parse_with(&after, &ctx).expect("the edit parses");
        whole.push(t.elapsed());
        let Read::Changes(changes) = read else {
            panic!("an edit is read as a change");
        };
        assert_eq!(changes.len(), 1, "one service changed");
        for (name, service) in changes {
            model
                .services
                .insert(name, service.expect("edited, not gone"));
        }
        assert_eq!(model, b, "the change gives what a whole parse gives");
    }
    to_map.sort();
    FileEditResult {
        services: n,
        samples,
        to_map: [percentile(&to_map, 0.5), percentile(&to_map, 0.99)],
        parse_cached: median(cached),
        parse_whole: median(whole),
    }
}
