//! Service IPs over BGP with real routers: three nodes whose agents drive BIRD, and a router
//! running FRR (another implementation) in a namespace of its own, with a client behind it on
//! another subnet (`ipam_tests::bgp_rig`). Real etcd, real agents, real sessions with TCP MD5
//! and BFD.
//!
//! One cluster for every phase (etcd and the agents start once): the router learns each
//! Service IP from every node (ECMP) and the client is served by more than one node; an
//! `externalTrafficPolicy: Local` Service only from the node with a ready endpoint (withdrawn
//! when it is no longer ready, back when it is again); IPv6 over an IPv6 session; adding
//! Services resets no session; Cilium's BGP resources converted by `ipamctl migrate` and applied
//! take over (their community reaches the router); two Services of a pool chosen by its labels
//! reach the router as one aggregate (`aggregationLength`) and no host route; an IP answered for over L2 by one node and
//! advertised over BGP keeps its address on that node when BGP lets it go; a node drained by
//! the exclusion label and a reload withdraws its routes but keeps its sessions; a wrong password or AS number leaves the session down with a
//! condition saying so on the BGPPeer; a restart of an agent said as one (`on_stop =
//! "restart"`) with graceful restart on the peer costs no request to a Service only it
//! advertises; a node that loses power is withdrawn by BFD, and one stopped cleanly at once.

use std::{collections::BTreeSet, net::IpAddr, time::Duration};

use ipam_core::lb::bgp::GracefulRestart;
use ipam_core::lb::resources::{
    IpFamilyPolicy, ServiceEndpoint, ServiceEndpoints, ServiceEndpointsSpec, TrafficPolicy,
};
use ipam_tests::{
    bgp_rig::{
        BgpRig, PASSWORD, PORT, ROUTER_V4, ROUTER_V6, established_condition, peer, session_of,
    },
    cluster::{node_addresses, wait_until},
    failover::{lb_service, uplink_policy},
    traffic::RequestLoop,
};
use serde_json::json;

#[test]
fn service_ips_are_routed_over_bgp_by_a_real_router() {
    let nodes = 3;
    let mut rig = BgpRig::start("bg", nodes, true, &[]);
    let mut web = lb_service(PORT);
    web.spec.ip_families = vec![ipam_core::Family::V4, ipam_core::Family::V6];
    web.spec.ip_family_policy = IpFamilyPolicy::RequireDualStack;
    rig.cluster.put("default/web", &web);
    let web_v4 = rig.wait_for_ip("default/web", false);
    let web_v6 = rig.wait_for_ip("default/web", true);

    // ECMP: every node is a next hop, and the client is served by more than one.
    rig.wait_for_hops(web_v4, &[0, 1, 2], "web's IPv4 route over the three nodes");
    rig.wait_for_hops(web_v6, &[0, 1, 2], "web's IPv6 route over the three nodes");
    for ip in [web_v4, web_v6] {
        let answers = rig.served_by(ip, 40);
        let by: BTreeSet<_> = answers.iter().flatten().cloned().collect();
        assert!(
            answers.iter().all(Option::is_some),
            "every connection to {ip} is served: {answers:?}"
        );
        assert!(by.len() >= 2, "ECMP spreads connections to {ip}: {by:?}");
    }
    let c = &rig.cluster;
    for (peer, node) in [("tor", "node-0"), ("tor6", "node-2")] {
        wait_until(
            Duration::from_secs(10),
            "the session in the BGPPeer's status",
            || session_of(c, peer, node).is_some_and(|(state, _)| state == "Established"),
            || format!("{:?}", c.list::<ipam_core::lb::bgp::BgpPeer>()),
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
    let sessions = |rig: &BgpRig| -> Vec<u64> {
        (0..nodes)
            .map(|i| {
                let address: IpAddr = node_addresses(i).0.parse().unwrap();
                rig.router.sessions_established(address)
            })
            .collect()
    };
    let established_before = sessions(&rig);
    let mut local = lb_service(PORT);
    local.spec.external_traffic_policy = TrafficPolicy::Local;
    rig.cluster.put("default/local", &local);
    rig.cluster
        .put("default/local", &local_endpoint_on_node_1(true));
    for i in 0..5 {
        rig.cluster
            .put(&format!("default/more-{i}"), &lb_service(PORT));
    }
    let local_ip = rig.wait_for_ip("default/local", false);
    rig.wait_for_hops(local_ip, &[1], "default/local's route from node-1 alone");
    let served: BTreeSet<_> = rig.served_by(local_ip, 10).into_iter().collect();
    assert_eq!(served, [Some("node-1".to_owned())].into());
    for i in 0..5 {
        let ip = rig.wait_for_ip(&format!("default/more-{i}"), false);
        rig.wait_for_hops(ip, &[0, 1, 2], "the new Services' routes");
    }
    // The endpoint no longer ready: its node withdraws the route, and nothing advertises it.
    rig.cluster
        .put("default/local", &local_endpoint_on_node_1(false));
    rig.wait_for_hops(
        local_ip,
        &[],
        "default/local withdrawn with its last ready endpoint",
    );
    rig.cluster
        .put("default/local", &local_endpoint_on_node_1(true));
    rig.wait_for_hops(local_ip, &[1], "default/local back from node-1");
    let established_after = sessions(&rig);
    assert_eq!(
        established_before, established_after,
        "adding Services must not reset any session"
    );
    assert!(
        established_after.iter().all(|n| *n >= 1),
        "{established_after:?}"
    );

    // One Service answered for over L2 and advertised over BGP: its address on `lo` is shared.
    l2_and_bgp_share_the_address(&rig);

    // A drain without a restart: the exclusion label and a reload withdraw node-0's routes
    // while its sessions stay up; removing the label brings them back.
    drain_by_label(&rig, web_v4);

    // Cilium's BGP resources, converted by `ipamctl migrate` and applied: the converted peers
    // (the password added where the conversion says to) carry the converted advertisement,
    // whose community reaches the router.
    migrate_from_cilium(&rig, web_v4);

    // Route aggregation (MetalLB's aggregationLength): two Services of one pool reach the
    // router as one /28 from every node, and no host route of theirs does.
    aggregation(&rig);

    // A wrong password: the session stays down and the peer says why.
    let c = &rig.cluster;
    c.put("tor", &peer(ROUTER_V4, "not-the-fabric-key", 64512, true));
    wait_until(
        Duration::from_secs(20),
        "an AuthenticationFailed reason on the BGPPeer",
        || {
            session_of(c, "tor", "node-0")
                .is_some_and(|(_, reason)| reason.starts_with("AuthenticationFailed"))
        },
        || {
            format!(
                "{:?}\n{}",
                c.list::<ipam_core::lb::bgp::BgpPeer>(),
                c.nodes[0].log()
            )
        },
    );
    let (up, message) = established_condition(c, "tor").expect("an Established condition");
    assert!(!up && message.contains("password"), "{message}");
    let view = c.ipamctl(0, &["bgp"]);
    assert!(
        view.lines().any(|l| l.contains("tor ")
            && l.contains("node-0")
            && l.contains("AuthenticationFailed")),
        "ipamctl bgp shows why the session is down:\n{view}"
    );
    assert!(
        rig.router.next_hops(web_v4).is_empty(),
        "no IPv4 route without a session"
    );
    // A wrong AS number, said as such.
    c.put("tor", &peer(ROUTER_V4, PASSWORD, 64513, true));
    wait_until(
        Duration::from_secs(20),
        "an ASNMismatch reason on the BGPPeer",
        || {
            session_of(c, "tor", "node-0")
                .is_some_and(|(_, reason)| reason.starts_with("ASNMismatch"))
        },
        || {
            format!(
                "{:?}\n{}",
                c.list::<ipam_core::lb::bgp::BgpPeer>(),
                c.nodes[0].log()
            )
        },
    );
    c.put("tor", &peer(ROUTER_V4, PASSWORD, 64512, true));
    rig.wait_for_hops(web_v4, &[0, 1, 2], "the sessions back with the password");
    wait_until(
        Duration::from_secs(10),
        "the Established condition true again",
        || established_condition(c, "tor").is_some_and(|(up, _)| up),
        || format!("{:?}", c.list::<ipam_core::lb::bgp::BgpPeer>()),
    );

    planned_restart(&mut rig, local_ip, web_v4);

    // Power loss of node-2 (link first, so BIRD cannot say goodbye): BFD withdraws it.
    let lost = std::time::Instant::now();
    rig.power_off(2);
    rig.wait_for_hops(web_v4, &[0, 1], "node-2's route withdrawn");
    println!(
        "power loss to withdrawal: {:?} (BFD 3 x 100 ms)",
        lost.elapsed()
    );
    let answers = rig.served_by(web_v4, 20);
    assert!(
        answers
            .iter()
            .all(|a| a.as_deref().is_some_and(|n| n != "node-2")),
        "the survivors serve: {answers:?}"
    );
    // A clean stop of node-1: BIRD closes its sessions, the route goes at once.
    let stopped = std::time::Instant::now();
    rig.cluster.nodes[1].stop();
    rig.wait_for_hops(web_v4, &[0], "node-1's route withdrawn on its stop");
    println!("clean stop to withdrawal: {:?}", stopped.elapsed());
    assert!(
        rig.router.next_hops(local_ip).is_empty(),
        "default/local had only node-1"
    );
    rig.stop_backends();
}

/// Node-0's configuration given the exclusion label (`node.kubernetes.io/exclude-from-external-
/// load-balancers`, as a Kubernetes Node would carry it) and reloaded (SIGHUP): the router loses
/// node-0's route to `web_v4` but not its session; the label removed and reloaded, the route
/// returns.
fn drain_by_label(rig: &BgpRig, web_v4: IpAddr) {
    let c = &rig.cluster;
    let node = &c.nodes[0];
    let address: IpAddr = node_addresses(0).0.parse().unwrap();
    let sessions_before = rig.router.sessions_established(address);
    let config = std::fs::read_to_string(node.config_path()).unwrap();
    let reload = |text: &str| {
        std::fs::write(node.config_path(), text).unwrap();
        let daemon = node.daemon.as_ref().expect("node-0 runs");
        daemon.signal(nix::sys::signal::Signal::SIGHUP);
    };
    reload(&format!(
        "{config}\n[node.labels]\n\"node.kubernetes.io/exclude-from-external-load-balancers\" = \"\"\n"
    ));
    rig.wait_for_hops(web_v4, &[1, 2], "node-0's route withdrawn by its drain");
    assert_eq!(
        rig.router.sessions_established(address),
        sessions_before,
        "a drain withdraws routes, not the session"
    );
    assert_eq!(
        session_of(c, "tor", "node-0").map(|(state, _)| state),
        Some("Established".to_owned())
    );
    reload(&config);
    rig.wait_for_hops(web_v4, &[0, 1, 2], "node-0's route back after the drain");
}

/// A Service answered for over L2 (by one node) and advertised over BGP (by all three): when the
/// BGP advertisement stops selecting it, the nodes that only advertised it take its IP off
/// `lo`, while the node answering ARP for it keeps it there, since both announcers hold it.
fn l2_and_bgp_share_the_address(rig: &BgpRig) {
    let c = &rig.cluster;
    let mut policy = uplink_policy();
    policy.spec.service_selector = selector(json!({ "matchLabels": { "l2": "yes" } }));
    c.put("uplink", &policy);
    let mut both = lb_service(PORT);
    both.spec.labels.insert("l2".into(), "yes".into());
    c.put("default/both", &both);
    let ip = rig.wait_for_ip("default/both", false);
    rig.wait_for_hops(ip, &[0, 1, 2], "both's route over the three nodes");
    let on_lo = || -> Vec<usize> {
        (0..c.nodes.len())
            .filter(|i| c.nodes[*i].ns.addresses("lo").iter().any(|(a, _)| *a == ip))
            .collect()
    };
    wait_until(
        Duration::from_secs(10),
        "both's IP on every node's lo",
        || on_lo().len() == 3,
        || format!("{:?}", on_lo()),
    );
    // On the segment, the IP held by all three kernels is answered by one MAC: the L2 owner's
    // responder; the kernels stay quiet ([node.announce] strict_arp, set by the agents). An IP
    // only advertised over BGP is answered by no one, in either family: it is routed.
    let mac = |i: usize| {
        let m = c.nodes[i].mac();
        format!(
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    };
    let answering = rig.answering_macs(ip);
    assert_eq!(answering.len(), 1, "{ip} answered by {answering:?}");
    assert!(
        (0..c.nodes.len()).any(|i| answering.contains(&mac(i))),
        "{ip} answered by {answering:?}, not a node"
    );
    for routed in [
        rig.wait_for_ip("default/web", false),
        rig.wait_for_ip("default/web", true),
    ] {
        let answering = rig.answering_macs(routed);
        assert!(
            answering.is_empty(),
            "{routed}, only advertised, answered by {answering:?}"
        );
    }
    let not_both = json!({ "spec": { "serviceSelector": {
        "matchExpressions": [{ "key": "l2", "operator": "DoesNotExist" }] } } });
    c.put("all", &advertisement(not_both));
    rig.wait_for_hops(ip, &[], "both's route withdrawn");
    wait_until(
        Duration::from_secs(10),
        "both's IP off the nodes that only advertised it",
        || on_lo().len() <= 1,
        || format!("{:?}", on_lo()),
    );
    // Every node has applied the advertisement by now (the route is gone from all three); a
    // moment more for the last address change, then the L2 node must still hold the IP.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        on_lo().len(),
        1,
        "the node answering ARP for {ip} keeps it on lo"
    );
    c.put("all", &advertisement(json!({ "spec": {} })));
    rig.wait_for_hops(ip, &[0, 1, 2], "both's route back");
}

fn advertisement(value: serde_json::Value) -> ipam_core::lb::bgp::BgpAdvertisement {
    serde_json::from_value(value).expect("a BGPAdvertisement")
}

fn selector(value: serde_json::Value) -> ipam_core::meta::Selector {
    serde_json::from_value(value).expect("a selector")
}

/// Cilium's peers (as `tor` and `tor6`), their peer config and an advertisement of every
/// Service's LoadBalancer IP with a standard and a large community, converted, the Secret reference replaced by the
/// password (this store has no Secrets), applied; the router then learns `web_v4` with the
/// communities from every node. The rig's own peers are put back afterwards.
fn migrate_from_cilium(rig: &BgpRig, web_v4: IpAddr) {
    const CILIUM: &str = "\
apiVersion: cilium.io/v2
kind: CiliumBGPClusterConfig
metadata: {name: fabric}
spec:
  bgpInstances:
  - name: main
    localASN: 64512
    peers:
    - {name: tor, peerAddress: 10.77.0.200, peerASN: 64500, peerConfigRef: {name: fast}}
    - {name: tor6, peerAddress: \"fd77::200\", peerASN: 64500, peerConfigRef: {name: fast}}
---
apiVersion: cilium.io/v2
kind: CiliumBGPPeerConfig
metadata: {name: fast}
spec:
  timers: {holdTimeSeconds: 3, keepAliveTimeSeconds: 1, connectRetryTimeSeconds: 1}
  authSecretRef: fabric-password
  families:
  - {afi: ipv4, safi: unicast, advertisements: {matchLabels: {advertise: bgp}}}
  - {afi: ipv6, safi: unicast, advertisements: {matchLabels: {advertise: bgp}}}
---
apiVersion: cilium.io/v2
kind: CiliumBGPAdvertisement
metadata: {name: all, labels: {advertise: bgp}}
spec:
  advertisements:
  - advertisementType: Service
    service: {addresses: [LoadBalancerIP]}
    selector: {matchExpressions: [{key: somekey, operator: NotIn, values: [never-used-value]}]}
    attributes: {communities: {standard: [\"64512:7\"], large: [\"64512:7:9\"]}}
";
    let c = &rig.cluster;
    let dir = ipam_tests::TempDir::new("bgp-migrate-");
    let cilium = dir.0.join("cilium.yaml");
    std::fs::write(&cilium, CILIUM).unwrap();
    let out = c.ipamctl_beside_store(&["migrate", "-f", cilium.to_str().unwrap()]);
    let (converted, report) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(out.status.code(), Some(2), "{converted}{report}");
    assert!(
        report.contains("spec.authSecretRef: the password is read from the Secret"),
        "{report}"
    );
    // The peers name Cilium's Secret; on this store (etcd) the password goes inline instead.
    let secret = "  passwordSecretRef:\n    name: fabric-password\n    key: password\n";
    assert_eq!(converted.matches(secret).count(), 2, "{converted}");
    let with_password = converted.replace(secret, &format!("  password: {PASSWORD}\n"));
    let migrated = dir.0.join("migrated.yaml");
    std::fs::write(&migrated, with_password).unwrap();
    let out = c.ipamctl_beside_store(&["apply", "-f", migrated.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let route = || {
        rig.router
            .vtysh(&[&format!("show bgp ipv4 unicast {web_v4}/32 json")])
    };
    wait_until(
        Duration::from_secs(20),
        "web's route with the converted communities (standard and large) from the three nodes",
        || {
            let route = route();
            rig.routed_to(web_v4).len() == 3
                && route.contains("\"64512:7\"")
                && route.contains("64512:7:9")
        },
        || format!("{}\n{:?}", route(), rig.routed_to(web_v4)),
    );
    // BFD back on: a change of the peers' own settings, so their sessions restart.
    rig.put_peers_and_wait(
        &[
            ("tor", &peer(ROUTER_V4, PASSWORD, 64512, true)),
            ("tor6", &peer(ROUTER_V6, PASSWORD, 64512, true)),
        ],
        web_v4,
    );
}

/// A pool `aggregated` (203.0.113.0/28, labelled `aggregate: "yes"`) advertised by its own
/// advertisement, chosen by the pool's label, as one /28; the advertisement `all` leaves it
/// out (by the label too). The router learns the /28 from the three nodes and no /32 of its
/// Services, and the client reaches both Services through it.
fn aggregation(rig: &BgpRig) {
    let c = &rig.cluster;
    let mut aggregated = ipam_tests::bgp_rig::pool(&["203.0.113.0/28"]);
    aggregated.labels = [("aggregate".to_owned(), "yes".to_owned())].into();
    c.put("aggregated", &aggregated);
    let all = c
        .list::<ipam_core::lb::bgp::BgpAdvertisement>()
        .into_iter()
        .find(|a| a.name == "all")
        .expect("the advertisement all");
    let mut all = all.value;
    all.spec.ip_pool_selector = selector(
        json!({ "matchExpressions": [{ "key": "aggregate", "operator": "DoesNotExist" }] }),
    );
    c.put("all", &all);
    c.put(
        "aggregate",
        &advertisement(json!({ "spec": {
            "ipPoolSelector": { "matchLabels": { "aggregate": "yes" } },
            "aggregationLength": 28,
        } })),
    );
    let mut ips = Vec::new();
    for name in ["default/agg-a", "default/agg-b"] {
        let mut service = lb_service(PORT);
        service.spec.pool = Some("aggregated".into());
        c.put(name, &service);
        ips.push(rig.wait_for_ip(name, false));
    }
    let hops = || rig.router.next_hops_of("203.0.113.0/28");
    wait_until(
        Duration::from_secs(20),
        "the aggregate 203.0.113.0/28 from the three nodes",
        || hops().len() == 3,
        || {
            format!(
                "{:?}\n{}",
                hops(),
                rig.router.vtysh(&["show bgp ipv4 unicast"])
            )
        },
    );
    // A Service's IP inside an aggregate that is already advertised is routed to every node
    // the moment it is given: each node accepts its traffic once its agent has put it on `lo`.
    for ip in &ips {
        let on_lo = |n: &ipam_tests::cluster::ClusterNode| {
            n.ns.addresses("lo").iter().any(|(a, _)| a == ip)
        };
        wait_until(
            Duration::from_secs(10),
            &format!("every node holding {ip} on lo"),
            || c.nodes.iter().all(on_lo),
            || {
                let holding: Vec<_> = c.nodes.iter().map(|n| (&n.name, on_lo(n))).collect();
                format!("{holding:?}")
            },
        );
    }
    for ip in &ips {
        assert!(
            rig.router.next_hops(*ip).is_empty(),
            "{ip} has a host route beside its aggregate:\n{}",
            rig.router.vtysh(&["show bgp ipv4 unicast"])
        );
        let served = rig.served_by(*ip, 6);
        assert!(
            served.iter().all(Option::is_some),
            "{ip} through the aggregate: {served:?}"
        );
    }
}

/// The endpoints of `default/local`: one, on node-1.
fn local_endpoint_on_node_1(ready: bool) -> ServiceEndpoints {
    ServiceEndpoints {
        spec: ServiceEndpointsSpec {
            service: "default/local".into(),
            endpoints: vec![ServiceEndpoint {
                node_name: "node-1".into(),
                ready,
            }],
        },
    }
}

/// A restart of node-1's agent said as one (`[node] on_stop = "restart"`, by a reload), with
/// graceful restart on the peer `tor` (and no BFD: a router drops a peer's routes when its BFD
/// session goes down, unless it checks the control-plane-independent bit): BIRD stops without
/// a Cease, the router keeps node-1's routes as stale while no agent runs (default/local's
/// only route among them), and the next agent, its BIRD recovering, takes them up and ends the
/// restart. Every request to default/local, one every 20 ms, is answered throughout. Then the
/// peer and the node are put back as they were.
fn planned_restart(rig: &mut BgpRig, local_ip: IpAddr, web_v4: IpAddr) {
    let mut tor = peer(ROUTER_V4, PASSWORD, 64512, false);
    tor.spec.graceful_restart = Some(GracefulRestart {
        restart_time_seconds: 30,
    });
    rig.cluster.put("tor", &tor);
    let node_1 = node_addresses(1).0;
    wait_until(
        Duration::from_secs(20),
        "the router to hear node-1 offer graceful restart",
        || {
            rig.router
                .vtysh(&[&format!("show bgp neighbors {node_1}")])
                .contains("Remote GR Mode: Restart")
        },
        || rig.router.vtysh(&[&format!("show bgp neighbors {node_1}")]),
    );
    rig.wait_for_hops(
        local_ip,
        &[1],
        "default/local's route from node-1, with graceful restart",
    );
    rig.cluster.nodes[1].set_node_setting("on_stop", Some("\"restart\""));

    let requests = RequestLoop::start(&rig.client, local_ip, Duration::from_millis(20));
    std::thread::sleep(Duration::from_millis(500));
    let stopped = std::time::Instant::now();
    rig.cluster.nodes[1].stop();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        rig.router.next_hops(local_ip),
        [node_1.parse::<IpAddr>().unwrap()],
        "the router keeps node-1's route while its agent is away:\n{}",
        rig.router.vtysh(&[&format!("show bgp neighbors {node_1}")])
    );
    rig.cluster.nodes[1].start();
    let c = &rig.cluster;
    wait_until(
        Duration::from_secs(20),
        "node-1's session established again",
        || session_of(c, "tor", "node-1").is_some_and(|(state, _)| state == "Established"),
        || c.nodes[1].log(),
    );
    std::thread::sleep(Duration::from_secs(2));
    let away = stopped.elapsed();
    let seen = requests.stop();
    println!(
        "planned restart of node-1: {} requests answered, {} failed, over {away:?} \
         (the agent away about 3 s)",
        seen.answered,
        seen.failed.len()
    );
    assert!(
        seen.failed.is_empty(),
        "requests to default/local failed during the restart at {:?}\n{}",
        seen.failed,
        c.nodes[1].log()
    );
    assert!(
        c.nodes[1]
            .log()
            .contains("BIRD resumes after a graceful restart"),
        "{}",
        c.nodes[1].log()
    );

    rig.cluster.nodes[1].set_node_setting("on_stop", None);
    // BFD back on: a change of the peer's own settings, so the IPv4 sessions restart.
    rig.put_peers_and_wait(&[("tor", &peer(ROUTER_V4, PASSWORD, 64512, true))], web_v4);
    rig.wait_for_hops(
        local_ip,
        &[1],
        "default/local's route from node-1, BFD back",
    );
    let nodes: Vec<String> = (0..3).map(|i| node_addresses(i).0).collect();
    wait_until(
        Duration::from_secs(20),
        "the IPv4 sessions' BFD up again",
        || {
            let peers = rig.router.vtysh(&["show bfd peers brief"]);
            nodes.iter().all(|n| {
                peers
                    .lines()
                    .any(|l| l.split_whitespace().any(|w| w == n) && l.contains("up"))
            })
        },
        || rig.router.vtysh(&["show bfd peers brief"]),
    );
}
