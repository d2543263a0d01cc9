//! How much each run measures: the scales of the issue (full), a run under
//! three minutes (quick), and a few seconds for CI (smoke).
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Name {
    Full,
    Quick,
    Smoke,
}

pub struct Profile {
    pub name: Name,
    /// Services in the connect benchmark (2 backends each, the measured one last).
    pub connect_services: Vec<usize>,
    /// Rounds per variant; the variants take turns, so drift hits all alike.
    pub connect_rounds: usize,
    /// Connects per round, at most, and at most this long per round.
    pub connect_per_round: usize,
    pub round_ms: u64,
    /// Services (× 10 endpoints) in the control-plane benchmark.
    pub control_services: Vec<usize>,
    /// How many times one endpoint change is timed (median reported).
    pub change_repeats: usize,
    /// Services in the packet benchmark, and BPF_PROG_TEST_RUN repeat.
    pub packet_services: Vec<usize>,
    pub packet_repeat: u32,
    /// First packets of new flows timed one by one.
    pub new_flows: usize,
    pub maglev_sizes: Vec<u32>,
    pub maglev_backends: Vec<usize>,
    /// Connect scales at which agent and map memory are read.
    pub memory_at: Vec<usize>,
    /// (services, endpoints each) whose heap is broken down in process.
    pub memory_breakdown: Vec<(usize, usize)>,
    /// (services, endpoints each) of Kubernetes mode's heap, fed recorded
    /// apiserver objects (`kube_memory::breakdown`).
    pub kube_memory: Vec<(usize, usize)>,
    /// Services × 2 endpoints created through the real apiserver for the
    /// agent's RSS, a second agent's sync and its CPU at rest (`kube_memory::scale`).
    pub kube_scale: Vec<usize>,
    /// Largest scale at which kube-proxy's layouts are loaded at all:
    /// loading them grows faster than linearly (nft -f of 10 000 services ×
    /// 10 endpoints takes over a minute here), so beyond these the report
    /// says "not run" instead of stalling the run for hours.
    pub iptables_max_services: usize,
    pub nftables_max_services: usize,
    /// The same for the control-plane benchmark (N × 10 endpoints).
    pub kube_proxy_control_max: usize,
    /// North-south traffic: rounds of every variant, and how long each
    /// measurement (upload, download, connections) runs.
    pub ns_rounds: usize,
    pub ns_ms: u64,
    /// Propagation on a real control plane: services × 10 endpoints in the
    /// cluster, and pod readiness changes timed one by one.
    pub propagation_services: Vec<usize>,
    pub propagation_samples: usize,
    /// How long the real kube-proxy gets for its first full sync (the
    /// propagation and restart benches) before the run records that it did
    /// not finish and goes on: iptables-nft does not finish at 10 000
    /// services here (docs/testbed.md).
    pub kube_proxy_sync_limit_s: u64,
    /// How long the real kube-proxy's propagation samples may take in all,
    /// per mode and scale: nftables mode at 10 000 services takes tens of
    /// seconds a change here, and 200 of them would take over an hour.
    pub kube_proxy_sampling_limit_s: u64,
    /// Services-file edit → maps (standalone mode): file sizes and edits each.
    pub file_edit_services: Vec<usize>,
    pub file_edit_samples: usize,
    /// Elements per variant of the map-write measurement.
    pub map_write_elements: usize,
    /// Traffic on the two-node test bed (agent, kube-proxy iptables and
    /// nftables in turn): Services added besides the measured one before
    /// each measurement (cumulative), rounds, and how long each
    /// measurement of a round runs.
    pub bed_services: Vec<usize>,
    pub bed_rounds: usize,
    pub bed_ms: u64,
}

impl Profile {
    pub fn new(name: Name) -> Self {
        match name {
            Name::Full => Self {
                name,
                connect_services: vec![10, 1_000, 10_000, 100_000],
                connect_rounds: 9,
                connect_per_round: 200_000,
                round_ms: 1_000,
                control_services: vec![1_000, 10_000, 100_000],
                change_repeats: 9,
                packet_services: vec![10, 100_000],
                packet_repeat: 1_000_000,
                new_flows: 20_000,
                maglev_sizes: vec![16_381, 32_749, 65_537, 131_071],
                maglev_backends: vec![10, 50, 100, 1_000],
                memory_at: vec![10_000, 100_000],
                memory_breakdown: vec![(10_000, 2), (100_000, 2), (100_000, 10)],
                kube_memory: vec![(100_000, 2), (100_000, 10)],
                // 10 000, where kube-proxy runs beside it (kube_proxy_control_max):
                // 20 000 took 11 minutes to create through the apiserver and
                // measured only the agent (2283 B per service on 2026-12-04).
                kube_scale: vec![10_000],
                iptables_max_services: 100_000,
                nftables_max_services: 10_000,
                kube_proxy_control_max: 10_000,
                ns_rounds: 3,
                ns_ms: 3_000,
                propagation_services: vec![1_000, 10_000],
                propagation_samples: 200,
                kube_proxy_sync_limit_s: 300,
                kube_proxy_sampling_limit_s: 600,
                file_edit_services: vec![1_000, 10_000],
                file_edit_samples: 30,
                map_write_elements: 230_000,
                bed_services: vec![0, 1_000, 10_000],
                bed_rounds: 3,
                bed_ms: 2_000,
            },
            Name::Quick => Self {
                name,
                connect_services: vec![10, 10_000],
                connect_rounds: 5,
                connect_per_round: 100_000,
                round_ms: 400,
                control_services: vec![1_000, 10_000],
                change_repeats: 5,
                packet_services: vec![10, 100_000],
                packet_repeat: 1_000_000,
                new_flows: 5_000,
                maglev_sizes: vec![16_381, 32_749, 65_537, 131_071],
                maglev_backends: vec![10, 50, 100, 1_000],
                memory_at: vec![10_000],
                memory_breakdown: vec![(10_000, 2), (10_000, 10)],
                kube_memory: vec![(10_000, 2), (10_000, 10)],
                kube_scale: vec![2_000],
                iptables_max_services: 10_000,
                nftables_max_services: 10_000,
                kube_proxy_control_max: 1_000,
                ns_rounds: 1,
                ns_ms: 2_000,
                propagation_services: vec![1_000],
                propagation_samples: 60,
                kube_proxy_sync_limit_s: 300,
                kube_proxy_sampling_limit_s: 300,
                file_edit_services: vec![10_000],
                file_edit_samples: 10,
                map_write_elements: 230_000,
                bed_services: vec![0, 1_000],
                bed_rounds: 2,
                bed_ms: 1_500,
            },
            Name::Smoke => Self {
                name,
                connect_services: vec![10],
                connect_rounds: 1,
                connect_per_round: 50,
                round_ms: 500,
                control_services: vec![100],
                change_repeats: 3,
                packet_services: vec![10],
                packet_repeat: 1_000,
                new_flows: 100,
                maglev_sizes: vec![251],
                maglev_backends: vec![10],
                memory_at: vec![10],
                memory_breakdown: vec![(100, 2), (100, 10)],
                kube_memory: vec![(100, 2), (100, 10)],
                kube_scale: Vec::new(),
                iptables_max_services: 100,
                nftables_max_services: 100,
                kube_proxy_control_max: 100,
                ns_rounds: 1,
                ns_ms: 300,
                propagation_services: vec![100],
                propagation_samples: 10,
                kube_proxy_sync_limit_s: 120,
                kube_proxy_sampling_limit_s: 120,
                file_edit_services: vec![100],
                file_edit_samples: 3,
                map_write_elements: 10_000,
                bed_services: vec![0, 20],
                bed_rounds: 1,
                bed_ms: 300,
            },
        }
    }

    pub fn label(&self) -> &'static str {
        match self.name {
            Name::Full => "full",
            Name::Quick => "quick",
            Name::Smoke => "smoke",
        }
    }

    pub fn default_out(&self) -> PathBuf {
        match self.name {
            Name::Full => PathBuf::from("docs/benchmarks.md"),
            _ => PathBuf::from(format!("target/benchmarks-{}.md", self.label())),
        }
    }
}
