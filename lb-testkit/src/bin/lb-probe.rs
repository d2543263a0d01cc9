//! lb-probe: a client that runs inside a given cgroup and network namespace,
//! dials an address some number of times and prints one JSON line per attempt.
//!
//!   lb-probe --cgroup DIR --netns NAME tcp|udp|udp-connected ADDR:PORT [COUNT]
//!   lb-probe --cgroup DIR --netns NAME udp-held|udp-sendto-held|tcp-held ADDR:PORT
//!   lb-probe --cgroup DIR --netns NAME udp-fanout ADDR:PORT,ADDR:PORT,... [ROUNDS]
//!
//! The `-held` modes keep one socket and ask through it once per line read
//! from stdin: a resolver that connected its UDP socket once, one that
//! sends every query with sendto() on an unconnected socket (as QUIC
//! clients and many resolvers do), a long-lived TCP connection (the server
//! must echo lines).
//!
//! It joins the cgroup first (so the socket hooks apply to it), then the
//! network namespace, both before creating any socket.
//!
//! `udp-fanout` sends from one unconnected socket to every target, then
//! reads every answer, ROUNDS times (a resolver or a metrics client talking
//! to many services through one socket), one line per answer.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream, UdpSocket},
    time::Duration,
};

use lb_testkit::probe::Attempt;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: lb-probe --cgroup DIR --netns NAME tcp|tcp-blocking|udp|udp-connected ADDR:PORT [COUNT]";
    if args.len() < 7 || args[1] != "--cgroup" || args[3] != "--netns" {
        eprintln!("{usage}");
        std::process::exit(2);
    }
    let (cgroup, netns, mode) = (&args[2], &args[4], args[5].as_str());
    let targets: Vec<SocketAddr> = args[6]
        .split(',')
        .map(|t| t.parse().expect("ADDR:PORT"))
        .collect();
    let target = targets[0];
    let count: usize = args.get(7).map_or(1, |c| c.parse().expect("COUNT"));

    std::fs::write(format!("{cgroup}/cgroup.procs"), "0").expect("joining the cgroup");
    lb_testkit::netns::enter(netns).expect("entering the network namespace");

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if mode == "udp-held" {
        held(target, &mut out, true);
        return;
    }
    if mode == "udp-sendto-held" {
        held(target, &mut out, false);
        return;
    }
    if mode == "tcp-held" {
        tcp_held(target, &mut out);
        return;
    }
    if mode == "udp-fanout" {
        let s = udp_socket(target);
        for _ in 0..count {
            // Every datagram out first, then every answer: a reply then
            // arrives after datagrams to the other targets.
            let sent: Vec<_> = targets.iter().map(|t| s.send_to(b"ping", t)).collect();
            for r in sent {
                let attempt = udp_answer(&s, r, false);
                writeln!(out, "{}", serde_json::to_string(&attempt).unwrap()).unwrap();
            }
        }
        return;
    }
    for _ in 0..count {
        let started = std::time::Instant::now();
        let mut attempt = match mode {
            "tcp" => tcp(target),
            "tcp-blocking" => tcp_blocking(target),
            "udp" => udp(target, false),
            "udp-connected" => udp(target, true),
            _ => {
                eprintln!("{usage}");
                std::process::exit(2);
            }
        };
        attempt.micros = Some(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
        writeln!(out, "{}", serde_json::to_string(&attempt).unwrap()).unwrap();
    }
}

/// A blocking connect() and nothing else: when it fails, the kernel
/// disconnects the socket (net/ipv4/af_inet.c, `__inet_stream_connect`
/// calls tcp_disconnect), which clears its destination; a connect with a
/// timeout (non-blocking) leaves it.
fn tcp_blocking(target: SocketAddr) -> Attempt {
    match TcpStream::connect(target) {
        Ok(c) => Attempt {
            ok: true,
            peer: c.peer_addr().ok().map(|a| a.to_string()),
            ..Default::default()
        },
        Err(e) => failed(e),
    }
}

fn held(target: SocketAddr, out: &mut impl std::io::Write, connect: bool) {
    let s = udp_socket(target);
    let connected = if connect { s.connect(target) } else { Ok(()) };
    for line in std::io::stdin().lines() {
        if line.is_err() {
            break;
        }
        let sent = connected
            .as_ref()
            .map_err(|e| std::io::Error::new(e.kind(), e.to_string()))
            .and_then(|_| {
                if connect {
                    s.send(b"ping")
                } else {
                    s.send_to(b"ping", target)
                }
            });
        let attempt = udp_answer(&s, sent, connect);
        writeln!(out, "{}", serde_json::to_string(&attempt).unwrap()).unwrap();
        out.flush().unwrap();
    }
}

fn tcp_held(target: SocketAddr, out: &mut impl std::io::Write) {
    use std::io::BufRead as _;
    let conn = TcpStream::connect_timeout(&target, Duration::from_secs(2));
    let mut reader = conn.as_ref().ok().map(|c| {
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        std::io::BufReader::new(c.try_clone().unwrap())
    });
    for line in std::io::stdin().lines() {
        if line.is_err() {
            break;
        }
        let attempt = match (&conn, reader.as_mut()) {
            (Err(e), _) => failed(std::io::Error::new(e.kind(), e.to_string())),
            (Ok(c), Some(r)) => {
                let mut answer = String::new();
                let mut w = c;
                match w
                    .write_all(b"ping\n")
                    .and_then(|_| r.read_line(&mut answer))
                {
                    Ok(0) => failed(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)),
                    Ok(_) => Attempt {
                        ok: true,
                        reply: Some(answer.trim().to_string()),
                        peer: c.peer_addr().ok().map(|a| a.to_string()),
                        ..Default::default()
                    },
                    Err(e) => failed(e),
                }
            }
            (Ok(_), None) => unreachable!(),
        };
        writeln!(out, "{}", serde_json::to_string(&attempt).unwrap()).unwrap();
        out.flush().unwrap();
    }
}

fn failed(e: std::io::Error) -> Attempt {
    Attempt {
        ok: false,
        errno: e.raw_os_error(),
        error: Some(e.to_string()),
        ..Default::default()
    }
}

fn tcp(target: SocketAddr) -> Attempt {
    let mut s = match TcpStream::connect_timeout(&target, Duration::from_secs(2)) {
        Ok(s) => s,
        Err(e) => return failed(e),
    };
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut reply = String::new();
    if let Err(e) = s.read_to_string(&mut reply) {
        return failed(e);
    }
    Attempt {
        ok: true,
        reply: Some(reply.trim().to_string()),
        peer: s.peer_addr().ok().map(|a| a.to_string()),
        local: s.local_addr().ok().map(|a| a.to_string()),
        ..Default::default()
    }
}

fn udp_socket(target: SocketAddr) -> UdpSocket {
    let s = UdpSocket::bind(if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    })
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s
}

fn udp(target: SocketAddr, connected: bool) -> Attempt {
    let s = udp_socket(target);
    let sent = if connected {
        s.connect(target).and_then(|_| s.send(b"ping"))
    } else {
        s.send_to(b"ping", target)
    };
    udp_answer(&s, sent, connected)
}

/// The answer to a datagram just sent (or the send's error).
fn udp_answer(s: &UdpSocket, sent: std::io::Result<usize>, connected: bool) -> Attempt {
    if let Err(e) = sent {
        return failed(e);
    }
    let mut buf = [0u8; 256];
    let (n, from) = match s.recv_from(&mut buf) {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    Attempt {
        ok: true,
        reply: Some(String::from_utf8_lossy(&buf[..n]).trim().to_string()),
        peer: if connected {
            s.peer_addr().ok().map(|a| a.to_string())
        } else {
            None
        },
        reply_from: Some(from.to_string()),
        local: s.local_addr().ok().map(|a| a.to_string()),
        ..Default::default()
    }
}
