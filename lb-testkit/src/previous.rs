//! The previous release's lb-agent, which the upgrade test runs before and
//! after this build's: the commit of lb-testkit/previous-release, built by
//! `cargo xtask test` (or `cargo xtask previous`) into
//! target/previous/<commit>/lb-agent.
use std::path::PathBuf;

const RELEASE_FILE: &str = include_str!("../previous-release");

/// The previous release's commit (the file's first line that is not a
/// comment).
pub fn commit() -> &'static str {
    RELEASE_FILE
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .expect("lb-testkit/previous-release names a commit")
}

/// Its lb-agent, which must be built.
pub fn agent() -> PathBuf {
    let target = crate::sibling_bin_dir()
        .parent()
        .expect("the target directory")
        .to_path_buf();
    let path = target.join("previous").join(commit()).join("lb-agent");
    assert!(
        path.exists(),
        "{} is not built: run `cargo xtask previous` (`cargo xtask test` does)",
        path.display()
    );
    path
}
