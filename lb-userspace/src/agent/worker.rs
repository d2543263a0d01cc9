//! The reconcile worker: a thread of its own that owns the reconciler and
//! applies whatever the mailbox holds. A full sync of 100 000 services takes
//! seconds; on its own thread it cannot starve the runtime that answers
//! signals, /healthz and /metrics and keeps reading the sources.
use std::{
    net::IpAddr,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use tracing::{debug, error, info, warn};

use super::mailbox::{Mailbox, Pending};
use crate::{
    maps::LbMaps,
    metrics::Metrics,
    reconcile::{ReconcileError, ReconcileStats, Reconciler},
    source::SourceEvent,
};

/// What the worker calls with the UDP backends a reconcile removed.
pub type OnRemovedUdp = Box<dyn FnMut(Vec<(IpAddr, u16)>) + Send>;

/// Changes to this many services, at once or since the last trim, leave
/// enough freed memory behind to give back (see `crate::sys::heap`).
const LARGE_BATCH: usize = 1000;

/// Small batches trim at most this often: `malloc_trim` holds each arena's
/// lock while it walks it, and a rolling update over a large cluster can
/// change a thousand services in well under a second.
const TRIM_AT_MOST_EVERY: Duration = Duration::from_secs(10);

/// Refused services are retried this often without new input.
pub const RETRY_EVERY: Duration = Duration::from_secs(10);

pub struct Worker<M: LbMaps> {
    reconciler: Reconciler<M>,
    metrics: Metrics,
    /// Called with the UDP backends a reconcile removed (connected sockets
    /// pinned to them are destroyed, see `crate::sockets`).
    on_removed_udp: OnRemovedUdp,
    /// Where the refused services are written for `lbctl status`.
    status_file: Option<PathBuf>,
    retry_every: Duration,
    /// Upstream change times not yet in the maps (network programming
    /// latency is observed when a reconcile succeeds).
    unprogrammed: Vec<crate::source::Trigger>,
    /// Reads this node's addresses, each round (at least every
    /// `retry_every`): an external IP that becomes or stops being the
    /// node's changes what sockets do with it (CVE-2020-8554).
    /// `None` from it: unknown this time, the last ones stay.
    node_addresses: Option<NodeAddresses>,
    /// Services changed since the heap was last trimmed: a watch delivers
    /// creations a few at a time, and never trimming after them left their
    /// freed decode and change buffers resident (5 000 services created
    /// through the apiserver: 12.1 MiB of growth, 11.0 MiB with this).
    changed_since_trim: usize,
    last_trim: Instant,
}

/// At most this many trigger times wait for a successful reconcile; beyond
/// it the oldest are dropped (a long outage must not grow memory).
const MAX_UNPROGRAMMED: usize = 10_000;

/// Reads this node's addresses (None: unknown this time).
pub type NodeAddresses = Box<dyn FnMut() -> Option<std::collections::BTreeSet<IpAddr>> + Send>;

impl<M: LbMaps> Worker<M> {
    /// A worker applying through `reconciler`, retrying every
    /// `RETRY_EVERY`, with no status file and no node addresses to follow.
    pub fn new(reconciler: Reconciler<M>, metrics: Metrics, on_removed_udp: OnRemovedUdp) -> Self {
        Self {
            reconciler,
            metrics,
            on_removed_udp,
            status_file: None,
            retry_every: RETRY_EVERY,
            unprogrammed: Vec::new(),
            node_addresses: None,
            changed_since_trim: 0,
            last_trim: Instant::now(),
        }
    }

    /// Where the refused services are written for `lbctl status`.
    pub fn with_status_file(mut self, path: PathBuf) -> Self {
        self.status_file = Some(path);
        self
    }

    /// How often a failed or partial apply is tried again.
    pub fn with_retry_every(mut self, every: Duration) -> Self {
        self.retry_every = every;
        self
    }

    /// Follow this node's addresses (`--external-ips-in-cluster owned-only`).
    pub fn with_node_addresses(mut self, read: NodeAddresses) -> Self {
        self.node_addresses = Some(read);
        self
    }

    pub fn reconciler(&self) -> &Reconciler<M> {
        &self.reconciler
    }

    /// The reconciler, to replace or inspect (tests: a restart).
    pub fn reconciler_mut(&mut self) -> &mut Reconciler<M> {
        &mut self.reconciler
    }
}

impl<M: LbMaps + Send + 'static> Worker<M> {
    pub fn spawn(self, mailbox: Arc<Mailbox>) -> std::thread::JoinHandle<()> {
        std::thread::Builder::new()
            .name("reconcile".into())
            .spawn(move || self.run(&mailbox))
            .expect("spawning the reconcile worker")
    }

    /// Applies what arrives until the mailbox closes.
    pub fn run(mut self, mailbox: &Mailbox) {
        while let Some(p) = mailbox.take(self.retry_every) {
            self.step(p);
        }
        // Before `self` (the model, the mirror of the maps) is dropped.
        mailbox.worker_stopped();
    }

    /// One round: notes, then the full model, then the changes after it;
    /// with nothing new, a retry of refused services.
    pub fn step(&mut self, p: Pending) {
        let idle = p.is_empty();
        for note in p.notes {
            self.note(note);
        }
        let observed = p.observed;
        self.unprogrammed.extend(p.triggers);
        if self.unprogrammed.len() > MAX_UNPROGRAMMED {
            let extra = self.unprogrammed.len() - MAX_UNPROGRAMMED;
            self.unprogrammed.drain(..extra);
        }
        let mut ok = true;
        if let Some(addresses) = self.node_addresses.as_mut().and_then(|read| read()) {
            if let Some(r) = self.reconciler.set_node_addresses(addresses) {
                info!("this node's addresses changed: external IPs checked again");
                ok &= self.finish(r, None);
            }
        }
        // A full model or a large batch leaves a peak of freed memory behind
        // (the parse, the old target, the change lists); so do many small
        // ones.
        self.changed_since_trim += p.changes.len();
        let large = p.full.is_some()
            || p.changes.len() >= LARGE_BATCH
            || (self.changed_since_trim >= LARGE_BATCH
                && self.last_trim.elapsed() >= TRIM_AT_MOST_EVERY);
        if let Some(model) = p.full {
            self.metrics.observed_change();
            // A complete view: the services that differ from the last one
            // are applied, the ones missing from it removed.
            let r = self.reconciler.reconcile_model(model);
            ok &= self.finish(r, observed);
        }
        if !p.changes.is_empty() {
            self.metrics.observed_change();
            let r = self.reconciler.reconcile_changes(p.changes);
            ok &= self.finish(r, observed);
        }
        if idle && self.reconciler.needs_retry() {
            info!(
                services = self.reconciler.pending().len(),
                "retrying refused services or a failed write"
            );
            let r = self.reconciler.retry();
            ok &= self.finish(r, None);
        }
        if ok && !self.unprogrammed.is_empty() {
            self.metrics
                .network_programmed(&std::mem::take(&mut self.unprogrammed));
        }
        // Not when stopping: the process is about to give it all back.
        if large && !self.reconciler.cancelled() {
            crate::sys::heap::release_free_memory();
            self.changed_since_trim = 0;
            self.last_trim = Instant::now();
        }
        let gone = self.reconciler.take_removed_udp();
        if !gone.is_empty() {
            (self.on_removed_udp)(gone);
        }
    }

    fn note(&self, ev: SourceEvent) {
        match ev {
            SourceEvent::Error {
                source,
                reason,
                message,
            } => {
                // Counted before it is logged: whoever reads the line (an
                // operator, a test) then finds the counter moved already.
                self.metrics.source_error(source, reason, message.clone());
                error!("{message}; keeping the last good state in the maps");
            }
            SourceEvent::Warning {
                source,
                reason,
                message,
            } => {
                self.metrics.source_warning(source, reason);
                warn!("{message}");
            }
            SourceEvent::Full { .. } | SourceEvent::Changes { .. } => {}
        }
    }

    /// Reports a reconcile's outcome; true when everything was applied.
    fn finish(
        &self,
        result: Result<ReconcileStats, ReconcileError>,
        observed: Option<Instant>,
    ) -> bool {
        let r = &self.reconciler;
        let target = r.target();
        // Whatever the result: what landed is in the maps.
        let exported = Arc::new(r.metric_frontends());
        if let Ok(mut f) = self.metrics.service_frontends.lock() {
            if **f != *exported {
                *f = exported;
            }
        }
        match result {
            Ok(stats) => {
                self.metrics.reconciled(
                    &stats,
                    observed,
                    r.state(),
                    target.services.len(),
                    r.maps().capacity(),
                );
                info!(
                    services = target.services.len(),
                    frontends = target.frontend_count(),
                    changed = stats.services_changed,
                    writes = stats.ops,
                    full_sync = stats.full_sync,
                    took_us = stats.duration.as_micros() as u64,
                    "reconciled"
                );
                self.write_status(&[]);
                true
            }
            Err(ReconcileError::Refused(refused)) => {
                // The details first, so whoever reads the warning finds them.
                self.write_status(&refused);
                for (name, e) in &refused {
                    debug!(service = %name, "refused: {e}");
                }
                let summary = crate::reconcile::refusal_summary(&refused);
                warn!("{summary}");
                self.metrics.reconciled_but_refused(
                    summary,
                    r.state(),
                    target.services.len(),
                    r.maps().capacity(),
                );
                false
            }
            Err(e @ ReconcileError::Cancelled { .. }) => {
                info!("{e}");
                false
            }
            Err(e) => {
                warn!("reconcile failed: {e}");
                self.metrics.reconcile_failed(e.to_string());
                false
            }
        }
    }

    fn write_status(
        &self,
        refused: &[(crate::model::ServiceName, crate::reconcile::ServiceError)],
    ) {
        let Some(path) = &self.status_file else {
            return;
        };
        let status = AgentStatus {
            version: env!("CARGO_PKG_VERSION").to_string(),
            layout: lb_common::maps::LAYOUT_VERSION,
            maglev_seed: self
                .reconciler
                .config()
                .maglev_seed
                .fingerprint()
                .to_string(),
            refused: refused
                .iter()
                .map(|(n, e)| RefusedService {
                    service: n.to_string(),
                    error: e.to_string(),
                })
                .collect(),
        };
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, serde_json::to_vec(&status)?)?;
            std::fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            warn!("writing {}: {e}", path.display());
        }
    }
}

/// What the agent leaves for `lbctl status` beside the maps.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct AgentStatus {
    /// The agent's release and map layout (for `lbctl version`).
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub layout: u32,
    pub refused: Vec<RefusedService>,
    /// The Maglev seed's fingerprint (`desired::maglev::Seed`).
    #[serde(default)]
    pub maglev_seed: String,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RefusedService {
    pub service: String,
    pub error: String,
}

/// The socket scans `terminate_stale_udp` has running: a stopping agent
/// waits a moment for them (the list of removed backends lives only in
/// memory, so a scan cut short is not done again after a restart).
#[derive(Default)]
pub struct UdpScans {
    running: std::sync::Mutex<usize>,
    idle: std::sync::Condvar,
}

impl UdpScans {
    fn start(&self) {
        *self.running.lock().unwrap() += 1;
    }

    fn end(&self) {
        let mut n = self.running.lock().unwrap();
        *n -= 1;
        if *n == 0 {
            self.idle.notify_all();
        }
    }

    /// Waits at most `timeout` for the running scans; whether none is left.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let n = self.running.lock().unwrap();
        let (n, _) = self
            .idle
            .wait_timeout_while(n, timeout, |n| *n > 0)
            .unwrap();
        *n == 0
    }
}

/// Connected UDP sockets that socket LB pinned to a backend that was just
/// removed fail over: they are destroyed in the background (scanning every
/// namespace takes a moment; the maps are already up to date).
pub fn terminate_stale_udp(
    pin_dir: PathBuf,
    metrics: Metrics,
    scans: Arc<UdpScans>,
) -> OnRemovedUdp {
    Box::new(move |gone| {
        let (pin_dir, metrics, scans) = (pin_dir.clone(), metrics.clone(), scans.clone());
        scans.start();
        std::thread::spawn(move || {
            scan_and_terminate(&pin_dir, &metrics, &gone);
            scans.end();
        });
    })
}

fn scan_and_terminate(pin_dir: &std::path::Path, metrics: &Metrics, gone: &[(IpAddr, u16)]) {
    match crate::sockets::terminate_udp(pin_dir, gone) {
        Ok(r) => {
            metrics.sockets_destroyed.inc_by(r.destroyed as u64);
            metrics.socket_scan_errors.inc_by(r.errors.len() as u64);
            for e in &r.errors {
                warn!("connected UDP sockets to removed backends: {e}");
            }
            info!(
                backends = gone.len(),
                namespaces = r.namespaces,
                destroyed = r.destroyed,
                "destroyed connected UDP sockets to removed backends"
            );
        }
        Err(e) => {
            metrics.socket_scan_errors.inc();
            warn!("connected UDP sockets to removed backends were not destroyed: {e:#}");
        }
    }
}

#[cfg(test)]
mod udp_scan_tests {
    use super::*;

    #[test]
    fn a_stop_waits_for_a_running_scan_and_not_longer() {
        let scans = Arc::new(UdpScans::default());
        assert!(scans.wait_idle(Duration::ZERO), "nothing running");
        scans.start();
        scans.start();
        scans.end();
        assert!(
            !scans.wait_idle(Duration::from_millis(20)),
            "one still running"
        );
        let done = {
            let scans = scans.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                scans.end();
            })
        };
        let t = Instant::now();
        assert!(scans.wait_idle(Duration::from_secs(10)));
        assert!(t.elapsed() < Duration::from_secs(5), "woken, not timed out");
        done.join().unwrap();
    }
}
