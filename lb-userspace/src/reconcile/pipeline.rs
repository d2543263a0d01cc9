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

/// Writes per hand-over. Each hand-over wakes a thread (a futex call and a
/// context switch); a full sync of 10 000 services is 230 000 writes in
/// about 30 000 `write_ops` calls, so they travel in chunks.
pub const CHUNK: usize = 1024;

/// Chunks the reconciler may be ahead of the writer by: enough to keep
/// the writer busy, few enough that a cancelled run (the agent stopping)
/// drains in milliseconds.
const DEPTH: usize = 4;

/// From this many services on, a run is pipelined. Below it the thread is
/// not worth starting: one change is written at once, in microseconds.
pub const FROM_SERVICES: usize = 64;

/// Writes of several `write_ops` calls, in order, and where each call's
/// writes end (with what they are for: an error names it).
#[derive(Default)]
struct Chunk {
    ops: Vec<MapOp>,
    parts: Vec<(String, usize)>,
}

impl Chunk {
    /// The failure of the call whose writes hold index `failed`. Past the
    /// last write (`failed` is the chunk's length): every write landed and
    /// what failed was owed after them (`LbMaps::apply_all`); it is the
    /// last call's.
    fn failure(self, failed: usize, error: MapWriteError) -> Failure {
        let mut start = 0;
        let last = self.parts.len().saturating_sub(1);
        for (k, (what, end)) in self.parts.into_iter().enumerate() {
            if failed < end || k == last {
                return Failure {
                    what,
                    applied: failed - start,
                    total: end - start,
                    error,
                };
            }
            start = end;
        }
        unreachable!("every write of a chunk belongs to a part")
    }
}

/// The first write that failed: what it was for, how many of its
/// `write_ops` call were made before it, and why.
pub struct Failure {
    pub what: String,
    pub applied: usize,
    pub total: usize,
    pub error: MapWriteError,
}

pub struct Sender {
    tx: mpsc::SyncSender<Chunk>,
    chunk: Chunk,
    /// Hand over once this many writes are queued (`CHUNK`).
    size: usize,
}

impl Sender {
    /// Queues `ops`. Fails when the writer has stopped on a failed write:
    /// the caller stops computing; the writer's own error replaces this
    /// one when the run ends.
    pub fn send(&mut self, what: &str, ops: &[MapOp]) -> Result<(), super::ReconcileError> {
        self.chunk.ops.extend_from_slice(ops);
        self.chunk
            .parts
            .push((what.to_string(), self.chunk.ops.len()));
        if self.chunk.ops.len() < self.size {
            return Ok(());
        }
        self.flush().map_err(|()| super::ReconcileError::Apply {
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

    /// Hands over what is queued; the writer stopped when this fails.
    fn flush(&mut self) -> Result<(), ()> {
        if self.chunk.ops.is_empty() {
            return Ok(());
        }
        self.tx
            .send(std::mem::take(&mut self.chunk))
            .map_err(|_| ())
    }

    /// Hands over the rest and closes the channel: the writer makes what
    /// is queued and ends.
    pub fn finish(mut self) {
        // A writer that stopped reports its own failure.
        let _ = self.flush();
    }
}

pub struct Writer(mpsc::Receiver<Chunk>);

/// A writer and its sender, handing over chunks of at least `size` writes.
pub fn channel(size: usize) -> (Sender, Writer) {
    let (tx, rx) = mpsc::sync_channel(DEPTH);
    (
        Sender {
            tx,
            chunk: Chunk::default(),
            size,
        },
        Writer(rx),
    )
}

impl Writer {
    /// Makes every queued write in order until the sender is gone or a
    /// write fails; the failure if there was one.
    pub fn run<M: LbMaps>(self, maps: &mut M) -> Option<Failure> {
        for chunk in &self.0 {
            if let Err((applied, error)) = maps.apply_all(&chunk.ops) {
                // Returning drops the receiver: later sends fail and the
                // reconciler stops; nothing queued after this is made.
                return Some(chunk.failure(applied, error));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error() -> MapWriteError {
        MapWriteError {
            map: "LB_BACKENDS_GEN",
            op: "test".to_string(),
            source: std::io::Error::other("test"),
        }
    }

    fn chunk() -> Chunk {
        Chunk {
            ops: Vec::new(),
            parts: vec![("a".to_string(), 3), ("b".to_string(), 5)],
        }
    }

    #[test]
    fn a_failure_is_the_call_whose_writes_hold_it_and_past_the_last_write_the_last_call() {
        let f = chunk().failure(3, error());
        assert_eq!((f.what.as_str(), f.applied, f.total), ("b", 0, 2));
        let f = chunk().failure(2, error());
        assert_eq!((f.what.as_str(), f.applied, f.total), ("a", 2, 3));
        // Every write landed, what they owed after them failed.
        let f = chunk().failure(5, error());
        assert_eq!((f.what.as_str(), f.applied, f.total), ("b", 2, 2));
    }
}
