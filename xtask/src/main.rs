//! cargo xtask: set up the machine, build, run the demo, the tests and the
//! benchmarks. Deliberately free of project dependencies: it must compile on a
//! fresh machine before anything it installs (bpf-linker, LLVM) exists.
mod image;
mod previous;
mod setup;
mod stack;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

const USAGE: &str = "\
usage: cargo xtask <task>

tasks:
  setup   install what is missing (apt packages, bpf-linker), mount bpffs
  build   setup, then build lb-agent, lbctl and the test tools
  demo    setup, build, then run the standalone demo (network namespaces, no real interface touched)
  test    setup, build (the Rust workspace, the Kubernetes test bed and its e2e suite), then run
          every test (unit, real-kernel integration, a real control plane and node, the upstream
          Services conformance tests; needs root)
  previous
          build the previous release's lb-agent (the commit in lb-testkit/previous-release)
          into target/previous/, for the upgrade test; `test` does it first
  testbed build the Kubernetes test bed (testbed/: apiserver, controller manager, kubectl from
          the upstream Go modules, and the real kube-proxy) into target/testbed
  cluster up [--node|--nodes N]|down|status
          a real control plane (etcd, kube-apiserver, kube-controller-manager) in a network
          namespace of its own, with kubeconfigs in target/cluster; --node adds the scheduler,
          a kubelet with containerd, the agent as its DaemonSet pod and CoreDNS; --nodes N
          makes N such nodes, each in a namespace of its own on one bridge, with an outside client
  conformance [--nodes N] [--proxy agent|kube-proxy-MODE] [--focus REGEX] [--skip REGEX]
          Kubernetes' own e2e tests (upstream e2e.test, v1.35.8) against the test bed (3 nodes
          unless --nodes says otherwise) with the agent in place of kube-proxy; default focus:
          the Services conformance tests;
          writes docs/conformance.md. With --proxy kube-proxy-iptables (nftables, ipvs): a
          control run with the real kube-proxy instead, written to
          docs/conformance-kube-proxy-MODE.md and shown beside the agent's next report
  lint    setup, then rustfmt and clippy (warnings denied) on the workspace and on the eBPF
          programs built for bpfel-unknown-none (host clippy sees none of lb-ebpf); fails when
          rustfmt or clippy is missing. CI runs it before the tests
  deb     the Debian package for standalone mode (release build, shell completions,
          cargo-deb) into target/debian/
  image   deploy/Dockerfile built unchanged with buildah (the debian:bookworm bases made with
          mmdebstrap: no registry here) into target/image/lb-agent.tar, its size reported,
          then run as the DaemonSet on a test node. Not in `test` (CI's hour)
  manifests
          render deploy/kubernetes from the Helm chart deploy/helm/lb-agent (the chart is
          the source; a test fails when the two differ)
  stack   build, then each eBPF program's deepest BPF-to-BPF call chain and its frames'
          bytes (the verifier allows 512 along any chain, rounding each frame up), read
          from the built object with llvm-objdump
  bench   setup, release build, then benchmarks side by side with the real kube-proxy (and
          its re-created rule layouts where it cannot run);
          writes docs/benchmarks.md. --quick: under 3 minutes; --smoke: seconds (CI)
  soak [--duration 1h]
          setup, build, then the soak test for that long (s, m or h; default 1h): traffic
          through the socket and the packet path while services churn and the agent restarts;
          no request may fail and nothing may grow. Writes target/soak/report.md and soak.svg.
          Not in `test` (CI's hour); the last hour-long run is docs/soak/report.md
";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("setup") => setup::run(),
        Some("build") => setup::run().and_then(|_| build()),
        Some("demo") => setup::run().and_then(|_| build()).and_then(|_| demo()),
        Some("test") => setup::run()
            .and_then(|_| previous::build())
            .and_then(|_| build())
            .and_then(|_| previous::check_head_relinked())
            .and_then(|_| testbed())
            .and_then(|_| e2e_suite())
            .and_then(|_| deb(DebProfile::Dev))
            .and_then(|_| test(&args[1..])),
        Some("deb") => setup::run().and_then(|_| deb(DebProfile::Release)),
        Some("previous") => setup::run()
            .and_then(|_| previous::build())
            .and_then(|_| build())
            .and_then(|_| previous::check_head_relinked()),
        Some("lint") => setup::run().and_then(|_| lint()),
        Some("testbed") => testbed(),
        Some("cluster") => setup::run()
            .and_then(|_| build())
            .and_then(|_| testbed())
            .and_then(|_| cluster(&args[1..])),
        Some("conformance") => setup::run()
            .and_then(|_| build())
            .and_then(|_| testbed())
            .and_then(|_| e2e_suite())
            .and_then(|_| conformance(&args[1..])),
        Some("manifests") => testbed().and_then(|_| manifests()),
        Some("image") => setup::run()
            .and_then(|_| build())
            .and_then(|_| testbed())
            .and_then(|_| image::run_image()),
        Some("stack") => build().and_then(|_| stack::run(&root())),
        Some("bench") => setup::run().and_then(|_| bench(&args[1..])),
        Some("soak") => setup::run()
            .and_then(|_| build())
            .and_then(|_| soak(&args[1..])),
        _ => {
            eprint!("{USAGE}");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        eprintln!("xtask: {e:#}");
        std::process::exit(1);
    }
}

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A command run from the workspace root with ~/.cargo/bin on PATH (where
/// bpf-linker is installed), echoed before it runs.
pub fn cmd(program: &str, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args)
        .current_dir(root())
        .env("PATH", setup::path_with_cargo_bin());
    c
}

pub fn run(mut c: Command) -> anyhow::Result<()> {
    eprintln!("xtask: $ {}", describe(&c));
    let status = c
        .status()
        .with_context(|| format!("starting {}", describe(&c)))?;
    if !status.success() {
        bail!("{} failed with {status}", describe(&c));
    }
    Ok(())
}

fn describe(c: &Command) -> String {
    std::iter::once(c.get_program().to_string_lossy().into_owned())
        .chain(c.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ")
}

fn build() -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    run(cmd("cargo", &["build", "--bins"]))?;
    eprintln!("xtask: build done in {:.0?}", started.elapsed());
    Ok(())
}

/// rustfmt and clippy with warnings denied: the host workspace, then the
/// eBPF programs as they are really built. On the host every module of
/// lb-ebpf is gated on `target_arch = "bpf"` (the binary is an empty stub),
/// so the host's clippy lints none of the data path; Debian's rustc-web
/// (the toolchain that builds it, with its prebuilt `core` for
/// bpfel-unknown-none) has its own clippy (rust-web-clippy).
fn lint() -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    for (tool, fix) in [
        (
            "fmt",
            "rustup component add rustfmt (or apt-get install rustfmt-web)",
        ),
        (
            "clippy",
            "rustup component add clippy (or apt-get install rust-web-clippy)",
        ),
    ] {
        let present = cmd("cargo", &[tool, "--version"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !present {
            bail!("cargo {tool} is not installed: {fix}");
        }
    }
    run(cmd("cargo", &["fmt", "--all", "--check"]))
        .context("the workspace is not rustfmt-clean: run cargo fmt --all")?;
    run(cmd(
        "cargo",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "-q",
            "--",
            "-D",
            "warnings",
        ],
    ))
    .context("clippy found something in the workspace")?;
    // Debian's cargo and clippy, first on PATH, so that clippy-driver is the
    // one of the rustc that has the bpfel core; aya-ebpf's one unstable
    // feature allowed for that crate only, as lb-userspace/build.rs does.
    // Its own presence check: the host's clippy above is another toolchain's.
    let debian_clippy = Command::new("/usr/bin/cargo")
        .args(["clippy", "--version"])
        .env("PATH", "/usr/bin:/bin")
        .env("RUSTC", "/usr/bin/rustc")
        .env_remove("RUSTUP_TOOLCHAIN")
        .output()
        .is_ok_and(|o| o.status.success());
    if !debian_clippy {
        bail!(
            "Debian's clippy, which lints lb-ebpf for bpfel-unknown-none with the rustc that has \
             its core, is not installed: apt-get install rust-web-clippy"
        );
    }
    let mut ebpf = Command::new("/usr/bin/cargo");
    ebpf.args([
        "clippy",
        "--target",
        "bpfel-unknown-none",
        "--bin",
        "lb-ebpf",
        "-q",
        "--",
        "-D",
        "warnings",
    ])
    .current_dir(root().join("lb-ebpf"))
    .env("PATH", {
        let mut path = std::ffi::OsString::from("/usr/bin:");
        path.push(setup::path_with_cargo_bin());
        path
    })
    .env("RUSTC", "/usr/bin/rustc")
    .env("RUSTC_BOOTSTRAP", "aya_ebpf")
    .env("CARGO_TARGET_DIR", root().join("target/ebpf-lint"))
    .env_remove("RUSTUP_TOOLCHAIN")
    .env_remove("RUSTC_WRAPPER")
    .env_remove("RUSTC_WORKSPACE_WRAPPER");
    run(ebpf)
        .context("clippy found something in the eBPF programs (lb-ebpf, bpfel-unknown-none)")?;
    eprintln!("xtask: lint clean in {:.0?}", started.elapsed());
    Ok(())
}

/// The Kubernetes test bed: one Go binary with etcd, the apiserver, the
/// controller manager, the scheduler, the kubelet and kubectl, from the
/// upstream modules pinned in testbed/go.mod, and the image tools of
/// testbed/images, and the real kube-proxy. Go's build cache makes the
/// rebuilds quick; a cold build takes several minutes on two cores.
fn testbed() -> anyhow::Result<()> {
    let go = go()?;
    let out_dir = root().join("target/testbed");
    std::fs::create_dir_all(&out_dir)?;
    let version = "v1.35.8";
    let mut ldflags = String::from("-s -w");
    for p in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        ldflags.push_str(&format!(
            " -X {p}.gitVersion={version} -X {p}.gitMajor=1 -X {p}.gitMinor=35 -X {p}.gitTreeState=clean -X {p}.buildDate=1970-01-01T00:00:00Z"
        ));
    }
    let started = std::time::Instant::now();
    // lbtestbed (the control plane, the kubelet, kubectl); agnhost, the e2e
    // suite's test image program; and the real kube-proxy, stamped like
    // lbtestbed (the control runs of the conformance suite and the
    // side-by-side benchmarks run it where the agent would run). All from
    // the Kubernetes module of testbed/go.mod.
    for (out, pkg, flags) in [
        ("lbtestbed", ".", ldflags.as_str()),
        ("agnhost", "k8s.io/kubernetes/test/images/agnhost", "-s -w"),
        (
            "kube-proxy",
            "k8s.io/kubernetes/cmd/kube-proxy",
            ldflags.as_str(),
        ),
    ] {
        let mut c = cmd(go, &["build", "-trimpath", "-ldflags", flags, "-o"]);
        c.arg(out_dir.join(out))
            .arg(pkg)
            .current_dir(root().join("testbed"))
            .env("CGO_ENABLED", "0")
            .env("GOTOOLCHAIN", "local")
            .env("GOFLAGS", "-mod=readonly");
        run(c)?;
    }
    let kubectl = out_dir.join("kubectl");
    let _ = std::fs::remove_file(&kubectl);
    std::os::unix::fs::symlink("lbtestbed", &kubectl)?;
    // The node's images are assembled here (no registry is reachable):
    // lbimage (go-containerregistry) and the pod sandbox's pause, a module
    // of their own so that go-containerregistry's requirements do not move
    // the Kubernetes modules' versions.
    // CoreDNS (kube-dns of the test node) likewise: its client-go is its own.
    // Helm (the chart's lint, template and install tests) too.
    for (out, module, pkg) in [
        ("lbimage", "testbed/images", "."),
        ("pause", "testbed/images", "./pause"),
        ("coredns", "testbed/coredns", "."),
        ("helm", "testbed/helm", "helm.sh/helm/v3/cmd/helm"),
    ] {
        // As Helm's Makefile links it: its version, and the Kubernetes
        // version of its client-go (v0.37) as the default the charts are
        // rendered for (otherwise v1.20).
        let flags = if out == "helm" {
            "-s -w -X helm.sh/helm/v3/internal/version.version=v3.22.0 \
             -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 \
             -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=37 \
             -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 \
             -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=37"
        } else {
            "-s -w"
        };
        let mut c = cmd(go, &["build", "-trimpath", "-ldflags", flags, "-o"]);
        c.arg(out_dir.join(out))
            .arg(pkg)
            .current_dir(root().join(module))
            .env("CGO_ENABLED", "0")
            .env("GOTOOLCHAIN", "local")
            .env("GOFLAGS", "-mod=readonly");
        run(c)?;
    }
    eprintln!("xtask: test bed built in {:.0?}", started.elapsed());
    Ok(())
}

/// The Go toolchain: on PATH, or where the machines have it.
fn go() -> anyhow::Result<&'static str> {
    ["go", "/usr/local/go/bin/go"]
        .into_iter()
        .find(|g| Command::new(g).arg("version").output().is_ok_and(|o| o.status.success()))
        .context("no Go toolchain found (go on PATH or /usr/local/go/bin/go): the Kubernetes test bed needs it")
}

/// The upstream e2e suite (`testbed/e2e`: k8s.io/kubernetes/test/e2e with
/// the sig-network tests) as one test binary, target/testbed/e2e.test.
fn e2e_suite() -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let mut c = cmd(
        go()?,
        &[
            "test",
            "-c",
            "-vet=off",
            "-trimpath",
            "-ldflags",
            "-s -w",
            "-o",
        ],
    );
    c.arg(root().join("target/testbed/e2e.test"))
        .arg("./e2e")
        .current_dir(root().join("testbed"))
        .env("CGO_ENABLED", "0")
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=readonly");
    run(c)?;
    eprintln!("xtask: e2e suite built in {:.0?}", started.elapsed());
    Ok(())
}

fn conformance(extra: &[String]) -> anyhow::Result<()> {
    let mut args: Vec<&str> = extra.iter().map(String::as_str).collect();
    // A control run (`--proxy kube-proxy-MODE`) publishes beside the
    // agent's report, which shows it in a column of its own.
    let proxy = args
        .iter()
        .position(|a| *a == "--proxy")
        .and_then(|i| extra.get(i + 1))
        .filter(|p| p.as_str() != "agent");
    let report = proxy.map_or_else(
        || "docs/conformance.md".to_string(),
        |p| format!("docs/conformance-{p}.md"),
    );
    if !args.contains(&"--report") {
        args.extend(["--report", report.as_str()]);
    }
    let result = run(cmd(
        &root().join("target/debug/lb-conformance").to_string_lossy(),
        &args,
    ));
    setup::sweep_leftovers();
    result
}

/// Which build the Debian package takes its binaries from.
#[derive(Clone, Copy, PartialEq)]
enum DebProfile {
    /// `cargo xtask deb`: what users install.
    Release,
    /// `cargo xtask test`: the debug build the tests just made, so CI does
    /// not compile the workspace a second time (minutes on two cores) to
    /// test packaging, which does not depend on the optimisation level.
    /// cargo-deb 3.8 warns that it may refuse the dev profile one day; it
    /// is pinned (setup.rs), and the test package is never shipped.
    Dev,
}

/// The Debian package (lb-userspace's [package.metadata.deb]): the build,
/// the shell completions it ships, then cargo-deb. cargo-deb maps the
/// assets' `target/release/` to the chosen profile's directory.
fn deb(profile: DebProfile) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let (cargo_profile, dir) = match profile {
        DebProfile::Release => ("release", "target/release"),
        DebProfile::Dev => ("dev", "target/debug"),
    };
    if profile == DebProfile::Release {
        run(cmd(
            "cargo",
            &["build", "--release", "-p", "lb-userspace", "--bins"],
        ))?;
    } // Dev: `build()` (`cargo build --bins`, the workspace) made them just now.
    let release = root().join(dir);
    let completions = release.join("completions");
    std::fs::create_dir_all(&completions)?;
    for bin in ["lbctl", "lb-agent"] {
        for (shell, file) in [
            ("bash", format!("{bin}.bash")),
            ("zsh", format!("_{bin}")),
            ("fish", format!("{bin}.fish")),
        ] {
            let out = Command::new(release.join(bin))
                .args(["completion", shell])
                .output()?;
            if !out.status.success() || out.stdout.is_empty() {
                bail!("{bin} completion {shell} failed");
            }
            std::fs::write(completions.join(file), out.stdout)?;
        }
    }
    let out_dir = root().join("target/debian");
    let _ = std::fs::remove_dir_all(&out_dir);
    let mut c = cmd(
        "cargo",
        &[
            "deb",
            "-p",
            "lb-userspace",
            "--no-build",
            "--profile",
            cargo_profile,
            "--output",
        ],
    );
    c.arg(&out_dir);
    run(c)?;
    eprintln!(
        "xtask: Debian package in {} ({:.0?})",
        out_dir.display(),
        started.elapsed()
    );
    Ok(())
}

/// deploy/kubernetes from the Helm chart: the manifests test renders the
/// chart and, with LB_UPDATE_MANIFESTS set, writes what it rendered.
fn manifests() -> anyhow::Result<()> {
    let mut c = cmd(
        "cargo",
        &[
            "test",
            "-p",
            "lb-testkit",
            "--test",
            "deploy_manifests",
            "kustomize_base_is_the_chart_rendered_with_its_values",
        ],
    );
    c.env("LB_UPDATE_MANIFESTS", "1");
    run(c)
}

/// `cluster up` / `down` / `status`: the control plane of the tests, kept
/// running for hands-on use (lb-cluster, in lb-testkit).
fn cluster(extra: &[String]) -> anyhow::Result<()> {
    let mut args: Vec<&str> = extra.iter().map(String::as_str).collect();
    if args.is_empty() {
        args.push("status");
    }
    run(cmd(
        &root().join("target/debug/lb-cluster").to_string_lossy(),
        &args,
    ))
}

fn demo() -> anyhow::Result<()> {
    run(cmd(
        &root().join("target/debug/lb-demo").to_string_lossy(),
        &[],
    ))
}

fn test(extra: &[String]) -> anyhow::Result<()> {
    if unsafe_geteuid() != 0 {
        bail!("the integration tests load BPF programs and create network namespaces: run as root");
    }
    let started = std::time::Instant::now();
    let mut args = vec!["test", "--no-fail-fast"];
    args.extend(extra.iter().map(String::as_str));
    let result = run(cmd("cargo", &args));
    setup::sweep_leftovers();
    result?;
    eprintln!("xtask: all tests passed in {:.0?}", started.elapsed());
    Ok(())
}

/// The soak test alone, for `--duration` (default one hour).
fn soak(extra: &[String]) -> anyhow::Result<()> {
    if unsafe_geteuid() != 0 {
        bail!("the soak test loads BPF programs and creates network namespaces: run as root");
    }
    let seconds = match extra {
        [] => 3600,
        [flag, d] if flag == "--duration" => parse_duration_s(d)?,
        _ => bail!("usage: cargo xtask soak [--duration 1h]"),
    };
    let mut test = cmd(
        "cargo",
        &[
            "test",
            "-p",
            "lb-testkit",
            "--test",
            "soak",
            "--",
            "--include-ignored",
            "--nocapture",
        ],
    );
    test.env("LB_SOAK_SECONDS", seconds.to_string())
        .env("LB_SOAK_REPORT", root().join("target/soak"));
    let result = run(test);
    setup::sweep_leftovers();
    result?;
    eprintln!("xtask: the soak report is in target/soak/report.md");
    Ok(())
}

/// "90", "90s", "3m", "1h": whole seconds.
fn parse_duration_s(d: &str) -> anyhow::Result<u64> {
    let (number, unit) = d.split_at(d.find(|c: char| !c.is_ascii_digit()).unwrap_or(d.len()));
    let n: u64 = number
        .parse()
        .with_context(|| format!("--duration {d}: a whole number with s, m or h (e.g. 1h)"))?;
    Ok(match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => bail!("--duration {d}: the unit is s, m or h (e.g. 1h)"),
    })
}

/// Benchmarks are built in release mode: the agent's and the programs'
/// loaders' speed is part of what is measured.
fn bench(extra: &[String]) -> anyhow::Result<()> {
    if unsafe_geteuid() != 0 {
        bail!("the benchmarks load BPF programs and create network namespaces: run as root");
    }
    let mut args: Vec<&str> = Vec::new();
    let mut smoke = false;
    for a in extra {
        match a.as_str() {
            "--quick" => args.extend(["--profile", "quick"]),
            "--smoke" => {
                smoke = true;
                args.extend(["--profile", "smoke"]);
            }
            other => args.push(other),
        }
    }
    // The smoke run only proves the bench works: the debug build the tests
    // made is enough and saves CI a release build.
    let profile = if smoke { "debug" } else { "release" };
    if smoke {
        build()?;
    } else {
        run(cmd("cargo", &["build", "--release", "--bins"]))?;
    }
    // The propagation part runs a real control plane.
    testbed()?;
    let result = run(cmd(
        &root()
            .join("target")
            .join(profile)
            .join("lb-bench")
            .to_string_lossy(),
        &args,
    ));
    setup::sweep_leftovers();
    result
}

fn unsafe_geteuid() -> u32 {
    // No libc dependency: read the effective uid from /proc.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).and_then(|u| u.parse().ok()))
        })
        .unwrap_or(u32::MAX)
}
