//! This node's addresses, followed while the agent runs: NodePorts listen
//! on them, so an address added to a device at run time gets its NodePorts
//! and one removed loses them (kube-proxy reads the node's addresses again
//! on every sync; Cilium follows them through netlink, as here). A thread
//! waits on rtnetlink's address groups (`sys::netlink::AddressWatch`),
//! reads the addresses again and publishes them when they differ.
use std::{collections::BTreeSet, net::IpAddr, time::Duration};

use anyhow::Context as _;
use tokio::sync::watch;
use tracing::warn;

pub type Addresses = BTreeSet<IpAddr>;

/// How long a burst of address messages (an address with its routes, an
/// IPv6 address leaving its tentative state) may take to settle before
/// the addresses are read.
const SETTLE: Duration = Duration::from_millis(50);

/// Starts following: the addresses `read` gives now, then after every
/// change. The thread ends within a second of every receiver being gone; an error of the
/// netlink socket ends it too, said loudly (the addresses then stay as
/// they were last read).
pub fn follow(
    read: fn() -> anyhow::Result<Addresses>,
) -> anyhow::Result<watch::Receiver<Addresses>> {
    let mut socket = crate::sys::netlink::AddressWatch::open()
        .context("listening for this node's address changes (rtnetlink)")?;
    let mut first = read()?;
    first.retain(|a| !is_v6_link_local(a));
    let (tx, rx) = watch::channel(first);
    std::thread::Builder::new()
        .name("addresses".into())
        .spawn(move || loop {
            match socket.wait(Duration::from_secs(1)) {
                // Nothing changed: still wanted?
                Ok(false) if tx.is_closed() => return,
                Ok(false) => continue,
                Ok(true) => {}
                Err(e) => {
                    warn!("listening for address changes failed ({e}): NodePorts keep the addresses read last and no longer follow this node's");
                    return;
                }
            }
            std::thread::sleep(SETTLE);
            match read() {
                Ok(mut now) => {
                    // IPv6 link-local addresses never serve NodePorts, and
                    // every new pod's veth brings one: they wake no one.
                    now.retain(|a| !is_v6_link_local(a));
                    tx.send_if_modified(|known| {
                        let changed = *known != now;
                        *known = now;
                        changed
                    });
                }
                Err(e) => warn!("reading this node's addresses: {e:#}; keeping the ones read last"),
            }
            if tx.is_closed() {
                return;
            }
        })
        .context("starting the address follower")?;
    Ok(rx)
}

fn is_v6_link_local(a: &IpAddr) -> bool {
    matches!(a, IpAddr::V6(v6) if v6.is_unicast_link_local())
}
