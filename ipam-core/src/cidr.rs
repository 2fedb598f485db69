//! CIDRs: `ipnet` parses, prints and answers containment; the block arithmetic the allocators
//! need (the n-th `/mask` block of a pool, the index of an address's block) is done here on the
//! address as an integer, IPv4 and IPv6 alike in a `u128`.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

pub use ipam_common::Family;

/// A network whose host bits are zero. Ordered by family, then first address, then prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr(IpNet);

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CidrError {
    #[error(
        "{input:?} is not a CIDR; write it as address/prefix, e.g. 10.244.0.0/16 or fd00::/104"
    )]
    Syntax { input: String },
    #[error("{input:?}: prefix /{prefix} is longer than an {} address (/{})", family.name(), family.bits())]
    PrefixTooLong {
        input: String,
        family: Family,
        prefix: u8,
    },
    #[error("{input:?} has host bits set; the network is {network}")]
    HostBitsSet { input: String, network: Cidr },
}

/// A CIDR is written as a string (`10.244.0.0/16`); Kubernetes validates the `cidr` format.
#[cfg(feature = "schema")]
impl schemars::JsonSchema for Cidr {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Cidr".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "format": "cidr" })
    }
}

pub fn ip_to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

pub fn u128_to_ip(family: Family, value: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(value as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(value)),
    }
}

impl Cidr {
    /// The network of `ip/prefix`, or an error when host bits are set or the prefix is too long.
    pub fn new(ip: IpAddr, prefix: u8) -> Result<Self, CidrError> {
        let input = || format!("{ip}/{prefix}");
        let net = IpNet::new(ip, prefix).map_err(|_| CidrError::PrefixTooLong {
            input: input(),
            family: Family::of(ip),
            prefix,
        })?;
        let network = Self(net.trunc());
        if network.0 != net {
            return Err(CidrError::HostBitsSet {
                input: input(),
                network,
            });
        }
        Ok(network)
    }

    /// The network as `ipnet` sees it.
    pub fn net(&self) -> IpNet {
        self.0
    }

    pub fn family(&self) -> Family {
        Family::of(self.0.network())
    }

    pub fn prefix(&self) -> u8 {
        self.0.prefix_len()
    }

    /// First address as an integer.
    pub fn base(&self) -> u128 {
        ip_to_u128(self.0.network())
    }

    pub fn network(&self) -> IpAddr {
        self.0.network()
    }

    /// log2 of the number of addresses.
    pub fn host_bits(&self) -> u8 {
        self.0.max_prefix_len() - self.0.prefix_len()
    }

    /// Number of addresses, saturating at `u128::MAX` for `::/0`.
    pub fn size(&self) -> u128 {
        1u128
            .checked_shl(u32::from(self.host_bits()))
            .unwrap_or(u128::MAX)
    }

    /// Last address as an integer.
    pub fn last(&self) -> u128 {
        ip_to_u128(self.0.broadcast())
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&ip)
    }

    /// CIDRs nest: two overlap exactly when one contains the other.
    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.0.contains(&other.0) || other.0.contains(&self.0)
    }

    /// The smaller of two overlapping CIDRs (the overlap itself, since CIDRs nest).
    pub fn overlap(&self, other: &Cidr) -> Option<Cidr> {
        let smaller = if self.prefix() >= other.prefix() {
            *self
        } else {
            *other
        };
        self.overlaps(other).then_some(smaller)
    }

    /// Number of `/mask` blocks in this CIDR (`mask >= prefix`), saturating.
    pub fn block_count(&self, mask: u8) -> u128 {
        1u128
            .checked_shl(u32::from(mask - self.prefix()))
            .unwrap_or(u128::MAX)
    }

    /// The `index`th `/mask` block of this CIDR.
    pub fn block(&self, mask: u8, index: u128) -> Cidr {
        let shift = self.family().bits() - mask;
        let first = u128_to_ip(self.family(), self.base() + (index << shift));
        Cidr(IpNet::new(first, mask).expect("a block's mask fits its family"))
    }

    /// Index of the `/mask` block that holds `ip`.
    pub fn block_index(&self, mask: u8, ip: IpAddr) -> u128 {
        (ip_to_u128(ip) - self.base()) >> (self.family().bits() - mask)
    }

    /// The address at `offset` from the start.
    pub fn addr(&self, offset: u128) -> IpAddr {
        u128_to_ip(self.family(), self.base() + offset)
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let text = input.trim();
        // ipnet accepts host bits (it is a host's address and prefix); a pool's CIDR must not
        // have them, so the network is checked here with this project's error.
        let net: IpNet = text.parse().map_err(|_| match text.split_once('/') {
            Some((ip, prefix)) => match (ip.parse::<IpAddr>(), prefix.parse::<u8>()) {
                (Ok(ip), Ok(prefix)) => CidrError::PrefixTooLong {
                    input: input.to_owned(),
                    family: Family::of(ip),
                    prefix,
                },
                _ => CidrError::Syntax {
                    input: input.to_owned(),
                },
            },
            None => CidrError::Syntax {
                input: input.to_owned(),
            },
        })?;
        let network = Self(net.trunc());
        if network.0 != net {
            return Err(CidrError::HostBitsSet {
                input: input.to_owned(),
                network,
            });
        }
        Ok(network)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Serialize for Cidr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

// Through `FromStr`, not ipnet's serde: a CIDR with host bits is refused with a message that
// names the network meant.
impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_and_prints_both_families() {
        assert_eq!(c("10.244.0.0/16").to_string(), "10.244.0.0/16");
        assert_eq!(c("fd00::/104").to_string(), "fd00::/104");
        assert_eq!(c("0.0.0.0/0").size(), 1 << 32);
        assert_eq!(c("::/0").size(), u128::MAX);
        assert_eq!(c("10.244.0.0/16").block_count(24), 256);
        assert_eq!(c("10.244.0.0/16").block(24, 255), c("10.244.255.0/24"));
        assert_eq!(
            c("10.244.0.0/16").block_index(24, "10.244.7.9".parse().unwrap()),
            7
        );
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let e = "10.244.1.0/16".parse::<Cidr>().unwrap_err().to_string();
        assert!(
            e.contains("host bits") && e.contains("10.244.0.0/16"),
            "{e}"
        );
        let e = "10.0.0.0/33".parse::<Cidr>().unwrap_err().to_string();
        assert!(e.contains("/33") && e.contains("IPv4"), "{e}");
        let e = "10.0.0.0".parse::<Cidr>().unwrap_err().to_string();
        assert!(e.contains("address/prefix"), "{e}");
        assert!("10.0.0.300/24".parse::<Cidr>().is_err());
    }

    #[test]
    fn overlap_is_the_smaller_network() {
        let a = c("10.0.0.0/8");
        let b = c("10.1.0.0/16");
        assert_eq!(a.overlap(&b), Some(b));
        assert_eq!(b.overlap(&a), Some(b));
        assert_eq!(c("10.0.0.0/16").overlap(&c("10.1.0.0/16")), None);
        assert_eq!(c("10.0.0.0/8").overlap(&c("::/0")), None);
    }
}
