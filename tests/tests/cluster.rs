//! Many nodes, one cluster, on one machine: three real etcd members, two operator replicas and
//! node namespaces on one L2 segment, each node running `ipamd --role agent` with the pod
//! datapath; pods wired by `ipam-cni`. Every fault ends with "nothing lost, nothing held
//! twice" checked against the store.
//!
//! One test walks the cluster through its faults in order, so etcd and the nodes start once
//! (the faults are few but real; each is a step below).

use std::time::{Duration, Instant};

use ipam_tests::{
    cluster::{Cluster, ClusterPod, NODE_GRACE_MS, NODE_LEASE_MS, OPERATOR_LEASE_MS, wait_until},
    pod_net::{reaches, tcp_exchange},
};

/// Runs `command` and fails the test with its output when it fails.
fn run_ok(command: &mut std::process::Command) {
    let out = command.output().expect("spawn");
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn all_reach(pods: &[(&str, &ClusterPod)]) -> Vec<String> {
    let mut failures = Vec::new();
    for (from_node, from) in pods {
        for (to_node, to) in pods {
            if from.container == to.container {
                continue;
            }
            for addr in [&to.v4, &to.v6] {
                if !reaches(&from.ns, addr) {
                    failures.push(format!("{from_node} {} -> {to_node} {addr}", from.v4));
                }
            }
        }
    }
    failures
}

#[test]
fn a_cluster_over_etcd_survives_its_faults() {
    let mut c = Cluster::start("cl", 2);
    for _ in 0..3 {
        c.add_node("cl");
    }
    let context = |c: &Cluster| {
        format!(
            "blocks: {:?}\noperator 0:\n{}\noperator 1:\n{}\nnode-0:\n{}",
            c.blocks(),
            c.operator_log(0),
            c.operator_log(1),
            c.nodes[0].log()
        )
    };

    // Every node gets a block of each family, none twice.
    wait_until(
        Duration::from_secs(30),
        "every node to hold an IPv4 and an IPv6 block",
        || c.blocks().values().filter(|b| b.len() == 2).count() == 3,
        || context(&c),
    );
    c.assert_no_block_twice();
    wait_until(
        Duration::from_secs(20),
        "every agent to be ready for pods",
        || c.nodes.iter().all(ipam_tests::cluster::ClusterNode::ready),
        || context(&c),
    );
    let leader = c.leader().expect("an operator leads");
    let logs = c.operator_log(0) + &c.operator_log(1);
    assert_eq!(
        logs.matches("leading the operators").count(),
        1,
        "exactly one replica leads: {logs}"
    );

    // Pods on different nodes reach each other, v4 and v6, both ways, through the datapath.
    let pods: Vec<ClusterPod> = (0..3)
        .map(|i| c.nodes[i].add_pod(&format!("clp{i}")))
        .collect();
    let named: Vec<(&str, &ClusterPod)> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| (c.nodes[i].name.as_str(), p))
        .collect();
    // Routes follow the records within a moment of the blocks.
    wait_until(
        Duration::from_secs(5),
        "every pod reaching every other",
        || all_reach(&named).is_empty(),
        || format!("unreachable: {:?}\n{}", all_reach(&named), context(&c)),
    );
    // They went through the route map: the pod program redirects them before the host's table
    // is consulted.
    for node in &c.nodes {
        let forwarded = ipam_datapath::RouteMaps::from_pins(node.bpffs_root())
            .unwrap()
            .stats()
            .unwrap()[ipam_common::pod::RouteStat::Forwarded as usize];
        assert!(
            forwarded > 0,
            "{}: nothing forwarded by the datapath",
            node.name
        );
        // The node's routing table holds its own pods (one /32 per pod on its veth) and, for
        // the host's own traffic, the other nodes' blocks through their addresses, marked as
        // the daemon's.
        let pool: ipam_core::Cidr = "10.240.0.0/16".parse().unwrap();
        let blocks = c.blocks();
        let others: Vec<ipam_core::Cidr> = blocks
            .iter()
            .filter(|(n, _)| **n != node.name)
            .flat_map(|(_, b)| b.iter().copied())
            .filter(|b| pool.overlaps(b))
            .collect();
        let kernel_routes = node.ns.routes(false);
        for block in &others {
            assert!(
                kernel_routes
                    .iter()
                    .any(|r| r.destination == block.network()
                        && r.prefix_len == block.prefix()
                        && r.gateway.is_some()
                        && r.protocol == ipam_netlink::IPAM_ROUTE_PROTOCOL),
                "{}: no host route to {block}: {kernel_routes:?}",
                node.name
            );
        }
        assert!(
            kernel_routes
                .iter()
                .filter(|r| pool.contains(r.destination))
                .all(|r| r.prefix_len == 32 || others.iter().any(|b| b.network() == r.destination)),
            "{kernel_routes:?}"
        );
    }
    // What kube-proxy forwards and host-network pods send leaves from the host itself, not
    // from a pod: every node's host reaches the other nodes' pods (v4 and v6).
    for node in &c.nodes {
        for (pod_node, pod) in &named {
            if *pod_node == node.name.as_str() {
                continue;
            }
            for addr in [&pod.v4, &pod.v6] {
                assert!(
                    reaches(&node.ns, addr),
                    "{}'s host cannot reach {pod_node}'s pod at {addr}\n{}",
                    node.name,
                    context(&c)
                );
            }
        }
    }

    // kube-proxy's rules, as every real node has them: forwarded packets that conntrack calls
    // INVALID are dropped, and Service addresses are DNATed to pods (here on node-0: one to
    // node-1's pod, one to a second pod of node-0). What the users see must still work: a
    // node's host talks TCP to other nodes' pods, a pod talks to a Service whose backend is on
    // another node or on its own, and pods still reach each other. Each needs the datapath to
    // send a reply the way its request went, through the stack or past it.
    for node in &c.nodes {
        for iptables in ["iptables", "ip6tables"] {
            run_ok(node.ns.command(iptables).args([
                "-A",
                "FORWARD",
                "-m",
                "conntrack",
                "--ctstate",
                "INVALID",
                "-j",
                "DROP",
            ]));
        }
    }
    let local_backend = c.nodes[0].add_pod("clb0");
    let dnat = |iptables: &str, service: &str, backend: String| {
        run_ok(
            c.nodes[0]
                .ns
                .command(iptables)
                .args(ipam_tests::netns::dnat_args(service, 80, &backend)),
        );
    };
    dnat("iptables", "10.96.0.10", format!("{}:8080", pods[1].v4));
    dnat(
        "iptables",
        "10.96.0.11",
        format!("{}:8080", local_backend.v4),
    );
    dnat("ip6tables", "fd96::10", format!("[{}]:8080", pods[1].v6));
    let socket =
        |addr: &str, port: u16| std::net::SocketAddr::new(addr.parse().expect("an address"), port);
    let exchanges = [
        (
            "node-0's host to node-1's pod",
            &c.nodes[0].ns,
            &pods[1].ns,
            socket(&pods[1].v4, 8080),
        ),
        (
            "node-0's host to node-1's pod (v6)",
            &c.nodes[0].ns,
            &pods[1].ns,
            socket(&pods[1].v6, 8080),
        ),
        (
            "node-0's pod to a Service on node-1",
            &pods[0].ns,
            &pods[1].ns,
            socket("10.96.0.10", 80),
        ),
        (
            "node-0's pod to a Service on node-1 (v6)",
            &pods[0].ns,
            &pods[1].ns,
            socket("fd96::10", 80),
        ),
        (
            "node-0's pod to a Service on node-0",
            &pods[0].ns,
            &local_backend.ns,
            socket("10.96.0.11", 80),
        ),
        (
            "node-0's pod to node-1's pod",
            &pods[0].ns,
            &pods[1].ns,
            socket(&pods[1].v4, 8080),
        ),
    ];
    for (what, client, server, to) in exchanges {
        if let Err(e) = tcp_exchange(client, server, 8080, to) {
            panic!("{what}: {e}\n{}", context(&c));
        }
    }
    assert!(all_reach(&named).is_empty(), "{:?}", all_reach(&named));

    // The nodes answer for Service IPs: the L2 responder (TC form on a veth) sits first on each
    // answering node's uplink, before the pod program. Pods still reach a pod of every node
    // over TCP with kube-proxy's INVALID drop in place: the responder hands every frame it does
    // not answer to the next program, so a reply to a pod's own request is delivered past the
    // stack as the request was sent. (Found on the real-cluster lab: with the responder ending
    // the chain, the node answering for a Service IP dropped its pods' replies as INVALID.)
    let manifest = ipam_tests::TempFile::new("cllb", "yaml");
    std::fs::write(
        &manifest.0,
        "kind: LoadBalancerIPPool\nmetadata: { name: lb }\nspec:\n  blocks:\n\
         \x20   - { start: 10.77.0.100, stop: 10.77.0.120 }\n---\n\
         kind: L2AnnouncementPolicy\nmetadata: { name: uplinks }\n\
         spec: { interfaces: [ \"up[0-9]+\" ] }\n",
    )
    .unwrap();
    c.ipamctl(0, &["apply", "-f", &manifest.0.display().to_string()]);
    for i in 0..9 {
        c.put(
            &format!("default/cl-{i}"),
            &ipam_tests::failover::lb_service(80),
        );
    }
    // A node answering has its responder's link pinned (TC form: the uplinks are veths).
    let answering = |node: &ipam_tests::cluster::ClusterNode| {
        ipam_datapath::pinned_attachments(node.bpffs_root())
            .unwrap_or_default()
            .iter()
            .any(|a| a.interface == "up0" && a.form == ipam_datapath::AttachForm::Tc)
    };
    wait_until(
        Duration::from_secs(20),
        "a node answering for Service IPs",
        || c.nodes.iter().any(answering),
        || context(&c),
    );
    for (i, pod) in pods.iter().enumerate() {
        let from = &pods[(i + 1) % pods.len()];
        let to = socket(&pod.v4, 8080);
        if let Err(e) = tcp_exchange(&from.ns, &pod.ns, 8080, to) {
            panic!(
                "a pod of node-{} to node-{i}'s pod (node-{i} answering for Service IPs: {}): \
                 {e}\n{}",
                (i + 1) % pods.len(),
                answering(&c.nodes[i]),
                context(&c)
            );
        }
    }

    // The leading operator SIGKILLed while a new node asks for blocks: the other replica takes
    // over within the lease and serves it; no block is assigned twice.
    let leader_index = (0..2)
        .find(|i| c.operator_log(*i).contains("leading the operators"))
        .expect("the leader's log");
    c.operators[leader_index].take().unwrap().kill();
    let killed_at = Instant::now();
    let new_node = c.add_node("cl");
    wait_until(
        Duration::from_secs(30),
        "the new node's blocks from the new leader",
        || c.blocks().get("node-3").is_some_and(|b| b.len() == 2),
        || context(&c),
    );
    wait_until(
        Duration::from_secs(20),
        "the new node to be ready for pods",
        || c.nodes[new_node].ready(),
        || context(&c),
    );
    let failover = killed_at.elapsed();
    assert!(
        failover < Duration::from_millis(OPERATOR_LEASE_MS * 4),
        "took {failover:?}"
    );
    assert_ne!(c.leader().as_deref(), Some(leader.as_str()));
    c.assert_no_block_twice();
    eprintln!("operator failover: new node served {failover:?} after the leader's SIGKILL");

    // An agent SIGKILLed and restarted keeps its blocks and its pods: "unchanged" is judged
    // once the new agent is up and ready (it has restored its state and served its record).
    let before = c.blocks()["node-1"].clone();
    c.nodes[1].daemon.take().unwrap().kill();
    assert!(!c.nodes[1].ready(), "the killed agent is not ready");
    c.nodes[1].start();
    wait_until(
        Duration::from_secs(20),
        "the restarted agent ready",
        || c.nodes[1].ready(),
        || context(&c),
    );
    assert_eq!(c.blocks()["node-1"], before);
    assert!(
        reaches(&pods[0].ns, &pods[1].v4),
        "pod on the restarted node reachable"
    );
    assert!(reaches(&pods[1].ns, &pods[2].v6));

    // One etcd member killed: work goes on.
    c.etcd.kill(0);
    let p3 = c.nodes[new_node].add_pod("clp3");
    assert!(reaches(&p3.ns, &pods[0].v4));
    // Two of three down: no quorum. Pods still get addresses from the nodes' blocks; the
    // agents say what is wrong and keep running.
    c.etcd.kill(1);
    let during: Vec<ClusterPod> = (0..3)
        .map(|i| c.nodes[i].add_pod(&format!("clq{i}")))
        .collect();
    assert!(reaches(&during[0].ns, &during[2].v4));
    std::thread::sleep(Duration::from_secs(3));
    for node in &mut c.nodes {
        assert!(
            node.daemon.as_mut().unwrap().running(),
            "{} exited:\n{}",
            node.name,
            node.log()
        );
    }
    let log = c.nodes[0].log();
    assert!(
        log.contains("cannot renew the node lease") && log.contains("no member could serve"),
        "{log}"
    );
    // etcd back: everything resumes without a restart; no node lost its blocks meanwhile
    // (the outage was shorter than the grace period).
    c.etcd.restart(0).unwrap();
    c.etcd.restart(1).unwrap();
    c.etcd.wait_ready(Duration::from_secs(30)).unwrap();
    wait_until(
        Duration::from_secs(30),
        "the agents to renew their leases again",
        || c.nodes[0].log().contains("node lease renewed again"),
        || context(&c),
    );
    let blocks = c.blocks();
    assert_eq!(
        blocks.values().filter(|b| b.len() == 2).count(),
        4,
        "{blocks:?}"
    );
    c.assert_no_block_twice();

    // A node removed (its agent gone for good): its blocks are freed only after the grace
    // period, and then a new node can have them.
    let gone = c.blocks()["node-2"].clone();
    c.nodes[2].daemon.take().unwrap().kill();
    let removed_at = Instant::now();
    wait_until(
        Duration::from_millis(NODE_GRACE_MS * 4),
        "node-2's blocks to be freed",
        || {
            c.blocks()
                .get("node-2")
                .is_some_and(std::vec::Vec::is_empty)
        },
        || context(&c),
    );
    // The grace period runs from the last renewal the operator saw, up to one renewal
    // interval before the kill.
    assert!(
        removed_at.elapsed() >= Duration::from_millis(NODE_GRACE_MS - NODE_LEASE_MS / 3),
        "freed after {:?}, before the grace period",
        removed_at.elapsed()
    );
    c.assert_no_block_twice();
    // Routes to the removed node leave the others' datapath at their next pass over the
    // records (which watch the store: the freed blocks reach them a moment after the store).
    let routes = || {
        ipam_datapath::RouteMaps::from_pins(c.nodes[0].bpffs_root())
            .unwrap()
            .list()
            .unwrap()
    };
    wait_until(
        Duration::from_secs(5),
        "the routes to node-2's blocks removed from node-0",
        || gone.iter().all(|b| !routes().contains_key(b)),
        || format!("{:?} still routes {gone:?}", routes()),
    );

    // A new node takes node-2's freed blocks (released blocks are reused first); node-2 then
    // comes back, its pods still using addresses of them. It keeps those (they conflict, and
    // its log says so), but a pod there asking for another address of the lost block by
    // address is refused with the reason: the new node hands that address out, and one
    // address must never be on two pods.
    let taker = c.add_node("cl");
    let taker_name = c.nodes[taker].name.clone();
    wait_until(
        Duration::from_secs(30),
        "the new node to hold node-2's freed blocks",
        || {
            c.blocks()
                .get(&taker_name)
                .is_some_and(|held| gone.iter().all(|b| held.contains(b)))
        },
        || context(&c),
    );
    wait_until(
        Duration::from_secs(20),
        "the new node to be ready for pods",
        || c.nodes[taker].ready(),
        || context(&c),
    );
    c.nodes[2].start();
    wait_until(
        Duration::from_secs(30),
        "node-2 back, told its blocks went to another node",
        || {
            c.nodes[2].ready()
                && c.nodes[2]
                    .log()
                    .contains("block was given to another node while this node was away")
        },
        || format!("{}\nnode-2:\n{}", context(&c), c.nodes[2].log()),
    );
    let lost_v4 = *gone
        .iter()
        .find(|b| b.family() == ipam_core::Family::V4)
        .expect("node-2 held an IPv4 block");
    let fixed = lost_v4.addr(100).to_string();
    let ask = |node: usize, tag: &str| {
        let pod = ipam_tests::netns::Netns::new(tag);
        let container = format!("ctr-{}", pod.name);
        let mut conf = c.nodes[node].conf();
        conf["runtimeConfig"] = serde_json::json!({ "ips": [format!("{fixed}/24")] });
        let (ok, result) = ipam_tests::cni::run_cni(
            &ipam_tests::workspace_binary("ipam-cni"),
            Some(&c.nodes[node].ns),
            "ADD",
            &container,
            "eth0",
            Some(&pod),
            &conf,
        );
        (pod, container, ok, result)
    };
    let (_taker_pod, _, ok, result) = ask(taker, "clfa");
    assert!(ok, "{taker_name} hands out {fixed} of its block: {result}");
    let (_pod, container, ok, result) = ask(2, "clfb");
    let msg = result["msg"].as_str().unwrap_or_default();
    assert!(
        !ok && [
            container.as_str(),
            fixed.as_str(),
            &lost_v4.to_string(),
            "node-2",
            "another node holds",
        ]
        .iter()
        .all(|part| msg.contains(part)),
        "node-2 must refuse {fixed} of the block it lost, saying why: {result}\n{}",
        c.nodes[2].log()
    );
}
