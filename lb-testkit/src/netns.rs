//! Named network namespaces (`ip netns`), removed on drop.
use std::{fs::File, io, os::fd::AsRawFd as _};

pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn create(name: &str) -> Self {
        // A namespace left by a crashed run of the same pid would make `add` fail.
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", name])
            .output();
        crate::run("ip", &["netns", "add", name]);
        let ns = Self {
            name: name.to_string(),
        };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// `ip -n NAME ARGS...`
    pub fn ip(&self, args: &[&str]) {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        crate::run("ip", &full);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A namespace's file: `name` itself when it is a path (a process's
/// `/proc/PID/ns/net`, e.g. a pod's), else the `ip netns` name's.
fn path_of(name: &str) -> String {
    if name.starts_with('/') {
        name.to_string()
    } else {
        format!("/run/netns/{name}")
    }
}

/// Moves the calling thread into the named network namespace (or the one
/// at a path, see `path_of`). Sockets made
/// afterwards by this thread live there.
pub fn enter(name: &str) -> io::Result<()> {
    let f = File::open(path_of(name))?;
    // SAFETY: an open namespace file; moves only the calling thread, as documented above.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes `cmd` run inside the named network namespace: the child calls
/// setns() before exec. Unlike `ip netns exec`, this keeps the mount
/// namespace (so /sys/fs/bpf stays visible) and adds nothing to a timing.
pub fn exec_in(cmd: &mut std::process::Command, name: &str) -> io::Result<()> {
    use std::os::unix::process::CommandExt as _;
    let f = File::open(path_of(name))?;
    // The file moves into the hook, so it stays open until the spawn.
    // SAFETY: setns(2) is async-signal-safe, all the hook does between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}
