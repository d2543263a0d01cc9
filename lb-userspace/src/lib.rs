//! lb: the node agent and CLI of an eBPF service load balancer.
//!
//! The pipeline, one module per step:
//!
//! ```text
//!  source (services file, apiserver) ─▶ model ─▶ desired ─▶ diff ─▶ maps (apply)
//!                                                  ▲                  │
//!                                                  └── ids, slots ◀───┘ (mirror of the maps)
//! ```
//!
//! `reconcile` drives the pipeline; `datapath` loads, pins and attaches the
//! eBPF programs; `sys` holds the few raw syscalls aya does not wrap.
pub mod agent;
pub mod cli;
pub mod collections;
pub mod conntrack;
pub mod datapath;
pub mod desired;
pub mod diff;
pub mod health;
pub mod maps;
pub mod metrics;
pub mod migrate;
pub mod model;
pub mod monitor;
pub mod net;
pub mod reconcile;
pub mod sockets;
pub mod source;
pub mod sys;
