//! CIDRs as integers: IPv4 and IPv6 in one `u128` representation, so block arithmetic is shared.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

pub use ipam_common::Family;

/// A network: family, first address and prefix length; host bits are always zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    family: Family,
    base: u128,
    prefix: u8,
}

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

pub fn ip_to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u32::from(v4) as u128,
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
        let family = Family::of(ip);
        let input = format!("{ip}/{prefix}");
        if prefix > family.bits() {
            return Err(CidrError::PrefixTooLong {
                input,
                family,
                prefix,
            });
        }
        let value = ip_to_u128(ip);
        let network = Self {
            family,
            base: value & !host_mask(family, prefix),
            prefix,
        };
        if network.base != value {
            return Err(CidrError::HostBitsSet { input, network });
        }
        Ok(network)
    }

    pub fn family(&self) -> Family {
        self.family
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// First address as an integer.
    pub fn base(&self) -> u128 {
        self.base
    }

    pub fn network(&self) -> IpAddr {
        u128_to_ip(self.family, self.base)
    }

    /// log2 of the number of addresses.
    pub fn host_bits(&self) -> u8 {
        self.family.bits() - self.prefix
    }

    /// Number of addresses, saturating at `u128::MAX` for `::/0`.
    pub fn size(&self) -> u128 {
        1u128
            .checked_shl(self.host_bits() as u32)
            .unwrap_or(u128::MAX)
    }

    /// Last address as an integer.
    pub fn last(&self) -> u128 {
        self.base | host_mask(self.family, self.prefix)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        Family::of(ip) == self.family && {
            let v = ip_to_u128(ip);
            v >= self.base && v <= self.last()
        }
    }

    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.family == other.family && self.base <= other.last() && other.base <= self.last()
    }

    /// The smaller of two overlapping CIDRs (the overlap itself, since CIDRs nest).
    pub fn overlap(&self, other: &Cidr) -> Option<Cidr> {
        let smaller = if self.prefix >= other.prefix {
            *self
        } else {
            *other
        };
        self.overlaps(other).then_some(smaller)
    }

    /// Number of `/mask` blocks in this CIDR (`mask >= prefix`), saturating.
    pub fn block_count(&self, mask: u8) -> u128 {
        1u128
            .checked_shl((mask - self.prefix) as u32)
            .unwrap_or(u128::MAX)
    }

    /// The `index`th `/mask` block of this CIDR.
    pub fn block(&self, mask: u8, index: u128) -> Cidr {
        let shift = self.family.bits() - mask;
        Cidr {
            family: self.family,
            base: self.base + (index << shift),
            prefix: mask,
        }
    }

    /// Index of the `/mask` block that holds `ip`.
    pub fn block_index(&self, mask: u8, ip: IpAddr) -> u128 {
        (ip_to_u128(ip) - self.base) >> (self.family.bits() - mask)
    }

    /// The address at `offset` from the start.
    pub fn addr(&self, offset: u128) -> IpAddr {
        u128_to_ip(self.family, self.base + offset)
    }
}

fn host_mask(family: Family, prefix: u8) -> u128 {
    let host_bits = (family.bits() - prefix) as u32;
    1u128.checked_shl(host_bits).map_or(u128::MAX, |v| v - 1)
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let syntax = || CidrError::Syntax {
            input: input.to_owned(),
        };
        let (ip, prefix) = input.trim().split_once('/').ok_or_else(syntax)?;
        let ip: IpAddr = ip.parse().map_err(|_| syntax())?;
        let prefix: u8 = prefix.parse().map_err(|_| syntax())?;
        Cidr::new(ip, prefix).map_err(|e| match e {
            CidrError::HostBitsSet { network, .. } => CidrError::HostBitsSet {
                input: input.to_owned(),
                network,
            },
            CidrError::PrefixTooLong { family, prefix, .. } => CidrError::PrefixTooLong {
                input: input.to_owned(),
                family,
                prefix,
            },
            other => other,
        })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network(), self.prefix)
    }
}

impl Serialize for Cidr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

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
