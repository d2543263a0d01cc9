//! Network types the sources, the model and the flags share.
use std::net::IpAddr;

/// An IPv4 or IPv6 network: --nodeport-addresses, --service-cidr,
/// loadBalancerSourceRanges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    pub address: IpAddr,
    pub prefix: u8,
}

impl std::str::FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, p) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not a CIDR like 10.0.0.0/8"))?;
        let address: IpAddr = a
            .parse()
            .map_err(|_| format!("{a:?} is not an IP address"))?;
        let prefix: u8 = p
            .parse()
            .map_err(|_| format!("{p:?} is not a prefix length"))?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(format!("prefix /{prefix} is longer than {max}"));
        }
        Ok(Cidr { address, prefix })
    }
}

impl Cidr {
    pub fn contains(&self, ip: &IpAddr) -> bool {
        match (self.address, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - self.prefix)
                };
                u32::from(n) & mask == u32::from(*a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - self.prefix)
                };
                u128::from(n) & mask == u128::from(*a) & mask
            }
            _ => false,
        }
    }

    /// The network address: the host bits cleared (`10.1.2.3/8` is `10.0.0.0/8`).
    pub fn network(&self) -> Self {
        let address = match self.address {
            IpAddr::V4(a) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - self.prefix)
                };
                IpAddr::V4((u32::from(a) & mask).into())
            }
            IpAddr::V6(a) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - self.prefix)
                };
                IpAddr::V6((u128::from(a) & mask).into())
            }
        };
        Self {
            address,
            prefix: self.prefix,
        }
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_parse_contain_and_normalise() {
        let c: Cidr = "10.1.2.3/8".parse().unwrap();
        assert!(c.contains(&"10.200.0.1".parse().unwrap()));
        assert!(!c.contains(&"11.0.0.1".parse().unwrap()));
        assert_eq!(c.network().to_string(), "10.0.0.0/8");
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(&"192.0.2.1".parse().unwrap()));
        assert!(!all.contains(&"::1".parse().unwrap()), "families never mix");
        let v6: Cidr = "fd00::1/64".parse().unwrap();
        assert_eq!(v6.network().to_string(), "fd00::/64");
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("10.0.0.0".parse::<Cidr>().is_err());
    }
}
