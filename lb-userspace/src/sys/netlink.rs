//! rtnetlink, just what finding pod-facing devices and checking a veth
//! for native XDP need: a dump of the links (index, name, kind, a veth's
//! peer, XDP attached), one link of another namespace by its id, and a
//! socket that hears links appear and go (RTMGRP_LINK), and one that hears
//! addresses change (RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR). Layouts from include/uapi/linux/rtnetlink.h and
//! if_link.h. Written here rather than pulling in the rtnetlink crate's
//! async stack for two messages.
use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const NLMSG_DONE: u16 = 3;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const RTMGRP_LINK: u32 = 1;
/// Address changes of either family (rtnetlink.h: RTMGRP_IPV4_IFADDR,
/// RTMGRP_IPV6_IFADDR).
const RTMGRP_IFADDR: u32 = 0x10 | 0x100;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINK: u16 = 5;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_LINK_NETNSID: u16 = 37;
const IFLA_XDP: u16 = 43;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_DRV_PROG_ID: u16 = 5;
const IFLA_TARGET_NETNSID: u16 = 46;
/// `IFLA_XDP_ATTACHED` values (if_link.h): one program in driver mode, or
/// several (then `IFLA_XDP_DRV_PROG_ID` says whether one is in driver mode).
const XDP_ATTACHED_DRV: u8 = 1;
const XDP_ATTACHED_MULTI: u8 = 4;
const NLMSG_HDRLEN: usize = 16;
const IFINFO_LEN: usize = 16;

/// A network device as rtnetlink reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub ifindex: u32,
    pub name: String,
    /// IFLA_INFO_KIND: "veth", "bridge", ... (empty for a physical device).
    pub kind: String,
    /// IFLA_LINK: a veth's peer (its ifindex, in `peer_netnsid`'s namespace).
    pub peer: Option<u32>,
    /// IFLA_LINK_NETNSID: the namespace of the peer, as this namespace
    /// numbers it; `None` when the peer is in this namespace.
    pub peer_netnsid: Option<i32>,
    /// A driver-mode XDP program is attached (IFLA_XDP).
    pub xdp_driver: bool,
}

/// A change of the device list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkEvent {
    New(Link),
    Gone(Link),
}

fn socket(groups: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned from here on.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a zeroed sockaddr_nl is valid; we set family and groups.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    addr.nl_groups = groups;
    // SAFETY: addr lives across the call, its size is passed.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

fn recv(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for its length.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_ne_bytes([b[off], b[off + 1]])
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(b[off..off + 4].try_into().unwrap())
}

/// Walks rtattrs in `b`, calling `f(type, payload)`.
fn attrs(b: &[u8], mut f: impl FnMut(u16, &[u8])) {
    let mut off = 0;
    while off + 4 <= b.len() {
        let len = u16_at(b, off) as usize;
        if len < 4 || off + len > b.len() {
            break;
        }
        f(u16_at(b, off + 2) & 0x3fff, &b[off + 4..off + len]);
        off += (len + 3) & !3;
    }
}

fn c_string(b: &[u8]) -> String {
    String::from_utf8_lossy(b.split(|c| *c == 0).next().unwrap_or(&[])).into_owned()
}

/// The link in one RTM_NEWLINK / RTM_DELLINK message body.
fn parse_link(body: &[u8]) -> Option<Link> {
    if body.len() < IFINFO_LEN {
        return None;
    }
    let ifindex = u32_at(body, 4);
    let mut link = Link {
        ifindex,
        name: String::new(),
        kind: String::new(),
        peer: None,
        peer_netnsid: None,
        xdp_driver: false,
    };
    attrs(&body[IFINFO_LEN..], |ty, payload| match ty {
        IFLA_IFNAME => link.name = c_string(payload),
        IFLA_LINK if payload.len() >= 4 => link.peer = Some(u32_at(payload, 0)),
        IFLA_LINK_NETNSID if payload.len() >= 4 => {
            link.peer_netnsid = Some(i32::from_ne_bytes(payload[..4].try_into().unwrap()));
        }
        IFLA_XDP => {
            let (mut attached, mut drv_id) = (0u8, 0u32);
            attrs(payload, |ty, p| match ty {
                IFLA_XDP_ATTACHED if !p.is_empty() => attached = p[0],
                IFLA_XDP_DRV_PROG_ID if p.len() >= 4 => drv_id = u32_at(p, 0),
                _ => {}
            });
            link.xdp_driver =
                attached == XDP_ATTACHED_DRV || (attached == XDP_ATTACHED_MULTI && drv_id != 0);
        }
        IFLA_LINKINFO => attrs(payload, |ty, p| {
            if ty == IFLA_INFO_KIND {
                link.kind = c_string(p);
            }
        }),
        _ => {}
    });
    (!link.name.is_empty()).then_some(link)
}

/// Calls `f` for each link message in a datagram; false at the end of a dump.
fn messages(b: &[u8], mut f: impl FnMut(u16, Link)) -> io::Result<bool> {
    let mut off = 0;
    while off + NLMSG_HDRLEN <= b.len() {
        let len = u32_at(b, off) as usize;
        let ty = u16_at(b, off + 4);
        if len < NLMSG_HDRLEN || off + len > b.len() {
            break;
        }
        match ty {
            NLMSG_DONE => return Ok(false),
            NLMSG_ERROR => {
                if len < NLMSG_HDRLEN + 4 {
                    return Err(io::Error::other("truncated netlink error message"));
                }
                let code = i32::from_ne_bytes(b[off + 16..off + 20].try_into().unwrap());
                if code != 0 {
                    return Err(io::Error::from_raw_os_error(-code));
                }
            }
            RTM_NEWLINK | RTM_DELLINK => {
                if let Some(l) = parse_link(&b[off + NLMSG_HDRLEN..off + len]) {
                    f(ty, l);
                }
            }
            _ => {}
        }
        off += (len + 3) & !3;
    }
    Ok(true)
}

/// Every link of the caller's network namespace.
pub fn links() -> io::Result<Vec<Link>> {
    let fd = socket(0)?;
    let mut req = [0u8; NLMSG_HDRLEN + IFINFO_LEN];
    let len = req.len() as u32;
    req[0..4].copy_from_slice(&len.to_ne_bytes());
    req[4..6].copy_from_slice(&RTM_GETLINK.to_ne_bytes());
    req[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    req[NLMSG_HDRLEN] = libc::AF_UNSPEC as u8;
    // SAFETY: req is valid for its length.
    let n = unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = recv(&fd, &mut buf)?;
        if !messages(&buf[..n], |_, l| out.push(l))? {
            return Ok(out);
        }
    }
}

/// One link: `ifindex` in the namespace this one numbers `netnsid`
/// (`None`: this namespace), as a veth's `peer` and `peer_netnsid` name it.
/// Needs CAP_NET_ADMIN over that namespace.
pub fn link_in(ifindex: u32, netnsid: Option<i32>) -> io::Result<Link> {
    let fd = socket(0)?;
    let attr_len = if netnsid.is_some() { 8 } else { 0 };
    let mut req = vec![0u8; NLMSG_HDRLEN + IFINFO_LEN + attr_len];
    let len = req.len() as u32;
    req[0..4].copy_from_slice(&len.to_ne_bytes());
    req[4..6].copy_from_slice(&RTM_GETLINK.to_ne_bytes());
    req[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    req[NLMSG_HDRLEN] = libc::AF_UNSPEC as u8;
    req[NLMSG_HDRLEN + 4..NLMSG_HDRLEN + 8].copy_from_slice(&ifindex.to_ne_bytes());
    if let Some(id) = netnsid {
        let at = NLMSG_HDRLEN + IFINFO_LEN;
        req[at..at + 2].copy_from_slice(&8u16.to_ne_bytes());
        req[at + 2..at + 4].copy_from_slice(&IFLA_TARGET_NETNSID.to_ne_bytes());
        req[at + 4..at + 8].copy_from_slice(&id.to_ne_bytes());
    }
    // SAFETY: req is valid for its length.
    let n = unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 64 * 1024];
    let n = recv(&fd, &mut buf)?;
    let mut found = None;
    messages(&buf[..n], |_, l| found = Some(l))?;
    found.ok_or_else(|| io::Error::from_raw_os_error(libc::ENODEV))
}

/// A socket that hears links appear and go.
pub struct LinkWatch {
    fd: OwnedFd,
    buf: Vec<u8>,
}

impl LinkWatch {
    pub fn open() -> io::Result<Self> {
        Ok(Self {
            fd: socket(RTMGRP_LINK)?,
            buf: vec![0u8; 64 * 1024],
        })
    }

    /// Blocks until the next batch of changes.
    pub fn next_events(&mut self) -> io::Result<Vec<LinkEvent>> {
        let n = recv(&self.fd, &mut self.buf)?;
        let mut out = Vec::new();
        messages(&self.buf[..n], |ty, l| {
            out.push(if ty == RTM_NEWLINK {
                LinkEvent::New(l)
            } else {
                LinkEvent::Gone(l)
            });
        })?;
        Ok(out)
    }
}

/// A socket that hears addresses come and go on any device of this
/// namespace (RTM_NEWADDR, RTM_DELADDR). It says only that something
/// changed: the reader reads the addresses again (getifaddrs), which a
/// missed or coalesced message cannot then get wrong.
pub struct AddressWatch {
    fd: OwnedFd,
    buf: Vec<u8>,
}

impl AddressWatch {
    pub fn open() -> io::Result<Self> {
        Ok(Self {
            fd: socket(RTMGRP_IFADDR)?,
            buf: vec![0u8; 64 * 1024],
        })
    }

    /// Waits up to `timeout` for an address change, then drains what else
    /// is queued: true when something changed. An overrun socket (ENOBUFS:
    /// changes were lost) counts as a change, so the caller reads every
    /// address again.
    pub fn wait(&mut self, timeout: std::time::Duration) -> io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd for the call.
        match unsafe { libc::poll(&mut pfd, 1, ms) } {
            0 => return Ok(false),
            n if n < 0 => {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::Interrupted => Ok(false),
                    _ => Err(e),
                };
            }
            _ => {}
        }
        loop {
            match recv(&self.fd, &mut self.buf) {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        loop {
            // SAFETY: buf is valid for its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n <= 0 {
                return Ok(true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_link_is_read_as_the_dump_has_it() {
        let lo = link_in(1, None).unwrap();
        assert_eq!(
            (lo.name.as_str(), lo.peer, lo.xdp_driver),
            ("lo", None, false)
        );
        assert_eq!(
            link_in(0x7fff_fff0, None).unwrap_err().raw_os_error(),
            Some(libc::ENODEV)
        );
    }

    #[test]
    fn the_dump_lists_loopback() {
        let all = links().unwrap();
        assert!(
            all.iter().any(|l| l.name == "lo" && l.ifindex == 1),
            "{all:?}"
        );
    }
}
