//! The reconciler: model → desired state → diff → apply.
//!
//! It keeps a mirror of what the maps hold (restored from the pinned maps on
//! start) and the model it last applied. A new model is compared service by
//! service; only services that changed are recomputed and diffed, so the cost
//! of an update follows the size of the change, not of the cluster.
//!
//! The first reconcile after a start (and the one after a failed apply) is a
//! full sync: every frontend in the maps is compared with the desired state
//! and anything unaccounted for is removed. Because slots and ids are
//! restored, a restarted agent with an unchanged model writes nothing.
use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    time::{Duration, Instant},
};

use lb_common::maps as names;

use crate::{
    desired::{self, Desired, DesiredError, Ids},
    diff::diff,
    maps::{Family, LbMaps, MapOp, MapState, MapWriteError, SvcKey},
    model::{Model, ServiceName},
};

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Desired(#[from] DesiredError),
    #[error(
        "{map} would need {needed} entries during this update but holds at most {max}: \
         raise {flag} or remove services; nothing was changed"
    )]
    Capacity { map: &'static str, needed: usize, max: u32, flag: &'static str },
    #[error("applying the change failed after {applied} of {total} writes: {source}; will retry with a full sync")]
    Apply {
        applied: usize,
        total: usize,
        #[source]
        source: MapWriteError,
    },
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
    maps: M,
    state: MapState,
    ids: Ids,
    /// Model last applied successfully.
    applied: Model,
    /// Master keys each service owns in the maps.
    owners: BTreeMap<ServiceName, Vec<SvcKey>>,
    needs_full_sync: bool,
}

impl<M: LbMaps> Reconciler<M> {
    /// Takes over whatever the maps hold (ids, slots) without changing it.
    pub fn restore(maps: M) -> anyhow::Result<Self> {
        let state = maps.dump()?;
        let mut ids = Ids::default();
        ids.restore(&state);
        Ok(Self { maps, state, ids, applied: Model::default(), owners: BTreeMap::new(), needs_full_sync: true })
    }

    pub fn maps(&self) -> &M {
        &self.maps
    }

    pub fn maps_mut(&mut self) -> &mut M {
        &mut self.maps
    }

    /// Mirror of the maps' contents.
    pub fn state(&self) -> &MapState {
        &self.state
    }

    pub fn applied_model(&self) -> &Model {
        &self.applied
    }

    /// Makes the maps match `model`. On error the maps keep their previous
    /// contents (capacity and id errors are found before any write) or, if a
    /// write failed midway, a consistent subset that the next call repairs.
    pub fn reconcile(&mut self, model: &Model) -> Result<ReconcileStats, ReconcileError> {
        let started = Instant::now();
        let full = self.needs_full_sync;
        let changed: BTreeSet<ServiceName> = if full {
            model.services.keys().cloned().collect()
        } else {
            self.applied.changed_services(model)
        };

        let replaced: HashSet<SvcKey> = if full {
            self.state.frontends().map(|(k, _)| *k).collect()
        } else {
            changed.iter().filter_map(|n| self.owners.get(n)).flatten().copied().collect()
        };

        let mut desired = Desired::default();
        let mut owners = Vec::new();
        for name in &changed {
            let Some(svc) = model.services.get(name) else {
                owners.push((name.clone(), Vec::new()));
                continue;
            };
            let before = desired.frontends.len();
            if let Err(e) = desired::build([svc], &self.state, &mut self.ids, &mut desired) {
                self.ids.retain_applied(&self.state);
                return Err(e.into());
            }
            owners.push((name.clone(), desired.frontends[before..].iter().map(|f| f.key).collect()));
        }

        let ops = diff(&self.state, &replaced, &desired, full);
        if let Err(e) = self.check_capacity(&ops) {
            self.ids.retain_applied(&self.state);
            return Err(e);
        }

        for (i, op) in ops.iter().enumerate() {
            if let Err(source) = self.maps.apply(op) {
                self.needs_full_sync = true;
                self.ids.retain_applied(&self.state);
                return Err(ReconcileError::Apply { applied: i, total: ops.len(), source });
            }
            self.state.apply(op);
            self.release_ids(op);
        }

        if full {
            self.owners.clear();
        }
        for (name, keys) in owners {
            if keys.is_empty() {
                self.owners.remove(&name);
            } else {
                self.owners.insert(name, keys);
            }
        }
        self.applied = model.clone();
        self.needs_full_sync = false;
        Ok(ReconcileStats {
            full_sync: full,
            services_changed: changed.len(),
            ops: ops.len(),
            duration: started.elapsed(),
        })
    }

    fn release_ids(&mut self, op: &MapOp) {
        match op {
            MapOp::DeleteRevNat(id, _) => self.ids.release_service(*id),
            MapOp::DeleteBackend(id, _) => self.ids.release_backend(*id),
            _ => {}
        }
    }

    /// Refuses a change that cannot fit, before writing anything. Inserts come
    /// before deletes in a diff, so the peak is the current size plus inserts.
    /// Each family has its own maps of the same capacity.
    fn check_capacity(&self, ops: &[MapOp]) -> Result<(), ReconcileError> {
        let cap = self.maps.capacity();
        for family in [Family::V4, Family::V6] {
            let (mut services, mut backends, mut revnat) = self.state.counts(family);
            for op in ops.iter().filter(|op| op.family() == family) {
                match op {
                    MapOp::UpsertService(k, _) if !self.state.services.contains_key(k) => services += 1,
                    MapOp::UpsertBackend(id, _) if !self.state.backends.contains_key(id) => backends += 1,
                    MapOp::UpsertRevNat(id, _) if !self.state.revnat.contains_key(id) => revnat += 1,
                    _ => {}
                }
            }
            let v4 = family == Family::V4;
            let checks = [
                (if v4 { names::LB4_SERVICES } else { names::LB6_SERVICES }, services, cap.services, "--map-size-services"),
                (if v4 { names::LB4_BACKENDS } else { names::LB6_BACKENDS }, backends, cap.backends, "--map-size-backends"),
                (if v4 { names::LB4_REVNAT } else { names::LB6_REVNAT }, revnat, cap.revnat, "--map-size-services"),
            ];
            for (map, needed, max, flag) in checks {
                if needed > max as usize {
                    return Err(ReconcileError::Capacity { map, needed, max, flag });
                }
            }
        }
        Ok(())
    }
}
