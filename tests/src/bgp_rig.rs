//! A routed fabric for the BGP test, benchmark and lab: a cluster of agents with `[bgp]` on
//! one segment, an FRR router on the same segment peering with every node (both families,
//! TCP MD5, hold time 3 s, BFD 3 x 100 ms where asked), a client behind the router on a subnet of
//! its own, and a backend on every node answering with the node's name.

use std::{net::IpAddr, time::Duration};

use ipam_core::lb::{
    bgp::{BgpAdvertisement, BgpPeer},
    resources::{LbIpPool, Service},
};
use serde_json::json;

use crate::{
    TempDir,
    bgp_router::FrrRouter,
    cluster::{Cluster, UPLINK, node_addresses, wait_until},
    netns::{Netns, veth},
    traffic::{Backends, request},
};

pub use crate::traffic::PORT;
pub const ROUTER_V4: &str = "10.77.0.200";
pub const ROUTER_V6: &str = "fd77::200";
pub const PASSWORD: &str = "fabric-key-1";
/// The client behind the router.
pub const CLIENT_V4: &str = "10.78.0.100";

/// The router's bgpd: each node as an eBGP neighbour over both families, with the password,
/// hold time 3 s, and BFD (profile `fast`, 3 x 100 ms) when `bfd`. `extra` neighbours (IPv4,
/// same AS) join them, for a reference speaker.
pub fn router_config(nodes: usize, bfd: bool, extra: &[&str]) -> String {
    let mut text = String::from(
        "router bgp 64500\n bgp router-id 10.77.0.200\n no bgp ebgp-requires-policy\n \
         no bgp default ipv4-unicast\n bgp bestpath as-path multipath-relax\n",
    );
    let mut v4: Vec<String> = (0..nodes).map(|i| node_addresses(i).0).collect();
    v4.extend(extra.iter().map(|a| (*a).to_owned()));
    let v6: Vec<String> = (0..nodes).map(|i| node_addresses(i).1).collect();
    for n in v4.iter().chain(&v6) {
        text.push_str(&format!(
            " neighbor {n} remote-as 64512\n neighbor {n} password {PASSWORD}\n \
             neighbor {n} timers 1 3\n neighbor {n} timers connect 1\n"
        ));
        if bfd {
            text.push_str(&format!(
                " neighbor {n} bfd\n neighbor {n} bfd profile fast\n"
            ));
        }
    }
    for (family, neighbours) in [("ipv4", &v4), ("ipv6", &v6)] {
        text.push_str(&format!(
            " address-family {family} unicast\n  maximum-paths 16\n"
        ));
        for n in neighbours {
            text.push_str(&format!("  neighbor {n} activate\n"));
        }
        text.push_str(" exit-address-family\n");
    }
    text
}

/// A BGPPeer for the router: the password, hold time 3 s, BFD 3 x 100 ms when `bfd`.
pub fn peer(address: &str, password: &str, local_asn: u32, bfd: bool) -> BgpPeer {
    let mut spec = json!({
        "peerAddress": address, "peerASN": 64500, "localASN": local_asn,
        "password": password, "holdTimeSeconds": 3, "connectRetryTimeSeconds": 1,
    });
    if bfd {
        spec["bfd"] =
            json!({ "receiveIntervalMs": 100, "transmitIntervalMs": 100, "detectMultiplier": 3 });
    }
    serde_json::from_value(json!({ "spec": spec })).expect("a BGPPeer")
}

pub fn pool(cidrs: &[&str]) -> LbIpPool {
    let blocks: Vec<_> = cidrs.iter().map(|c| json!({ "cidr": c })).collect();
    serde_json::from_value(json!({ "spec": { "blocks": blocks } })).expect("a pool")
}

pub struct BgpRig {
    pub cluster: Cluster,
    pub router: FrrRouter,
    pub client: Netns,
    /// Each node's addresses on the segment, link-local ones too, as at the start (a node
    /// whose link is down shows none).
    node_addresses: Vec<Vec<IpAddr>>,
    _run_dirs: Vec<TempDir>,
    backends: Backends,
}

impl BgpRig {
    /// `nodes` agents peering with the router (`bfd` on both sides or neither), the pool
    /// `routed` (198.51.100.0/22, 2001:db8:100::/120), the peers `tor` and `tor6`, and the
    /// advertisement `all`; `extra` router neighbours for a reference speaker.
    pub fn start(tag: &str, nodes: usize, bfd: bool, extra: &[&str]) -> Self {
        Self::start_prepared(tag, nodes, bfd, extra, |_| ())
    }

    /// As [`BgpRig::start`], with `prepare` done to the cluster before its agents are added
    /// (the gossip enabled, another segment added).
    pub fn start_prepared(
        tag: &str,
        nodes: usize,
        bfd: bool,
        extra: &[&str],
        prepare: impl FnOnce(&mut Cluster),
    ) -> Self {
        let mut cluster = Cluster::start_add_on(tag, 1);
        prepare(&mut cluster);
        let router_ns = Netns::new(&format!("{tag}r"));
        veth(&router_ns, "up0", &cluster.fabric, &format!("{tag}rt"));
        cluster.fabric.add_port(&format!("{tag}rt"), "br0");
        router_ns.add_address("up0", &format!("{ROUTER_V4}/24"));
        router_ns.add_address("up0", &format!("{ROUTER_V6}/64"));
        let client = Netns::new(&format!("{tag}c"));
        veth(&router_ns, "c0", &client, "eth0");
        router_ns.add_address("c0", "10.78.0.1/24");
        router_ns.add_address("c0", "fd78::1/64");
        client.add_address("eth0", &format!("{CLIENT_V4}/24"));
        client.add_address("eth0", "fd78::100/64");
        client.route_via("0.0.0.0/0", "10.78.0.1");
        client.route_via("::/0", "fd78::1");
        let router = FrrRouter::start(router_ns, &router_config(nodes, bfd, extra));
        let run_dirs: Vec<TempDir> = (0..nodes).map(|_| TempDir::new("bgp-run-")).collect();
        for dir in &run_dirs {
            cluster.add_node_with(
                tag,
                &format!(
                    "[bgp]\nrun_dir = \"{}\"\nstatus_interval_ms = 200\n",
                    dir.0.display()
                ),
            );
        }
        for node in &cluster.nodes {
            route_back(&node.ns);
        }
        let backends = Backends::start(&cluster);
        cluster.put("routed", &pool(&["198.51.100.0/22", "2001:db8:100::/120"]));
        cluster.put("tor", &peer(ROUTER_V4, PASSWORD, 64512, bfd));
        cluster.put("tor6", &peer(ROUTER_V6, PASSWORD, 64512, bfd));
        cluster.put(
            "all",
            &serde_json::from_value::<BgpAdvertisement>(json!({ "spec": {} })).unwrap(),
        );
        let node_addresses = cluster
            .nodes
            .iter()
            .map(|n| n.ns.addresses(UPLINK).into_iter().map(|(a, _)| a).collect())
            .collect();
        Self {
            cluster,
            router,
            client,
            node_addresses,
            _run_dirs: run_dirs,
            backends,
        }
    }

    /// The MACs that answer ARP (IPv4) or a neighbour solicitation (IPv6) for `ip` on the
    /// segment, asked from the router's port on it, as any host there would ask: what decides
    /// where the segment sends the IP's traffic. Lower-case `aa:bb:...`.
    pub fn answering_macs(&self, ip: IpAddr) -> std::collections::BTreeSet<String> {
        let ip = ip.to_string();
        let output = if ip.contains(':') {
            self.router
                .ns
                .command("ndisc6")
                .args(["-m", "-n", "-r", "3", "-w", "300", &ip, "up0"])
                .output()
        } else {
            self.router
                .ns
                .command("arping")
                .args(["-I", "up0", "-c", "3", "-w", "3", &ip])
                .output()
        }
        .expect("arping and ndisc6 are installed (cargo xtask setup)");
        let text = String::from_utf8_lossy(&output.stdout).to_lowercase();
        text.lines()
            .filter_map(|line| {
                // Debian's arping: "58 bytes from MAC (IP): index=0 ..."; ndisc6: "Target
                // link-layer address: MAC".
                let mac = match line.split_once(" bytes from ") {
                    Some((_, rest)) => rest.split(' ').next()?,
                    None => line.strip_prefix("target link-layer address:")?.trim(),
                };
                (mac.len() == 17).then(|| mac.to_owned())
            })
            .collect()
    }

    /// A power loss of node `index`: its link cut first (BIRD cannot say goodbye), then its
    /// agent killed.
    pub fn power_off(&mut self, index: usize) {
        let node = &mut self.cluster.nodes[index];
        node.ns.down(UPLINK);
        if let Some(d) = node.daemon.take() {
            d.kill();
        }
    }

    /// Node `index` back: its link up with what the kernel flushed when it went down (the
    /// IPv6 address, the routes through it), and its agent started.
    pub fn power_on(&mut self, index: usize) {
        let node = &mut self.cluster.nodes[index];
        node.ns.up(UPLINK);
        let v6: IpAddr = node_addresses(index).1.parse().unwrap();
        if !node.ns.addresses(UPLINK).iter().any(|(a, _)| *a == v6) {
            node.ns.add_address(UPLINK, &format!("{v6}/64"));
        }
        route_back(&node.ns);
        node.start();
    }

    /// The Service's address of the family, once LB-IPAM gave one.
    pub fn ip_of(&self, service: &str, v6: bool) -> Option<IpAddr> {
        ip_of(&self.cluster, service, v6)
    }

    /// Waits until `service` has an address of the family.
    pub fn wait_for_ip(&self, service: &str, v6: bool) -> IpAddr {
        wait_until(
            Duration::from_secs(30),
            &format!("an address for {service}"),
            || self.ip_of(service, v6).is_some(),
            || format!("{:?}", self.cluster.list::<Service>()),
        );
        self.ip_of(service, v6).unwrap()
    }

    /// The nodes the router's route to `ip` leads to, by index: a next hop is a node's address
    /// on the segment, or for IPv6 its link-local one (FRR installs that when the node sends
    /// both).
    pub fn routed_to(&self, ip: IpAddr) -> Vec<usize> {
        let mut out: Vec<usize> = self
            .router
            .next_hops(ip)
            .into_iter()
            .filter_map(|hop| self.node_addresses.iter().position(|a| a.contains(&hop)))
            .collect();
        out.sort_unstable();
        out
    }

    /// Waits until the router's route to `ip` leads to exactly `nodes`.
    pub fn wait_for_hops(&self, ip: IpAddr, nodes: &[usize], what: &str) {
        wait_until(
            Duration::from_secs(30),
            what,
            || self.routed_to(ip) == nodes,
            || {
                format!(
                    "router's next hops for {ip}: {:?}, wanted nodes {nodes:?}\n{}\n{}\nnode-0's \
                     log:\n{}",
                    self.router.next_hops(ip),
                    self.router.vtysh(&["show bgp summary"]),
                    self.router.logs(),
                    self.cluster.nodes[0].log()
                )
            },
        );
    }

    /// How many times the router's session with each node came up, over IPv4 and IPv6.
    pub fn sessions_established(&self) -> Vec<(u64, u64)> {
        (0..self.cluster.nodes.len())
            .map(|i| {
                let (v4, v6) = node_addresses(i);
                let count = |a: String| self.router.sessions_established(a.parse().unwrap());
                (count(v4), count(v6))
            })
            .collect()
    }

    /// Puts `peers` (a change of the peers' own settings, which BIRD applies by restarting
    /// their sessions) and waits until every node's sessions of the families they are for came
    /// up again and `ip` is routed over every node: traffic checked before then would meet
    /// the reset, not what is tested.
    pub fn put_peers_and_wait(&self, peers: &[(&str, &BgpPeer)], ip: IpAddr) {
        let before = self.sessions_established();
        for (name, spec) in peers {
            self.cluster.put(name, *spec);
        }
        let (v4, v6) = (
            peers.iter().any(|(_, p)| p.spec.peer_address.is_ipv4()),
            peers.iter().any(|(_, p)| p.spec.peer_address.is_ipv6()),
        );
        wait_until(
            Duration::from_secs(30),
            "every node's changed sessions established again",
            || {
                let now = self.sessions_established();
                let up = |i: usize, v6: bool| {
                    let (v4_address, v6_address) = node_addresses(i);
                    let address = if v6 { v6_address } else { v4_address };
                    self.router
                        .vtysh(&[&format!("show bgp neighbors {address} json")])
                        .contains("\"bgpState\":\"Established\"")
                };
                now.iter().zip(&before).enumerate().all(|(i, (now, was))| {
                    (!v4 || (now.0 > was.0 && up(i, false)))
                        && (!v6 || (now.1 > was.1 && up(i, true)))
                })
            },
            || {
                format!(
                    "sessions established before {before:?}, now {:?}\n{}",
                    self.sessions_established(),
                    self.router.vtysh(&["show bgp summary"])
                )
            },
        );
        let all: Vec<usize> = (0..self.cluster.nodes.len()).collect();
        self.wait_for_hops(
            ip,
            &all,
            "the route over every node after the sessions' reset",
        );
    }

    /// The node that answered each of `count` connections from the client to `ip` (`None`:
    /// not answered within 500 ms).
    pub fn served_by(&self, ip: IpAddr, count: usize) -> Vec<Option<String>> {
        self.client.run(move || {
            (0..count)
                .map(|_| request(ip, Duration::from_millis(500)))
                .collect()
        })
    }

    /// One request from the client.
    pub fn request(&self, ip: IpAddr, timeout: Duration) -> Option<String> {
        self.client.run(move || request(ip, timeout))
    }

    /// Stops the backends (before the cluster goes).
    pub fn stop_backends(&mut self) {
        self.backends.stop();
    }
}

/// The way back to the client's subnet through the router (the agents import no routes).
fn route_back(ns: &Netns) {
    for (cidr, via) in [("10.78.0.0/24", ROUTER_V4), ("fd78::/64", ROUTER_V6)] {
        let (net, len) = cidr.split_once('/').unwrap();
        let (net, len): (IpAddr, u8) = (net.parse().unwrap(), len.parse().unwrap());
        let present = ns
            .routes(net.is_ipv6())
            .iter()
            .any(|r| r.destination == net && r.prefix_len == len);
        if !present {
            ns.route_via(cidr, via);
        }
    }
}

pub fn ip_of(c: &Cluster, service: &str, v6: bool) -> Option<IpAddr> {
    c.list::<Service>()
        .into_iter()
        .find(|s| s.name == service)?
        .value
        .status
        .ingress
        .into_iter()
        .find(|ip| ip.is_ipv6() == v6)
}

/// The state and reason of `node`'s session with `peer`, from the peer's status.
pub fn session_of(c: &Cluster, peer: &str, node: &str) -> Option<(String, String)> {
    let p = c.list::<BgpPeer>().into_iter().find(|p| p.name == peer)?;
    let s = p.value.status.nodes.into_iter().find(|n| n.node == node)?;
    Some((s.state, s.reason))
}

/// The peer's `Established` condition: whether it holds, and its message.
pub fn established_condition(c: &Cluster, peer: &str) -> Option<(bool, String)> {
    let p = c.list::<BgpPeer>().into_iter().find(|p| p.name == peer)?;
    let cond = p
        .value
        .status
        .conditions
        .into_iter()
        .find(|c| c.kind == "Established")?;
    Some((cond.status, cond.message))
}
