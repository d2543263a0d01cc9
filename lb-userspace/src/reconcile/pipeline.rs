//! The writer thread of a pipelined reconcile.
//!
//! A full sync is mostly the kernel's work: each element inserted into a
//! hash map costs about a microsecond in bpf(2) (docs/benchmarks.md,
//! section 2), against a few hundred nanoseconds to compute it. So the
//! reconciler computes service after service while this thread makes the
//! writes, and the two overlap. The channel is a FIFO and there is one
//! writer: the maps see the writes in exactly the order they were
//! computed, which is the order that keeps every intermediate state valid
//! for a reader (`crate::diff`). After a failed write nothing later is
//! made: the writer drops the channel and the reconciler stops sending.
use std::sync::mpsc;

use crate::maps::{LbMaps, MapOp, MapWriteError};

/// Runs of writes the reconciler may be ahead of the writer by. A few
/// dozen services: enough to keep the writer busy, short enough that a
/// cancelled run (the agent stopping) drains in milliseconds.
const DEPTH: usize = 64;

/// From this many services on, a run is pipelined. Below it the thread is
/// not worth starting: one change is written at once, in microseconds.
pub const FROM_SERVICES: usize = 64;

/// One `write_ops` call: the writes, and what they are for (the error names it).
struct Batch {
    what: String,
    ops: Vec<MapOp>,
}

/// The first write that failed: what it was for, how many of its run
/// were made before it, and why.
pub struct Failure {
    pub what: String,
    pub applied: usize,
    pub total: usize,
    pub error: MapWriteError,
}

pub struct Sender(mpsc::SyncSender<Batch>);

impl Sender {
    /// Queues `ops`. Fails when the writer has stopped on a failed write:
    /// the caller stops computing; the writer's own error replaces this
    /// one when the run ends.
    pub fn send(&self, what: &str, ops: &[MapOp]) -> Result<(), super::ReconcileError> {
        let batch = Batch {
            what: what.to_string(),
            ops: ops.to_vec(),
        };
        self.0
            .send(batch)
            .map_err(|_| super::ReconcileError::Apply {
                service: what.to_string(),
                applied: 0,
                total: ops.len(),
                source: MapWriteError {
                    map: "-",
                    op: "queued write".into(),
                    source: std::io::Error::other("an earlier write failed"),
                },
            })
    }
}

pub struct Writer(mpsc::Receiver<Batch>);

pub fn channel() -> (Sender, Writer) {
    let (tx, rx) = mpsc::sync_channel(DEPTH);
    (Sender(tx), Writer(rx))
}

impl Writer {
    /// Makes every queued write in order until the sender is dropped or a
    /// write fails; gives the maps back, with the failure if there was one.
    pub fn run<M: LbMaps>(self, mut maps: M) -> (M, Option<Failure>) {
        for batch in &self.0 {
            if let Err((applied, error)) = maps.apply_all(&batch.ops) {
                // Returning drops the receiver: later sends fail and the
                // reconciler stops; nothing queued after this is made.
                let failure = Failure {
                    what: batch.what,
                    applied,
                    total: batch.ops.len(),
                    error,
                };
                return (maps, Some(failure));
            }
        }
        (maps, None)
    }
}
