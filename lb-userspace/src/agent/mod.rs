//! The agent's loop as a library: sources post to a mailbox, a worker
//! thread applies what it holds through the reconciler (over `LbMaps`, so
//! the loop runs against the fake maps in tests as well as the pinned ones),
//! and the binary only parses flags, installs the data path and answers
//! signals.
pub mod mailbox;
pub mod settings;
pub mod worker;

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
