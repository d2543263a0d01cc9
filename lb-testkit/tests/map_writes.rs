//! The BPF map writer on real maps: consecutive upserts go in one batch
//! syscall, in order, and a failure in the middle of a batch reports exactly
//! how many writes landed (the reconciler's mirror follows that count).
use std::net::{IpAddr, Ipv4Addr};

use lb::{
    datapath::{self, MapSizes},
    maps::{bpf::BpfMaps, LbMaps as _, MapOp, ServiceValue, SvcKey},
};
use lb_testkit::{agent::PinDir, unique};

fn upsert(i: u16) -> MapOp {
    let key = SvcKey::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1)), 80, 6, 0).with_slot(i);
    MapOp::UpsertService(
        key,
        ServiceValue {
            backend_id: 100 + u32::from(i),
            ..Default::default()
        },
    )
}

#[test]
fn a_batch_that_overflows_the_map_reports_how_many_writes_landed() {
    let pins = PinDir::create(&unique("map_writes"));
    // Hash maps refuse the insert past max_entries with E2BIG.
    let sizes = MapSizes {
        services: 4,
        ..MapSizes::default()
    };
    let (_ebpf, _) = datapath::load(&pins.path, &sizes).expect("loading");
    let mut maps = BpfMaps::open(&pins.path).unwrap();

    let ops: Vec<MapOp> = (0..6).map(upsert).collect();
    let (applied, err) = maps
        .apply_all(&ops)
        .expect_err("six entries cannot fit in four");
    assert_eq!(applied, 4, "the first four landed, in order");
    assert_eq!(err.source.raw_os_error(), Some(libc::E2BIG), "{err}");
    assert!(
        err.op.contains("slot: 4"),
        "the error names the write that failed: {}",
        err.op
    );

    let state = maps.dump().unwrap();
    assert_eq!(state.services.len(), 4);
    for op in &ops[..4] {
        let MapOp::UpsertService(k, v) = op else {
            unreachable!()
        };
        assert_eq!(state.services.get(k), Some(v));
    }
}

#[test]
fn consecutive_writes_to_several_maps_all_land_in_order() {
    let pins = PinDir::create(&unique("map_writes_all"));
    let (_ebpf, _) = datapath::load(&pins.path, &MapSizes::default()).expect("loading");
    let mut maps = BpfMaps::open(&pins.path).unwrap();
    let backend = |id: u32| {
        MapOp::UpsertBackend(
            id,
            lb::maps::BackendEntry {
                address: IpAddr::V4(Ipv4Addr::new(10, 0, 0, id as u8)),
                port: 8080,
                proto: 6,
                state: 0,
                flags: 0,
            },
        )
    };
    // A run of backends, a run of slots, an update of an existing slot, a delete.
    let mut ops: Vec<MapOp> = (1..=3).map(backend).collect();
    ops.extend((0..3).map(upsert));
    ops.push(MapOp::UpsertService(
        SvcKey::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1)), 80, 6, 0).with_slot(1),
        ServiceValue {
            backend_id: 7,
            ..Default::default()
        },
    ));
    ops.push(MapOp::DeleteService(
        SvcKey::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1)), 80, 6, 0).with_slot(2),
    ));
    maps.apply_all(&ops).expect("all writes");

    let state = maps.dump().unwrap();
    assert_eq!(state.backends.len(), 3);
    let slot = |i: u16| {
        state
            .services
            .get(&SvcKey::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1)), 80, 6, 0).with_slot(i))
            .map(|v| v.backend_id)
    };
    assert_eq!(
        (slot(0), slot(1), slot(2)),
        (Some(100), Some(7), None),
        "later writes win, the delete came last"
    );
}

/// The map catalog describes the object as built: after a load every map
/// it lists is pinned with the kernel map type, key and value sizes and
/// capacity it says, every map pinned has a row, and a pinned map of
/// another capacity is refused by name.
#[test]
fn every_map_of_the_catalog_is_pinned_as_the_catalog_describes_it() {
    let pins = PinDir::create(&unique("catalog"));
    let sizes = MapSizes {
        source_ranges: 1024,
        ..MapSizes::default()
    };
    let (_ebpf, reused) = datapath::load(&pins.path, &sizes).expect("loading");
    assert!(!reused);
    for m in lb::maps::catalog::CATALOG {
        let pin = pins.path.join(m.name);
        assert!(pin.exists(), "{} is not pinned", m.name);
        let info = aya::maps::MapData::from_pin(&pin)
            .and_then(|map| map.info())
            .unwrap_or_else(|e| panic!("{}: {e}", m.name));
        assert_eq!(
            info.map_type().ok(),
            Some(m.kind),
            "{}: the kernel's map type",
            m.name
        );
    }
    // Every map the object pins has a row (the uninstall and `lbctl status`
    // walk the catalog: a map without one would be left behind, unlisted).
    for e in std::fs::read_dir(&pins.path).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("LB") {
            assert!(
                lb::maps::catalog::spec_of(&name).is_some(),
                "{name} is pinned but not in the catalog"
            );
        }
    }
    let layout = datapath::PinLayout::new(&pins.path);
    assert!(layout
        .check_pinned_maps(&sizes)
        .expect("sizes as the catalog says"));
    let other = MapSizes {
        source_ranges: 2048,
        ..sizes
    };
    let err = layout.check_pinned_maps(&other).unwrap_err().to_string();
    assert!(
        err.contains("LB4_SRC_RANGES") && err.contains("1024"),
        "{err}"
    );
}

/// The kernel's own account of a map's memory (/proc/<pid>/fdinfo "memlock").
fn memlock(pin: &std::path::Path) -> u64 {
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let map = aya::maps::MapData::from_pin(pin).expect("opening the pin");
    let fd = map.fd().as_fd().as_raw_fd();
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("memlock:"))
        .expect("fdinfo has memlock")
        .trim()
        .parse()
        .unwrap()
}

/// `--preallocate-maps`: the services, backends and reverse-NAT maps are
/// made preallocated (their whole capacity reserved, as the kernel
/// accounts it), a pipelined full sync into them reads back equal to the
/// mirror, a packet is translated through them, and a restart without
/// the flag is refused by name while one with it takes them over.
#[test]
fn preallocated_maps_reserve_their_capacity_serve_packets_and_a_restart_must_keep_the_choice() {
    use lb_testkit::{
        dataplane::*,
        packets::{self, inspect, SYN},
    };
    let sizes = MapSizes {
        preallocate: true,
        ..MapSizes::default()
    };
    let mut dp = Dataplane::with_sizes(&unique("prealloc"), &sizes);
    let extra: String = (0..200)
        .map(|i| {
            format!(
                "  - name: bulk-{i}\n    clusterIPs: [10.97.{}.{}]\n    ports: [{{port: 80}}]\n    backends: [{{address: 10.245.{}.{}}}, {{address: 10.246.{}.{}}}]\n",
                i / 250, i % 250 + 1, i / 250, i % 250 + 1, i / 250, i % 250 + 1
            )
        })
        .collect();
    dp.apply_with_extra(&format!("services:\n{extra}"));
    assert_eq!(
        dp.reconciler.maps().dump().unwrap(),
        *dp.reconciler.state(),
        "the pipelined sync's writes all landed"
    );

    let made = |name: &str| {
        aya::maps::MapData::from_pin(dp.pins.path.join(name))
            .unwrap()
            .info()
            .unwrap()
    };
    for m in lb::maps::catalog::CATALOG
        .iter()
        .filter(|m| m.preallocatable)
    {
        assert_eq!(
            made(m.name).map_flags() & 1,
            0,
            "{} is BPF_F_NO_PREALLOC",
            m.name
        );
    }
    assert_eq!(
        made(lb_common::maps::LB_AFFINITY_MATCH).map_flags() & 1,
        1,
        "maps the flag is not about are made as the object says"
    );

    // What the choice costs: the kernel's memlock of the preallocated map
    // against the same map made as usual (empty), in a pin dir of its own.
    let usual = PinDir::create(&unique("prealloc-usual"));
    let (_usual_ebpf, _) = datapath::load(&usual.path, &MapSizes::default()).unwrap();
    let (pre, not) = (
        memlock(&dp.pins.path.join("LB4_SERVICES")),
        memlock(&usual.path.join("LB4_SERVICES")),
    );
    let all = |dir: &std::path::Path| -> u64 {
        lb::maps::catalog::CATALOG
            .iter()
            .filter(|m| m.preallocatable)
            .map(|m| memlock(&dir.join(m.name)))
            .sum()
    };
    eprintln!(
        "LB4_SERVICES at {} entries: {pre} bytes preallocated, {not} not; the six maps: {} against {}",
        sizes.services,
        all(&dp.pins.path),
        all(&usual.path)
    );
    // Before Linux 6.4 memlock was an estimate from max_entries for either kind.
    if lb::datapath::features::kernel_release().is_some_and(|v| v >= (6, 4)) {
        assert!(
            pre >= u64::from(sizes.services) * 64 && pre > 2 * not,
            "a preallocated map reserves its capacity: {pre} against {not}"
        );
    }

    let (rc, out) = dp.tc_ingress(&packets::tcp(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP, NODE_IP, 40000, 30001, SYN, b"",
    ));
    assert_eq!(rc, TC_ACT_OK);
    let v = inspect(&out);
    assert_eq!(
        (v.daddr, v.dport),
        ("10.244.1.10".parse().unwrap(), 8080),
        "translated through the preallocated maps"
    );

    let without = MapSizes {
        preallocate: false,
        ..sizes
    };
    let err = datapath::load(&dp.pins.path, &without)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("LB4_SERVICES")
            && err.contains("--preallocate-maps")
            && err.contains("uninstall"),
        "{err}"
    );
    let ids = |dir: &std::path::Path| -> Vec<u32> {
        lb::maps::catalog::CATALOG
            .iter()
            .filter(|m| m.preallocatable)
            .map(|m| {
                aya::maps::MapData::from_pin(dir.join(m.name))
                    .unwrap()
                    .info()
                    .unwrap()
                    .id()
            })
            .collect()
    };
    let before = ids(&dp.pins.path);
    let (_again, reused) = datapath::load(&dp.pins.path, &sizes).expect("the same choice again");
    assert!(reused);
    assert_eq!(
        ids(&dp.pins.path),
        before,
        "the preallocated maps are taken over, not made again"
    );
}
