//! Network devices: index and IPv4 address by name (getifaddrs(3)).
use std::{ffi::CString, net::Ipv4Addr};

use anyhow::{bail, Context as _};

pub fn ifindex(name: &str) -> anyhow::Result<u32> {
    let c = CString::new(name).context("device name")?;
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        bail!("device {name:?} does not exist in this network namespace: check --devices");
    }
    Ok(i)
}

/// The first IPv4 address of a device.
pub fn ipv4_address(name: &str) -> anyhow::Result<Option<Ipv4Addr>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(std::io::Error::last_os_error()).context("getifaddrs");
    }
    let mut found = None;
    let mut cur = list;
    while !cur.is_null() {
        let ifa = unsafe { &*cur };
        let this = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy();
        if this == name
            && !ifa.ifa_addr.is_null()
            && unsafe { (*ifa.ifa_addr).sa_family } as i32 == libc::AF_INET
        {
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            found = Some(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            break;
        }
        cur = ifa.ifa_next;
    }
    unsafe { libc::freeifaddrs(list) };
    Ok(found)
}
