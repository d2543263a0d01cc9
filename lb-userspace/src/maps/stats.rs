//! `LB_SVC_STATS`, traffic per frontend (`lb_common::stats`): the entries'
//! upkeep, and the sums `lbctl` and the metrics read.
//!
//! An entry lives exactly as long as its frontend's reverse-NAT entry: one
//! per frontend, keyed by the same service id. So the writer makes it when
//! it writes a reverse-NAT entry (that is, for a new frontend: an existing
//! one's reverse-NAT entry never changes) and deletes it with it, and no
//! operation of the diff has to name it. At start the agent makes the two
//! agree (`adopt`): pins from a build without the map, or a crash between
//! the two writes; and again after any stats write failed. A stats write
//! never fails a reconcile: counters must not hold back service changes.
use std::{collections::BTreeMap, io, path::Path};

use anyhow::Context as _;
use aya::maps::{MapData, PerCpuHashMap, PerCpuValues};
use lb_common::{maps as names, stats::ServiceStats};

use super::{
    bpf::{ignore_missing, io_error, open_pinned},
    MapOp,
};

/// The open map and how many CPUs a value holds.
pub struct StatsMap {
    map: PerCpuHashMap<MapData, u32, ServiceStats>,
    cpus: usize,
    /// Frontends get entries (`--service-stats on`); off, none is made and
    /// `adopt` deletes them all.
    enabled: bool,
}

impl StatsMap {
    /// None when the pins are from a build without the map.
    pub fn open(pin_dir: &Path) -> anyhow::Result<Option<Self>> {
        if !pin_dir.join(names::LB_SVC_STATS).exists() {
            return Ok(None);
        }
        let map = PerCpuHashMap::try_from(open_pinned(pin_dir, names::LB_SVC_STATS)?)?;
        let cpus = aya::util::nr_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
        Ok(Some(Self {
            map,
            cpus,
            enabled: true,
        }))
    }

    /// `--service-stats off`: no entries.
    pub fn set_enabled(&mut self, on: bool) {
        self.enabled = on;
    }

    fn zeros(&self) -> io::Result<PerCpuValues<ServiceStats>> {
        PerCpuValues::try_from(vec![ServiceStats::default(); self.cpus])
            .map_err(|e| io::Error::other(e.to_string()))
    }

    /// Makes a frontend's entry unless it has one (its counts are kept:
    /// the same frontend, written again).
    pub fn create(&mut self, service_id: u32) -> io::Result<()> {
        const BPF_NOEXIST: u64 = 1;
        let zeros = self.zeros()?;
        match self
            .map
            .insert(service_id, zeros, BPF_NOEXIST)
            .map_err(io_error)
        {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            other => other,
        }
    }

    pub fn delete(&mut self, service_id: u32) -> io::Result<()> {
        ignore_missing(self.map.remove(&service_id))
    }

    /// The entry an operation brings along, after it landed.
    pub fn follow(&mut self, op: &MapOp) -> io::Result<()> {
        match op {
            MapOp::UpsertRevNat(id, _) if self.enabled => self.create(*id),
            MapOp::DeleteRevNat(id, _) => self.delete(*id),
            _ => Ok(()),
        }
    }

    /// Makes the entries agree with the frontends (`frontends`: every
    /// service id with a reverse-NAT entry): each gets one, and entries of
    /// no frontend go. Returns (made, deleted).
    pub fn adopt(&mut self, frontends: &[u32]) -> anyhow::Result<(usize, usize)> {
        let have: Vec<u32> = self
            .map
            .keys()
            .collect::<Result<_, _>>()
            .context("reading the keys of LB_SVC_STATS")?;
        let frontends = if self.enabled { frontends } else { &[] };
        let want: std::collections::HashSet<u32> = frontends.iter().copied().collect();
        let mut deleted = 0;
        for id in have.iter().filter(|id| !want.contains(id)) {
            self.delete(*id)
                .with_context(|| format!("deleting the stats of service id {id}"))?;
            deleted += 1;
        }
        let have: std::collections::HashSet<u32> = have.into_iter().collect();
        let mut made = 0;
        for id in frontends.iter().filter(|id| !have.contains(id)) {
            self.create(*id)
                .with_context(|| format!("making the stats of service id {id}"))?;
            made += 1;
        }
        Ok((made, deleted))
    }

    /// One frontend's counts, summed over the CPUs; None without an entry.
    pub fn get(&self, service_id: u32) -> anyhow::Result<Option<ServiceStats>> {
        match self.map.get(&service_id, 0) {
            Ok(values) => Ok(Some(sum(&values))),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(e).context("reading LB_SVC_STATS"),
        }
    }

    /// Every frontend's counts, summed over the CPUs.
    pub fn read_all(&self) -> anyhow::Result<BTreeMap<u32, ServiceStats>> {
        let mut out = BTreeMap::new();
        // An entry can go between listing its key and reading it.
        for (id, values) in self.map.iter().flatten() {
            out.insert(id, sum(&values));
        }
        Ok(out)
    }
}

/// A frontend's counts: its CPUs' values added up.
fn sum(values: &PerCpuValues<ServiceStats>) -> ServiceStats {
    let mut total = ServiceStats::default();
    for v in values.iter() {
        total.add(v);
    }
    total
}

/// Every frontend's counts from the pins; empty when the data path is
/// from a build without them.
pub fn read(pin_dir: &Path) -> anyhow::Result<BTreeMap<u32, ServiceStats>> {
    match StatsMap::open(pin_dir)? {
        Some(m) => m.read_all(),
        None => Ok(BTreeMap::new()),
    }
}
