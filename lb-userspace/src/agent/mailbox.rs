//! Between the sources and the reconcile worker: a mailbox that never makes
//! a source wait. Events that arrive while the worker is busy are merged: a
//! complete model replaces everything before it; changes to a service
//! replace earlier changes to the same service. The worker takes all of it
//! at once when it is free. So a Kubernetes watch keeps being read during a
//! full sync of 100 000 services, and a burst of edits costs one reconcile.
use std::{
    collections::BTreeMap,
    sync::{Condvar, Mutex},
    time::{Duration, Instant},
};

use crate::{
    model::{Model, Service, ServiceName},
    source::SourceEvent,
};

/// What is waiting for the worker.
#[derive(Debug, Default)]
pub struct Pending {
    /// A complete model, applied first.
    pub full: Option<Model>,
    /// Changes after it (or since the last run), by service.
    pub changes: BTreeMap<ServiceName, Option<Service>>,
    /// Errors and warnings, in order, reported before anything is applied.
    pub notes: Vec<SourceEvent>,
    /// When the oldest of these changes was observed (propagation delay).
    pub observed: Option<Instant>,
    /// When they were made upstream (network programming latency).
    pub triggers: Vec<crate::source::Trigger>,
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.full.is_none() && self.changes.is_empty() && self.notes.is_empty()
    }

    fn add(&mut self, ev: SourceEvent) {
        match ev {
            SourceEvent::Full {
                model,
                observed,
                triggers,
            } => {
                self.full = Some(model);
                self.changes.clear();
                self.observed.get_or_insert(observed);
                // Replaced changes are programmed by the full model: their
                // trigger times stay.
                self.triggers.extend(triggers);
            }
            SourceEvent::Changes {
                changes,
                observed,
                triggers,
            } => {
                // Nothing changed: no start for the next change's delay.
                if !changes.is_empty() {
                    self.observed.get_or_insert(observed);
                }
                self.changes.extend(changes);
                self.triggers.extend(triggers);
            }
            note @ (SourceEvent::Error { .. } | SourceEvent::Warning { .. }) => {
                self.notes.push(note);
            }
        }
    }
}

#[derive(Default)]
pub struct Mailbox {
    pending: Mutex<(Pending, bool)>,
    ready: Condvar,
    /// The worker has stopped writing (its state may still be dropping).
    stopped: Mutex<bool>,
    stopped_cv: Condvar,
}

impl Mailbox {
    /// Leaves an event for the worker; never blocks on the worker.
    pub fn post(&self, ev: SourceEvent) {
        let mut g = self.pending.lock().unwrap();
        g.0.add(ev);
        self.ready.notify_one();
    }

    /// Asks the worker to stop (it sees `None` from `take`).
    pub fn close(&self) {
        self.pending.lock().unwrap().1 = true;
        self.ready.notify_all();
    }

    /// Said by the worker once it writes no more, before it frees its
    /// state: freeing a 100 000-service model takes longer than a stop may.
    pub fn worker_stopped(&self) {
        *self.stopped.lock().unwrap() = true;
        self.stopped_cv.notify_all();
    }

    /// Waits at most `timeout` for `worker_stopped`; whether it came.
    pub fn wait_worker_stopped(&self, timeout: Duration) -> bool {
        let g = self.stopped.lock().unwrap();
        let (g, _) = self
            .stopped_cv
            .wait_timeout_while(g, timeout, |stopped| !*stopped)
            .unwrap();
        *g
    }

    /// Everything waiting, once there is something or `timeout` passed
    /// (an empty `Pending`); None once closed.
    pub fn take(&self, timeout: Duration) -> Option<Pending> {
        let deadline = Instant::now() + timeout;
        let mut g = self.pending.lock().unwrap();
        loop {
            if g.1 {
                return None;
            }
            if !g.0.is_empty() {
                return Some(std::mem::take(&mut g.0));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Some(Pending::default());
            }
            g = self.ready.wait_timeout(g, left).unwrap().0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ServiceName;

    fn changes(names: &[&str]) -> SourceEvent {
        SourceEvent::Changes {
            changes: names
                .iter()
                .map(|n| (ServiceName::new("default", *n), None))
                .collect(),
            observed: Instant::now(),
            triggers: Vec::new(),
        }
    }

    #[test]
    fn a_stop_is_seen_by_a_waiter_and_a_missing_one_times_out() {
        let m = std::sync::Arc::new(Mailbox::default());
        assert!(!m.wait_worker_stopped(Duration::from_millis(20)));
        let worker = {
            let m = m.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                m.worker_stopped();
            })
        };
        let t = Instant::now();
        assert!(m.wait_worker_stopped(Duration::from_secs(10)));
        assert!(t.elapsed() < Duration::from_secs(5), "woken, not timed out");
        worker.join().unwrap();
    }

    #[test]
    fn a_full_model_replaces_what_came_before_and_changes_merge_after_it() {
        let m = Mailbox::default();
        m.post(changes(&["a"]));
        m.post(SourceEvent::Full {
            model: Model::default(),
            observed: Instant::now(),
            triggers: Vec::new(),
        });
        m.post(changes(&["b"]));
        m.post(changes(&["b", "c"]));
        let p = m.take(Duration::ZERO).unwrap();
        assert!(p.full.is_some());
        let names: Vec<_> = p.changes.keys().map(|n| n.name().to_string()).collect();
        assert_eq!(names, ["b", "c"], "a is superseded by the full model");
        assert!(m.take(Duration::from_millis(10)).unwrap().is_empty());
        m.close();
        assert!(m.take(Duration::from_secs(10)).is_none(), "closed: at once");
    }
}
