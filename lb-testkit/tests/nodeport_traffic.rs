//! The north-south path under real traffic, in the two-node namespace
//! cluster with GRO on the node devices (as a real NIC has it): bulk TCP
//! both ways with every byte checked, a 32 MiB download, 20 000 sequential
//! short connections to one remote backend (four times the SNAT port range),
//! DNS over UDP, for SNAT, DSR and hybrid, on tc and with XDP.
use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use lb_testkit::{
    cluster::{
        Cluster, Node, Options, CLIENT, CLIENT6, NODE_A, NODE_A6, POD_A, POD_A6, POD_B, POD_B6,
    },
    servers, traffic, unique,
};

/// The addresses one family's run uses.
struct IpFamily {
    label: &'static str,
    node_a: IpAddr,
    client: IpAddr,
    pod_a: IpAddr,
    pods_b: [IpAddr; 3],
    /// ClusterIPs of the services of `services_of`, in order.
    cluster_ips: [&'static str; 5],
    /// The DNS LoadBalancer address.
    lb: &'static str,
}

const V4: IpFamily = IpFamily {
    label: "IPv4",
    node_a: IpAddr::V4(NODE_A),
    client: IpAddr::V4(CLIENT),
    pod_a: IpAddr::V4(POD_A),
    pods_b: [
        IpAddr::V4(POD_B[0]),
        IpAddr::V4(POD_B[1]),
        IpAddr::V4(POD_B[2]),
    ],
    cluster_ips: [
        "10.96.0.2",
        "10.96.0.3",
        "10.96.0.4",
        "10.96.0.5",
        "10.96.0.53",
    ],
    lb: "203.0.113.40",
};

/// The same on IPv6: clusterIPs of the service CIDR fd00:96::/112, the
/// pods' IPv6 addresses as backends.
const V6: IpFamily = IpFamily {
    label: "IPv6",
    node_a: IpAddr::V6(NODE_A6),
    client: IpAddr::V6(CLIENT6),
    pod_a: IpAddr::V6(POD_A6),
    pods_b: [
        IpAddr::V6(POD_B6[0]),
        IpAddr::V6(POD_B6[1]),
        IpAddr::V6(POD_B6[2]),
    ],
    cluster_ips: [
        "fd00:96::2",
        "fd00:96::3",
        "fd00:96::4",
        "fd00:96::5",
        "fd00:96::53",
    ],
    lb: "2001:db8:40::53",
};

/// The same services on every node; `node` decides which backends are local.
pub fn services(node: char) -> String {
    services_of(node, &V4)
}

fn services_of(node: char, f: &IpFamily) -> String {
    let b = |ip: IpAddr| {
        let local = (node == 'a' && ip == f.pod_a) || (node == 'b' && f.pods_b.contains(&ip));
        format!("{{address: \"{ip}\", local: {local}}}")
    };
    let [names, bulk, bulk_local, closed, dns] = f.cluster_ips;
    format!(
        r#"
services:
  - name: names
    type: NodePort
    clusterIPs: ["{names}"]
    ports: [{{port: 80, targetPort: 8080, nodePort: 30081}}]
    backends: [{pb0}]
  - name: bulk
    type: NodePort
    clusterIPs: ["{bulk}"]
    ports: [{{port: 80, targetPort: 9000, nodePort: 30090}}]
    backends: [{pb0}]
  - name: bulk-local
    type: NodePort
    clusterIPs: ["{bulk_local}"]
    ports: [{{port: 80, targetPort: 9000, nodePort: 30091}}]
    backends: [{pa}]
  - name: closed
    type: NodePort
    clusterIPs: ["{closed}"]
    ports: [{{port: 99, protocol: UDP, targetPort: 5999, nodePort: 30095}}]
    backends: [{pb0}]
  - name: dns
    type: LoadBalancer
    algorithm: maglev
    clusterIPs: ["{dns}"]
    loadBalancerIPs: ["{lb}"]
    # The client's host only (with another network): the range check on
    # node A and, with DSR, on node B (the learned option) meet real flows.
    loadBalancerSourceRanges: ["{client}/{host_bits}", "{other}"]
    ports: [{{port: 53, protocol: UDP, targetPort: 5353}}]
    backends: [{pb0}, {pb1}, {pb2}]
"#,
        pb0 = b(f.pods_b[0]),
        pb1 = b(f.pods_b[1]),
        pb2 = b(f.pods_b[2]),
        pa = b(f.pod_a),
        lb = f.lb,
        client = f.client,
        host_bits = if f.client.is_ipv4() { 32 } else { 128 },
        other = if f.client.is_ipv4() {
            "10.123.0.0/16"
        } else {
            "fd00:123::/64"
        },
    )
}

pub struct Backends {
    _servers: Vec<servers::Server>,
}

pub fn backends(c: &Cluster) -> Backends {
    backends_of(c, &V4)
}

fn backends_of(c: &Cluster, f: &IpFamily) -> Backends {
    let mut s = vec![
        servers::tcp(&c.pod_b.name, SocketAddr::from((f.pods_b[0], 8080)), "b0"),
        traffic::bulk_server(&c.pod_b.name, SocketAddr::from((f.pods_b[0], 9000))),
        traffic::bulk_server(&c.pod_a.name, SocketAddr::from((f.pod_a, 9000))),
    ];
    for (i, ip) in f.pods_b.iter().enumerate() {
        s.push(servers::udp(
            &c.pod_b.name,
            SocketAddr::from((*ip, 5353)),
            &format!("b{i}"),
        ));
    }
    Backends { _servers: s }
}

fn drops(node: &Node) -> String {
    node.agent.as_ref().unwrap().lbctl(&["drops"])
}

fn report(what: &str, c: &Cluster) -> String {
    format!(
        "{what}\nnode A drops:\n{}\nnode B drops:\n{}\nnode A log:\n{}",
        drops(&c.a),
        drops(&c.b),
        c.a.agent.as_ref().unwrap().log_text()
    )
}

/// Bulk both ways for 2 s to `port` on node A, every byte checked.
fn bulk_both_ways(c: &Cluster, port: u16, label: &str) {
    bulk_both_ways_to(c, IpAddr::V4(NODE_A), port, label);
}

fn bulk_both_ways_to(c: &Cluster, node: IpAddr, port: u16, label: &str) {
    let target = SocketAddr::from((node, port));
    let (up, down) = traffic::both_ways(&c.client.name, target, 2000);
    let up = up.unwrap_or_else(|e| panic!("{}: {e}", report(&format!("{label}: upload"), c)));
    let down = down.unwrap_or_else(|e| panic!("{}: {e}", report(&format!("{label}: download"), c)));
    eprintln!(
        "{label} :{port}: up {:.0} Mbit/s, down {:.0} Mbit/s",
        up.mbit_per_s(),
        down.mbit_per_s()
    );
    // Not a speed limit: a transfer that makes no progress is a failure.
    for (dir, t) in [("upload", &up), ("download", &down)] {
        assert!(
            t.bytes >= 1 << 20 && t.elapsed >= Duration::from_secs(2),
            "{label}: the {dir} moved {} bytes in {:?}",
            t.bytes,
            t.elapsed
        );
    }
}

/// The client's ephemeral ports become 40000-44999, the SNAT range the
/// tests that use it give the agents: each SNAT flow keeps its client's port.
fn client_ports_in_snat_range(c: &Cluster) {
    lb_testkit::run(
        "ip",
        &[
            "netns",
            "exec",
            &c.client.name,
            "sysctl",
            "-qw",
            "net.ipv4.ip_local_port_range=40000 44999",
        ],
    );
}

/// A TCP connect from the client to `target`, given 2 s.
fn connect_within_2s(c: &Cluster, target: SocketAddr) -> std::io::Result<()> {
    traffic::in_netns(&c.client.name, move || {
        std::net::TcpStream::connect_timeout(&target, Duration::from_secs(2)).map(|_| ())
    })
}

fn start_nodes(c: &mut Cluster, args: &[&str]) {
    Cluster::start(&mut c.a, &services('a'), args);
    Cluster::start(&mut c.b, &services('b'), args);
}

/// Through node A, for one family: who the backend sees, bulk both ways to
/// a remote and a local backend, a 32 MiB download, 20 000 short
/// connections (SNAT ports reused four times over) and DNS over UDP to a
/// Maglev LoadBalancer, with GRO on; the flows went through the programs,
/// and lbctl shows them.
fn real_traffic(tag: &str, mode: &str, xdp: bool, f: &IpFamily) {
    real_traffic_on(tag, mode, xdp, f, &[], false);
}

/// `real_traffic` with more agent flags, on a segment that drops IP
/// options and extension headers when `strict_fabric`.
fn real_traffic_on(
    tag: &str,
    mode: &str,
    xdp: bool,
    f: &IpFamily,
    more_args: &[&str],
    strict_fabric: bool,
) {
    let opts = Options {
        gro: true,
        full_checksums: xdp,
        xdp_ready: xdp,
        drop_ip_options: strict_fabric,
        ..Default::default()
    };
    let mut c = Cluster::with(&unique(tag), &opts);
    let _b = backends_of(&c, f);
    let mut args = vec!["--lb-mode", mode];
    args.extend(more_args);
    if xdp {
        args.extend(["--acceleration", "native"]);
    }
    Cluster::start(&mut c.a, &services_of('a', f), &args);
    Cluster::start(&mut c.b, &services_of('b', f), &args);
    let client = c.client.name.clone();
    let label = format!("{}, {mode}, xdp {xdp}", f.label);
    let report = |what: &str, c: &Cluster| report(&format!("{what} ({label})"), c);
    let node = f.node_a;

    // Who the backend sees: node A's address with SNAT, the client's with
    // DSR (hybrid: DSR for TCP). The answer is "name address:port".
    let answer = traffic::in_netns(&client, move || {
        use std::io::Read as _;
        let mut s = std::net::TcpStream::connect((node, 30081)).expect("connect");
        let mut a = String::new();
        s.read_to_string(&mut a).expect("answer");
        a
    });
    let seen = if mode == "snat" { f.node_a } else { f.client };
    let peer: Option<SocketAddr> = answer
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok());
    assert_eq!(
        peer.map(|p| p.ip()),
        Some(seen),
        "{label}: the backend saw {answer:?}"
    );

    // Bulk both ways for 2 s, every byte checked, remote and local backend.
    bulk_both_ways_to(&c, node, 30090, &label);
    bulk_both_ways_to(&c, node, 30091, &label);
    // 32 MiB, byte for byte.
    let big = traffic::download(
        &client,
        SocketAddr::from((node, 30090)),
        7,
        Some(32 << 20),
        None,
    )
    .unwrap_or_else(|e| panic!("{}: {e}", report("32 MiB download", &c)));
    assert_eq!(big.bytes, 32 << 20);

    // 20 000 sequential short connections to the one remote backend.
    let churn = traffic::churn(&client, SocketAddr::from((node, 30081)), 20_000);
    eprintln!("{label}: {} connections in {:.1?}", churn.ok, churn.elapsed);
    assert_eq!(
        churn.failed,
        0,
        "{:?}\n{}",
        churn.errors,
        report("churn", &c)
    );
    assert_eq!(churn.backends.get("b0"), Some(&20_000));

    // DNS over UDP through the LoadBalancer address.
    let dns = SocketAddr::from((f.lb.parse::<IpAddr>().unwrap(), 53));
    let answers = traffic::udp_from_one_socket(&client, dns, 20);
    assert!(
        answers.iter().all(Option::is_some),
        "{answers:?}\n{}",
        report("dns", &c)
    );
    // The DNS LoadBalancer's source ranges admitted the client on node A
    // and, with DSR, on node B, which learned each datagram's option.
    for n in [&c.a, &c.b] {
        let drops = n.agent.as_ref().unwrap().drops("source-range");
        assert_eq!(
            drops,
            0,
            "{label}: source-range drops\n{}",
            report("dns", &c)
        );
    }
    if mode == "dsr" {
        let learned = Cluster::counter(&c.b, lb_common::config::CNT_DSR_LEARNED);
        assert!(
            learned >= 20,
            "{label}: node B learned {learned} DSR options"
        );
    }
    // The flows went through the programs, not around them (with XDP:
    // what XDP cannot do, tc did, counted the same).
    let fwd = Cluster::counter(&c.a, lb_common::config::CNT_NP_FORWARD);
    assert!(fwd > 20_000, "forwarded {fwd}");
    let agent = c.a.agent.as_ref().unwrap();
    let ct = agent.lbctl(&["ct", "list"]);
    let client_ep = SocketAddr::from((f.client, 0)).to_string();
    assert!(
        ct.contains(client_ep.trim_end_matches('0')),
        "lbctl ct list shows the flows:\n{ct}"
    );
    let list = agent.lbctl(&["service", "list"]);
    assert!(
        list.contains(&format!("{}/TCP", SocketAddr::from((node, 30090))))
            && list.contains(&format!("{dns}/UDP")),
        "lbctl service list shows the NodePort and LoadBalancer frontends:\n{list}"
    );
    if strict_fabric {
        assert_eq!(c.fabric_drops(), 0, "{label}: the fabric dropped packets");
    }
}

/// DSR through a fabric that drops IPv4 options and IPv6 extension headers
/// (an nftables rule on the segment), with the IPIP / IP6IP6 dispatch: the
/// whole real-traffic run passes (bulk, a 32 MiB download, 20 000
/// connections, DNS over UDP, every DSR request learned on node B) and the
/// fabric drops nothing. The option dispatch on the same fabric fails
/// (`dsr_with_the_option_fails_where_the_fabric_drops_ip_options`).
#[test]
fn dsr_ipip_carries_bulk_a_download_20000_connections_and_dns_where_the_fabric_drops_ip_options() {
    real_traffic_on(
        "dsripip4",
        "dsr",
        false,
        &V4,
        &["--dsr-dispatch", "ipip"],
        true,
    );
}

#[test]
fn ipv6_dsr_ip6ip6_carries_bulk_a_download_20000_connections_and_dns_where_the_fabric_drops_extension_headers(
) {
    real_traffic_on(
        "dsripip6",
        "dsr",
        false,
        &V6,
        &["--dsr-dispatch", "ipip"],
        true,
    );
}

/// DSR's IPIP dispatch counts its outer header in the path MTU: on a
/// narrower path (node A's route to node B's pods, 1400) a UDP datagram of
/// 1 380 bytes would fit with the option (1 388) but not with the outer
/// header too (1 408). Node A answers "fragmentation needed" naming
/// 1400 − 8 − 20 = 1 372, the client's kernel takes it (IP_MTU), and a
/// datagram of that size is answered through the LoadBalancer. (On a
/// segment that drops IP options: node A's errors carry a 4-byte NOP
/// option, `icmp::reply`'s answer to checksum offload, and such a segment
/// drops them too.)
#[test]
fn dsr_ipip_counts_its_outer_header_in_the_path_mtu() {
    use std::os::fd::AsRawFd as _;
    let opts = Options {
        route_mtu: Some(1400),
        ..Default::default()
    };
    let mut c = Cluster::with(&unique("ipipmtu"), &opts);
    let _b = backends_of(&c, &V4);
    let args = ["--lb-mode", "dsr", "--dsr-dispatch", "ipip"];
    Cluster::start(&mut c.a, &services_of('a', &V4), &args);
    Cluster::start(&mut c.b, &services_of('b', &V4), &args);
    let dns = SocketAddr::from(([203, 0, 113, 40], 53));
    let (mtu, answer) = traffic::in_netns(&c.client.name, move || {
        let s = std::net::UdpSocket::bind("0.0.0.0:0").expect("bind");
        let fd = s.as_raw_fd();
        let opt = |name: i32, value: i32| {
            // SAFETY: a socket option of an int, on a socket we own.
            unsafe {
                libc::setsockopt(fd, libc::IPPROTO_IP, name, (&value as *const i32).cast(), 4)
            }
        };
        assert_eq!(opt(libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO), 0);
        s.connect(dns).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let _ = s.send(&[b'q'; 1380 - 28]);
        std::thread::sleep(Duration::from_millis(300));
        let mut mtu = 0i32;
        let mut len = 4u32;
        // SAFETY: reads an int into `mtu`, on a socket we own.
        unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_IP,
                libc::IP_MTU,
                (&mut mtu as *mut i32).cast(),
                &mut len,
            )
        };
        // The error is also reported once on the connected socket (a
        // pending EMSGSIZE); the send after it goes.
        let _ = s.take_error();
        let mut buf = [0u8; 512];
        let answer = s
            .send(&[b'q'; 1372 - 28])
            .and_then(|_| s.recv(&mut buf))
            .map(|n| String::from_utf8_lossy(&buf[..n]).into_owned());
        (mtu, answer)
    });
    let sent = Cluster::counter(&c.a, lb_common::config::CNT_ICMP_SENT);
    assert_eq!(
        mtu, 1372,
        "the path MTU the client learned (node A sent {sent} errors)"
    );
    assert!(
        answer.as_ref().is_ok_and(|a| a.starts_with('b')),
        "a datagram within it: {answer:?}\n{}",
        report("ipip pmtu", &c)
    );
}

/// A service's own forwarding mode (`forwardingMode`, the services-file
/// form of the `lb.dev/forwarding-mode` annotation) over the agent's
/// `--lb-mode`: with DSR on the agents, a service that asks for SNAT has
/// its backend see node A, beside a service that keeps DSR (the client);
/// with SNAT on the agents, a service that asks for DSR has its backend
/// see the client. 2 000 connections through the one that differs.
#[test]
fn a_services_forwarding_mode_overrides_the_agents_lb_mode() {
    let node_a = IpAddr::V4(NODE_A);
    let client = IpAddr::V4(CLIENT);
    for (agent_mode, asked, seen_asked, seen_plain) in [
        ("dsr", "snat", node_a, client),
        ("snat", "dsr", client, node_a),
    ] {
        let mut c = Cluster::with(&unique(&format!("fwd{agent_mode}")), &Options::default());
        let _b = backends_of(&c, &V4);
        let services = |node: char| {
            let local = node == 'b';
            format!(
                r#"
services:
  - name: asked
    type: NodePort
    clusterIPs: ["10.96.0.2"]
    forwardingMode: {asked}
    ports: [{{port: 80, targetPort: 8080, nodePort: 30081}}]
    backends: [{{address: "{b}", local: {local}}}]
  - name: plain
    type: NodePort
    clusterIPs: ["10.96.0.3"]
    ports: [{{port: 80, targetPort: 8080, nodePort: 30082}}]
    backends: [{{address: "{b}", local: {local}}}]
"#,
                b = POD_B[0]
            )
        };
        let args = ["--lb-mode", agent_mode];
        Cluster::start(&mut c.a, &services('a'), &args);
        Cluster::start(&mut c.b, &services('b'), &args);
        for (port, want) in [(30081, seen_asked), (30082, seen_plain)] {
            let target = SocketAddr::new(node_a, port);
            let answer = traffic::in_netns(&c.client.name, move || traffic::ask(target))
                .unwrap_or_else(|e| panic!("{agent_mode}: :{port}: {e}\n{}", report("fwd", &c)));
            let peer: Option<SocketAddr> = answer
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.parse().ok());
            assert_eq!(
                peer.map(|p| p.ip()),
                Some(want),
                "--lb-mode {agent_mode}, :{port} ({answer:?})"
            );
        }
        let churn = traffic::churn(&c.client.name, SocketAddr::new(node_a, 30081), 2_000);
        assert_eq!(
            churn.failed,
            0,
            "{agent_mode}: {:?}\n{}",
            churn.errors,
            report("fwd", &c)
        );
    }
}

/// The control for the two above: on the same fabric, DSR with the option
/// gets no connection through (the SYN carries the option and is dropped
/// on the segment, counted there), in both families.
#[test]
fn dsr_with_the_option_fails_where_the_fabric_drops_ip_options() {
    for f in [&V4, &V6] {
        let opts = Options {
            drop_ip_options: true,
            ..Default::default()
        };
        let tag = format!("dsropt{}", f.label.replace("IPv", ""));
        let mut c = Cluster::with(&unique(&tag), &opts);
        let _b = backends_of(&c, f);
        let args = ["--lb-mode", "dsr"];
        Cluster::start(&mut c.a, &services_of('a', f), &args);
        Cluster::start(&mut c.b, &services_of('b', f), &args);
        let target = SocketAddr::new(f.node_a, 30081);
        let r = connect_within_2s(&c, target);
        assert!(
            r.is_err(),
            "{}: connected through the strict fabric",
            f.label
        );
        assert!(
            c.fabric_drops() >= 1,
            "{}: the fabric dropped nothing",
            f.label
        );
    }
}

/// A node takes an outer header off only when it runs the IPIP dispatch
/// itself (the outer header hides the inner source from the fabric): with
/// node A sending IPIP and node B on the option dispatch, no connection
/// gets through, in both families.
#[test]
fn a_node_without_the_ipip_dispatch_takes_no_outer_header_off() {
    for f in [&V4, &V6] {
        let tag = format!("noipip{}", f.label.replace("IPv", ""));
        let mut c = Cluster::with(&unique(&tag), &Options::default());
        let _b = backends_of(&c, f);
        Cluster::start(
            &mut c.a,
            &services_of('a', f),
            &["--lb-mode", "dsr", "--dsr-dispatch", "ipip"],
        );
        Cluster::start(&mut c.b, &services_of('b', f), &["--lb-mode", "dsr"]);
        let target = SocketAddr::new(f.node_a, 30081);
        let r = connect_within_2s(&c, target);
        assert!(r.is_err(), "{}: node B took the outer header off", f.label);
        let learned = Cluster::counter(&c.b, lb_common::config::CNT_DSR_LEARNED);
        assert_eq!(learned, 0, "{}: node B learned a DSR request", f.label);
    }
}

#[test]
fn ipv6_snat_carries_bulk_tcp_a_32_mib_download_and_20000_connections_with_gro() {
    real_traffic("t6snat", "snat", false, &V6);
}

#[test]
fn ipv6_with_xdp_carries_bulk_tcp_a_32_mib_download_and_20000_connections() {
    real_traffic("t6xdp", "snat", true, &V6);
}

/// DSR over IPv6: the frontend in a Destination Options header, the
/// client's address at the backend, replies straight from node B.
#[test]
fn ipv6_dsr_carries_bulk_tcp_a_32_mib_download_and_20000_connections_with_gro() {
    real_traffic("t6dsr", "dsr", false, &V6);
}

#[test]
fn ipv6_dsr_with_xdp_carries_bulk_tcp_a_32_mib_download_and_20000_connections() {
    real_traffic("t6dsrx", "dsr", true, &V6);
}

#[test]
fn ipv6_hybrid_carries_bulk_tcp_a_32_mib_download_and_20000_connections_with_gro() {
    real_traffic("t6hyb", "hybrid", false, &V6);
}

#[test]
fn snat_carries_bulk_tcp_a_32_mib_download_and_20000_connections_with_gro() {
    real_traffic("snat_tc", "snat", false, &V4);
}

#[test]
fn dsr_carries_bulk_tcp_a_32_mib_download_and_20000_connections_with_gro() {
    real_traffic("dsr_tc", "dsr", false, &V4);
}

#[test]
fn hybrid_carries_bulk_tcp_a_32_mib_download_and_20000_connections_with_gro() {
    real_traffic("hybrid_tc", "hybrid", false, &V4);
}

#[test]
fn snat_with_xdp_carries_bulk_tcp_a_32_mib_download_and_20000_connections() {
    real_traffic("snat_xdp", "snat", true, &V4);
}

#[test]
fn dsr_with_xdp_carries_bulk_tcp_a_32_mib_download_and_20000_connections() {
    real_traffic("dsr_xdp", "dsr", true, &V4);
}

#[test]
fn hybrid_with_xdp_carries_bulk_tcp_a_32_mib_download_and_20000_connections() {
    real_traffic("hybrid_xdp", "hybrid", true, &V4);
}

/// 20 000 connections through a SNAT range of 5 000 ports: every port is
/// reused four times while the backend still holds TIME_WAIT on it. The
/// client's ports lie in the range, so each client tuple keeps its SNAT
/// tuple and the backend accepts the reuse (same timestamps clock).
#[test]
fn twenty_thousand_connections_reuse_a_five_thousand_port_snat_range_without_failures() {
    let mut c = Cluster::with(
        &unique("snat_reuse4x"),
        &Options {
            gro: true,
            ..Default::default()
        },
    );
    let _b = backends(&c);
    client_ports_in_snat_range(&c);
    start_nodes(&mut c, &["--snat-port-range", "40000-44999"]);
    let churn = traffic::churn(&c.client.name, SocketAddr::from((NODE_A, 30081)), 20_000);
    eprintln!("{} connections in {:.1?}", churn.ok, churn.elapsed);
    assert_eq!(
        churn.failed,
        0,
        "{:?}\n{}",
        churn.errors,
        report("churn", &c)
    );
}

/// Host processes on node A connect straight to the backend that 20 000
/// NodePort connections reach through SNAT, from ports of the SNAT range
/// (every other one bound by hand to a port the SNAT flows are using, the
/// others the node's ephemeral ports, which overlap the range), while those
/// connections run and for 3 s after. A host tuple that a SNAT flow holds is moved to
/// another port on its way out (`host_port_clashes`), so no connection on
/// either side fails. Both families on tc, and IPv4 with XDP (which leaves
/// a moved connection's replies to tc: given their port back in XDP, they
/// would meet the clashing SNAT flow's entry in tc).
#[test]
fn host_connections_from_snat_range_ports_beside_20000_snat_connections_never_share_a_tuple() {
    for (f, xdp) in [(&V4, false), (&V6, false), (&V4, true)] {
        host_connections_beside_snat(f, xdp);
    }
}

fn host_connections_beside_snat(f: &IpFamily, xdp: bool) {
    use std::sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    };
    let tag = format!(
        "hostclash{}{}",
        f.label.replace("IPv", ""),
        if xdp { "x" } else { "" }
    );
    let mut c = Cluster::with(
        &unique(&tag),
        &Options {
            gro: true,
            full_checksums: xdp,
            xdp_ready: xdp,
            ..Default::default()
        },
    );
    let _b = backends_of(&c, f);
    // The client's ports are the SNAT range: each SNAT flow keeps its
    // client's port, so the SNAT flows walk the whole range.
    client_ports_in_snat_range(&c);
    let mut args = vec!["--snat-port-range", "40000-44999"];
    if xdp {
        args.extend(["--acceleration", "native"]);
    }
    Cluster::start(&mut c.a, &services_of('a', f), &args);
    Cluster::start(&mut c.b, &services_of('b', f), &args);
    let done = Arc::new(AtomicBool::new(false));
    let host = {
        let done = done.clone();
        let backend = SocketAddr::from((f.pods_b[0], 8080));
        let ns = c.a.ns.name.clone();
        std::thread::spawn(move || {
            lb_testkit::netns::enter(&ns).expect("entering node A's namespace");
            host_connects(backend, &done)
        })
    };
    let churn = traffic::churn(&c.client.name, SocketAddr::from((f.node_a, 30081)), 20_000);
    // And for 3 s more, while the SNAT flows' entries still live (closing,
    // 10 s): without the clash handling, these are the host connections
    // that hang (during the churn, the client's next flows mostly heal
    // the tuples by chance).
    std::thread::sleep(Duration::from_secs(3));
    done.store(true, Ordering::Relaxed);
    let host = host.join().expect("host connections");
    let clashes = Cluster::counter(&c.a, lb_common::config::CNT_HOST_PORT_CLASHES);
    eprintln!(
        "{}, xdp {xdp}: {} SNAT connections in {:.1?}; host: {} connected ({} from a bound port), {} failed, {} ports busy; {clashes} clashes moved",
        f.label, churn.ok, churn.elapsed, host.ok, host.bound, host.failed, host.busy
    );
    let label = format!("{}, xdp {xdp}", f.label);
    assert_eq!(
        churn.failed,
        0,
        "{label}: SNAT side {:?}\n{}",
        churn.errors,
        report("host clash", &c)
    );
    assert_eq!(
        host.failed,
        0,
        "{label}: host side {:?}\n{}",
        host.errors,
        report("host clash", &c)
    );
    assert!(
        host.bound >= 200,
        "{label}: too few host connections: {host:?}"
    );
    // The clash really happened (else this test proves nothing).
    assert!(clashes >= 1, "{label}: no host connection clashed");
}

#[derive(Debug, Default)]
struct HostConnects {
    ok: usize,
    bound: usize,
    failed: usize,
    busy: usize,
    errors: Vec<String>,
}

/// Connections from the current namespace to `backend` until `done`:
/// every other one from a port of 40000-44999 bound by hand (walking the
/// range), the others from an ephemeral port. Each must connect within 3 s
/// and read the backend's answer to its end.
fn host_connects(backend: SocketAddr, done: &std::sync::atomic::AtomicBool) -> HostConnects {
    use std::io::Read as _;
    let mut h = HostConnects::default();
    let mut port = 40_000u16;
    let mut i = 0usize;
    while !done.load(std::sync::atomic::Ordering::Relaxed) {
        // About 200 connections a second: a busy node-local process, not
        // a flood (every one of them may take a port from the range).
        std::thread::sleep(Duration::from_millis(5));
        i += 1;
        let s = socket2::Socket::new(
            socket2::Domain::for_address(backend),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )
        .expect("socket");
        let by_hand = i.is_multiple_of(2);
        if by_hand {
            // Even ports: Linux's connect() takes ports of the low end's
            // parity first (inet_hash_connect), so the client's, and with
            // them the SNAT flows', are even.
            port = if port >= 44_980 {
                40_000 + (port + 2) % 14
            } else {
                port + 14
            };
            let _ = s.set_reuse_address(true);
            let local = SocketAddr::new(
                match backend {
                    SocketAddr::V4(_) => IpAddr::from([0u8; 4]),
                    SocketAddr::V6(_) => IpAddr::from([0u16; 8]),
                },
                port,
            );
            if s.bind(&local.into()).is_err() {
                h.busy += 1;
                continue;
            }
        }
        let answer = s
            .connect_timeout(&backend.into(), Duration::from_secs(3))
            .and_then(|()| {
                let mut s: std::net::TcpStream = s.into();
                s.set_read_timeout(Some(Duration::from_secs(3)))?;
                let mut a = String::new();
                s.read_to_string(&mut a)?;
                Ok(a)
            });
        match answer {
            Ok(a) if a.starts_with("b0") => {
                h.ok += 1;
                h.bound += usize::from(by_hand);
            }
            other => {
                h.failed += 1;
                if h.errors.len() < 5 {
                    h.errors
                        .push(format!("#{i} (port {port}, by hand {by_hand}): {other:?}"));
                }
            }
        }
    }
    h
}

/// A path MTU below the client's: node A's own route to node B's pods is
/// narrower (1400). Node A answers "fragmentation needed" (GSO-aware: the
/// client's segments arrive merged by GRO), the client shrinks its packets
/// and the bulk transfer completes, byte for byte, in every mode.
#[test]
fn a_narrower_path_from_node_a_gets_frag_needed_and_bulk_still_completes() {
    for mode in ["snat", "dsr"] {
        let opts = Options {
            gro: true,
            route_mtu: Some(1400),
            ..Default::default()
        };
        let mut c = Cluster::with(&unique(&format!("pmtu_{mode}")), &opts);
        let _b = backends(&c);
        start_nodes(&mut c, &["--lb-mode", mode]);
        bulk_both_ways(&c, 30090, &format!("{mode}, path MTU 1400"));
        let sent = Cluster::counter(&c.a, lb_common::config::CNT_ICMP_SENT);
        assert!(
            sent >= 1,
            "{mode}: node A sent no frag-needed\n{}",
            report("pmtu", &c)
        );
    }
}

/// IPv6: node A's own route to node B's pods is 1400 bytes; GRO'd packets
/// that no longer fit get "packet too big" from node A (RFC 8201: IPv6 has
/// no fragmentation on the way), and the bulk transfer completes. The
/// merged packets ask for a checksum offload (CHECKSUM_PARTIAL), so this
/// is also the error's offload-proof form at work (see `icmp6.rs`).
#[test]
fn ipv6_a_narrower_path_from_node_a_gets_packet_too_big_and_bulk_still_completes() {
    let opts = Options {
        gro: true,
        route_mtu: Some(1400),
        ..Default::default()
    };
    let mut c = Cluster::with(&unique("pmtu6"), &opts);
    // Node A sums what it sends itself (no tx offload on its device): the
    // checksum of an error answering a merged packet is then written where
    // the offload writes, and the client checks it: a form that let that
    // write land in the ICMPv6 message would fail path MTU discovery here.
    lb_testkit::cluster::ethtool(&c.a.ns, "eth0", "tx", false);
    let _s = traffic::bulk_server(&c.pod_b.name, SocketAddr::from((POD_B6[0], 9000)));
    Cluster::start(&mut c.a, &services_of('a', &V6), &[]);
    Cluster::start(&mut c.b, &services_of('b', &V6), &[]);
    bulk_both_ways_to(&c, IpAddr::V6(NODE_A6), 30090, "IPv6, path MTU 1400");
    let sent = Cluster::counter(&c.a, lb_common::config::CNT_ICMP_SENT);
    assert!(
        sent >= 1,
        "node A sent no packet too big\n{}",
        report("pmtu6", &c)
    );
}

/// A router between the nodes with a 1400-byte link: it tells our SNAT
/// address "fragmentation needed"; node A translates the error for the
/// client (RFC 5508), and the transfer completes.
#[test]
fn a_routers_frag_needed_reaches_the_client_through_snat_and_bulk_completes() {
    let opts = Options {
        gro: true,
        router_mtu: Some(1400),
        ..Default::default()
    };
    let mut c = Cluster::with(&unique("pmtu_router"), &opts);
    let _b = backends(&c);
    start_nodes(&mut c, &[]);
    bulk_both_ways(&c, 30090, "snat via a 1400-byte router");
    let translated = Cluster::counter(&c.a, lb_common::config::CNT_ICMP_TRANSLATED);
    assert!(
        translated >= 1,
        "no error translated\n{}",
        report("router pmtu", &c)
    );
}

/// IPv6 through the same 1400-byte router: its "packet too big" for the
/// SNAT address is translated for the client (RFC 5508), which shrinks its
/// packets, and the transfer completes.
#[test]
fn ipv6_a_routers_packet_too_big_reaches_the_client_through_snat_and_bulk_completes() {
    let opts = Options {
        gro: true,
        router_mtu: Some(1400),
        ..Default::default()
    };
    let mut c = Cluster::with(&unique("pmtu6_router"), &opts);
    let _s = traffic::bulk_server(&c.pod_b.name, SocketAddr::from((POD_B6[0], 9000)));
    Cluster::start(&mut c.a, &services_of('a', &V6), &[]);
    Cluster::start(&mut c.b, &services_of('b', &V6), &[]);
    bulk_both_ways_to(
        &c,
        IpAddr::V6(NODE_A6),
        30090,
        "IPv6 via a 1400-byte router",
    );
    let translated = Cluster::counter(&c.a, lb_common::config::CNT_ICMP_TRANSLATED);
    assert!(
        translated >= 1,
        "no error translated\n{}",
        report("router pmtu6", &c)
    );
}

/// A UDP backend with nothing listening answers "port unreachable"; the
/// client's connected socket sees ECONNREFUSED, as it would talking to the
/// backend directly: the error came back translated (SNAT: through node A;
/// DSR: from node B straight to the client).
#[test]
fn an_icmp_error_from_the_backend_reaches_the_client_translated() {
    for mode in ["snat", "dsr"] {
        let mut c = Cluster::with(&unique(&format!("icmp_{mode}")), &Options::default());
        let _b = backends(&c);
        start_nodes(&mut c, &["--lb-mode", mode]);
        let err = traffic::in_netns(&c.client.name, || {
            let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            s.connect(SocketAddr::from((NODE_A, 30095))).unwrap();
            s.send(b"anyone?").unwrap();
            let mut buf = [0u8; 64];
            s.recv(&mut buf).err().map(|e| e.kind())
        });
        assert_eq!(
            err,
            Some(std::io::ErrorKind::ConnectionRefused),
            "{mode}\n{}",
            report("icmp", &c)
        );
    }
}

/// A client reuses its source port right after the server closed the first
/// connection: the SYN starts a new flow (not the old one's closing state),
/// and the new connection outlives the closing timeout while idle.
#[test]
fn a_reused_client_tuple_within_the_closing_timeout_connects_and_lives() {
    let mut c = Cluster::with(&unique("reuse_tuple"), &Options::default());
    let _b = backends(&c);
    start_nodes(&mut c, &["--conntrack-timeout-tcp-fin", "2s"]);
    let target = SocketAddr::from((NODE_A, 30090));
    let r = traffic::in_netns(&c.client.name, move || -> Result<(), String> {
        use std::io::{Read, Write};
        let bound = |port: u16| {
            let s = socket2_tcp();
            s.bind(&SocketAddr::from(([0, 0, 0, 0], port)).into())
                .map_err(|e| format!("bind {port}: {e}"))?;
            s.connect_timeout(&target.into(), Duration::from_secs(3))
                .map_err(|e| format!("connect from {port}: {e}"))?;
            Ok::<std::net::TcpStream, String>(s.into())
        };
        // First connection: the server sends 10 bytes and closes first.
        let mut a = bound(45555)?;
        let mut h = [0u8; 17];
        h[0] = b'D';
        h[9] = 10;
        a.write_all(&h).map_err(|e| e.to_string())?;
        let mut got = Vec::new();
        a.read_to_end(&mut got).map_err(|e| e.to_string())?;
        drop(a);
        // Same tuple again at once (as soon as the client's own side has
        // left LAST_ACK: until our FIN is acknowledged the kernel refuses
        // the tuple with EADDRNOTAVAIL, well within the 2 s closing
        // timeout); idle past the closing timeout, then use it.
        let reused = std::time::Instant::now();
        let mut b = loop {
            match bound(45555) {
                Err(e)
                    if e.contains("os error 99")
                        && reused.elapsed() < Duration::from_millis(500) =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                other => break other?,
            }
        };
        std::thread::sleep(Duration::from_secs(4));
        h[0] = b'U';
        h[9] = 0;
        b.write_all(&h).map_err(|e| format!("after idling: {e}"))?;
        let payload = vec![0u8; 0];
        b.write_all(&payload).map_err(|e| e.to_string())?;
        b.shutdown(std::net::Shutdown::Write)
            .map_err(|e| e.to_string())?;
        let mut verdict = [0u8; 9];
        b.read_exact(&mut verdict)
            .map_err(|e| format!("no verdict: {e}"))?;
        if verdict[0] != 1 {
            return Err("the server saw wrong bytes".into());
        }
        Ok(())
    });
    r.unwrap_or_else(|e| panic!("{e}\n{}", report("reused tuple", &c)));
    assert!(Cluster::counter(&c.a, lb_common::config::CNT_CT_REOPENED) >= 1);
}

fn socket2_tcp() -> socket2::Socket {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.set_reuse_address(true).unwrap();
    s
}

/// After traffic stops, the conntrack table empties within the lifetimes
/// (short ones here) plus one sweep: expired entries are deleted, not only
/// hidden.
#[test]
fn conntrack_drains_after_traffic_stops() {
    let mut c = Cluster::with(&unique("ct_drain"), &Options::default());
    let _b = backends(&c);
    start_nodes(
        &mut c,
        &[
            "--conntrack-timeout-tcp-fin",
            "6s",
            "--conntrack-timeout-udp",
            "6s",
            "--conntrack-gc-interval",
            "1s",
        ],
    );
    let churn = traffic::churn(&c.client.name, SocketAddr::from((NODE_A, 30081)), 500);
    assert_eq!(churn.failed, 0);
    let answers =
        traffic::udp_from_one_socket(&c.client.name, "203.0.113.40:53".parse().unwrap(), 5);
    assert!(answers.iter().all(Option::is_some));
    let agent = c.a.agent.as_ref().unwrap();
    let count = || {
        agent
            .lbctl_json(&["ct", "list", "--all"])
            .as_array()
            .unwrap()
            .len()
    };
    // Each connection has its two entries until the closing lifetime runs out.
    assert!(count() >= 1000, "every connection tracked");
    assert!(
        lb_testkit::wait_until(Duration::from_secs(20), || count() == 0),
        "left: {:#}",
        agent.lbctl_json(&["ct", "list", "--all"])
    );
    let (_, metrics) = agent.http_get("/metrics");
    assert!(
        metrics.contains("lb_conntrack_gc_deleted_total"),
        "{metrics}"
    );
}

/// `--acceleration best-effort` where native XDP cannot attach (node A's
/// uplink is a Linux bridge): the agent says so, and tc serves the same
/// traffic.
#[test]
fn best_effort_acceleration_falls_back_to_tc_where_xdp_cannot_attach() {
    let opts = Options {
        gro: true,
        bridged_uplink_a: true,
        ..Default::default()
    };
    let mut c = Cluster::with(&unique("xdp_besteff"), &opts);
    let _b = backends(&c);
    start_nodes(&mut c, &["--acceleration", "best-effort"]);
    let log = c.a.agent.as_ref().unwrap().log_text();
    assert!(log.contains("no native XDP"), "{log}");
    bulk_both_ways(&c, 30090, "best-effort on a bridge");
    let churn = traffic::churn(&c.client.name, SocketAddr::from((NODE_A, 30081)), 2_000);
    assert_eq!(churn.failed, 0, "{:?}", churn.errors);
    assert_eq!(Cluster::counter(&c.a, lb_common::config::CNT_XDP_PUNTED), 0);
}

/// Native XDP on a veth whose peer has no XDP program loses what the
/// program sends back out (XDP_TX, redirects), with no counter of ours:
/// the agent reads the peer before it loads anything. `--acceleration
/// native` refuses to start, naming the device, its peer and what a veth
/// needs, and installs nothing; best-effort serves the same traffic
/// through tc and says why; once the peers run an XDP_PASS program,
/// native attaches and carries it.
#[test]
fn native_xdp_on_a_veth_whose_peer_has_no_program_is_refused_and_best_effort_uses_tc() {
    let opts = Options {
        gro: true,
        full_checksums: true,
        ..Default::default()
    };
    let mut c = Cluster::with(&unique("xdp_veth"), &opts);
    let _b = backends(&c);

    std::fs::write(&c.a.services, services('a')).unwrap();
    let mut cmd = std::process::Command::new(lb_testkit::sibling_bin("lb-agent"));
    lb_testkit::netns::exec_in(&mut cmd, &c.a.ns.name).unwrap();
    let out = cmd
        .arg("--services")
        .arg(&c.a.services)
        .arg("--cgroup")
        .arg(&c.a.cgroup.path)
        .arg("--pin-dir")
        .arg(&c.a.pins.path)
        .args(["--devices", &c.a.device, "--acceleration", "native"])
        .env("KUBECONFIG", "/nonexistent")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "native on such a veth must not start:\n{err}"
    );
    assert!(
        err.contains(&format!("{} is a veth whose peer na0", c.a.device))
            && err.contains("no driver-mode XDP program")
            && err.contains("XDP_PASS")
            && err.contains("tx off")
            && err.contains("best-effort"),
        "the refusal names the device, its peer and what a veth needs:\n{err}"
    );
    let pinned: Vec<_> = std::fs::read_dir(&c.a.pins.path)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        pinned.is_empty(),
        "refused before anything was loaded: {pinned:?}"
    );
    let xdp_link =
        lb::datapath::PinLayout::new(&c.a.pins.path).link(&format!("xdp@{}", c.a.device));

    start_nodes(&mut c, &["--acceleration", "best-effort"]);
    let log = c.a.agent.as_ref().unwrap().log_text();
    assert!(
        log.contains("no native XDP") && log.contains("is a veth whose peer na0"),
        "{log}"
    );
    assert!(!xdp_link.exists(), "best-effort attached no XDP there");
    bulk_both_ways(&c, 30090, "best-effort on a veth whose peer has no program");
    assert_eq!(
        Cluster::counter(&c.a, lb_common::config::CNT_XDP_PUNTED),
        0,
        "no XDP ran"
    );

    let _pass: Vec<_> = ["c0", "na0", "nb0"]
        .iter()
        .map(|port| lb_testkit::xdp_pass::attach(&c.hub.name, port))
        .collect();
    start_nodes(&mut c, &["--acceleration", "native"]);
    let log = c.a.agent.as_ref().unwrap().log_text();
    assert!(
        log.contains("XDP ready") && log.contains("full checksums"),
        "native attaches once the peer has a program, and says what it cannot check:\n{log}"
    );
    assert!(xdp_link.exists(), "native XDP attached and pinned");
    bulk_both_ways(&c, 30090, "native XDP on a veth whose peer has a program");
}
