//! XDP program on the node's external devices: the same forwarding as tc
//! ingress before the stack allocates anything. What it cannot do alone
//! (insert the DSR option, resolve a neighbour, learn DSR on a backend's
//! node, answer or translate an ICMP error, a frame that does not fit the
//! path) it passes on untouched, and tc ingress does it (counted:
//! `xdp_punted_to_tc`).
//!
//! XDP sees frames as they came off the wire and rewrites their checksums
//! in place (RFC 1624). A frame from a veth peer whose checksum the sender
//! left to an offload (CHECKSUM_PARTIAL) carries only a partial sum, which
//! XDP cannot tell apart; forwarded by XDP_TX or a redirect it arrives with
//! a bad checksum. Physical NICs never hand XDP such frames.
use aya_ebpf::{
    bindings::{bpf_fib_lookup, xdp_action},
    helpers::{bpf_fib_lookup as fib, bpf_redirect},
    macros::xdp,
    programs::XdpContext,
    EbpfContext,
};
use lb_common::{config::CNT_XDP_PUNTED, event::HOOK_XDP};

use super::{access::Pkt, csum::manual_csum_l4, family::Ip, parse::Flow, Hook, Verdict};
use crate::runtime::bump;

struct Xdp<'a> {
    ctx: &'a XdpContext,
}

impl Pkt for Xdp<'_> {
    #[inline(always)]
    fn data(&self) -> usize {
        // SAFETY: the xdp_md of this run; read volatile so the verifier sees
        // the load it tracks as the packet start.
        unsafe { core::ptr::read_volatile(&(*self.ctx.ctx).data) as usize }
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        // SAFETY: as `data`: the packet end of this run.
        unsafe { core::ptr::read_volatile(&(*self.ctx.ctx).data_end) as usize }
    }
    /// Single-buffer XDP: the frame is all linear.
    #[inline(always)]
    fn covers(&self, len: usize) -> bool {
        self.data() + len <= self.data_end()
    }
    #[inline(always)]
    fn pull(&self, _len: usize) {}
}

impl Hook for Xdp<'_> {
    const IS_XDP: bool = true;

    #[inline(always)]
    fn ingress_ifindex(&self) -> u32 {
        self.ctx.ingress_ifindex() as u32
    }
    #[inline(always)]
    fn hook(&self) -> u8 {
        HOOK_XDP
    }
    #[inline(always)]
    fn is_from_pod(&self) -> bool {
        false
    }
    /// A frame is one packet on the wire.
    #[inline(always)]
    fn wire_len<I: Ip>(&self, f: &Flow<I>) -> u16 {
        f.tot_len
    }
    #[inline(always)]
    fn segments(&self, _payload: u32) -> u32 {
        1
    }
    #[inline(always)]
    fn change_tail(&self, _len: u32) -> bool {
        false
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
    fn push_outer_header(&self, _len: u32, _v6: bool) -> bool {
        false
    }
    #[inline(always)]
    fn pop_outer_header(&self, _len: u32, _v6: bool) -> bool {
        false
    }
    #[inline(always)]
    fn socket_holds<I: Ip>(&self, key: &lb_common::conntrack::CtKey<I::Addr>) -> bool {
        super::access::socket_holds::<I>(self.ctx.as_ptr(), key)
    }
    /// XDP sees only what arrives.
    #[inline(always)]
    fn sent_by_local_socket<I: Ip>(&self, _f: &Flow<I>) -> bool {
        false
    }
    #[inline(always)]
    fn fib_lookup(&self, p: &mut bpf_fib_lookup) -> i64 {
        // SAFETY: the context of this run and a parameter block we own, of
        // the size given.
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
    fn csum_complete_fixup(&self, _diff: u32) {}
    #[inline(always)]
    fn csum_l4_sums(
        &self,
        check_off: usize,
        pseudo: Option<u32>,
        plain: Option<u32>,
        udp: bool,
    ) -> bool {
        // No skb state: both kinds of change go into the field alike.
        manual_csum_l4(
            self,
            check_off,
            pseudo.unwrap_or(0) + plain.unwrap_or(0),
            udp,
        )
    }
}

#[xdp]
pub fn lb_xdp(ctx: XdpContext) -> u32 {
    match super::ingress(&Xdp { ctx: &ctx }).verdict() {
        Verdict::Pass => xdp_action::XDP_PASS,
        Verdict::Punt => {
            bump(CNT_XDP_PUNTED);
            xdp_action::XDP_PASS
        }
        Verdict::Drop => xdp_action::XDP_DROP,
        // Out of the device it came in on: bounce it.
        // (The device read here, not up front: two dependent loads every
        // other packet would pay.)
        Verdict::Redirect(ifindex) if ifindex == ctx.ingress_ifindex() as u32 => xdp_action::XDP_TX,
        // SAFETY: a helper taking plain values.
        Verdict::Redirect(ifindex) => unsafe { bpf_redirect(ifindex, 0) as u32 },
        Verdict::RedirectNeigh(..) => {
            bump(CNT_XDP_PUNTED);
            xdp_action::XDP_PASS
        }
    }
}
