//! `LB_CONFIG`: the settings every program reads. Every write goes through
//! `ConfigSlots` (the pinned map, the map of a just-loaded object, or a
//! plain map in tests), and each slot has one writer, listed in `WRITERS`
//! (a test checks every slot is listed once):
//!
//! * the agent's start settings (`agent::settings::StartSettings::write`);
//! * the run-time settings of `SETTINGS` (`lbctl config set`; the agent
//!   writes their start values too);
//! * the frontend filter's trust, cleared by an install before it attaches
//!   programs (`datapath::install`) and set by the reconciler after its
//!   first full sync (`MapOp::TrustFilter`, `maps::bpf`).
use std::{borrow::BorrowMut, collections::BTreeMap, path::Path};

use anyhow::{bail, Context as _};
use aya::maps::{Array, MapData};
use lb_common::{config::*, maps as names};

use crate::maps::bpf::open_pinned;

/// Where `LB_CONFIG` writes go: the pinned map, a loaded object's map, or a
/// map in tests.
pub trait ConfigSlots {
    fn get(&self, index: u32) -> anyhow::Result<u32>;
    fn set(&mut self, index: u32, value: u32) -> anyhow::Result<()>;
}

impl<T: BorrowMut<MapData>> ConfigSlots for Array<T, u32> {
    fn get(&self, index: u32) -> anyhow::Result<u32> {
        Array::get(self, &index, 0).with_context(|| format!("reading LB_CONFIG[{index}]"))
    }
    fn set(&mut self, index: u32, value: u32) -> anyhow::Result<()> {
        Array::set(self, index, value, 0).with_context(|| format!("writing LB_CONFIG[{index}]"))
    }
}

impl ConfigSlots for BTreeMap<u32, u32> {
    fn get(&self, index: u32) -> anyhow::Result<u32> {
        Ok(BTreeMap::get(self, &index).copied().unwrap_or(0))
    }
    fn set(&mut self, index: u32, value: u32) -> anyhow::Result<()> {
        self.insert(index, value);
        Ok(())
    }
}

/// Who writes a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    /// The agent at start, from its flags (`StartSettings`).
    Start,
    /// `lbctl config set` at any time (`SETTINGS`); the agent writes the
    /// start value.
    Runtime,
    /// The install clears it, the reconciler sets it (the frontend filter's
    /// trust).
    FilterTrust,
}

/// Every slot of `LB_CONFIG` and its one writer.
pub const WRITERS: [(u32, Writer); CONFIG_SLOTS as usize] = [
    (CFG_LOG_LEVEL, Writer::Runtime),
    (CFG_TRACE, Writer::Runtime),
    (CFG_EVENT_RATE, Writer::Runtime),
    (CFG_HOST_NS_ONLY, Writer::Runtime),
    (CFG_HOST_NETNS_COOKIE_LO, Writer::Start),
    (CFG_HOST_NETNS_COOKIE_HI, Writer::Start),
    (CFG_LB_MODE, Writer::Start),
    (CFG_MAGLEV_M, Writer::Start),
    (CFG_SNAT_PORT_MIN, Writer::Start),
    (CFG_SNAT_PORT_MAX, Writer::Start),
    (CFG_CT_TCP_S, Writer::Start),
    (CFG_CT_TCP_SYN_S, Writer::Start),
    (CFG_CT_CLOSING_S, Writer::Start),
    (CFG_CT_UDP_S, Writer::Start),
    (CFG_FRONTEND_FILTER, Writer::FilterTrust),
    (CFG_SNAT_PORTS_EVER, Writer::Start),
];

/// The writer of a slot.
pub fn writer_of(index: u32) -> Option<Writer> {
    WRITERS.iter().find(|(i, _)| *i == index).map(|(_, w)| *w)
}

/// A setting: its name on the command line, its slot, and its value names.
pub struct Setting {
    pub name: &'static str,
    pub index: u32,
    pub help: &'static str,
    pub default: u32,
}

pub const SETTINGS: [Setting; 4] = [
    Setting {
        name: "bpf-log-level",
        index: CFG_LOG_LEVEL,
        help: "aya-log level of the programs: off, error, warn, info, debug, trace",
        default: DEFAULT_LOG_LEVEL,
    },
    Setting {
        name: "trace",
        index: CFG_TRACE,
        help: "trace events for every translation: on or off",
        default: 0,
    },
    Setting {
        name: "event-rate",
        index: CFG_EVENT_RATE,
        help: "events per second per CPU before rate limiting",
        default: DEFAULT_EVENT_RATE,
    },
    Setting {
        name: "host-namespace-only",
        index: CFG_HOST_NS_ONLY,
        help: "translate only sockets of the host network namespace: on or off",
        default: 0,
    },
];

const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

pub fn setting(name: &str) -> anyhow::Result<&'static Setting> {
    SETTINGS.iter().find(|s| s.name == name).with_context(|| {
        format!(
            "unknown setting {name:?}; known: {}",
            SETTINGS
                .iter()
                .map(|s| s.name)
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// Parses a value for a setting, with an error that lists what is allowed.
pub fn parse_value(s: &Setting, text: &str) -> anyhow::Result<u32> {
    match s.index {
        CFG_LOG_LEVEL => LEVELS
            .iter()
            .position(|l| *l == text)
            .map(|p| p as u32)
            .with_context(|| {
                format!(
                    "{}: {text:?} is not a level; use one of {}",
                    s.name,
                    LEVELS.join(", ")
                )
            }),
        CFG_TRACE | CFG_HOST_NS_ONLY => match text {
            "on" | "true" | "1" => Ok(1),
            "off" | "false" | "0" => Ok(0),
            _ => bail!("{}: use on or off", s.name),
        },
        _ => match text.parse::<u32>() {
            Ok(v) if v > 0 => Ok(v),
            _ => bail!("{}: {text:?} is not a positive number", s.name),
        },
    }
}

pub fn format_value(s: &Setting, v: u32) -> String {
    match s.index {
        CFG_LOG_LEVEL => LEVELS.get(v as usize).copied().unwrap_or("?").to_string(),
        CFG_TRACE | CFG_HOST_NS_ONLY => if v != 0 { "on" } else { "off" }.to_string(),
        _ => v.to_string(),
    }
}

/// The pinned `LB_CONFIG`.
pub struct RuntimeConfig {
    map: Array<MapData, u32>,
}

impl ConfigSlots for RuntimeConfig {
    fn get(&self, index: u32) -> anyhow::Result<u32> {
        ConfigSlots::get(&self.map, index)
    }
    fn set(&mut self, index: u32, value: u32) -> anyhow::Result<()> {
        ConfigSlots::set(&mut self.map, index, value)
    }
}

impl RuntimeConfig {
    pub fn open(pin_dir: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            map: Array::try_from(open_pinned(pin_dir, names::LB_CONFIG)?)?,
        })
    }

    /// Every setting with its current value. An unset log level or rate
    /// reads as 0 in the map; the programs treat 0 rate as the default.
    pub fn all(&self) -> anyhow::Result<Vec<(&'static Setting, u32)>> {
        SETTINGS
            .iter()
            .map(|s| Ok((s, self.get(s.index)?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new slot must say who writes it: every slot once, in order.
    #[test]
    fn every_config_slot_has_one_writer() {
        let slots: Vec<u32> = WRITERS.iter().map(|(i, _)| *i).collect();
        assert_eq!(slots, (0..CONFIG_SLOTS).collect::<Vec<_>>());
        let runtime: Vec<u32> = WRITERS
            .iter()
            .filter(|(_, w)| *w == Writer::Runtime)
            .map(|(i, _)| *i)
            .collect();
        let settings: Vec<u32> = SETTINGS.iter().map(|s| s.index).collect();
        assert_eq!(
            runtime, settings,
            "the run-time slots are SETTINGS' and only those"
        );
        assert_eq!(writer_of(CFG_FRONTEND_FILTER), Some(Writer::FilterTrust));
    }
}
