//! What this node answers ARP/NDP for: (IP, interface) pairs grouped by interface, with how the
//! responder is attached there. One producer builds it (`configured`, from the configured IPs
//! and the service IPs this node owns, `OwnedIps`); the responder controller reads it.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use ipam_datapath::AttachMode;

pub use ipam_core::l2::{HandOn, HandedOver, OwnedIp, OwnedIps};

/// The IPs answered on one interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OnInterface {
    pub attach: AttachMode,
    pub ips: BTreeSet<IpAddr>,
}

/// Every IP this node answers for, by interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Announcements {
    by_interface: BTreeMap<String, OnInterface>,
}

impl Announcements {
    /// Answers `ip` on `interface`, with the responder attached as `attach` there.
    pub fn add(&mut self, ip: IpAddr, interface: &str, attach: AttachMode) {
        let on = self.by_interface.entry(interface.to_owned()).or_default();
        on.attach = attach;
        on.ips.insert(ip);
    }

    /// The interfaces with something to answer, in name order.
    pub fn interfaces(&self) -> impl Iterator<Item = (&str, &OnInterface)> {
        self.by_interface.iter().map(|(i, on)| (i.as_str(), on))
    }

    /// How many (IP, interface) pairs.
    pub fn len(&self) -> usize {
        self.by_interface.values().map(|on| on.ips.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_interface.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_by_interface_and_counts_pairs() {
        let mut a = Announcements::default();
        a.add("10.0.0.1".parse().unwrap(), "eth0", AttachMode::Auto);
        a.add("10.0.0.1".parse().unwrap(), "eth0", AttachMode::Auto);
        a.add("10.0.0.2".parse().unwrap(), "eth0", AttachMode::Auto);
        a.add("fd00::1".parse().unwrap(), "eth1", AttachMode::Tc);
        assert_eq!(a.len(), 3);
        let names: Vec<_> = a.interfaces().map(|(i, on)| (i, on.attach)).collect();
        assert_eq!(
            names,
            [("eth0", AttachMode::Auto), ("eth1", AttachMode::Tc)]
        );
    }
}
