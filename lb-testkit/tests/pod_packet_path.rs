//! ClusterIPs for pods whose sockets socket LB leaves alone
//! (`--socket-lb-host-namespace-only`, for service meshes): tc on the host
//! ends of the pods' veths translates their packets (as kube-proxy does in
//! PREROUTING and Cilium in bpf_lxc), keeps the pod's address at the
//! backend, and gives the replies the ClusterIP back.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    time::Duration,
};

use lb_testkit::{agent::Agent, pods::PodNode, probe, servers, traffic, unique};

const VIP: &str = "10.96.0.80";
const DNS: &str = "10.96.0.53";

fn services(n: &PodNode) -> String {
    let b = n.ip_of(1);
    format!(
        "services:\n\
         \x20 - name: web\n    clusterIPs: [{VIP}]\n    ports: [{{port: 80, targetPort: 8080}}, {{name: bulk, port: 9000, targetPort: 9000}}]\n    backends: [{{address: {b}, local: true}}]\n\
         \x20 - name: dns\n    clusterIPs: [{DNS}]\n    ports: [{{port: 53, protocol: UDP, targetPort: 5353}}]\n    backends: [{{address: {b}, local: true}}]\n"
    )
}

struct Backends(#[allow(dead_code)] Vec<servers::Server>);

fn backends(n: &PodNode) -> Backends {
    let b = n.ip_of(1);
    Backends(vec![
        servers::tcp(&n.pods[1].name, SocketAddr::from((b, 8080)), "b0"),
        traffic::bulk_server(&n.pods[1].name, SocketAddr::from((b, 9000))),
        servers::udp(&n.pods[1].name, SocketAddr::from((b, 5353)), "b0"),
    ])
}

fn start(n: &PodNode, extra: &[&str]) -> Agent {
    std::fs::write(&n.services, services(n)).unwrap();
    Agent::start_in_netns(
        &n.node.name,
        &n.services,
        &n.cgroup.path,
        &n.pins.path,
        extra,
    )
}

const MESH_SAFE: [&str; 3] = ["--socket-lb-host-namespace-only", "--pod-devices", "pv*"];

fn pod_reaches_the_clusterip(routed: bool, tag: &str) {
    let n = PodNode::new(&unique(tag), 2, routed);
    let _b = backends(&n);
    let agent = start(&n, &MESH_SAFE);
    let client = &n.pods[0].name;
    let pod = n.ip_of(0);
    // lb-probe joins the test's cgroup: its sockets meet the socket hooks,
    // which leave them alone (not the host namespace).
    for a in probe::run(&n.cgroup.path, client, "tcp", &format!("{VIP}:80"), 20) {
        assert!(a.ok, "{a:?}\n{}", agent.log_text());
        assert_eq!(a.backend(), Some("b0"));
        assert!(
            a.seen_client().unwrap().starts_with(&format!("{pod}:")),
            "the backend sees the pod: {a:?}"
        );
        assert_eq!(a.peer.as_deref(), Some("10.96.0.80:80"), "{a:?}");
    }
    for a in probe::run(&n.cgroup.path, client, "udp", &format!("{DNS}:53"), 10) {
        assert!(a.ok, "{a:?}");
        assert_eq!(
            a.reply_from.as_deref(),
            Some("10.96.0.53:53"),
            "the reply comes from the ClusterIP"
        );
        assert!(a.seen_client().unwrap().starts_with(&format!("{pod}:")));
    }
    let churn = traffic::churn(client, format!("{VIP}:80").parse().unwrap(), 3_000);
    assert_eq!(churn.failed, 0, "{:?}", churn.errors);
    let target: SocketAddr = format!("{VIP}:9000").parse().unwrap();
    let (up, down) = traffic::both_ways(client, target, 2000);
    let (up, down) = (up.unwrap(), down.unwrap());
    assert!(up.bytes >= 1 << 20 && down.bytes >= 1 << 20);
    eprintln!(
        "routed {routed}: up {:.0} Mbit/s, down {:.0} Mbit/s, {} connections in {:.1?}",
        up.mbit_per_s(),
        down.mbit_per_s(),
        churn.ok,
        churn.elapsed
    );
    // lbctl status names the pod devices that carry the path.
    let status = agent.lbctl(&["status"]);
    assert!(
        status.contains("tc-pod-ingress@pv1") && status.contains("tc-pod-egress@pv2"),
        "{status}"
    );
}

#[test]
fn a_routed_pod_reaches_a_clusterip_through_the_packet_path_when_its_sockets_are_left_alone() {
    pod_reaches_the_clusterip(true, "pod_routed");
}

#[test]
fn a_bridged_pod_reaches_a_clusterip_through_the_packet_path_when_its_sockets_are_left_alone() {
    pod_reaches_the_clusterip(false, "pod_bridged");
}

/// A pod made after the agent started is served as soon as its device
/// appears (rtnetlink), and a gone one leaves no stale link.
#[test]
fn a_pod_made_after_the_agent_started_is_served() {
    let tag = unique("pod_later");
    let mut n = PodNode::new(&tag, 2, true);
    let _b = backends(&n);
    let agent = start(&n, &MESH_SAFE);
    let i = n.add_pod(&tag);
    let pod = n.pods[i].name.clone();
    assert!(
        lb_testkit::wait_until(Duration::from_secs(5), || agent
            .lbctl(&["status"])
            .contains("tc-pod-ingress@pv3")),
        "{}",
        agent.log_text()
    );
    let a = &probe::run(&n.cgroup.path, &pod, "tcp", &format!("{VIP}:80"), 1)[0];
    assert!(a.ok, "{a:?}");
}

/// Without the flag the socket path serves the same pods (their connect is
/// translated before any packet exists).
#[test]
fn without_host_namespace_only_the_socket_path_serves_the_pods() {
    let n = PodNode::new(&unique("pod_sockets"), 2, true);
    let _b = backends(&n);
    let agent = start(&n, &[]);
    assert!(!agent.lbctl(&["status"]).contains("tc-pod-ingress"));
    for a in probe::run(
        &n.cgroup.path,
        &n.pods[0].name,
        "tcp",
        &format!("{VIP}:80"),
        5,
    ) {
        assert!(a.ok && a.backend() == Some("b0"), "{a:?}");
        assert_eq!(a.peer.as_deref(), Some("10.96.0.80:80"));
    }
}

/// The mesh case: inside the pod, an iptables REDIRECT (as Istio's init
/// container installs) sends the application's connect to the ClusterIP to
/// a local proxy. The proxy reads SO_ORIGINAL_DST, which is the ClusterIP
/// (socket LB left the socket alone), dials it itself, and the request
/// reaches the backend through the packet path.
#[test]
fn a_mesh_proxy_sees_the_clusterip_and_its_own_connection_reaches_the_backend() {
    let n = PodNode::new(&unique("pod_mesh"), 2, true);
    let _b = backends(&n);
    let _agent = start(&n, &MESH_SAFE);
    let pod = n.pods[0].name.clone();
    const MARK: u32 = 0x539; // the proxy's own connections skip the redirect
    lb_testkit::run(
        "ip",
        &[
            "netns",
            "exec",
            &pod,
            "iptables",
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-p",
            "tcp",
            "-d",
            VIP,
            "--dport",
            "80",
            "-m",
            "mark",
            "!",
            "--mark",
            &MARK.to_string(),
            "-j",
            "REDIRECT",
            "--to-ports",
            "15001",
        ],
    );
    // The sidecar: accept, read the original destination, dial it, relay.
    let proxy_ns = pod.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let proxy = std::thread::spawn(move || -> (String, String) {
        lb_testkit::netns::enter(&proxy_ns).unwrap();
        let l = TcpListener::bind("127.0.0.1:15001").unwrap();
        ready_tx.send(()).unwrap();
        let (mut app, _) = l.accept().unwrap();
        let original = original_dst(app.as_raw_fd());
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.set_mark(MARK).unwrap();
        s.connect_timeout(&original.into(), Duration::from_secs(3))
            .unwrap();
        let mut upstream: TcpStream = s.into();
        let mut answer = String::new();
        upstream.read_to_string(&mut answer).unwrap();
        app.write_all(answer.as_bytes()).unwrap();
        (original.to_string(), answer)
    });
    ready_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    // The application, in the test's cgroup (socket hooks apply, and leave it alone).
    let a = &probe::run(&n.cgroup.path, &pod, "tcp", &format!("{VIP}:80"), 1)[0];
    let (original, answer) = proxy.join().unwrap();
    assert_eq!(original, "10.96.0.80:80", "the mesh sees the service");
    assert!(answer.starts_with("b0 "), "{answer}");
    assert!(a.ok && a.backend() == Some("b0"), "{a:?}");
}

/// getsockopt(SO_ORIGINAL_DST): where a REDIRECTed connection was going.
fn original_dst(fd: i32) -> SocketAddr {
    const SO_ORIGINAL_DST: i32 = 80;
    // SAFETY: a zeroed sockaddr_in is valid; its size is passed.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as u32;
    // SAFETY: `fd` is an open socket; the kernel writes at most `len` bytes
    // into `sa`, which outlives the call.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_IP,
            SO_ORIGINAL_DST,
            (&mut sa as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0, "SO_ORIGINAL_DST: {}", std::io::Error::last_os_error());
    SocketAddr::from((
        std::net::Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
        u16::from_be(sa.sin_port),
    ))
}

/// Hairpin: a pod reaches a service whose backend is itself. Its own
/// address as the source would be a martian to it; the source becomes the
/// ClusterIP (kube-proxy masquerades it), and the reply finds its way back.
#[test]
fn a_pod_that_is_its_own_backend_reaches_itself_through_the_clusterip() {
    let n = PodNode::new(&unique("pod_hairpin"), 1, true);
    let me = n.ip_of(0);
    let _s = servers::tcp(&n.pods[0].name, SocketAddr::from((me, 8080)), "self");
    std::fs::write(
        &n.services,
        format!("services:\n  - name: web\n    clusterIPs: [{VIP}]\n    ports: [{{port: 80, targetPort: 8080}}]\n    backends: [{{address: {me}, local: true}}]\n"),
    )
    .unwrap();
    let _agent = Agent::start_in_netns(
        &n.node.name,
        &n.services,
        &n.cgroup.path,
        &n.pins.path,
        &MESH_SAFE,
    );
    for a in probe::run(
        &n.cgroup.path,
        &n.pods[0].name,
        "tcp",
        &format!("{VIP}:80"),
        5,
    ) {
        assert!(a.ok && a.backend() == Some("self"), "{a:?}");
        assert!(
            a.seen_client().unwrap().starts_with(&format!("{VIP}:")),
            "{a:?}"
        );
    }
}

/// An external IP no node holds, for the node's sockets and pods: with
/// the default `--external-ips-in-cluster translate` it leads to the Service
/// (kube-proxy's semantics; the upstream test "should be possible to connect
/// to a service via ExternalIP when the external IP is not assigned to a
/// node"); with `owned-only` it reaches the real address it names
/// (CVE-2020-8554, Cilium's `sock4_skip_xlate`). In both, an external IP the
/// node holds is served and tc keeps serving the address from outside.
struct ExternalIps {
    // Fields drop in order: the agent first, the namespaces, cgroup and
    // pins it uses last.
    agent: Agent,
    _servers: [servers::Server; 2],
    n: PodNode,
    /// An address the node holds (on its lo) when the agent starts.
    owned: &'static str,
    /// The address of the third pod, "the real owner" a tenant wrote into
    /// the Service's externalIPs.
    foreign: std::net::Ipv4Addr,
}

impl ExternalIps {
    fn start(tag: &str, agent_args: &[&str]) -> Self {
        let n = PodNode::new(&unique(tag), 3, true);
        let (backend, foreign) = (n.ip_of(1), n.ip_of(2));
        let _servers = [
            servers::tcp(&n.pods[1].name, SocketAddr::from((backend, 8080)), "b1"),
            servers::tcp(&n.pods[2].name, SocketAddr::from((foreign, 8080)), "real"),
        ];
        let owned = "192.168.70.50";
        n.node
            .ip(&["addr", "add", &format!("{owned}/32"), "dev", "lo"]);
        std::fs::write(
            &n.services,
            format!(
                "services:\n  - name: ext\n    clusterIPs: [10.96.0.81]\n    externalIPs: [{owned}, {foreign}]\n    ports: [{{port: 8080}}]\n    backends: [{{address: {backend}, local: true}}]\n"
            ),
        )
        .unwrap();
        let agent = Agent::start_in_netns(
            &n.node.name,
            &n.services,
            &n.cgroup.path,
            &n.pins.path,
            agent_args,
        );
        Self {
            agent,
            _servers,
            n,
            owned,
            foreign,
        }
    }

    /// Who answers 5 connects from `netns` to `target`: a backend's name or "failed".
    fn answers(&self, netns: &str, target: &str) -> Vec<String> {
        probe::run(&self.n.cgroup.path, netns, "tcp", target, 5)
            .iter()
            .map(|a| {
                if a.ok {
                    a.backend().unwrap_or("?").to_string()
                } else {
                    "failed".to_string()
                }
            })
            .collect()
    }

    /// The node's own namespace (host sockets) and the first pod.
    fn clients(&self) -> [String; 2] {
        [self.n.node.name.clone(), self.n.pods[0].name.clone()]
    }

    /// Both external IPs, from the host and from the pod, reach `foreign_answer`
    /// and the service's backend.
    fn check(&self, foreign_answer: &str, why: &str) {
        for from in self.clients() {
            assert_eq!(
                self.answers(&from, &format!("{}:8080", self.foreign)),
                [foreign_answer; 5],
                "from {from}: {why}\n{}",
                self.agent.log_text()
            );
            assert_eq!(
                self.answers(&from, &format!("{}:8080", self.owned)),
                ["b1"; 5],
                "from {from}: the node's own external IP is served"
            );
        }
        let list = self.agent.lbctl(&["service", "list"]);
        assert!(
            list.contains(&format!("{}:8080/TCP", self.foreign)),
            "the foreign external IP stays a frontend in the maps (for packets from outside):\n{list}"
        );
    }
}

#[test]
fn by_default_an_external_ip_no_node_holds_leads_host_sockets_and_pods_to_the_service_as_with_kube_proxy(
) {
    // Pods' sockets through the socket hooks.
    let w = ExternalIps::start("extip_translate", &[]);
    w.check(
        "b1",
        "an external IP is the Service's for in-cluster clients",
    );
    let list = w.agent.lbctl(&["service", "list"]);
    assert!(!list.contains("not this node's"), "{list}");
    drop(w);
    // Pods' packets through tc on their veths.
    let w = ExternalIps::start("extip_translate_tc", &MESH_SAFE);
    w.check(
        "b1",
        "an external IP is the Service's for pods' packets too",
    );
}

/// CVE-2020-8554 (`--external-ips-in-cluster owned-only`): whoever may edit
/// a Service writes its externalIPs. An external IP this node does not own
/// stays the real address it looks like, for the node's sockets and for
/// pods (their sockets through the socket hooks, their packets through tc
/// on their veths), while one the node owns is served. An address the node
/// gives up, or gains again, is picked up (the agent reads its addresses
/// every round, at least every 10 s).
#[test]
fn owned_only_an_external_ip_the_node_does_not_own_reaches_its_real_owner_from_host_sockets_and_pods_cve_2020_8554(
) {
    // Pods' sockets through the socket hooks.
    let w = ExternalIps::start(
        "foreign_extip_sock",
        &["--external-ips-in-cluster", "owned-only"],
    );
    w.check("real", "a foreign external IP was redirected");
    drop(w);
    // Pods' packets through tc on their veths.
    let mut args = MESH_SAFE.to_vec();
    args.extend(["--external-ips-in-cluster", "owned-only"]);
    let w = ExternalIps::start("foreign_extip", &args);
    w.check("real", "a foreign external IP was redirected");
    let list = w.agent.lbctl(&["service", "list"]);
    assert!(list.contains("not this node's"), "{list}");

    // The node gives the address up: it is foreign now, nobody answers
    // there, while the foreign one still reaches its owner and the
    // ClusterIP its backend (the agent is alive and translating).
    let [host, pod] = w.clients();
    let owned = format!("{}:8080", w.owned);
    w.n.node
        .ip(&["addr", "del", &format!("{}/32", w.owned), "dev", "lo"]);
    assert!(
        lb_testkit::wait_until(Duration::from_secs(30), || w
            .answers(&host, &owned)
            .iter()
            .all(|a| a == "failed")),
        "an address the node gave up is still translated\n{}",
        w.agent.log_text()
    );
    for from in [&host, &pod] {
        assert!(
            w.answers(from, &owned).iter().all(|a| a == "failed"),
            "from {from}: an address the node gave up is still translated"
        );
        assert_eq!(w.answers(from, &format!("{}:8080", w.foreign)), ["real"; 5]);
        assert_eq!(
            w.answers(from, "10.96.0.81:8080"),
            ["b1"; 5],
            "from {from}: the ClusterIP"
        );
    }
    let list = w.agent.lbctl(&["service", "list"]);
    assert!(
        list.lines()
            .any(|l| l.contains(&owned) && l.contains("not this node's")),
        "the address given up is marked:\n{list}"
    );
    // The node takes it back: translated again.
    w.n.node
        .ip(&["addr", "add", &format!("{}/32", w.owned), "dev", "lo"]);
    assert!(
        lb_testkit::wait_until(Duration::from_secs(30), || w.answers(&host, &owned)
            == ["b1"; 5]),
        "an address the node gained is not translated\n{}",
        w.agent.log_text()
    );
    assert_eq!(w.answers(&pod, &owned), ["b1"; 5]);
}
