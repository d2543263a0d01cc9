//! A child cgroup v2 per test, removed on drop. The agent attaches there, so
//! nothing outside the test's own probe processes is ever affected.
use std::{path::PathBuf, time::Duration};

pub struct ChildCgroup {
    pub path: PathBuf,
}

impl ChildCgroup {
    pub fn create(tag: &str) -> Self {
        let root = lb::sys::fs::cgroup2_mount().expect("cgroup2 mount");
        let path = root.join(format!("lbtest-{tag}"));
        let _ = std::fs::remove_dir(&path);
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        Self { path }
    }
}

impl Drop for ChildCgroup {
    fn drop(&mut self) {
        // Probe processes have exited by now; allow a moment for the kernel to notice.
        crate::wait_until(Duration::from_secs(5), || {
            std::fs::remove_dir(&self.path).is_ok() || !self.path.exists()
        });
    }
}
