//! `LB_CONFIG`: run-time settings every program reads (log level, tracing,
//! event rate). Written by the agent at start and by `lbctl config set`.
use std::path::Path;

use anyhow::{bail, Context as _};
use aya::maps::{Array, MapData};
use lb_common::{config::*, maps as names};

use crate::maps::bpf::open_pinned;

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

pub struct RuntimeConfig {
    map: Array<MapData, u32>,
}

impl RuntimeConfig {
    pub fn open(pin_dir: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            map: Array::try_from(open_pinned(pin_dir, names::LB_CONFIG)?)?,
        })
    }

    pub fn get(&self, index: u32) -> anyhow::Result<u32> {
        Ok(self.map.get(&index, 0)?)
    }

    pub fn set(&mut self, index: u32, value: u32) -> anyhow::Result<()> {
        Ok(self.map.set(index, value, 0)?)
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
