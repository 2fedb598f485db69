//! The node's interfaces as its record tells them: those up, with a carrier and an address
//! (where it may announce Service IPs, and which subnets they reach); and those it could
//! announce from earlier in this agent's life that it cannot any more, with why, so that the
//! agent that takes its IPs, `ipamctl who-has` and the node's metrics can say why it stopped.
//! An interface that is down when the agent starts is simply not listed.

use std::{collections::BTreeSet, net::IpAddr};

use ipam_core::resources::{InterfaceDown, NodeInterface};

/// One link as netlink shows it, with its addresses other than link-local ones.
#[derive(Debug, Clone)]
pub struct LinkState {
    pub name: String,
    pub admin_up: bool,
    pub carrier: bool,
    pub mac: [u8; 6],
    /// `ip/prefix`.
    pub addresses: Vec<String>,
}

/// What the node's record lists of its interfaces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Judged {
    pub usable: Vec<NodeInterface>,
    pub down: Vec<InterfaceDown>,
}

impl Judged {
    /// The verdict `facts` hold: what stands while netlink cannot be read.
    pub fn as_in(facts: &ipam_core::pod::agent::NodeFacts) -> Self {
        Self {
            usable: facts.interfaces.clone(),
            down: facts.interfaces_down.clone(),
        }
    }
}

/// The interfaces seen usable since the agent started.
#[derive(Debug, Default)]
pub struct Interfaces {
    seen_usable: BTreeSet<String>,
}

impl Interfaces {
    /// Looks at the node's links now, leaving out the loopback and `skip` (pod IPAM's own
    /// devices); `None` when netlink cannot be read (nothing is judged down for it).
    pub fn look(&mut self, skip: &[&str]) -> Option<Judged> {
        let links = links_now()?;
        Some(
            self.judge(
                links
                    .into_iter()
                    .filter(|l| l.name != "lo" && !skip.contains(&l.name.as_str())),
            ),
        )
    }

    /// The verdict on `links`; an interface seen usable before and now missing from them is
    /// gone (removed or renamed).
    pub fn judge(&mut self, links: impl IntoIterator<Item = LinkState>) -> Judged {
        let mut judged = Judged::default();
        let mut present = BTreeSet::new();
        for link in links {
            present.insert(link.name.clone());
            match why_unusable(&link) {
                None => {
                    self.seen_usable.insert(link.name.clone());
                    judged.usable.push(NodeInterface {
                        name: link.name,
                        addresses: link.addresses,
                        mac: Some(mac_text(link.mac)),
                    });
                }
                Some(why) if self.seen_usable.contains(&link.name) => {
                    judged.down.push(InterfaceDown {
                        name: link.name,
                        why: why.to_owned(),
                    });
                }
                Some(_) => {}
            }
        }
        for gone in self.seen_usable.difference(&present) {
            judged.down.push(InterfaceDown {
                name: gone.clone(),
                why: "gone (removed or renamed)".to_owned(),
            });
        }
        judged.usable.sort();
        judged.down.sort();
        judged
    }
}

/// `02:00:0a:4d:00:01`.
fn mac_text(mac: [u8; 6]) -> String {
    mac.map(|o| format!("{o:02x}")).join(":")
}

fn why_unusable(link: &LinkState) -> Option<&'static str> {
    if !link.admin_up {
        Some("set down")
    } else if !link.carrier {
        Some("no carrier (the link is lost)")
    } else if link.addresses.is_empty() {
        Some("no address")
    } else {
        None
    }
}

/// Every link of the node's namespace with its addresses, from netlink (not /sys/class/net: a
/// daemon entered into a namespace with `nsenter --net` still sees the host's /sys).
fn links_now() -> Option<Vec<LinkState>> {
    let netlink = ipam_netlink::Netlink::open().ok()?;
    let links = netlink.links().ok()?;
    let mut out = Vec::with_capacity(links.len());
    for link in links {
        // A link with no address needs no question: only up ones may announce.
        let addresses = if link.up {
            netlink
                .addresses(link.index)
                .ok()?
                .into_iter()
                .filter(|(ip, _)| match ip {
                    IpAddr::V4(v4) => !v4.is_link_local(),
                    IpAddr::V6(v6) => !v6.is_unicast_link_local(),
                })
                .map(|(ip, prefix)| format!("{ip}/{prefix}"))
                .collect()
        } else {
            Vec::new()
        };
        out.push(LinkState {
            name: link.name,
            admin_up: link.admin_up,
            carrier: link.up,
            mac: link.mac,
            addresses,
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, admin_up: bool, carrier: bool, addresses: &[&str]) -> LinkState {
        LinkState {
            name: name.to_owned(),
            admin_up,
            carrier: admin_up && carrier,
            mac: [2, 0, 0, 0, 0, 1],
            addresses: addresses.iter().map(|a| (*a).to_owned()).collect(),
        }
    }

    fn down(judged: &Judged) -> Vec<(&str, &str)> {
        judged
            .down
            .iter()
            .map(|d| (d.name.as_str(), d.why.as_str()))
            .collect()
    }

    #[test]
    fn an_interface_that_announced_says_why_it_no_longer_can() {
        let mut interfaces = Interfaces::default();
        let first = interfaces.judge([
            link("eth0", true, true, &["10.0.0.5/24"]),
            link("edge0", true, true, &["10.79.0.5/24"]),
            link("docker0", true, false, &["172.17.0.1/16"]),
        ]);
        assert_eq!(first.usable.len(), 2);
        assert!(first.down.is_empty(), "never usable is not down: {first:?}");

        let lost = interfaces.judge([
            link("eth0", true, true, &["10.0.0.5/24"]),
            link("edge0", true, false, &[]),
            link("docker0", true, false, &["172.17.0.1/16"]),
        ]);
        assert_eq!(down(&lost), [("edge0", "no carrier (the link is lost)")]);
        assert_eq!(lost.usable.len(), 1);

        let set_down = interfaces.judge([link("eth0", false, false, &[])]);
        assert_eq!(
            down(&set_down),
            [("edge0", "gone (removed or renamed)"), ("eth0", "set down")]
        );

        let no_address = interfaces.judge([
            link("eth0", true, true, &[]),
            link("edge0", true, true, &["10.79.0.5/24"]),
        ]);
        assert_eq!(down(&no_address), [("eth0", "no address")]);

        let back = interfaces.judge([
            link("eth0", true, true, &["10.0.0.5/24"]),
            link("edge0", true, true, &["10.79.0.5/24"]),
        ]);
        assert!(back.down.is_empty());
        assert_eq!(back.usable.len(), 2);
    }
}
