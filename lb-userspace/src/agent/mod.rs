//! The agent as a library, each part tested without root:
//! * `settings`: the programs' start settings, checked before the install
//!   and written in a safe order;
//! * `router`: the event loop, source events to the NodePort health checks
//!   and the mailbox, control messages (reload, stop);
//! * `mailbox`: merges events while the worker is busy;
//! * `worker`: applies them through the reconciler (over `LbMaps`, so it
//!   runs against the fake maps in tests as well as the pinned ones).
//!
//! * `assembly`: the `Agent` once the data path is in place: the worker,
//!   the source, the servers and the loop, over any `LbMaps` (tested over
//!   the fake maps);
//! * `flags`: the flags of `lb-agent run` and what they parse into;
//! * `plan`: what the flags ask for (the source, how devices are found,
//!   which pod devices are served), decided before anything is touched;
//! * `process`: from the flags to a running agent: installs the data path
//!   (`datapath::install`, root, tested by the integration tests), wires
//!   the parts together and turns signals into control messages.
//!
//! The binary (src/bin/lb-agent.rs) only parses the command line.
pub mod addresses;
pub mod assembly;
pub mod flags;
pub mod mailbox;
pub mod plan;
pub mod privileges;
pub mod process;
pub mod router;
pub mod settings;
pub mod worker;

pub use assembly::Agent;

use std::path::{Path, PathBuf};

/// Where the agent serving `pin_dir` leaves its status for lbctl (refused
/// services): a file per pin directory under /run/lb.
pub fn status_file(pin_dir: &Path) -> PathBuf {
    let flat: String = pin_dir
        .to_string_lossy()
        .trim_start_matches('/')
        .chars()
        .map(|c| if c == '/' { '_' } else { c })
        .collect();
    PathBuf::from("/run/lb").join(format!("{flat}.json"))
}
