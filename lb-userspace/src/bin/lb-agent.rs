//! lb-agent: the node agent. Installs the data path, then keeps the maps in
//! line with a source: a services file (standalone mode) or the Kubernetes
//! apiserver. The data path stays when the agent stops. This file parses
//! the command line; the agent itself is `lb::agent` (`flags`, `process`).
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use lb::{
    agent::{flags::RunArgs, process},
    datapath,
    net::Cidr,
};

#[derive(Parser)]
#[command(
    name = "lb-agent",
    version,
    about = "eBPF service load balancer: node agent"
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    /// Log lines as text (coloured only on a terminal, and never with
    /// NO_COLOR set) or as JSON objects for log shippers.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "LB_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Install the data path and follow the source (the default).
    Run(Box<RunArgs>),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion { shell: clap_complete::Shell },
    /// Detach every program and remove every pinned map and link.
    Uninstall {
        #[arg(long, default_value_os_t = datapath::pins::default_pin_dir(), env = "LB_PIN_DIR")]
        pin_dir: PathBuf,
    },
    /// Remove kube-proxy's leftovers from this node once kube-proxy is
    /// stopped: KUBE-* iptables chains (legacy and nft), its nftables
    /// tables, the kube-ipvs0 device, and conntrack entries of service addresses.
    CleanupKubeProxy {
        /// The cluster's service CIDRs (kube-apiserver --service-cluster-ip-range):
        /// conntrack entries DNATed to them are deleted.
        #[arg(long, value_delimiter = ',', value_name = "CIDR,...")]
        service_cidr: Vec<Cidr>,
        /// Only report what would be removed.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn init_logging(format: LogFormat) {
    use std::io::IsTerminal as _;
    // Records from the eBPF programs (target lb_ebpf::...) are filtered at the
    // source by --bpf-log-level / `lbctl config set bpf-log-level`; let all of
    // them through here unless LB_LOG says otherwise.
    let mut filter = std::env::var("LB_LOG").unwrap_or_else(|_| "info".into());
    if !filter.contains("lb_ebpf") {
        filter.push_str(",lb_ebpf=trace");
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => {
            // Colour codes only for a person at a terminal (https://no-color.org).
            let colour = std::io::stderr().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
            builder.with_ansi(colour).init();
        }
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Some(Command::CleanupKubeProxy {
            service_cidr,
            dry_run,
        }) => {
            let r = lb::migrate::cleanup(&service_cidr, dry_run)?;
            let verb = if dry_run { "would remove" } else { "removed" };
            for line in &r.iptables {
                println!("{verb} iptables: {line}");
            }
            for t in &r.nftables_tables {
                println!("{verb} nftables table {t}");
            }
            if r.ipvs_device {
                println!("{verb} the kube-ipvs0 device");
            }
            for c in &r.conntrack {
                println!("{verb} conntrack entries to {c}");
            }
            for s in &r.skipped {
                println!("skipped {s}");
            }
            if r.iptables.is_empty() && r.nftables_tables.is_empty() && !r.ipvs_device {
                println!("no kube-proxy rules or devices found");
            }
            Ok(())
        }
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
        Some(Command::Completion { shell }) => {
            use clap::CommandFactory as _;
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "lb-agent",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Some(Command::Run(args)) => process::run(*args),
        None => process::run(cli.run),
    }
}
