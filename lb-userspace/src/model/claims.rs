//! Frontend ownership, settled before the model: every source files each
//! service's frontends here, and a model it outputs gives each frontend
//! (address, port, protocol) to one service only. The reconciler can then
//! take the model as it is: what it keeps per frontend is which service's
//! entries hold it in the maps (bookkeeping for removal), not a choice.
//!
//! The rule is the same for both sources: of the services that claim a
//! frontend, the first by name owns it. What they do with a contest
//! differs, as their users expect. The apiserver accepts each service on
//! its own (two may name one external IP and port), and one user's
//! mistake must not take another's service down, so the Kubernetes store
//! skips the losers' frontends and warns (`frontend-conflict`); a name
//! order makes every node pick the same owner. A services file is one
//! document its author can fix, so the file source refuses it whole,
//! naming both services.
use std::net::IpAddr;

use super::{Frontend, ServiceName};
use crate::collections::HashMap;

/// What makes two frontends the same to the data path: the services map is
/// keyed by address, port and protocol (the scope and slot follow).
pub type FrontendId = (IpAddr, u16, u8);

/// The identity of a frontend.
pub fn frontend_id(f: &Frontend) -> FrontendId {
    (f.address, f.port, f.protocol.number())
}

/// Which services claim each frontend, and so which owns it.
#[derive(Default)]
pub struct FrontendClaims {
    claims: HashMap<FrontendId, Claimants>,
}

impl FrontendClaims {
    /// `name` claims `id`. Returns the service that owned it until now and
    /// lost it to `name` (which sorts before it), if any.
    pub fn claim(&mut self, id: FrontendId, name: &ServiceName) -> Option<ServiceName> {
        let set = self.claims.entry(id).or_default();
        let before = set.first().cloned();
        set.insert(name);
        before.filter(|prev| prev != name && set.first() == Some(name))
    }

    /// `name` lets go of `id`. Returns the service that owns it now
    /// because `name` did and let go, if any.
    pub fn release(&mut self, id: FrontendId, name: &ServiceName) -> Option<ServiceName> {
        let set = self.claims.get_mut(&id)?;
        let was_owner = set.first() == Some(name);
        set.remove(name);
        let next = set.first().cloned().filter(|_| was_owner);
        if set.is_empty() {
            self.claims.remove(&id);
        }
        next
    }

    /// The service that owns `id`: the first by name of its claimants.
    pub fn owner(&self, id: &FrontendId) -> Option<&ServiceName> {
        self.claims.get(id).and_then(Claimants::first)
    }

    /// A claimant of `id` other than `name`, if any: whom `name` contests
    /// the frontend with.
    pub fn rival(&self, id: &FrontendId, name: &ServiceName) -> Option<&ServiceName> {
        match self.claims.get(id)? {
            Claimants::None => None,
            Claimants::One(n) => Some(n).filter(|n| *n != name),
            Claimants::Many(v) => v.iter().find(|n| *n != name),
        }
    }

    /// Frontends claimed (by one service or more).
    pub fn len(&self) -> usize {
        self.claims.len()
    }

    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }

    pub fn clear(&mut self) {
        self.claims.clear();
    }
}

/// The services that claim a frontend, sorted by name (the first owns
/// it). Almost always one, held without a vector: at 100 000 services a
/// vector per frontend was 48 B of RSS each.
#[derive(Default)]
enum Claimants {
    #[default]
    None,
    One(ServiceName),
    Many(Vec<ServiceName>),
}

impl Claimants {
    fn first(&self) -> Option<&ServiceName> {
        match self {
            Self::None => None,
            Self::One(n) => Some(n),
            Self::Many(v) => v.first(),
        }
    }

    fn is_empty(&self) -> bool {
        self.first().is_none()
    }

    fn insert(&mut self, name: &ServiceName) {
        match self {
            Self::None => *self = Self::One(name.clone()),
            Self::One(n) if n == name => {}
            Self::One(n) => {
                let mut v = vec![n.clone(), name.clone()];
                v.sort();
                *self = Self::Many(v);
            }
            Self::Many(v) => {
                if let Err(at) = v.binary_search(name) {
                    v.insert(at, name.clone());
                }
            }
        }
    }

    fn remove(&mut self, name: &ServiceName) {
        match self {
            Self::One(n) if n == name => *self = Self::None,
            Self::Many(v) => {
                v.retain(|n| n != name);
                if v.len() == 1 {
                    *self = Self::One(v.pop().expect("one left"));
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> FrontendId {
        ("10.0.0.1".parse().unwrap(), 80, 6)
    }

    #[test]
    fn the_first_claimant_by_name_owns_a_frontend_whatever_the_order_of_claims() {
        let (a, b, c) = (
            ServiceName::new("ns", "a"),
            ServiceName::new("ns", "b"),
            ServiceName::new("ns", "c"),
        );
        let mut claims = FrontendClaims::default();
        assert_eq!(claims.claim(id(), &b), None, "the first claim takes it");
        assert_eq!(claims.claim(id(), &c), None, "c sorts after b: b keeps it");
        assert_eq!(claims.owner(&id()), Some(&b));
        assert_eq!(claims.claim(id(), &a), Some(b.clone()), "a takes it from b");
        assert_eq!(claims.owner(&id()), Some(&a));
        assert_eq!(
            claims.claim(id(), &a),
            None,
            "a claim again changes nothing"
        );
        assert_eq!(claims.rival(&id(), &a), Some(&b));
        assert_eq!(claims.release(id(), &c), None, "c never owned it");
        assert_eq!(claims.release(id(), &a), Some(b.clone()), "b owns it again");
        assert_eq!(claims.rival(&id(), &b), None, "b is alone");
        assert_eq!(claims.release(id(), &b), None);
        assert!(claims.is_empty(), "a frontend nobody claims is forgotten");

        // Every order of claims ends with the first by name owning it.
        let names = [a.clone(), b.clone(), c.clone()];
        for order in [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ] {
            let mut claims = FrontendClaims::default();
            for i in order {
                claims.claim(id(), &names[i]);
            }
            assert_eq!(claims.owner(&id()), Some(&a), "{order:?}");
        }
    }
}
