//! The reconcile pipeline against the fake maps: minimal writes, stable ids,
//! safe ordering, capacity and failure handling, and convergence for any
//! sequence of models.
use std::{
    collections::{BTreeMap, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use lb::{
    maps::{fake::FakeMaps, state::is_marker, MapOp, MapSizes, MapState},
    model::{Backend, BackendState, Frontend, FrontendKind, Model, Protocol, Service, ServiceName},
    reconcile::{ReconcileError, Reconciler, ServiceError},
};
use lb_common::service::{SVC_FLAG_CLUSTER_IP, SVC_FLAG_VIP_MARKER};
use proptest::prelude::*;

fn backend(i: u8, state: BackendState) -> Backend {
    Backend {
        address: IpAddr::V4(Ipv4Addr::new(10, 244, 0, i)),
        port: 8080,
        state,
        local: false,
        weight: 1,
    }
}

fn service(vip: u32, port: u16, backends: &[u8]) -> Service {
    Service {
        frontends: vec![Frontend {
            address: IpAddr::V4(Ipv4Addr::from(0x0a60_0000 + vip)),
            port,
            port_index: 0,
            protocol: Protocol::Tcp,
            kind: FrontendKind::ClusterIP,
            algorithm: Default::default(),
            affinity_timeout_s: None,
            maglev_table_size: None,
            external_traffic_local: false,
            forwarding: None,
            source_ranges: Vec::new(),
            backends: backends
                .iter()
                .map(|b| backend(*b, BackendState::Active))
                .collect(),
        }],
        health_check_node_port: None,
        metrics: false,
    }
}

fn name(i: u32) -> ServiceName {
    ServiceName::new("default", format!("svc-{i}"))
}

/// `n` services with 3 backends each.
fn cluster(n: u32) -> Model {
    let mut m = Model::default();
    for i in 0..n {
        let b = (i % 200) as u8;
        m.services
            .insert(name(i), service(i, 80, &[b, b + 1, b + 2]));
    }
    m
}

/// Fake maps of these sizes (the reverse-NAT maps: as many as services,
/// as `--map-size-services` makes them; maglev and source ranges: 10).
fn sized(services: u32, backends: u32) -> Reconciler<FakeMaps> {
    Reconciler::restore(FakeMaps::with_capacity(MapSizes {
        services,
        backends,
        maglev: 10,
        source_ranges: 10,
        ..MapSizes::default()
    }))
    .unwrap()
}

fn reconciled(model: &Model) -> Reconciler<FakeMaps> {
    let mut r = Reconciler::restore(FakeMaps::default()).unwrap();
    r.reconcile(model).unwrap();
    r.maps_mut().take_log();
    r
}

/// What any reader may rely on, checked after every reconcile.
fn assert_consistent(state: &MapState) {
    let mut referenced = HashSet::new();
    let mut cluster_ips: HashSet<IpAddr> = HashSet::new();
    for (k, v) in state.frontends() {
        // Active, terminating, then maintenance (graceful drain) slots.
        let total = v.master_slots() as u16;
        for slot in 1..=total {
            let s = state
                .services
                .get(&k.with_slot(slot))
                .unwrap_or_else(|| panic!("slot {slot} of {k:?} missing"));
            assert!(
                state.backends.contains_key(&s.backend_id),
                "slot names missing backend {}",
                s.backend_id
            );
            referenced.insert(s.backend_id);
        }
        assert!(
            !state.services.contains_key(&k.with_slot(total + 1)),
            "stray slot after {k:?}"
        );
        assert!(
            state.revnat.contains_key(&v.service_id),
            "no revnat for {k:?}"
        );
        if v.flags & SVC_FLAG_CLUSTER_IP != 0 {
            cluster_ips.insert(k.address);
        }
    }
    let backends: HashSet<u32> = state.backends.keys().copied().collect();
    assert_eq!(backends, referenced, "backends not referenced by any slot");
    let markers: HashSet<IpAddr> = state
        .services
        .iter()
        .filter(|(k, v)| is_marker(k, v))
        .map(|(k, _)| k.address)
        .collect();
    assert_eq!(
        markers, cluster_ips,
        "VIP markers must match ClusterIP addresses"
    );
    let ids: HashSet<u32> = state.frontends().map(|(_, v)| v.service_id).collect();
    assert_eq!(ids.len(), state.frontends().count(), "service ids unique");
    for (k, v) in state.frontends() {
        if let Some(table) = state.maglev.get(&v.service_id) {
            assert_eq!(
                lb_common::maps::maglev_size_of(v.maglev_size),
                Some(table.len() as u32),
                "{k:?}: the master names its table's size"
            );
        }
    }
    for (id, table) in &state.maglev {
        assert!(ids.contains(id), "Maglev table of a gone service {id}");
        assert!(
            table.iter().all(|b| state.backends.contains_key(b)),
            "Maglev table names a missing backend"
        );
    }
    assert_eq!(state.revnat.len(), ids.len(), "stray revnat entries");
    // The frontend filter: exactly the bits the IPv4 frontends use, trusted.
    let wanted: BTreeMap<u32, u64> = state.filter_wanted().into_iter().collect();
    let words: BTreeMap<u32, u64> = state.filter_words.clone().into_iter().collect();
    assert_eq!(
        words, wanted,
        "LB4_FE_FILTER holds a stale or a missing bit"
    );
    assert!(
        state.filter_trusted,
        "the filter is trusted after a reconcile"
    );
}

/// Replays a write log from `start`: after every single write, each IPv4
/// frontend entry in the maps (master or address marker) has its filter bit
/// set, or the packet programs would let its packets pass untranslated.
fn assert_filter_covers_at_every_step(start: &MapState, log: &[MapOp]) {
    let mut replay = start.clone();
    for (i, op) in log.iter().enumerate() {
        replay.apply(op);
        if !replay.filter_trusted {
            continue;
        }
        for k in replay.services.keys() {
            if let Some(bit) = lb::maps::state::filter_bit(k) {
                assert!(
                    replay.filter_bit_set(bit),
                    "after write {i} ({op:?}) {k:?} is in the maps but its filter bit is clear"
                );
            }
        }
    }
}

#[test]
fn adding_one_backend_at_1000_services_writes_backend_slot_and_master_only() {
    let mut model = cluster(1000);
    let mut r = reconciled(&model);
    model
        .services
        .insert(name(500), service(500, 80, &[100, 101, 102, 250]));
    let stats = r.reconcile(&model).unwrap();
    let log = r.maps_mut().take_log();
    assert_eq!(stats.services_changed, 1);
    assert!(
        matches!(log.as_slice(), [MapOp::UpsertBackend(..), MapOp::UpsertService(s, _), MapOp::UpsertService(m, _)]
        if s.slot == 4 && m.slot == 0),
        "{log:?}"
    );
    assert_consistent(r.state());
}

#[test]
fn removing_a_middle_backend_moves_the_last_slot_into_the_hole() {
    let mut model = cluster(100);
    let mut r = reconciled(&model);
    // svc-7 has backends 7, 8, 9 in slots 1..3; drop 8.
    model.services.insert(name(7), service(7, 80, &[7, 9]));
    r.reconcile(&model).unwrap();
    let log = r.maps_mut().take_log();
    assert_eq!(log.len(), 3, "{log:?}");
    assert!(
        matches!(log[0], MapOp::UpsertService(k, _) if k.slot == 2),
        "hole filled first: {log:?}"
    );
    assert!(
        matches!(log[1], MapOp::UpsertService(k, v) if k.slot == 0 && v.count == 2),
        "then the master: {log:?}"
    );
    assert!(
        matches!(log[2], MapOp::DeleteService(k) if k.slot == 3),
        "then the old last slot: {log:?}"
    );
    // Backend 8 is still used by svc-6 and svc-8, so it stays.
    assert_consistent(r.state());
}

#[test]
fn removing_a_backend_nobody_else_uses_deletes_it_last() {
    let mut model = Model::default();
    model.services.insert(name(1), service(1, 80, &[1, 2]));
    let mut r = reconciled(&model);
    model.services.insert(name(1), service(1, 80, &[1]));
    r.reconcile(&model).unwrap();
    let log = r.maps_mut().take_log();
    assert!(
        matches!(
            log.as_slice(),
            [
                MapOp::UpsertService(..),
                MapOp::DeleteService(_),
                MapOp::DeleteBackend(..)
            ]
        ),
        "{log:?}"
    );
}

#[test]
fn backend_turning_terminating_touches_only_its_service() {
    let mut model = cluster(50);
    let mut r = reconciled(&model);
    let mut svc = service(3, 80, &[3, 4]);
    svc.frontends[0]
        .backends
        .push(backend(5, BackendState::Terminating));
    model.services.insert(name(3), svc);
    r.reconcile(&model).unwrap();
    let log = r.maps_mut().take_log();
    let vip3 = IpAddr::V4(Ipv4Addr::from(0x0a60_0003u32));
    for op in &log {
        if let MapOp::UpsertService(k, _) | MapOp::DeleteService(k) = op {
            assert_eq!(k.address, vip3, "touched another service: {op:?}");
        }
    }
    assert!(log.len() <= 4, "{log:?}");
    let master = r
        .state()
        .frontends()
        .find(|(k, _)| k.address == vip3)
        .unwrap()
        .1;
    assert_eq!((master.count, master.terminating_count), (2, 1));
    assert_consistent(r.state());
}

#[test]
fn restarted_reconciler_with_same_model_writes_nothing() {
    let model = cluster(300);
    let r = reconciled(&model);
    let maps = FakeMaps {
        state: r.state().clone(),
        ..Default::default()
    };
    let mut again = Reconciler::restore(maps).unwrap();
    let stats = again.reconcile(&model).unwrap();
    assert!(stats.full_sync);
    assert_eq!(stats.ops, 0, "{:?}", again.maps_mut().take_log());
}

#[test]
fn ids_stay_stable_when_other_services_come_and_go() {
    let mut model = cluster(20);
    let mut r = reconciled(&model);
    let ids_before: BTreeMap<_, _> = r
        .state()
        .frontends()
        .map(|(k, v)| (*k, v.service_id))
        .collect();
    let backends_before = r.state().backends.clone();

    model.services.remove(&name(0));
    model.services.remove(&name(10));
    model.services.insert(name(99), service(99, 80, &[50, 51]));
    r.reconcile(&model).unwrap();
    for (k, v) in r.state().frontends() {
        if let Some(before) = ids_before.get(k) {
            assert_eq!(*before, v.service_id, "service id of {k:?} changed");
        }
    }
    for (id, b) in &r.state().backends {
        if let Some(before) = backends_before.get(id) {
            assert_eq!(before, b, "backend id {id} now names another backend");
        }
    }
    // A new frontend never gets a freed id (no reuse before wrapping).
    let new_id = r
        .state()
        .frontends()
        .map(|(_, v)| v.service_id)
        .max()
        .unwrap();
    assert!(new_id > *ids_before.values().max().unwrap());
    assert_consistent(r.state());
}

#[test]
fn service_that_does_not_fit_is_refused_whole_while_the_others_apply_and_retried_later() {
    let model = cluster(10);
    let mut r = sized(60, 100);
    r.reconcile(&model).unwrap(); // 10 × (master + 3 slots) + 10 markers = 50 entries
    r.maps_mut().take_log();
    // Three more services of 5 entries each: two fit (60), the third does not.
    let bigger = cluster(13);
    let err = r.reconcile(&bigger).unwrap_err();
    let ReconcileError::Refused(refused) = &err else {
        panic!("{err}")
    };
    assert_eq!(refused.len(), 1, "{err}");
    let (name, e) = &refused[0];
    assert!(
        matches!(
            e,
            ServiceError::Capacity {
                map: "LB4_SERVICES",
                max: 60,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        err.to_string().contains("--map-size-services")
            && err.to_string().contains(&name.to_string()),
        "{err}"
    );
    assert_eq!(r.state().services.len(), 60);
    // Nothing of the refused service was written: no master, no slot, no marker.
    let refused_vip = IpAddr::V4(Ipv4Addr::from(0x0a60_0000 + 12u32));
    assert!(
        r.state().services.keys().all(|k| k.address != refused_vip),
        "half-applied service"
    );
    assert_consistent(r.state());
    assert_eq!(r.pending().len(), 1);

    // More room: the retry applies the refused service.
    r.maps_mut().capacity.services = 100;
    r.retry().unwrap();
    assert!(r.pending().is_empty());
    assert_eq!(r.state().services.len(), 65);
    assert_consistent(r.state());
}

/// When a service overflows several maps, the refusal names the first in a
/// fixed order, a family's maps together and IPv4 first: here LB4_BACKENDS
/// (5 IPv4 backends, room for 4), not LB6_SERVICES (10 IPv6 entries, room
/// for 8), with the flag that sizes it.
#[test]
fn a_service_too_big_for_several_maps_is_refused_naming_the_first_ipv4_one() {
    let backends: Vec<String> = (1..=5)
        .map(|i| format!("{{address: 10.244.0.{i}}}"))
        .chain((1..=8).map(|i| format!("{{address: 'fd00:244::{i}'}}")))
        .collect();
    let model = lb::source::file::parse::parse(&format!(
        "services:\n  - name: big\n    clusterIPs: [10.96.0.10, 'fd00:96::10']\n    ports: [{{port: 80}}]\n    backends: [{}]\n",
        backends.join(", ")
    ))
    .unwrap();
    let mut r = sized(8, 4);
    let err = r.reconcile(&model).unwrap_err();
    let ReconcileError::Refused(refused) = &err else {
        panic!("{err}")
    };
    assert!(
        matches!(
            &refused[0].1,
            ServiceError::Capacity {
                map: "LB4_BACKENDS",
                needed: 5,
                max: 4,
                flag: "--map-size-backends",
            }
        ),
        "{}",
        refused[0].1
    );
}

#[test]
fn write_failure_midway_is_repaired_by_the_next_reconcile() {
    let mut model = cluster(10);
    let mut r = reconciled(&model);
    for i in 0..10 {
        model.services.insert(name(i), service(i, 80, &[200, 201]));
    }
    r.maps_mut().fail_after = Some(7);
    let err = r.reconcile(&model).unwrap_err();
    assert!(matches!(err, ReconcileError::Apply { .. }), "{err}");
    let stats = r.reconcile(&model).unwrap();
    assert!(stats.full_sync, "a failed apply forces a full sync");
    assert_consistent(r.state());
    assert_eq!(r.maps().state, *r.state(), "mirror equals the maps");
    assert_eq!(
        summary(r.state()),
        summary(reconciled(&model).state()),
        "converged to what a fresh apply serves"
    );
}

#[test]
fn vip_marker_lives_exactly_as_long_as_a_cluster_ip_frontend_uses_the_address() {
    let mut model = Model::default();
    model.services.insert(name(1), service(1, 80, &[1]));
    model.services.insert(name(2), service(1, 443, &[2]));
    let mut r = reconciled(&model);
    let marker_present = |r: &Reconciler<FakeMaps>| {
        r.state()
            .services
            .values()
            .any(|v| v.flags & SVC_FLAG_VIP_MARKER != 0)
    };
    assert!(marker_present(&r));
    model.services.remove(&name(1));
    r.reconcile(&model).unwrap();
    assert!(marker_present(&r), "port 443 still uses the address");
    model.services.remove(&name(2));
    r.reconcile(&model).unwrap();
    assert!(!marker_present(&r));
    assert!(
        r.state().services.is_empty()
            && r.state().backends.is_empty()
            && r.state().revnat.is_empty()
    );
}

fn arb_model() -> impl Strategy<Value = Model> {
    // Up to 6 services on 4 addresses × 2 ports, backends from a pool of 6, mixed states.
    let svc = (
        0u32..4,
        prop::sample::select(vec![80u16, 443]),
        prop::collection::btree_map(0u8..6, 0u8..3, 0..5),
        // A Maglev service's own table size, or the agent's: tables grow
        // and shrink between models.
        prop::sample::select(vec![None, Some(251u32), Some(509), Some(1_021)]),
        // Maglev or random, changing between models on the same frontend.
        any::<bool>(),
    );
    prop::collection::btree_map(0u32..6, svc, 0..6).prop_map(|services| {
        let mut m = Model::default();
        let mut used = HashSet::new();
        for (i, (vip, port, backends, table_size, maglev)) in services {
            if !used.insert((vip, port)) {
                continue; // one owner per frontend, as the parsers guarantee
            }
            let mut s = service(vip, port, &[]);
            // Some services use Maglev: its tables follow the same pipeline.
            if maglev {
                s.frontends[0].algorithm = lb::model::Algorithm::Maglev;
                s.frontends[0].maglev_table_size = table_size;
            }
            s.frontends[0].backends = backends
                .into_iter()
                .map(|(b, st)| {
                    backend(
                        b,
                        [
                            BackendState::Active,
                            BackendState::Terminating,
                            BackendState::Maintenance,
                        ][st as usize],
                    )
                })
                .collect();
            // Address 3 is IPv6: both families go through the same pipeline.
            if vip == 3 {
                let fe = &mut s.frontends[0];
                fe.address = IpAddr::V6(Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 3));
                for b in &mut fe.backends {
                    if let IpAddr::V4(a) = b.address {
                        b.address = IpAddr::V6(a.to_ipv6_mapped());
                    }
                }
            }
            m.services.insert(name(i), s);
        }
        m
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Applying any sequence of models leaves the maps equal to what a fresh
    /// agent would write for the last one, consistent at every step.
    #[test]
    fn any_sequence_of_models_converges_to_the_last_one(models in prop::collection::vec(arb_model(), 1..8)) {
        let mut r = Reconciler::restore(FakeMaps::default()).unwrap();
        // The same sequence with every run pipelined (a writer thread makes
        // the writes): it must make the very same writes in the same order.
        let mut piped = Reconciler::restore(FakeMaps::default()).unwrap().with_pipeline_from(0);
        for m in &models {
            let before = r.state().clone();
            r.reconcile(m).unwrap();
            piped.reconcile(m).unwrap();
            assert_consistent(r.state());
            prop_assert_eq!(&r.maps().state, r.state());
            let log = r.maps_mut().take_log();
            prop_assert_eq!(&piped.maps_mut().take_log(), &log, "the pipelined run wrote otherwise");
            prop_assert_eq!(piped.state(), r.state());
            assert_filter_covers_at_every_step(&before, &log);
            prop_assert!(
                r.maps().maglev_overruns.is_empty(),
                "a master's table size passed its table's end: {:?}",
                r.maps().maglev_overruns
            );
        }
        let last = models.last().unwrap();
        let fresh = reconciled(last);
        // Ids and slot order may differ by history; compare what each frontend serves.
        prop_assert_eq!(summary(r.state()), summary(fresh.state()));
        prop_assert_eq!(r.reconcile(last).unwrap().ops, 0, "steady state writes nothing");
    }
}

/// A full sync long enough to travel in several chunks to the writer
/// (thousands of writes, in chunks of the default size and of 7, whose
/// edges fall everywhere): a failure early, in the middle and late stops
/// the pipelined run at the same write as the serial run, with the same
/// error, and the mirror is what the maps hold.
#[test]
fn a_failed_write_in_any_chunk_of_a_long_pipelined_sync_stops_it_where_the_serial_run_stops() {
    let model = cluster(600);
    let total = {
        let mut r = Reconciler::restore(FakeMaps::default()).unwrap();
        r.reconcile(&model).unwrap().ops
    };
    assert!(total > 3000, "several chunks of writes: {total}");
    let chunks = [None, Some(7)];
    for (chunk, fail_at) in chunks
        .iter()
        .flat_map(|c| [0, 6, 7, 8, 1023, 1024, 1500, 2047, total / 2, total - 5].map(|f| (*c, f)))
    {
        let mut serial = Reconciler::restore(FakeMaps::default()).unwrap();
        let mut piped = Reconciler::restore(FakeMaps::default()).unwrap();
        if let Some(c) = chunk {
            piped = piped.with_pipeline_chunk(c);
        }
        serial = serial.with_pipeline_from(usize::MAX);
        serial.maps_mut().fail_after = Some(fail_at);
        piped.maps_mut().fail_after = Some(fail_at);
        let a = serial.reconcile(&model).unwrap_err().to_string();
        let b = piped.reconcile(&model).unwrap_err().to_string();
        assert_eq!(a, b, "failing at write {fail_at}");
        assert_eq!(
            piped.maps_mut().take_log(),
            serial.maps_mut().take_log(),
            "the same writes made before write {fail_at}"
        );
        assert_eq!(&piped.maps().state, piped.state(), "mirror read back");
        piped.maps_mut().fail_after = None;
        assert!(piped.reconcile(&model).unwrap().full_sync);
        assert_consistent(piped.state());
        assert_eq!(summary(piped.state()), summary(reconciled(&model).state()));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    /// A write that fails in a pipelined run stops it where the serial run
    /// would stop: the same writes made before it, none after it (the
    /// writer drops what was queued), the same error, a mirror read back
    /// equal to the maps, and the next reconcile converges.
    #[test]
    fn a_failed_write_in_a_pipelined_run_stops_it_where_the_serial_run_stops(
        first in arb_model(),
        second in arb_model(),
        fail_at in 0usize..200,
    ) {
        let mut serial = Reconciler::restore(FakeMaps::default()).unwrap();
        let mut piped = Reconciler::restore(FakeMaps::default()).unwrap().with_pipeline_from(0);
        serial.reconcile(&first).unwrap();
        piped.reconcile(&first).unwrap();
        serial.maps_mut().take_log();
        piped.maps_mut().take_log();
        serial.maps_mut().fail_after = Some(fail_at);
        piped.maps_mut().fail_after = Some(fail_at);
        let (a, b) = (serial.reconcile(&second), piped.reconcile(&second));
        prop_assert_eq!(a.is_err(), b.is_err());
        if let (Err(a), Err(b)) = (&a, &b) {
            prop_assert!(matches!(b, ReconcileError::Apply { .. }), "{}", b);
            prop_assert_eq!(a.to_string(), b.to_string());
        }
        let made = serial.maps_mut().take_log();
        prop_assert_eq!(&piped.maps_mut().take_log(), &made, "writes made before the failure");
        prop_assert_eq!(&piped.maps().state, piped.state(), "mirror read back from the maps");
        piped.maps_mut().fail_after = None;
        piped.reconcile(&second).unwrap();
        assert_consistent(piped.state());
        prop_assert_eq!(&piped.maps().state, piped.state());
        prop_assert_eq!(summary(piped.state()), summary(reconciled(&second).state()));
        prop_assert_eq!(piped.reconcile(&second).unwrap().ops, 0, "steady state writes nothing");
    }
}

type Endpoints = Vec<(IpAddr, u16)>;

/// frontend → (sorted active backends, sorted terminating backends), by address.
fn summary(state: &MapState) -> BTreeMap<(IpAddr, u16), (Endpoints, Endpoints)> {
    state
        .frontends()
        .map(|(k, v)| {
            let slots = state.slots_of(k);
            let addr = |id: &u32| {
                let b = state.backends[id];
                (b.address, b.port)
            };
            let mut active: Vec<_> = slots[..v.count as usize].iter().map(addr).collect();
            let mut term: Vec<_> = slots[v.count as usize..].iter().map(addr).collect();
            active.sort();
            term.sort();
            ((k.address, k.port), (active, term))
        })
        .collect()
}

#[test]
fn external_traffic_policy_local_adds_a_node_local_view_of_the_frontend() {
    let mut svc = service(7, 30080, &[1, 2, 3]);
    let fe = &mut svc.frontends[0];
    fe.kind = FrontendKind::NodePort;
    fe.external_traffic_local = true;
    fe.backends[1].local = true;
    let mut model = Model::default();
    model.services.insert(name(7), svc);
    let r = reconciled(&model);
    let masters: Vec<_> = r
        .state()
        .frontends()
        .map(|(k, v)| (k.scope, v.count, v.flags))
        .collect();
    assert_eq!(masters.len(), 2, "{masters:?}");
    let all = masters
        .iter()
        .find(|m| m.0 == lb_common::service::SCOPE_ALL)
        .unwrap();
    let local = masters
        .iter()
        .find(|m| m.0 == lb_common::service::SCOPE_LOCAL)
        .unwrap();
    assert_eq!(all.1, 3, "clients on the node use every backend");
    assert_eq!(local.1, 1, "traffic from outside uses the local one only");
    assert!(all.2 & lb_common::service::SVC_FLAG_TWO_SCOPES != 0);
    assert_consistent(r.state());
}

#[test]
fn affinity_match_entries_follow_the_selectable_backends() {
    let mut svc = service(9, 80, &[1, 2]);
    svc.frontends[0].affinity_timeout_s = Some(60);
    let mut model = Model::default();
    model.services.insert(name(9), svc.clone());
    let mut r = reconciled(&model);
    let id = r.state().frontends().next().unwrap().1.service_id;
    assert_eq!(r.state().affinity[&id].len(), 2);

    // Backend 2 turns terminating while 1 is ready: nobody may stick to it.
    svc.frontends[0].backends[1].state = BackendState::Terminating;
    model.services.insert(name(9), svc.clone());
    r.reconcile(&model).unwrap();
    let log = r.maps_mut().take_log();
    assert!(
        matches!(log[0], MapOp::DeleteAffinityMatch(..)),
        "withdrawn before anything else: {log:?}"
    );
    assert_eq!(r.state().affinity[&id].len(), 1);

    // Only terminating ones left: they are what the service selects, so they match.
    svc.frontends[0].backends[0].state = BackendState::Terminating;
    model.services.insert(name(9), svc);
    r.reconcile(&model).unwrap();
    assert_eq!(r.state().affinity[&id].len(), 2);

    model.services.clear();
    r.reconcile(&model).unwrap();
    assert!(r.state().affinity.is_empty());
}

#[test]
fn maglev_table_is_written_before_the_master_and_follows_the_backends() {
    let mut svc = service(11, 80, &[1, 2, 3]);
    svc.frontends[0].algorithm = lb::model::Algorithm::Maglev;
    let mut model = Model::default();
    model.services.insert(name(11), svc.clone());
    let mut r = Reconciler::restore(FakeMaps::default()).unwrap();
    r.reconcile(&model).unwrap();
    let log = r.maps_mut().take_log();
    let table_at = log
        .iter()
        .position(|op| matches!(op, MapOp::SetMaglev(..)))
        .expect("a table is written");
    let master_at = log
        .iter()
        .position(|op| matches!(op, MapOp::UpsertService(k, _) if k.slot == 0 && k.port == 80))
        .unwrap();
    assert!(table_at < master_at, "table before master: {log:?}");
    let id = r.state().frontends().next().unwrap().1.service_id;
    let table = &r.state().maglev[&id];
    assert_eq!(table.len(), lb_common::maps::DEFAULT_MAGLEV_M as usize);
    let ids: HashSet<u32> = table.iter().copied().collect();
    assert_eq!(ids.len(), 3);

    // Backend 2 leaves: a new table without it, written before its entry is deleted.
    svc.frontends[0].backends.remove(1);
    model.services.insert(name(11), svc.clone());
    r.reconcile(&model).unwrap();
    let log = r.maps_mut().take_log();
    let table_at = log
        .iter()
        .position(|op| matches!(op, MapOp::SetMaglev(..)))
        .unwrap();
    let delete_at = log
        .iter()
        .position(|op| matches!(op, MapOp::DeleteBackend(..)))
        .unwrap();
    assert!(table_at < delete_at, "{log:?}");
    assert_eq!(
        r.state().maglev[&id]
            .iter()
            .copied()
            .collect::<HashSet<_>>()
            .len(),
        2
    );

    // Back to random: the table goes.
    svc.frontends[0].algorithm = lb::model::Algorithm::Random;
    model.services.insert(name(11), svc);
    r.reconcile(&model).unwrap();
    assert!(r.state().maglev.is_empty());
    // Unchanged model: nothing written, not even the table.
    assert_eq!(r.reconcile(&model).unwrap().ops, 0);
}

/// A service's table size changes both ways without a moment where its
/// master names a size past its table's end (the programs would drop new
/// flows, `maglev-missing`): a bigger table goes in before the master, a
/// smaller one after it. The fake records any such moment.
#[test]
fn a_maglev_table_grows_before_its_master_and_shrinks_after_it() {
    let mut svc = service(14, 80, &[1, 2, 3]);
    svc.frontends[0].algorithm = lb::model::Algorithm::Maglev;
    let mut model = Model::default();
    let mut r = Reconciler::restore(FakeMaps::default()).unwrap();
    for size in [
        Some(251),
        Some(65_537),
        None,
        Some(509),
        Some(131_071),
        Some(251),
    ] {
        svc.frontends[0].maglev_table_size = size;
        model.services.insert(name(14), svc.clone());
        r.reconcile(&model).unwrap();
        let want = size.unwrap_or(lb_common::maps::DEFAULT_MAGLEV_M);
        let (_, master) = r.state().frontends().next().unwrap();
        assert_eq!(r.state().maglev[&master.service_id].len(), want as usize);
        assert_eq!(
            lb_common::maps::maglev_size_of(master.maglev_size),
            Some(want)
        );
    }
    assert!(
        r.maps().maglev_overruns.is_empty(),
        "{:?}",
        r.maps().maglev_overruns
    );
}

/// Upgrading from an agent whose masters name no size (0: the programs use
/// CFG_MAGLEV_M, here 251): the first reconcile moves the table to the new
/// size with the master, never letting the master's size pass its table.
#[test]
fn a_master_of_an_older_agent_moves_to_a_named_size_without_an_overrun() {
    let mut svc = service(15, 80, &[1, 2, 3]);
    svc.frontends[0].algorithm = lb::model::Algorithm::Maglev;
    svc.frontends[0].maglev_table_size = Some(251);
    let mut model = Model::default();
    model.services.insert(name(15), svc.clone());
    let mut old = Reconciler::restore(FakeMaps {
        legacy_maglev_m: 251,
        ..Default::default()
    })
    .unwrap();
    old.reconcile(&model).unwrap();
    // What the older agent left: the same table, a master without a size.
    let mut maps = std::mem::take(old.maps_mut());
    let (key, master) = maps
        .state
        .frontends()
        .map(|(k, v)| (*k, *v))
        .next()
        .unwrap();
    lb::maps::LbMaps::apply(
        &mut maps,
        &MapOp::UpsertService(
            key,
            lb_common::service::ServiceValue {
                maglev_size: 0,
                ..master
            },
        ),
    )
    .unwrap();
    assert!(maps.maglev_overruns.is_empty());
    for size in [None, Some(509)] {
        let mut r = Reconciler::restore(std::mem::take(&mut maps)).unwrap();
        svc.frontends[0].maglev_table_size = size;
        model.services.insert(name(15), svc.clone());
        r.reconcile(&model).unwrap();
        let want = size.unwrap_or(lb_common::maps::DEFAULT_MAGLEV_M);
        let (_, m) = r.state().frontends().next().unwrap();
        assert_eq!(lb_common::maps::maglev_size_of(m.maglev_size), Some(want));
        assert_eq!(r.state().maglev[&m.service_id].len(), want as usize);
        maps = std::mem::take(r.maps_mut());
    }
    assert!(
        maps.maglev_overruns.is_empty(),
        "{:?}",
        maps.maglev_overruns
    );
}

/// A Maglev service whose last backend goes has no table (the kernel
/// refuses an empty array, and so does the fake): the reconcile goes
/// through, the old table is removed, and the rest of the model applies.
#[test]
fn a_maglev_service_without_backends_has_no_table_and_does_not_stop_the_sync() {
    let mut svc = service(12, 80, &[1, 2]);
    svc.frontends[0].algorithm = lb::model::Algorithm::Maglev;
    let other = service(13, 81, &[3]);
    let mut model = Model::default();
    model.services.insert(name(12), svc.clone());
    let mut r = Reconciler::restore(FakeMaps::default()).unwrap();
    r.reconcile(&model).unwrap();
    assert_eq!(r.state().maglev.len(), 1);

    svc.frontends[0].backends.clear();
    model.services.insert(name(12), svc);
    model.services.insert(name(13), other);
    r.reconcile(&model)
        .expect("an empty Maglev service reconciles");
    assert!(r.state().maglev.is_empty(), "the table is gone");
    assert_eq!(r.pending().len(), 0);
    assert!(
        r.state().frontends().any(|(k, _)| k.port == 81),
        "the other service applied"
    );
    // And the fake refuses what the kernel refuses.
    let mut fake = FakeMaps::default();
    assert!(lb::maps::LbMaps::apply(
        &mut fake,
        &MapOp::SetMaglev(1, std::sync::Arc::new(Vec::new()))
    )
    .is_err());
}

/// Refusing k of n services costs O(n + k) id-table work: a refused service
/// gives back only the ids it took. (Giving them back by scanning every id
/// once per refused service made it n·k: minutes at 100 000 services.)
#[test]
fn refusing_most_services_costs_work_linear_in_the_input() {
    let n = 3_000u32;
    let mut model = Model::default();
    for i in 0..n {
        model
            .services
            .insert(name(i), service(i, 80, &[(i % 200) as u8]));
    }
    // Services: marker + master + slot, room for 300 of them.
    let mut r = sized(900, 1_000);
    let err = r.reconcile(&model).unwrap_err();
    let ReconcileError::Refused(refused) = &err else {
        panic!("{err}")
    };
    let k = refused.len() as u64;
    assert!(k >= 2_600, "{k} refused");
    let work = r.ids_touched();
    assert!(
        work <= 8 * (u64::from(n) + k),
        "{work} id-table entries looked at for n = {n}, k = {k}"
    );
    // The summary is one line whatever k is.
    let text = err.to_string();
    assert!(text.len() < 400, "{text}");
    assert!(text.contains("LB4_SERVICES is full"), "{text}");
}

/// `forwardingMode` reaches the master entries of the LoadBalancer
/// frontend as its flag (not the ClusterIP's), and a change of mode is
/// written as a change of that one entry.
#[test]
fn a_forwarding_mode_sets_its_flag_on_external_frontends_and_a_change_rewrites_it() {
    use lb_common::service::{SVC_FLAG_FORWARD_DSR, SVC_FLAG_FORWARD_SNAT};
    let model = |mode: &str| {
        lb::source::file::parse::parse(&format!(
            "services: [{{name: lb, type: LoadBalancer, clusterIPs: [10.96.0.1], loadBalancerIPs: [203.0.113.1], {mode} ports: [{{port: 80}}], backends: [{{address: 10.0.0.1}}]}}]"
        ))
        .unwrap()
    };
    let flags_of = |r: &Reconciler<FakeMaps>, addr: &str| {
        let a: IpAddr = addr.parse().unwrap();
        r.state()
            .frontends()
            .find(|(k, _)| k.address == a)
            .map(|(_, v)| v.flags)
            .unwrap()
    };
    let mut r = Reconciler::restore(FakeMaps::default()).unwrap();
    r.reconcile(&model("forwardingMode: dsr,")).unwrap();
    assert_ne!(flags_of(&r, "203.0.113.1") & SVC_FLAG_FORWARD_DSR, 0);
    assert_eq!(flags_of(&r, "203.0.113.1") & SVC_FLAG_FORWARD_SNAT, 0);
    assert_eq!(
        flags_of(&r, "10.96.0.1") & (SVC_FLAG_FORWARD_DSR | SVC_FLAG_FORWARD_SNAT),
        0,
        "a ClusterIP has no forwarding mode"
    );
    r.maps_mut().take_log();
    r.reconcile(&model("forwardingMode: snat,")).unwrap();
    assert_ne!(flags_of(&r, "203.0.113.1") & SVC_FLAG_FORWARD_SNAT, 0);
    let log = r.maps_mut().take_log();
    assert!(
        log.iter().all(|op| matches!(op, MapOp::UpsertService(..))) && !log.is_empty(),
        "{log:#?}"
    );
    r.reconcile(&model("")).unwrap();
    assert_eq!(
        flags_of(&r, "203.0.113.1") & (SVC_FLAG_FORWARD_DSR | SVC_FLAG_FORWARD_SNAT),
        0
    );
}

/// loadBalancerSourceRanges: a range is written before the master entry that
/// turns the check on and withdrawn after the one that turns it off, a
/// change adds the new ranges before removing the old, only the
/// LoadBalancer frontend carries them, and nothing is left behind.
#[test]
fn source_ranges_go_in_before_the_check_turns_on_and_out_after_it_turns_off() {
    use lb_common::service::SVC_FLAG_SOURCE_RANGES;
    let model = |ranges: &str| {
        lb::source::file::parse::parse(&format!(
            "services: [{{name: lb, type: LoadBalancer, clusterIPs: [10.96.0.1], loadBalancerIPs: [203.0.113.1], loadBalancerSourceRanges: [{ranges}], ports: [{{port: 80}}], backends: [{{address: 10.0.0.1}}]}}]"
        ))
        .unwrap()
    };
    let pos = |log: &[MapOp], f: &dyn Fn(&MapOp) -> bool| log.iter().position(f);
    let checked_master = |op: &MapOp| matches!(op, MapOp::UpsertService(k, v) if k.slot == 0 && v.flags & SVC_FLAG_SOURCE_RANGES != 0);
    let mut r = Reconciler::restore(FakeMaps::default()).unwrap();
    r.reconcile(&model("10.1.2.3/8, 192.168.7.0/24")).unwrap();
    let log = r.maps_mut().take_log();
    let first_range = pos(&log, &|op| matches!(op, MapOp::UpsertSourceRange(..))).unwrap();
    let master = pos(&log, &checked_master).expect("the LB master turns the check on");
    assert!(first_range < master, "{log:#?}");
    let lb_id = r
        .state()
        .frontends()
        .find(|(k, _)| k.address == "203.0.113.1".parse::<IpAddr>().unwrap())
        .map(|(_, v)| v.service_id)
        .unwrap();
    let ranges: Vec<String> = r.state().source_ranges[&lb_id]
        .iter()
        .map(std::string::ToString::to_string)
        .collect();
    assert_eq!(
        ranges,
        ["10.0.0.0/8", "192.168.7.0/24"],
        "host bits cleared"
    );
    assert_eq!(
        r.state().source_ranges.len(),
        1,
        "the ClusterIP is not restricted"
    );

    // A change: the new network in before the old one goes.
    r.reconcile(&model("10.0.0.0/8, 172.16.0.0/12")).unwrap();
    let log = r.maps_mut().take_log();
    let added = pos(&log, &|op| matches!(op, MapOp::UpsertSourceRange(..))).unwrap();
    let removed = pos(&log, &|op| matches!(op, MapOp::DeleteSourceRange(..))).unwrap();
    assert!(added < removed, "{log:#?}");
    assert_eq!(log.len(), 2, "only the changed range: {log:#?}");

    // Off: the master first, then the ranges.
    r.reconcile(&model("")).unwrap();
    let log = r.maps_mut().take_log();
    let master = pos(&log, &|op| matches!(op, MapOp::UpsertService(k, v) if k.slot == 0 && v.flags & SVC_FLAG_SOURCE_RANGES == 0)).unwrap();
    let removed = pos(&log, &|op| matches!(op, MapOp::DeleteSourceRange(..))).unwrap();
    assert!(master < removed, "{log:#?}");
    assert_eq!(r.state().source_range_entries(), 0);

    // A removed service takes its ranges along.
    r.reconcile(&model("10.0.0.0/8")).unwrap();
    assert_eq!(r.state().source_range_entries(), 1);
    r.reconcile(&Model::default()).unwrap();
    assert_eq!(r.state().source_range_entries(), 0);
    let mut empty = MapState::default();
    empty.apply(&MapOp::TrustFilter(true));
    assert_eq!(r.state(), &empty);
}

/// A bad network in the services file names its field and the fix.
#[test]
fn a_bad_source_range_names_its_field() {
    let e = lb::source::file::parse::parse(
        "services: [{name: lb, type: LoadBalancer, loadBalancerIPs: [203.0.113.1], loadBalancerSourceRanges: [10.0.0.0/8, 10.0.0.0/40], ports: [{port: 80}]}]",
    )
    .unwrap_err();
    assert_eq!(e.field, "services[0].loadBalancerSourceRanges[1]");
    assert!(e.message.contains("203.0.113.0/24"), "{e}");
}

/// A backend that drains is parked after the selectable slots only once the
/// master no longer counts that slot as selectable: no new flow can draw it
/// in between.
#[test]
fn a_drained_backend_is_parked_after_the_master_stops_counting_its_slot() {
    let model = |a_state: &str| {
        lb::source::file::parse::parse(&format!(
            "services: [{{name: web, clusterIPs: [10.96.0.1], ports: [{{port: 80}}], backends: [{{address: 10.0.0.1, state: {a_state}}}, {{address: 10.0.0.2}}, {{address: 10.0.0.3}}]}}]"
        ))
        .unwrap()
    };
    let mut r = Reconciler::restore(FakeMaps::default()).unwrap();
    r.reconcile(&model("active")).unwrap();
    r.maps_mut().take_log();
    r.reconcile(&model("maintenance")).unwrap();
    let log = r.maps_mut().take_log();
    let master = log
        .iter()
        .position(|op| matches!(op, MapOp::UpsertService(k, v) if k.slot == 0 && k.port == 80 && v.count == 2))
        .expect("the master drops to two selectable backends");
    for (i, op) in log.iter().enumerate() {
        if let MapOp::UpsertService(k, _) = op {
            if k.slot > 2 {
                assert!(
                    i > master,
                    "slot {} written before the master: {log:#?}",
                    k.slot
                );
            }
        }
    }
    let (_, m) = r.state().frontends().find(|(k, _)| k.port == 80).unwrap();
    assert_eq!(
        (m.count, m.backend_id),
        (2, 1),
        "two selectable, one parked"
    );
}

/// externalTrafficPolicy turning Local: the node-local view is written
/// before the master that names it, so no packet finds a master pointing
/// at a view that is not there yet.
#[test]
fn the_local_view_is_written_before_the_master_that_names_it() {
    use lb_common::service::{SCOPE_LOCAL, SVC_FLAG_TWO_SCOPES};
    let model = |policy: &str| {
        lb::source::file::parse::parse_with(
            &format!("services: [{{name: np, type: NodePort, externalTrafficPolicy: {policy}, clusterIPs: [10.96.0.1], ports: [{{port: 80, nodePort: 30080}}], backends: [{{address: 10.0.0.1, local: true}}]}}]"),
            &lb::source::file::parse::FileContext {
                nodeport_addresses: vec!["192.168.1.10".parse().unwrap()],
                ..Default::default()
            },
        )
        .unwrap()
    };
    let mut r = Reconciler::restore(FakeMaps::default()).unwrap();
    r.reconcile(&model("Cluster")).unwrap();
    r.maps_mut().take_log();
    r.reconcile(&model("Local")).unwrap();
    let log = r.maps_mut().take_log();
    let view = log
        .iter()
        .position(
            |op| matches!(op, MapOp::UpsertService(k, _) if k.slot == 0 && k.scope == SCOPE_LOCAL),
        )
        .expect("the local view");
    let master = log
        .iter()
        .position(|op| matches!(op, MapOp::UpsertService(k, v) if k.slot == 0 && v.flags & SVC_FLAG_TWO_SCOPES != 0))
        .expect("the master naming it");
    assert!(view < master, "{log:#?}");
}

fn pos(log: &[MapOp], f: &dyn Fn(&MapOp) -> bool) -> Option<usize> {
    log.iter().position(f)
}

#[test]
fn a_frontend_filter_bit_is_set_before_its_frontend_and_cleared_after_the_last_one_on_it() {
    let mut r = Reconciler::restore(FakeMaps::default()).unwrap();
    let mut m = cluster(1);
    r.reconcile(&m).unwrap();
    let log = r.maps_mut().take_log();
    let master = pos(
        &log,
        &|op| matches!(op, MapOp::UpsertService(k, _) if k.slot == 0 && k.port == 80),
    )
    .unwrap();
    let bit = lb::maps::state::filter_bit(match &log[master] {
        MapOp::UpsertService(k, _) => k,
        _ => unreachable!(),
    })
    .unwrap();
    let (word, mask) = lb_common::filter::word_and_mask(bit);
    let set = pos(
        &log,
        &|op| matches!(op, MapOp::SetFilterWord(w, v) if *w == word && v & mask != 0),
    )
    .unwrap();
    assert!(set < master, "{log:#?}");
    let trust = pos(&log, &|op| matches!(op, MapOp::TrustFilter(true))).unwrap();
    assert_eq!(
        trust,
        log.len() - 1,
        "trusted last, once the full sync wrote it: {log:#?}"
    );

    // A second service: its own bit; then the first goes, and only its bit.
    m.services.insert(name(1), service(1, 80, &[7]));
    r.reconcile(&m).unwrap();
    r.maps_mut().take_log();
    m.services.remove(&name(0));
    r.reconcile(&m).unwrap();
    let log = r.maps_mut().take_log();
    let deleted = pos(
        &log,
        &|op| matches!(op, MapOp::DeleteService(k) if k.slot == 0 && k.port == 80),
    )
    .unwrap();
    let cleared = pos(
        &log,
        &|op| matches!(op, MapOp::SetFilterWord(w, v) if *w == word && v & mask == 0),
    )
    .unwrap();
    assert!(deleted < cleared, "{log:#?}");
    assert_consistent(r.state());

    // A restart trusts nothing until its full sync checked the filter: a
    // stale bit left behind is cleared, a missing one set, then trusted.
    let mut maps = std::mem::take(r.maps_mut());
    maps.state.apply(&MapOp::TrustFilter(false));
    maps.state.apply(&MapOp::SetFilterWord(word, mask));
    let mut r = Reconciler::restore(maps).unwrap();
    r.reconcile(&m).unwrap();
    assert_consistent(r.state());
}

/// sessionAffinity is kept per service port, as kube-proxy does: the
/// ClusterIP, NodePort and LoadBalancer frontends of one port share one
/// affinity group (the lowest of their service ids), even when their
/// backend lists differ (internalTrafficPolicy: Local keeps the ClusterIP's
/// local ones only); another port of the same service has its own, even
/// with the same backends; a service without affinity has none; and the
/// group goes with the frontends.
#[test]
fn affinity_groups_join_the_frontends_of_one_service_port_and_go_with_them() {
    let fe = |address: &str, port: u16, kind: FrontendKind, target: u16, index: u16| Frontend {
        address: address.parse().unwrap(),
        port,
        port_index: index,
        protocol: Protocol::Tcp,
        kind,
        algorithm: Default::default(),
        affinity_timeout_s: Some(600),
        maglev_table_size: None,
        external_traffic_local: false,
        forwarding: None,
        source_ranges: Vec::new(),
        backends: (1..=3)
            .map(|i| Backend {
                port: target,
                ..backend(i, BackendState::Active)
            })
            .collect(),
    };
    let sticky = Service {
        frontends: vec![
            // internalTrafficPolicy: Local: the ClusterIP keeps one backend.
            Frontend {
                backends: vec![Backend {
                    port: 8080,
                    ..backend(1, BackendState::Active)
                }],
                ..fe("10.96.0.1", 80, FrontendKind::ClusterIP, 8080, 0)
            },
            fe("192.168.1.10", 30080, FrontendKind::NodePort, 8080, 0),
            fe("203.0.113.5", 80, FrontendKind::LoadBalancer, 8080, 0),
            fe("10.96.0.1", 443, FrontendKind::ClusterIP, 8443, 1),
            fe("192.168.1.10", 30443, FrontendKind::NodePort, 8443, 1),
            // A third port with the same backends as the first.
            fe("10.96.0.1", 8080, FrontendKind::ClusterIP, 8080, 2),
        ],
        health_check_node_port: None,
        metrics: false,
    };
    let mut m = cluster(3);
    m.services.insert(name(100), sticky);
    let r = reconciled(&m);
    let state = r.state();
    let id_of = |addr: &str, port: u16| {
        state
            .frontends()
            .find(|(k, _)| k.address == addr.parse::<IpAddr>().unwrap() && k.port == port)
            .unwrap()
            .1
            .service_id
    };
    let group = |addr: &str, port: u16| state.affinity_groups.get(&id_of(addr, port)).copied();
    let http = [
        ("10.96.0.1", 80),
        ("192.168.1.10", 30080),
        ("203.0.113.5", 80),
    ];
    let lowest = http.iter().map(|(a, p)| id_of(a, *p)).min().unwrap();
    for (a, p) in http {
        assert_eq!(group(a, p), Some(lowest), "{a}:{p}");
    }
    let https = group("10.96.0.1", 443).expect("its own group");
    assert_ne!(https, lowest, "another service port");
    assert_eq!(group("192.168.1.10", 30443), Some(https));
    let third = group("10.96.0.1", 8080).expect("its own group");
    assert_ne!(third, lowest, "same backends, another service port");
    assert_ne!(third, https);
    // No affinity, no group.
    assert_eq!(state.affinity_groups.len(), 6);
    // Gone with the service.
    let mut r = r;
    m.services.remove(&name(100));
    r.reconcile(&m).unwrap();
    assert!(r.state().affinity_groups.is_empty());
}
