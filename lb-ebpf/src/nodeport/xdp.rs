//! XDP program on the node's external devices: the same forwarding as tc
//! ingress before the stack allocates anything. What it cannot do alone
//! (insert the DSR option, resolve a neighbour, learn DSR on a backend's
//! node) it passes on untouched, and tc ingress does it.
use aya_ebpf::{
    bindings::{bpf_fib_lookup, xdp_action},
    helpers::{bpf_fib_lookup as fib, bpf_redirect},
    macros::xdp,
    programs::XdpContext,
    EbpfContext,
};
use lb_common::event::HOOK_XDP;

use super::{manual_csum_l3, manual_csum_l4, packet::Pkt, Action, NpContext};

struct Xdp<'a> {
    ctx: &'a XdpContext,
}

impl Pkt for Xdp<'_> {
    #[inline(always)]
    fn data(&self) -> usize {
        unsafe { core::ptr::read_volatile(&(*self.ctx.ctx).data) as usize }
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        unsafe { core::ptr::read_volatile(&(*self.ctx.ctx).data_end) as usize }
    }
    /// Single-buffer XDP: the frame is all linear.
    #[inline(always)]
    fn covers(&self, len: usize) -> bool {
        self.data() + len <= self.data_end()
    }
}

impl NpContext for Xdp<'_> {
    const CAN_INSERT_OPTIONS: bool = false;
    const CAN_RESOLVE_NEIGH: bool = false;

    #[inline(always)]
    fn ingress_ifindex(&self) -> u32 {
        self.ctx.ingress_ifindex() as u32
    }
    #[inline(always)]
    fn hook(&self) -> u8 {
        HOOK_XDP
    }
    #[inline(always)]
    fn grow_ip_options(&self, _len: u32) -> bool {
        false
    }
    #[inline(always)]
    fn shrink_ip_options(&self, _len: u32) -> bool {
        false
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
    #[inline(always)]
    fn csum_l3(&self, old: u32, new: u32) -> bool {
        manual_csum_l3(self, old, new)
    }
    #[inline(always)]
    fn csum_l4(
        &self,
        check_off: usize,
        old: u32,
        new: u32,
        size: u64,
        _pseudo: bool,
        udp: bool,
    ) -> bool {
        manual_csum_l4(self, check_off, old, new, size, udp)
    }
}

#[xdp]
pub fn lb_xdp(ctx: XdpContext) -> u32 {
    let ingress = ctx.ingress_ifindex() as u32;
    match super::ingress(&Xdp { ctx: &ctx }) {
        Action::Pass | Action::Punt => xdp_action::XDP_PASS,
        Action::Drop => xdp_action::XDP_DROP,
        // Out of the device it came in on: bounce it.
        Action::Redirect(ifindex) if ifindex == ingress => xdp_action::XDP_TX,
        Action::Redirect(ifindex) => unsafe { bpf_redirect(ifindex, 0) as u32 },
        Action::RedirectNeigh(..) => xdp_action::XDP_PASS,
    }
}
