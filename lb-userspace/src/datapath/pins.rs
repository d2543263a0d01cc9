//! Where things are pinned, and checks that pinned maps fit this build.
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use aya::maps::MapData;
use lb_common::maps as names;

use crate::maps::MapSizes;

/// Default pin directory; the layout version is part of the path because the
/// kernel reuses a pin without checking its key and value sizes.
pub fn default_pin_dir() -> PathBuf {
    PathBuf::from(format!("/sys/fs/bpf/lb/v{}", names::LAYOUT_VERSION))
}

/// Whether an agent has pinned its maps in `pin_dir` before (the data path
/// holds a state that a restart keeps serving).
pub fn has_state(pin_dir: &Path) -> bool {
    pin_dir.join(names::LB4_SERVICES).exists()
}

pub struct PinLayout {
    dir: PathBuf,
}

impl PinLayout {
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
        }
    }

    pub fn map(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn links_dir(&self) -> PathBuf {
        self.dir.join("links")
    }

    pub fn link(&self, hook: &str) -> PathBuf {
        self.links_dir().join(hook)
    }

    /// Checks every already pinned map against this build's layout and the
    /// requested sizes. Returns whether any map was pinned already.
    pub fn check_pinned_maps(&self, sizes: &MapSizes) -> anyhow::Result<bool> {
        let mut any = false;
        for m in crate::maps::catalog::CATALOG {
            let (name, max) = (m.name, m.max_entries(sizes));
            let Some((key, value)) = m.sizes else {
                continue;
            };
            let path = self.map(name);
            if !path.exists() {
                continue;
            }
            any = true;
            let info = MapData::from_pin(&path)?.info()?;
            if info.key_size() as usize != key || info.value_size() as usize != value {
                bail!(
                    "pinned map {} has key/value sizes {}/{} but this build expects {key}/{value}: \
                     it was made by an incompatible version; run `lb-agent uninstall --pin-dir {}` first",
                    path.display(),
                    info.key_size(),
                    info.value_size(),
                    self.dir.display()
                );
            }
            if m.preallocatable {
                let preallocated = info.map_flags() & BPF_F_NO_PREALLOC == 0;
                if preallocated != sizes.preallocate {
                    let (was, asked) = if preallocated {
                        ("preallocated", "without --preallocate-maps")
                    } else {
                        ("not preallocated", "with --preallocate-maps")
                    };
                    bail!(
                        "pinned map {} is {was} but the agent runs {asked}: a pinned map keeps how it was made; \
                         start the agent as before, or run `lb-agent uninstall --pin-dir {}` and start again",
                        path.display(),
                        self.dir.display()
                    );
                }
            }
            if let Some(max) = max {
                if info.max_entries() != max {
                    bail!(
                        "pinned map {} holds {} entries but {max} were asked for: a pinned map cannot be resized; \
                         keep the old size, or run `lb-agent uninstall --pin-dir {}` and start again",
                        path.display(),
                        info.max_entries(),
                        self.dir.display()
                    );
                }
            }
        }
        Ok(any)
    }

    /// With `--preallocate-maps`: makes and pins the maps it applies to
    /// (those not pinned yet) before the object is loaded, so the loader
    /// takes them instead of making them as the object says
    /// (BPF_F_NO_PREALLOC). Preallocated, a map reserves its whole capacity
    /// at once (`lbctl status` and docs/datapath.md give the memory).
    pub fn create_preallocated(&self, sizes: &MapSizes) -> anyhow::Result<()> {
        let mut made = Vec::new();
        let result = self.create_preallocated_into(sizes, &mut made);
        if result.is_err() {
            // None or all: a start without the flag must not find some of
            // them preallocated (it would be refused until an uninstall).
            for path in made {
                let _ = std::fs::remove_file(path);
            }
        }
        result
    }

    fn create_preallocated_into(
        &self,
        sizes: &MapSizes,
        made: &mut Vec<PathBuf>,
    ) -> anyhow::Result<()> {
        for m in crate::maps::catalog::CATALOG
            .iter()
            .filter(|m| m.preallocatable)
        {
            let path = self.map(m.name);
            let (Some((key, value)), Some(max)) = (m.sizes, m.max_entries(sizes)) else {
                bail!("{}: the catalog gives no sizes to make it with", m.name);
            };
            if path.exists() {
                continue;
            }
            let def =
                aya_obj::Map::new_from_params(BPF_MAP_TYPE_HASH, key as u32, value as u32, max, 0);
            let map = MapData::create(def, m.name, None)
                .with_context(|| format!("making {} preallocated ({max} entries)", m.name))?;
            map.pin(&path)
                .with_context(|| format!("pinning {}", path.display()))?;
            made.push(path);
        }
        Ok(())
    }
}

/// `bpf_map_type::BPF_MAP_TYPE_HASH` and the flag the object gives the
/// agent-written hash maps (include/uapi/linux/bpf.h).
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_F_NO_PREALLOC: u32 = 1;
