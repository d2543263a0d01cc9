//! A TCP relay on the agent's path to the apiserver, for faults the kernel
//! here cannot inject with tc (no sch_netem: docs/testbed.md): latency
//! (`set_delay`: each chunk waits that long before it is passed on, each
//! way) and a silent cut.
//! While cut it forwards nothing and closes nothing, as a lost route or a
//! firewall that drops would; new connections are accepted and then hear
//! nothing. When the cut ends only connections made after it carry bytes:
//! the ones from before stay silent for good, as a connection whose state
//! a NAT or load balancer lost during the cut does (no FIN, no RST; the
//! client's TCP would retry for many minutes before giving up).
use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

#[derive(Default)]
struct State {
    stop: AtomicBool,
    cut: AtomicBool,
    /// Moves on at the end of each cut: a connection forwards only in the
    /// generation it was accepted in.
    generation: AtomicU64,
    /// Added latency per direction, in milliseconds.
    delay_ms: AtomicU64,
}

impl State {
    fn forwards(&self, generation: u64) -> bool {
        !self.cut.load(Ordering::Relaxed) && self.generation.load(Ordering::Relaxed) == generation
    }
}

/// The relay, listening on 127.0.0.1:`port` in a network namespace,
/// forwarding to `target` there. Dropping it closes every connection.
pub struct Relay {
    pub port: u16,
    state: Arc<State>,
}

const POLL: Duration = Duration::from_millis(100);

impl Relay {
    pub fn start(netns: &str, target: SocketAddr) -> Self {
        let state = Arc::new(State::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let netns = netns.to_string();
        let st = state.clone();
        // The thread enters the namespace; the threads it makes inherit it.
        std::thread::spawn(move || {
            crate::netns::enter(&netns).expect("entering the namespace");
            let listener = TcpListener::bind("127.0.0.1:0").expect("binding the relay");
            listener.set_nonblocking(true).unwrap();
            tx.send(listener.local_addr().unwrap().port()).unwrap();
            while !st.stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let generation = st.generation.load(Ordering::Relaxed);
                        let st = st.clone();
                        std::thread::spawn(move || connect(&st, client, target, generation));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(POLL / 4),
                    Err(_) => return,
                }
            }
        });
        let port = rx.recv().expect("the relay's port");
        Self { port, state }
    }

    /// Holds every chunk `delay` before passing it on, each way (so a
    /// request and its answer take 2 × `delay` more).
    pub fn set_delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.state.delay_ms.store(ms, Ordering::Relaxed);
    }

    /// Forwards nothing from now on, closing nothing.
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::Relaxed);
    }

    /// Ends the cut: new connections forward again, every older one stays
    /// silent.
    pub fn restore(&self) {
        self.state.generation.fetch_add(1, Ordering::Relaxed);
        self.state.cut.store(false, Ordering::Relaxed);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
    }
}

/// One connection: upstream once it may forward, then both directions.
fn connect(st: &Arc<State>, client: TcpStream, target: SocketAddr, generation: u64) {
    while !st.forwards(generation) {
        if st.stop.load(Ordering::Relaxed) || st.generation.load(Ordering::Relaxed) != generation {
            // A connection accepted during a cut never gets through; it is
            // closed only with the relay.
            while !st.stop.load(Ordering::Relaxed) {
                std::thread::sleep(POLL);
            }
            return;
        }
        std::thread::sleep(POLL);
    }
    let Ok(server) = TcpStream::connect(target) else {
        return;
    };
    let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let st2 = st.clone();
    std::thread::spawn(move || pump(&st2, c2, s2, generation));
    pump(st, server, client, generation);
}

/// Copies `from` to `to` while the relay forwards this generation; while it
/// does not, reads nothing (the bytes wait in the kernel, unanswered).
fn pump(st: &State, mut from: TcpStream, mut to: TcpStream, generation: u64) {
    from.set_read_timeout(Some(POLL)).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    while !st.stop.load(Ordering::Relaxed) {
        if !st.forwards(generation) {
            std::thread::sleep(POLL);
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let delay = st.delay_ms.load(Ordering::Relaxed);
                if delay > 0 {
                    std::thread::sleep(Duration::from_millis(delay));
                }
                // Read just as a cut began: held until it ends (or for good).
                while !st.forwards(generation) && !st.stop.load(Ordering::Relaxed) {
                    std::thread::sleep(POLL);
                }
                if st.stop.load(Ordering::Relaxed) || to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
