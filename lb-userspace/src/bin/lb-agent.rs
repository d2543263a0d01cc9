//! lb-agent: the node agent. Installs the data path, then keeps the maps in
//! line with the services file. The data path stays when the agent stops.
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use lb::{
    datapath::{self, DatapathConfig, MapSizes},
    maps::bpf::BpfMaps,
    reconcile::Reconciler,
    source, sys,
};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info, warn};

#[derive(Parser)]
#[command(name = "lb-agent", version, about = "eBPF service load balancer: node agent")]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Install the data path and follow the services file (the default).
    Run(RunArgs),
    /// Detach every program and remove every pinned map and link.
    Uninstall {
        #[arg(long, default_value_os_t = datapath::pins::default_pin_dir())]
        pin_dir: PathBuf,
    },
}

#[derive(Args, Clone)]
struct RunArgs {
    /// Services file (YAML) of standalone mode.
    #[arg(long, value_name = "FILE")]
    services: Option<PathBuf>,
    /// cgroup v2 directory to attach the socket hooks to [default: the cgroup2 root from /proc/mounts].
    #[arg(long, value_name = "DIR")]
    cgroup: Option<PathBuf>,
    /// Where maps and links are pinned (on bpffs).
    #[arg(long, value_name = "DIR", default_value_os_t = datapath::pins::default_pin_dir())]
    pin_dir: PathBuf,
    /// Capacity of LB4_SERVICES (one entry per frontend plus one per backend slot) and LB4_REVNAT.
    #[arg(long, default_value_t = MapSizes::default().services)]
    map_size_services: u32,
    /// Capacity of LB4_BACKENDS.
    #[arg(long, default_value_t = MapSizes::default().backends)]
    map_size_backends: u32,
    /// Capacity of LB4_SOCK_REVNAT (sockets with a translated peer).
    #[arg(long, default_value_t = MapSizes::default().sock_revnat)]
    map_size_sock_revnat: u32,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LB_LOG").unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Uninstall { pin_dir }) => {
            let report = datapath::uninstall(&pin_dir)?;
            println!(
                "removed links [{}] and maps [{}] from {}",
                report.links.join(", "),
                report.maps.join(", "),
                pin_dir.display()
            );
            Ok(())
        }
        Some(Command::Run(args)) => run(args),
        None => run(cli.run),
    }
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let services = args
        .services
        .clone()
        .context("--services FILE is required (standalone mode reads services from a file)")?;
    let cgroup = match &args.cgroup {
        Some(c) => c.clone(),
        None => sys::fs::cgroup2_mount()?,
    };
    let cfg = DatapathConfig {
        pin_dir: args.pin_dir.clone(),
        cgroup,
        sizes: MapSizes {
            services: args.map_size_services,
            backends: args.map_size_backends,
            revnat: args.map_size_services,
            sock_revnat: args.map_size_sock_revnat,
        },
    };
    let report = datapath::install(&cfg)?;
    info!(pin_dir = %cfg.pin_dir.display(), maps_reused = report.maps_reused, "data path installed");

    let maps = BpfMaps::open(&cfg.pin_dir)?;
    let mut reconciler = Reconciler::restore(maps)?;
    info!(entries = reconciler.state().services.len(), backends = reconciler.state().backends.len(), "restored state from pinned maps");

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let (_watcher, mut changes) = source::file::watch(&services)?;
        let mut hup = signal(SignalKind::hangup())?;
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        sync(&services, &mut reconciler);
        loop {
            tokio::select! {
                Some(()) = changes.recv() => {
                    // Editors write in several steps: let them finish.
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    while changes.try_recv().is_ok() {}
                    sync(&services, &mut reconciler);
                }
                _ = hup.recv() => {
                    info!("SIGHUP: re-reading the services file");
                    sync(&services, &mut reconciler);
                }
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
        info!("stopping; the data path stays installed and keeps forwarding");
        anyhow::Ok(())
    })
}

fn sync(path: &std::path::Path, reconciler: &mut Reconciler<BpfMaps>) {
    let model = match source::file::load(path) {
        Ok(m) => m,
        Err(e) => {
            error!("{e}; keeping the last good state in the maps");
            return;
        }
    };
    match reconciler.reconcile(&model) {
        Ok(stats) => info!(
            services = model.services.len(),
            frontends = model.frontend_count(),
            changed = stats.services_changed,
            writes = stats.ops,
            full_sync = stats.full_sync,
            took_us = stats.duration.as_micros() as u64,
            "reconciled"
        ),
        Err(e) => warn!("reconcile failed: {e}"),
    }
}
