//! The add-on run on a real cluster: the project's LB-IPAM and L2 announcements beside the pod
//! network a cluster already has, installed as such a cluster installs it
//! (deploy/overlays/add-on: no pod IPAM, no CNI plugin, no pod datapath). The cluster's own CNI
//! here is Debian's bridge plugin with host-local, a stand-in for the user's (Flannel, Calico,
//! Cilium without L2 announcements): each node's pods on a bridge of the node's in a /24 of
//! its own, and routes between the nodes for those subnets, as such a CNI keeps them. Shared by
//! `cargo xtask lab kube` and `tests/tests/kube_cluster.rs`.

use std::{net::IpAddr, time::Duration};

use super::{
    KubeCluster,
    checks::{self, PodAddresses},
    scenario::{self, Figures},
};

/// The web Deployment (30 pods, 10 per node), as in the main run.
const WEB: &str = "web";
const REPLICAS: usize = 30;
/// The other CNI's configuration, the only one on each node.
const CONFLIST: &str = "10-lab-bridge.conflist";
/// The project's CNI plugin and configuration, which the add-on mode must not install.
const PROJECT_CNI: [&str; 2] = ["ipam-cni", "10-ipam.conflist"];

/// Node `i`'s pod subnet under the other CNI: `10.200.<i + 1>.0/24`, inside kube-proxy's
/// `clusterCIDR` (10.200.0.0/16).
fn pod_subnet(i: usize) -> String {
    format!("10.200.{}.0/24", i + 1)
}

/// Whether `ip` is in node `i`'s pod subnet.
fn in_pod_subnet(ip: IpAddr, i: usize) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            (a, b, usize::from(c)) == (10, 200, i + 1)
        }
        IpAddr::V6(_) => false,
    }
}

/// The run: the other CNI, the project installed beside it, pods over the nodes, a
/// LoadBalancer Service reached through kube-proxy, and `losses` power losses of the node
/// answering for its IP; the losses' figures.
pub fn run(cluster: &mut KubeCluster, losses: usize, say: &dyn Fn(&str)) -> Figures {
    install_other_cni(cluster);
    say(
        "the cluster's own CNI: Debian's bridge plugin with host-local on every node \
         (10.200.<n>.0/24), routes between the nodes for those subnets",
    );
    say("install: kubectl apply -k (deploy/overlays/add-on), the gossip Secret");
    checks::install_overlay(cluster, "add-on", None);
    checks::wait_ready(cluster, Duration::from_secs(240));
    checks::no_forbidden_in_logs(cluster);
    say("every node Ready, an agent on every node, both operators Ready; no Forbidden in a log");
    assert_project_cni_absent(cluster);
    say("the agents installed no CNI plugin or configuration: each node has the other CNI's alone");

    checks::deploy_web(cluster, "default", WEB, REPLICAS);
    let pods = checks::pod_addresses(cluster, "default", &format!("app={WEB}"));
    assert_addresses_from_the_other_cni(cluster, &pods);
    assert_no_pod_blocks(cluster);
    say(&format!(
        "{REPLICAS} pods Running, each with its address from the other CNI's subnet of its \
         node; no node holds a block of the project's"
    ));
    checks::assert_pods_reach_across_nodes(cluster, "default", &pods);
    say("pods reach each other across nodes (from inside the pods)");

    let ip = checks::expose(cluster, "default", WEB, WEB, false);
    let answer = cluster.wait_for(
        Duration::from_secs(30),
        &format!("the client's answer from {ip}"),
        |c| checks::client_get(c, ip),
    );
    say(&format!(
        "Service {WEB}: LoadBalancer IP {ip}, the client outside the cluster reached a pod on \
         {answer} through kube-proxy"
    ));

    let mut figures = Figures::default();
    scenario::power_losses(cluster, ip, losses, &mut figures, say);
    figures
}

/// The other CNI on every node: its configuration (host-local keeps its leases under `/run`,
/// which a reboot clears, as the nodes' own runtime state), and a route on each node to every
/// other node's pod subnet through that node.
fn install_other_cni(cluster: &KubeCluster) {
    for (i, node) in cluster.nodes.iter().enumerate() {
        let conf = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "lab-bridge",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": true,
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": "/run/cni-host-local",
                        "ranges": [[{ "subnet": pod_subnet(i) }]],
                        "routes": [{ "dst": "0.0.0.0/0" }]
                    }
                },
                { "type": "portmap", "capabilities": { "portMappings": true } }
            ]
        });
        let path = node.dir.join("cni-conf").join(CONFLIST);
        std::fs::write(&path, conf.to_string())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for (j, other) in cluster.nodes.iter().enumerate().filter(|(j, _)| *j != i) {
            node.ns.route_via(&pod_subnet(j), &other.ip.to_string());
        }
    }
}

/// Each node's CNI folders hold the other CNI's configuration and Debian's plugins alone.
fn assert_project_cni_absent(cluster: &KubeCluster) {
    for node in &cluster.nodes {
        for dir in ["cni-conf", "cni-bin"] {
            let names: Vec<String> = std::fs::read_dir(node.dir.join(dir))
                .unwrap_or_else(|e| panic!("{}'s {dir}: {e}", node.name))
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            for project in PROJECT_CNI {
                assert!(
                    !names.iter().any(|n| n == project),
                    "the add-on mode installed {project} on {}: {names:?}",
                    node.name
                );
            }
        }
        let confs = std::fs::read_dir(node.dir.join("cni-conf"))
            .expect("the node's CNI configuration folder")
            .count();
        assert_eq!(
            confs, 1,
            "{} has another CNI configuration beside the bridge",
            node.name
        );
    }
}

/// Every pod's addresses come from the other CNI's subnet of its node.
fn assert_addresses_from_the_other_cni(cluster: &KubeCluster, pods: &[PodAddresses]) {
    for pod in pods {
        let i = cluster
            .nodes
            .iter()
            .position(|n| n.name == pod.node)
            .unwrap_or_else(|| panic!("pod {} on an unknown node {}", pod.name, pod.node));
        assert!(
            !pod.ips.is_empty() && pod.ips.iter().all(|ip| in_pod_subnet(*ip, i)),
            "pod {} on {} has {:?}, not from the bridge's {}",
            pod.name,
            pod.node,
            pod.ips,
            pod_subnet(i)
        );
    }
}

/// The nodes' records (kept for the gossip and the announcers) hold no pod block.
fn assert_no_pod_blocks(cluster: &KubeCluster) {
    let records = cluster.get_json(&["nodeipams"]);
    for record in records["items"].as_array().into_iter().flatten() {
        let allocated = &record["status"]["allocated"];
        assert!(
            allocated.is_null() || allocated.as_array().is_some_and(Vec::is_empty),
            "node {} holds pod blocks in the add-on mode: {allocated}",
            record["metadata"]["name"]
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_subnet_holds_its_node_s_addresses_alone() {
        assert_eq!(pod_subnet(0), "10.200.1.0/24");
        assert!(in_pod_subnet("10.200.1.7".parse().unwrap(), 0));
        assert!(!in_pod_subnet("10.200.2.7".parse().unwrap(), 0));
        assert!(!in_pod_subnet("fd00::1".parse().unwrap(), 0));
    }
}
