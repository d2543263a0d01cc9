//! lb-cluster: the tests' real control plane, kept running for hands-on use.
//!
//!   lb-cluster up       start etcd, kube-apiserver and kube-controller-manager
//!                       (lb-testkit `k8s::ControlPlane`) in a network namespace
//!                       of their own, install deploy/kubernetes, write
//!                       kubeconfigs to target/cluster/, and return
//!   lb-cluster up --node
//!                       the same with the scheduler, every controller and a
//!                       real node (containerd, kubelet: lb-testkit `node`),
//!                       the agent running as the DaemonSet's pod, and CoreDNS
//!   lb-cluster up --nodes N
//!                       N such nodes, each in a network namespace of its own
//!                       on a bridge with an outside client (lb-testkit
//!                       `fabric`), the agent on every node (helm install)
//!   lb-cluster down     stop it and remove its namespace
//!   lb-cluster status   is it up, and how to use it
//!
//! `up` starts `lb-cluster serve` in the background (its own session), which
//! owns the processes: they die with it (PR_SET_PDEATHSIG).
use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

fn state_dir() -> PathBuf {
    lb_testkit::sibling_bin_dir().join("../cluster")
}

fn pid() -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(state_dir().join("pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: signal 0 only checks the process exists.
    (unsafe { libc::kill(pid, 0) } == 0).then_some(pid)
}

fn usage() -> ! {
    eprintln!("usage: lb-cluster up [--node|--nodes N]|down|status");
    std::process::exit(2)
}

/// How many nodes `up`/`serve` are asked for: none (a control plane only),
/// 1 (`--node`) or N (`--nodes N`).
fn nodes_arg(args: &[String]) -> usize {
    match args.first().map(String::as_str) {
        None => 0,
        Some("--node") => 1,
        Some("--nodes") => args
            .get(1)
            .and_then(|n| n.parse().ok())
            .filter(|n| *n >= 1)
            .unwrap_or_else(|| usage()),
        Some(_) => usage(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = args.first().cloned().unwrap_or_else(|| usage());
    match arg.as_str() {
        "up" => up(nodes_arg(&args[1..])),
        "down" => down(),
        "status" => status(),
        "serve" => serve(nodes_arg(&args[1..])),
        _ => usage(),
    }
}

fn up(nodes: usize) {
    if let Some(p) = pid() {
        println!("already up (pid {p})");
        status();
        return;
    }
    let dir = state_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let _ = std::fs::remove_file(dir.join("ready"));
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.arg("serve")
        .args(
            (nodes > 0)
                .then(|| ["--nodes".to_string(), nodes.to_string()])
                .into_iter()
                .flatten(),
        )
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    use std::os::unix::process::CommandExt as _;
    // SAFETY: setsid is async-signal-safe: a session of its own, so the
    // shell that ran `up` can end.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    // Once up, serve is meant to outlive this process (a daemon in a session
    // of its own; `down` stops it): it is not waited for.
    #[allow(clippy::zombie_processes)]
    let mut child = cmd.spawn().expect("starting lb-cluster serve");
    let deadline = Instant::now() + Duration::from_secs(600);
    while !dir.join("ready").exists() {
        if let Ok(Some(s)) = child.try_wait() {
            eprintln!(
                "lb-cluster serve exited with {s}:\n{}",
                std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
            );
            std::process::exit(1);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!(
                "the cluster did not come up in 10 minutes; see {}",
                dir.join("serve.log").display()
            );
            std::process::exit(1);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    status();
}

/// What `serve` keeps running until SIGTERM.
enum Running {
    Plane(lb_testkit::k8s::ControlPlane),
    Nodes(Box<lb_testkit::kube_cluster::Cluster>),
}

fn serve(nodes: usize) {
    use lb_testkit::{k8s, kube_cluster::Cluster};
    let dir = state_dir();
    std::fs::write(dir.join("pid"), std::process::id().to_string()).unwrap();
    // With a node, the agent runs as the DaemonSet's pod there; without,
    // the manifests only provide its RBAC for an agent started by hand.
    let running = match nodes {
        0 => {
            let cp = k8s::ControlPlane::start("cluster");
            k8s::install_manifests(&cp);
            Running::Plane(cp)
        }
        1 => Running::Nodes(Box::new(Cluster::start("cluster", "lb-node"))),
        n => Running::Nodes(Box::new(Cluster::start_nodes("cluster", n))),
    };
    let cp = match &running {
        Running::Plane(cp) => cp,
        Running::Nodes(c) => &c.cp,
    };
    if let Running::Nodes(c) = &running {
        // Where each node and the outside client live, for `status`.
        let mut places = String::new();
        for n in &c.nodes {
            places.push_str(&format!(
                "node {} {} {} {}\n",
                n.name, n.ip, n.netns_name, n.pod_cidr
            ));
        }
        if let Some(client) = &c.client {
            places.push_str(&format!("client {}\n", client.name));
        }
        std::fs::write(dir.join("nodes"), places).unwrap();
    }
    std::fs::copy(cp.admin_kubeconfig(), dir.join("admin.kubeconfig")).unwrap();
    let agent = cp.service_account_kubeconfig("kube-system", "lb-agent");
    std::fs::copy(agent, dir.join("lb-agent.kubeconfig")).unwrap();
    std::fs::write(dir.join("netns"), &cp.netns.name).unwrap();
    std::fs::write(dir.join("ready"), "").unwrap();
    // Until SIGTERM (lb-cluster down): then drop everything.
    // SAFETY: an all-zero sigset_t is a valid (empty) set.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: a local signal set; SIGTERM/SIGINT blocked and waited for.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let mut sig = 0;
        libc::sigwait(&set, &mut sig);
    }
    drop(running);
    for f in [
        "pid",
        "ready",
        "netns",
        "admin.kubeconfig",
        "lb-agent.kubeconfig",
        "nodes",
    ] {
        let _ = std::fs::remove_file(dir.join(f));
    }
}

fn down() {
    let Some(p) = pid() else {
        println!("not running");
        return;
    };
    // SAFETY: a plain signal to the serve process.
    unsafe { libc::kill(p, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while pid().is_some() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    if pid().is_some() {
        // SAFETY: as above.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    println!("down");
}

fn status() {
    let dir = state_dir();
    match pid() {
        None => println!("not running (cargo xtask cluster up)"),
        Some(p) => {
            let ns = std::fs::read_to_string(dir.join("netns")).unwrap_or_default();
            let kubectl = lb_testkit::sibling_bin_dir().join("../testbed/kubectl");
            println!("up (pid {p}), in network namespace {ns}");
            println!(
                "  ip netns exec {ns} {} --kubeconfig {} get nodes,services -A",
                kubectl.display(),
                dir.join("admin.kubeconfig").display()
            );
            println!(
                "  the agent's ServiceAccount (RBAC from deploy/kubernetes): {}",
                dir.join("lb-agent.kubeconfig").display()
            );
            let places = std::fs::read_to_string(dir.join("nodes")).unwrap_or_default();
            for line in places.lines() {
                let f: Vec<&str> = line.split_whitespace().collect();
                match f.as_slice() {
                    ["node", name, ip, netns, cidr] => println!(
                        "  node {name}: InternalIP {ip}, pods {cidr}; its shell: ip netns exec {netns} sh"
                    ),
                    ["client", netns] => println!(
                        "  an outside client on the fabric: ip netns exec {netns} sh"
                    ),
                    _ => {}
                }
            }
        }
    }
}
