//! Unconnected UDP: one backend per socket and frontend.
//!
//! sendmsg4/6 run for every datagram sent with an address. Choosing afresh
//! each time sends a QUIC connection's or a multi-datagram query's packets
//! to different backends. The choice is kept in the socket's own storage
//! (BPF_MAP_TYPE_SK_STORAGE: it lives and dies with the socket, no global
//! table to fill or evict), a few frontends per socket, and made again when
//! the backend is no longer at the slot it was chosen from (removed, or the
//! slots were replanned). Cilium reaches per-socket stickiness by hashing
//! the socket cookie into the slots, which moves when the backend count
//! changes; a stored choice does not.
use aya_ebpf::{btf_maps::SkStorage, macros::btf_map, programs::SockAddrContext};
use lb_common::Addr6;
use lb_common::{
    service::ServiceValue,
    sock::{UdpChoice, UdpChoices, UDP_CHOICES as CHOICES},
};

use crate::select::{self, ServiceFamily};

#[btf_map]
pub static LB_SOCK_UDP: SkStorage<UdpChoices> = SkStorage::new();

/// The backend this socket already uses for the frontend `address:port`,
/// while it is still at its slot of `key`; else a new choice, stored.
#[inline(always)]
pub fn choose<F: ServiceFamily>(
    ctx: &SockAddrContext,
    address: Addr6,
    port: u16,
    key: &F::Key,
    svc: &ServiceValue,
) -> Result<(u32, F::Backend), lb_common::drop::DropReason> {
    // SAFETY: the context's socket; the storage is created zeroed.
    let choices = unsafe { LB_SOCK_UDP.get_or_insert_ptr_mut(ctx, None) };
    if choices.is_null() {
        return select::select_backend::<F>(key, svc);
    }
    // SAFETY: the storage of this socket, valid for the program's run.
    let choices = unsafe { &mut *choices };
    let mut i = 0;
    while i < CHOICES {
        let c = choices.entries[i];
        if c.used != 0 && c.port == port && c.address == address {
            let count = u32::from(svc.count) + u32::from(svc.terminating_count);
            if u32::from(c.slot) <= count {
                if let Ok((id, b)) = select::backend_at::<F>(key, c.slot) {
                    if id == c.backend_id {
                        return Ok((id, b));
                    }
                }
            }
            // Gone from its slot: choose again, in the same entry.
            return store::<F>(choices, i, address, port, key, svc);
        }
        i += 1;
    }
    let i = (choices.next as usize) % CHOICES;
    choices.next = choices.next.wrapping_add(1);
    store::<F>(choices, i, address, port, key, svc)
}

#[inline(always)]
fn store<F: ServiceFamily>(
    choices: &mut UdpChoices,
    i: usize,
    address: Addr6,
    port: u16,
    key: &F::Key,
    svc: &ServiceValue,
) -> Result<(u32, F::Backend), lb_common::drop::DropReason> {
    let slot = select::select_slot(svc);
    let (id, b) = select::backend_at::<F>(key, slot)?;
    if i < CHOICES {
        choices.entries[i] = UdpChoice {
            address,
            port,
            slot,
            backend_id: id,
            used: 1,
        };
    }
    Ok((id, b))
}
