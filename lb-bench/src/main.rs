//! lb-bench: the load balancer side by side with kube-proxy's own rule
//! layouts, in one run on one machine, reported as ratios.
//!
//!   lb-bench [--profile full|quick|smoke] [--out FILE]
//!
//! Every part sets up its own network namespaces, child cgroups and pin
//! directories and removes them afterwards; nothing touches the root cgroup,
//! a real interface, or sends a packet that could leave the machine.
//! `cargo xtask bench` builds it in release mode and runs it as root.
mod apiserver;
mod bed_traffic;
mod client;
mod connect;
mod control;
mod file_edit;
mod kube_memory;
mod kube_proxy;
mod maglev;
mod map_writes;
mod memory;
mod northsouth;
mod packet;
mod packet_per_run;
mod profile;
mod prom;
mod propagation;
mod report;
mod stats;
mod workload;

use std::path::PathBuf;

#[global_allocator]
static ALLOC: memory::CountingAlloc = memory::CountingAlloc;

use clap::{Parser, Subcommand};
use profile::Profile;

#[derive(Parser)]
#[command(
    name = "lb-bench",
    about = "Benchmarks against kube-proxy's iptables and nftables layouts"
)]
struct Cli {
    /// full: every scale of the issue (about 15 minutes); quick: under 3
    /// minutes; smoke: seconds, proves the bench still works (CI).
    #[arg(long, value_enum, default_value_t = profile::Name::Full)]
    profile: profile::Name,
    /// Where the Markdown report goes [default: docs/benchmarks.md for full,
    /// target/benchmarks-<profile>.md otherwise].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Only these parts (connect, control, file, packet, maglev, northsouth, propagation, memory, bed); default all.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// The propagation part at these numbers of services instead of the
    /// profile's (e.g. 10000: one scale redone alone).
    #[arg(long, value_delimiter = ',')]
    propagation_services: Vec<usize>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Internal: the measuring client, run inside a cgroup and a namespace.
    #[command(hide = true)]
    ConnectClient(client::Args),
    /// Internal: Kubernetes mode's heap (`kube_memory::breakdown`) in a
    /// fresh process, printed as JSON.
    #[command(hide = true)]
    KubeMemory {
        services: usize,
        endpoints: usize,
        /// The objects as watch events after empty lists, not as a list.
        #[arg(long)]
        watched: bool,
    },
    /// Internal: Kubernetes mode through the real apiserver at one count
    /// (`kube_memory::scale`), printed as JSON: one row of the memory part
    /// alone, to compare changes without the whole run.
    #[command(hide = true)]
    KubeScale { services: usize },
    /// Internal: one kind of connect in a loop, to profile beside it.
    #[command(hide = true)]
    ProfileConnect {
        /// plain, backend, elsewhere or vip.
        #[arg(long)]
        dial: String,
        #[arg(long, default_value_t = 10)]
        services: usize,
        #[arg(long, default_value_t = 20)]
        seconds: u64,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Some(Command::ConnectClient(args)) = cli.command {
        client::main(args);
        return;
    }
    if let Some(Command::KubeMemory {
        services,
        endpoints,
        watched,
    }) = cli.command
    {
        let b = kube_memory::breakdown(services, endpoints, watched);
        println!("{}", serde_json::to_string(&b).unwrap());
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("lb-bench: loads BPF programs and creates network namespaces: run as root (cargo xtask bench)");
        std::process::exit(1);
    }
    if let Some(Command::KubeScale { services }) = cli.command {
        let limit =
            std::time::Duration::from_secs(Profile::new(cli.profile).kube_proxy_sync_limit_s);
        let s = kube_memory::scale(services, limit, &[]);
        println!("{}", serde_json::to_string(&s).unwrap());
        return;
    }
    if let Some(Command::ProfileConnect {
        dial,
        services,
        seconds,
    }) = cli.command
    {
        connect::profile(&dial, services, seconds);
        return;
    }
    let mut p = Profile::new(cli.profile);
    if !cli.propagation_services.is_empty() {
        p.propagation_services.clone_from(&cli.propagation_services);
    }
    let wants = |part: &str| cli.only.is_empty() || cli.only.iter().any(|o| o == part);
    let started = std::time::Instant::now();
    let mut r = report::Report::new(&p, std::env::args().collect::<Vec<_>>().join(" "));
    if wants("maglev") {
        eprintln!("lb-bench: Maglev table builds");
        r.maglev = maglev::run(&p);
    }
    if wants("packet") {
        eprintln!("lb-bench: tc/XDP ns per packet (BPF_PROG_TEST_RUN)");
        r.packet = packet::run(&p);
    }
    if wants("control") {
        eprintln!("lb-bench: control plane (full sync, one endpoint change)");
        r.control = control::run(&p);
        eprintln!("lb-bench: what a full sync's writes cost, by map flags, batch and threads");
        r.map_writes = map_writes::run(p.map_write_elements);
    }
    if wants("file") {
        eprintln!("lb-bench: standalone mode, a services-file edit to the maps");
        r.file_edit = file_edit::run(&p);
    }
    if wants("northsouth") {
        eprintln!("lb-bench: north-south traffic through a NodePort vs routing");
        r.northsouth = northsouth::run(&p);
    }
    if wants("propagation") {
        eprintln!(
            "lb-bench: propagation delay on a real control plane (pod readiness → map entry)"
        );
        r.propagation = propagation::run(&p);
    }
    if wants("bed") {
        eprintln!("lb-bench: traffic on the two-node test bed, the agent and the real kube-proxy");
        r.bed = bed_traffic::run(&p);
    }
    if wants("memory") {
        eprintln!("lb-bench: where the agent's heap goes");
        r.breakdown = p
            .memory_breakdown
            .iter()
            .map(|&(n, e)| memory::breakdown(n, e))
            .collect();
        eprintln!("lb-bench: Kubernetes mode's heap, fed recorded apiserver objects");
        r.kube_breakdown = p
            .kube_memory
            .iter()
            .map(|&(n, e)| kube_memory::breakdown_apart(n, e))
            .collect();
        let limit = std::time::Duration::from_secs(p.kube_proxy_sync_limit_s);
        for &n in &p.kube_scale {
            eprintln!("lb-bench: Kubernetes mode at {n} services through the real apiserver");
            // A kube-proxy mode that did not sync at a smaller scale is not
            // waited for again at a larger one.
            let skip: Vec<String> = r
                .kube_scale
                .iter()
                .flat_map(|k| &k.kube_proxy)
                .filter(|kp| !kp.synced)
                .map(|kp| kp.mode.clone())
                .collect();
            r.kube_scale.push(kube_memory::scale(n, limit, &skip));
        }
    }
    if wants("connect") {
        eprintln!("lb-bench: connect through a service address");
        r.connect = connect::run(&p);
    }
    r.total = started.elapsed();
    let text = r.render();
    let out = cli.out.unwrap_or_else(|| p.default_out());
    if let Some(dir) = out.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    std::fs::write(&out, &text).unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    print!("{text}");
    eprintln!(
        "lb-bench: report written to {} ({:.0?})",
        out.display(),
        r.total
    );
}
