//! The programs' run-time settings the agent writes at start (`LB_CONFIG`),
//! from its flags. Checked before anything is installed, so a bad flag
//! changes nothing; written in an order that never lets a program see a
//! half-made change.
use std::time::Duration;

use lb_common::config::{
    snat_ports_ever, CFG_CT_CLOSING_S, CFG_CT_TCP_S, CFG_CT_TCP_SYN_S, CFG_CT_UDP_S,
    CFG_EVENT_RATE, CFG_HOST_NETNS_COOKIE_HI, CFG_HOST_NETNS_COOKIE_LO, CFG_HOST_NS_ONLY,
    CFG_LB_MODE, CFG_LOG_LEVEL, CFG_MAGLEV_M, CFG_SNAT_PORTS_EVER, CFG_SNAT_PORT_MAX,
    CFG_SNAT_PORT_MIN,
};

pub use crate::datapath::config::ConfigSlots;

/// Conntrack timeouts (north-south path).
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub tcp: Duration,
    pub tcp_syn: Duration,
    pub tcp_fin: Duration,
    pub udp: Duration,
}

impl Timeouts {
    /// (slot, flag, value)
    fn slots(&self) -> [(u32, &'static str, Duration); 4] {
        [
            (CFG_CT_TCP_S, "--conntrack-timeout-tcp", self.tcp),
            (
                CFG_CT_TCP_SYN_S,
                "--conntrack-timeout-tcp-syn",
                self.tcp_syn,
            ),
            (
                CFG_CT_CLOSING_S,
                "--conntrack-timeout-tcp-fin",
                self.tcp_fin,
            ),
            (CFG_CT_UDP_S, "--conntrack-timeout-udp", self.udp),
        ]
    }
}

/// Everything the agent sets at start.
#[derive(Clone, Debug)]
pub struct StartSettings {
    /// aya-log level (`datapath::config::parse_value` of --bpf-log-level).
    pub log_level: u32,
    pub event_rate: u32,
    /// The agent's own network namespace: the host's.
    pub host_netns_cookie: u64,
    pub host_namespace_only: bool,
    /// `lb_common::nodeport::lb_mode_word`: the mode (`MODE_*`) and the
    /// DSR dispatch (`DSR_DISPATCH_*`).
    pub lb_mode: u32,
    pub maglev_m: u32,
    /// The SNAT source-port range, inclusive.
    pub snat_ports: (u16, u16),
    pub conntrack: Timeouts,
}

impl StartSettings {
    /// Refuses a value the programs cannot use, naming the flag.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.event_rate == 0 {
            anyhow::bail!("--event-rate must be at least 1");
        }
        for (_, flag, d) in self.conntrack.slots() {
            let secs = d.as_secs();
            if secs == 0 || secs > u64::from(u32::MAX) {
                anyhow::bail!("{flag} {}: give at least 1s", humantime::format_duration(d));
            }
        }
        let (low, high) = self.snat_ports;
        if low == 0 || high < low {
            anyhow::bail!(
                "--snat-port-range {low}-{high}: the range must be non-empty and start above 0"
            );
        }
        Ok(())
    }

    pub fn write(&self, config: &mut impl ConfigSlots) -> anyhow::Result<()> {
        self.check()?;
        config.set(CFG_LOG_LEVEL, self.log_level)?;
        config.set(CFG_EVENT_RATE, self.event_rate)?;
        // The cookie before the switch that uses it.
        config.set(CFG_HOST_NETNS_COOKIE_LO, self.host_netns_cookie as u32)?;
        config.set(
            CFG_HOST_NETNS_COOKIE_HI,
            (self.host_netns_cookie >> 32) as u32,
        )?;
        config.set(CFG_HOST_NS_ONLY, u32::from(self.host_namespace_only))?;
        config.set(CFG_LB_MODE, self.lb_mode)?;
        // Set once, at the first install: it is the size of the tables of
        // masters that do not name their own (written by agents before
        // per-service sizes), so it must stay what those tables were built
        // for. Every master this agent writes names its table's size, so a
        // changed --maglev-table-size reaches the programs service by
        // service, each table with its master (diff.rs orders the writes).
        if config.get(CFG_MAGLEV_M)? == 0 {
            config.set(CFG_MAGLEV_M, self.maglev_m)?;
        }
        // The hull first: a reply to a port of the old range must never
        // leave early (CFG_SNAT_PORTS_EVER), not even between these writes.
        let (low, high) = self.snat_ports;
        let ever = config.get(CFG_SNAT_PORTS_EVER)?;
        config.set(CFG_SNAT_PORTS_EVER, snat_ports_ever(ever, low, high))?;
        config.set(CFG_SNAT_PORT_MIN, u32::from(low))?;
        config.set(CFG_SNAT_PORT_MAX, u32::from(high))?;
        for (index, _, d) in self.conntrack.slots() {
            config.set(index, d.as_secs() as u32)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::datapath::config::{writer_of, Writer};

    fn settings() -> StartSettings {
        StartSettings {
            log_level: 2,
            event_rate: 100,
            host_netns_cookie: 0x1234_5678_9abc_def0,
            host_namespace_only: true,
            lb_mode: 1,
            maglev_m: 16_381,
            snat_ports: (40_000, 50_000),
            conntrack: Timeouts {
                tcp: Duration::from_secs(21_600),
                // All different, so a swapped slot shows.
                tcp_syn: Duration::from_secs(61),
                tcp_fin: Duration::from_secs(10),
                udp: Duration::from_secs(60),
            },
        }
    }

    /// Records the order of writes.
    #[derive(Default)]
    struct Recorder {
        values: BTreeMap<u32, u32>,
        order: Vec<u32>,
    }

    impl ConfigSlots for Recorder {
        fn get(&self, index: u32) -> anyhow::Result<u32> {
            ConfigSlots::get(&self.values, index)
        }
        fn set(&mut self, index: u32, value: u32) -> anyhow::Result<()> {
            self.order.push(index);
            ConfigSlots::set(&mut self.values, index, value)
        }
    }

    #[test]
    fn every_setting_lands_in_its_slot_and_the_snat_hull_is_written_first() {
        let mut c = Recorder::default();
        // An earlier agent used 30000-35000.
        c.values
            .insert(CFG_SNAT_PORTS_EVER, snat_ports_ever(0, 30_000, 35_000));
        settings().write(&mut c).unwrap();
        let v = |i| c.values[&i];
        assert_eq!(v(CFG_LOG_LEVEL), 2);
        assert_eq!(v(CFG_EVENT_RATE), 100);
        assert_eq!(v(CFG_HOST_NETNS_COOKIE_LO), 0x9abc_def0);
        assert_eq!(v(CFG_HOST_NETNS_COOKIE_HI), 0x1234_5678);
        assert_eq!(v(CFG_HOST_NS_ONLY), 1);
        assert_eq!(
            (v(CFG_SNAT_PORT_MIN), v(CFG_SNAT_PORT_MAX)),
            (40_000, 50_000)
        );
        // The hull spans the old and the new range.
        assert_eq!(v(CFG_SNAT_PORTS_EVER), (30_000 << 16) | 50_000);
        assert_eq!(v(CFG_LB_MODE), 1);
        assert_eq!(v(CFG_MAGLEV_M), 16_381);
        assert_eq!(v(CFG_CT_TCP_S), 21_600);
        assert_eq!(v(CFG_CT_TCP_SYN_S), 61);
        assert_eq!(v(CFG_CT_CLOSING_S), 10);
        assert_eq!(v(CFG_CT_UDP_S), 60);
        let at = |i| c.order.iter().position(|&x| x == i).unwrap();
        assert!(at(CFG_SNAT_PORTS_EVER) < at(CFG_SNAT_PORT_MIN));
        assert!(at(CFG_SNAT_PORTS_EVER) < at(CFG_SNAT_PORT_MAX));
        assert!(at(CFG_HOST_NETNS_COOKIE_HI) < at(CFG_HOST_NS_ONLY));
        // Only its own slots and the run-time settings' start values: the
        // filter's trust is the install's and the reconciler's.
        for i in &c.order {
            assert!(
                matches!(writer_of(*i), Some(Writer::Start | Writer::Runtime)),
                "the start settings wrote LB_CONFIG[{i}], owned by {:?}",
                writer_of(*i)
            );
        }
    }

    #[test]
    fn the_agent_wide_maglev_size_is_written_once_and_a_restart_with_another_keeps_it() {
        let mut c = BTreeMap::new();
        let mut s = settings();
        s.maglev_m = 509;
        s.write(&mut c).unwrap();
        assert_eq!(c[&CFG_MAGLEV_M], 509);
        s.maglev_m = 65_537;
        s.write(&mut c).unwrap();
        assert_eq!(c[&CFG_MAGLEV_M], 509, "the pinned tables' size stays");
    }

    #[test]
    fn a_bad_value_is_refused_by_flag_before_anything_is_written() {
        let mut s = settings();
        s.conntrack.udp = Duration::from_millis(500);
        let mut c = BTreeMap::new();
        let e = s.write(&mut c).unwrap_err().to_string();
        assert!(e.contains("--conntrack-timeout-udp"), "{e}");
        assert!(c.is_empty(), "written before the check: {c:?}");
        let mut s = settings();
        s.event_rate = 0;
        assert!(s.check().unwrap_err().to_string().contains("--event-rate"));
        let mut s = settings();
        s.snat_ports = (50_000, 40_000);
        assert!(s
            .check()
            .unwrap_err()
            .to_string()
            .contains("--snat-port-range"));
    }
}
