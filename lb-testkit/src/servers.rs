//! Backend servers: each runs on a thread that entered the backend's network
//! namespace, answers every TCP connection or UDP datagram with
//! "<name> <peer ip:port>", and stops when dropped.
use std::{
    io::Write as _,
    net::{SocketAddr, TcpListener, UdpSocket},
    os::fd::AsRawFd as _,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

pub struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn set_timeout(fd: i32) {
    // accept() honours SO_RCVTIMEO: wake up to check the stop flag.
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    // SAFETY: a socket we own and a timeval of the size given.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
    }
}

/// The `netns` argument of the servers for "the namespace this process is
/// in" (a server running in a pod, `lb-pod-server`).
pub const HERE: &str = "";

/// Runs `serve` on a thread that entered `netns` (`HERE`: stays). `serve`
/// binds, calls `ready` once it listens, and returns when `stop` is set.
/// Returns once it listens.
fn spawn(netns: &str, serve: impl FnOnce(&dyn Fn(), Arc<AtomicBool>) + Send + 'static) -> Server {
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (ns, flag) = (netns.to_string(), stop.clone());
    let thread = std::thread::spawn(move || {
        if ns != HERE {
            crate::netns::enter(&ns).expect("enter backend netns");
        }
        serve(&|| ready_tx.send(()).unwrap(), flag);
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("server ready");
    Server {
        stop,
        thread: Some(thread),
    }
}

fn listen(addr: SocketAddr) -> TcpListener {
    let listener = TcpListener::bind(addr).expect("bind backend");
    set_timeout(listener.as_raw_fd());
    listener
}

pub fn tcp(netns: &str, addr: SocketAddr, name: &str) -> Server {
    let name = name.to_string();
    spawn(netns, move |ready, stop| {
        let listener = listen(addr);
        ready();
        while !stop.load(Ordering::Relaxed) {
            if let Ok((mut conn, peer)) = listener.accept() {
                let _ = conn.write_all(format!("{name} {peer}\n").as_bytes());
            }
        }
    })
}

pub fn udp(netns: &str, addr: SocketAddr, name: &str) -> Server {
    let name = name.to_string();
    spawn(netns, move |ready, stop| {
        let sock = UdpSocket::bind(addr).expect("bind backend");
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        ready();
        let mut buf = [0u8; 512];
        while !stop.load(Ordering::Relaxed) {
            if let Ok((_, peer)) = sock.recv_from(&mut buf) {
                let _ = sock.send_to(format!("{name} {peer}").as_bytes(), peer);
            }
        }
    })
}

/// A TCP server that hands each connection to `handle` on a thread of its
/// own (with the stop flag, for long transfers).
pub fn serve_tcp(
    netns: &str,
    addr: SocketAddr,
    handle: impl Fn(std::net::TcpStream, Arc<AtomicBool>) + Send + Sync + Clone + 'static,
) -> Server {
    spawn(netns, move |ready, stop| {
        let listener = listen(addr);
        ready();
        while !stop.load(Ordering::Relaxed) {
            if let Ok((conn, _)) = listener.accept() {
                let (handle, stop) = (handle.clone(), stop.clone());
                // Accepted sockets inherit the listener's receive timeout.
                conn.set_read_timeout(None).unwrap();
                std::thread::spawn(move || handle(conn, stop));
            }
        }
    })
}

/// A TCP server that keeps each connection open and answers every line with
/// "<name> <line>": for flows that must live across a configuration change.
pub fn tcp_echo(netns: &str, addr: SocketAddr, name: &str) -> Server {
    use std::io::{BufRead as _, BufReader};
    let name = name.to_string();
    spawn(netns, move |ready, stop| {
        let listener = listen(addr);
        ready();
        while !stop.load(Ordering::Relaxed) {
            if let Ok((conn, _)) = listener.accept() {
                let (name, stop) = (name.clone(), stop.clone());
                std::thread::spawn(move || {
                    // Wake up now and then to see whether the server stopped.
                    conn.set_read_timeout(Some(Duration::from_millis(200)))
                        .unwrap();
                    let mut w = conn.try_clone().unwrap();
                    let mut r = BufReader::new(conn);
                    let mut line = String::new();
                    while !stop.load(Ordering::Relaxed) {
                        line.clear();
                        match r.read_line(&mut line) {
                            Ok(0) => return,
                            Ok(_) => {
                                let _ = w.write_all(format!("{name} {line}").as_bytes());
                            }
                            Err(_) => continue,
                        }
                    }
                });
            }
        }
    })
}
