//! lb-agent as a child process, with a pin directory of its own; killed and
//! uninstalled on drop.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

pub struct PinDir {
    pub path: PathBuf,
}

impl PinDir {
    pub fn create(tag: &str) -> Self {
        if !Path::new("/sys/fs/bpf").join(".").exists() {
            panic!("/sys/fs/bpf is missing: mount bpffs (cargo xtask test does)");
        }
        let path = PathBuf::from(format!("/sys/fs/bpf/lbtest-{tag}"));
        let _ = lb::datapath::uninstall(&path);
        Self { path }
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        if let Err(e) = lb::datapath::uninstall(&self.path) {
            eprintln!("cleanup of {}: {e}", self.path.display());
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

pub struct Agent {
    child: Option<Child>,
    pub log: PathBuf,
    pub services: PathBuf,
    pub cgroup: PathBuf,
    pub pin_dir: PathBuf,
}

impl Agent {
    /// Starts the agent and waits for its first reconcile.
    pub fn start(services: &Path, cgroup: &Path, pin_dir: &Path) -> Self {
        let log = std::env::temp_dir().join(format!(
            "lb-agent-{}.log",
            pin_dir.file_name().unwrap().to_string_lossy()
        ));
        let mut agent = Agent {
            child: None,
            log,
            services: services.to_path_buf(),
            cgroup: cgroup.to_path_buf(),
            pin_dir: pin_dir.to_path_buf(),
        };
        agent.spawn();
        agent
    }

    fn spawn(&mut self) {
        let _ = std::fs::remove_file(&self.log);
        let log = std::fs::File::create(&self.log).unwrap();
        let child = Command::new(crate::sibling_bin("lb-agent"))
            .arg("--services")
            .arg(&self.services)
            .arg("--cgroup")
            .arg(&self.cgroup)
            .arg("--pin-dir")
            .arg(&self.pin_dir)
            .env("LB_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawning lb-agent");
        self.child = Some(child);
        let ok = self.wait_for_log("reconciled", 1, Duration::from_secs(20));
        assert!(ok, "lb-agent did not reconcile; log:\n{}", self.log_text());
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `needle` appears at least `times` times in the log.
    pub fn wait_for_log(&mut self, needle: &str, times: usize, timeout: Duration) -> bool {
        crate::wait_until(timeout, || {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!("lb-agent exited with {status}; log:\n{}", self.log_text());
                }
            }
            self.log_text().matches(needle).count() >= times
        })
    }

    /// SIGKILL: no chance to clean anything up.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn lbctl(&self, args: &[&str]) -> String {
        let out = Command::new(crate::sibling_bin("lbctl"))
            .args(args)
            .arg("--pin-dir")
            .arg(&self.pin_dir)
            .output()
            .expect("running lbctl");
        assert!(out.status.success(), "lbctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn lbctl_json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.lbctl(&all)).expect("lbctl json")
    }

    /// Packets counted for a drop reason (egress), from `lbctl drops`.
    pub fn drops(&self, reason: &str) -> u64 {
        self.lbctl_json(&["drops"])
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["reason"] == reason)
            .map(|c| c["packets"].as_u64().unwrap())
            .sum()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}
