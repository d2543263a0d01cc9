//! Host-side placeholder: the eBPF programs are the `lb-ebpf` binary target,
//! built for `bpfel-unknown-none`. This empty library lets the agent depend on
//! the crate so cargo rebuilds it when the programs change.
#![no_std]
