//! In-memory maps for tests of the reconciler: same `LbMaps` contract as the
//! BPF maps, records every operation, can be told to fail.
use super::{capacity, Capacity, LbMaps, MapOp, MapState, MapWriteError};

#[derive(Debug, Default)]
pub struct FakeMaps {
    pub state: MapState,
    pub log: Vec<MapOp>,
    pub capacity: Capacity,
    /// Fail the n-th next operation (0 = the next one) with EIO.
    pub fail_after: Option<usize>,
}

impl FakeMaps {
    pub fn with_capacity(capacity: Capacity) -> Self {
        Self {
            capacity,
            ..Default::default()
        }
    }

    /// Returns and clears the operation log.
    pub fn take_log(&mut self) -> Vec<MapOp> {
        std::mem::take(&mut self.log)
    }
}

impl LbMaps for FakeMaps {
    fn apply(&mut self, op: &MapOp) -> Result<(), MapWriteError> {
        if let Some(n) = self.fail_after.as_mut() {
            if *n == 0 {
                self.fail_after = None;
                return Err(MapWriteError {
                    map: op.map_name(),
                    op: format!("{op:?}"),
                    source: std::io::Error::from_raw_os_error(libc::EIO),
                });
            }
            *n -= 1;
        }
        // What the kernel refuses, the fake refuses: an array of no entries
        // (BPF_MAP_CREATE with max_entries 0 is EINVAL).
        if let MapOp::SetMaglev(_, table) = op {
            if table.is_empty() {
                return Err(MapWriteError {
                    map: op.map_name(),
                    op: format!("{op:?}"),
                    source: std::io::Error::from_raw_os_error(libc::EINVAL),
                });
            }
        }
        // Capacities are per family, like the real LB4_* / LB6_* maps.
        let full = capacity::out_of_range(op)
            || capacity::Bounded::added_by(op, &self.state)
                .is_some_and(|m| m.len(&self.state) >= m.max(&self.capacity) as usize);
        if full {
            return Err(MapWriteError {
                map: op.map_name(),
                op: format!("{op:?}"),
                source: std::io::Error::from_raw_os_error(libc::E2BIG),
            });
        }
        self.state.apply(op);
        self.log.push(op.clone());
        Ok(())
    }

    fn dump(&self) -> anyhow::Result<MapState> {
        Ok(self.state.clone())
    }

    fn capacity(&self) -> Capacity {
        self.capacity
    }
}
