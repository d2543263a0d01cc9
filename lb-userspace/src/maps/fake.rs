//! In-memory maps for tests of the reconciler: same `LbMaps` contract as the
//! BPF maps, records every operation, can be told to fail.
use super::{capacity, LbMaps, MapOp, MapSizes, MapState, MapWriteError};

#[derive(Debug, Default)]
pub struct FakeMaps {
    pub state: MapState,
    pub log: Vec<MapOp>,
    pub capacity: MapSizes,
    /// Fail the n-th next operation (0 = the next one) with EIO.
    pub fail_after: Option<usize>,
    /// Moments between two writes when a Maglev master named a table size
    /// past the end of its table: the programs would drop new flows then
    /// (`maglev-missing`). Tests of the write order expect none.
    pub maglev_overruns: Vec<String>,
    /// What LB_CONFIG's CFG_MAGLEV_M holds here: the size of the tables of
    /// masters that name none (0: `DEFAULT_MAGLEV_M`).
    pub legacy_maglev_m: u32,
}

impl FakeMaps {
    pub fn with_capacity(capacity: MapSizes) -> Self {
        Self {
            capacity,
            ..Default::default()
        }
    }

    /// What the programs would do with the state after `op`: index a
    /// master's table with the size the master names (`CFG_MAGLEV_M`, the
    /// default size, for a master of an older agent).
    fn check_maglev_sizes(&mut self, op: &MapOp) {
        use lb_common::{maps::maglev_size_of, service::ALG_MAGLEV};
        let legacy = match self.legacy_maglev_m {
            0 => lb_common::maps::DEFAULT_MAGLEV_M,
            m => m,
        };
        // None: a code past the list (the programs drop: maglev-missing).
        let size = |v: &lb_common::service::ServiceValue| match v.maglev_size {
            0 => Some(legacy as usize),
            code => maglev_size_of(code).map(|m| m as usize),
        };
        let masters: Vec<_> = match op {
            MapOp::UpsertService(key, v) if key.slot == 0 => vec![(*key, *v)],
            MapOp::SetMaglev(id, _) | MapOp::DeleteMaglev(id) => self
                .state
                .services
                .iter()
                .filter(|(k, v)| k.slot == 0 && v.service_id == *id)
                .map(|(k, v)| (*k, *v))
                .collect(),
            _ => return,
        };
        for (key, v) in masters {
            // A master without a backend to choose answers "no backend"
            // before it reads a table.
            if v.algorithm != ALG_MAGLEV || v.count == 0 && v.terminating_count == 0 {
                continue;
            }
            let table = self.state.maglev.get(&v.service_id).map(|t| t.len());
            let fits = matches!((size(&v), table), (Some(m), Some(len)) if m <= len);
            if !fits {
                let op = match op {
                    MapOp::SetMaglev(id, t) => format!("SetMaglev({id}, {} slots)", t.len()),
                    other => format!("{other:?}"),
                };
                self.maglev_overruns.push(format!(
                    "after {op}: {key:?} names M = {:?} but its table has {table:?} slots",
                    size(&v),
                ));
            }
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
        self.check_maglev_sizes(op);
        self.log.push(op.clone());
        Ok(())
    }

    fn dump(&self) -> anyhow::Result<MapState> {
        Ok(self.state.clone())
    }

    fn capacity(&self) -> MapSizes {
        self.capacity
    }
}
