//! cargo xtask: set up the machine, build, run the demo, the tests and the
//! benchmarks. Deliberately free of project dependencies: it must compile on a
//! fresh machine before anything it installs (bpf-linker, LLVM) exists.
mod setup;

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
  test    setup, build, then run every test (unit and real-kernel integration; needs root)
  bench   setup, release build, then benchmarks side by side with kube-proxy's rule layouts;
          writes docs/benchmarks.md. --quick: under 3 minutes; --smoke: seconds (CI)
";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("setup") => setup::run(),
        Some("build") => setup::run().and_then(|_| build()),
        Some("demo") => setup::run().and_then(|_| build()).and_then(|_| demo()),
        Some("test") => setup::run()
            .and_then(|_| build())
            .and_then(|_| test(&args[1..])),
        Some("bench") => setup::run().and_then(|_| bench(&args[1..])),
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
