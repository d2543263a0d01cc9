//! One test's world: namespaces, a child cgroup, a pin directory and a
//! services file, all removed when it is dropped.
use std::{net::IpAddr, path::PathBuf};

use crate::{
    agent::{Agent, PinDir},
    cgroup::ChildCgroup,
    probe::{self, Attempt},
    servers::{self, Server},
    topology::Topology,
    unique,
};

pub struct World {
    pub tag: String,
    pub topo: Topology,
    pub cgroup: ChildCgroup,
    pub pins: PinDir,
    pub services: PathBuf,
}

impl World {
    pub fn new(test: &str, backends: usize) -> Self {
        let tag = unique(test);
        let services = std::env::temp_dir().join(format!("lb-services-{tag}.yaml"));
        Self {
            topo: Topology::new(&tag, backends),
            cgroup: ChildCgroup::create(&tag),
            pins: PinDir::create(&tag),
            services,
            tag,
        }
    }

    /// Write-then-rename, as editors and config management do.
    pub fn write_services(&self, yaml: &str) {
        let tmp = self.services.with_extension("tmp");
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, &self.services).unwrap();
    }

    pub fn start_agent(&self) -> Agent {
        Agent::start(&self.services, &self.cgroup.path, &self.pins.path)
    }

    /// A TCP server named b1, b2, ... on every backend, IPv4 or IPv6.
    pub fn tcp_servers(&self, port: u16, v6: bool) -> Vec<Server> {
        (0..self.topo.backends.len())
            .map(|i| {
                servers::tcp(
                    &self.topo.backends[i].name,
                    (self.backend_addr(i, v6), port).into(),
                    &format!("b{}", i + 1),
                )
            })
            .collect()
    }

    pub fn udp_servers(&self, port: u16, v6: bool) -> Vec<Server> {
        (0..self.topo.backends.len())
            .map(|i| {
                servers::udp(
                    &self.topo.backends[i].name,
                    (self.backend_addr(i, v6), port).into(),
                    &format!("b{}", i + 1),
                )
            })
            .collect()
    }

    pub fn backend_addr(&self, i: usize, v6: bool) -> IpAddr {
        if v6 {
            Topology::backend_ip6(i).into()
        } else {
            Topology::backend_ip(i).into()
        }
    }

    pub fn probe(&self, mode: &str, target: &str, count: usize) -> Vec<Attempt> {
        probe::run(
            &self.cgroup.path,
            &self.topo.client.name,
            mode,
            target,
            count,
        )
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.services);
    }
}
