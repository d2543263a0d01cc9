//! The images a test node runs, built here (no registry is reachable) with
//! `lbimage` (go-containerregistry, `testbed/images`) as OCI archives, once
//! per cluster, and imported into each node's containerd.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::node::{
    AGENT_IMAGE, AGNHOST_IMAGE, BUSYBOX_IMAGE, COREDNS_IMAGE, JESSIE_DNSUTILS_IMAGE, PAUSE_IMAGE,
    POD_SERVER_IMAGE,
};

/// The archives, in a directory removed on drop.
pub struct Images {
    dir: PathBuf,
    /// Each image's reference and its archive.
    pub archives: Vec<(&'static str, PathBuf)>,
}

impl Images {
    /// Builds every image into a directory of `tag`'s.
    pub fn build(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("lb-images-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let archives = build(&dir);
        Self { dir, archives }
    }
}

impl Drop for Images {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Builds the images the node runs (`lbimage`, go-containerregistry):
/// the pod sandbox, a busybox userland for test pods, CoreDNS, and the agent's image
/// as deploy/Dockerfile would (lb-agent and lbctl with the libraries they
/// link, and a shell for the DaemonSet's bpffs init container).
fn build(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    let tools = crate::sibling_bin_dir().join("../testbed");
    let lbimage = tools.join("lbimage");
    let pause = tools.join("pause");
    let coredns = tools.join("coredns");
    let agnhost = tools.join("agnhost");
    for tool in [&lbimage, &pause, &coredns, &agnhost] {
        assert!(
            tool.exists(),
            "{} is not built: `cargo xtask testbed` builds it",
            tool.display()
        );
    }
    let busybox = "/bin/busybox";
    assert!(
        Path::new(busybox).exists(),
        "{busybox} missing: apt-get install busybox-static"
    );
    let porter = agnhost_sources().join("porter").display().to_string();
    let agent = crate::sibling_bin("lb-agent");
    let lbctl = crate::sibling_bin("lbctl");
    let specs: Vec<(&'static str, Vec<String>)> = vec![
        (
            PAUSE_IMAGE,
            vec![
                format!("--file={}=/pause", pause.display()),
                "--entrypoint=/pause".into(),
            ],
        ),
        (
            BUSYBOX_IMAGE,
            vec![format!("--busybox={busybox}"), "--cmd=sh".into()],
        ),
        (
            // As upstream's (Alpine with netcat-openbsd, curl, bind-tools):
            // the suite runs `nc -v -t -w 2`, `nc -u`, `curl` and `nslookup`
            // in its pods through `sh -x -c`.
            AGNHOST_IMAGE,
            vec![
                format!("--file={}=/agnhost", agnhost.display()),
                // porter's TLS ports, as upstream's Dockerfile adds them.
                format!("--file={porter}/localhost.crt=/localhost.crt"),
                format!("--file={porter}/localhost.key=/localhost.key"),
                // dash as /bin/sh: busybox's sh runs its own applets before
                // PATH, and its nc lacks -v/-t/-u.
                "--file=/bin/dash=/bin/sh".into(),
                "--file=/bin/nc.openbsd=/usr/bin/nc".into(),
                "--file=/usr/bin/curl=/usr/bin/curl".into(),
                // GNU wget: Debian's static busybox wget crashes (the
                // non-conformance Services tests fetch with `wget -q -O - -T 1`).
                "--file=/usr/bin/wget=/usr/bin/wget".into(),
                "--file=/usr/bin/dig=/usr/bin/dig".into(),
                "--file=/usr/bin/getent=/usr/bin/getent".into(),
                "--with-libs".into(),
                format!("--busybox={busybox}"),
                "--entrypoint=/agnhost".into(),
                "--cmd=pause".into(),
            ],
        ),
        (
            // The DNS tests' probe scripts: dig (+search, +tcp, PTR),
            // getent hosts, test, seq, sleep through `sh -c`.
            JESSIE_DNSUTILS_IMAGE,
            vec![
                "--file=/bin/dash=/bin/sh".into(),
                "--file=/usr/bin/dig=/usr/bin/dig".into(),
                "--file=/usr/bin/getent=/usr/bin/getent".into(),
                "--with-libs".into(),
                format!("--busybox={busybox}"),
            ],
        ),
        (
            POD_SERVER_IMAGE,
            vec![
                format!(
                    "--file={}=/lb-pod-server",
                    crate::sibling_bin("lb-pod-server").display()
                ),
                "--with-libs".into(),
                "--entrypoint=/lb-pod-server".into(),
            ],
        ),
        (
            COREDNS_IMAGE,
            vec![
                format!("--file={}=/coredns", coredns.display()),
                "--entrypoint=/coredns".into(),
            ],
        ),
        (
            AGENT_IMAGE,
            vec![
                format!("--file={}=/usr/local/bin/lb-agent", agent.display()),
                format!("--file={}=/usr/local/bin/lbctl", lbctl.display()),
                "--with-libs".into(),
                format!("--busybox={busybox}"),
                "--entrypoint=lb-agent".into(),
            ],
        ),
    ];
    // `cargo xtask image` builds deploy/Dockerfile for real and runs its
    // node test with the archive in place of the assembled agent image.
    let built_agent = std::env::var_os("LB_AGENT_IMAGE_ARCHIVE").map(PathBuf::from);
    let mut out = Vec::new();
    for (image, args) in specs {
        if let (AGENT_IMAGE, Some(archive)) = (image, &built_agent) {
            assert!(
                archive.exists(),
                "LB_AGENT_IMAGE_ARCHIVE={}: no such file (`cargo xtask image` writes it)",
                archive.display()
            );
            out.push((image, archive.clone()));
            continue;
        }
        let tar = dir.join(format!("{}.tar", image.replace(['/', ':'], "_")));
        let res = Command::new(&lbimage)
            .arg(format!("--ref={image}"))
            .arg(format!("--out={}", tar.display()))
            .args(&args)
            .output()
            .unwrap();
        assert!(
            res.status.success(),
            "lbimage {image}: {}",
            String::from_utf8_lossy(&res.stderr)
        );
        out.push((image, tar));
    }
    out
}

/// test/images/agnhost of the k8s.io/kubernetes module the test bed uses,
/// in Go's module cache (`go mod download` put it there for the build).
fn agnhost_sources() -> PathBuf {
    let go = ["go", "/usr/local/go/bin/go"]
        .into_iter()
        .find(|g| {
            Command::new(g)
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect("a Go toolchain (go on PATH or /usr/local/go/bin/go)");
    let out = Command::new(go)
        .args(["list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes"])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../testbed"))
        .env("GOFLAGS", "-mod=readonly")
        .env("GOTOOLCHAIN", "local")
        .output()
        .expect("go list -m k8s.io/kubernetes");
    assert!(
        out.status.success(),
        "go list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("test/images/agnhost")
}
