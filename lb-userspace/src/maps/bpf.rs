//! The real maps: opened from their pins, so the agent and lbctl see the same
//! objects whether or not the agent that created them is still running.
use std::{io, os::fd::AsFd as _, path::Path};

use anyhow::Context as _;
use aya::maps::{
    Array, HashMap, HashOfMaps, IterableMap as _, Map, MapData, MapError, PerCpuArray,
};
use lb_common::{
    affinity::AffinityMatchKey,
    config::CFG_FRONTEND_FILTER,
    conntrack::next_backends_gen,
    drop::{drop_index, Direction, DropReason},
    maps as names,
};

use crate::datapath::config::ConfigSlots;

use super::{
    catalog,
    family::{BothFamilies, RunMap},
    Family, LbMaps, MapOp, MapSizes, MapState, MapWriteError, SizeFlag,
};

pub struct BpfMaps {
    /// Services, backends, reverse NAT and source ranges, once per family.
    families: BothFamilies,
    affinity: HashMap<MapData, AffinityMatchKey, u8>,
    affinity_groups: HashMap<MapData, u32, u32>,
    maglev: HashOfMaps<MapData, u32, Array<MapData, u32>>,
    fe_filter: Array<MapData, u64>,
    config: Array<MapData, u32>,
    /// `LB_BACKENDS_GEN`: moved on after every run of backend deletes, so
    /// known flows check their backend again
    /// (`lb_common::conntrack::CtValue::backends_gen`). None: pins of a
    /// build without it, read by lbctl; a write that needs it fails.
    backends_gen: Option<Array<MapData, u32>>,
    /// A backend delete was tried and the generation has not moved since
    /// (the move failed, or the run of deletes stopped at a failure): moved
    /// before anything else is written, and by `settle`.
    gen_due: bool,
    /// `LB_SVC_STATS`: a frontend's entry follows its reverse-NAT entry
    /// (`stats`). None: pins of a build without it.
    stats: Option<super::stats::StatsMap>,
    /// A stats entry could not be made or deleted: `settle` makes the map
    /// agree with the frontends again.
    stats_due: bool,
    capacity: MapSizes,
}

/// Inner maps of LB_MAGLEV may have any size (the configured M): the flag
/// the program's template carries, include/uapi/linux/bpf.h BPF_F_INNER_MAP.
const BPF_F_INNER_MAP: u32 = 1 << 12;

/// Opens a pinned map, with an error that says what to do when it is missing.
pub fn open_pinned(pin_dir: &Path, name: &str) -> anyhow::Result<Map> {
    let path = pin_dir.join(name);
    if !path.exists() {
        anyhow::bail!(
            "map {name} is not pinned at {}: the data path is not installed there \
             (start lb-agent, or pass the right --pin-dir)",
            path.display()
        );
    }
    let data = MapData::from_pin(&path)
        .with_context(|| format!("opening pinned map {}", path.display()))?;
    Map::from_map_data(data).with_context(|| format!("map {}", path.display()))
}

/// The kernel's count of a pinned map's memory in bytes (fdinfo
/// `memlock`; exact since Linux 6.4, an estimate from the capacity before):
/// a preallocated map shows its whole capacity, others what they use.
pub fn memory(pin_dir: &Path, name: &str) -> anyhow::Result<u64> {
    use std::os::fd::AsRawFd as _;
    let data = MapData::from_pin(pin_dir.join(name))
        .with_context(|| format!("opening pinned map {name}"))?;
    let fd = data.fd().as_fd().as_raw_fd();
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
        .with_context(|| format!("fdinfo of map {name}"))?;
    info.lines()
        .find_map(|l| l.strip_prefix("memlock:"))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no memlock in the fdinfo of map {name}"))
}

/// Capacity of a pinned map.
pub fn max_entries(pin_dir: &Path, name: &str) -> anyhow::Result<u32> {
    let data = MapData::from_pin(pin_dir.join(name))
        .with_context(|| format!("opening pinned map {name}"))?;
    Ok(data
        .info()
        .with_context(|| format!("info of map {name}"))?
        .max_entries())
}

/// The sizes the pinned maps were made with: each flag's value read from
/// the first map the catalog sizes with it (both families share the sizes;
/// a map not pinned leaves the default).
fn pinned_sizes(pin_dir: &Path) -> anyhow::Result<MapSizes> {
    let mut sizes = MapSizes::default();
    for flag in SizeFlag::ALL {
        let first = catalog::CATALOG
            .iter()
            .find(|m| matches!(m.capacity, catalog::Capacity::Sized(f) if f == flag));
        if let Some(m) = first.filter(|m| pin_dir.join(m.name).exists()) {
            flag.set(&mut sizes, max_entries(pin_dir, m.name)?);
        }
    }
    Ok(sizes)
}

impl BpfMaps {
    pub fn open(pin_dir: &Path) -> anyhow::Result<Self> {
        let capacity = pinned_sizes(pin_dir)?;
        let backends_gen: Option<Array<MapData, u32>> =
            if pin_dir.join(names::LB_BACKENDS_GEN).exists() {
                Some(Array::try_from(open_pinned(
                    pin_dir,
                    names::LB_BACKENDS_GEN,
                )?)?)
            } else {
                None
            };
        Ok(Self {
            families: BothFamilies::open(pin_dir)?,
            affinity: HashMap::try_from(open_pinned(pin_dir, names::LB_AFFINITY_MATCH)?)?,
            affinity_groups: HashMap::try_from(open_pinned(pin_dir, names::LB_AFFINITY_GROUP)?)?,
            maglev: HashOfMaps::try_from(open_pinned(pin_dir, names::LB_MAGLEV)?)?,
            fe_filter: Array::try_from(open_pinned(pin_dir, names::LB4_FE_FILTER)?)?,
            config: Array::try_from(open_pinned(pin_dir, names::LB_CONFIG)?)?,
            backends_gen,
            gen_due: false,
            stats: super::stats::StatsMap::open(pin_dir)?,
            stats_due: false,
            capacity,
        })
    }
}

pub(super) fn io_error(e: MapError) -> io::Error {
    match e {
        MapError::SyscallError(s) => s.io_error,
        other => io::Error::other(other.to_string()),
    }
}

/// Deleting what is already gone is success: deletes are idempotent.
pub(super) fn ignore_missing(r: Result<(), MapError>) -> Result<(), io::Error> {
    match r.map_err(io_error) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        other => other,
    }
}

/// Moves the backends' generation in `LB_BACKENDS_GEN` on by one (read
/// from the map, not remembered: another load of the object may have moved
/// it, and writing a value it already had would move nothing). Shared by the
/// writer (after deletes) and by every load of the object
/// (`datapath::load`).
pub fn move_generation<T: std::borrow::BorrowMut<MapData>>(
    map: &mut Array<T, u32>,
) -> Result<(), MapError> {
    let now = map.get(&0, 0)?;
    map.set(0, next_backends_gen(now), 0)
}

/// Whether a backend delete ends at `i`: the programs must hear of it (the
/// generation moves on) before anything after it is written.
fn ends_backend_deletes(ops: &[MapOp], i: usize) -> bool {
    let deletes = |op: Option<&MapOp>| matches!(op, Some(MapOp::DeleteBackend(..)));
    deletes(ops.get(i)) && !deletes(ops.get(i + 1))
}

impl BpfMaps {
    /// Moves the backends' generation on (after backend deletes): every
    /// known flow looks its backend up once more. On failure it stays due.
    fn move_backends_gen(&mut self) -> Result<(), MapWriteError> {
        let failed = |source| MapWriteError {
            map: names::LB_BACKENDS_GEN,
            op: "moving the backends' generation on after backend deletes".to_string(),
            source,
        };
        let Some(map) = &mut self.backends_gen else {
            return Err(failed(io::Error::other(
                "not pinned: the data path is from a build without it (restart lb-agent)",
            )));
        };
        move_generation(map).map_err(|e| failed(io_error(e)))?;
        self.gen_due = false;
        Ok(())
    }

    /// A move still due, made now, before anything else is written.
    fn settle_backends_gen(&mut self) -> Result<(), MapWriteError> {
        if self.gen_due {
            self.move_backends_gen()?;
        }
        Ok(())
    }

    /// On the way out with a failure: deletes that landed before it still
    /// get their move (if that fails too, it stays due).
    fn failing<E>(&mut self, e: E) -> E {
        if self.gen_due {
            if let Err(moved) = self.move_backends_gen() {
                tracing::warn!("{moved}: due before the next write");
            }
        }
        e
    }

    /// One operation, without the generation's move (`apply` and
    /// `apply_all` make it).
    fn apply_one(&mut self, op: &MapOp) -> Result<(), MapWriteError> {
        if matches!(op, MapOp::DeleteBackend(..)) {
            self.gen_due = true;
        }
        // Services, backends, reverse NAT, source ranges: the family's maps.
        let family = match op.family() {
            Some(Family::V4) => self.families.v4.apply(op),
            Some(Family::V6) => self.families.v6.apply(op),
            None => None,
        };
        let result = match (family, op) {
            (Some(done), _) => done,
            (None, MapOp::UpsertAffinityMatch(s, b)) => self
                .affinity
                .insert(
                    AffinityMatchKey {
                        service_id: *s,
                        backend_id: *b,
                    },
                    1,
                    0,
                )
                .map_err(io_error),
            (None, MapOp::SetAffinityGroup(s, g)) => {
                self.affinity_groups.insert(s, g, 0).map_err(io_error)
            }
            (None, MapOp::DeleteAffinityGroup(s)) => ignore_missing(self.affinity_groups.remove(s)),
            (None, MapOp::DeleteAffinityMatch(s, b)) => {
                ignore_missing(self.affinity.remove(&AffinityMatchKey {
                    service_id: *s,
                    backend_id: *b,
                }))
            }
            (None, MapOp::SetMaglev(s, table)) => self.set_maglev(*s, table),
            (None, MapOp::DeleteMaglev(s)) => ignore_missing(self.maglev.remove(s)),
            (None, MapOp::SetFilterWord(i, w)) => self.fe_filter.set(*i, *w, 0).map_err(io_error),
            (None, MapOp::TrustFilter(t)) => {
                ConfigSlots::set(&mut self.config, CFG_FRONTEND_FILTER, u32::from(*t))
                    .map_err(io::Error::other)
            }
            // Every other operation is one family's, written above.
            (None, _) => Err(io::Error::other("no map takes this operation")),
        };
        result.map_err(|source| MapWriteError {
            map: op.map_name(),
            op: format!("{op:?}"),
            source,
        })?;
        self.follow_stats(std::slice::from_ref(op));
        Ok(())
    }

    /// The stats entries that come and go with reverse-NAT entries
    /// (`stats`), after `ops` landed. A failure is warned about and leaves
    /// the map to `settle`: it never fails the writes themselves.
    fn follow_stats(&mut self, ops: &[MapOp]) {
        let Some(stats) = &mut self.stats else {
            return;
        };
        for op in ops {
            if let Err(e) = stats.follow(op) {
                tracing::warn!(
                    "{}: the stats entry of {op:?}: {e}; made again at the next run",
                    names::LB_SVC_STATS
                );
                self.stats_due = true;
            }
        }
    }

    /// `--service-stats`: whether frontends get counters (off: none, and
    /// those in the map go at `adopt_service_stats`).
    pub fn with_service_stats(mut self, on: bool) -> Self {
        if let Some(stats) = &mut self.stats {
            stats.set_enabled(on);
        }
        self
    }

    /// Makes `LB_SVC_STATS` agree with the frontends in the maps
    /// (`stats::StatsMap::adopt`): at start, and after a stats write
    /// failed. Returns (made, deleted).
    pub fn adopt_service_stats(&mut self) -> anyhow::Result<(usize, usize)> {
        let Some(stats) = &mut self.stats else {
            return Ok((0, 0));
        };
        let mut ids = self.families.v4.revnat_ids()?;
        ids.extend(self.families.v6.revnat_ids()?);
        let done = stats.adopt(&ids)?;
        self.stats_due = false;
        Ok(done)
    }

    /// A stats repair still due, tried now (warned about, never failing).
    fn settle_stats(&mut self) {
        if self.stats_due {
            match self.adopt_service_stats() {
                Ok((made, deleted)) => {
                    tracing::info!(made, deleted, "{} repaired", names::LB_SVC_STATS);
                }
                Err(e) => tracing::warn!(
                    "{}: {e:#}; tried again at the next run",
                    names::LB_SVC_STATS
                ),
            }
        }
    }

    /// A new inner table, filled in one batch, then swapped in for the old
    /// one by a single update of the outer map: a lookup sees the old table
    /// or the new one, never a mix.
    fn set_maglev(&mut self, service_id: u32, table: &[u32]) -> io::Result<()> {
        let inner =
            Array::<MapData, u32>::create(table.len() as u32, BPF_F_INNER_MAP).map_err(io_error)?;
        let keys: Vec<u32> = (0..table.len() as u32).collect();
        crate::sys::bpf::map_update_batch_of(inner.map().fd().as_fd(), &keys, table)
            .map_err(|(_, e)| e)?;
        self.maglev.insert(service_id, &inner, 0).map_err(io_error)
    }
}

/// Which run of batchable writes an operation belongs to: upserts into the
/// same hash map of one family. Everything else is written on its own.
fn run_of(op: &MapOp) -> Option<(Family, RunMap)> {
    let map = match op {
        MapOp::UpsertService(..) => RunMap::Services,
        MapOp::UpsertBackend(..) => RunMap::Backends,
        MapOp::UpsertRevNat(..) => RunMap::RevNat,
        _ => return None,
    };
    Some((op.family()?, map))
}

impl BpfMaps {
    /// One run of upserts into one map, as a single BPF_MAP_UPDATE_BATCH.
    fn write_run(
        &mut self,
        (family, map): (Family, RunMap),
        ops: &[MapOp],
    ) -> Result<(), (usize, io::Error)> {
        match family {
            Family::V4 => self.families.v4.write_run(map, ops),
            Family::V6 => self.families.v6.write_run(map, ops),
        }
    }
}

impl LbMaps for BpfMaps {
    /// Consecutive upserts into one map go in one syscall: a full sync of
    /// 10 000 services × 10 endpoints makes about 40 000 calls instead of
    /// 230 000. The order of writes is unchanged.
    fn apply_all(&mut self, ops: &[MapOp]) -> Result<(), (usize, MapWriteError)> {
        self.settle_backends_gen().map_err(|e| (0, e))?;
        let mut i = 0;
        while i < ops.len() {
            let run = run_of(&ops[i]);
            let end = match run {
                Some(r) => {
                    i + ops[i..]
                        .iter()
                        .take_while(|op| run_of(op) == Some(r))
                        .count()
                }
                None => i + 1,
            };
            match run {
                Some(r) if end - i > 1 => {
                    if let Err((done, source)) = self.write_run(r, &ops[i..end]) {
                        // What landed brings its stats entries along.
                        self.follow_stats(&ops[i..i + done.min(end - i)]);
                        let failed = &ops[i + done.min(end - i - 1)];
                        return Err(self.failing((
                            i + done,
                            MapWriteError {
                                map: failed.map_name(),
                                op: format!("{failed:?}"),
                                source,
                            },
                        )));
                    }
                    self.follow_stats(&ops[i..end]);
                }
                _ => {
                    if let Err(e) = self.apply_one(&ops[i]) {
                        return Err(self.failing((i, e)));
                    }
                    // One move for a run of deletes. The deletes landed:
                    // a failed move is reported after them (i + 1 applied),
                    // so the caller counts them as made; the move stays due.
                    if ends_backend_deletes(ops, i) {
                        self.move_backends_gen().map_err(|e| (i + 1, e))?;
                    }
                }
            }
            i = end;
        }
        Ok(())
    }

    fn apply(&mut self, op: &MapOp) -> Result<(), MapWriteError> {
        self.settle_backends_gen()?;
        if let Err(e) = self.apply_one(op) {
            return Err(self.failing(e));
        }
        self.settle_backends_gen()
    }

    fn settle(&mut self) -> Result<(), MapWriteError> {
        self.settle_stats();
        self.settle_backends_gen()
    }

    fn dump(&self) -> anyhow::Result<MapState> {
        let (mut services, mut backends, mut revnat, mut source_ranges) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        self.families.v4.dump_into(
            &mut services,
            &mut backends,
            &mut revnat,
            &mut source_ranges,
        )?;
        self.families.v6.dump_into(
            &mut services,
            &mut backends,
            &mut revnat,
            &mut source_ranges,
        )?;
        let mut affinity = Vec::new();
        for e in &self.affinity {
            let (k, _) = e.context("reading LB_AFFINITY_MATCH")?;
            affinity.push((k.service_id, k.backend_id));
        }
        let mut maglev = Vec::new();
        for k in self.maglev.keys() {
            let k = k.context("reading LB_MAGLEV")?;
            let inner: Array<MapData, u32> =
                self.maglev.get(&k, 0).context("reading a Maglev table")?;
            let table =
                crate::sys::bpf::array_lookup_all(inner.map().fd().as_fd(), inner.len() as usize)
                    .context("reading a Maglev table")?;
            maglev.push((k, table));
        }
        let groups: Vec<(u32, u32)> = self
            .affinity_groups
            .iter()
            .collect::<Result<_, _>>()
            .context("reading LB_AFFINITY_GROUP")?;
        let mut state = MapState::from_entries(
            services,
            backends,
            revnat,
            affinity,
            maglev,
            source_ranges,
            groups,
        );
        let words: Vec<u64> = crate::sys::bpf::array_lookup_all(
            self.fe_filter.map().fd().as_fd(),
            self.fe_filter.len() as usize,
        )
        .context("reading LB4_FE_FILTER")?;
        for (i, w) in words.into_iter().enumerate() {
            state.apply(&MapOp::SetFilterWord(i as u32, w));
        }
        let trusted = ConfigSlots::get(&self.config, CFG_FRONTEND_FILTER)?;
        state.apply(&MapOp::TrustFilter(trusted != 0));
        Ok(state)
    }

    fn capacity(&self) -> MapSizes {
        self.capacity
    }
}

/// One drop counter, summed over CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DropCount {
    pub reason: &'static str,
    pub direction: &'static str,
    pub packets: u64,
}

/// Reads `LB_DROPS`: every reason and direction, zeros included.
pub fn read_drops(pin_dir: &Path) -> anyhow::Result<Vec<DropCount>> {
    let drops: PerCpuArray<MapData, u64> =
        PerCpuArray::try_from(open_pinned(pin_dir, names::LB_DROPS)?)?;
    let mut out = Vec::new();
    for reason in DropReason::ALL {
        for direction in Direction::ALL {
            let values = drops
                .get(&drop_index(reason, direction), 0)
                .context("reading LB_DROPS")?;
            out.push(DropCount {
                reason: reason.name(),
                direction: direction.name(),
                packets: values.iter().sum(),
            });
        }
    }
    Ok(out)
}

/// Number of entries in a pinned map with keys (hash maps, LRU hashes, LPM
/// tries, the Maglev hash of maps); arrays and ring buffers have no
/// meaningful count: None. The key size comes from the kernel's map info,
/// so no map needs listing here.
pub fn count_entries(pin_dir: &Path, name: &str) -> anyhow::Result<Option<usize>> {
    let map = open_pinned(pin_dir, name)?;
    let (Map::HashMap(data)
    | Map::LruHashMap(data)
    | Map::PerCpuHashMap(data)
    | Map::PerCpuLruHashMap(data)
    | Map::LpmTrie(data)
    | Map::HashOfMaps(data)) = &map
    else {
        return Ok(None);
    };
    let info = data.info().context("reading the map's info")?;
    let n = crate::sys::bpf::count_keys(data.fd().as_fd(), info.key_size() as usize)
        .with_context(|| format!("walking the keys of {name}"))?;
    Ok(Some(n))
}

/// The TCP sockets `LB_SOCK_TCP` holds a translation for (its slots with
/// a cookie; a TCP socket that outlived its slot is in LB4/6_SOCK_REVNAT).
pub fn count_tcp_table(pin_dir: &Path) -> anyhow::Result<usize> {
    let table: Array<MapData, lb_common::sock::SockTcpSlot> =
        Array::try_from(open_pinned(pin_dir, names::LB_SOCK_TCP)?)?;
    let mut n = 0;
    for slot in table.iter() {
        if slot.context("reading LB_SOCK_TCP")?.cookie != 0 {
            n += 1;
        }
    }
    Ok(n)
}

/// Every entry of a north-south conntrack table (LB4_CT with `u32`
/// addresses, LB6_CT with `[u32; 4]`).
pub fn read_ct<A>(
    pin_dir: &Path,
    name: &str,
) -> anyhow::Result<
    Vec<(
        lb_common::conntrack::CtKey<A>,
        lb_common::conntrack::CtValue<A>,
    )>,
>
where
    lb_common::conntrack::CtKey<A>: aya::Pod,
    lb_common::conntrack::CtValue<A>: aya::Pod,
{
    let map: HashMap<MapData, lb_common::conntrack::CtKey<A>, lb_common::conntrack::CtValue<A>> =
        HashMap::try_from(open_pinned(pin_dir, name)?)?;
    // An LRU entry can vanish between listing its key and reading it.
    Ok(map.iter().flatten().collect())
}
