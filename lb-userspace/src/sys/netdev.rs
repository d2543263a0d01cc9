//! Network devices: index and IPv4/IPv6 address by name (getifaddrs(3)).
use std::{
    ffi::CString,
    net::{Ipv4Addr, Ipv6Addr},
};

use anyhow::{bail, Context as _};

pub fn ifindex(name: &str) -> anyhow::Result<u32> {
    let c = CString::new(name).context("device name")?;
    // SAFETY: a NUL-terminated string that outlives the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        bail!("device {name:?} does not exist in this network namespace: check --devices");
    }
    Ok(i)
}

/// The first IPv4 address of a device.
pub fn ipv4_address(name: &str) -> anyhow::Result<Option<Ipv4Addr>> {
    Ok(all_addresses()?.into_iter().find_map(|(dev, a)| match a {
        std::net::IpAddr::V4(v4) if dev == name => Some(v4),
        _ => None,
    }))
}

/// The first global IPv6 address of a device: not link-local (fe80::/10),
/// loopback or unspecified. A link-local address cannot be the source of a
/// packet routed beyond the link (RFC 4291 §2.5.6), so it never serves as
/// a SNAT or NodePort address.
pub fn ipv6_address(name: &str) -> anyhow::Result<Option<Ipv6Addr>> {
    Ok(all_addresses()?.into_iter().find_map(|(dev, a)| match a {
        std::net::IpAddr::V6(v6) if dev == name && is_global_v6(&v6) => Some(v6),
        _ => None,
    }))
}

pub fn is_global_v6(a: &Ipv6Addr) -> bool {
    !(a.is_loopback() || a.is_unspecified() || a.is_unicast_link_local() || a.is_multicast())
}

/// Every address of every device of the caller's network namespace
/// (getifaddrs(3)): (device, address).
pub fn all_addresses() -> anyhow::Result<Vec<(String, std::net::IpAddr)>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list`, freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(std::io::Error::last_os_error()).context("getifaddrs");
    }
    let mut out = Vec::new();
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        // SAFETY: ifa_name is a NUL-terminated string of the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy();
        // glibc names an IPv4 address by its label (IFA_LABEL), "eth0:vip"
        // for `ip addr add ... label eth0:vip`; a device name never holds a
        // ':' (dev_valid_name, net/core/dev.c), so what precedes it is the
        // device.
        let name = name.split(':').next().unwrap_or_default().to_string();
        if !ifa.ifa_addr.is_null() {
            // SAFETY: the family says which sockaddr it is.
            let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
            if family == libc::AF_INET {
                // SAFETY: AF_INET: the address is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                out.push((
                    name,
                    Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)).into(),
                ));
            } else if family == libc::AF_INET6 {
                // SAFETY: AF_INET6: the address is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                out.push((
                    name,
                    std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr).into(),
                ));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(list) };
    Ok(out)
}

/// The devices of the default routes (IPv4 and IPv6) of the caller's
/// namespace, from /proc/net/route and /proc/net/ipv6_route.
pub fn default_route_devices() -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(t) = std::fs::read_to_string("/proc/net/route") {
        // Iface Destination Gateway ...; a default route has destination 0
        // and mask 0.
        for l in t.lines().skip(1) {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() > 7
                && f[1] == "00000000"
                && f[7] == "00000000"
                && !out.contains(&f[0].to_string())
            {
                out.push(f[0].to_string());
            }
        }
    }
    if let Ok(t) = std::fs::read_to_string("/proc/net/ipv6_route") {
        // dest(32 hex) plen src srcplen nexthop metric refcnt use flags dev
        for l in t.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() >= 10
                && f[0] == "00000000000000000000000000000000"
                && f[1] == "00"
                && f[9] != "lo"
                && !out.contains(&f[9].to_string())
            {
                out.push(f[9].to_string());
            }
        }
    }
    out
}

/// The devices that carry this node's external traffic when none are
/// given, as Cilium detects them: the devices of the default routes and
/// the ones holding the Node's InternalIP addresses (`internal`). Loopback
/// and devices that cannot carry the programs are never chosen.
pub fn detect_external_devices(internal: &[std::net::IpAddr]) -> anyhow::Result<Vec<String>> {
    let mut out = default_route_devices();
    for (dev, addr) in all_addresses()? {
        if internal.contains(&addr) && !out.contains(&dev) {
            out.push(dev);
        }
    }
    out.retain(|d| d != "lo");
    Ok(out)
}
