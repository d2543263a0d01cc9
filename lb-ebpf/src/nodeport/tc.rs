//! tc (tcx) programs on the node's external devices.
use aya_ebpf::{
    bindings::{
        bpf_adj_room_mode::BPF_ADJ_ROOM_NET, bpf_fib_lookup, bpf_redir_neigh, TC_ACT_OK,
        TC_ACT_SHOT,
    },
    helpers::{
        bpf_fib_lookup as fib, bpf_l3_csum_replace, bpf_l4_csum_replace, bpf_redirect,
        bpf_redirect_neigh,
    },
    macros::classifier,
    programs::TcContext,
    EbpfContext,
};
use lb_common::event::{HOOK_TC_EGRESS, HOOK_TC_INGRESS};

use super::{
    packet::{Pkt, ETH_HLEN, IP_CHECK},
    Action, NpContext,
};

const BPF_F_PSEUDO_HDR: u64 = 1 << 4;
const BPF_F_MARK_MANGLED_0: u64 = 1 << 5;

struct Tc<'a> {
    ctx: &'a TcContext,
    hook: u8,
}

impl Pkt for Tc<'_> {
    #[inline(always)]
    fn data(&self) -> usize {
        unsafe { core::ptr::read_volatile(&(*self.ctx.skb.skb).data) as usize }
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        unsafe { core::ptr::read_volatile(&(*self.ctx.skb.skb).data_end) as usize }
    }
    #[inline(always)]
    fn covers(&self, len: usize) -> bool {
        len as u32 <= self.ctx.len()
    }
}

/// Headers we read directly: Ethernet, an IPv4 header with the DSR option,
/// TCP. Packets from local sockets or GRO can keep part of them in page
/// fragments; pull them into the linear area first.
const HEADERS: usize = 14 + 28 + 20;

#[inline(always)]
fn pull_headers(ctx: &TcContext) {
    let t = Tc { ctx, hook: 0 };
    if t.data() + HEADERS > t.data_end() {
        let want = if ctx.len() < HEADERS as u32 {
            ctx.len()
        } else {
            HEADERS as u32
        };
        let _ = ctx.pull_data(want);
    }
}

impl NpContext for Tc<'_> {
    const CAN_INSERT_OPTIONS: bool = true;
    const CAN_RESOLVE_NEIGH: bool = true;

    #[inline(always)]
    fn ingress_ifindex(&self) -> u32 {
        unsafe { (*self.ctx.skb.skb).ingress_ifindex }
    }
    #[inline(always)]
    fn hook(&self) -> u8 {
        self.hook
    }
    #[inline(always)]
    fn grow_ip_options(&self, len: u32) -> bool {
        self.ctx
            .adjust_room(len as i32, BPF_ADJ_ROOM_NET, 0)
            .is_ok()
    }
    #[inline(always)]
    fn shrink_ip_options(&self, len: u32) -> bool {
        self.ctx
            .adjust_room(-(len as i32), BPF_ADJ_ROOM_NET, 0)
            .is_ok()
    }
    #[inline(always)]
    fn fib_lookup(&self, p: &mut bpf_fib_lookup) -> i64 {
        unsafe {
            fib(
                self.ctx.as_ptr(),
                p,
                core::mem::size_of::<bpf_fib_lookup>() as i32,
                0,
            )
        }
    }
    /// The kernel helpers keep skb->csum (CHECKSUM_COMPLETE) in step and, for
    /// CHECKSUM_PARTIAL packets (from a local socket, over veth), change only
    /// what the offload will not recompute.
    #[inline(always)]
    fn csum_l3(&self, old: u32, new: u32) -> bool {
        unsafe {
            bpf_l3_csum_replace(
                self.ctx.as_ptr().cast(),
                (ETH_HLEN + IP_CHECK) as u32,
                old as u64,
                new as u64,
                4,
            ) == 0
        }
    }
    #[inline(always)]
    fn csum_l4(
        &self,
        check_off: usize,
        old: u32,
        new: u32,
        size: u64,
        pseudo: bool,
        udp: bool,
    ) -> bool {
        let mut flags = size;
        if pseudo {
            flags |= BPF_F_PSEUDO_HDR;
        }
        if udp {
            flags |= BPF_F_MARK_MANGLED_0;
        }
        unsafe {
            bpf_l4_csum_replace(
                self.ctx.as_ptr().cast(),
                check_off as u32,
                old as u64,
                new as u64,
                flags,
            ) == 0
        }
    }
}

#[inline(always)]
fn verdict(a: Action) -> i32 {
    match a {
        Action::Pass | Action::Punt => TC_ACT_OK,
        Action::Drop => TC_ACT_SHOT,
        Action::Redirect(ifindex) => unsafe { bpf_redirect(ifindex, 0) as i32 },
        Action::RedirectNeigh(ifindex, nexthop) => {
            let mut nh: bpf_redir_neigh = unsafe { core::mem::zeroed() };
            nh.nh_family = 2; // AF_INET
            nh.__bindgen_anon_1.ipv4_nh = nexthop;
            unsafe {
                bpf_redirect_neigh(
                    ifindex,
                    &mut nh,
                    core::mem::size_of::<bpf_redir_neigh>() as i32,
                    0,
                ) as i32
            }
        }
    }
}

#[classifier]
pub fn lb_tc_ingress(ctx: TcContext) -> i32 {
    pull_headers(&ctx);
    verdict(super::ingress(&Tc {
        ctx: &ctx,
        hook: HOOK_TC_INGRESS,
    }))
}

#[classifier]
pub fn lb_tc_egress(ctx: TcContext) -> i32 {
    pull_headers(&ctx);
    verdict(super::egress(&Tc {
        ctx: &ctx,
        hook: HOOK_TC_EGRESS,
    }))
}
