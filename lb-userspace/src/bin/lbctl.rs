//! lbctl: inspect the load balancer from its pinned maps. Works whether or
//! not the agent is running; needs root (bpffs pins are root-only).
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use lb::{
    cli::{self, Output},
    datapath,
    maps::{bpf::BpfMaps, LbMaps as _},
};

#[derive(Parser)]
#[command(name = "lbctl", version, about = "Inspect the eBPF service load balancer")]
struct Cli {
    /// Where the agent pinned its maps.
    #[arg(long, global = true, default_value_os_t = datapath::pins::default_pin_dir())]
    pin_dir: PathBuf,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Services and their backends.
    Service {
        #[command(subcommand)]
        command: ServiceCommand,
    },
    /// Drop counters by reason and direction.
    Drops,
}

#[derive(Subcommand)]
enum ServiceCommand {
    /// List every frontend with its backends.
    List,
}

fn main() {
    if let Err(e) = run() {
        eprintln!("lbctl: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    check_access(&cli.pin_dir)?;
    match cli.command {
        Command::Service { command: ServiceCommand::List } => {
            let state = BpfMaps::open(&cli.pin_dir)?.dump()?;
            let rows = cli::service_list::rows(&state);
            match cli.output {
                Output::Table => print!("{}", cli::service_list::render_table(&rows)),
                Output::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
            }
        }
        Command::Drops => {
            let counts = lb::maps::bpf::read_drops(&cli.pin_dir)?;
            match cli.output {
                Output::Table => print!("{}", cli::drops::render_table(&counts)),
                Output::Json => println!("{}", serde_json::to_string_pretty(&counts)?),
            }
        }
    }
    Ok(())
}

fn check_access(pin_dir: &std::path::Path) -> anyhow::Result<()> {
    if unsafe { libc::geteuid() } != 0 {
        anyhow::bail!("lbctl reads BPF maps and needs root (try sudo lbctl ...)");
    }
    if !pin_dir.exists() {
        anyhow::bail!(
            "nothing is pinned at {}: the agent has not installed the data path there (start lb-agent, or pass --pin-dir)",
            pin_dir.display()
        );
    }
    Ok(())
}
