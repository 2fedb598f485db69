//! What this node answers ARP/NDP for: the Service IPs the owners controller hands the
//! responder (`ServiceAnswers`), and the (IP, interface) pairs the responder answers, grouped by
//! interface with how it is attached there (`Announcements`, from the configured IPs and the
//! Service IPs: `Configured::with`).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use ipam_datapath::AttachMode;

pub use ipam_core::l2::{HandOn, HandedOver, OwnedIp, OwnedIps, owners::Answers};

/// What the owners controller hands the responder: what this node does for the cluster's
/// Service IPs, whole, and whether a decision made it. One value on one channel: the responder
/// cannot see the IPs before their hand-overs, nor answer what is not on `lo` yet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceAnswers {
    pub answers: Answers,
    /// Whether the owners controller has decided since the agent started (or has nothing to
    /// take up from an agent before): until then, the IPs that agent left on `lo` stay.
    pub decided: bool,
}

impl ServiceAnswers {
    /// At an agent's start: what the agent before answered when it stopped for a restart
    /// whose promise runs (`inherited`, empty otherwise), until the first decision.
    pub fn at_start(inherited: OwnedIps) -> Self {
        Self {
            answers: Answers::inherited(inherited),
            decided: false,
        }
    }

    /// No Service IP: there is no owners controller (or it ended).
    pub fn none() -> Self {
        Self {
            answers: Answers::default(),
            decided: true,
        }
    }
}

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
