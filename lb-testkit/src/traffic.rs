//! Real-sized traffic for the north-south tests: bulk TCP streams whose
//! every byte is checked at the far end, large downloads, connection churn,
//! and many datagrams from one unconnected UDP socket.
//!
//! The bulk server speaks a tiny protocol. The client opens a connection and
//! sends a 17-byte header: an operation byte, a seed (u64 LE) and an
//! argument (u64 LE).
//!
//! * `D` download: the server sends `arg` bytes of the seed's pattern, then
//!   closes; the client checks every byte and that none is missing.
//! * `T` timed download: the same for `arg` milliseconds.
//! * `U` upload: the client streams the pattern until it shuts down its
//!   side; the server checks every byte and answers with a verdict byte
//!   (1: all bytes right) and the byte count (u64 LE).
//!
//! The pattern depends on the byte's position, so a lost, duplicated,
//! reordered or corrupted segment anywhere in the stream is caught.
use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{Shutdown, SocketAddr, TcpStream, UdpSocket},
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use crate::servers::{self, Server};

const HEADER: usize = 17;
const CHUNK: usize = 64 * 1024;

/// splitmix64 (Steele, Lea, Flood 2014): a fast, well-mixed stream.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `buf` with the pattern of `seed` from stream position `offset`.
pub fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        let pos = offset + i as u64;
        *b = mix(seed ^ (pos / 8)).to_le_bytes()[(pos % 8) as usize];
    }
}

/// Checks `buf` against the pattern; the position of the first wrong byte.
fn check(seed: u64, offset: u64, buf: &[u8], scratch: &mut Vec<u8>) -> Result<(), u64> {
    scratch.resize(buf.len(), 0);
    fill(seed, offset, scratch);
    match buf.iter().zip(scratch.iter()).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(offset + i as u64),
    }
}

/// The bulk server, on a thread in `netns`, one thread per connection.
pub fn bulk_server(netns: &str, addr: SocketAddr) -> Server {
    servers::serve_tcp(netns, addr, |conn, stop| {
        let _ = serve_bulk(conn, stop);
    })
}

fn serve_bulk(
    mut conn: TcpStream,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut h = [0u8; HEADER];
    conn.read_exact(&mut h)?;
    let seed = u64::from_le_bytes(h[1..9].try_into().unwrap());
    let arg = u64::from_le_bytes(h[9..17].try_into().unwrap());
    let mut buf = vec![0u8; CHUNK];
    match h[0] {
        b'D' | b'T' => {
            let until = (h[0] == b'T').then(|| Instant::now() + Duration::from_millis(arg));
            let mut sent = 0u64;
            loop {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let n = match until {
                    Some(t) if Instant::now() >= t => break,
                    Some(_) => CHUNK,
                    None if sent >= arg => break,
                    None => CHUNK.min((arg - sent) as usize),
                };
                fill(seed, sent, &mut buf[..n]);
                conn.write_all(&buf[..n])?;
                sent += n as u64;
            }
            conn.shutdown(Shutdown::Write)
        }
        b'U' => {
            let mut scratch = Vec::new();
            let (mut got, mut ok) = (0u64, true);
            loop {
                let n = conn.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                if ok && check(seed, got, &buf[..n], &mut scratch).is_err() {
                    ok = false;
                }
                got += n as u64;
            }
            let mut verdict = [0u8; 9];
            verdict[0] = u8::from(ok);
            verdict[1..].copy_from_slice(&got.to_le_bytes());
            conn.write_all(&verdict)?;
            conn.shutdown(Shutdown::Write)
        }
        _ => Ok(()),
    }
}

/// What a bulk transfer did.
#[derive(Clone, Debug)]
pub struct Transfer {
    pub bytes: u64,
    pub elapsed: Duration,
}

impl Transfer {
    pub fn mbit_per_s(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.elapsed.as_secs_f64() / 1e6
    }
}

/// Runs `f` on a thread that entered `netns` (sockets it makes live there).
pub fn in_netns<T: Send + 'static>(netns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = netns.to_string();
    std::thread::spawn(move || {
        crate::netns::enter(&ns).expect("entering the client namespace");
        f()
    })
    .join()
    .expect("traffic thread panicked")
}

fn connect(target: SocketAddr) -> Result<TcpStream, String> {
    let s = TcpStream::connect_timeout(&target, Duration::from_secs(5))
        .map_err(|e| format!("connect {target}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    Ok(s)
}

fn header(op: u8, seed: u64, arg: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[0] = op;
    h[1..9].copy_from_slice(&seed.to_le_bytes());
    h[9..].copy_from_slice(&arg.to_le_bytes());
    h
}

/// Downloads `bytes` bytes (or, with `for_ms`, for that many milliseconds)
/// and checks each one. Err names the first wrong position or the failure.
pub fn download(
    netns: &str,
    target: SocketAddr,
    seed: u64,
    bytes: Option<u64>,
    for_ms: Option<u64>,
) -> Result<Transfer, String> {
    in_netns(netns, move || {
        let started = Instant::now();
        let mut s = connect(target)?;
        let h = match (bytes, for_ms) {
            (Some(n), _) => header(b'D', seed, n),
            (None, Some(ms)) => header(b'T', seed, ms),
            (None, None) => return Err("download: give bytes or a duration".into()),
        };
        s.write_all(&h).map_err(|e| format!("request: {e}"))?;
        let (mut buf, mut scratch) = (vec![0u8; CHUNK], Vec::new());
        let mut got = 0u64;
        loop {
            let n = s
                .read(&mut buf)
                .map_err(|e| format!("after {got} bytes: {e}"))?;
            if n == 0 {
                break;
            }
            check(seed, got, &buf[..n], &mut scratch)
                .map_err(|pos| format!("byte {pos} of the download is wrong"))?;
            got += n as u64;
        }
        if let Some(n) = bytes {
            if got != n {
                return Err(format!("download ended after {got} of {n} bytes"));
            }
        }
        Ok(Transfer {
            bytes: got,
            elapsed: started.elapsed(),
        })
    })
}

/// Streams the pattern to the server for `for_ms` milliseconds; the server
/// checks every byte and reports. Err when it saw a wrong or missing byte.
pub fn upload(netns: &str, target: SocketAddr, seed: u64, for_ms: u64) -> Result<Transfer, String> {
    in_netns(netns, move || {
        let started = Instant::now();
        let mut s = connect(target)?;
        s.write_all(&header(b'U', seed, 0))
            .map_err(|e| format!("request: {e}"))?;
        let mut buf = vec![0u8; CHUNK];
        let mut sent = 0u64;
        let until = started + Duration::from_millis(for_ms);
        while Instant::now() < until {
            fill(seed, sent, &mut buf);
            s.write_all(&buf)
                .map_err(|e| format!("after {sent} bytes: {e}"))?;
            sent += CHUNK as u64;
        }
        s.shutdown(Shutdown::Write).map_err(|e| e.to_string())?;
        let mut verdict = [0u8; 9];
        s.read_exact(&mut verdict)
            .map_err(|e| format!("no verdict from the server: {e}"))?;
        let counted = u64::from_le_bytes(verdict[1..].try_into().unwrap());
        if verdict[0] != 1 || counted != sent {
            return Err(format!(
                "the server counted {counted} of {sent} bytes, all right: {}",
                verdict[0] == 1
            ));
        }
        Ok(Transfer {
            bytes: sent,
            elapsed: started.elapsed(),
        })
    })
}

/// Runs an upload and a download at the same time (bulk both ways).
pub fn both_ways(
    netns: &str,
    target: SocketAddr,
    for_ms: u64,
) -> (Result<Transfer, String>, Result<Transfer, String>) {
    let ns = netns.to_string();
    let up = std::thread::spawn(move || upload(&ns, target, 11, for_ms));
    let down = download(netns, target, 12, None, Some(for_ms));
    (up.join().expect("upload thread"), down)
}

/// What a run of sequential short connections did.
#[derive(Clone, Debug, Default)]
pub struct Churn {
    pub ok: usize,
    pub failed: usize,
    /// The first few failures, for the assertion message.
    pub errors: Vec<String>,
    /// Answers per backend name (servers::tcp answers "<name> <peer>").
    pub backends: BTreeMap<String, usize>,
    pub elapsed: Duration,
}

/// `count` sequential connections from one client; each reads the
/// backend's one-line answer until the server closes.
pub fn churn(netns: &str, target: SocketAddr, count: usize) -> Churn {
    churn_until(netns, target, count, None)
}

/// Sequential connections for `for_ms` milliseconds (a rate measurement).
pub fn churn_for(netns: &str, target: SocketAddr, for_ms: u64) -> Churn {
    churn_until(
        netns,
        target,
        usize::MAX,
        Some(Duration::from_millis(for_ms)),
    )
}

/// One short connection from the current namespace: connected within 3 s,
/// the server's answer read until it closes (within 3 s more).
pub fn ask(target: SocketAddr) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(3))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    Ok(answer)
}

fn churn_until(netns: &str, target: SocketAddr, count: usize, limit: Option<Duration>) -> Churn {
    in_netns(netns, move || {
        let started = Instant::now();
        let mut c = Churn::default();
        for i in 0..count {
            if limit.is_some_and(|l| started.elapsed() >= l) {
                break;
            }
            match ask(target) {
                Ok(a) if !a.trim().is_empty() => {
                    c.ok += 1;
                    let name = a.split_whitespace().next().unwrap_or("").to_string();
                    *c.backends.entry(name).or_default() += 1;
                }
                Ok(_) => {
                    c.failed += 1;
                    if c.errors.len() < 5 {
                        c.errors.push(format!("#{i}: empty answer"));
                    }
                }
                Err(e) => {
                    c.failed += 1;
                    if c.errors.len() < 5 {
                        c.errors.push(format!("#{i}: {e}"));
                    }
                }
            }
        }
        c.elapsed = started.elapsed();
        c
    })
}

/// Sends `count` datagrams from one unconnected UDP socket (sendto each
/// time, as QUIC or a resolver does) and returns who answered each one
/// (None when no answer came).
pub fn udp_from_one_socket(netns: &str, target: SocketAddr, count: usize) -> Vec<Option<String>> {
    udp_answers_from_one_socket(netns, target, count)
        .into_iter()
        .map(|a| a.and_then(|(a, _)| a.split_whitespace().next().map(str::to_string)))
        .collect()
}

/// Like `udp_from_one_socket`, each answer whole ("<name> <peer>") with the
/// address it came from (the target's, when replies are translated back).
pub fn udp_answers_from_one_socket(
    netns: &str,
    target: SocketAddr,
    count: usize,
) -> Vec<Option<(String, SocketAddr)>> {
    in_netns(netns, move || {
        let s = UdpSocket::bind(if target.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        })
        .expect("bind");
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 512];
        (0..count)
            .map(|i| {
                s.send_to(format!("q{i}").as_bytes(), target).ok()?;
                let (n, from) = s.recv_from(&mut buf).ok()?;
                Some((String::from_utf8_lossy(&buf[..n]).into_owned(), from))
            })
            .collect()
    })
}
