//! Finding and destroying sockets through NETLINK_SOCK_DIAG: a dump of a
//! namespace's UDP sockets (SOCK_DIAG_BY_FAMILY) and SOCK_DESTROY of one of
//! them (Linux 4.5, CONFIG_INET_DIAG_DESTROY). A destroyed UDP socket is
//! disconnected with ECONNABORTED pending (net/ipv4/udp.c, udp_abort), which is what
//! makes a resolver that connected its socket to a vanished backend open a
//! new one. Layouts: include/uapi/linux/{netlink,sock_diag,inet_diag}.h.
//!
//! Two fixed-size request messages and one fixed-size reply: written here
//! rather than pulling in a netlink stack for them.
use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

const NETLINK_SOCK_DIAG: libc::c_int = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
const NLM_F_REQUEST: u16 = 0x01;
const NLM_F_ACK: u16 = 0x04;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// sizeof(struct nlmsghdr), sizeof(struct inet_diag_req_v2), sizeof(struct inet_diag_msg).
const NLMSG_HDR: usize = 16;
const REQ_V2: usize = 56;
const DIAG_MSG: usize = 72;

/// One socket as sock_diag names it (struct inet_diag_sockid, plus family).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SockId {
    pub family: u8,
    pub src: IpAddr,
    pub sport: u16,
    pub dst: IpAddr,
    pub dport: u16,
    pub ifindex: u32,
    pub cookie: u64,
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes no pointers.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket() and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn addr_bytes(a: &IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(v4) => {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&v4.octets());
            b
        }
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// nlmsghdr + inet_diag_req_v2 for UDP sockets of `family` in any state.
fn request(kind: u16, flags: u16, family: u8, id: Option<&SockId>) -> Vec<u8> {
    let mut m = vec![0u8; NLMSG_HDR + REQ_V2];
    m[0..4].copy_from_slice(&((NLMSG_HDR + REQ_V2) as u32).to_ne_bytes());
    m[4..6].copy_from_slice(&kind.to_ne_bytes());
    m[6..8].copy_from_slice(&flags.to_ne_bytes());
    let r = NLMSG_HDR;
    m[r] = family;
    m[r + 1] = libc::IPPROTO_UDP as u8;
    m[r + 4..r + 8].copy_from_slice(&u32::MAX.to_ne_bytes()); // idiag_states: all
    if let Some(id) = id {
        let s = r + 8; // struct inet_diag_sockid
        m[s..s + 2].copy_from_slice(&id.sport.to_be_bytes());
        m[s + 2..s + 4].copy_from_slice(&id.dport.to_be_bytes());
        m[s + 4..s + 20].copy_from_slice(&addr_bytes(&id.src));
        m[s + 20..s + 36].copy_from_slice(&addr_bytes(&id.dst));
        m[s + 36..s + 40].copy_from_slice(&id.ifindex.to_ne_bytes());
        m[s + 40..s + 48].copy_from_slice(&id.cookie.to_ne_bytes());
    }
    m
}

fn send(fd: &OwnedFd, msg: &[u8]) -> io::Result<()> {
    // SAFETY: `msg` is valid for reads of msg.len() bytes; `fd` is open.
    let n = unsafe { libc::send(fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn addr_from(family: u8, b: &[u8]) -> IpAddr {
    if family == libc::AF_INET as u8 {
        IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&b[..16]).unwrap()))
    }
}

/// Every UDP socket of `family` (AF_INET or AF_INET6) in the calling
/// thread's network namespace.
pub fn udp_sockets(family: u8) -> io::Result<Vec<SockId>> {
    let fd = socket()?;
    send(
        &fd,
        &request(
            SOCK_DIAG_BY_FAMILY,
            NLM_F_REQUEST | NLM_F_DUMP,
            family,
            None,
        ),
    )?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: `buf` is valid for writes of buf.len() bytes; `fd` is open.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut off = 0usize;
        let n = n as usize;
        while off + NLMSG_HDR <= n {
            let len = u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap()) as usize;
            let kind = u16::from_ne_bytes(buf[off + 4..off + 6].try_into().unwrap());
            if len < NLMSG_HDR || off + len > n {
                return Err(io::Error::other("sock_diag: truncated netlink message"));
            }
            match kind {
                NLMSG_DONE => return Ok(out),
                NLMSG_ERROR => {
                    let errno = i32::from_ne_bytes(buf[off + 16..off + 20].try_into().unwrap());
                    return Err(io::Error::from_raw_os_error(-errno));
                }
                SOCK_DIAG_BY_FAMILY if len >= NLMSG_HDR + DIAG_MSG => {
                    let m = &buf[off + NLMSG_HDR..off + len];
                    let fam = m[0];
                    let s = &m[4..52]; // struct inet_diag_sockid
                    out.push(SockId {
                        family: fam,
                        sport: u16::from_be_bytes([s[0], s[1]]),
                        dport: u16::from_be_bytes([s[2], s[3]]),
                        src: addr_from(fam, &s[4..20]),
                        dst: addr_from(fam, &s[20..36]),
                        ifindex: u32::from_ne_bytes(s[36..40].try_into().unwrap()),
                        cookie: u64::from_ne_bytes(s[40..48].try_into().unwrap()),
                    });
                }
                _ => {}
            }
            // NLMSG_ALIGN(len)
            off += (len + 3) & !3;
        }
    }
}

/// Destroys one socket; ENOENT when it is already gone.
pub fn destroy(id: &SockId) -> io::Result<()> {
    let fd = socket()?;
    send(
        &fd,
        &request(SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, id.family, Some(id)),
    )?;
    let mut buf = [0u8; 512];
    // SAFETY: `buf` is valid for writes of buf.len() bytes; `fd` is open.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if (n as usize) >= NLMSG_HDR + 4 && u16::from_ne_bytes([buf[4], buf[5]]) == NLMSG_ERROR {
        let errno = i32::from_ne_bytes(buf[16..20].try_into().unwrap());
        if errno != 0 {
            return Err(io::Error::from_raw_os_error(-errno));
        }
    }
    Ok(())
}
