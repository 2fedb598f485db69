//! Whether this node may announce Service IPs, judged by its own agent and published in its
//! record (`NodeAnnouncing`), so every agent decides ownership from the same verdicts whatever
//! its own `[node.announce]` says: excluded by the Kubernetes label, while its network is
//! unavailable, NotReady or cordoned (as configured); and what on the node makes clients see
//! other answers than the owner's (kube-proxy's IPVS mode without strictARP).

use std::collections::BTreeMap;

use ipam_config::AnnounceSettings;
use ipam_core::resources::NodeAnnouncing;
use ipam_kube::node::NodeInfo;

use crate::metrics::Health;

/// The label Kubernetes' service controllers (and MetalLB) leave out of load balancing.
pub const EXCLUSION_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
/// The dummy device kube-proxy's IPVS mode puts every Service IP on.
const IPVS_DEVICE: &str = "kube-ipvs0";

/// The verdict on this node: its labels (the Node's with the configured ones over them), its
/// Kubernetes Node when the store is Kubernetes, and what the host shows.
pub fn judge(
    settings: &AnnounceSettings,
    labels: &BTreeMap<String, String>,
    node: Option<&NodeInfo>,
) -> NodeAnnouncing {
    NodeAnnouncing {
        excluded: excluded(settings, labels, node),
        warnings: ipvs_without_strict_arp().into_iter().collect(),
    }
}

fn excluded(
    settings: &AnnounceSettings,
    labels: &BTreeMap<String, String>,
    node: Option<&NodeInfo>,
) -> Option<String> {
    if settings.exclusion_label && labels.contains_key(EXCLUSION_LABEL) {
        return Some(format!(
            "label {EXCLUSION_LABEL}; remove it, or set [node.announce] exclusion_label = false"
        ));
    }
    let node = node?;
    if settings.exclude_network_unavailable && node.network_unavailable {
        return Some("its Node's NetworkUnavailable condition is True".to_owned());
    }
    if settings.exclude_not_ready && node.ready == Some(false) {
        return Some("its Node is NotReady".to_owned());
    }
    if settings.exclude_cordoned && node.unschedulable {
        return Some("its Node is cordoned".to_owned());
    }
    None
}

/// kube-proxy's IPVS mode puts every Service IP on `kube-ipvs0`; unless its strictARP set
/// `arp_ignore` for all interfaces, the kernel answers ARP for those IPs on every interface,
/// and clients reach nodes that do not own the IP.
fn ipvs_without_strict_arp() -> Option<String> {
    if ipam_netlink::iface::index(IPVS_DEVICE).is_err() {
        return None;
    }
    let arp_ignore = std::fs::read_to_string("/proc/sys/net/ipv4/conf/all/arp_ignore").ok()?;
    (arp_ignore.trim() == "0").then(|| {
        "kube-proxy runs in IPVS mode without strictARP (kube-ipvs0 holds every Service IP and \
         net.ipv4.conf.all.arp_ignore is 0): this node's kernel answers ARP for every \
         LoadBalancer IP, so clients may reach a node that does not own it; set strictARP: true \
         in kube-proxy's configuration (kubectl -n kube-system edit configmap kube-proxy) and \
         restart kube-proxy"
            .to_owned()
    })
}

/// Says what changed in the verdict (the log) and keeps the agent unready while a warning
/// stands (`/readyz`, check `announcing`), so the DaemonSet shows it.
pub fn report(node: &str, previous: &NodeAnnouncing, now: &NodeAnnouncing, health: &Health) {
    if previous.excluded != now.excluded {
        match &now.excluded {
            Some(why) => tracing::warn!(node, "this node announces no Service IP: {why}"),
            None => tracing::info!(node, "this node may announce Service IPs again"),
        }
    }
    if previous.warnings != now.warnings {
        for w in &now.warnings {
            tracing::error!(node, "{w}");
        }
    }
    health.set(
        "announcing",
        if now.warnings.is_empty() {
            Ok(())
        } else {
            Err(now.warnings.join("; "))
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kube(ready: Option<bool>, cordoned: bool, network_unavailable: bool) -> NodeInfo {
        NodeInfo {
            ready,
            unschedulable: cordoned,
            network_unavailable,
            ..NodeInfo::default()
        }
    }

    #[test]
    fn each_state_excludes_as_configured_and_the_defaults_are_metallb_s() {
        let defaults = AnnounceSettings::default();
        let none = BTreeMap::new();
        let labelled = BTreeMap::from([(EXCLUSION_LABEL.to_owned(), String::new())]);
        let why = |s: &AnnounceSettings, labels, node: Option<NodeInfo>| {
            excluded(s, labels, node.as_ref())
        };
        assert!(
            why(&defaults, &labelled, None)
                .unwrap()
                .contains(EXCLUSION_LABEL)
        );
        assert!(why(&defaults, &none, Some(kube(Some(true), false, true))).is_some());
        // MetalLB keeps announcing from NotReady and cordoned nodes.
        assert_eq!(
            why(&defaults, &none, Some(kube(Some(false), true, false))),
            None
        );
        let strict = AnnounceSettings {
            exclusion_label: false,
            exclude_network_unavailable: false,
            exclude_not_ready: true,
            exclude_cordoned: true,
            ..AnnounceSettings::default()
        };
        assert_eq!(why(&strict, &labelled, None), None, "the label ignored");
        assert!(
            why(&strict, &none, Some(kube(Some(false), false, false)))
                .unwrap()
                .contains("NotReady")
        );
        assert!(
            why(&strict, &none, Some(kube(Some(true), true, false)))
                .unwrap()
                .contains("cordoned")
        );
        assert_eq!(
            why(&strict, &none, Some(kube(None, false, true))),
            None,
            "not reported yet"
        );
    }
}
