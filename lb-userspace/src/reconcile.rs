//! The reconciler: model → desired state → diff → apply, one service at a time.
//!
//! It keeps a mirror of what the maps hold (restored from the pinned maps on
//! start), the target model (the latest from the sources) and which service's
//! entries hold each frontend (the sources decided who owns it,
//! `model::claims`). A change is applied per service: its desired entries
//! are computed, diffed against the mirror and written, so the cost follows
//! the size of the change, not of the cluster, and a service that does not
//! fit is refused on its own (nothing of it written) while the others apply.
//!
//! The first reconcile after a start, and the one after a failed write, is a
//! full sync: every service is applied, then whatever no service owns is
//! swept. Because slots and ids are restored, a restarted agent with an
//! unchanged model writes nothing.
//!
//! A reconcile of many services (a full sync) is pipelined: the kernel's
//! part (bpf(2) inserts, about three quarters of a full sync) runs on a
//! writer thread while this one computes the next services (`pipeline`).
//! The writes reach the maps in exactly the order they are computed, so
//! every state a reader sees is one the serial order would show.
use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use smallvec::SmallVec;

mod errors;
mod pipeline;
pub use errors::{refusal_summary, ReconcileError, ServiceError};
pub use pipeline::FROM_SERVICES;

use crate::{
    collections::{HashMap, HashSet},
    desired::{self, BuildConfig, Desired, Ids},
    diff::{diff, filter, sweep},
    maps::{capacity, LbMaps, MapOp, MapState, SvcKey},
    model::{Model, Service, ServiceName},
};

/// A long reconcile (a full sync of a big cluster) says how far it got this
/// often, unless told otherwise.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// A frontend whose counters the metrics export, with its labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricFrontend {
    pub service_id: u32,
    pub namespace: String,
    pub name: String,
    /// `10.96.0.10:80/TCP`, `[fd00::10]:53/UDP`.
    pub frontend: String,
    /// ClusterIP, NodePort, LoadBalancer, ExternalIP.
    pub kind: &'static str,
}

/// What one reconcile did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconcileStats {
    pub full_sync: bool,
    pub services_changed: usize,
    pub ops: usize,
    pub duration: Duration,
}

pub struct Reconciler<M: LbMaps> {
    /// None only while a pipelined run lends the maps to its writer thread.
    maps: Option<M>,
    /// The maps' capacity, read at the start of each run.
    capacity: crate::maps::MapSizes,
    /// Where a pipelined run sends its writes (None: written here, at once).
    pipe: Option<pipeline::Sender>,
    /// Runs of at least this many services are pipelined.
    pipeline_from: usize,
    /// Writes per hand-over to the writer thread.
    pipeline_chunk: usize,
    /// A pipelined run stopped at a failed write and the maps could not be
    /// read back yet: the mirror may hold writes that never landed.
    mirror_ahead: bool,
    /// A reconcile has been asked for (the target is a source's, not the
    /// empty model of a fresh start).
    had_input: bool,
    state: MapState,
    ids: Ids,
    /// The model to converge to.
    target: Model,
    /// Master key → the service whose entries hold that frontend in the
    /// maps. Bookkeeping, not a choice: the sources settle ownership before
    /// the model (`model::claims`), so no two services of a target share a
    /// frontend; this says which service's removal may delete it while a
    /// frontend moves from one service to another within a run.
    holder: HashMap<SvcKey, ServiceName>,
    /// Service → master keys it holds (one frontend inline: most services
    /// have one port and one address, and a heap block per service was
    /// memory scattered through the heap at 100 000 services).
    held: HashMap<ServiceName, SmallVec<[SvcKey; 1]>>,
    /// Services that were refused and wait for a retry.
    pending: BTreeSet<ServiceName>,
    /// Services of the target whose counters are exported as metrics
    /// (`Service::metrics`), kept as the target changes.
    metric_services: BTreeSet<ServiceName>,
    needs_full_sync: bool,
    cfg: BuildConfig,
    /// UDP backends deleted from the maps since the last `take_removed_udp`.
    removed_udp: Vec<(std::net::IpAddr, u16)>,
    /// Set from outside (a signal) to stop a long reconcile between services.
    cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    progress_every: Duration,
}

impl<M: LbMaps> Reconciler<M> {
    /// Takes over whatever the maps hold (ids, slots) without changing it.
    pub fn restore(maps: M) -> anyhow::Result<Self> {
        let state = maps.dump()?;
        let mut ids = Ids::default();
        ids.restore(&state);
        Ok(Self {
            capacity: maps.capacity(),
            maps: Some(maps),
            pipe: None,
            pipeline_from: pipeline::FROM_SERVICES,
            pipeline_chunk: pipeline::CHUNK,
            mirror_ahead: false,
            had_input: false,
            state,
            ids,
            target: Model::default(),
            holder: HashMap::default(),
            held: HashMap::default(),
            pending: BTreeSet::new(),
            metric_services: BTreeSet::new(),
            needs_full_sync: true,
            cfg: BuildConfig::default(),
            removed_udp: Vec::new(),
            cancel: None,
            progress_every: PROGRESS_EVERY,
        })
    }

    /// A flag that, once set, makes a running reconcile stop at the next
    /// service (`ReconcileError::Cancelled`); the services not reached are
    /// kept for the next run.
    pub fn with_cancel(mut self, flag: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Self {
        self.cancel = Some(flag);
        self
    }

    /// Whether the cancel flag is set (the agent is stopping).
    pub fn cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// How often a long reconcile logs its progress.
    pub fn with_progress_every(mut self, every: Duration) -> Self {
        self.progress_every = every;
        self
    }

    /// This node's addresses changed (or are first known): with
    /// `--external-ips-in-cluster owned-only` the services with an external
    /// IP are applied again, since whether sockets may translate it depends
    /// on them (CVE-2020-8554). `None` when nothing changed.
    pub fn set_node_addresses(
        &mut self,
        addresses: std::collections::BTreeSet<std::net::IpAddr>,
    ) -> Option<Result<ReconcileStats, ReconcileError>> {
        if *self.cfg.node_addresses == addresses {
            return None;
        }
        self.cfg.node_addresses = std::sync::Arc::new(addresses);
        if !self.cfg.external_ips_in_cluster.needs_node_addresses() {
            return None;
        }
        // Before any source's input the target is empty and a full sync is
        // due: a run now would sweep the pinned state. The first model is
        // built with these addresses anyway.
        if !self.had_input {
            return None;
        }
        let affected: BTreeSet<ServiceName> = self
            .target
            .services
            .iter()
            .filter(|(_, s)| {
                s.frontends
                    .iter()
                    .any(|f| f.kind == crate::model::FrontendKind::ExternalIP)
            })
            .map(|(n, _)| n.clone())
            .collect();
        Some(self.run(affected))
    }

    /// Settings the desired state depends on (the default Maglev table
    /// size, this node's addresses). Changing them takes effect for each
    /// service as it is next applied (at the latest, the next full sync).
    pub fn with_config(mut self, cfg: BuildConfig) -> Self {
        self.cfg = cfg;
        self
    }

    /// The settings the desired state is built with.
    pub fn config(&self) -> &BuildConfig {
        &self.cfg
    }

    /// Pipelines runs of at least `services` services (0: every run; tests
    /// use it to put small models through the writer thread).
    pub fn with_pipeline_from(mut self, services: usize) -> Self {
        self.pipeline_from = services;
        self
    }

    /// Hands writes to the writer thread in chunks of at least `writes`
    /// (tests put chunk edges where they want them).
    pub fn with_pipeline_chunk(mut self, writes: usize) -> Self {
        self.pipeline_chunk = writes.max(1);
        self
    }

    pub fn maps(&self) -> &M {
        self.maps.as_ref().expect(MAPS_LENT)
    }

    pub fn maps_mut(&mut self) -> &mut M {
        self.maps.as_mut().expect(MAPS_LENT)
    }

    /// Id-table entries looked at so far (a cost measure for tests).
    pub fn ids_touched(&self) -> u64 {
        self.ids.touched()
    }

    /// Mirror of the maps' contents.
    pub fn state(&self) -> &MapState {
        &self.state
    }

    /// The model the maps converge to (the latest from the sources).
    pub fn target(&self) -> &Model {
        &self.target
    }

    /// The frontends in the maps of services that export their counters
    /// (`Service::metrics`): the few the metrics name, found without a
    /// scan of every service.
    pub fn metric_frontends(&self) -> Vec<MetricFrontend> {
        let mut out = Vec::new();
        for name in &self.metric_services {
            for key in self.held.get(name).into_iter().flatten() {
                let Some(master) = self.state.services.get(key) else {
                    continue;
                };
                out.push(MetricFrontend {
                    service_id: master.service_id,
                    namespace: name.namespace().to_string(),
                    name: name.name().to_string(),
                    frontend: crate::cli::service_list::frontend_text(key),
                    kind: crate::cli::service_list::type_name(master.flags),
                });
            }
        }
        out
    }

    /// Services refused by the last reconcile, waiting for a retry.
    pub fn pending(&self) -> &BTreeSet<ServiceName> {
        &self.pending
    }

    /// UDP backends deleted since the last call: connected sockets may still
    /// point at them (see `crate::sockets`).
    pub fn take_removed_udp(&mut self) -> Vec<(std::net::IpAddr, u16)> {
        std::mem::take(&mut self.removed_udp)
    }

    /// Converges to a complete model (services file, or a relist).
    pub fn reconcile(&mut self, model: &Model) -> Result<ReconcileStats, ReconcileError> {
        self.reconcile_model(model.clone())
    }

    /// `reconcile`, keeping `model` as the target instead of a copy of it
    /// (at 100 000 services a copy is tens of megabytes).
    pub fn reconcile_model(&mut self, mut model: Model) -> Result<ReconcileStats, ReconcileError> {
        model.shrink_to_fit();
        self.had_input = true;
        let dirty = self.target.changed_services(&model);
        self.target = model;
        self.metric_services = self
            .target
            .services
            .iter()
            .filter(|(_, s)| s.metrics)
            .map(|(n, _)| n.clone())
            .collect();
        self.run(dirty)
    }

    /// Applies changes to some services (`None`: the service is gone).
    pub fn reconcile_changes(
        &mut self,
        changes: impl IntoIterator<Item = (ServiceName, Option<Service>)>,
    ) -> Result<ReconcileStats, ReconcileError> {
        self.had_input = true;
        let mut dirty = BTreeSet::new();
        for (name, svc) in changes {
            if svc.as_ref().is_some_and(|s| s.metrics) {
                self.metric_services.insert(name.clone());
            } else {
                self.metric_services.remove(&name);
            }
            let changed = match svc {
                Some(mut s) => {
                    s.shrink_to_fit();
                    if self.target.services.get(&name) == Some(&s) {
                        false
                    } else {
                        self.target.services.insert(name.clone(), s);
                        true
                    }
                }
                None => self.target.services.remove(&name).is_some(),
            };
            if changed {
                dirty.insert(name);
            }
        }
        self.run(dirty)
    }

    /// Retries refused services (and a pending full sync) without new input.
    pub fn retry(&mut self) -> Result<ReconcileStats, ReconcileError> {
        self.run(BTreeSet::new())
    }

    /// Whether `retry` has something to do: refused services, or a full
    /// sync due after a failed write (not the first one: before any input
    /// the target is empty, and a sync would sweep the pinned state).
    pub fn needs_retry(&self) -> bool {
        !self.pending.is_empty() || self.had_input && (self.needs_full_sync || self.mirror_ahead)
    }

    fn run(&mut self, mut dirty: BTreeSet<ServiceName>) -> Result<ReconcileStats, ReconcileError> {
        // A write owed from an earlier failure (deletes the programs have
        // not heard of), before anything else, the read-back too (it does
        // not need it): this run may write nothing.
        if let Err(source) = self.maps_mut().settle() {
            self.pending.extend(dirty);
            self.needs_full_sync = true;
            return Err(ReconcileError::Apply {
                service: "a write owed from an earlier failure".to_string(),
                applied: 0,
                total: 0,
                source,
            });
        }
        // A diff against a mirror that is ahead of the maps would skip
        // writes that never landed: read them back first, or write nothing
        // (what is dirty stays pending, and a full sync stays due).
        if self.mirror_ahead {
            if let Err(e) = self.read_back() {
                self.pending.extend(dirty);
                return Err(ReconcileError::ReadBack(e));
            }
        }
        let started = Instant::now();
        let full = self.needs_full_sync;
        if full {
            self.holder.clear();
            self.held.clear();
            dirty = self.target.services.keys().cloned().collect();
            // Frontends of services that are gone are swept below.
        }
        dirty.extend(std::mem::take(&mut self.pending));
        self.capacity = self.maps().capacity();
        let (mut ops, refused) = if dirty.len() >= self.pipeline_from.max(1) {
            self.apply_services_pipelined(&dirty, full)?
        } else {
            self.apply_services(&dirty, full)?
        };
        if full {
            let unowned: HashSet<SvcKey> = self
                .state
                .frontends()
                .map(|(k, _)| *k)
                .filter(|k| !self.holder.contains_key(k))
                .collect();
            let sweep_ops = sweep(&self.state, &unowned);
            ops += sweep_ops.len();
            self.write("full-sync sweep", &sweep_ops)?;
            let repair = filter::repair(&self.state);
            self.write("frontend filter", &repair)?;
            self.ids.retain_applied(&self.state);
            self.needs_full_sync = false;
        }
        if !refused.is_empty() {
            return Err(ReconcileError::Refused(refused));
        }
        Ok(ReconcileStats {
            full_sync: full,
            services_changed: dirty.len(),
            ops,
            duration: started.elapsed(),
        })
    }

    /// Applies each service of `dirty` in turn: the writes made, and the
    /// services refused.
    fn apply_services(
        &mut self,
        dirty: &BTreeSet<ServiceName>,
        full: bool,
    ) -> Result<(usize, Vec<(ServiceName, ServiceError)>), ReconcileError> {
        let mut ops = 0;
        let mut refused = Vec::new();
        let total = dirty.len();
        let mut reported = Instant::now();
        for (done, name) in dirty.iter().enumerate() {
            if self.cancelled() {
                // What is left waits for the next run. A full sync stays
                // due and lists every service again: nothing to keep (and
                // cloning 100 000 names would only delay a stop).
                if !full {
                    self.pending.extend(dirty.iter().skip(done).cloned());
                }
                return Err(ReconcileError::Cancelled { done, total });
            }
            if reported.elapsed() >= self.progress_every {
                tracing::info!(done, total, full_sync = full, "reconciling");
                reported = Instant::now();
            }
            match self.apply_service(name) {
                Ok(n) => ops += n,
                Err(Step::Refused(e)) => {
                    self.pending.insert(name.clone());
                    refused.push((name.clone(), e));
                }
                Err(Step::Write(e)) => return Err(e),
            }
        }
        Ok((ops, refused))
    }

    /// `apply_services` with the writes handed to a writer thread that
    /// owns the maps meanwhile (see `pipeline`). When it returns, every
    /// write sent has been made or refused, and the writer is gone.
    fn apply_services_pipelined(
        &mut self,
        dirty: &BTreeSet<ServiceName>,
        full: bool,
    ) -> Result<(usize, Vec<(ServiceName, ServiceError)>), ReconcileError> {
        let mut maps = self.maps.take().expect(MAPS_LENT);
        let (tx, writer) = pipeline::channel(self.pipeline_chunk);
        // The writer borrows the maps, so they are still here whatever
        // happens to the thread.
        let outcome = std::thread::scope(|scope| {
            let spawned = std::thread::Builder::new()
                .name("lb-map-writer".into())
                .spawn_scoped(scope, || writer.run(&mut maps));
            let Ok(writer) = spawned else {
                return None;
            };
            self.pipe = Some(tx);
            // Caught so the channel is closed even then: a writer left
            // waiting for more would keep the scope from ever ending.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.apply_services(dirty, full)
            }));
            // Closing the channel lets the writer finish what is queued.
            if let Some(pipe) = self.pipe.take() {
                pipe.finish();
            }
            let failure = writer.join();
            Some((result, failure))
        });
        self.maps = Some(maps);
        let Some((result, failure)) = outcome else {
            // No thread to be had (a pids limit): the same work, serially.
            tracing::warn!("could not start the map writer thread; writing from this one");
            return self.apply_services(dirty, full);
        };
        let result = result.unwrap_or_else(|panic| {
            // Whoever catches it finds the mirror suspect.
            self.needs_full_sync = true;
            self.mirror_ahead = true;
            std::panic::resume_unwind(panic)
        });
        match failure.unwrap_or_else(|panic| std::panic::resume_unwind(panic)) {
            // The mirror ran ahead of the maps (it was updated as the
            // writes were queued): read back what they hold instead.
            Some(f) => Err(self.after_failed_pipeline(f)),
            None => result,
        }
    }

    /// After a queued write failed: the mirror is made what the maps hold
    /// (the writes after the failed one were never made), the ids follow
    /// it, and a full sync is due.
    fn after_failed_pipeline(&mut self, f: pipeline::Failure) -> ReconcileError {
        self.needs_full_sync = true;
        self.mirror_ahead = true;
        if let Err(e) = self.read_back() {
            // Tried again before the next run writes anything.
            tracing::error!(
                error = e,
                "reading the maps back after a failed write failed"
            );
        }
        ReconcileError::Apply {
            service: f.what,
            applied: f.applied,
            total: f.total,
            source: f.error,
        }
    }

    /// Makes the mirror what the maps hold, after a pipelined run whose
    /// writes stopped at a failure (`mirror_ahead`).
    fn read_back(&mut self) -> Result<(), String> {
        let state = self.maps().dump().map_err(|e| format!("{e:#}"))?;
        self.state = state;
        self.mirror_ahead = false;
        // Ids freed by deletes that never landed are taken back; ids of
        // entries that never landed are forgotten. The next-id counters
        // stay where they were, so no id is handed out again early.
        self.ids.retain_applied(&self.state);
        self.ids.restore(&self.state);
        // UDP backends whose delete never landed are still there: their
        // sockets are left alone.
        let udp_left: HashSet<(std::net::IpAddr, u16)> = self
            .state
            .backends
            .values()
            .filter(|b| b.proto == lb_common::proto::UDP)
            .map(|b| (b.address, b.port))
            .collect();
        self.removed_udp.retain(|b| !udp_left.contains(b));
        Ok(())
    }

    /// Makes the maps match the target for one service. Returns the writes made.
    fn apply_service(&mut self, name: &ServiceName) -> Result<usize, Step> {
        // Frontends this service's entries hold now; one another service
        // took over in this same batch is not ours to remove.
        let replaced: HashSet<SvcKey> = self
            .held
            .get(name)
            .into_iter()
            .flatten()
            .filter(|k| self.holder.get(k) == Some(name))
            .copied()
            .collect();
        let mut desired = Desired::default();
        // A refusal gives back only the ids this service took: O(service),
        // not O(all frontends) per refused service (which made refusing k of
        // n services cost n·k).
        self.ids.begin();
        if let Some(svc) = self.target.services.get(name) {
            if let Err(e) =
                desired::build([svc], &self.state, &mut self.ids, &self.cfg, &mut desired)
            {
                self.ids.rollback();
                return Err(Step::Refused(e.into()));
            }
        }
        let ops = diff(&self.state, &replaced, &desired);
        if let Err(e) = self.check_capacity(&ops) {
            self.ids.rollback();
            return Err(Step::Refused(e));
        }
        self.write(&name.to_string(), &ops).map_err(Step::Write)?;

        for k in &replaced {
            self.holder.remove(k);
        }
        let keys: SmallVec<[SvcKey; 1]> = desired.frontends.iter().map(|f| f.key).collect();
        for k in &keys {
            self.holder.insert(*k, name.clone());
        }
        if keys.is_empty() {
            self.held.remove(name);
        } else {
            self.held.insert(name.clone(), keys);
        }
        Ok(ops.len())
    }

    /// Writes `ops` as they are (a diff or a sweep: the frontend filter's
    /// words are part of them, `diff::filter`), the mirror following.
    fn write(&mut self, what: &str, ops: &[MapOp]) -> Result<(), ReconcileError> {
        if ops.is_empty() {
            return Ok(());
        }
        if let Some(pipe) = &mut self.pipe {
            // Queued, not yet made: the mirror runs ahead of the maps until
            // the writer catches up (or is read back if a write fails).
            let sent = pipe.send(what, ops);
            self.follow(ops);
            return sent;
        }
        let (applied, failure) = match self.maps_mut().apply_all(ops) {
            Ok(()) => (ops.len(), None),
            Err((applied, e)) => (applied, Some(e)),
        };
        // The mirror follows exactly what reached the maps.
        self.follow(&ops[..applied]);
        if let Some(source) = failure {
            self.needs_full_sync = true;
            self.ids.retain_applied(&self.state);
            return Err(ReconcileError::Apply {
                service: what.to_string(),
                applied,
                total: ops.len(),
                source,
            });
        }
        Ok(())
    }

    /// The mirror, the ids and the list of removed UDP backends after `ops`.
    fn follow(&mut self, ops: &[MapOp]) {
        for op in ops {
            if let MapOp::DeleteBackend(id, _) = op {
                if let Some(b) = self
                    .state
                    .backends
                    .get(id)
                    .filter(|b| b.proto == lb_common::proto::UDP)
                {
                    self.removed_udp.push((b.address, b.port));
                }
            }
            self.state.apply(op);
            match op {
                MapOp::DeleteRevNat(id, _) => self.ids.release_service(*id),
                MapOp::DeleteBackend(id, _) => self.ids.release_backend(*id),
                _ => {}
            }
        }
    }

    /// Refuses a change that cannot fit, before writing anything. Inserts come
    /// before deletes in a diff, so the peak is the current size plus inserts.
    /// Each family has its own maps of the same capacity.
    fn check_capacity(&self, ops: &[MapOp]) -> Result<(), ServiceError> {
        match capacity::overfilled(ops, &self.state, &self.capacity) {
            None => Ok(()),
            Some((m, needed)) => Err(ServiceError::Capacity {
                map: m.map(),
                needed,
                max: m.max(&self.capacity),
                flag: m.flag(),
            }),
        }
    }
}

const MAPS_LENT: &str = "the maps are lent to a writer thread only within a run";

enum Step {
    Refused(ServiceError),
    Write(ReconcileError),
}
