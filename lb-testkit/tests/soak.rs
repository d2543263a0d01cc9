//! Soak: steady traffic through both paths while services churn and the
//! agent restarts, for an hour with `cargo xtask soak` (150 s by default
//! when run alone with `--include-ignored`; not in `./xtask.sh test`, see
//! the `#[ignore]`).
//!
//! In the two-node namespace cluster, node A's agent serves `web` (a
//! ClusterIP and a NodePort over three pods on node B). Two loads run the
//! whole time, every request timed and checked:
//! - the socket path: a pod on node A connects to web's ClusterIP from node
//!   A's cgroup (connect4 picks a pod; no translation after that);
//! - the packet path: an outside client connects to node A's NodePort (tc
//!   ingress, conntrack, SNAT to a pod on node B, the reply back).
//!
//! Meanwhile, every second, services are created and deleted (each with a
//! ClusterIP, a NodePort and backends) and web is scaled between one and
//! three of its pods. A pod scaled away is first terminating for two
//! seconds (still serving, chosen by no new flow: KEP-1669), then removed
//! and its server stopped, as a pod with a preStop delay is deleted: a flow
//! already on its way to it completes there, and a new flow sent to it
//! after its removal would fail. The churned services carry no traffic
//! (their backends do not exist): they exercise the agent and the maps.
//! Node B runs no agent; it only routes to its pods. The agent is restarted every few minutes, SIGKILL and
//! SIGTERM in turn, during the first two thirds of the run; the last agent
//! lives through the last third of the churn alone, so what it leaks per
//! change has time to show.
//!
//! Asserted: no request fails on either path; and once the churn stops
//! and the services are back where they started, nothing has grown: every
//! map holds the entries it held before the churn (the conntrack table
//! once its flows expired, the socket path's TCP table once its sockets
//! closed), and the last agent's RSS, file descriptors and threads are
//! where the first agent's were before the churn. The report (a table and an
//! SVG of RSS, map entries, latency and errors over time) goes to
//! target/soak/ (LB_SOAK_REPORT), the figures docs/reliability.md quotes.
use std::{
    fmt::Write as _,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use lb_testkit::{
    cluster::{Cluster, Node, NODE_A, POD_B},
    netns, probe, servers, traffic, unique, wait_until,
};

/// Web's ClusterIP and NodePort: what both loads dial.
const WEB_VIP: &str = "10.96.0.2";
const WEB_NODE_PORT: u16 = 30081;
/// Churned services alive at once, at most (the oldest go first).
const CHURN_LIVE: usize = 40;
/// Services created per churn tick.
const CHURN_PER_TICK: usize = 2;
/// Web's serving pods over time, a tick each: always at least one of the
/// three. Pod 2 is away for four ticks and pod 1 for three (each
/// terminating, then removed: its server stops), pod 0 for two (it comes
/// back while still terminating).
const WEB_SCALE: [&[usize]; 8] = [
    &[0, 1, 2],
    &[0, 1],
    &[0, 1],
    &[0],
    &[0],
    &[0, 2],
    &[2],
    &[1, 2],
];
/// Ticks a pod scaled away stays terminating before it is removed.
const TERMINATING_TICKS: usize = 2;

/// One request: how long it took, and whether it got its answer.
#[derive(Clone, Copy)]
struct Request {
    took: Duration,
    ok: bool,
}

/// Requests of one load since the sampler last took them.
type Log = Arc<Mutex<Vec<Request>>>;

/// The loads' threads: stopped and joined when dropped, so a failing
/// assertion never leaves them dialing into a cluster being torn down.
struct Loads {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Loads {
    /// Panics when a load has stopped by itself (its thread panicked).
    fn check_running(&self) {
        assert!(
            self.threads.iter().all(|t| !t.is_finished()),
            "a load stopped before the end of the soak (see its panic above)"
        );
    }

    /// Stops and joins the loads: whether each ended without panicking.
    fn halt(&mut self) -> Vec<bool> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads.drain(..).map(|t| t.join().is_ok()).collect()
    }

    fn stop(mut self) {
        assert!(self.halt().iter().all(|ok| *ok), "a load panicked");
    }
}

impl Drop for Loads {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Web's pods' servers, one per pod while it is in the service (serving
/// or terminating); a pod removed from the service is gone, as a deleted
/// pod is: a new flow sent to it would fail.
struct Pods {
    netns: String,
    servers: Vec<Option<servers::Server>>,
}

impl Pods {
    fn start(&mut self, pod: usize) {
        if self.servers[pod].is_none() {
            self.servers[pod] = Some(servers::tcp(
                &self.netns,
                SocketAddr::from((POD_B[pod], 8080)),
                &format!("pod-b{pod}"),
            ));
        }
    }

    fn remove(&mut self, pod: usize) {
        self.servers[pod] = None;
    }
}

/// The node's services file: web on `web` (indexes into POD_B) with
/// `terminating` pods beside them, and the churned services `churn`
/// (serial numbers).
fn services(web: &[usize], terminating: &[usize], churn: &[usize]) -> String {
    let mut pods: Vec<String> = web
        .iter()
        .map(|i| format!("{{address: \"{}\"}}", POD_B[*i]))
        .collect();
    pods.extend(
        terminating
            .iter()
            .map(|i| format!("{{address: \"{}\", state: terminating}}", POD_B[*i])),
    );
    let mut y = format!(
        "services:\n  - name: web\n    type: NodePort\n    clusterIPs: [\"{WEB_VIP}\"]\n    \
         ports: [{{port: 80, targetPort: 8080, nodePort: {WEB_NODE_PORT}}}]\n    backends: [{}]\n",
        pods.join(", ")
    );
    for n in churn {
        // Addresses and ports from the serial number: a deleted service's
        // are reused later by another, as a cluster's IPAM does.
        let slot = n % 500;
        let backends: Vec<String> = (0..1 + n % 3)
            .map(|b| format!("{{address: \"10.244.9.{}\"}}", (n + b) % 250 + 1))
            .collect();
        let _ = write!(
            y,
            "  - name: churn-{n}\n    type: NodePort\n    clusterIPs: [\"10.96.{}.{}\"]\n    \
             ports: [{{port: 80, targetPort: 8080, nodePort: {}}}]\n    backends: [{}]\n",
            1 + slot / 250,
            slot % 250 + 1,
            31000 + slot,
            backends.join(", ")
        );
    }
    y
}

/// Requests through the socket path: lb-probe in node A's cgroup and pod
/// A's namespace, 20 connects per process, until stopped.
fn socket_load(c: &Cluster, stop: Arc<AtomicBool>, log: Log) -> JoinHandle<()> {
    let (cgroup, ns) = (c.a.cgroup.path.clone(), c.pod_a.name.clone());
    std::thread::spawn(move || {
        let target = format!("{WEB_VIP}:80");
        while !stop.load(Ordering::Relaxed) {
            let attempts = probe::run(&cgroup, &ns, "tcp", &target, 20);
            let mut log = log.lock().unwrap();
            for a in attempts {
                if !a.ok {
                    eprintln!("soak: socket path request failed: {a:?}");
                }
                log.push(Request {
                    took: Duration::from_micros(a.micros.unwrap_or(0)),
                    ok: a.ok && a.backend().is_some_and(|b| b.starts_with("pod-b")),
                });
            }
        }
    })
}

/// Requests through the packet path: connections from the outside client
/// to node A's NodePort, each reading the pod's answer, until stopped.
fn packet_load(c: &Cluster, stop: Arc<AtomicBool>, log: Log) -> JoinHandle<()> {
    let ns = c.client.name.clone();
    std::thread::spawn(move || {
        netns::enter(&ns).expect("entering the client's namespace");
        let target = SocketAddr::from((NODE_A, WEB_NODE_PORT));
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            let answer = traffic::ask(target);
            let ok = answer.as_ref().is_ok_and(|a| a.starts_with("pod-b"));
            if !ok {
                eprintln!("soak: packet path request failed: {answer:?}");
            }
            log.lock().unwrap().push(Request {
                took: t.elapsed(),
                ok,
            });
            // About 200 a second: steady, far from the SNAT range's limits.
            std::thread::sleep(Duration::from_millis(5));
        }
    })
}

/// What the agent process holds, from /proc.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Process {
    rss_kib: u64,
    fds: usize,
    threads: usize,
}

/// The agent's process, which must be running (a dead one reads as zeros).
fn process(pid: u32) -> Process {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let p = Process {
        rss_kib: field("VmRSS:"),
        threads: field("Threads:") as usize,
        fds: std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count),
    };
    assert!(
        p.rss_kib > 0 && p.threads > 0 && p.fds > 0,
        "the agent (pid {pid}) is not running: {p:?}"
    );
    p
}

/// Entries of every hash map of the node's pin directory, by name, and
/// the socket path's TCP table (an array: its taken slots).
fn map_entries(pins: &Path) -> Vec<(&'static str, usize)> {
    let mut all: Vec<(&'static str, usize)> = lb::maps::catalog::CATALOG
        .iter()
        .filter_map(|m| {
            lb::maps::bpf::count_entries(pins, m.name)
                .ok()
                .flatten()
                .map(|n| (m.name, n))
        })
        .collect();
    all.push((
        lb_common::maps::LB_SOCK_TCP,
        lb::maps::bpf::count_tcp_table(pins).expect("LB_SOCK_TCP"),
    ));
    all
}

/// Maps whose entries differ between `was` and `now`, by name.
fn differing(was: &[(&'static str, usize)], now: &[(&'static str, usize)]) -> Vec<String> {
    let mut names: Vec<&str> = was.iter().chain(now).map(|(n, _)| *n).collect();
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .filter(|n| entries_of(was, n) != entries_of(now, n))
        .map(|n| format!("{n}: {} → {}", entries_of(was, n), entries_of(now, n)))
        .collect()
}

fn entries_of(all: &[(&'static str, usize)], name: &str) -> usize {
    all.iter().find(|(n, _)| *n == name).map_or(0, |(_, e)| *e)
}

/// One row of the report: the agent, the maps and each load over the
/// last interval.
struct Sample {
    at: Duration,
    pid: u32,
    agent: Process,
    services: usize,
    backends: usize,
    conntrack: usize,
    churned_live: usize,
    socket: Window,
    packet: Window,
}

/// Requests of one load in an interval.
#[derive(Clone, Copy, Default)]
struct Window {
    count: usize,
    failed: usize,
    p50: Duration,
    p99: Duration,
}

/// The requests logged since the last window (taken out of the log, so it
/// stays small over an hour), added to `total`.
fn window(log: &Log, total: &mut Window) -> Window {
    let recent = std::mem::take(&mut *log.lock().unwrap());
    let mut took: Vec<Duration> = recent.iter().map(|r| r.took).collect();
    took.sort();
    let pick = |q: f64| {
        took.get(((took.len() as f64 * q).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or_default()
    };
    let w = Window {
        count: recent.len(),
        failed: recent.iter().filter(|r| !r.ok).count(),
        p50: pick(0.5),
        p99: pick(0.99),
    };
    total.count += w.count;
    total.failed += w.failed;
    w
}

fn duration_from_env() -> Duration {
    Duration::from_secs(
        std::env::var("LB_SOAK_SECONDS")
            .ok()
            .map_or(150, |s| s.parse().expect("LB_SOAK_SECONDS: whole seconds")),
    )
}

/// `cargo xtask soak` writes to target/soak; the suite's short run to
/// target/soak-suite, so it never overwrites a long run's report.
fn report_dir() -> PathBuf {
    std::env::var_os("LB_SOAK_REPORT").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/soak-suite"),
        PathBuf::from,
    )
}

/// Written beside and renamed over, as config management does: the agent
/// never reads a half-written file.
fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn agent_pid(node: &Node) -> u32 {
    node.agent
        .as_ref()
        .and_then(lb_testkit::agent::Agent::pid)
        .expect("the agent runs")
}

// Not in `./xtask.sh test`: CI has an hour and the suite uses most of it.
// It found a conntrack sweep race (about one NodePort request in 30 000
// unanswered under this churn), fixed since; an hour-long run on `ca943ae`
// failed none of 16.6 M requests (docs/reliability.md, docs/soak/).
// `cargo xtask soak` runs it.
#[test]
#[ignore = "longer than CI's hour allows; run by cargo xtask soak (docs/reliability.md)"]
fn soak_under_service_churn_and_agent_restarts_fails_no_request_and_grows_nothing() {
    let total = duration_from_env();
    assert!(
        total >= Duration::from_secs(60),
        "LB_SOAK_SECONDS: at least 60 (restarts, then a third of the run on one agent)"
    );
    // Restarts in the first two thirds only, at least three of them.
    let restarts_until = total * 2 / 3;
    let restart_every = (restarts_until / 4).min(Duration::from_secs(300));
    let sample_every = (total / 60).clamp(Duration::from_secs(2), Duration::from_secs(30));
    eprintln!(
        "soak: {total:?}, the agent restarted every {restart_every:?}, a sample every {sample_every:?}"
    );

    let mut c = Cluster::new(&unique("soak"));
    let mut pods = Pods {
        netns: c.pod_b.name.clone(),
        servers: POD_B.iter().map(|_| None).collect(),
    };
    for pod in 0..POD_B.len() {
        pods.start(pod);
    }
    // Short conntrack lifetimes after FIN and a fixed sweep, so the table
    // can be seen back at its baseline minutes, not hours, after the load.
    let args = [
        "--conntrack-timeout-tcp-fin",
        "2s",
        "--conntrack-gc-interval",
        "2s",
    ];
    let base = services(&[0, 1, 2], &[], &[]);
    Cluster::start(&mut c.a, &base, &args);
    let baseline_maps = map_entries(&c.a.pins.path);

    let started = Instant::now();
    let (socket_log, packet_log): (Log, Log) = (Log::default(), Log::default());
    let stop = Arc::new(AtomicBool::new(false));
    let loads = Loads {
        threads: vec![
            socket_load(&c, stop.clone(), socket_log.clone()),
            packet_load(&c, stop.clone(), packet_log.clone()),
        ],
        stop,
    };
    // The first agent's footprint under load, before any churn; after
    // tokio's start-up blocking threads have gone (they linger 10 s).
    std::thread::sleep(Duration::from_secs(11));
    let baseline_agent = process(agent_pid(&c.a));

    let mut samples = Vec::new();
    let (mut socket_total, mut packet_total) = (Window::default(), Window::default());
    // What the loads did before the churn starts counts too.
    window(&socket_log, &mut socket_total);
    window(&packet_log, &mut packet_total);
    let mut churn: Vec<usize> = Vec::new();
    // Pods scaled away, and the tick at which each is removed.
    let mut terminating: Vec<(usize, usize)> = Vec::new();
    let mut serving: &[usize] = WEB_SCALE[0];
    let (mut serial, mut tick, mut removals) = (0usize, 0usize, 0usize);
    let churn_started = Instant::now();
    let (mut next_sample, mut next_restart) =
        (churn_started + sample_every, churn_started + restart_every);
    let mut restarts = 0;
    let churn_until = churn_started + total;
    while Instant::now() < churn_until {
        loads.check_running();
        // Churn: new services, the oldest deleted, web rescaled.
        for _ in 0..CHURN_PER_TICK {
            churn.push(serial);
            serial += 1;
        }
        if churn.len() > CHURN_LIVE {
            churn.drain(..churn.len() - CHURN_LIVE);
        }
        let web = WEB_SCALE[tick % WEB_SCALE.len()];
        for pod in serving.iter().filter(|p| !web.contains(p)) {
            terminating.push((*pod, tick + TERMINATING_TICKS));
        }
        serving = web;
        // A pod back in the service serves before the agent hears of it.
        for pod in web {
            pods.start(*pod);
        }
        terminating.retain(|(pod, _)| !web.contains(pod));
        let removed: Vec<usize> = terminating
            .iter()
            .filter(|(_, until)| *until <= tick)
            .map(|(p, _)| *p)
            .collect();
        terminating.retain(|(_, until)| *until > tick);
        tick += 1;
        let going: Vec<usize> = terminating.iter().map(|(p, _)| *p).collect();
        write_atomically(&c.a.services, &services(web, &going, &churn));
        // A removed pod had been terminating for TERMINATING_TICKS: no new
        // flow went to it since, so it can go at once.
        for pod in removed {
            pods.remove(pod);
            removals += 1;
        }

        let now = Instant::now();
        if now >= next_restart && now < churn_started + restarts_until {
            let agent = c.a.agent.as_mut().unwrap();
            if restarts % 2 == 0 {
                agent.kill();
            } else {
                assert!(
                    agent.terminate(Duration::from_secs(10)).is_some(),
                    "the agent did not stop on SIGTERM within 10 s"
                );
            }
            agent.restart();
            restarts += 1;
            next_restart = now + restart_every;
        }
        if now >= next_sample {
            let maps = map_entries(&c.a.pins.path);
            let pid = agent_pid(&c.a);
            samples.push(Sample {
                at: started.elapsed(),
                pid,
                agent: process(pid),
                services: entries_of(&maps, lb_common::maps::LB4_SERVICES),
                backends: entries_of(&maps, lb_common::maps::LB4_BACKENDS),
                conntrack: entries_of(&maps, lb_common::maps::LB4_CT),
                churned_live: churn.len(),
                socket: window(&socket_log, &mut socket_total),
                packet: window(&packet_log, &mut packet_total),
            });
            next_sample = now + sample_every;
        }
        std::thread::sleep(Duration::from_secs(1));
    }

    // The churn stops: the services as they were at the start, every pod
    // serving again.
    for pod in 0..POD_B.len() {
        pods.start(pod);
    }
    write_atomically(&c.a.services, &base);
    let back = wait_until(Duration::from_secs(30), || {
        let now = map_entries(&c.a.pins.path);
        [
            lb_common::maps::LB4_SERVICES,
            lb_common::maps::LB4_BACKENDS,
            lb_common::maps::LB4_REVNAT,
        ]
        .iter()
        .all(|m| entries_of(&now, m) == entries_of(&baseline_maps, m))
    });
    // The load runs on a little over the base services, then stops.
    std::thread::sleep(Duration::from_secs(5));
    loads.stop();
    window(&socket_log, &mut socket_total);
    window(&packet_log, &mut packet_total);

    // Every map back at its baseline: the conntrack table once its flows
    // expired (2 s after their FIN, swept every 2 s).
    let mut last_maps = Vec::new();
    let settled = wait_until(Duration::from_secs(60), || {
        last_maps = map_entries(&c.a.pins.path);
        last_maps == baseline_maps
    });
    // tokio's blocking threads linger 10 s after their last job.
    std::thread::sleep(Duration::from_secs(11));
    let final_agent = process(agent_pid(&c.a));

    let report = write_report(
        &Summary {
            total,
            restarts,
            created: serial,
            removals,
            socket: socket_total,
            packet: packet_total,
            baseline: baseline_agent,
            last: final_agent,
        },
        &samples,
    );
    eprintln!("{report}");

    assert!(back, "the base services did not come back within 30 s");
    assert!(restarts >= 3, "only {restarts} restarts in {total:?}");
    assert!(
        removals >= 2,
        "only {removals} pods were removed after terminating: the scaling did not run"
    );
    assert!(
        socket_total.count >= 100 && packet_total.count >= 100,
        "the loads ran: {} socket-path and {} packet-path requests",
        socket_total.count,
        packet_total.count
    );
    assert_eq!(
        (socket_total.failed, packet_total.failed),
        (0, 0),
        "failed requests (socket path, packet path) of ({}, {})",
        socket_total.count,
        packet_total.count
    );
    assert!(
        settled,
        "maps not back at their baseline 60 s after the load stopped: {:?}",
        differing(&baseline_maps, &last_maps)
    );
    // The same services on a restarted agent: its heap may be laid out
    // otherwise, but a leak over the churn would be far beyond this.
    assert!(
        final_agent.rss_kib <= baseline_agent.rss_kib * 5 / 4 + 2048,
        "the agent's RSS grew: {} KiB → {} KiB",
        baseline_agent.rss_kib,
        final_agent.rss_kib
    );
    assert!(
        final_agent.fds <= baseline_agent.fds + 2,
        "the agent's file descriptors grew: {} → {}",
        baseline_agent.fds,
        final_agent.fds
    );
    assert!(
        final_agent.threads <= baseline_agent.threads + 2,
        "the agent's threads grew: {} → {}",
        baseline_agent.threads,
        final_agent.threads
    );
}

/// The run as a whole, for the report's opening.
struct Summary {
    total: Duration,
    restarts: usize,
    created: usize,
    removals: usize,
    socket: Window,
    packet: Window,
    baseline: Process,
    last: Process,
}

/// Writes report.md and soak.svg to `report_dir()`; returns the markdown.
fn write_report(run: &Summary, samples: &[Sample]) -> String {
    let mut md = format!(
        "# Soak\n\n{:.0} s of churn with load through both paths; {} services created and deleted at \
         {CHURN_PER_TICK} a second (at most {CHURN_LIVE} alive), web rescaled every second ({} pods \
         removed after terminating for {TERMINATING_TICKS} s), the agent restarted {} times \
         (SIGKILL and SIGTERM in turn).\n\n\
         Requests: socket path {} ({} failed), packet path {} ({} failed).\n\n\
         The agent before the churn (the first agent, under load) and at the end (the last \
         agent, after the churn, base services back, load stopped): RSS {} → {} KiB, file \
         descriptors {} → {}, threads {} → {}.\n\n![soak](soak.svg)\n\n\
         Each row covers the interval since the row before. LB4_CT is counted by walking the \
         map while the sweep deletes, which can count an entry twice: read it as a trend.\n\n\
         | s | agent | RSS MiB | fds | threads | LB4_SERVICES | LB4_BACKENDS | LB4_CT | churned alive | \
         socket req | p50 ms | p99 ms | failed | packet req | p50 ms | p99 ms | failed |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        run.total.as_secs_f64(),
        run.created,
        run.removals,
        run.restarts,
        run.socket.count,
        run.socket.failed,
        run.packet.count,
        run.packet.failed,
        run.baseline.rss_kib,
        run.last.rss_kib,
        run.baseline.fds,
        run.last.fds,
        run.baseline.threads,
        run.last.threads,
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for s in samples {
        let _ = writeln!(
            md,
            "| {:.0} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {} | {} | {:.2} | {:.2} | {} |",
            s.at.as_secs_f64(),
            s.pid,
            s.agent.rss_kib as f64 / 1024.0,
            s.agent.fds,
            s.agent.threads,
            s.services,
            s.backends,
            s.conntrack,
            s.churned_live,
            s.socket.count,
            ms(s.socket.p50),
            ms(s.socket.p99),
            s.socket.failed,
            s.packet.count,
            ms(s.packet.p50),
            ms(s.packet.p99),
            s.packet.failed,
        );
    }
    let dir = report_dir();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("report.md"), &md).unwrap();
    std::fs::write(dir.join("soak.svg"), svg(samples)).unwrap();
    md
}

/// Four panels over time: the agent's RSS; map entries; request latency
/// p50/p99 on both paths; failed requests per interval.
fn svg(samples: &[Sample]) -> String {
    type Series<'a> = (&'a str, &'a str, Vec<f64>);
    let (w, panel_h, left, top) = (900.0, 160.0, 60.0, 30.0);
    let t: Vec<f64> = samples.iter().map(|s| s.at.as_secs_f64()).collect();
    let t_max = t.last().copied().unwrap_or(1.0).max(1.0);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let panels: Vec<(&str, Vec<Series>)> = vec![
        (
            "agent RSS (MiB)",
            vec![(
                "RSS",
                "#1f77b4",
                samples
                    .iter()
                    .map(|s| s.agent.rss_kib as f64 / 1024.0)
                    .collect(),
            )],
        ),
        (
            "map entries",
            vec![
                (
                    "LB4_SERVICES",
                    "#2ca02c",
                    samples.iter().map(|s| s.services as f64).collect(),
                ),
                (
                    "LB4_BACKENDS",
                    "#ff7f0e",
                    samples.iter().map(|s| s.backends as f64).collect(),
                ),
                (
                    "LB4_CT",
                    "#9467bd",
                    samples.iter().map(|s| s.conntrack as f64).collect(),
                ),
            ],
        ),
        (
            "request latency (ms)",
            vec![
                (
                    "socket p50",
                    "#17becf",
                    samples.iter().map(|s| ms(s.socket.p50)).collect(),
                ),
                (
                    "socket p99",
                    "#1f77b4",
                    samples.iter().map(|s| ms(s.socket.p99)).collect(),
                ),
                (
                    "packet p50",
                    "#bcbd22",
                    samples.iter().map(|s| ms(s.packet.p50)).collect(),
                ),
                (
                    "packet p99",
                    "#d62728",
                    samples.iter().map(|s| ms(s.packet.p99)).collect(),
                ),
            ],
        ),
        (
            "failed requests per interval",
            vec![
                (
                    "socket",
                    "#1f77b4",
                    samples.iter().map(|s| s.socket.failed as f64).collect(),
                ),
                (
                    "packet",
                    "#d62728",
                    samples.iter().map(|s| s.packet.failed as f64).collect(),
                ),
            ],
        ),
    ];
    let height = top + panels.len() as f64 * (panel_h + 40.0);
    let mut o = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let plot_w = w - left - 20.0;
    for (i, (title, series)) in panels.iter().enumerate() {
        let y0 = top + i as f64 * (panel_h + 40.0);
        let y_max = series
            .iter()
            .flat_map(|(_, _, v)| v.iter().copied())
            .fold(0.0f64, f64::max)
            .max(1.0)
            * 1.1;
        let _ = writeln!(
            o,
            "<text x=\"{left}\" y=\"{}\" font-weight=\"bold\">{title}</text>\n\
             <rect x=\"{left}\" y=\"{y0}\" width=\"{plot_w}\" height=\"{panel_h}\" fill=\"none\" stroke=\"#999\"/>\n\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{y_max:.1}</text>\n\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">0</text>\n\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{t_max:.0} s</text>",
            y0 - 6.0,
            left - 4.0,
            y0 + 10.0,
            left - 4.0,
            y0 + panel_h,
            left + plot_w,
            y0 + panel_h + 14.0,
        );
        for (k, (name, colour, values)) in series.iter().enumerate() {
            let points: Vec<String> = t
                .iter()
                .zip(values)
                .map(|(t, v)| {
                    format!(
                        "{:.1},{:.1}",
                        left + t / t_max * plot_w,
                        y0 + panel_h - v / y_max * panel_h
                    )
                })
                .collect();
            let _ = writeln!(
                o,
                "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>\n\
                 <text x=\"{}\" y=\"{}\" fill=\"{colour}\">{name}</text>",
                points.join(" "),
                left + 200.0 + k as f64 * 110.0,
                y0 - 6.0,
            );
        }
    }
    o.push_str("</svg>\n");
    o
}
