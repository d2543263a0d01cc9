//! Service lookup and backend selection, written once for both address
//! families and independent of the hook that asks (the socket hooks and the
//! tc/XDP programs).
use aya_ebpf::helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns};
use lb_common::{
    affinity::{AffinityKey, AffinityMatchKey, AffinityValue},
    backend::{Backend4, Backend6},
    drop::DropReason,
    service::{
        Service4Key, Service6Key, ServiceValue, SCOPE_ALL, SVC_FLAG_AFFINITY, SVC_FLAG_VIP_MARKER,
    },
};

use crate::maps::{
    LB4_BACKENDS, LB4_SERVICES, LB6_BACKENDS, LB6_SERVICES, LB_AFFINITY, LB_AFFINITY_GROUP,
    LB_AFFINITY_MATCH,
};

/// The maps of one address family.
pub trait ServiceFamily {
    type Key: Copy;
    type Backend: Copy;
    fn service(key: &Self::Key) -> Option<ServiceValue>;
    fn backend(id: u32) -> Option<Self::Backend>;
    fn slot_key(key: &Self::Key, slot: u16) -> Self::Key;
    /// The address-only entry that marks a known service address.
    fn marker_key(key: &Self::Key) -> Self::Key;
}

pub struct V4;
pub struct V6;

// Values are copied out at once: the element may be replaced while we run.
impl ServiceFamily for V4 {
    type Key = Service4Key;
    type Backend = Backend4;
    #[inline(always)]
    fn service(key: &Service4Key) -> Option<ServiceValue> {
        // SAFETY: a lookup in our own map, the value copied out at once.
        unsafe { LB4_SERVICES.get(key) }.copied()
    }
    #[inline(always)]
    fn backend(id: u32) -> Option<Backend4> {
        // SAFETY: a lookup in our own map, the value copied out at once.
        unsafe { LB4_BACKENDS.get(&id) }.copied()
    }
    #[inline(always)]
    fn slot_key(key: &Service4Key, slot: u16) -> Service4Key {
        key.with_slot(slot)
    }
    #[inline(always)]
    fn marker_key(key: &Service4Key) -> Service4Key {
        Service4Key::new(key.address, 0, 0, SCOPE_ALL, 0)
    }
}

impl ServiceFamily for V6 {
    type Key = Service6Key;
    type Backend = Backend6;
    #[inline(always)]
    fn service(key: &Service6Key) -> Option<ServiceValue> {
        // SAFETY: a lookup in our own map, the value copied out at once.
        unsafe { LB6_SERVICES.get(key) }.copied()
    }
    #[inline(always)]
    fn backend(id: u32) -> Option<Backend6> {
        // SAFETY: a lookup in our own map, the value copied out at once.
        unsafe { LB6_BACKENDS.get(&id) }.copied()
    }
    #[inline(always)]
    fn slot_key(key: &Service6Key, slot: u16) -> Service6Key {
        key.with_slot(slot)
    }
    #[inline(always)]
    fn marker_key(key: &Service6Key) -> Service6Key {
        Service6Key::new(key.address, 0, 0, SCOPE_ALL, 0)
    }
}

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
pub fn lookup_service<F: ServiceFamily>(key: &F::Key) -> Lookup {
    if let Some(svc) = F::service(key) {
        return Lookup::Service(svc);
    }
    match F::service(&F::marker_key(key)) {
        Some(m) if m.flags & SVC_FLAG_VIP_MARKER != 0 => Lookup::UnknownPort,
        _ => Lookup::NotService,
    }
}

/// A slot drawn uniformly at random among the active backends, or among the
/// terminating ones when none is active (KEP-1669); 0 when there is none.
#[inline(always)]
pub fn select_slot(svc: &ServiceValue) -> u16 {
    let n = if svc.count > 0 {
        svc.count
    } else {
        svc.terminating_count
    };
    // A NonZero divisor leaves no panic path for the verifier to reject.
    let Some(n) = core::num::NonZeroU32::new(u32::from(n)) else {
        return 0;
    };
    // Slots count+1.. hold the terminating backends; with count == 0 they start at 1.
    // SAFETY: a helper without arguments.
    1 + (unsafe { bpf_get_prandom_u32() } % n) as u16
}

/// The backend at a slot of a frontend.
#[inline(always)]
pub fn backend_at<F: ServiceFamily>(
    key: &F::Key,
    slot: u16,
) -> Result<(u32, F::Backend), DropReason> {
    if slot == 0 {
        return Err(DropReason::NoBackend);
    }
    let backend_id = match F::service(&F::slot_key(key, slot)) {
        Some(v) => v.backend_id,
        None => return Err(DropReason::BackendMissing),
    };
    match F::backend(backend_id) {
        Some(b) => Ok((backend_id, b)),
        None => Err(DropReason::BackendMissing),
    }
}

/// Picks a backend uniformly at random among the active backends, or among
/// the terminating ones when none is active (KEP-1669).
#[inline(always)]
pub fn select_backend<F: ServiceFamily>(
    key: &F::Key,
    svc: &ServiceValue,
) -> Result<(u32, F::Backend), DropReason> {
    backend_at::<F>(key, select_slot(svc))
}

/// `select_backend`, but with sessionAffinity: ClientIP honoured for
/// services that ask for it: the client's last backend is reused while it is
/// still selectable for the service and the timeout has not run out since
/// its last use.
#[inline(always)]
pub fn select_backend_for<F: ServiceFamily>(
    key: &F::Key,
    svc: &ServiceValue,
    client: u64,
) -> Result<(u32, F::Backend), DropReason> {
    if svc.flags & SVC_FLAG_AFFINITY == 0 {
        return select_backend::<F>(key, svc);
    }
    if let Some(found) = remembered::<F>(svc, client) {
        return Ok(found);
    }
    let (id, backend) = select_backend::<F>(key, svc)?;
    remember(svc, client, id);
    Ok((id, backend))
}

/// The id a client's memory of its backend is kept under: shared by every
/// frontend of the service port (LB_AFFINITY_GROUP, as kube-proxy keeps one
/// per service port), the frontend's own id where the agent wrote none.
#[inline(always)]
fn affinity_group(svc: &ServiceValue) -> u32 {
    // SAFETY: a lookup in our own map, the value copied out at once.
    unsafe { LB_AFFINITY_GROUP.get(&svc.service_id) }
        .copied()
        .unwrap_or(svc.service_id)
}

/// sessionAffinity: the backend `client` last got from this service, while
/// it is still selectable for it (LB_AFFINITY_MATCH) and the timeout has not
/// run out since its last use (which this refreshes).
#[inline(always)]
pub fn remembered<F: ServiceFamily>(svc: &ServiceValue, client: u64) -> Option<(u32, F::Backend)> {
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let akey = AffinityKey {
        client,
        service_id: affinity_group(svc),
        pad: 0,
    };
    let entry = LB_AFFINITY.get_ptr_mut(&akey)?;
    // SAFETY: a value of our LRU map, valid for this program run.
    let entry = unsafe { &mut *entry };
    let fresh =
        now.saturating_sub(entry.last_used_ns) <= u64::from(svc.affinity_timeout_s) * 1_000_000_000;
    let member = AffinityMatchKey {
        service_id: svc.service_id,
        backend_id: entry.backend_id,
    };
    // SAFETY: a lookup in our own map; the value is not kept.
    if !fresh || unsafe { LB_AFFINITY_MATCH.get(&member) }.is_none() {
        return None;
    }
    let b = F::backend(entry.backend_id)?;
    entry.last_used_ns = now;
    Some((entry.backend_id, b))
}

/// sessionAffinity: `client` got `backend_id` from this service now.
#[inline(always)]
pub fn remember(svc: &ServiceValue, client: u64, backend_id: u32) {
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let akey = AffinityKey {
        client,
        service_id: affinity_group(svc),
        pad: 0,
    };
    let _ = LB_AFFINITY.insert(
        &akey,
        &AffinityValue {
            backend_id,
            pad: 0,
            last_used_ns: now,
        },
        0,
    );
}
