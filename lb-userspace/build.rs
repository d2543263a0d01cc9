//! Builds the eBPF object (lb-ebpf) for bpfel-unknown-none and leaves it in
//! OUT_DIR, where `src/datapath/mod.rs` (EBPF_OBJECT) embeds it with
//! `include_bytes_aligned!`.
use std::path::Path;

use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR")?;
    let root = Path::new(&manifest_dir).parent().expect("workspace root");
    let ebpf_dir = root.join("lb-ebpf");
    println!(
        "cargo:rerun-if-changed={}",
        root.join("lb-common/src").display()
    );
    println!("cargo:rerun-if-env-changed=LB_EBPF_TOOLCHAIN");

    // Debian's rustc-web ships a prebuilt `core` for bpfel-unknown-none, so no
    // nightly and no -Z build-std. aya-ebpf uses one unstable feature
    // (asm_experimental_arch); allow unstable features for that crate only.
    // Safe: build scripts are single-threaded when this runs.
    std::env::set_var("RUSTC_BOOTSTRAP", "aya_ebpf");
    let toolchain = std::env::var("LB_EBPF_TOOLCHAIN").unwrap_or_else(|_| "/usr".to_string());
    aya_build::build_ebpf(
        [Package {
            name: "lb-ebpf",
            root_dir: ebpf_dir.to_str().expect("utf-8 path"),
            ..Default::default()
        }],
        Toolchain::Custom(&toolchain),
    )
}
