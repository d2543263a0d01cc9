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

pub fn tcp(netns: &str, addr: SocketAddr, name: &str) -> Server {
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (ns, name, flag) = (netns.to_string(), name.to_string(), stop.clone());
    let thread = std::thread::spawn(move || {
        crate::netns::enter(&ns).expect("enter backend netns");
        let listener = TcpListener::bind(addr).expect("bind backend");
        set_timeout(listener.as_raw_fd());
        ready_tx.send(()).unwrap();
        while !flag.load(Ordering::Relaxed) {
            if let Ok((mut conn, peer)) = listener.accept() {
                let _ = conn.write_all(format!("{name} {peer}\n").as_bytes());
            }
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("server ready");
    Server {
        stop,
        thread: Some(thread),
    }
}

pub fn udp(netns: &str, addr: SocketAddr, name: &str) -> Server {
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (ns, name, flag) = (netns.to_string(), name.to_string(), stop.clone());
    let thread = std::thread::spawn(move || {
        crate::netns::enter(&ns).expect("enter backend netns");
        let sock = UdpSocket::bind(addr).expect("bind backend");
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        ready_tx.send(()).unwrap();
        let mut buf = [0u8; 512];
        while !flag.load(Ordering::Relaxed) {
            if let Ok((_, peer)) = sock.recv_from(&mut buf) {
                let _ = sock.send_to(format!("{name} {peer}").as_bytes(), peer);
            }
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("server ready");
    Server {
        stop,
        thread: Some(thread),
    }
}

/// A TCP server that keeps each connection open and answers every line with
/// "<name> <line>": for flows that must live across a configuration change.
pub fn tcp_echo(netns: &str, addr: SocketAddr, name: &str) -> Server {
    use std::io::{BufRead as _, BufReader};
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (ns, name, flag) = (netns.to_string(), name.to_string(), stop.clone());
    let thread = std::thread::spawn(move || {
        crate::netns::enter(&ns).expect("enter backend netns");
        let listener = TcpListener::bind(addr).expect("bind backend");
        set_timeout(listener.as_raw_fd());
        ready_tx.send(()).unwrap();
        while !flag.load(Ordering::Relaxed) {
            if let Ok((conn, _)) = listener.accept() {
                let (name, flag) = (name.clone(), flag.clone());
                std::thread::spawn(move || {
                    conn.set_read_timeout(Some(Duration::from_millis(200)))
                        .unwrap();
                    let mut w = conn.try_clone().unwrap();
                    let mut r = BufReader::new(conn);
                    let mut line = String::new();
                    while !flag.load(Ordering::Relaxed) {
                        line.clear();
                        match r.read_line(&mut line) {
                            Ok(0) => return,
                            Ok(_) => {
                                let _ = w.write_all(format!("{name} {}", line).as_bytes());
                            }
                            Err(_) => continue,
                        }
                    }
                });
            }
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("server ready");
    Server {
        stop,
        thread: Some(thread),
    }
}
