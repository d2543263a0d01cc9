//! Connects through a service address, side by side:
//!
//! * `direct`: to the backend's own address, nothing in the way (the peer
//!   every other variant is divided by);
//! * `direct, hooks attached`: the same from the cgroup with our programs,
//!   which look the backend's address up and leave it alone: what socket LB
//!   costs every connect that is not to a service;
//! * `lb`: to the service address, translated by our connect4 program;
//! * `iptables`: kube-proxy's iptables layout (iptables-legacy, nat table);
//! * `nftables`: kube-proxy's nftables layout.
//!
//! ```text
//!  [client ns]  direct / lb (cgroup with our programs)  ─┐
//!  [ipt ns]     iptables rules in its nat table          ─┼─ br0 [hub] ── 10.250.0.11, .12 (accept + RST)
//!  [nft ns]     nftables rules                           ─┘
//! ```
//!
//! All at N services with 2 endpoints each, the measured service last. The
//! variants take turns round by round, so machine noise hits them alike.
use std::{
    net::{SocketAddr, SocketAddrV4},
    time::{Duration, Instant},
};

use lb_testkit::{
    agent::{Agent, PinDir},
    cgroup::ChildCgroup,
    topology::Topology,
    unique,
};
use socket2::{Domain, Protocol, Socket, Type};

use crate::{
    client,
    kube_proxy::{self, timed_in_netns},
    memory::{self, Memory},
    profile::Profile,
    stats::{median_f64, middle_half, percentile},
    workload::{agent_map_args, Workload, TARGET_PORT},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Direct,
    DirectHooked,
    Lb,
    Iptables,
    Nftables,
}

impl Variant {
    pub const ALL: [Variant; 5] = [
        Variant::Direct,
        Variant::DirectHooked,
        Variant::Lb,
        Variant::Iptables,
        Variant::Nftables,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Direct => "direct to backend",
            Variant::DirectHooked => "direct, hooks attached",
            Variant::Lb => "lb (socket LB)",
            Variant::Iptables => "kube-proxy iptables",
            Variant::Nftables => "kube-proxy nftables",
        }
    }
}

#[derive(Clone, Debug)]
pub struct VariantResult {
    pub variant: Variant,
    /// Median over rounds of connects per second.
    pub rate: f64,
    /// Connects per second, round by round (the same rounds for every
    /// variant: round r of each ran in the same round, the variants taking turns).
    pub round_rates: Vec<f64>,
    pub p50: Duration,
    pub p99: Duration,
    pub attempts: usize,
    pub failed: usize,
}

#[derive(Clone, Debug)]
pub struct Scale {
    pub services: usize,
    pub results: Vec<VariantResult>,
    /// Time to install the N services: our agent from start to its first
    /// reconcile (file parse included), iptables-restore, nft -f.
    pub setup_lb: Duration,
    pub setup_iptables: Option<Duration>,
    pub setup_nftables: Option<Duration>,
    pub memory: Option<Memory>,
    /// Our programs' own run time (kernel BPF stats) in three extra runs:
    /// connect4 per run through the VIP and direct, and what all of them
    /// together take per direct connect, to a backend and elsewhere.
    pub hooks: Option<HookCosts>,
}

/// Our socket programs' run time from the kernel's per-program statistics.
#[derive(Clone, Debug)]
pub struct HookCosts {
    /// connect4 per run, dialing the service address.
    pub connect4_vip_ns: f64,
    /// connect4 per run, dialing a backend directly (no service there).
    pub connect4_direct_ns: f64,
    /// Our programs' time in a direct connect to a backend, which sockets
    /// were translated to (sock_release then looks the socket up).
    pub to_backend: PerConnect,
    /// The same to an address and port no service sends to.
    pub elsewhere: PerConnect,
}

/// What our programs took in one run of direct connects.
#[derive(Clone, Debug)]
pub struct PerConnect {
    /// Every one of our programs that ran (connect4, sock_release, ...),
    /// ns per connect, by program name.
    pub programs: Vec<(String, f64)>,
    /// The connects' own mean time (the run's wall time ÷ connects, one
    /// client, back to back), to set the programs' time against.
    pub connect_ns: f64,
}

impl PerConnect {
    pub fn total_ns(&self) -> f64 {
        self.programs.iter().map(|(_, ns)| ns).sum()
    }

    pub fn share(&self) -> f64 {
        self.total_ns() / self.connect_ns
    }
}

/// What the extra runs with the kernel's statistics on dial.
#[derive(Clone, Copy, Debug)]
enum Dial {
    Vip,
    Backend,
    Elsewhere,
}

/// The port of the server no service sends to.
const ELSEWHERE_PORT: u16 = 9090;

impl Scale {
    pub fn get(&self, v: Variant) -> Option<&VariantResult> {
        self.results.iter().find(|r| r.variant == v)
    }

    /// The middle half of the round-by-round ratios of `v`'s rate to the
    /// direct rate (round r of each, run in the same round): the noise a ratio of
    /// medians carries.
    pub fn round_spread(&self, v: Variant) -> Option<(f64, f64)> {
        let (a, d) = (self.get(v)?, self.get(Variant::Direct)?);
        let ratios = a
            .round_rates
            .iter()
            .zip(&d.round_rates)
            .map(|(a, d)| a / d)
            .collect();
        middle_half(ratios)
    }
}

/// A backend that accepts and closes. The client has reset the connection
/// by then (or does so on the server's FIN), so neither side keeps a
/// TIME_WAIT. The server must not reset itself: its RST can race the
/// client's next SYN from the same port and fail that connect.
fn start_server(netns: &str, addr: SocketAddrV4) {
    let (ns, (tx, rx)) = (netns.to_string(), std::sync::mpsc::channel());
    std::thread::spawn(move || {
        lb_testkit::netns::enter(&ns).expect("backend namespace");
        let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        s.set_reuse_address(true).unwrap();
        s.bind(&SocketAddr::from(addr).into()).expect("bind");
        s.listen(4096).unwrap();
        tx.send(()).unwrap();
        // Ends with the process: the bench exits when it is done.
        loop {
            if let Ok((c, _)) = s.accept() {
                drop(c);
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("server ready");
}

/// The world of the connect rows: two backends serving TARGET_PORT, a
/// server no service sends to (a backend's host, another port: what most
/// connects that are not to a service reach), and two client cgroups, one
/// with our programs and one without.
struct Bed {
    topo: Topology,
    backends: Vec<SocketAddrV4>,
    elsewhere: SocketAddrV4,
    lb_cgroup: ChildCgroup,
    plain_cgroup: ChildCgroup,
    services_file: std::path::PathBuf,
}

impl Bed {
    fn new(tag: &str) -> Self {
        let topo = Topology::new(tag, 2);
        let backends: Vec<SocketAddrV4> = (0..2)
            .map(|i| SocketAddrV4::new(Topology::backend_ip(i), TARGET_PORT))
            .collect();
        for (i, b) in backends.iter().enumerate() {
            start_server(&topo.backends[i].name, *b);
        }
        let elsewhere = SocketAddrV4::new(Topology::backend_ip(0), ELSEWHERE_PORT);
        start_server(&topo.backends[0].name, elsewhere);
        Self {
            topo,
            backends,
            elsewhere,
            lb_cgroup: ChildCgroup::create(&format!("{tag}-lb")),
            plain_cgroup: ChildCgroup::create(&format!("{tag}-plain")),
            services_file: std::env::temp_dir().join(format!("lb-services-{tag}.yaml")),
        }
    }
}

/// Our agent on the services file, sized for `n` services, its maps
/// pinned apart under `pin_tag`.
fn start_agent(
    services_file: &std::path::Path,
    cgroup: &ChildCgroup,
    n: usize,
    pin_tag: &str,
) -> (Agent, PinDir) {
    let pins = PinDir::create(pin_tag);
    let sizes = agent_map_args(n);
    let args: Vec<&str> = sizes.iter().map(String::as_str).collect();
    let agent = Agent::start_slow(
        services_file,
        &cgroup.path,
        &pins.path,
        &args,
        Duration::from_secs(600),
    );
    (agent, pins)
}

/// A client namespace where the service range is routed on-link, as in a
/// cluster: kube-proxy's rules DNAT after the route lookup, which must succeed.
fn kube_proxy_client(topo: &mut Topology, tag: &str) -> String {
    let name = topo.add_client(tag);
    let ns = topo.extra_clients.last().unwrap();
    ns.ip(&[
        "route",
        "del",
        "blackhole",
        lb_testkit::topology::SERVICE_RANGE,
    ]);
    ns.ip(&[
        "route",
        "add",
        lb_testkit::topology::SERVICE_RANGE,
        "dev",
        "eth0",
    ]);
    name
}

pub fn run(p: &Profile) -> Vec<Scale> {
    let tag = unique("bench-connect");
    let Bed {
        mut topo,
        backends,
        elsewhere,
        lb_cgroup,
        plain_cgroup,
        services_file,
    } = Bed::new(&tag);
    let ipt_ns = kube_proxy_client(&mut topo, &format!("{tag}i"));
    let nft_ns = kube_proxy_client(&mut topo, &format!("{tag}n"));

    let mut scales = Vec::new();
    for &n in &p.connect_services {
        eprintln!("lb-bench: connect at {n} services");
        let w = Workload::new(n, 2, &backends);
        let vip = SocketAddr::from((w.last().vip, w.last().port));

        std::fs::write(&services_file, w.services_yaml()).unwrap();
        let t = Instant::now();
        let (agent, pins) = start_agent(&services_file, &lb_cgroup, n, &format!("{tag}-{n}"));
        let setup_lb = t.elapsed();
        let mut variants = vec![Variant::Direct, Variant::DirectHooked, Variant::Lb];
        let setup_iptables = (n <= p.iptables_max_services).then(|| {
            variants.push(Variant::Iptables);
            timed_in_netns(
                &ipt_ns,
                "iptables-legacy-restore",
                &[],
                &kube_proxy::iptables::full(&w.services),
            )
            .expect("loading the iptables layout")
        });
        let setup_nftables = (n <= p.nftables_max_services).then(|| {
            variants.push(Variant::Nftables);
            timed_in_netns(
                &nft_ns,
                "nft",
                &["-f", "-"],
                &kube_proxy::nftables::full(&w.services),
            )
            .expect("loading the nftables layout")
        });
        let memory = p
            .memory_at
            .contains(&n)
            .then(|| memory::measure(n, agent.pid().unwrap(), &pins.path));

        let direct: Vec<SocketAddr> = backends.iter().map(|b| SocketAddr::from(*b)).collect();
        let target = |v: Variant| -> (&std::path::Path, &str, Vec<SocketAddr>) {
            match v {
                Variant::Direct => (&plain_cgroup.path, &topo.client.name, direct.clone()),
                Variant::DirectHooked => (&lb_cgroup.path, &topo.client.name, direct.clone()),
                Variant::Lb => (&lb_cgroup.path, &topo.client.name, vec![vip]),
                Variant::Iptables => (&plain_cgroup.path, &ipt_ns, vec![vip]),
                Variant::Nftables => (&plain_cgroup.path, &nft_ns, vec![vip]),
            }
        };
        // Warm-up (neighbour entries, caches), and proof that every variant
        // reaches a backend: a broken layout must not pass as a slow one.
        for &v in &variants {
            let (cg, ns, addr) = target(v);
            let s = client::run(cg, ns, &addr, 20, 5_000);
            assert!(
                !s.latencies_ns.is_empty(),
                "{} never reached a backend through {addr:?}",
                v.name()
            );
        }
        let k = variants.len();
        let mut latencies: Vec<Vec<Duration>> = vec![Vec::new(); k];
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); k];
        let mut failed = vec![0usize; k];
        for round in 0..p.connect_rounds {
            for j in 0..k {
                let i = (round + j) % k;
                let (cg, ns, addr) = target(variants[i]);
                let s = client::run(cg, ns, &addr, p.connect_per_round, p.round_ms);
                let attempts = s.latencies_ns.len() + s.failed;
                rates[i].push(attempts as f64 / (s.elapsed_ns as f64 / 1e9));
                failed[i] += s.failed;
                if let Some(e) = s.first_error {
                    eprintln!(
                        "lb-bench: {} at {n} services: {} failed, first: {e}",
                        variants[i].name(),
                        s.failed
                    );
                }
                latencies[i].extend(s.latencies_ns.iter().map(|&ns| Duration::from_nanos(ns)));
            }
        }
        let hooks = hook_costs(&lb_cgroup.path, |dial| {
            let (cg, ns, addr) = match dial {
                Dial::Vip => target(Variant::Lb),
                Dial::Backend => target(Variant::DirectHooked),
                Dial::Elsewhere => (
                    lb_cgroup.path.as_path(),
                    topo.client.name.as_str(),
                    vec![SocketAddr::from(elsewhere)],
                ),
            };
            let s = client::run(cg, ns, &addr, p.connect_per_round, p.round_ms);
            if let Some(e) = &s.first_error {
                eprintln!(
                    "lb-bench: {dial:?} with BPF stats: {} failed, first: {e}",
                    s.failed
                );
            }
            (s.latencies_ns.len(), s.failed, s.elapsed_ns)
        });
        let results = variants
            .iter()
            .enumerate()
            .map(|(i, &variant)| {
                let mut l = std::mem::take(&mut latencies[i]);
                l.sort();
                VariantResult {
                    variant,
                    rate: median_f64(rates[i].clone()),
                    round_rates: rates[i].clone(),
                    p50: percentile(&l, 0.5),
                    p99: percentile(&l, 0.99),
                    attempts: l.len() + failed[i],
                    failed: failed[i],
                }
            })
            .collect();
        drop(agent);
        drop(pins);
        scales.push(Scale {
            services: n,
            results,
            setup_lb,
            setup_iptables,
            setup_nftables,
            memory,
            hooks,
        });
    }
    let _ = std::fs::remove_file(&services_file);
    scales
}

/// Every program's (name, run time, runs) at one moment, by id.
type Snapshot = std::collections::HashMap<u32, (String, Duration, u64)>;
/// A program's (name, run time, runs) between two snapshots.
type Spent = (String, Duration, u64);

/// Run time and run count of every program attached to `cgroup` (this
/// agent's: another agent's programs on the machine are not counted), by id.
fn our_programs(cgroup: &std::path::Path) -> Snapshot {
    let ids: std::collections::HashSet<u32> = match lb::datapath::attached_programs(cgroup) {
        Ok(hooks) => hooks.into_iter().flat_map(|(_, ids)| ids).collect(),
        Err(e) => {
            eprintln!("lb-bench: the agent's programs not found ({e:#}): no BPF stats rows");
            Default::default()
        }
    };
    aya::programs::loaded_programs()
        .flatten()
        .filter(|p| ids.contains(&p.id()))
        .filter_map(|p| {
            let name = p.name_as_str()?.to_owned();
            Some((p.id(), (name, p.run_time(), p.run_count())))
        })
        .collect()
}

/// What each program took, summed by name, and how many runs, between two
/// snapshots.
fn spent(before: &Snapshot, after: &Snapshot) -> Vec<Spent> {
    let mut by_name: std::collections::BTreeMap<String, (Duration, u64)> = Default::default();
    for (id, (name, time, runs)) in after {
        let (t0, r0) = before.get(id).map_or((Duration::ZERO, 0), |b| (b.1, b.2));
        let runs = runs.saturating_sub(r0);
        if runs > 0 {
            let e = by_name.entry(name.clone()).or_default();
            e.0 += time.saturating_sub(t0);
            e.1 += runs;
        }
    }
    by_name.into_iter().map(|(n, (t, r))| (n, t, r)).collect()
}

/// Our programs' run time from the kernel's per-program statistics
/// (BPF_ENABLE_STATS), enabled only for these extra runs: the statistics
/// cost every program two clock reads per run, which the timed rounds
/// above must not pay. `run` makes one run of connects and returns
/// (connects made, connects failed, wall time in ns). A run with failures
/// gives no figures: a failed connect runs the programs without the
/// handshake, which would lower both sides of the share.
fn hook_costs(
    cgroup: &std::path::Path,
    run: impl Fn(Dial) -> (usize, usize, u64),
) -> Option<HookCosts> {
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok()?;
    let measured = |dial: Dial| -> Option<(Vec<Spent>, PerConnect)> {
        let before = our_programs(cgroup);
        let (connects, failed, wall_ns) = run(dial);
        let spent = spent(&before, &our_programs(cgroup));
        if connects == 0 || failed > 0 {
            return None;
        }
        let per = connects as f64;
        let programs = spent
            .iter()
            .map(|(n, t, _)| (n.clone(), t.as_nanos() as f64 / per))
            .collect();
        Some((
            spent,
            PerConnect {
                programs,
                connect_ns: wall_ns as f64 / per,
            },
        ))
    };
    let connect4_per_run = |spent: &[Spent]| -> Option<f64> {
        let (_, t, runs) = spent.iter().find(|(n, _, _)| n == "lb_connect4")?;
        Some(t.as_nanos() as f64 / *runs as f64)
    };
    let (vip, _) = measured(Dial::Vip)?;
    let (backend, to_backend) = measured(Dial::Backend)?;
    let (_, elsewhere) = measured(Dial::Elsewhere)?;
    Some(HookCosts {
        connect4_vip_ns: connect4_per_run(&vip)?,
        connect4_direct_ns: connect4_per_run(&backend)?,
        to_backend,
        elsewhere,
    })
}

/// Not part of the report: one kind of connect, again and again, long
/// enough to profile (`perf record -a -g` beside it), in the same world as
/// the connect rows at `services` services. `dial`: `plain` (a backend, no
/// hooks), `backend` (a backend, hooks attached), `elsewhere` (a port no
/// service uses, hooks attached) or `vip` (the service address).
pub fn profile(dial: &str, services: usize, seconds: u64) {
    let tag = unique("bench-prof");
    let bed = Bed::new(&tag);
    let w = Workload::new(services, 2, &bed.backends);
    std::fs::write(&bed.services_file, w.services_yaml()).unwrap();
    let (agent, _pins) = start_agent(&bed.services_file, &bed.lb_cgroup, services, &tag);
    let direct: Vec<SocketAddr> = bed.backends.iter().map(|b| SocketAddr::from(*b)).collect();
    let (cg, addr) = match dial {
        "plain" => (&bed.plain_cgroup.path, direct),
        "backend" => (&bed.lb_cgroup.path, direct),
        "elsewhere" => (&bed.lb_cgroup.path, vec![SocketAddr::from(bed.elsewhere)]),
        "vip" => (
            &bed.lb_cgroup.path,
            vec![SocketAddr::from((w.last().vip, w.last().port))],
        ),
        other => panic!("--dial {other}: expected plain, backend, elsewhere or vip"),
    };
    eprintln!(
        "lb-bench: {dial}: connecting for {seconds} s (lb-agent pid {:?})",
        agent.pid()
    );
    for _ in 0..seconds {
        let s = client::run(cg, &bed.topo.client.name, &addr, 10_000_000, 1_000);
        let n = s.latencies_ns.len();
        eprintln!(
            "{dial}: {:.0} connects/s, {} failed",
            n as f64 / (s.elapsed_ns as f64 / 1e9),
            s.failed
        );
    }
    drop(agent);
    let _ = std::fs::remove_file(&bed.services_file);
}
