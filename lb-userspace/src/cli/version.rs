//! `lbctl version`: this CLI's release and map layout beside the data path's
//! and the agent's, and a plain word when they differ (an upgrade half done:
//! a new lbctl reading an old agent's pins finds nothing, or wrong sizes).
use std::path::{Path, PathBuf};

use lb_common::maps::LAYOUT_VERSION;

use crate::datapath::pins;

#[derive(Debug, serde::Serialize)]
pub struct VersionReport {
    pub lbctl: String,
    pub lbctl_layout: u32,
    /// The pin directory asked about, and whether a data path is pinned there.
    pub pin_dir: PathBuf,
    pub pinned: bool,
    /// Other layouts pinned beside it (`/sys/fs/bpf/lb/v1` next to `v2`).
    pub other_layouts: Vec<(u32, PathBuf)>,
    /// What the agent serving `pin_dir` last wrote (its status file).
    pub agent: Option<String>,
    pub agent_layout: Option<u32>,
}

impl VersionReport {
    /// Problems, each a sentence with what to do.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.pinned {
            match self.other_layouts.first() {
                Some((v, dir)) => out.push(format!(
                    "the data path is pinned with map layout v{v} at {}, this lbctl reads v{}: \
                     an upgrade is half done; run the lb-agent of this release (it pins v{} and \
                     takes over), then `lb-agent uninstall --pin-dir {}`",
                    dir.display(),
                    self.lbctl_layout,
                    self.lbctl_layout,
                    dir.display()
                )),
                None => out.push(format!(
                    "no data path is pinned at {}: is lb-agent running (and with this --pin-dir)?",
                    self.pin_dir.display()
                )),
            }
        }
        if let Some(l) = self
            .agent_layout
            .filter(|l| *l != 0 && *l != self.lbctl_layout)
        {
            out.push(format!(
                "the agent writes map layout v{l}, this lbctl reads v{}: use the lbctl of the agent's release",
                self.lbctl_layout
            ));
        }
        out
    }
}

/// Layouts pinned in `pin_dir`'s parent as `v<N>` directories.
fn layouts_beside(pin_dir: &Path) -> Vec<(u32, PathBuf)> {
    let Some(parent) = pin_dir.parent() else {
        return Vec::new();
    };
    let mut out: Vec<(u32, PathBuf)> = std::fs::read_dir(parent)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.strip_prefix('v')?.parse().ok()?;
            let dir = e.path();
            (dir != pin_dir && pins::has_state(&dir)).then_some((v, dir))
        })
        .collect();
    out.sort();
    out
}

pub fn gather(pin_dir: &Path) -> VersionReport {
    let status: Option<crate::agent::worker::AgentStatus> =
        std::fs::read(crate::agent::status_file(pin_dir))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
    VersionReport {
        lbctl: env!("CARGO_PKG_VERSION").to_string(),
        lbctl_layout: LAYOUT_VERSION,
        pin_dir: pin_dir.to_path_buf(),
        pinned: pins::has_state(pin_dir),
        other_layouts: layouts_beside(pin_dir),
        agent: status
            .as_ref()
            .map(|s| s.version.clone())
            .filter(|v| !v.is_empty()),
        agent_layout: status.map(|s| s.layout).filter(|l| *l != 0),
    }
}

pub fn render(r: &VersionReport) -> String {
    let mut rows = vec![[
        "lbctl".to_string(),
        format!("{} (map layout v{})", r.lbctl, r.lbctl_layout),
    ]];
    rows.push([
        "data path".into(),
        if r.pinned {
            format!("map layout v{} at {}", r.lbctl_layout, r.pin_dir.display())
        } else {
            format!("nothing pinned at {}", r.pin_dir.display())
        },
    ]);
    for (v, dir) in &r.other_layouts {
        rows.push(["".into(), format!("map layout v{v} at {}", dir.display())]);
    }
    rows.push([
        "agent".into(),
        match (&r.agent, r.agent_layout) {
            (Some(v), Some(l)) => format!("{v} (map layout v{l})"),
            (Some(v), None) => v.clone(),
            _ => "unknown (no status written for this pin directory)".into(),
        },
    ]);
    let mut out = super::align(&rows);
    for p in r.problems() {
        out.push_str(&format!("\n{p}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(pinned: bool, other: &[u32], agent_layout: Option<u32>) -> VersionReport {
        VersionReport {
            lbctl: "1.2.3".into(),
            lbctl_layout: 2,
            pin_dir: "/sys/fs/bpf/lb/v2".into(),
            pinned,
            other_layouts: other
                .iter()
                .map(|v| (*v, PathBuf::from(format!("/sys/fs/bpf/lb/v{v}"))))
                .collect(),
            agent: agent_layout.map(|_| "1.2.3".into()),
            agent_layout,
        }
    }

    #[test]
    fn matching_versions_have_no_problem_and_render_as_golden() {
        let r = report(true, &[], Some(2));
        assert!(r.problems().is_empty());
        assert_eq!(
            render(&r),
            "\
lbctl       1.2.3 (map layout v2)
data path   map layout v2 at /sys/fs/bpf/lb/v2
agent       1.2.3 (map layout v2)
"
        );
    }

    #[test]
    fn an_old_layout_pinned_beside_says_the_upgrade_is_half_done() {
        let r = report(false, &[1], None);
        let p = r.problems();
        assert_eq!(p.len(), 1);
        assert!(p[0].contains("pinned with map layout v1"), "{p:?}");
        assert!(
            p[0].contains("lb-agent uninstall --pin-dir /sys/fs/bpf/lb/v1"),
            "{p:?}"
        );
        assert!(render(&r).contains("map layout v1 at /sys/fs/bpf/lb/v1"));
    }

    #[test]
    fn nothing_pinned_and_an_agent_of_another_layout_are_both_said() {
        assert!(report(false, &[], None).problems()[0].contains("no data path is pinned"));
        let p = report(true, &[], Some(3)).problems();
        assert!(p[0].contains("the agent writes map layout v3"), "{p:?}");
    }
}
