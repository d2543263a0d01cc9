//! lb-agent: the node agent. Installs the data path, then keeps the maps in
//! line with the services file. The data path stays when the agent stops.
use std::{net::SocketAddr, path::PathBuf, time::{Duration, Instant}};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use lb::{
    datapath::{self, config::RuntimeConfig, DatapathConfig, MapSizes},
    maps::{bpf::BpfMaps, LbMaps as _},
    metrics::{self, Metrics},
    reconcile::Reconciler,
    source, sys,
};
use lb_common::config::{CFG_EVENT_RATE, CFG_LOG_LEVEL};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{signal, SignalKind},
};
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
    /// Capacity of LB4/6_SERVICES (one entry per frontend plus one per backend slot) and LB4/6_REVNAT.
    #[arg(long, default_value_t = MapSizes::default().services)]
    map_size_services: u32,
    /// Capacity of LB4/6_BACKENDS.
    #[arg(long, default_value_t = MapSizes::default().backends)]
    map_size_backends: u32,
    /// Capacity of LB4/6_SOCK_REVNAT (sockets with a translated peer).
    #[arg(long, default_value_t = MapSizes::default().sock_revnat)]
    map_size_sock_revnat: u32,
    /// Address of /metrics and /healthz. Loopback unless you choose otherwise.
    #[arg(long, default_value = "127.0.0.1:9967")]
    metrics_address: SocketAddr,
    /// /healthz turns unhealthy when an observed change is not in the maps after this long.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    healthz_grace: Duration,
    /// Log level of the eBPF programs (off, error, warn, info, debug, trace); debug covers hot paths.
    #[arg(long, default_value = "warn")]
    bpf_log_level: String,
    /// Drop/trace events per second per CPU before rate limiting.
    #[arg(long, default_value_t = lb_common::config::DEFAULT_EVENT_RATE)]
    event_rate: u32,
}

fn main() -> anyhow::Result<()> {
    // Records from the eBPF programs (target lb_ebpf::...) are filtered at the
    // source by --bpf-log-level / `lbctl config set bpf-log-level`; let all of
    // them through here unless LB_LOG says otherwise.
    let mut filter = std::env::var("LB_LOG").unwrap_or_else(|_| "info".into());
    if !filter.contains("lb_ebpf") {
        filter.push_str(",lb_ebpf=trace");
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
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
    let log_level = datapath::config::parse_value(datapath::config::setting("bpf-log-level")?, &args.bpf_log_level)
        .context("--bpf-log-level")?;
    if args.event_rate == 0 {
        anyhow::bail!("--event-rate must be at least 1");
    }
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
    let mut config = RuntimeConfig::open(&cfg.pin_dir)?;
    config.set(CFG_LOG_LEVEL, log_level)?;
    config.set(CFG_EVENT_RATE, args.event_rate)?;

    let maps = BpfMaps::open(&cfg.pin_dir)?;
    let mut reconciler = Reconciler::restore(maps)?;
    info!(entries = reconciler.state().services.len(), backends = reconciler.state().backends.len(), "restored state from pinned maps");

    let (metrics, registry) = Metrics::new(cfg.pin_dir.clone());
    metrics.health.lock().unwrap().installed = true;

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let health = metrics.health.clone();
        let addr = args.metrics_address;
        let grace = args.healthz_grace;
        tokio::spawn(async move {
            if let Err(e) = metrics::server::serve(addr, registry, health, grace).await {
                error!("{e:#}");
            }
        });
        if let Some(logger) = report.logger {
            tokio::spawn(forward_bpf_logs(logger));
        }

        let (_watcher, mut changes) = source::file::watch(&services)?;
        let mut hup = signal(SignalKind::hangup())?;
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        sync(&services, &mut reconciler, &metrics, Instant::now());
        loop {
            tokio::select! {
                Some(()) = changes.recv() => {
                    let observed = Instant::now();
                    metrics.observed_change();
                    // Editors write in several steps: let them finish.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    while changes.try_recv().is_ok() {}
                    sync(&services, &mut reconciler, &metrics, observed);
                }
                _ = hup.recv() => {
                    info!("SIGHUP: re-reading the services file");
                    metrics.observed_change();
                    sync(&services, &mut reconciler, &metrics, Instant::now());
                }
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
        info!("stopping; the data path stays installed and keeps forwarding");
        anyhow::Ok(())
    })
}

/// Forwards the programs' aya-log records to tracing (through the `log` crate).
async fn forward_bpf_logs(logger: aya_log::EbpfLogger<&'static dyn log::Log>) {
    // SAFETY: the logger owns the ring buffer's fd for its whole life and
    // always returns that same fd.
    let mut fd = match unsafe { AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE) } {
        Ok(fd) => fd,
        Err(e) => {
            warn!("cannot poll eBPF logs: {e}");
            return;
        }
    };
    loop {
        let Ok(mut guard) = fd.readable_mut().await else { return };
        guard.get_inner_mut().flush();
        guard.clear_ready();
    }
}

fn sync(path: &std::path::Path, reconciler: &mut Reconciler<BpfMaps>, metrics: &Metrics, observed: Instant) {
    let model = match source::file::load(path) {
        Ok(m) => m,
        Err(e) => {
            let reason = match e {
                source::file::LoadError::Read { .. } => "unreadable",
                source::file::LoadError::Invalid { .. } => "invalid",
            };
            error!("{e}; keeping the last good state in the maps");
            metrics.source_error("file", reason, e.to_string());
            return;
        }
    };
    match reconciler.reconcile(&model) {
        Ok(stats) => {
            metrics.reconciled(&stats, Some(observed), reconciler.state(), model.services.len(), reconciler.maps().capacity());
            info!(
                services = model.services.len(),
                frontends = model.frontend_count(),
                changed = stats.services_changed,
                writes = stats.ops,
                full_sync = stats.full_sync,
                took_us = stats.duration.as_micros() as u64,
                "reconciled"
            )
        }
        Err(e) => {
            warn!("reconcile failed: {e}");
            metrics.reconcile_failed(e.to_string());
        }
    }
}
