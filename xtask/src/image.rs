//! `cargo xtask image`: deploy/Dockerfile built for real, with buildah
//! (Debian's package), unchanged. No registry is reachable here, so the
//! base images it names (`debian:bookworm`, `debian:bookworm-slim`) are
//! made from Debian's packages with mmdebstrap, as Debian's official images
//! are (a minbase bootstrap; the slim one without documentation, manual
//! pages and translations, like debuerreotype's `--slimify`), and committed
//! into buildah's local storage under those names. The image is then
//! written as a docker-archive to target/image/, and a node test runs it as
//! the DaemonSet (lb-testkit/tests/dockerfile_image.rs).
use std::{path::Path, process::Command};

use anyhow::{bail, Context as _};

use crate::{cmd, root, run};

/// The reference the chart's default values name (and the test bed's node
/// imports): the archive carries it as its tag.
const IMAGE: &str = "ghcr.io/example/lb-agent:0.1.0";

/// What building the image needs, installed on demand: not in `setup`,
/// since neither CI nor the tests build the image.
const PACKAGES: &[&str] = &["buildah", "mmdebstrap", "uidmap"];

/// Paths the slim base leaves out: the list of debuerreotype's
/// `slimify-excludes`, which Debian's `-slim` images are made with,
/// keeping the copyright files.
const SLIM_EXCLUDES: &[&str] = &[
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/linda/*",
    "path-exclude=/usr/share/lintian/overrides/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/man/*",
];

pub fn run_image() -> anyhow::Result<()> {
    if super::unsafe_geteuid() != 0 {
        bail!("image installs packages and runs buildah: run as root");
    }
    let started = std::time::Instant::now();
    packages()?;
    let out_dir = root().join("target/image");
    std::fs::create_dir_all(&out_dir)?;
    base("docker.io/library/debian:bookworm", &[], &out_dir)?;
    base(
        "docker.io/library/debian:bookworm-slim",
        SLIM_EXCLUDES,
        &out_dir,
    )?;

    // The Dockerfile as a user builds it, from the repository root. The
    // build stage's apt-get and cargo reach Debian's mirror and crates.io
    // over the host's network (a private one needs a CNI config buildah
    // does not have here); --pull=never: the bases are the local ones.
    let mut build = cmd(
        "buildah",
        &[
            "build",
            "--network",
            "host",
            "--pull=never",
            "--layers",
            "--force-rm",
            "-f",
            "deploy/Dockerfile",
            "-t",
            IMAGE,
        ],
    );
    // This machine reaches crates.io through a TLS-inspecting proxy whose
    // CA the host trusts through /usr/local/share/ca-certificates. Mounted
    // read-only into the build's RUN steps, the build stage's
    // `ca-certificates` takes it in as it would on such a host; the
    // Dockerfile is unchanged and nothing of it reaches the final image.
    let local_cas = Path::new("/usr/local/share/ca-certificates");
    let has_local_cas = std::fs::read_dir(local_cas).is_ok_and(|d| {
        d.flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "crt"))
    });
    if has_local_cas {
        build.arg(format!(
            "--volume={}:{}:ro",
            local_cas.display(),
            local_cas.display()
        ));
    }
    build.arg(".").current_dir(root());
    run(build)?;

    let archive = out_dir.join("lb-agent.tar");
    let _ = std::fs::remove_file(&archive);
    run(cmd(
        "buildah",
        &[
            "push",
            "--format",
            "docker",
            IMAGE,
            &format!("docker-archive:{}:{IMAGE}", archive.display()),
        ],
    ))?;
    let size = output("buildah", &["images", "--format", "{{.Size}}", IMAGE])?;
    let archived = std::fs::metadata(&archive)?.len();
    eprintln!(
        "xtask: {IMAGE} built from deploy/Dockerfile in {:.0?}: {} in buildah's storage, \
         archive {} ({:.1} MB)",
        started.elapsed(),
        size.trim(),
        archive.display(),
        archived as f64 / 1e6
    );

    // The image on a real node: the test bed imports the archive in place
    // of the one it assembles from the built binaries.
    let mut test = cmd(
        "cargo",
        &[
            "test",
            "-p",
            "lb-testkit",
            "--test",
            "dockerfile_image",
            "--",
            "--ignored",
        ],
    );
    test.env("LB_AGENT_IMAGE_ARCHIVE", &archive);
    let result = run(test);
    crate::setup::sweep_leftovers();
    result
}

fn packages() -> anyhow::Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    run(cmd("apt-get", &["update"]))?;
    let mut install = cmd("apt-get", &["install", "-y", "--no-install-recommends"]);
    install
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive");
    run(install)
}

/// `name` in buildah's storage, bootstrapped from Debian bookworm unless
/// it is there already.
fn base(name: &str, dpkg_opts: &[&str], out_dir: &Path) -> anyhow::Result<()> {
    let present = Command::new("buildah")
        .args(["inspect", "--type", "image", name])
        .output()
        .is_ok_and(|o| o.status.success());
    if present {
        eprintln!("xtask: {name} is in buildah's storage already");
        return Ok(());
    }
    let tar = out_dir.join(format!(
        "{}.rootfs.tar",
        name.rsplit('/').next().unwrap_or(name).replace(':', "_")
    ));
    // The merged-/usr layout made by mmdebstrap's hook, as debootstrap and
    // Debian's images make it: minbase alone pulls in the usrmerge package
    // and with it perl (about 30 MB).
    let mut strap = cmd(
        "mmdebstrap",
        &[
            "--variant=minbase",
            "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        ],
    );
    for o in dpkg_opts {
        strap.arg(format!("--dpkgopt={o}"));
    }
    // The suites Debian's images list: bookworm's point releases come
    // through -updates and -security (rustc-web and LLVM 22, which the
    // Dockerfile's build stage installs, are only there).
    strap.arg("bookworm").arg(&tar).args([
        "deb http://deb.debian.org/debian bookworm main",
        "deb http://deb.debian.org/debian bookworm-updates main",
        "deb http://deb.debian.org/debian-security bookworm-security main",
    ]);
    run(strap)?;
    let container = output("buildah", &["from", "scratch"])?;
    let container = container.trim();
    let made = (|| -> anyhow::Result<()> {
        run(cmd(
            "buildah",
            &["add", container, &tar.display().to_string(), "/"],
        ))?;
        // As Debian's images: a shell, and PATH for it.
        run(cmd(
            "buildah",
            &[
                "config",
                "--env",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--cmd",
                "bash",
                container,
            ],
        ))?;
        run(cmd("buildah", &["commit", "--rm", container, name]))
    })();
    if made.is_err() {
        let _ = Command::new("buildah").args(["rm", container]).status();
    }
    let _ = std::fs::remove_file(&tar);
    made.with_context(|| format!("committing {name}"))
}

fn output(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = cmd(program, args).output()?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
