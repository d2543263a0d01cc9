//! lb-demo: the standalone demo behind `cargo xtask demo`.
//!
//! Builds a client namespace and three backend namespaces (never touching the
//! root namespace or a real interface), starts lb-agent on a child cgroup with
//! the embedded services file, sends traffic through the service addresses,
//! shows `lbctl service list`, changes the file live, kills the agent to show
//! traffic keeps flowing, and cleans everything up, also on failure.
use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use lb_testkit::{
    agent::{Agent, PinDir},
    cgroup::ChildCgroup,
    probe::{self, Attempt},
    servers,
    topology::{Topology, CLIENT_IP},
    unique,
};

const DEFAULT_SERVICES: &str = include_str!("../../demo/services.yaml");

fn step(n: u32, title: &str) {
    println!("\n== {n}. {title}");
}

fn tally(attempts: &[Attempt]) -> String {
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for a in attempts {
        let key = match (a.ok, a.backend()) {
            (true, Some(b)) => b.to_string(),
            _ => format!("failed ({})", a.error.clone().unwrap_or_default()),
        };
        *by.entry(key).or_default() += 1;
    }
    by.iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn main() {
    if let Err(e) = run() {
        eprintln!("lb-demo: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let services_text = match std::env::args().nth(1).as_deref() {
        Some("--services") => {
            std::fs::read_to_string(std::env::args().nth(2).expect("--services FILE"))?
        }
        _ => DEFAULT_SERVICES.to_string(),
    };
    let tag = unique("demo");

    step(
        1,
        "Topology (network namespaces only; nothing in the root namespace)",
    );
    let topo = Topology::new(&tag, 3);
    println!(
        "client  {:<22} {CLIENT_IP}  (route to 10.96.0.0/12 is a blackhole)",
        topo.client.name
    );
    for (i, b) in topo.backends.iter().enumerate() {
        println!("backend {:<22} {}", b.name, Topology::backend_ip(i));
    }
    let _tcp: Vec<_> = (0..3)
        .map(|i| {
            servers::tcp(
                &topo.backends[i].name,
                format!("{}:8080", Topology::backend_ip(i)).parse().unwrap(),
                &format!("b{}", i + 1),
            )
        })
        .collect();
    let _udp = servers::udp(
        &topo.backends[1].name,
        format!("{}:5353", Topology::backend_ip(1)).parse().unwrap(),
        "b2",
    );
    let cgroup = ChildCgroup::create(&tag);
    let pins = PinDir::create(&tag);
    let services = std::env::temp_dir().join(format!("lb-demo-{tag}.yaml"));
    std::fs::write(&services, &services_text)?;
    let _cleanup_file = RemoveOnDrop(services.clone());

    step(2, "Services file");
    print!("{services_text}");

    step(3, "Start lb-agent");
    println!(
        "lb-agent --services {} --cgroup {} --pin-dir {}",
        services.display(),
        cgroup.path.display(),
        pins.path.display()
    );
    let mut agent = Agent::start(&services, &cgroup.path, &pins.path);
    println!(
        "attached connect4, sendmsg4, recvmsg4, getpeername4 to {}",
        cgroup.path.display()
    );

    step(4, "lbctl service list");
    print!("{}", agent.lbctl(&["service", "list"]));

    let probe = |mode: &str, target: &str, n: usize| {
        probe::run(&cgroup.path, &topo.client.name, mode, target, n)
    };

    step(
        5,
        "30 TCP connects to 10.96.0.10:80 from the client namespace",
    );
    let attempts = probe("tcp", "10.96.0.10:80", 30);
    println!("answered by  {}", tally(&attempts));
    if let Some(a) = attempts.first() {
        println!(
            "backend saw  {} (the client's own address: no SNAT)",
            a.seen_client().unwrap_or("?")
        );
        println!(
            "getpeername  {} (the service address, though the socket talks to a backend)",
            a.peer.as_deref().unwrap_or("?")
        );
    }

    step(6, "UDP sendto 10.96.0.53:53 (unconnected socket)");
    let a = &probe("udp", "10.96.0.53:53", 1)[0];
    println!(
        "answered by  {}; recvfrom() says the reply came from {}",
        a.backend().unwrap_or("?"),
        a.reply_from.as_deref().unwrap_or("?")
    );

    step(7, "A service without backends refuses the connection (Kubernetes' reject), and the drop is visible");
    let mut monitor = Command::new(lb_testkit::sibling_bin("lbctl"))
        .args(["monitor", "--type", "drop", "--count", "1", "--pin-dir"])
        .arg(&pins.path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut listening = String::new();
    BufReader::new(monitor.stderr.take().unwrap()).read_line(&mut listening)?;
    println!("$ lbctl monitor --type drop");
    let a = &probe("tcp", "10.96.0.99:80", 1)[0];
    let mut line = String::new();
    BufReader::new(monitor.stdout.take().unwrap()).read_line(&mut line)?;
    let _ = monitor.wait();
    print!("{line}");
    println!(
        "(the client saw: connect 10.96.0.99:80 -> {})",
        a.error.as_deref().unwrap_or("connected?!")
    );
    println!("$ lbctl drops");
    print!("{}", agent.lbctl(&["drops"]));
    println!(
        "$ curl {}/metrics | grep -E '^lb_(drops_total|services|frontends|backends) '",
        agent.metrics
    );
    let (_, metrics) = agent.http_get("/metrics");
    for l in metrics.lines().filter(|l| {
        (l.starts_with("lb_drops_total") && !l.ends_with(" 0"))
            || l.starts_with("lb_services ")
            || l.starts_with("lb_frontends ")
            || l.starts_with("lb_backends ")
    }) {
        println!("{l}");
    }

    step(8, "Edit the services file: remove backend 10.250.0.11");
    std::fs::write(
        &services,
        services_text.replacen("      - address: 10.250.0.11\n", "", 1),
    )?;
    agent.wait_for_log("reconciled", 2, Duration::from_secs(10));
    println!(
        "{}",
        agent
            .log_text()
            .lines()
            .rfind(|l| l.contains("reconciled"))
            .unwrap_or("")
    );
    print!("{}", agent.lbctl(&["service", "list"]));
    println!("answered by  {}", tally(&probe("tcp", "10.96.0.10:80", 30)));

    step(9, "SIGKILL the agent: the kernel keeps forwarding");
    agent.kill();
    println!(
        "agent killed; answered by  {}",
        tally(&probe("tcp", "10.96.0.10:80", 30))
    );

    step(10, "Clean up: lb-agent uninstall, namespaces, cgroup");
    drop(agent);
    drop(pins);
    println!("done");
    Ok(())
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
