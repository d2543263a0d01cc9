//! The kernel feature probes (`lb::datapath::features`) on the real
//! kernel: every feature the data path uses is found present here (the
//! programs load and run on this kernel, so a probe saying otherwise is
//! wrong), and the probes tell a present helper from one the program type
//! does not have. Needs root (the probes load programs).
use aya::{
    programs::ProgramType,
    sys::{is_helper_supported, BpfHelper},
};
use lb::datapath::features;

#[test]
fn every_feature_the_data_path_uses_is_found_on_this_kernel() {
    let release = features::kernel_release().expect("a kernel release");
    assert!(
        release >= (6, 6),
        "the test machines run 6.6 or later: {release:?}"
    );
    for r in features::requirements(true) {
        assert!(
            features::present(&r).unwrap(),
            "{} (Linux {}.{}) reported missing on {release:?}",
            r.what,
            r.since.0,
            r.since.1
        );
    }
    features::check(true).unwrap();
}

#[test]
fn the_helper_probe_refuses_a_helper_the_program_type_does_not_have() {
    // bpf_redirect_neigh exists for tc, not for cgroup sock_addr programs:
    // the probe must see the difference, or "present" proves nothing.
    assert!(is_helper_supported(
        ProgramType::SchedClassifier,
        BpfHelper::BPF_FUNC_redirect_neigh
    )
    .unwrap());
    assert!(!is_helper_supported(
        ProgramType::CgroupSockAddr,
        BpfHelper::BPF_FUNC_redirect_neigh
    )
    .unwrap());
}
