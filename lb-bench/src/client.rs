//! The measuring client: a process of its own, because joining a cgroup
//! moves a whole process and the socket hooks apply by cgroup. It joins the
//! cgroup, enters the namespace, then connects and resets in a loop,
//! timing each connect() (the TCP handshake, including whatever translation
//! the variant does on the way), and prints one JSON line.
use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, Socket, Type};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long)]
    cgroup: std::path::PathBuf,
    /// A named namespace (`ip netns`), or a namespace file's path, e.g. a
    /// pod's `/proc/PID/ns/net`.
    #[arg(long)]
    netns: String,
    /// Dialed in turn (the backends, for the direct variant: the same spread
    /// over the servers as through a service).
    #[arg(long, value_delimiter = ',')]
    target: Vec<SocketAddr>,
    /// At most this many connects...
    #[arg(long)]
    count: usize,
    /// ...and for at most this long.
    #[arg(long)]
    millis: u64,
    /// How long one connect may take before it counts as failed.
    #[arg(long, default_value_t = 1_000)]
    timeout_ms: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Sample {
    /// connect() durations of the successful attempts, in nanoseconds.
    pub latencies_ns: Vec<u64>,
    pub failed: usize,
    /// The first failure, for the report's notes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// Wall time of the whole loop.
    pub elapsed_ns: u64,
}

pub fn main(a: Args) {
    std::fs::write(a.cgroup.join("cgroup.procs"), "0").expect("joining the cgroup");
    lb_testkit::netns::enter(&a.netns).expect("entering the namespace");
    let deadline = Duration::from_millis(a.millis);
    let mut latencies = Vec::with_capacity(a.count.min(1 << 20));
    let mut failed = 0;
    let mut first_error = None;
    let started = Instant::now();
    for i in 0..a.count {
        let target = a.target[i % a.target.len()];
        if started.elapsed() >= deadline {
            break;
        }
        let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).expect("socket");
        // Close with RST: no TIME_WAIT, so ports never run out however many
        // connects a round makes.
        s.set_linger(Some(Duration::ZERO)).unwrap();
        let t = Instant::now();
        match s.connect_timeout(&target.into(), Duration::from_millis(a.timeout_ms)) {
            Ok(()) => latencies.push(t.elapsed().as_nanos() as u64),
            Err(e) => {
                failed += 1;
                first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    let sample = Sample {
        latencies_ns: latencies,
        failed,
        first_error,
        elapsed_ns: started.elapsed().as_nanos() as u64,
    };
    println!("{}", serde_json::to_string(&sample).unwrap());
}

/// Runs the client as a child process of this very binary.
pub fn run(
    cgroup: &std::path::Path,
    netns: &str,
    targets: &[SocketAddr],
    count: usize,
    millis: u64,
) -> Sample {
    run_with_timeout(
        cgroup,
        netns,
        targets,
        count,
        millis,
        Duration::from_secs(1),
    )
}

/// `run` with another limit for one connect.
pub fn run_with_timeout(
    cgroup: &std::path::Path,
    netns: &str,
    targets: &[SocketAddr],
    count: usize,
    millis: u64,
    timeout: Duration,
) -> Sample {
    let target: Vec<String> = targets
        .iter()
        .map(std::string::ToString::to_string)
        .collect();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("connect-client")
        .arg("--cgroup")
        .arg(cgroup)
        .args([
            "--netns",
            netns,
            "--target",
            &target.join(","),
            "--count",
            &count.to_string(),
            "--millis",
            &millis.to_string(),
            "--timeout-ms",
            &timeout.as_millis().to_string(),
        ])
        .output()
        .expect("running the client");
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("client output")
}
