//! The previous release's lb-agent, for the upgrade test
//! (lb-testkit/tests/upgrade.rs): the commit named in
//! lb-testkit/previous-release, exported with `git archive` (no worktree
//! left behind) and built with this workspace's target directory, so only
//! the crates of this repository build again (the registry crates of the
//! same versions are shared). Its binary is copied to
//! target/previous/<commit>/lb-agent; HEAD's are then linked again by the
//! `cargo build` that follows, and checked to be other files.
use std::path::PathBuf;

use anyhow::{bail, Context as _};

use crate::{cmd, root, run};

/// The commit of lb-testkit/previous-release (its first line that is not
/// a comment).
pub fn commit() -> anyhow::Result<String> {
    let file = root().join("lb-testkit/previous-release");
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let commit = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .with_context(|| format!("{}: no commit in it", file.display()))?;
    if commit.len() != 40 || !commit.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!(
            "{}: {commit:?} is not a full commit id (40 hex digits)",
            file.display()
        );
    }
    Ok(commit.to_string())
}

/// The target directory the builds share (CARGO_TARGET_DIR, or target/).
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), PathBuf::from)
}

/// Where the upgrade test finds it (beside the test binaries' profile
/// directory).
pub fn agent_path(commit: &str) -> PathBuf {
    target_dir().join("previous").join(commit).join("lb-agent")
}

/// Builds the previous release's lb-agent unless it is there already.
pub fn build() -> anyhow::Result<()> {
    let commit = commit()?;
    let out = agent_path(&commit);
    if out.exists() {
        eprintln!(
            "xtask: the previous release's agent is built ({})",
            out.display()
        );
        return Ok(());
    }
    let started = std::time::Instant::now();
    let have = cmd("git", &["cat-file", "-e", &format!("{commit}^{{commit}}")])
        .status()
        .context("running git")?;
    if !have.success() {
        // A shallow clone lacks it: fetch that commit alone.
        run(cmd(
            "git",
            &["fetch", "--quiet", "--depth=1", "origin", &commit],
        ))
        .with_context(|| {
            format!("commit {commit} (lb-testkit/previous-release) is not in this clone")
        })?;
    }
    // A directory per commit: its crates are other packages to cargo than
    // any other release's, so nothing built for one passes for another.
    let dir = out.parent().unwrap().to_path_buf();
    let src = dir.join("src");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src)?;
    // git archive | tar -x: the tree as it was, nothing of git's; -m dates
    // the files now, not at the commit, so cargo never takes an older
    // build of them for fresh.
    let archive = dir.join("src.tar");
    let mut export = cmd("git", &["archive", "--format=tar", "-o"]);
    export.arg(&archive).arg(&commit);
    run(export)?;
    let mut untar = cmd("tar", &["-xmf"]);
    untar.arg(&archive).arg("-C").arg(&src);
    run(untar)?;
    std::fs::remove_file(&archive)?;
    mark_versions(&src)?;

    // The workspace's default members selected, as HEAD's `cargo build
    // --bins` selects them: features unify alike, so the registry crates
    // are shared rather than built twice.
    let mut build = cmd("cargo", &["build", "--bin", "lb-agent"]);
    build
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", target_dir());
    run(build)?;
    // Copied, not linked (HEAD's next build replaces target/debug/lb-agent),
    // and renamed into place: a copy cut short is never taken for a build.
    let partial = out.with_extension("partial");
    std::fs::copy(target_dir().join("debug/lb-agent"), &partial)?;
    std::fs::rename(&partial, &out)?;
    std::fs::remove_dir_all(&src)?;
    eprintln!(
        "xtask: the previous release ({}) built into {} in {:.0?}",
        &commit[..12],
        out.display(),
        started.elapsed()
    );
    Ok(())
}

/// Gives the release's own crates the version `<version>-previous`. Cargo
/// names a workspace crate's artifacts (and its build script's OUT_DIR,
/// where lb-userspace/build.rs builds the eBPF object) by its name, version
/// and path relative to the workspace root: the same for this tree and the
/// release's, so without another version the two builds would take each
/// other's artifacts for their own (found: HEAD's agent embedding the
/// release's programs). Registry crates stay shared. Cargo.lock follows
/// by itself (only the workspace's own entries change).
fn mark_versions(src: &std::path::Path) -> anyhow::Result<()> {
    let mut manifests = vec![src.join("Cargo.toml")];
    for entry in std::fs::read_dir(src)? {
        let manifest = entry?.path().join("Cargo.toml");
        if manifest.exists() {
            manifests.push(manifest);
        }
    }
    let mut marked = 0;
    for manifest in manifests {
        let text = std::fs::read_to_string(&manifest)?;
        // A package's or the workspace's version sits at the start of a
        // line; dependencies give theirs inline.
        let changed: Vec<String> = text
            .lines()
            .map(|l| match l.strip_prefix("version = \"") {
                Some(rest) if rest.ends_with('"') => {
                    marked += 1;
                    format!("version = \"{}-previous\"", rest.trim_end_matches('"'))
                }
                _ => l.to_string(),
            })
            .collect();
        std::fs::write(&manifest, changed.join("\n") + "\n")?;
    }
    if marked == 0 {
        bail!("no version to mark in {}", src.display());
    }
    Ok(())
}

/// After HEAD's build: target/debug/lb-agent must be HEAD's again, not
/// the previous release's (cargo links a binary again even when nothing
/// in it changed; this says so loudly if that ever stops being true).
pub fn check_head_relinked() -> anyhow::Result<()> {
    let commit = commit()?;
    let previous = std::fs::read(agent_path(&commit))?;
    let head = std::fs::read(target_dir().join("debug/lb-agent"))?;
    if previous == head {
        bail!(
            "target/debug/lb-agent is the previous release's ({commit}): remove it and run `cargo build --bins`"
        );
    }
    // Each embeds the eBPF object of its own tree, which names its sources:
    // the release's under target/previous/, this tree's elsewhere.
    let marker = b"/target/previous/";
    let holds = |bin: &[u8]| bin.windows(marker.len()).any(|w| w == marker);
    if holds(&head) {
        bail!(
            "target/debug/lb-agent embeds programs built from the previous release's sources: \
             run `cargo clean -p lb-userspace` and `cargo xtask previous` again"
        );
    }
    if !holds(&previous) {
        bail!(
            "{} embeds programs not built from the release's sources: remove it and run \
             `cargo xtask previous` again",
            agent_path(&commit).display()
        );
    }
    Ok(())
}
