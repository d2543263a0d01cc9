//! IPv4 service lookup and backend selection, independent of the hook that
//! asks (socket hooks today, tc/XDP later).
use aya_ebpf::helpers::bpf_get_prandom_u32;
use lb_common::{
    backend::Backend4,
    drop::DropReason,
    service::{Service4Key, ServiceValue, SCOPE_ALL, SVC_FLAG_VIP_MARKER},
};

use crate::maps::{LB4_BACKENDS, LB4_SERVICES};

/// What a frontend lookup found.
pub enum Lookup {
    /// Not a service address: leave the traffic alone.
    NotService,
    /// A service frontend with its master entry.
    Service(ServiceValue),
    /// A known service address on a port it does not expose.
    UnknownPort,
}

#[inline(always)]
pub fn lookup_service(key: &Service4Key) -> Lookup {
    // Copy the value out at once: the element may be replaced while we run.
    if let Some(svc) = unsafe { LB4_SERVICES.get(key) } {
        return Lookup::Service(*svc);
    }
    let marker = Service4Key::new(key.address, 0, 0, SCOPE_ALL, 0);
    match unsafe { LB4_SERVICES.get(&marker) } {
        Some(m) if m.flags & SVC_FLAG_VIP_MARKER != 0 => Lookup::UnknownPort,
        _ => Lookup::NotService,
    }
}

/// Picks a backend uniformly at random among the active backends, or among
/// the terminating ones when none is active (KEP-1669).
#[inline(always)]
pub fn select_backend(key: &Service4Key, svc: &ServiceValue) -> Result<(u32, Backend4), DropReason> {
    let n = if svc.count > 0 { svc.count } else { svc.terminating_count };
    if n == 0 {
        return Err(DropReason::NoBackend);
    }
    // Slots count+1.. hold the terminating backends; with count == 0 they start at 1.
    let slot = 1 + (unsafe { bpf_get_prandom_u32() } % n as u32) as u16;
    let slot_entry = match unsafe { LB4_SERVICES.get(&key.with_slot(slot)) } {
        Some(v) => v.backend_id,
        None => return Err(DropReason::BackendMissing),
    };
    match unsafe { LB4_BACKENDS.get(&slot_entry) } {
        Some(b) => Ok((slot_entry, *b)),
        None => Err(DropReason::BackendMissing),
    }
}
