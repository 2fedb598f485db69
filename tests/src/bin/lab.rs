//! The lab: a cluster on one machine. Three etcd members, two operator replicas, three nodes
//! and a client on one L2 segment (a bridge in a fabric namespace). Every node runs
//! `ipamd --role agent`; node-0 also announces a service IP, which the client finds with
//! ARP/NDP and reaches. Pods are added to every node with `ipam-cni` as a container runtime adds
//! them, and reach each other across nodes through the TC datapath. Then `ipamctl` shows the
//! blocks per node, read from etcd. Everything is created here and removed at the end, also
//! when a step fails.

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, Ipv6Addr, TcpListener, TcpStream},
    time::{Duration, Instant},
};

use ipam_api::types::Mac;
use ipam_tests::{
    cluster::{Cluster, ClusterNode, ClusterPod, UPLINK, node_addresses, wait_until},
    netns::{Netns, veth},
    pod_net::{reaches, reaches_from},
    resolve::Resolver,
    workspace_binary,
};

const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 100);
const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 0x100);
const SERVICE_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 200);
const SERVICE_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 0x200);
const NODES: usize = 3;

fn step(n: u32, text: &str) {
    println!("\n[{n}] {text}");
}

fn main() {
    println!(
        "IPAM lab: a cluster on one L2 segment: etcd, two operators, three nodes, pods on \
         every node, and a client."
    );
    step(1, "The segment and the store: a bridge, three etcd members");
    let mut c = Cluster::start("lab", 0);
    // The agents tell each other who is alive over UDP (docs/liveness.md).
    c.enable_gossip();
    println!(
        "    fabric namespace {}: br0 10.77.0.254/24, fd77::fe/64",
        c.fabric.name
    );
    println!(
        "    etcd members: {} (key prefix {})",
        c.store.endpoints.join(", "),
        c.store.prefix
    );

    step(
        2,
        "Two operator replicas: one leads, through a lease in etcd",
    );
    for _ in 0..2 {
        let op = c.start_operator();
        c.operators.push(Some(op));
    }
    wait_until(
        Duration::from_secs(30),
        "an operator to lead",
        || c.leader().is_some(),
        || c.operator_log(0),
    );
    println!("    leading: {}", c.leader().unwrap_or_default());

    step(
        3,
        "Three nodes join (ipamd --role agent, gossiping on UDP 7946); node-0 also announces a \
         service IP",
    );
    let announce = format!(
        "[[announcement]]\nip = \"{SERVICE_V4}\"\ninterface = \"{UPLINK}\"\n\n\
         [[announcement]]\nip = \"{SERVICE_V6}\"\ninterface = \"{UPLINK}\"\n"
    );
    for i in 0..NODES {
        let started = Instant::now();
        let index = c.add_node_with("lab", if i == 0 { &announce } else { "" });
        let (v4, v6) = node_addresses(index);
        println!(
            "    {} in namespace {}: {UPLINK} {v4}/24, {v6}/64; agent answering after {} ms",
            c.nodes[index].name,
            c.nodes[index].ns.name,
            started.elapsed().as_millis()
        );
    }
    wait_until(
        Duration::from_secs(30),
        "every node's blocks and router addresses",
        || c.nodes.iter().all(ClusterNode::ready),
        || format!("{:?}\n{}", c.blocks(), c.nodes[0].log()),
    );
    for (node, blocks) in c.blocks() {
        let blocks: Vec<String> = blocks.iter().map(ToString::to_string).collect();
        println!("    {node}: {}", blocks.join(", "));
    }
    // The service IP is local to node-0 (its kernel accepts traffic for it) but the kernel must
    // not answer ARP for it: the eBPF responder does, on the interfaces the daemon chooses (the
    // agent sets the strict-ARP sysctls for its announcements: `[node.announce] strict_arp`).
    let node0 = &c.nodes[0];
    node0.ns.add_address("lo", &format!("{SERVICE_V4}/32"));

    step(
        4,
        "A client on the segment, routing each node's blocks to that node",
    );
    let client = Netns::new("labcli");
    veth(&client, "eth0", &c.fabric, "pcli");
    c.fabric.add_port("pcli", "br0");
    client.add_address("eth0", &format!("{CLIENT_V4}/24"));
    client.add_address("eth0", &format!("{CLIENT_V6}/64"));
    for (i, node) in c.nodes.iter().enumerate() {
        let (v4, v6) = node_addresses(i);
        for cidr in c.blocks().get(&node.name).into_iter().flatten() {
            let via = match cidr.family() {
                ipam_core::Family::V4 => &v4,
                ipam_core::Family::V6 => &v6,
            };
            client.route_via(&cidr.to_string(), via);
        }
    }
    println!(
        "    client namespace {}: eth0 {CLIENT_V4}/24, {CLIENT_V6}/64",
        client.name
    );

    step(
        5,
        "The client finds the service IP (ARP, NDP) and reaches it",
    );
    service(&c, &client);

    step(
        6,
        "Pods: ipam-cni adds one pod to every node; they reach each other across nodes",
    );
    let pods: Vec<ClusterPod> = (0..NODES)
        .map(|i| add_pod(&c.nodes[i], &format!("labp{i}")))
        .collect();
    for (i, p) in pods.iter().enumerate() {
        println!(
            "    {} pod {}: {} and {}",
            c.nodes[i].name, p.container, p.v4, p.v6
        );
    }
    let mut checks = Vec::new();
    for (i, from) in pods.iter().enumerate() {
        for (j, to) in pods.iter().enumerate() {
            if i != j {
                for addr in [&to.v4, &to.v6] {
                    checks.push((
                        format!("pod on node-{i} -> pod on node-{j}"),
                        &from.ns,
                        addr.clone(),
                    ));
                }
            }
        }
        checks.push((
            format!("client -> pod on node-{i}"),
            &client,
            from.v4.clone(),
        ));
    }
    for (what, from, to) in &checks {
        if !reaches(from, to) {
            fail(&c, &format!("{what}: {to} does not answer"));
        }
        println!("    ping {what:<34} {to:<18} answered");
    }
    // A pod sending from an address that is not its own is dropped by the datapath.
    let spoof = "10.240.255.250";
    pods[0].ns.add_address("eth0", &format!("{spoof}/32"));
    if reaches_from(&pods[0].ns, spoof, &pods[1].v4) {
        fail(&c, "a spoofed source address got through");
    }
    println!(
        "    ping {:<34} {:<18} dropped (spoof_dropped)",
        format!("pod on node-0, source {spoof}"),
        pods[1].v4
    );
    for node in &c.nodes {
        let routes = ipam_datapath::RouteMaps::from_pins(node.bpffs_root())
            .and_then(|m| m.list())
            .unwrap_or_default();
        let shown: Vec<String> = routes
            .iter()
            .map(|(cidr, t)| format!("{cidr} via {}", t.next_hop))
            .collect();
        println!(
            "    {} route map (bpf_redirect_neigh out of {UPLINK}): {}",
            node.name,
            shown.join(", ")
        );
    }

    step(
        7,
        "ipamctl on node-0: its own state, the cluster's blocks read from etcd, and the gossip \
         as node-0 sees it",
    );
    let out = c.nodes[0]
        .ns
        .command(workspace_binary("ipamctl"))
        .args(["ipam", "status", "--config"])
        .arg(c.nodes[0].config_path())
        .output()
        .expect("run ipamctl");
    println!("    $ ipamctl ipam status --config <node-0's ipamd.toml>");
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        println!("    {line}");
    }
    if !out.status.success() {
        fail(
            &c,
            &format!(
                "ipamctl failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        );
    }

    let members = c.ipamctl(0, &["members"]);
    println!("    $ ipamctl members --config <node-0's ipamd.toml>");
    for line in members.lines() {
        println!("    {line}");
    }

    step(
        8,
        "Cleaning up: pods, agents, operators, etcd members, pins and namespaces",
    );
    drop(pods);
    drop(client);
    drop(c);
    println!(
        "    done: three nodes got their blocks from the leading operator over etcd, pods on \
         every node reached each other across nodes, and the service IP answered; nothing is \
         left behind."
    );
}

/// The client resolves the service IP and talks to it over TCP.
fn service(c: &Cluster, client: &Netns) {
    let node_mac = c.nodes[0].ns.mac(UPLINK);
    let answer = client.run(|| {
        let t = Instant::now();
        let a = Resolver::new("eth0").arp(CLIENT_V4, SERVICE_V4, Duration::from_secs(1));
        (a, t.elapsed())
    });
    match answer {
        (Some(reply), rtt) => println!(
            "    ARP answered in {} µs: {SERVICE_V4} is at {} (node-0's {UPLINK}: {})",
            rtt.as_micros(),
            Mac(reply.sender_mac),
            if reply.sender_mac == node_mac {
                "correct"
            } else {
                "WRONG"
            }
        ),
        (None, _) => fail(c, "no ARP answer for the service IP"),
    }
    match client.run(|| Resolver::new("eth0").ndp(CLIENT_V6, SERVICE_V6, Duration::from_secs(1))) {
        Some(na) => println!(
            "    neighbour advertisement: {SERVICE_V6} is at {}",
            Mac(na.lladdr_option.map(|o| o.1).unwrap_or_default())
        ),
        None => fail(c, "no NDP answer for the service IPv6 address"),
    }
    let listener = c.nodes[0]
        .ns
        .run(|| TcpListener::bind((SERVICE_V4, 8080)).expect("listen on the service IP"));
    let server = std::thread::spawn(move || {
        if let Ok((mut conn, _)) = listener.accept() {
            let _ = conn.write_all(b"hello from the service on node-0\n");
        }
    });
    let greeting = client.run(|| {
        let mut s = TcpStream::connect_timeout(&(SERVICE_V4, 8080).into(), Duration::from_secs(2))
            .expect("connect to the service IP");
        let mut text = String::new();
        s.read_to_string(&mut text).expect("read greeting");
        text
    });
    let _ = server.join();
    println!("    TCP {SERVICE_V4}:8080 said: {}", greeting.trim());
}

/// Adds a pod like a runtime: code 11 (try again later) is retried, anything else fails.
fn add_pod(node: &ClusterNode, tag: &str) -> ClusterPod {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match node.try_add_pod(tag) {
            Ok(pod) => return pod,
            Err(e) if e["code"] == 11 && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("CNI ADD of {tag} on {}: {e}\n{}", node.name, node.log()),
        }
    }
}

fn fail(c: &Cluster, what: &str) -> ! {
    eprintln!("LAB FAILED: {what}");
    for node in &c.nodes {
        eprintln!("--- {} log ---\n{}", node.name, node.log());
    }
    for i in 0..c.operators.len() {
        eprintln!("--- operator {i} log ---\n{}", c.operator_log(i));
    }
    // Destructors of the namespaces, daemons and etcd members run on unwinding.
    panic!("{what}");
}
