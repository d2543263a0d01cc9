//! Whether native XDP can carry a device's traffic, checked before it is
//! attached. A veth is where it fails without a word: the frames the
//! program sends back out of the device (XDP_TX, a redirect to another
//! veth) go to the peer's XDP ring, and the peer reads that ring only when
//! it has a driver-mode XDP program of its own (drivers/net/veth.c:
//! veth_xdp_xmit refuses them with ENXIO without the peer's NAPI, and
//! veth_xdp_flush schedules the peer only when it has a program; GRO on
//! the peer makes a NAPI, but frames then wait for other traffic). The
//! kernel counts those in `ethtool -S` (`xdp_tx_errors`), not where an
//! operator of this agent looks. A physical NIC has no peer: nothing to
//! check there.
//!
//! The other condition cannot be checked from here: the senders must put
//! full checksums in their packets. veth hands a packet whose checksum was
//! left to offload (CHECKSUM_PARTIAL) to XDP as it is, XDP cannot tell,
//! and the rewritten packet arrives with a wrong checksum and is dropped
//! by the receiver (packet/xdp.rs). The agent says so when it attaches.
use crate::sys::netlink::{self, Link};

/// What a veth needs for native XDP, for the operator.
pub const VETH_NEEDS: &str = "a veth carries native XDP only when (1) its peer runs a \
driver-mode XDP program (one that returns XDP_PASS is enough) and (2) the senders behind it \
write full checksums (`ethtool -K <device> tx off` on their devices): frames XDP sends out of \
a veth whose peer has no program are dropped, and XDP cannot see a checksum left to offload";

/// The verdict on one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fit {
    /// Not a veth: native XDP works if the driver has it.
    NotVeth,
    /// A veth whose peer has a driver-mode program; the senders' checksums
    /// are the operator's to ensure.
    Veth,
    /// A veth that would lose traffic: why.
    Unfit(String),
}

/// Checks `dev` (ifindex `ifindex`) in this namespace.
pub fn check(dev: &str, ifindex: u32) -> anyhow::Result<Fit> {
    let link = netlink::links()?.into_iter().find(|l| l.ifindex == ifindex);
    Ok(match link {
        Some(link) if link.kind == "veth" => veth(dev, &link, netlink::link_in),
        _ => Fit::NotVeth,
    })
}

/// The verdict on a veth, reading its peer with `peer_of` (the real
/// rtnetlink call, or a stand-in in unit tests).
fn veth(
    dev: &str,
    link: &Link,
    peer_of: impl Fn(u32, Option<i32>) -> std::io::Result<Link>,
) -> Fit {
    let Some(peer) = link.peer else {
        return Fit::Unfit(format!("{dev} is a veth without a peer; {VETH_NEEDS}"));
    };
    let place = link
        .peer_netnsid
        .map_or_else(String::new, |id| format!(" in namespace id {id}"));
    match peer_of(peer, link.peer_netnsid) {
        Ok(p) if p.xdp_driver => Fit::Veth,
        Ok(p) => Fit::Unfit(format!(
            "{dev} is a veth whose peer {} (ifindex {peer}{place}) has no driver-mode XDP \
             program; {VETH_NEEDS}",
            p.name
        )),
        Err(e) => Fit::Unfit(format!(
            "{dev} is a veth whose peer (ifindex {peer}{place}) cannot be read ({e}); \
             {VETH_NEEDS}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, peer: Option<u32>, xdp_driver: bool) -> Link {
        Link {
            ifindex: 7,
            name: name.into(),
            kind: "veth".into(),
            peer,
            peer_netnsid: Some(3),
            xdp_driver,
        }
    }

    #[test]
    fn a_veth_is_fit_only_when_its_peer_has_a_driver_mode_program() {
        let eth0 = link("eth0", Some(9), false);
        let with = |xdp| move |_: u32, _: Option<i32>| Ok(link("na0", None, xdp));
        assert_eq!(veth("eth0", &eth0, with(true)), Fit::Veth);
        let Fit::Unfit(why) = veth("eth0", &eth0, with(false)) else {
            panic!("a peer without a program");
        };
        assert!(
            why.contains("peer na0 (ifindex 9 in namespace id 3)"),
            "{why}"
        );
        assert!(why.contains("XDP_PASS") && why.contains("tx off"), "{why}");
        let gone = |_: u32, _: Option<i32>| Err(std::io::Error::from_raw_os_error(libc::ENODEV));
        assert!(matches!(veth("eth0", &eth0, gone), Fit::Unfit(w) if w.contains("cannot be read")));
        assert!(matches!(
            veth("eth0", &link("eth0", None, false), with(true)),
            Fit::Unfit(w) if w.contains("without a peer")
        ));
    }
}
