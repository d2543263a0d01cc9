//! Runs lb-probe inside the test's cgroup and client namespace.
use std::{path::Path, process::Command};

use serde::{Deserialize, Serialize};

/// One connection attempt, as lb-probe reports it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Attempt {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errno: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The server's answer: "<backend name> <peer it saw>".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
    /// getpeername() of the client socket.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// Source address of the UDP reply, as recvfrom() reports it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_from: Option<String>,
    /// getsockname() of the client socket.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local: Option<String>,
    /// How long the attempt took, in microseconds (the plain modes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micros: Option<u64>,
}

impl Attempt {
    /// Name of the backend that answered.
    pub fn backend(&self) -> Option<&str> {
        self.reply
            .as_deref()
            .and_then(|r| r.split_whitespace().next())
    }

    /// Client address as the backend saw it.
    pub fn seen_client(&self) -> Option<&str> {
        self.reply
            .as_deref()
            .and_then(|r| r.split_whitespace().nth(1))
    }
}

pub fn run(cgroup: &Path, netns: &str, mode: &str, target: &str, count: usize) -> Vec<Attempt> {
    let out = Command::new(crate::sibling_bin("lb-probe"))
        .arg("--cgroup")
        .arg(cgroup)
        .args(["--netns", netns, mode, target, &count.to_string()])
        .output()
        .expect("running lb-probe");
    assert!(
        out.status.success(),
        "lb-probe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let attempts: Vec<Attempt> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("probe json"))
        .collect();
    // udp-fanout: `count` rounds over every target.
    let count = if mode == "udp-fanout" {
        count * target.split(',').count()
    } else {
        count
    };
    assert_eq!(
        attempts.len(),
        count,
        "probe printed {} results for {count} attempts",
        attempts.len()
    );
    attempts
}

/// A client process holding one connected socket, asking through it
/// whenever told to (`lb-probe udp-held` / `tcp-held`).
pub struct Held {
    child: std::process::Child,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Held {
    /// A connected UDP socket.
    pub fn start(cgroup: &Path, netns: &str, target: &str) -> Self {
        Self::start_mode(cgroup, netns, "udp-held", target)
    }

    /// An unconnected UDP socket that sends every query with sendto().
    pub fn udp_sendto(cgroup: &Path, netns: &str, target: &str) -> Self {
        Self::start_mode(cgroup, netns, "udp-sendto-held", target)
    }

    /// A long-lived TCP connection to a line-echoing server.
    pub fn tcp(cgroup: &Path, netns: &str, target: &str) -> Self {
        Self::start_mode(cgroup, netns, "tcp-held", target)
    }

    fn start_mode(cgroup: &Path, netns: &str, mode: &str, target: &str) -> Self {
        use std::{io::BufRead as _, process::Stdio};
        let mut child = Command::new(crate::sibling_bin("lb-probe"))
            .arg("--cgroup")
            .arg(cgroup)
            .args(["--netns", netns, mode, target])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("running lb-probe");
        let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, lines }
    }

    /// One datagram out through the held socket, and its answer (or error).
    pub fn ask(&mut self) -> Attempt {
        use std::io::Write as _;
        writeln!(self.child.stdin.as_mut().unwrap()).expect("lb-probe stdin");
        let line = self
            .lines
            .next()
            .expect("lb-probe answered")
            .expect("reading lb-probe");
        serde_json::from_str(&line).expect("probe json")
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
