//! lbctl: inspect the load balancer from its pinned maps. Works whether or
//! not the agent is running; needs root (bpffs pins are root-only). Only
//! `config set` and `monitor --type trace` write anything.
use std::{
    io::Write as _,
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
};

use anyhow::bail;
use clap::{Parser, Subcommand, ValueEnum};
use lb::{
    cli::{self, Output},
    datapath::{
        self,
        config::{ConfigSlots as _, RuntimeConfig},
    },
    maps::{bpf::BpfMaps, LbMaps as _},
    monitor::{self, reader::EventReader},
};
use lb_common::config::CFG_TRACE;

#[derive(Parser)]
#[command(
    name = "lbctl",
    version,
    about = "Inspect the eBPF service load balancer"
)]
struct Cli {
    /// Where the agent pinned its maps.
    #[arg(long, global = true, default_value_os_t = datapath::pins::default_pin_dir(), env = "LB_PIN_DIR")]
    pin_dir: PathBuf,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Services (frontends) and their backends.
    Service {
        #[command(subcommand)]
        command: ServiceCommand,
    },
    /// Backends.
    Backend {
        #[command(subcommand)]
        command: BackendCommand,
    },
    /// Drop counters by reason and direction (the non-zero ones).
    Drops {
        /// Every counter, zeros included.
        #[arg(long)]
        all: bool,
    },
    /// This lbctl's release and map layout, the data path's and the agent's;
    /// fails when they do not match.
    Version,
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion { shell: clap_complete::Shell },
    /// Kernel features, attached programs and map fill.
    Status,
    /// Stream drop (and, when asked, translation) events as they happen.
    Monitor {
        #[arg(long = "type", value_enum, default_value_t = MonitorType::Drop)]
        kind: MonitorType,
        /// Exit after this many events.
        #[arg(long)]
        count: Option<usize>,
    },
    /// North-south connection tracking (NodePort, LoadBalancer, external IPs).
    Ct {
        #[command(subcommand)]
        command: CtCommand,
    },
    /// Maglev lookup tables of services that use them.
    Maglev {
        #[command(subcommand)]
        command: MaglevCommand,
    },
    /// The busiest frontends now (connects, flows, packets and bits per
    /// second, from the data path's counters), refreshed until Ctrl-C.
    Top {
        /// Time between refreshes.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        interval: std::time::Duration,
        /// Exit after this many refreshes (as top -n).
        #[arg(short = 'n', long)]
        count: Option<usize>,
        /// Frontends shown.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        #[arg(long, value_enum, default_value_t = cli::top::SortBy::Connects)]
        sort: cli::top::SortBy,
    },
    /// What the packet path does now with a packet from outside of this
    /// tuple (lbctl trace tcp 203.0.113.7:41000 192.168.1.10:30080): its
    /// frontend, conntrack entry, source-range verdict, affinity entry,
    /// Maglev slot or random choice, and the backend or drop reason.
    /// Reads the pinned maps only.
    Trace {
        #[arg(value_enum)]
        protocol: TraceProtocol,
        source: std::net::SocketAddr,
        destination: std::net::SocketAddr,
    },
    /// Run-time settings of the programs (log level, tracing, event rate).
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum TraceProtocol {
    Tcp,
    Udp,
}

#[derive(Subcommand)]
enum ServiceCommand {
    /// List every frontend with its backends.
    List {
        /// What the data path counted per frontend instead of the
        /// backends: connects (socket path), flows, packets and bytes
        /// (packet path), since the frontend was made.
        #[arg(long)]
        stats: bool,
    },
    /// One service, by id or frontend (10.96.0.10:80, 10.96.0.10:80/TCP, [fd00::10]:53/UDP).
    Get { service: String },
}

#[derive(Subcommand)]
enum BackendCommand {
    /// List every backend.
    List,
}

#[derive(Subcommand)]
enum CtCommand {
    /// List the live flows and reverse entries (expired ones wait for the
    /// agent's sweep: --all shows them too).
    List {
        #[arg(long)]
        all: bool,
    },
}

#[derive(Subcommand)]
enum MaglevCommand {
    /// Slots per backend in one service's table, by id or frontend.
    Get { service: String },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Show every setting.
    Get,
    /// Change a setting: bpf-log-level (off..trace), trace (on/off), event-rate (per second per CPU).
    Set { key: String, value: String },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MonitorType {
    /// Drops only (always on in the data path).
    Drop,
    /// Translations only (switches tracing on while the monitor runs).
    Trace,
    /// Both.
    All,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn main() {
    if let Err(e) = run() {
        eprintln!("lbctl: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let out = cli.output;
    if let Command::Completion { shell } = cli.command {
        use clap::CommandFactory as _;
        clap_complete::generate(shell, &mut Cli::command(), "lbctl", &mut std::io::stdout());
        return Ok(());
    }
    if let Command::Version = cli.command {
        // Works without root: it reads directory names and the status file.
        let r = cli::version::gather(&cli.pin_dir);
        match out {
            Output::Table => print!("{}", cli::version::render(&r)),
            Output::Json => println!("{}", serde_json::to_string_pretty(&r)?),
        }
        if !r.problems().is_empty() {
            std::process::exit(1);
        }
        return Ok(());
    }
    if let Command::Status = cli.command {
        // Status works without root and without pins: it says what is missing.
        let status = cli::status::gather(&cli.pin_dir);
        match out {
            Output::Table => print!("{}", cli::status::render_table(&status)),
            Output::Json => println!("{}", serde_json::to_string_pretty(&status)?),
        }
        if !status.ok() {
            std::process::exit(1);
        }
        return Ok(());
    }
    check_access(&cli.pin_dir)?;
    match cli.command {
        Command::Service { command } => {
            let state = BpfMaps::open(&cli.pin_dir)?.dump()?;
            let rows = cli::service_list::rows(&state);
            let with_stats = matches!(command, ServiceCommand::List { stats: true });
            let rows: Vec<_> = match command {
                ServiceCommand::List { .. } => rows.iter().collect(),
                ServiceCommand::Get { service } => {
                    let found = cli::service_list::find(&rows, &service);
                    if found.is_empty() {
                        bail!("no service {service:?}: give a service id or a frontend like 10.96.0.10:80/TCP (see lbctl service list)");
                    }
                    found
                }
            };
            let mut rows: Vec<_> = rows.into_iter().cloned().collect();
            if with_stats {
                let stats = lb::maps::stats::read(&cli.pin_dir)?;
                cli::service_list::add_stats(&mut rows, &stats);
            }
            match out {
                Output::Table if with_stats => {
                    print!("{}", cli::service_list::render_stats_table(&rows));
                }
                Output::Table => print!("{}", cli::service_list::render_table(&rows)),
                Output::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
            }
        }
        Command::Backend {
            command: BackendCommand::List,
        } => {
            let state = BpfMaps::open(&cli.pin_dir)?.dump()?;
            let rows = cli::backend_list::rows(&state);
            match out {
                Output::Table => print!("{}", cli::backend_list::render_table(&rows)),
                Output::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
            }
        }
        Command::Drops { all } => {
            let mut counts = lb::maps::bpf::read_drops(&cli.pin_dir)?;
            if !all {
                counts.retain(|c| c.packets > 0);
            }
            match out {
                Output::Table if counts.is_empty() => {
                    println!("No drops counted (--all shows every counter).");
                }
                Output::Table => print!("{}", cli::drops::render_table(&counts)),
                Output::Json => println!("{}", serde_json::to_string_pretty(&counts)?),
            }
        }
        Command::Ct {
            command: CtCommand::List { all },
        } => {
            let v4 = lb::maps::bpf::read_ct::<u32>(&cli.pin_dir, lb_common::maps::LB4_CT)?;
            // Pins of an agent from before IPv6 north-south have no LB6_CT.
            let v6 = if cli.pin_dir.join(lb_common::maps::LB6_CT).exists() {
                lb::maps::bpf::read_ct::<[u32; 4]>(&cli.pin_dir, lb_common::maps::LB6_CT)?
            } else {
                Vec::new()
            };
            let config = lb::datapath::config::RuntimeConfig::open(&cli.pin_dir)?;
            let timeouts = lb::conntrack::timeouts(&config)?;
            let now = monitor::reader::monotonic_ns();
            let mut rows = cli::conntrack::rows(&v4, now, &timeouts);
            rows.extend(cli::conntrack::rows(&v6, now, &timeouts));
            if !all {
                rows.retain(|r| r.expires_s >= 0);
            }
            match out {
                Output::Table => print!("{}", cli::conntrack::render_table(&rows)),
                Output::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
            }
        }
        Command::Maglev {
            command: MaglevCommand::Get { service },
        } => {
            let state = BpfMaps::open(&cli.pin_dir)?.dump()?;
            let rows = cli::service_list::rows(&state);
            let Some(found) = cli::service_list::find(&rows, &service)
                .first()
                .map(|r| r.id)
            else {
                bail!("no service {service:?}: give a service id or a frontend like 10.96.0.10:80/TCP (see lbctl service list)");
            };
            let Some(summary) = cli::maglev::summary(&state, found) else {
                bail!("service {found} has no Maglev table: it selects backends at random (set `algorithm: maglev` in the services file or the lb.dev/algorithm=maglev annotation on the Service)");
            };
            match out {
                Output::Table => print!("{}", cli::maglev::render_table(&summary)),
                Output::Json => println!("{}", serde_json::to_string_pretty(&summary)?),
            }
        }
        Command::Config { command } => {
            let mut config = RuntimeConfig::open(&cli.pin_dir)?;
            if let ConfigCommand::Set { key, value } = &command {
                let setting = datapath::config::setting(key)?;
                config.set(
                    setting.index,
                    datapath::config::parse_value(setting, value)?,
                )?;
            }
            let all = config.all()?;
            match out {
                Output::Table => print!("{}", cli::config::render_table(&all)),
                Output::Json => println!("{}", cli::config::to_json(&all)),
            }
        }
        Command::Monitor { kind, count } => monitor(&cli.pin_dir, kind, count, out)?,
        Command::Trace {
            protocol,
            source,
            destination,
        } => {
            let protocol = match protocol {
                TraceProtocol::Tcp => lb::model::Protocol::Tcp,
                TraceProtocol::Udp => lb::model::Protocol::Udp,
            };
            let now = monitor::reader::monotonic_ns();
            let t = cli::trace::trace(&cli.pin_dir, protocol, source, destination, now)?;
            match out {
                Output::Table => print!("{}", cli::trace::render(&t)),
                Output::Json => println!("{}", serde_json::to_string_pretty(&t)?),
            }
        }
        Command::Top {
            interval,
            count,
            limit,
            sort,
        } => top(&cli.pin_dir, interval, count, limit, sort, out)?,
        Command::Status | Command::Version | Command::Completion { .. } => unreachable!(),
    }
    Ok(())
}

fn monitor(
    pin_dir: &std::path::Path,
    kind: MonitorType,
    count: Option<usize>,
    out: Output,
) -> anyhow::Result<()> {
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let mut reader = EventReader::open(pin_dir)?;
    // Tracing costs an event per translation: on only while someone watches.
    let mut config = RuntimeConfig::open(pin_dir)?;
    let previous_trace = config.get(CFG_TRACE)?;
    let wants_trace = kind != MonitorType::Drop;
    if wants_trace {
        config.set(CFG_TRACE, 1)?;
    }
    eprintln!(
        "Listening for {} events on {}... Press Ctrl-C to quit",
        match kind {
            MonitorType::Drop => "drop",
            MonitorType::Trace => "trace",
            MonitorType::All => "drop and trace",
        },
        pin_dir.display()
    );
    let mut seen = 0usize;
    let stdout = std::io::stdout();
    let result = reader.run(&STOP, |e| {
        let wanted = match kind {
            MonitorType::Drop => e.kind == "drop",
            MonitorType::Trace => e.kind == "trace",
            MonitorType::All => true,
        };
        if wanted {
            let line = match out {
                Output::Table => monitor::format_line(&e),
                Output::Json => serde_json::to_string(&e).unwrap_or_default(),
            };
            let mut lock = stdout.lock();
            let _ = writeln!(lock, "{line}");
            let _ = lock.flush();
            seen += 1;
        }
        count.is_none_or(|c| seen < c)
    });
    if wants_trace {
        config.set(CFG_TRACE, previous_trace)?;
    }
    result
}

/// `lbctl top`: reads the counters every `interval` and shows the rates
/// since the reading before; on a terminal each refresh replaces the last,
/// elsewhere (a pipe, `-o json`: one object per line) they follow each other.
fn top(
    pin_dir: &std::path::Path,
    interval: std::time::Duration,
    count: Option<usize>,
    limit: usize,
    sort: cli::top::SortBy,
    out: Output,
) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let Some(stats) = lb::maps::stats::StatsMap::open(pin_dir)? else {
        bail!("the data path at {} has no per-service counters (LB_SVC_STATS): it is from an older release; restart lb-agent with this release", pin_dir.display());
    };
    let maps = BpfMaps::open(pin_dir)?;
    let clear = out == Output::Table && std::io::stdout().is_terminal();
    let mut before = stats.read_all()?;
    let mut at = std::time::Instant::now();
    let mut shown = 0usize;
    let mut frontends: Option<Vec<cli::service_list::ServiceRow>> = None;
    let mut known_ids: Vec<u32> = Vec::new();
    while count.is_none_or(|c| shown < c) {
        // Sleep in short steps so Ctrl-C is not kept waiting.
        let until = at + interval;
        while std::time::Instant::now() < until && !STOP.load(Ordering::Relaxed) {
            std::thread::sleep(
                (until - std::time::Instant::now()).min(std::time::Duration::from_millis(100)),
            );
        }
        if STOP.load(Ordering::Relaxed) {
            break;
        }
        let now = stats.read_all()?;
        let now_at = std::time::Instant::now();
        let secs = (now_at - at).as_secs_f64();
        // The frontends are read again only when the set of counted ones
        // changed (services came or went): a dump of every map is heavy at
        // 100 000 services, the counters' keys are not.
        let ids: Vec<u32> = now.keys().copied().collect();
        if frontends.is_none() || ids != known_ids {
            frontends = Some(cli::service_list::rows(&maps.dump()?));
            known_ids = ids;
        }
        let frontends = frontends.as_deref().unwrap_or_default();
        let all = cli::top::rows(frontends, &before, &now, secs, sort, usize::MAX);
        let rows = &all[..all.len().min(limit)];
        let mut lock = std::io::stdout().lock();
        match out {
            Output::Table => {
                if clear {
                    let _ = write!(lock, "\x1b[H\x1b[2J");
                }
                let _ = write!(lock, "{}", cli::top::render(rows, secs, all.len(), sort));
                if !clear {
                    let _ = writeln!(lock);
                }
            }
            Output::Json => {
                let line = serde_json::json!({ "interval_s": secs, "active": all.len(), "frontends": rows });
                let _ = writeln!(lock, "{line}");
            }
        }
        let _ = lock.flush();
        (before, at) = (now, now_at);
        shown += 1;
    }
    Ok(())
}

fn check_access(pin_dir: &std::path::Path) -> anyhow::Result<()> {
    // SAFETY: geteuid(2) cannot fail and takes no arguments.
    if unsafe { libc::geteuid() } != 0 {
        bail!("lbctl reads BPF maps and needs root (try sudo lbctl ...)");
    }
    if !pin_dir.exists() {
        bail!(
            "nothing is pinned at {}: the agent has not installed the data path there (start lb-agent, or pass --pin-dir)",
            pin_dir.display()
        );
    }
    Ok(())
}
