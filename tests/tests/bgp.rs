//! Service IPs over BGP with real routers: three nodes whose agents drive BIRD, and a router
//! running FRR (another implementation) in a namespace of its own, with a client behind it on
//! another subnet. Real etcd, real agents, real sessions with TCP MD5 and BFD.
//!
//! One cluster for every phase (etcd and the agents start once): the router learns each
//! Service IP from every node (ECMP) and the client is served by more than one node; an
//! `externalTrafficPolicy: Local` Service only from the node with its endpoint; IPv6 over an
//! IPv6 session; adding Services resets no session; a wrong password or AS number leaves the
//! session down with a condition saying so on the BGPPeer; a node that loses power is withdrawn
//! by BFD, and one stopped cleanly at once.

use std::{
    collections::BTreeSet,
    io::{Read, Write},
    net::{IpAddr, SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use ipam_core::lb::{
    bgp::{BgpAdvertisement, BgpPeer},
    resources::{
        LbIpPool, Service, ServiceEndpoint, ServiceEndpoints, ServiceEndpointsSpec, TrafficPolicy,
    },
};
use ipam_tests::{
    TempDir,
    bgp_router::FrrRouter,
    cluster::{Cluster, UPLINK, node_addresses, wait_until},
    failover::lb_service,
    netns::{Netns, veth},
};
use serde_json::json;

const PORT: u16 = 8080;
const ROUTER_V4: &str = "10.77.0.200";
const ROUTER_V6: &str = "fd77::200";
const PASSWORD: &str = "fabric-key-1";

/// The router's bgpd: the three nodes as eBGP neighbours over both families, with the
/// password, short timers (hold 3 s) and BFD.
fn router_config(nodes: usize) -> String {
    let mut text = String::from(
        "router bgp 64500\n bgp router-id 10.77.0.200\n no bgp ebgp-requires-policy\n \
         no bgp default ipv4-unicast\n bgp bestpath as-path multipath-relax\n",
    );
    for i in 0..nodes {
        let (v4, v6) = node_addresses(i);
        for n in [v4, v6] {
            text.push_str(&format!(
                " neighbor {n} remote-as 64512\n neighbor {n} password {PASSWORD}\n \
                 neighbor {n} timers 1 3\n neighbor {n} timers connect 1\n neighbor {n} bfd\n neighbor {n} bfd profile fast\n"
            ));
        }
    }
    for (family, v6) in [("ipv4", false), ("ipv6", true)] {
        text.push_str(&format!(
            " address-family {family} unicast\n  maximum-paths 8\n"
        ));
        for i in 0..nodes {
            let (v4, v6_address) = node_addresses(i);
            let n = if v6 { v6_address } else { v4 };
            text.push_str(&format!("  neighbor {n} activate\n"));
        }
        text.push_str(" exit-address-family\n");
    }
    text
}

fn peer(address: &str, password: &str, local_asn: u32) -> BgpPeer {
    serde_json::from_value(json!({ "spec": {
        "peerAddress": address, "peerASN": 64500, "localASN": local_asn,
        "password": password, "holdTimeSeconds": 3, "connectRetryTimeSeconds": 1,
        "bfd": { "receiveIntervalMs": 100, "transmitIntervalMs": 100, "detectMultiplier": 3 }
    }}))
    .expect("a BGPPeer")
}

fn pool(cidrs: &[&str]) -> LbIpPool {
    let blocks: Vec<_> = cidrs.iter().map(|c| json!({ "cidr": c })).collect();
    serde_json::from_value(json!({ "spec": { "blocks": blocks } })).expect("a pool")
}

fn ip_of(c: &Cluster, service: &str, v6: bool) -> Option<IpAddr> {
    c.list::<Service>()
        .into_iter()
        .find(|s| s.name == service)?
        .value
        .status
        .ingress
        .into_iter()
        .find(|ip| ip.is_ipv6() == v6)
}

/// The nodes the router's route to `ip` leads to, by index: a next hop is a node's address on
/// the segment, or for IPv6 its link-local one (FRR installs that when the node sends both).
fn routed_to(router: &FrrRouter, c: &Cluster, ip: IpAddr) -> Vec<usize> {
    let mut out: Vec<usize> = router
        .next_hops(ip)
        .into_iter()
        .filter_map(|hop| {
            c.nodes
                .iter()
                .position(|n| n.ns.addresses(UPLINK).iter().any(|(a, _)| *a == hop))
        })
        .collect();
    out.sort_unstable();
    out
}

/// Waits until the router's route to `ip` leads to exactly `nodes`.
fn wait_for_hops(router: &FrrRouter, c: &Cluster, ip: IpAddr, nodes: &[usize], what: &str) {
    wait_until(
        Duration::from_secs(30),
        what,
        || routed_to(router, c, ip) == nodes,
        || {
            format!(
                "router's next hops for {ip}: {:?}, wanted nodes {nodes:?}\n{}\n{}\nnode-0's log:\n{}",
                router.next_hops(ip),
                router.vtysh(&["show bgp summary"]),
                router.logs(),
                c.nodes[0].log()
            )
        },
    );
}

/// A backend in each node's namespace: answers every connection with the node's name.
struct Backends {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Backends {
    fn start(c: &Cluster) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for node in &c.nodes {
            let (name, stop) = (node.name.clone(), stop.clone());
            threads.push(node.ns.spawn(move || serve(&name, &stop)));
        }
        Self { stop, threads }
    }
}

impl Drop for Backends {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One listener on `[::]` takes both families (IPv4 as mapped addresses).
fn serve(node: &str, stop: &AtomicBool) {
    let listener = TcpListener::bind(("::", PORT)).expect("backend listens");
    listener.set_nonblocking(true).expect("non-blocking");
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((mut conn, _)) => {
                let _ = conn.write_all(node.as_bytes());
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// The nodes that answered `count` connections from the client to `ip`.
fn served_by(client: &Netns, ip: IpAddr, count: usize) -> Vec<Option<String>> {
    client.run(move || {
        (0..count)
            .map(|_| {
                let mut s = TcpStream::connect_timeout(
                    &SocketAddr::new(ip, PORT),
                    Duration::from_millis(500),
                )
                .ok()?;
                s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
                let mut name = String::new();
                s.read_to_string(&mut name).ok()?;
                Some(name)
            })
            .collect()
    })
}

fn session_of(c: &Cluster, peer: &str, node: &str) -> Option<(String, String)> {
    let p = c.list::<BgpPeer>().into_iter().find(|p| p.name == peer)?;
    let s = p.value.status.nodes.into_iter().find(|n| n.node == node)?;
    Some((s.state, s.reason))
}

fn established_condition(c: &Cluster, peer: &str) -> Option<(bool, String)> {
    let p = c.list::<BgpPeer>().into_iter().find(|p| p.name == peer)?;
    let cond = p
        .value
        .status
        .conditions
        .into_iter()
        .find(|c| c.kind == "Established")?;
    Some((cond.status, cond.message))
}

#[test]
fn service_ips_are_routed_over_bgp_by_a_real_router() {
    let mut c = Cluster::start_add_on("bg", 1);
    // The router and the client behind it.
    let router_ns = Netns::new("bgr");
    veth(&router_ns, "up0", &c.fabric, "rtr");
    c.fabric.add_port("rtr", "br0");
    router_ns.add_address("up0", &format!("{ROUTER_V4}/24"));
    router_ns.add_address("up0", &format!("{ROUTER_V6}/64"));
    let client = Netns::new("bgc");
    veth(&router_ns, "c0", &client, "eth0");
    router_ns.add_address("c0", "10.78.0.1/24");
    router_ns.add_address("c0", "fd78::1/64");
    client.add_address("eth0", "10.78.0.100/24");
    client.add_address("eth0", "fd78::100/64");
    client.route_via("0.0.0.0/0", "10.78.0.1");
    client.route_via("::/0", "fd78::1");

    let nodes = 3;
    let router = FrrRouter::start(router_ns, &router_config(nodes));
    let run_dirs: Vec<TempDir> = (0..nodes).map(|_| TempDir::new("bgp-run-")).collect();
    for dir in &run_dirs {
        c.add_node_with(
            "bg",
            &format!(
                "[bgp]\nrun_dir = \"{}\"\nstatus_interval_ms = 200\n",
                dir.0.display()
            ),
        );
    }
    // The way back to the client's subnet (the agents import no routes).
    for node in &c.nodes {
        node.ns.route_via("10.78.0.0/24", ROUTER_V4);
        node.ns.route_via("fd78::/64", ROUTER_V6);
    }
    let _backends = Backends::start(&c);

    c.put("routed", &pool(&["198.51.100.0/28", "2001:db8:100::/124"]));
    c.put("tor", &peer(ROUTER_V4, PASSWORD, 64512));
    c.put("tor6", &peer(ROUTER_V6, PASSWORD, 64512));
    c.put(
        "all",
        &serde_json::from_value::<BgpAdvertisement>(json!({ "spec": {} })).unwrap(),
    );
    let mut web = lb_service(PORT);
    web.spec.ip_families = vec![ipam_core::Family::V4, ipam_core::Family::V6];
    web.spec.ip_family_policy = ipam_core::lb::resources::IpFamilyPolicy::RequireDualStack;
    c.put("default/web", &web);
    wait_until(
        Duration::from_secs(20),
        "an IPv4 and an IPv6 address for default/web",
        || ip_of(&c, "default/web", false).is_some() && ip_of(&c, "default/web", true).is_some(),
        || format!("{:?}", c.list::<Service>()),
    );
    let web_v4 = ip_of(&c, "default/web", false).unwrap();
    let web_v6 = ip_of(&c, "default/web", true).unwrap();

    // ECMP: every node is a next hop, and the client is served by more than one.
    wait_for_hops(
        &router,
        &c,
        web_v4,
        &[0, 1, 2],
        "web's IPv4 route over the three nodes",
    );
    wait_for_hops(
        &router,
        &c,
        web_v6,
        &[0, 1, 2],
        "web's IPv6 route over the three nodes",
    );
    for ip in [web_v4, web_v6] {
        let answers = served_by(&client, ip, 40);
        let by: BTreeSet<_> = answers.iter().flatten().cloned().collect();
        assert!(
            answers.iter().all(Option::is_some),
            "every connection to {ip} is served: {answers:?}"
        );
        assert!(by.len() >= 2, "ECMP spreads connections to {ip}: {by:?}");
    }
    for (peer, node) in [("tor", "node-0"), ("tor6", "node-2")] {
        wait_until(
            Duration::from_secs(10),
            "the session in the BGPPeer's status",
            || session_of(&c, peer, node).is_some_and(|(state, _)| state == "Established"),
            || format!("{:?}", c.list::<BgpPeer>()),
        );
    }
    let log = c.nodes[0].log();
    assert!(log.contains("BGP session established"), "{log}");
    let view = c.ipamctl(0, &["bgp"]);
    for node in ["node-0", "node-1", "node-2"] {
        assert!(
            view.lines()
                .any(|l| l.contains("tor6") && l.contains(node) && l.contains("Established")),
            "ipamctl bgp lists {node}'s session:\n{view}"
        );
    }

    // Local: only the node with a ready endpoint; more Services reset no session.
    let established_before: Vec<u64> = (0..nodes)
        .map(|i| router.sessions_established(node_addresses(i).0.parse().unwrap()))
        .collect();
    let mut local = lb_service(PORT);
    local.spec.external_traffic_policy = TrafficPolicy::Local;
    c.put("default/local", &local);
    c.put(
        "default/local",
        &ServiceEndpoints {
            spec: ServiceEndpointsSpec {
                service: "default/local".into(),
                endpoints: vec![ServiceEndpoint {
                    node_name: "node-1".into(),
                    ready: true,
                }],
            },
        },
    );
    for i in 0..5 {
        c.put(&format!("default/more-{i}"), &lb_service(PORT));
    }
    wait_until(
        Duration::from_secs(20),
        "an address for default/local",
        || ip_of(&c, "default/local", false).is_some(),
        || format!("{:?}", c.list::<Service>()),
    );
    let local_ip = ip_of(&c, "default/local", false).unwrap();
    wait_for_hops(
        &router,
        &c,
        local_ip,
        &[1],
        "default/local's route from node-1 alone",
    );
    let served: BTreeSet<_> = served_by(&client, local_ip, 10).into_iter().collect();
    assert_eq!(served, [Some("node-1".to_owned())].into());
    for i in 0..5 {
        let ip = ip_of(&c, &format!("default/more-{i}"), false);
        let ip = ip.expect("more services get addresses");
        wait_for_hops(&router, &c, ip, &[0, 1, 2], "the new Services' routes");
    }
    let established_after: Vec<u64> = (0..nodes)
        .map(|i| router.sessions_established(node_addresses(i).0.parse().unwrap()))
        .collect();
    assert_eq!(
        established_before, established_after,
        "adding Services must not reset any session"
    );
    assert!(
        established_after.iter().all(|n| *n >= 1),
        "{established_after:?}"
    );

    // A wrong password: the session stays down and the peer says why.
    c.put("tor", &peer(ROUTER_V4, "not-the-fabric-key", 64512));
    wait_until(
        Duration::from_secs(20),
        "an AuthenticationFailed reason on the BGPPeer",
        || {
            session_of(&c, "tor", "node-0")
                .is_some_and(|(_, reason)| reason.starts_with("AuthenticationFailed"))
        },
        || format!("{:?}\n{}", c.list::<BgpPeer>(), c.nodes[0].log()),
    );
    let (up, message) = established_condition(&c, "tor").expect("an Established condition");
    assert!(!up && message.contains("password"), "{message}");
    let view = c.ipamctl(0, &["bgp"]);
    assert!(
        view.lines().any(|l| l.contains("tor ")
            && l.contains("node-0")
            && l.contains("AuthenticationFailed")),
        "ipamctl bgp shows why the session is down:\n{view}"
    );
    assert!(
        router.next_hops(web_v4).is_empty(),
        "no IPv4 route without a session"
    );
    // A wrong AS number, said as such.
    c.put("tor", &peer(ROUTER_V4, PASSWORD, 64513));
    wait_until(
        Duration::from_secs(20),
        "an ASNMismatch reason on the BGPPeer",
        || {
            session_of(&c, "tor", "node-0")
                .is_some_and(|(_, reason)| reason.starts_with("ASNMismatch"))
        },
        || format!("{:?}\n{}", c.list::<BgpPeer>(), c.nodes[0].log()),
    );
    c.put("tor", &peer(ROUTER_V4, PASSWORD, 64512));
    wait_for_hops(
        &router,
        &c,
        web_v4,
        &[0, 1, 2],
        "the sessions back with the password",
    );
    wait_until(
        Duration::from_secs(10),
        "the Established condition true again",
        || established_condition(&c, "tor").is_some_and(|(up, _)| up),
        || format!("{:?}", c.list::<BgpPeer>()),
    );

    // Power loss of node-2 (link first, so BIRD cannot say goodbye): BFD withdraws it.
    c.nodes[2].ns.down(UPLINK);
    let lost = Instant::now();
    if let Some(d) = c.nodes[2].daemon.take() {
        d.kill();
    }
    wait_for_hops(&router, &c, web_v4, &[0, 1], "node-2's route withdrawn");
    println!(
        "power loss to withdrawal: {:?} (BFD 3 x 100 ms)",
        lost.elapsed()
    );
    let answers = served_by(&client, web_v4, 20);
    assert!(
        answers
            .iter()
            .all(|a| a.as_deref().is_some_and(|n| n != "node-2")),
        "the survivors serve: {answers:?}"
    );
    // A clean stop of node-1: BIRD closes its sessions, the route goes at once.
    let stopped = Instant::now();
    c.nodes[1].daemon.take().expect("node-1 runs").terminate();
    wait_for_hops(
        &router,
        &c,
        web_v4,
        &[0],
        "node-1's route withdrawn on its stop",
    );
    println!("clean stop to withdrawal: {:?}", stopped.elapsed());
    assert!(
        router.next_hops(local_ip).is_empty(),
        "default/local had only node-1"
    );
}
