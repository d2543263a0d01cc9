//! Reads `LB_EVENTS`. A BPF ring buffer has one consumer position, so one
//! reader at a time gets every event; the agent does not read it (its
//! metrics come from the exact per-CPU counters), lbctl monitor does.
use std::{
    os::fd::AsRawFd as _,
    path::Path,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use anyhow::Context as _;
use aya::maps::{MapData, RingBuf};
use lb_common::{event::Event, maps as names};

use super::{decode, MonitorEvent};
use crate::maps::bpf::open_pinned;

pub struct EventReader {
    ring: RingBuf<MapData>,
    /// Events older than this (CLOCK_MONOTONIC ns) were buffered before we
    /// started: skip them, a monitor shows what happens from now on.
    since_ns: u64,
}

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl EventReader {
    pub fn open(pin_dir: &Path) -> anyhow::Result<Self> {
        let ring = RingBuf::try_from(open_pinned(pin_dir, names::LB_EVENTS)?)
            .context("LB_EVENTS is not a ring buffer")?;
        Ok(Self {
            ring,
            since_ns: monotonic_ns(),
        })
    }

    /// Calls `f` for each new event until `f` returns false or `stop` is set.
    pub fn run(
        &mut self,
        stop: &AtomicBool,
        mut f: impl FnMut(MonitorEvent) -> bool,
    ) -> anyhow::Result<()> {
        let fd = self.ring.as_raw_fd();
        while !stop.load(Ordering::Relaxed) {
            while let Some(item) = self.ring.next() {
                if item.len() < std::mem::size_of::<Event>() {
                    continue;
                }
                // SAFETY: the length was checked above; Event is plain old data (lb-common, repr(C)), any bytes are a valid value.
                let raw: Event = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                if raw.ktime_ns < self.since_ns {
                    continue;
                }
                if !f(decode(&raw)) {
                    return Ok(());
                }
            }
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            let timeout = Duration::from_millis(200).as_millis() as i32;
            // SAFETY: `pfd` is one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, timeout) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e).context("poll on LB_EVENTS");
                }
            }
        }
        Ok(())
    }
}
