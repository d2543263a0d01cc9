//! The conntrack garbage collector: a thread that sweeps LB4_CT and LB6_CT, deletes
//! what `expired_keys` names, and picks its next interval from how much it
//! found, as Cilium's does (pkg/maps/ctmap/gc, calculateIntervalWithConfig):
//! a sweep that deleted more than a quarter of the table comes back sooner
//! (interval × (1 − ratio), ratio capped at 0.9), one that deleted under 5 %
//! waits longer (× 1.5), within [MIN_INTERVAL, MAX_INTERVAL]. A fixed
//! interval can be set instead.
use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use aya::{
    maps::{HashMap, MapData},
    Pod,
};
use lb_common::{
    conntrack::{CtKey, CtTimeouts, CtValue},
    maps as names,
};
use prometheus_client::metrics::{counter::Counter, gauge::Gauge};
use tracing::{debug, warn};

use super::{expired_keys, timeouts};
use crate::{datapath::config::RuntimeConfig, maps::bpf::open_pinned};

pub const START_INTERVAL: Duration = Duration::from_secs(60);
pub const MIN_INTERVAL: Duration = Duration::from_secs(10);
pub const MAX_INTERVAL: Duration = Duration::from_secs(600);

/// What one sweep found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sweep {
    pub scanned: usize,
    pub deleted: usize,
    /// (deleted, capacity) of the table that lost the largest share.
    pub busiest: (usize, u32),
    pub duration: Duration,
}

/// The collector's metrics (registered by `Metrics::new`).
#[derive(Clone, Default)]
pub struct GcMetrics {
    pub runs: Counter,
    pub deleted: Counter,
    pub alive: Gauge,
    pub interval_seconds: Gauge,
    pub last_duration_ms: Gauge,
}

/// One sweep of both tables: reads every entry, deletes the expired ones.
/// `deleted`/`scanned` add both up; `busiest` is the table that lost the
/// largest share, from which the next interval is taken. A missing LB6_CT
/// (pins of an agent from before IPv6 north-south) is an empty table.
pub fn sweep(pin_dir: &Path) -> anyhow::Result<Sweep> {
    let started = Instant::now();
    let config = RuntimeConfig::open(pin_dir)?;
    let t = timeouts(&config)?;
    let (s4, d4, c4) = sweep_table::<u32>(pin_dir, names::LB4_CT, &t)?;
    let (s6, d6, c6) = if pin_dir.join(names::LB6_CT).exists() {
        sweep_table::<[u32; 4]>(pin_dir, names::LB6_CT, &t)?
    } else {
        (0, 0, c4)
    };
    let share = |d: usize, c: u32| d as f64 / f64::from(c.max(1));
    let busiest = if share(d6, c6) > share(d4, c4) {
        (d6, c6)
    } else {
        (d4, c4)
    };
    Ok(Sweep {
        scanned: s4 + s6,
        deleted: d4 + d6,
        busiest,
        duration: started.elapsed(),
    })
}

/// (scanned, deleted, capacity) of one table.
fn sweep_table<A>(pin_dir: &Path, name: &str, t: &CtTimeouts) -> anyhow::Result<(usize, usize, u32)>
where
    A: Copy + Eq + std::hash::Hash,
    CtKey<A>: Pod,
    CtValue<A>: Pod,
{
    let mut map: HashMap<MapData, CtKey<A>, CtValue<A>> =
        HashMap::try_from(open_pinned(pin_dir, name)?)?;
    let capacity = crate::maps::bpf::max_entries(pin_dir, name)?;
    // An LRU entry can vanish between listing its key and reading it.
    let entries: Vec<(CtKey<A>, CtValue<A>)> = map.iter().filter_map(Result::ok).collect();
    let now = crate::monitor::reader::monotonic_ns();
    let gone = expired_keys(&entries, now, t);
    // Decided on a snapshot while the programs kept writing: decided again
    // on what the entries hold now (`confirm_expired` says why), and each
    // deleted only if it still holds that, reverse entries first.
    let now = crate::monitor::reader::monotonic_ns();
    let confirmed = super::confirm_expired(&gone, |k| map.get(k, 0).ok(), now, t);
    let mut deleted = 0;
    for (k, v) in &confirmed {
        // Evicted or deleted by a program meanwhile: fine. (What a program
        // writes between this read and the delete is lost: a window of
        // microseconds, against the snapshot's milliseconds.)
        if map.get(k, 0).ok().as_ref() == Some(v) && map.remove(k).is_ok() {
            deleted += 1;
        }
    }
    Ok((entries.len(), deleted, capacity))
}

/// The interval after a sweep that took `current` to come and deleted
/// `deleted` of `capacity` entries.
pub fn next_interval(current: Duration, deleted: usize, capacity: u32) -> Duration {
    let ratio = deleted as f64 / f64::from(capacity.max(1));
    let next = if ratio > 0.25 {
        current.mul_f64(1.0 - ratio.min(0.9))
    } else if ratio < 0.05 {
        current.mul_f64(1.5)
    } else {
        current
    };
    next.clamp(MIN_INTERVAL, MAX_INTERVAL)
}

/// Runs the collector on a thread of its own until `stop` is set.
/// `fixed`: sweep at this interval instead of adapting it.
pub fn spawn(
    pin_dir: PathBuf,
    fixed: Option<Duration>,
    metrics: GcMetrics,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("ct-gc".into())
        .spawn(move || {
            let mut interval = fixed.unwrap_or(START_INTERVAL);
            loop {
                metrics.interval_seconds.set(interval.as_secs() as i64);
                // Sleep in short steps so a stop is seen promptly.
                let deadline = Instant::now() + interval;
                while Instant::now() < deadline {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100).min(interval));
                }
                match sweep(&pin_dir) {
                    Ok(s) => {
                        metrics.runs.inc();
                        metrics.deleted.inc_by(s.deleted as u64);
                        metrics.alive.set((s.scanned - s.deleted) as i64);
                        metrics.last_duration_ms.set(s.duration.as_millis() as i64);
                        debug!(
                            scanned = s.scanned,
                            deleted = s.deleted,
                            took_ms = s.duration.as_millis() as u64,
                            "conntrack sweep"
                        );
                        if fixed.is_none() {
                            interval = next_interval(interval, s.busiest.0, s.busiest.1);
                        }
                    }
                    Err(e) => warn!("conntrack sweep failed: {e:#}"),
                }
            }
        })
        .expect("spawning the conntrack collector")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_shrinks_when_much_expired_and_grows_when_little_did() {
        let m = Duration::from_secs(60);
        assert_eq!(next_interval(m, 50_000, 100_000), Duration::from_secs(30));
        assert_eq!(next_interval(m, 1_000, 100_000), Duration::from_secs(90));
        assert_eq!(next_interval(m, 10_000, 100_000), m);
        // Bounded both ways.
        assert_eq!(
            next_interval(Duration::from_secs(11), 99_000, 100_000),
            MIN_INTERVAL
        );
        assert_eq!(
            next_interval(Duration::from_secs(500), 0, 100_000),
            MAX_INTERVAL
        );
    }
}
