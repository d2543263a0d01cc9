//! Socket load balancing on the real kernel: real programs attached to a
//! child cgroup, real connect()/sendto() from a client namespace to backends
//! in other namespaces. Needs root (CI runs as root). What both families
//! share (a connect reaching the backends, UDP replies from the service,
//! refusals without backends) is in socket_lb_both_families.rs, one body
//! run for each.
use std::{collections::BTreeMap, time::Duration};

use lb_testkit::{
    agent::Agent,
    probe::{Attempt, Held},
    servers::Server,
    topology::Topology,
    world::World,
};

const VIP: &str = "10.96.0.10";

/// A ClusterIP service on VIP:80 → backends (by index) on port 8080.
fn service_yaml(backends: &[usize], extra: &str) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|i| format!("{{address: {}}}", Topology::backend_ip(*i)))
        .collect();
    format!(
        "services:\n  - name: web\n    clusterIPs: [{VIP}]\n    ports: [{{port: 80, targetPort: 8080}}]\n    backends: [{}]\n{extra}",
        list.join(", ")
    )
}

fn count_backends(attempts: &[Attempt]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for a in attempts {
        assert!(a.ok, "attempt failed: {a:?}");
        *counts.entry(a.backend().unwrap().to_string()).or_default() += 1;
    }
    counts
}

#[test]
fn tcp_connects_spread_uniformly_over_three_backends_chi_square_p001() {
    let w = World::new("tcp_uniform_chi_square", 3);
    let _servers = w.tcp_servers(8080, false);
    w.write_services(&service_yaml(&[0, 1, 2], ""));
    let _agent = w.start_agent();

    let n = 3000;
    let counts = count_backends(&w.probe("tcp", &format!("{VIP}:80"), n));
    assert_eq!(counts.len(), 3, "every backend must be chosen: {counts:?}");
    let expected = n as f64 / 3.0;
    let chi2: f64 = counts
        .values()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum();
    // Critical value of chi-square with 2 degrees of freedom at p = 0.001.
    assert!(
        chi2 < 13.816,
        "distribution {counts:?} is not uniform (chi2 = {chi2:.2})"
    );
}

#[test]
fn removing_a_backend_stops_new_connections_to_it_and_adding_one_starts_them() {
    let w = World::new("remove_add_backend", 3);
    let _servers = w.tcp_servers(8080, false);
    w.write_services(&service_yaml(&[0, 1], ""));
    let mut agent = w.start_agent();

    let counts = count_backends(&w.probe("tcp", &format!("{VIP}:80"), 200));
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        ["b1", "b2"],
        "{counts:?}"
    );

    w.write_services(&service_yaml(&[1], ""));
    assert!(
        agent.wait_for_log("reconciled", 2, Duration::from_secs(10)),
        "{}",
        agent.log_text()
    );
    let counts = count_backends(&w.probe("tcp", &format!("{VIP}:80"), 200));
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        ["b2"],
        "removed b1 still chosen: {counts:?}"
    );

    w.write_services(&service_yaml(&[1, 2], ""));
    assert!(
        agent.wait_for_log("reconciled", 3, Duration::from_secs(10)),
        "{}",
        agent.log_text()
    );
    let counts = count_backends(&w.probe("tcp", &format!("{VIP}:80"), 200));
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        ["b2", "b3"],
        "added b3 not chosen: {counts:?}"
    );
}

/// A TCP echo server on port 8081 of each of the two backends, answering
/// "b1" / "b2".
fn echo_backends(w: &World) -> Vec<Server> {
    (0..2)
        .map(|i| {
            lb_testkit::servers::tcp_echo(
                &w.topo.backends[i].name,
                (Topology::backend_ip(i), 8081).into(),
                &format!("b{}", i + 1),
            )
        })
        .collect()
}

fn lru_entries(w: &World) -> usize {
    lb::maps::bpf::count_entries(&w.pins.path, "LB4_SOCK_REVNAT")
        .expect("reading LB4_SOCK_REVNAT")
        .expect("LB4_SOCK_REVNAT is pinned")
}

/// A closing socket's entry leaves the shared LB4_SOCK_REVNAT LRU, and a
/// TCP socket's its LB_SOCK_TCP slot (cgroup/sock_release), so connection
/// churn does not fill them with dead sockets (and every connect insert
/// into a full LRU takes the eviction path): after 2000 TCP connects and
/// 300 connected UDP sockets, closed, only the entries of the sockets still
/// open remain, and those still translate getpeername().
#[test]
fn closed_sockets_leave_the_shared_reverse_lru_and_open_ones_keep_their_entry() {
    let w = World::new("sock_release_lru", 2);
    let _dns = w.udp_servers(5353, false);
    let _web = w.tcp_servers(8080, false);
    let _echo = echo_backends(&w);
    let (b1, b2) = (Topology::backend_ip(0), Topology::backend_ip(1));
    w.write_services(&format!(
        "services:\n  - name: mixed\n    clusterIPs: [{VIP}]\n    ports:\n      - {{name: dns, port: 53, protocol: UDP, targetPort: 5353}}\n      - {{name: web, port: 80, targetPort: 8080}}\n      - {{name: echo, port: 81, targetPort: 8081}}\n    backends: [{{address: {b1}}}, {{address: {b2}}}]\n"
    ));
    let _agent = Agent::start(&w.services, &w.cgroup.path, &w.pins.path);
    // The connected UDP socket's entry is in the LRU, the TCP socket's in
    // LB_SOCK_TCP.
    let entries = || lru_entries(&w) + lb::maps::bpf::count_tcp_table(&w.pins.path).unwrap();
    assert_eq!(entries(), 0, "nothing translated yet");
    let (cg, ns) = (&w.cgroup.path, w.topo.client.name.as_str());
    let mut udp = Held::start(cg, ns, &format!("{VIP}:53"));
    let mut tcp = Held::tcp(cg, ns, &format!("{VIP}:81"));
    assert!(udp.ask().ok);
    assert!(tcp.ask().ok);
    assert_eq!(entries(), 2, "one entry per open translated socket");

    for (mode, target, n) in [
        ("tcp", "10.96.0.10:80", 2000),
        ("udp-connected", "10.96.0.10:53", 300),
    ] {
        let attempts = w.probe(mode, target, n);
        assert!(attempts.iter().all(|a| a.ok), "{mode}: a probe failed");
        assert!(
            attempts.iter().all(|a| a.peer.as_deref() == Some(target)),
            "{mode}: getpeername() showed a backend while the socket was open"
        );
    }
    assert_eq!(
        entries(),
        2,
        "the 2300 closed sockets' entries were left in the LRU"
    );
    let a = udp.ask();
    assert_eq!(a.peer.as_deref(), Some("10.96.0.10:53"), "{a:?}");
    let a = tcp.ask();
    assert_eq!(a.peer.as_deref(), Some("10.96.0.10:81"), "{a:?}");
    drop(udp);
    drop(tcp);
    assert_eq!(entries(), 0, "the held sockets' entries outlived them");
}

/// A ClusterIP DNS service (VIP:53 → both backends' 5353), servers up.
fn dns_world(tag: &str) -> (World, Vec<Server>) {
    let w = World::new(tag, 2);
    let dns = w.udp_servers(5353, false);
    let (b1, b2) = (Topology::backend_ip(0), Topology::backend_ip(1));
    w.write_services(&format!(
        "services:\n  - name: dns\n    clusterIPs: [{VIP}]\n    ports: [{{port: 53, protocol: UDP, targetPort: 5353}}]\n    backends: [{{address: {b1}}}, {{address: {b2}}}]\n"
    ));
    (w, dns)
}

/// LB4_SOCK_REVNAT's keys, by cookie.
fn lru_keys(w: &World) -> Vec<lb_common::revnat::SockRevNat4Key> {
    use lb_common::revnat::{SockRevNat4Key, SockRevNat4Value};
    let lru: aya::maps::HashMap<_, SockRevNat4Key, SockRevNat4Value> =
        aya::maps::HashMap::try_from(
            lb::maps::bpf::open_pinned(&w.pins.path, "LB4_SOCK_REVNAT").expect("LB4_SOCK_REVNAT"),
        )
        .unwrap();
    let mut keys: Vec<_> = lru.keys().map(Result::unwrap).collect();
    keys.sort_by_key(|k| k.cookie);
    keys
}

fn filter_flags(w: &World, filter: &str) -> aya::maps::Array<aya::maps::MapData, u8> {
    aya::maps::Array::try_from(lb::maps::bpf::open_pinned(&w.pins.path, filter).expect(filter))
        .unwrap()
}

/// An LB_SOCK_COOKIES slot holds the tag of the socket that set it: a
/// closing socket whose slot holds another socket's tag (one made 2^18
/// cookies before or after it) has nothing to look up, and one whose slot
/// is shared (both set it) looks up but leaves the slot for the other.
#[test]
fn a_cookie_slot_with_another_sockets_tag_spares_the_lookup_and_a_shared_one_is_never_cleared() {
    use lb_common::filter::{sock_cookie_slot, sock_cookie_tag, SOCK_COOKIE_SHARED};
    let (w, _dns) = dns_world("sock_cookie_tags");
    let _agent = Agent::start(&w.services, &w.cgroup.path, &w.pins.path);
    let (cg, ns) = (&w.cgroup.path, w.topo.client.name.as_str());
    let mut first = Held::start(cg, ns, &format!("{VIP}:53"));
    let mut second = Held::start(cg, ns, &format!("{VIP}:53"));
    assert!(first.ask().ok && second.ask().ok);
    let keys = lru_keys(&w);
    assert_eq!(keys.len(), 2, "{keys:?}");
    let (k1, k2) = (keys[0], keys[1]);
    let other_tag = sock_cookie_tag(k1.cookie) % 254 + 1;
    filter_flags(&w, "LB_SOCK_COOKIES")
        .set(sock_cookie_slot(k1.cookie), other_tag, 0)
        .unwrap();
    filter_flags(&w, "LB_SOCK_COOKIES")
        .set(sock_cookie_slot(k2.cookie), SOCK_COOKIE_SHARED, 0)
        .unwrap();
    drop(first);
    drop(second);
    assert_eq!(
        lru_keys(&w),
        [k1],
        "the first (another's tag in its slot) must be skipped, the second (shared) looked up"
    );
    let flag = |k: &lb_common::revnat::SockRevNat4Key| {
        filter_flags(&w, "LB_SOCK_COOKIES")
            .get(&sock_cookie_slot(k.cookie), 0)
            .unwrap()
    };
    assert_eq!(flag(&k1), other_tag, "a close cleared another socket's tag");
    assert_eq!(
        flag(&k2),
        SOCK_COOKIE_SHARED,
        "a close cleared a shared slot"
    );
}

/// The agent's seed at start writes the tags of the LRU's entries the way
/// the programs do: a slot that holds another socket's tag becomes shared
/// (not overwritten, which would forget that socket), and the socket whose
/// entry it found is then looked up and taken out at its close.
#[test]
fn an_agent_start_marks_a_cookie_slot_holding_another_tag_shared_and_the_socket_still_leaves_the_lru(
) {
    use lb_common::filter::{sock_cookie_slot, sock_cookie_tag, SOCK_COOKIE_SHARED};
    let (w, _dns) = dns_world("sock_cookie_seed");
    let mut agent = Agent::start(&w.services, &w.cgroup.path, &w.pins.path);
    let (cg, ns) = (&w.cgroup.path, w.topo.client.name.as_str());
    let mut held = Held::start(cg, ns, &format!("{VIP}:53"));
    assert!(held.ask().ok);
    let keys = lru_keys(&w);
    assert_eq!(keys.len(), 1, "{keys:?}");
    let slot = sock_cookie_slot(keys[0].cookie);
    let other_tag = sock_cookie_tag(keys[0].cookie) % 254 + 1;
    // Another socket's tag, as one 2^18 cookies away leaves it.
    filter_flags(&w, "LB_SOCK_COOKIES")
        .set(slot, other_tag, 0)
        .unwrap();
    agent.restart();
    assert_eq!(
        filter_flags(&w, "LB_SOCK_COOKIES").get(&slot, 0).unwrap(),
        SOCK_COOKIE_SHARED,
        "the seed must mark a slot of two tags shared"
    );
    drop(held);
    assert!(
        lru_keys(&w).is_empty(),
        "the held socket's entry outlived it"
    );
}

/// sock_release looks a closing socket up in the shared reverse LRU only
/// when a socket was ever indexed under its backend (LB_SOCK_FILTER): the
/// filter really spares the lookup, and the agent flags, at every start,
/// the backends of entries already in the LRU (an older build's, made with
/// no flag), so their sockets still leave it.
#[test]
fn the_lru_filter_skips_unflagged_backends_and_an_agent_start_flags_the_entries_already_there() {
    a_cleared_flag_spares_the_lookup_until_an_agent_start_flags_it_again(
        "sock_lru_filter",
        "LB_SOCK_FILTER",
        |k| lb_common::filter::sock_filter_slot(k.address, k.port),
        |_| 1,
        false,
    );
}

/// The same for the sockets' own flags (LB_SOCK_COOKIES, by cookie), which
/// spare the lookup for a direct connect to a backend other sockets were
/// translated to; and sock_release clears the closed socket's flag.
#[test]
fn the_cookie_filter_skips_unflagged_sockets_an_agent_start_flags_the_entries_already_there_and_a_close_clears_its_flag(
) {
    a_cleared_flag_spares_the_lookup_until_an_agent_start_flags_it_again(
        "sock_cookie_filter",
        "LB_SOCK_COOKIES",
        |k| lb_common::filter::sock_cookie_slot(k.cookie),
        |k| lb_common::filter::sock_cookie_tag(k.cookie),
        true,
    );
}

/// Two held connected UDP sockets through the VIP (a TCP socket's
/// translation is in LB_SOCK_TCP, not the LRU); their flags in `filter`
/// (`flag_of` an LRU key, in the slot `slot_of` it) cleared by hand, as an older build leaves them:
/// the one closed now keeps its entry (the lookup was skipped), the one
/// closed after the agent restarts loses it. `cleared_on_close`: the closed
/// socket's flag is clear again afterwards.
fn a_cleared_flag_spares_the_lookup_until_an_agent_start_flags_it_again(
    tag: &str,
    filter: &str,
    slot_of: fn(&lb_common::revnat::SockRevNat4Key) -> u32,
    flag_of: fn(&lb_common::revnat::SockRevNat4Key) -> u8,
    cleared_on_close: bool,
) {
    use lb_common::revnat::SockRevNat4Key;
    let (w, _dns) = dns_world(tag);
    let mut agent = Agent::start(&w.services, &w.cgroup.path, &w.pins.path);
    let keys = || lru_keys(&w);
    let flags = || filter_flags(&w, filter);
    let flag = |k: &SockRevNat4Key| flags().get(&slot_of(k), 0).unwrap();
    assert!(keys().is_empty(), "nothing translated yet");

    let (cg, ns) = (&w.cgroup.path, w.topo.client.name.as_str());
    let mut first = Held::start(cg, ns, &format!("{VIP}:53"));
    let (a1, k1) = (first.ask(), keys());
    let mut second = Held::start(cg, ns, &format!("{VIP}:53"));
    let a2 = second.ask();
    assert!(a1.ok && a2.ok, "{a1:?} {a2:?}");
    let (k1, all) = (k1[0], keys());
    assert_eq!(all.len(), 2, "one entry per open translated socket");
    let k2 = *all.iter().find(|k| **k != k1).unwrap();
    let both = all;
    for k in [&k1, &k2] {
        assert_eq!(
            flag(k),
            flag_of(k),
            "connect4 did not set {filter}'s flag of {k:?}"
        );
    }

    // As an older build leaves them: entries, no flags.
    for k in [&k1, &k2] {
        flags().set(slot_of(k), 0, 0).unwrap();
    }
    drop(first);
    assert_eq!(
        keys(),
        both,
        "sock_release looked up an entry whose {filter} flag is clear"
    );

    agent.restart();
    assert_eq!(
        (flag(&k1), flag(&k2)),
        (flag_of(&k1), flag_of(&k2)),
        "the agent's start did not flag the entries in the LRU"
    );
    let a = second.ask();
    assert_eq!(a.peer.as_deref(), Some("10.96.0.10:53"), "{a:?}");
    drop(second);
    assert_eq!(
        keys(),
        [k1],
        "the entry made before the flag was cleared outlived its socket after the restart"
    );
    if cleared_on_close {
        assert_eq!(flag(&k2), 0, "sock_release left the closed socket's flag");
    }
}

/// A TCP socket's translation is kept in LB_SOCK_TCP, in the slot of its
/// cookie's low bits; a socket made `slots` cookies later claims the slot
/// again. A socket still open then (a long-lived connection) must keep its
/// translation: it moves to the LRU. With a 16-slot table, one held TCP
/// socket and 500 connects after it: every connect's getpeername() shows
/// the VIP, the held socket's too (from the LRU) after its slot was taken,
/// and the LRU holds that socket alone (the closed ones freed their slots,
/// so no claim moved them there); its close takes it out. An agent restart
/// before the churn keeps the held socket's slot.
#[test]
fn a_tcp_socket_that_outlives_its_slot_keeps_its_translation_in_the_lru_and_closed_ones_never_go_there(
) {
    let w = World::new("sock_tcp_table", 2);
    let _web = w.tcp_servers(8080, false);
    let _echo = echo_backends(&w);
    let (b1, b2) = (Topology::backend_ip(0), Topology::backend_ip(1));
    w.write_services(&format!(
        "services:\n  - name: mixed\n    clusterIPs: [{VIP}]\n    ports:\n      - {{name: web, port: 80, targetPort: 8080}}\n      - {{name: echo, port: 81, targetPort: 8081}}\n    backends: [{{address: {b1}}}, {{address: {b2}}}]\n"
    ));
    // LB_SOCK_TCP gets a quarter of this, at least 16 slots.
    let mut agent = Agent::start_with(
        &w.services,
        &w.cgroup.path,
        &w.pins.path,
        &["--map-size-sock-revnat=64"],
    );
    let table = || lb::maps::bpf::count_tcp_table(&w.pins.path).unwrap();
    let (cg, ns) = (&w.cgroup.path, w.topo.client.name.as_str());
    let mut held = Held::tcp(cg, ns, &format!("{VIP}:81"));
    let a = held.ask();
    assert_eq!(a.peer.as_deref(), Some("10.96.0.10:81"), "{a:?}");
    assert_eq!((table(), lru_entries(&w)), (1, 0), "kept in its slot");
    // The table is pinned: a restart keeps it, and the new programs read it.
    agent.restart();
    let a = held.ask();
    assert_eq!(
        a.peer.as_deref(),
        Some("10.96.0.10:81"),
        "after a restart: {a:?}"
    );
    assert_eq!((table(), lru_entries(&w)), (1, 0), "a restart moved it");

    let attempts = w.probe("tcp", "10.96.0.10:80", 500);
    assert!(attempts.iter().all(|a| a.ok), "a connect failed");
    let wrong: Vec<_> = attempts
        .iter()
        .filter(|a| a.peer.as_deref() != Some("10.96.0.10:80"))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of 500 getpeername() showed no VIP, first {:?}",
        wrong.len(),
        wrong.first()
    );
    assert_eq!(
        (table(), lru_entries(&w)),
        (0, 1),
        "after 500 connects (table slots in use, LRU entries): the held socket's slot was taken, \
         so its translation should be in the LRU and nothing else anywhere"
    );
    let a = held.ask();
    assert_eq!(
        a.peer.as_deref(),
        Some("10.96.0.10:81"),
        "the held socket lost its translation when its slot was taken: {a:?}"
    );
    drop(held);
    assert_eq!(lru_entries(&w), 0, "the held socket's entry outlived it");
}

/// A TCP connect through a VIP that the backend refuses (RST) frees its
/// LB_SOCK_TCP slot at close, whether non-blocking (the socket keeps its
/// destination) or blocking (the kernel's tcp_disconnect clears the
/// destination, so sock_release finds the slot by cookie alone): otherwise
/// every refused connect would leave a slot that the next claim moves into
/// the LRU.
#[test]
fn a_refused_tcp_connect_blocking_or_not_frees_its_slot_at_close() {
    let w = World::new("sock_tcp_refused", 1);
    let b1 = Topology::backend_ip(0);
    // Nothing listens on 8082.
    w.write_services(&format!(
        "services:\n  - name: closed\n    clusterIPs: [{VIP}]\n    ports: [{{port: 82, targetPort: 8082}}]\n    backends: [{{address: {b1}}}]\n"
    ));
    let _agent = Agent::start(&w.services, &w.cgroup.path, &w.pins.path);
    for mode in ["tcp", "tcp-blocking"] {
        let attempts = w.probe(mode, "10.96.0.10:82", 20);
        assert!(
            attempts.iter().all(|a| !a.ok),
            "{mode}: a connect to a port nothing listens on succeeded: {attempts:?}"
        );
        assert_eq!(
            (
                lb::maps::bpf::count_tcp_table(&w.pins.path).unwrap(),
                lru_entries(&w)
            ),
            (0, 0),
            "{mode}: refused sockets left their translation behind (table slots, LRU entries)"
        );
    }
}

/// Socket LB keeps a UDP socket's translation in the socket's own storage
/// (LB_SOCK_PEERS), not only in the shared LB4_SOCK_REVNAT LRU: sockets
/// opened far beyond that LRU's size (256 here) must not make an idle,
/// long-lived UDP socket's replies or getpeername() show the backend (a
/// resolver drops such replies). With the translation in the LRU alone, the
/// churn evicts the idle sockets' entries. (TCP's getpeername stays on the
/// LRU: see lb-ebpf/src/sock/peers.rs.)
#[test]
fn idle_long_lived_udp_sockets_still_see_the_vip_after_socket_churn_far_beyond_the_shared_lru() {
    let w = World::new("sock_churn_idle", 2);
    let _dns = w.udp_servers(5353, false);
    let _web = w.tcp_servers(8080, false);
    let (b1, b2) = (Topology::backend_ip(0), Topology::backend_ip(1));
    w.write_services(&format!(
        "services:\n  - name: mixed\n    clusterIPs: [{VIP}]\n    ports:\n      - {{name: dns, port: 53, protocol: UDP, targetPort: 5353}}\n      - {{name: web, port: 80, targetPort: 8080}}\n    backends: [{{address: {b1}}}, {{address: {b2}}}]\n"
    ));
    let _agent = Agent::start_with(
        &w.services,
        &w.cgroup.path,
        &w.pins.path,
        &["--map-size-sock-revnat=256"],
    );
    let (cg, ns) = (&w.cgroup.path, w.topo.client.name.as_str());
    let mut resolver = Held::start(cg, ns, &format!("{VIP}:53"));
    let mut sendto = Held::udp_sendto(cg, ns, &format!("{VIP}:53"));
    let check = |resolver: &mut Held, sendto: &mut Held, when: &str| {
        let a = resolver.ask();
        assert!(a.ok, "{when}: {a:?}");
        assert_eq!(
            a.reply_from.as_deref(),
            Some("10.96.0.10:53"),
            "{when}: {a:?}"
        );
        assert_eq!(a.peer.as_deref(), Some("10.96.0.10:53"), "{when}: {a:?}");
        let a = sendto.ask();
        assert!(a.ok, "{when}: {a:?}");
        assert_eq!(
            a.reply_from.as_deref(),
            Some("10.96.0.10:53"),
            "{when}: {a:?}"
        );
    };
    check(&mut resolver, &mut sendto, "before the churn");

    // 10x the LRU's size in new sockets of every kind that socket LB
    // translates: TCP connects, unconnected and connected UDP.
    for (mode, target, n) in [
        ("tcp", "10.96.0.10:80", 1500),
        ("udp", "10.96.0.10:53", 500),
        ("udp-connected", "10.96.0.10:53", 600),
    ] {
        let attempts = w.probe(mode, target, n);
        let failed: Vec<_> = attempts.iter().filter(|a| !a.ok).collect();
        assert!(
            failed.is_empty(),
            "{mode}: {} failed, first {:?}",
            failed.len(),
            failed[0]
        );
    }
    check(&mut resolver, &mut sendto, "after 2600 other sockets");
}

/// One unconnected UDP socket sending to more backends than its own
/// storage holds (4) before reading any answer: the oldest translations
/// move to the shared LRU, so every reply, in every round, still comes from
/// the address it was sent to.
#[test]
fn one_udp_socket_sending_to_six_services_sees_each_reply_from_its_own_vip() {
    let w = World::new("udp_fanout_six", 6);
    let _dns = w.udp_servers(5353, false);
    let vip = |i: usize| format!("10.96.0.{}", 20 + i);
    let services: String = (0..6)
        .map(|i| {
            format!(
                "  - name: dns{i}\n    clusterIPs: [{}]\n    ports: [{{port: 53, protocol: UDP, targetPort: 5353}}]\n    backends: [{{address: {}}}]\n",
                vip(i),
                Topology::backend_ip(i)
            )
        })
        .collect();
    w.write_services(&format!("services:\n{services}"));
    let _agent = w.start_agent();
    let targets: Vec<String> = (0..6).map(|i| format!("{}:53", vip(i))).collect();
    let attempts = w.probe("udp-fanout", &targets.join(","), 3);
    assert_eq!(attempts.len(), 18);
    for (n, a) in attempts.iter().enumerate() {
        assert!(a.ok, "answer {n}: {a:?}");
        // Answers may come in any order: the backend says whose it is.
        let b: usize = a.backend().unwrap()[1..].parse().unwrap();
        assert_eq!(
            a.reply_from.as_deref(),
            Some(targets[b - 1].as_str()),
            "answer {n}: {a:?}"
        );
    }
}

#[test]
fn agent_sigkill_keeps_connects_working_and_restart_stacks_no_second_program() {
    let w = World::new("agent_sigkill_restart", 2);
    let _servers = w.tcp_servers(8080, false);
    w.write_services(&service_yaml(&[0, 1], ""));
    let mut agent = w.start_agent();
    let before = agent.lbctl_json(&["service", "list"]);

    agent.kill();
    let attempts = w.probe("tcp", &format!("{VIP}:80"), 200);
    assert!(
        attempts.iter().all(|a| a.ok),
        "connects failed with the agent dead"
    );

    agent.restart();
    // Exactly one program per hook on the cgroup: the restart swapped the
    // program inside the pinned link instead of attaching a second one.
    for (hook, progs) in lb::datapath::attached_programs(&w.cgroup.path).unwrap() {
        assert_eq!(progs.len(), 1, "hook {hook} has programs {progs:?}");
    }
    assert!(
        agent.log_text().contains("action=Updated"),
        "{}",
        agent.log_text()
    );
    // Same entries (ids, slots) and not one write on restart.
    assert_eq!(agent.lbctl_json(&["service", "list"]), before);
    assert!(
        agent.log_text().contains("writes=0"),
        "{}",
        agent.log_text()
    );
    assert!(w
        .probe("tcp", &format!("{VIP}:80"), 50)
        .iter()
        .all(|a| a.ok));
}

#[test]
fn invalid_services_file_is_reported_by_field_and_maps_keep_last_good_state() {
    let w = World::new("invalid_file_keeps_state", 1);
    let _servers = w.tcp_servers(8080, false);
    w.write_services(&service_yaml(&[0], ""));
    let mut agent = w.start_agent();
    let before = agent.lbctl_json(&["service", "list"]);

    w.write_services(&service_yaml(&[0], "").replace("port: 80,", "port: 0,"));
    assert!(
        agent.wait_for_log("services[0].ports[0].port", 1, Duration::from_secs(10)),
        "error does not name the field:\n{}",
        agent.log_text()
    );
    assert!(agent.log_text().contains("keeping the last good state"));
    assert_eq!(agent.lbctl_json(&["service", "list"]), before);
    assert!(w.probe("tcp", &format!("{VIP}:80"), 5).iter().all(|a| a.ok));
}

#[test]
fn lbctl_service_list_matches_configured_services() {
    let w = World::new("lbctl_service_list", 2);
    w.write_services(&format!(
        "services:\n  - name: web\n    clusterIPs: [{VIP}]\n    ports: [{{port: 80, targetPort: 8080}}]\n    backends: [{{address: 10.250.0.11}}, {{address: 10.250.0.12, state: terminating}}]\n  - name: dns\n    clusterIPs: [10.96.0.53]\n    ports: [{{port: 53, protocol: UDP}}]\n    backends: [{{address: 10.250.0.12}}]\n"
    ));
    let agent = w.start_agent();
    let table = agent.lbctl(&["service", "list"]);
    let expected = "\
ID   Frontend            Service Type   Backend
1    10.96.0.53:53/UDP   ClusterIP      1 => 10.250.0.12:53/UDP (active)
2    10.96.0.10:80/TCP   ClusterIP      1 => 10.250.0.11:8080/TCP (active)
                                        2 => 10.250.0.12:8080/TCP (terminating)
";
    assert_eq!(table, expected, "\n{table}");
    let json = agent.lbctl_json(&["service", "list"]);
    assert_eq!(json[1]["frontend"]["address"], VIP);
    assert_eq!(json[1]["type"], "ClusterIP");
    assert_eq!(json[1]["backends"].as_array().unwrap().len(), 2);
}

/// With host-namespace-only, the host's own sockets are translated by socket
/// LB, pods' sockets are left alone (a mesh sidecar must see the ClusterIP),
/// and the pods' connects still succeed: tc on their veths translates their
/// packets (see pod_packet_path.rs for the rest of that path).
#[test]
fn host_namespace_only_translates_host_sockets_and_pods_reach_services_through_the_packet_path() {
    use lb_testkit::pods::PodNode;
    let n = PodNode::new(&lb_testkit::unique("host_ns_only"), 2, true);
    let backend = n.ip_of(1);
    let _server = lb_testkit::servers::tcp(
        &n.pods[1].name,
        std::net::SocketAddr::from((backend, 8080)),
        "b1",
    );
    std::fs::write(
        &n.services,
        format!("services:\n  - name: web\n    clusterIPs: [{VIP}]\n    ports: [{{port: 80, targetPort: 8080}}]\n    backends: [{{address: {backend}, local: true}}]\n"),
    )
    .unwrap();
    // The agent runs in the node namespace, which thereby is the "host".
    let agent = Agent::start_in_netns(
        &n.node.name,
        &n.services,
        &n.cgroup.path,
        &n.pins.path,
        &["--socket-lb-host-namespace-only", "--pod-devices", "pv*"],
    );
    assert_eq!(
        agent.lbctl_json(&["config", "get"])["host-namespace-only"],
        "on"
    );
    let before =
        lb_testkit::cluster_counter(&n.pins.path, lb_common::config::CNT_SOCK_TRANSLATIONS);
    for a in lb_testkit::probe::run(&n.cgroup.path, &n.node.name, "tcp", &format!("{VIP}:80"), 3) {
        assert!(
            a.ok && a.backend() == Some("b1"),
            "host sockets are translated: {a:?}"
        );
    }
    let host = lb_testkit::cluster_counter(&n.pins.path, lb_common::config::CNT_SOCK_TRANSLATIONS);
    assert_eq!(host - before, 3, "by socket LB");
    // A pod keeps the service address on its socket (socket LB leaves it
    // alone) and reaches the backend all the same, through its veth.
    for a in lb_testkit::probe::run(
        &n.cgroup.path,
        &n.pods[0].name,
        "tcp",
        &format!("{VIP}:80"),
        3,
    ) {
        assert!(a.ok && a.backend() == Some("b1"), "{a:?}");
    }
    assert_eq!(
        lb_testkit::cluster_counter(&n.pins.path, lb_common::config::CNT_SOCK_TRANSLATIONS),
        host,
        "not by socket LB"
    );
    assert!(lb_testkit::cluster_counter(&n.pins.path, lb_common::config::CNT_NP_FORWARD) >= 3);
}

/// Localhost NodePorts (kube-proxy's iptables mode serves 127.0.0.1, Cilium's
/// socket LB serves 127.0.0.1 and ::1): a process of the node connecting to
/// 127.0.0.1:<nodePort> or [::1]:<nodePort> reaches the backend of that
/// family through the socket hook, and getpeername() shows the loopback
/// address and the NodePort. A pod's loopback stays its own: its own
/// listener on that port answers. With --nodeport-addresses holding no
/// loopback address the node's connects are left alone (refused: nothing
/// listens there), while the NodePort on the node's address serves in both
/// runs.
#[test]
fn localhost_nodeports_serve_the_nodes_sockets_in_both_families_and_leave_a_pods_own_loopback_alone(
) {
    use lb_testkit::{pods::PodNode, probe, servers};
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
    // Pods on a bridge, with an IPv6 address each beside the IPv4 one.
    let n = PodNode::new(&lb_testkit::unique("np_localhost"), 2, false);
    n.node
        .ip(&["-6", "addr", "add", "fd00:8::1/64", "dev", "cbr0", "nodad"]);
    let backend = n.ip_of(1);
    let backend6: Ipv6Addr = "fd00:8::12".parse().unwrap();
    n.pods[1].ip(&["-6", "addr", "add", "fd00:8::12/64", "dev", "eth0", "nodad"]);
    n.pods[1].ip(&["-6", "route", "add", "default", "via", "fd00:8::1"]);
    // A device whose addresses serve NodePorts (--devices).
    n.node.ip(&[
        "link", "add", "ext0", "type", "veth", "peer", "name", "ext0p",
    ]);
    n.node.ip(&["addr", "add", "192.0.2.1/24", "dev", "ext0"]);
    n.node.ip(&["link", "set", "ext0", "up"]);
    n.node.ip(&["link", "set", "ext0p", "up"]);
    let _server = servers::tcp(&n.pods[1].name, SocketAddr::from((backend, 8080)), "b1");
    let _server6 = servers::tcp(&n.pods[1].name, SocketAddr::from((backend6, 8080)), "b1v6");
    let _own = servers::tcp(
        &n.pods[0].name,
        SocketAddr::from((Ipv4Addr::LOCALHOST, 30080)),
        "own",
    );
    std::fs::write(
        &n.services,
        format!("services:\n  - name: web\n    type: NodePort\n    clusterIPs: [{VIP}, 'fd00:96::10']\n    ports: [{{port: 80, targetPort: 8080, nodePort: 30080}}]\n    backends: [{{address: {backend}, local: true}}, {{address: '{backend6}', local: true}}]\n"),
    )
    .unwrap();
    for (flags, localhost) in [
        (&[][..], true),
        (&["--nodeport-addresses", "192.0.2.0/24"][..], false),
    ] {
        let args = [&["--devices", "ext0"][..], flags].concat();
        let agent = Agent::start_in_netns(
            &n.node.name,
            &n.services,
            &n.cgroup.path,
            &n.pins.path,
            &args,
        );
        let listed = agent.lbctl_json(&["service", "list"]).to_string();
        for lo in ["\"127.0.0.1\"", "\"::1\""] {
            assert_eq!(
                listed.contains(lo),
                localhost,
                "{flags:?}: {lo} in lbctl service list: {listed}"
            );
        }
        for (target, name) in [("127.0.0.1:30080", "b1"), ("[::1]:30080", "b1v6")] {
            for a in probe::run(&n.cgroup.path, &n.node.name, "tcp", target, 3) {
                if localhost {
                    assert!(
                        a.ok && a.backend() == Some(name) && a.peer.as_deref() == Some(target),
                        "the node's {target} reaches the backend: {a:?}"
                    );
                } else {
                    assert!(
                        !a.ok,
                        "{flags:?}: {target} is not a NodePort address: {a:?}"
                    );
                }
            }
        }
        for a in probe::run(&n.cgroup.path, &n.pods[0].name, "tcp", "127.0.0.1:30080", 3) {
            assert!(
                a.ok && a.backend() == Some("own"),
                "{flags:?}: a pod's loopback is its own: {a:?}"
            );
        }
        for a in probe::run(&n.cgroup.path, &n.node.name, "tcp", "192.0.2.1:30080", 2) {
            assert!(a.ok && a.backend() == Some("b1"), "{flags:?}: {a:?}");
        }
        drop(agent);
    }
}

/// NodePorts follow the node's addresses while the agent runs: an address
/// added to a device serves the NodePort (the agent hears it through
/// rtnetlink), and once removed it no longer does. Each change is waited
/// for up to 5 s (the issue asks for a second; the time taken is printed,
/// not asserted).
#[test]
fn an_address_added_at_run_time_serves_nodeports_and_a_removed_one_stops() {
    use lb_testkit::{pods::PodNode, probe, servers};
    use std::net::SocketAddr;
    let n = PodNode::new(&lb_testkit::unique("np_follow"), 2, true);
    n.node.ip(&[
        "link", "add", "ext0", "type", "veth", "peer", "name", "ext0p",
    ]);
    n.node.ip(&["addr", "add", "192.0.2.1/24", "dev", "ext0"]);
    n.node.ip(&["link", "set", "ext0", "up"]);
    n.node.ip(&["link", "set", "ext0p", "up"]);
    let backend = n.ip_of(1);
    let _server = servers::tcp(&n.pods[1].name, SocketAddr::from((backend, 8080)), "b1");
    std::fs::write(
        &n.services,
        format!("services:\n  - name: web\n    type: NodePort\n    clusterIPs: [{VIP}]\n    ports: [{{port: 80, targetPort: 8080, nodePort: 30080}}]\n    backends: [{{address: {backend}, local: true}}]\n"),
    )
    .unwrap();
    let agent = Agent::start_in_netns(
        &n.node.name,
        &n.services,
        &n.cgroup.path,
        &n.pins.path,
        &["--devices", "ext0"],
    );
    let listed = |addr: &str| {
        agent
            .lbctl_json(&["service", "list"])
            .to_string()
            .contains(&format!("\"{addr}\""))
    };
    let reach = |target: &str| probe::run(&n.cgroup.path, &n.node.name, "tcp", target, 2);
    assert!(listed("192.0.2.1") && !listed("192.0.2.7"));
    n.node.ip(&["addr", "add", "192.0.2.7/24", "dev", "ext0"]);
    let t = std::time::Instant::now();
    assert!(
        lb_testkit::wait_until(Duration::from_secs(5), || listed("192.0.2.7")),
        "the added address never served the NodePort"
    );
    eprintln!("added: NodePort on 192.0.2.7 after {:?}", t.elapsed());
    for a in reach("192.0.2.7:30080") {
        assert!(a.ok && a.backend() == Some("b1"), "added address: {a:?}");
    }
    n.node.ip(&["addr", "del", "192.0.2.7/24", "dev", "ext0"]);
    let t = std::time::Instant::now();
    assert!(
        lb_testkit::wait_until(Duration::from_secs(5), || !listed("192.0.2.7")),
        "the removed address kept the NodePort"
    );
    eprintln!("removed: NodePort off 192.0.2.7 after {:?}", t.elapsed());
    assert!(listed("192.0.2.1"), "the other address keeps it");
    for a in reach("192.0.2.1:30080") {
        assert!(a.ok && a.backend() == Some("b1"), "{a:?}");
    }
}
