//! kube-proxy's rule layouts, generated the way kube-proxy writes them, and
//! loaded with the same tools it uses (iptables-restore, nft -f), in a
//! network namespace of the benchmark's own.
//!
//! What is kept: the chains a new connection walks through and the shape of
//! every rule on that walk (comments, matches, statistic/numgen, DNAT), and
//! the masquerade marking. What is left out: the filter-table chains (reject
//! for services without endpoints, KUBE-FORWARD), NodePorts and firewall
//! chains: they are not on the path of a ClusterIP connection from a pod.
pub mod iptables;
pub mod nftables;
pub mod real;

use std::{
    io::Write as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

/// Runs `program args` inside network namespace `netns` with `input` on its
/// stdin; returns the wall time from spawn to exit, as kube-proxy pays it.
/// The child enters the namespace itself (setns before exec), so nothing of
/// `ip netns exec` is counted.
pub fn timed_in_netns(
    netns: &str,
    program: &str,
    args: &[&str],
    input: &str,
) -> anyhow::Result<Duration> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    lb_testkit::netns::exec_in(&mut cmd, netns).with_context(|| format!("netns {netns}"))?;
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {program} (apt install iptables nftables)"))?;
    {
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(input.as_bytes())
            .with_context(|| format!("feeding {program}"))?;
    }
    let out = child.wait_with_output()?;
    let took = started.elapsed();
    if !out.status.success() {
        bail!(
            "{program} {args:?} in {netns} failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .take(5)
                .collect::<Vec<_>>()
                .join(" | ")
        );
    }
    Ok(took)
}

/// A stable name fragment from some text, like kube-proxy's base32 SHA-256
/// prefixes (FNV-1a here: only the shape and the uniqueness matter).
pub fn chain_hash(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    (0..16)
        .map(|i| ALPHABET[((h >> (i * 4)) & 31) as usize] as char)
        .collect()
}
