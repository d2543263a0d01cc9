//! lb-pod-server: the test servers (`lb_testkit::servers`, `traffic`) as a
//! program that runs in a pod of the Kubernetes test bed (image
//! `node::POD_SERVER_IMAGE`), so that cross-node traffic reaches real pods:
//!
//!   lb-pod-server [--name NAME] [--tcp PORT] [--udp PORT] [--bulk PORT] [--echo PORT] [--drain SECS]
//!
//! `--tcp` and `--udp` answer every connection or datagram with
//! "<name> <peer ip:port>" (the name defaults to $POD_NAME, then the host
//! name); `--bulk` speaks the bulk protocol of `traffic` (downloads and
//! uploads with every byte checked); `--echo` keeps each connection open and
//! answers every line with "<name> <line>". On SIGTERM it keeps serving for
//! `--drain` seconds (default 0), as a backend that delays its shutdown until
//! the proxies stopped sending it new connections, then exits.
//!
//!   lb-pod-server --hold-udp ADDR:PORT
//!
//! is a client instead: a resolver's UDP socket, connected once and read
//! until the kernel aborts it (a proxy destroying a socket pinned to a
//! removed backend); it prints "aborted: <error>" and exits.
use std::net::SocketAddr;

use lb_testkit::{servers, traffic};

fn usage() -> ! {
    eprintln!(
        "usage: lb-pod-server [--name NAME] [--tcp PORT] [--udp PORT] [--bulk PORT] [--echo PORT] [--drain SECS]\n       lb-pod-server --hold-udp ADDR:PORT"
    );
    std::process::exit(2)
}

fn main() {
    let mut name = std::env::var("POD_NAME").ok();
    let (mut tcp, mut udp, mut bulk, mut echo, mut drain) = (None, None, None, None, 0u64);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage());
        let mut port = || -> u16 { value().parse().unwrap_or_else(|_| usage()) };
        match a.as_str() {
            "--tcp" => tcp = Some(port()),
            "--udp" => udp = Some(port()),
            "--bulk" => bulk = Some(port()),
            "--echo" => echo = Some(port()),
            "--name" => name = Some(value()),
            "--drain" => drain = value().parse().unwrap_or_else(|_| usage()),
            "--hold-udp" => hold_udp(value().parse().unwrap_or_else(|_| usage())),
            _ => usage(),
        }
    }
    let name = name.unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map_or_else(|_| "pod".into(), |h| h.trim().to_string())
    });
    // SIGTERM is waited for below: block it before any thread starts.
    // SAFETY: an all-zero sigset_t is a valid (empty) set, filled below.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: a local signal set; SIGTERM and SIGINT blocked in every thread.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    let any = |port: u16| SocketAddr::from(([0, 0, 0, 0], port));
    let mut running = Vec::new();
    if let Some(p) = tcp {
        running.push(servers::tcp(servers::HERE, any(p), &name));
    }
    if let Some(p) = udp {
        running.push(servers::udp(servers::HERE, any(p), &name));
    }
    if let Some(p) = bulk {
        running.push(traffic::bulk_server(servers::HERE, any(p)));
    }
    if let Some(p) = echo {
        running.push(servers::tcp_echo(servers::HERE, any(p), &name));
    }
    if running.is_empty() {
        usage();
    }
    eprintln!("lb-pod-server {name}: serving tcp {tcp:?} udp {udp:?} bulk {bulk:?} echo {echo:?}");
    let mut sig = 0;
    // SAFETY: waits for one of the signals blocked above.
    unsafe { libc::sigwait(&set, &mut sig) };
    eprintln!("lb-pod-server {name}: signal {sig}, serving {drain} s more");
    std::thread::sleep(std::time::Duration::from_secs(drain));
    // The servers' threads stop with the process.
    std::process::exit(0)
}

/// Connects a UDP socket to `target` and reads until it fails.
fn hold_udp(target: SocketAddr) -> ! {
    let socket = std::net::UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0)))
        .and_then(|s| s.connect(target).map(|()| s))
        .unwrap_or_else(|e| {
            eprintln!("lb-pod-server: connecting to {target}: {e}");
            std::process::exit(1)
        });
    println!("connected to {target}");
    let mut buf = [0u8; 512];
    loop {
        if let Err(e) = socket.recv(&mut buf) {
            println!("aborted: {e}");
            std::process::exit(0)
        }
    }
}
