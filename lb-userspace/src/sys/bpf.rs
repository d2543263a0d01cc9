//! bpf(2) commands aya 0.14 keeps private: updating the program of a pinned
//! cgroup link (BPF_LINK_UPDATE), reading a link's target (BPF_OBJ_GET_INFO_BY_FD)
//! and listing the programs attached to a cgroup (BPF_PROG_QUERY).
//! Layouts follow include/uapi/linux/bpf.h; each attr is zero-padded, as the
//! kernel requires unused tail bytes to be zero.
use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    path::Path,
};

const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_LINK_UPDATE: libc::c_long = 29;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// Attach types of the socket hooks (enum bpf_attach_type).
pub const BPF_CGROUP_INET4_CONNECT: u32 = 10;
pub const BPF_CGROUP_UDP4_SENDMSG: u32 = 14;
pub const BPF_CGROUP_UDP4_RECVMSG: u32 = 19;
pub const BPF_CGROUP_INET4_GETPEERNAME: u32 = 29;
pub const BPF_CGROUP_INET6_CONNECT: u32 = 11;
pub const BPF_CGROUP_UDP6_SENDMSG: u32 = 15;
pub const BPF_CGROUP_UDP6_RECVMSG: u32 = 20;
pub const BPF_CGROUP_INET6_GETPEERNAME: u32 = 30;
pub const BPF_CGROUP_INET_SOCK_RELEASE: u32 = 34;

#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Self {
        Attr([0; 128])
    }
    fn put_u32(&mut self, off: usize, v: u32) {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
    }
    fn put_u64(&mut self, off: usize, v: u64) {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
    }
    fn get_u32(&self, off: usize) -> u32 {
        u32::from_ne_bytes(self.0[off..off + 4].try_into().unwrap())
    }
}

fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a zero-padded bpf_attr of the size passed, alive for the call; every pointer in it was set by the caller to a live buffer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut Attr,
            std::mem::size_of::<Attr>(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Opens a pinned object (map, program or link).
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    let mut attr = Attr::new();
    attr.put_u64(0, c.as_ptr() as u64); // pathname
    let fd = bpf(BPF_OBJ_GET, &mut attr)?;
    // SAFETY: BPF_OBJ_GET returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Swaps the program of a link atomically: the hook is never empty.
pub fn link_update(link: BorrowedFd<'_>, new_prog: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = Attr::new();
    attr.put_u32(0, link.as_raw_fd() as u32); // link_fd
    attr.put_u32(4, new_prog.as_raw_fd() as u32); // new_prog_fd
    bpf(BPF_LINK_UPDATE, &mut attr).map(drop)
}

/// What a cgroup link is attached to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupLinkInfo {
    pub link_id: u32,
    pub prog_id: u32,
    pub cgroup_id: u64,
    pub attach_type: u32,
}

pub fn cgroup_link_info(link: BorrowedFd<'_>) -> io::Result<CgroupLinkInfo> {
    // struct bpf_link_info: type, id, prog_id, then (8-aligned) union { cgroup { cgroup_id, attach_type } }.
    let mut info = [0u64; 32];
    let mut attr = Attr::new();
    attr.put_u32(0, link.as_raw_fd() as u32); // bpf_fd
    attr.put_u32(4, std::mem::size_of_val(&info) as u32); // info_len
    attr.put_u64(8, info.as_mut_ptr() as u64); // info
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    let bytes: &[u8] =
        // SAFETY: views the initialised `info` buffer as bytes, for its own size and lifetime.
        unsafe { std::slice::from_raw_parts(info.as_ptr().cast(), std::mem::size_of_val(&info)) };
    let u32_at = |o: usize| u32::from_ne_bytes(bytes[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_ne_bytes(bytes[o..o + 8].try_into().unwrap());
    Ok(CgroupLinkInfo {
        link_id: u32_at(4),
        prog_id: u32_at(8),
        cgroup_id: u64_at(16),
        attach_type: u32_at(24),
    })
}

/// Ids of every program attached to `cgroup` for `attach_type` (effective or not).
pub fn cgroup_prog_ids(cgroup: BorrowedFd<'_>, attach_type: u32) -> io::Result<Vec<u32>> {
    let mut ids = vec![0u32; 64];
    let mut attr = Attr::new();
    attr.put_u32(0, cgroup.as_raw_fd() as u32); // target_fd
    attr.put_u32(4, attach_type);
    attr.put_u64(16, ids.as_mut_ptr() as u64); // prog_ids
    attr.put_u32(24, ids.len() as u32); // prog_cnt
    bpf(BPF_PROG_QUERY, &mut attr)?;
    ids.truncate(attr.get_u32(24) as usize);
    Ok(ids)
}

/// The ifindex a tcx or XDP link is attached to (0 once its device is gone):
/// both keep it first in their part of struct bpf_link_info.
pub fn netdev_link_ifindex(link: BorrowedFd<'_>) -> io::Result<u32> {
    let mut info = [0u64; 32];
    let mut attr = Attr::new();
    attr.put_u32(0, link.as_raw_fd() as u32);
    attr.put_u32(4, std::mem::size_of_val(&info) as u32);
    attr.put_u64(8, info.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok((info[2] & 0xffff_ffff) as u32)
}

/// Writes `values[i]` at `keys[i]` for any plain key and value types, in
/// order, in one syscall (BPF_MAP_UPDATE_BATCH, Linux 5.6): a Maglev table
/// of 16381 slots is one call, not 16381. The kernel updates element by element exactly as
/// single updates would (kernel/bpf/syscall.c, generic_map_update_batch),
/// so readers see the same sequence of states; only the syscalls are
/// saved. On failure: how many were written before it, and the error.
pub fn map_update_batch_of<K: Copy, V: Copy>(
    map: BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
) -> Result<(), (usize, io::Error)> {
    assert_eq!(keys.len(), values.len());
    if keys.is_empty() {
        return Ok(());
    }
    let mut attr = Attr::new();
    attr.put_u64(16, keys.as_ptr() as u64);
    attr.put_u64(24, values.as_ptr() as u64);
    attr.put_u32(32, keys.len() as u32); // count
    attr.put_u32(36, map.as_raw_fd() as u32); // map_fd
    let result = bpf(BPF_MAP_UPDATE_BATCH, &mut attr);
    let done = attr.get_u32(32) as usize;
    match result {
        Ok(_) if done == keys.len() => Ok(()),
        Ok(_) => Err((
            done,
            io::Error::other(format!(
                "batch update wrote {done} of {} entries",
                keys.len()
            )),
        )),
        Err(e) => Err((done.min(keys.len()), e)),
    }
}

/// How many keys a map holds, walked with BPF_MAP_GET_NEXT_KEY: works for
/// every map type with keys (hash, LRU hash, LPM trie, hash of maps)
/// without knowing the key's type, only its size. An LRU may change while
/// it is walked; the count is then of that moment, more or less one.
pub fn count_keys(map: BorrowedFd<'_>, key_size: usize) -> io::Result<usize> {
    let mut key = vec![0u8; key_size];
    let mut next = vec![0u8; key_size];
    let mut n = 0;
    loop {
        let mut attr = Attr::new();
        attr.put_u32(0, map.as_raw_fd() as u32); // map_fd
                                                 // key: NULL for the first one.
        attr.put_u64(8, if n == 0 { 0 } else { key.as_ptr() as u64 });
        attr.put_u64(16, next.as_mut_ptr() as u64); // next_key
        match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
            Ok(_) => {
                n += 1;
                std::mem::swap(&mut key, &mut next);
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(n),
            Err(e) => return Err(e),
        }
    }
}

/// Reads an array map whole (BPF_MAP_LOOKUP_BATCH); `V` is its value type
/// (u32, u64: plain integers, any bytes valid).
pub fn array_lookup_all<V: Copy + Default>(map: BorrowedFd<'_>, len: usize) -> io::Result<Vec<V>> {
    let mut keys = vec![0u32; len];
    let mut values = vec![V::default(); len];
    let mut out_batch = 0u32;
    let mut attr = Attr::new();
    attr.put_u64(8, (&mut out_batch as *mut u32) as u64); // out_batch
    attr.put_u64(16, keys.as_mut_ptr() as u64);
    attr.put_u64(24, values.as_mut_ptr() as u64);
    attr.put_u32(32, len as u32);
    attr.put_u32(36, map.as_raw_fd() as u32);
    match bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) {
        // ENOENT: the last batch (here: all of it) was read.
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => return Err(e),
    }
    let n = attr.get_u32(32) as usize;
    let mut out = vec![V::default(); len];
    for i in 0..n.min(len) {
        if let Some(slot) = out.get_mut(keys[i] as usize) {
            *slot = values[i];
        }
    }
    Ok(out)
}
