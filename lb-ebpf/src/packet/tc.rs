//! tc (tcx) programs on the node's external devices.
use crate::select::{V4, V6};
use aya_ebpf::{
    bindings::{
        bpf_adj_room_mode::{BPF_ADJ_ROOM_MAC, BPF_ADJ_ROOM_NET},
        bpf_fib_lookup, bpf_redir_neigh, BPF_F_ADJ_ROOM_DECAP_L3_IPV4,
        BPF_F_ADJ_ROOM_DECAP_L3_IPV6, BPF_F_ADJ_ROOM_ENCAP_L3_IPV4, BPF_F_ADJ_ROOM_ENCAP_L3_IPV6,
        TC_ACT_OK, TC_ACT_SHOT,
    },
    helpers::{
        bpf_csum_update, bpf_fib_lookup as fib, bpf_l4_csum_replace, bpf_redirect,
        bpf_redirect_neigh, bpf_skb_change_tail,
    },
    macros::classifier,
    programs::TcContext,
    EbpfContext,
};
use lb_common::event::{HOOK_TC_EGRESS, HOOK_TC_INGRESS, HOOK_TC_POD_EGRESS, HOOK_TC_POD_INGRESS};

use super::{access::Pkt, family::Ip, parse::Flow, Action, Hook, Verdict};

const BPF_F_PSEUDO_HDR: u64 = 1 << 4;
const BPF_F_MARK_MANGLED_0: u64 = 1 << 5;

struct Tc<'a> {
    ctx: &'a TcContext,
    hook: u8,
}

impl Pkt for Tc<'_> {
    #[inline(always)]
    fn data(&self) -> usize {
        // SAFETY: reading a field of the context the program was given.
        unsafe { core::ptr::read_volatile(&(*self.ctx.skb.skb).data) as usize }
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        // SAFETY: reading a field of the context the program was given.
        unsafe { core::ptr::read_volatile(&(*self.ctx.skb.skb).data_end) as usize }
    }
    #[inline(always)]
    fn covers(&self, len: usize) -> bool {
        len as u32 <= self.ctx.len()
    }
    #[inline(always)]
    fn pull(&self, len: usize) {
        // Compare with what the packet can give: a packet shorter than `len`
        // (a 54-byte TCP ACK) that is all linear already must not call the
        // helper, which costs a call on every such packet and, on a cloned
        // skb (TCP's transmit path clones), copies its head.
        let want = (len as u32).min(self.ctx.len());
        if self.data() + want as usize > self.data_end() {
            let _ = self.ctx.pull_data(want);
        }
    }
}

/// 802.1Q-tagged frames whose tag the device took off (skb->vlan_present)
/// belong to the VLAN device, which has its own programs if it serves.
#[inline(always)]
fn tagged(ctx: &TcContext) -> bool {
    // SAFETY: reading a field of the context the program was given.
    unsafe { (*ctx.skb.skb).vlan_present != 0 }
}

impl Hook for Tc<'_> {
    const IS_XDP: bool = false;

    #[inline(always)]
    fn ingress_ifindex(&self) -> u32 {
        // SAFETY: reading a field of the context the program was given.
        unsafe { (*self.ctx.skb.skb).ingress_ifindex }
    }
    #[inline(always)]
    fn hook(&self) -> u8 {
        self.hook
    }
    #[inline(always)]
    fn is_from_pod(&self) -> bool {
        self.hook == HOOK_TC_POD_INGRESS
    }
    /// A GRO/GSO skb goes out as segments of gso_size payload bytes each
    /// (net/core/gso.c, skb_gso_validate_network_len does the same sum).
    #[inline(always)]
    fn wire_len<I: Ip>(&self, f: &Flow<I>) -> u16 {
        // SAFETY: reading a field of the context the program was given.
        let gso_size = unsafe { (*self.ctx.skb.skb).gso_size };
        if gso_size == 0 {
            return f.tot_len;
        }
        let seg = (f.ip_len & I::IP_LEN_MASK) + f.l4_len + gso_size as usize;
        if seg < f.tot_len as usize {
            seg as u16
        } else {
            f.tot_len
        }
    }
    #[inline(always)]
    fn segments(&self, payload: u32) -> u32 {
        // From the segment size, not gso_segs: a packet from an untrusted
        // source (SKB_GSO_DODGY: virtio_net, tun) has gso_segs 0 until the
        // stack recounts it on egress (net/core/dev.c, qdisc_pkt_len_init).
        // SAFETY: reading a field of the context the program was given.
        let gso_size = unsafe { (*self.ctx.skb.skb).gso_size };
        if gso_size == 0 {
            return 1;
        }
        payload.div_ceil(gso_size).max(1)
    }
    #[inline(always)]
    fn change_tail(&self, len: u32) -> bool {
        // SAFETY: the helper takes the program's own context.
        unsafe { bpf_skb_change_tail(self.ctx.as_ptr().cast(), len, 0) == 0 }
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
    fn push_outer_header(&self, len: u32, v6: bool) -> bool {
        let flags = if v6 {
            BPF_F_ADJ_ROOM_ENCAP_L3_IPV6
        } else {
            BPF_F_ADJ_ROOM_ENCAP_L3_IPV4
        };
        self.ctx
            .adjust_room(len as i32, BPF_ADJ_ROOM_MAC, u64::from(flags))
            .is_ok()
    }
    #[inline(always)]
    fn pop_outer_header(&self, len: u32, v6: bool) -> bool {
        // The decap flags (Linux 6.3) set skb->protocol for the inner
        // packet's family.
        let flags = if v6 {
            BPF_F_ADJ_ROOM_DECAP_L3_IPV6
        } else {
            BPF_F_ADJ_ROOM_DECAP_L3_IPV4
        };
        self.ctx
            .adjust_room(-(len as i32), BPF_ADJ_ROOM_MAC, u64::from(flags))
            .is_ok()
    }
    #[inline(always)]
    fn socket_holds<I: Ip>(&self, key: &lb_common::conntrack::CtKey<I::Addr>) -> bool {
        super::access::socket_holds::<I>(self.ctx.as_ptr(), key)
    }
    #[inline(always)]
    fn sent_by_local_socket<I: Ip>(&self, f: &Flow<I>) -> bool {
        // skb->sk is set on what a socket of this node sends, but not only
        // there: veth keeps the sender's socket on a packet that crosses
        // into another namespace (Linux 5.1, "skbuff: preserve sock
        // reference when scrubbing the skb"), so a client's packet can
        // arrive with its socket and be redirected out still holding it.
        // The socket's own source must be the packet's: a SNATed packet
        // left its client's address behind.
        // SAFETY: reading a field of the context the program was given;
        // the socket's fields only after the null check (the verifier's
        // PTR_TO_SOCK_COMMON_OR_NULL).
        unsafe {
            let sk = core::ptr::read_volatile(&(*self.ctx.skb.skb).__bindgen_anon_2.sk);
            if sk.is_null() {
                return false;
            }
            core::ptr::read_volatile(&(*sk).src_port) == u32::from(u16::from_be(f.sport))
                && I::sock_source_is(sk, &f.saddr)
        }
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
    fn csum_complete_fixup(&self, diff: u32) {
        // SAFETY: the skb of this run; returns an error (ignored) when the
        // skb is not CHECKSUM_COMPLETE, which is then nothing to fix.
        unsafe {
            bpf_csum_update(self.ctx.as_ptr().cast(), diff);
        }
    }
    /// The L4 checksum through the kernel's helper: it keeps skb->csum
    /// (CHECKSUM_COMPLETE) in step with a pseudo-header change and, for
    /// CHECKSUM_PARTIAL packets (from a local socket, over veth), changes
    /// only what the offload will not recompute: states a tc program
    /// cannot read.
    ///
    /// Diff mode (size 0 in the flags: `to` is a precomputed one's
    /// complement difference, `from` must be 0; net/core/filter.c,
    /// inet_proto_csum_replace_by_diff): the same effect as one call per
    /// field, with two calls at most. Pseudo-header and other changes stay
    /// apart: a CHECKSUM_PARTIAL packet's field takes only the former.
    #[inline(always)]
    fn csum_l4_sums(
        &self,
        check_off: usize,
        pseudo: Option<u32>,
        plain: Option<u32>,
        udp: bool,
    ) -> bool {
        let mangled = if udp { BPF_F_MARK_MANGLED_0 } else { 0 };
        for (diff, flags) in [(pseudo, BPF_F_PSEUDO_HDR | mangled), (plain, mangled)] {
            let Some(diff) = diff else {
                continue;
            };
            // SAFETY: the skb of this run; the helper checks the offset
            // against the packet.
            let rc = unsafe {
                bpf_l4_csum_replace(
                    self.ctx.as_ptr().cast(),
                    check_off as u32,
                    0,
                    u64::from(diff),
                    flags,
                )
            };
            if rc != 0 {
                return false;
            }
        }
        true
    }
}

#[inline(always)]
fn verdict(a: Action) -> i32 {
    match a.verdict() {
        Verdict::Pass | Verdict::Punt => TC_ACT_OK,
        Verdict::Drop => TC_ACT_SHOT,
        // SAFETY: a helper taking plain values.
        Verdict::Redirect(ifindex) => unsafe { bpf_redirect(ifindex, 0) as i32 },
        Verdict::RedirectNeigh(ifindex, false) => redirect_neigh::<V4>(ifindex),
        Verdict::RedirectNeigh(ifindex, true) => redirect_neigh::<V6>(ifindex),
    }
}

/// bpf_redirect_neigh to the next hop the FIB lookup left in the family's
/// scratch parameters.
#[inline(always)]
fn redirect_neigh<I: Ip>(ifindex: u32) -> i32 {
    let Some(s) = super::scratch::<I>() else {
        return TC_ACT_SHOT;
    };
    // SAFETY: plain data; zero is its "nothing set" value.
    let mut nh: bpf_redir_neigh = unsafe { core::mem::zeroed() };
    nh.nh_family = u32::from(I::AF);
    // SAFETY: per-CPU scratch of this run; the lookup filled it.
    let hop = I::fib_next_hop(unsafe { &(*s).fib });
    if I::IS_V6 {
        let mut words = [0u32; 4];
        let mut i = 0;
        while i < 4 {
            words[i] = I::word(hop, i);
            i += 1;
        }
        nh.__bindgen_anon_1.ipv6_nh = words;
    } else {
        nh.__bindgen_anon_1.ipv4_nh = I::word(hop, 0);
    }
    // SAFETY: the helper reads `nh`, which lives across the call.
    unsafe {
        bpf_redirect_neigh(
            ifindex,
            &mut nh,
            core::mem::size_of::<bpf_redir_neigh>() as i32,
            0,
        ) as i32
    }
}

#[classifier]
pub fn lb_tc_ingress(ctx: TcContext) -> i32 {
    if tagged(&ctx) {
        return TC_ACT_OK;
    }
    let t = Tc {
        ctx: &ctx,
        hook: HOOK_TC_INGRESS,
    };
    verdict(super::ingress(&t))
}

#[classifier]
pub fn lb_tc_egress(ctx: TcContext) -> i32 {
    if tagged(&ctx) {
        return TC_ACT_OK;
    }
    let t = Tc {
        ctx: &ctx,
        hook: HOOK_TC_EGRESS,
    };
    t.pull(super::IPV4_HEADERS);
    verdict(super::egress(&t))
}

/// A pod's packets as they leave it (the host end of its veth): ClusterIPs
/// and every other frontend are translated here for pods whose sockets
/// socket LB leaves alone (`--socket-lb-host-namespace-only`, for service
/// meshes), as kube-proxy does in PREROUTING and Cilium in bpf_lxc. The
/// pod's address is kept and the stack routes the packet; no SNAT.
#[classifier]
pub fn lb_tc_pod_ingress(ctx: TcContext) -> i32 {
    if tagged(&ctx) {
        return TC_ACT_OK;
    }
    let t = Tc {
        ctx: &ctx,
        hook: HOOK_TC_POD_INGRESS,
    };
    verdict(super::ingress(&t))
}

/// Packets on their way into a pod: replies of a translated flow get the
/// frontend back as their source.
#[classifier]
pub fn lb_tc_pod_egress(ctx: TcContext) -> i32 {
    if tagged(&ctx) {
        return TC_ACT_OK;
    }
    let t = Tc {
        ctx: &ctx,
        hook: HOOK_TC_POD_EGRESS,
    };
    t.pull(super::IPV4_HEADERS);
    verdict(super::egress(&t))
}
