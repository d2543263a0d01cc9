//! cgroup2 and bpffs: finding and checking the file systems we attach and pin to.
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

/// The cgroup v2 mount point, read from /proc/mounts (never assumed: hybrid
/// systems mount it at /sys/fs/cgroup/unified, pure v2 at /sys/fs/cgroup).
pub fn cgroup2_mount() -> anyhow::Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").context("reading /proc/mounts")?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_dev, dir, fstype) = (f.next()?, f.next()?, f.next()?);
            (fstype == "cgroup2").then(|| PathBuf::from(dir))
        })
        .next()
        .context("no cgroup2 file system is mounted: the socket load balancer needs cgroup v2 (mount -t cgroup2 none /sys/fs/cgroup)")
}

fn fs_magic(path: &Path) -> anyhow::Result<i64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: statfs is plain old data; all-zero is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path alive for the call; `st` is a valid out pointer.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("statfs {}", path.display()));
    }
    Ok(st.f_type as i64)
}

const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

pub fn check_cgroup2(path: &Path) -> anyhow::Result<()> {
    if !path.is_dir() {
        bail!("cgroup {} does not exist: create it or pass --cgroup with an existing cgroup v2 directory", path.display());
    }
    if fs_magic(path)? != CGROUP2_SUPER_MAGIC {
        bail!("{} is not on a cgroup v2 file system: pass a cgroup v2 directory (see /proc/mounts, type cgroup2)", path.display());
    }
    Ok(())
}

/// Checks that `pin_dir` is (or can be created) on bpffs, creating it mode 0700.
pub fn ensure_pin_dir(pin_dir: &Path) -> anyhow::Result<()> {
    let mut existing = pin_dir;
    while !existing.exists() {
        existing = existing
            .parent()
            .context("pin directory has no existing parent")?;
    }
    if fs_magic(existing)? != BPF_FS_MAGIC {
        bail!(
            "{} is not on a BPF file system: mount it with `mount -t bpf bpf /sys/fs/bpf`, or pass --pin-dir under a bpffs mount",
            existing.display()
        );
    }
    std::fs::create_dir_all(pin_dir.join("links"))
        .with_context(|| format!("creating {}", pin_dir.display()))?;
    // Pins are the data path's state: root only.
    use std::os::unix::fs::PermissionsExt as _;
    for dir in [pin_dir.to_path_buf(), pin_dir.join("links")] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("chmod 0700 {}", dir.display()))?;
    }
    Ok(())
}

/// The id the kernel gives a cgroup v2 directory (its kernfs inode number).
pub fn cgroup_id(path: &Path) -> anyhow::Result<u64> {
    use std::os::unix::fs::MetadataExt as _;
    Ok(std::fs::metadata(path)
        .with_context(|| format!("stat {}", path.display()))?
        .ino())
}

/// The cookie of the caller's network namespace (SO_NETNS_COOKIE, Linux 5.14).
pub fn own_netns_cookie() -> anyhow::Result<u64> {
    const SO_NETNS_COOKIE: libc::c_int = 71;
    // SAFETY: socket(2) takes no pointers; the fd is closed below on every path.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("socket()");
    }
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `cookie` and `len` are valid for writes of the sizes passed.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    let err = std::io::Error::last_os_error();
    // SAFETY: `fd` is ours, opened above and not used after.
    unsafe { libc::close(fd) };
    if r != 0 {
        return Err(err).context("getsockopt(SO_NETNS_COOKIE): the kernel is older than 5.14; host-namespace-only socket LB needs it");
    }
    Ok(cookie)
}
