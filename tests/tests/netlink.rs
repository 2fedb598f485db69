//! The project's netlink crate against the kernel: what the test kit and the CNI plugin build
//! on. Named namespaces must interoperate with `ip netns`, routes must read back as written.

use std::net::IpAddr;

use ipam_netlink::{Netlink, netns};
use ipam_tests::{
    netns::{Netns, veth},
    unique,
};

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

#[test]
fn a_named_namespace_is_seen_by_ip_netns_refuses_a_second_create_and_deletes_twice() {
    let name = unique("nlns");
    let path = netns::create(&name).expect("create");
    let listed = ipam_tests::run("ip", &["netns", "list"]);
    assert!(
        listed.contains(&name),
        "ip netns list shows {name}: {listed}"
    );
    // A fresh namespace has loopback only.
    let links = Netlink::open_in(&path).unwrap().links().unwrap();
    assert_eq!(
        links.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(),
        ["lo"]
    );

    let again = netns::create(&name).expect_err("a second namespace of the same name");
    assert!(
        again.to_string().contains(&path.display().to_string()),
        "the error names the namespace: {again}"
    );
    assert!(path.exists(), "a refused create leaves the first one alone");

    netns::delete(&name).expect("delete");
    assert!(!path.exists());
    netns::delete(&name).expect("deleting what is gone is not an error");
    assert!(!ipam_tests::run("ip", &["netns", "list"]).contains(&name));
}

#[test]
fn bridges_ports_addresses_and_routes_read_back_as_written() {
    let a = Netns::new("nla");
    let b = Netns::new("nlb");
    a.add_bridge("br0");
    veth(&a, "port0", &b, "eth0");
    a.add_port("port0", "br0");
    let bridge = a.link("br0");
    assert_eq!(a.link("port0").controller, Some(bridge.index));
    assert!(b.link("eth0").up);

    b.add_address("eth0", "10.61.0.2/24");
    b.add_address("eth0", "fd61::2/64");
    let mut addresses = b.addresses("eth0");
    addresses.retain(|(ip, _)| !matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local()));
    addresses.sort();
    assert_eq!(addresses, [(ip("10.61.0.2"), 24), (ip("fd61::2"), 64)]);

    b.route_via("10.62.0.0/16", "10.61.0.1");
    b.route_via("fd62::/48", "fd61::1");
    b.blackhole("10.63.0.7/32");
    let v4 = b.routes(false);
    let via = v4
        .iter()
        .find(|r| r.destination == ip("10.62.0.0"))
        .unwrap_or_else(|| panic!("{v4:?}"));
    assert_eq!(
        (via.prefix_len, via.gateway, via.output, via.blackhole),
        (16, Some(ip("10.61.0.1")), Some(b.ifindex("eth0")), false)
    );
    let hole = v4
        .iter()
        .find(|r| r.destination == ip("10.63.0.7"))
        .unwrap_or_else(|| panic!("{v4:?}"));
    assert!(hole.blackhole && hole.output.is_none(), "{hole:?}");
    let v6 = b.routes(true);
    assert!(
        v6.iter()
            .any(|r| r.destination == ip("fd62::") && r.gateway == Some(ip("fd61::1"))),
        "{v6:?}"
    );

    for cidr in ["10.62.0.0/16", "fd62::/48", "10.63.0.7/32"] {
        b.delete_route(cidr);
        b.delete_route(cidr); // gone already: not an error
    }
    let left: Vec<_> = b
        .routes(false)
        .into_iter()
        .chain(b.routes(true))
        .filter(|r| [ip("10.62.0.0"), ip("fd62::"), ip("10.63.0.7")].contains(&r.destination))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    b.delete_address("eth0", "10.61.0.2/24");
    assert!(!b.addresses("eth0").contains(&(ip("10.61.0.2"), 24)));
    b.down("eth0");
    assert!(!b.link("eth0").up);
}

#[test]
fn a_command_runs_in_the_namespace_it_was_made_for() {
    let ns = Netns::new("nlcmd");
    ns.add_bridge("marker0");
    let out = ns
        .command("cat")
        .arg("/proc/net/dev")
        .output()
        .expect("cat");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("marker0"), "{text}");
}

/// Addresses of one family for the stale-flow scenario below.
struct Plan {
    iptables: &'static str,
    forwarding: &'static str,
    /// client, node answering (towards the client), node answering (towards the dead node),
    /// the dead node, with their prefix length.
    client: &'static str,
    node: &'static str,
    node_inner: &'static str,
    dead: &'static str,
    /// The dead node's pod block, a pod in it that no longer answers, and one that answers
    /// on the dead node's loopback (a flow that got its answer before the node was held dead).
    dead_block: &'static str,
    dead_pod: &'static str,
    answering_pod: &'static str,
    /// Another silent address, outside the dead node's block.
    elsewhere: &'static str,
    elsewhere_block: &'static str,
    /// The Service IP the node answering DNATs, as kube-proxy does.
    service: &'static str,
    prefix: &'static str,
    /// The client's network, and its routes through the node answering.
    client_net: &'static str,
    client_routes: [&'static str; 3],
}

const V4: Plan = Plan {
    iptables: "iptables",
    forwarding: "net.ipv4.ip_forward=1",
    client: "10.64.0.1",
    node: "10.64.0.2",
    node_inner: "10.65.1.1",
    dead: "10.65.1.2",
    dead_block: "10.65.0.0/24",
    dead_pod: "10.65.0.5",
    answering_pod: "10.65.0.6",
    elsewhere: "10.67.0.5",
    elsewhere_block: "10.67.0.0/24",
    service: "10.66.0.10",
    prefix: "24",
    client_net: "10.64.0.0/24",
    client_routes: ["10.65.0.0/24", "10.66.0.0/24", "10.67.0.0/24"],
};

const V6: Plan = Plan {
    iptables: "ip6tables",
    forwarding: "net.ipv6.conf.all.forwarding=1",
    client: "fd64::1",
    node: "fd64::2",
    node_inner: "fd65:1::1",
    dead: "fd65:1::2",
    dead_block: "fd65::/64",
    dead_pod: "fd65::5",
    answering_pod: "fd65::6",
    elsewhere: "fd67::5",
    elsewhere_block: "fd67::/64",
    service: "fd66::10",
    prefix: "64",
    client_net: "fd64::/64",
    client_routes: ["fd65::/64", "fd66::/64", "fd67::/64"],
};

fn socket(ip: &str, port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::new(self::ip(ip), port)
}

/// A TCP connection from `local` (reused: the same client port again) to `remote` in `ns`,
/// open or why not within half a second.
fn connect_from(
    ns: &Netns,
    local: std::net::SocketAddr,
    remote: std::net::SocketAddr,
) -> Result<std::net::TcpStream, String> {
    ns.run(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let socket = match local {
                std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
                std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
            }
            .map_err(|e| e.to_string())?;
            socket.set_reuseaddr(true).map_err(|e| e.to_string())?;
            socket
                .bind(local)
                .map_err(|e| format!("bind {local}: {e}"))?;
            let timeout = std::time::Duration::from_millis(500);
            match tokio::time::timeout(timeout, socket.connect(remote)).await {
                Ok(Ok(stream)) => {
                    let stream = stream.into_std().map_err(|e| e.to_string())?;
                    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
                    Ok(stream)
                }
                Ok(Err(e)) => Err(format!("{local} -> {remote}: {e}")),
                Err(_) => Err(format!("{local} -> {remote}: no answer within {timeout:?}")),
            }
        })
    })
}

/// What the agents' sweep is for, as a client sees it: a connection a kube-proxy-like DNAT
/// sent to a pod that no longer answers leaves a conntrack entry, and a new connection from
/// the same client port follows that entry to the dead pod even after the rules point
/// elsewhere. Deleting the unanswered flows from the dead node's block lets it follow the
/// rules; a flow that had its answer, and an unanswered one elsewhere, are left alone.
#[test]
fn deleting_unanswered_flows_from_a_dead_block_lets_a_reused_client_port_follow_the_rules() {
    for plan in [V4, V6] {
        unanswered_flows_scenario(&plan);
    }
}

fn unanswered_flows_scenario(plan: &Plan) {
    use std::io::{Read, Write};

    let client = Netns::new("ctc");
    let node = Netns::new("ctn");
    let dead = Netns::new("ctd");
    veth(&client, "eth0", &node, "client0");
    veth(&node, "dead0", &dead, "eth0");
    let with_prefix = |ip: &str| format!("{ip}/{}", plan.prefix);
    client.add_address("eth0", &with_prefix(plan.client));
    node.add_address("client0", &with_prefix(plan.node));
    node.add_address("dead0", &with_prefix(plan.node_inner));
    dead.add_address("eth0", &with_prefix(plan.dead));
    let host = if plan.prefix == "24" { "32" } else { "128" };
    dead.add_address("lo", &format!("{}/{host}", plan.answering_pod));
    for route in plan.client_routes {
        client.route_via(route, plan.node);
    }
    node.route_via(plan.dead_block, plan.dead);
    node.route_via(plan.elsewhere_block, plan.dead);
    dead.route_via(plan.client_net, plan.node_inner);
    let run = |ns: &Netns, program: &str, args: &[&str]| {
        let out = ns.command(program).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{program} {args:?} in {}: {out:?}",
            ns.name
        );
    };
    run(&node, "sysctl", &["-q", "-w", plan.forwarding]);
    // The dead pod and the address elsewhere are silent: what reaches them is dropped.
    for silent in [plan.dead_pod, plan.elsewhere] {
        run(
            &dead,
            plan.iptables,
            &["-t", "raw", "-A", "PREROUTING", "-d", silent, "-j", "DROP"],
        );
    }
    let backend = |ip: &str, port| {
        if ip.contains(':') {
            format!("[{ip}]:{port}")
        } else {
            format!("{ip}:{port}")
        }
    };
    let dnat = ipam_tests::netns::dnat_args(plan.service, 80, &backend(plan.dead_pod, 8080));
    run(
        &node,
        plan.iptables,
        &dnat.iter().map(String::as_str).collect::<Vec<_>>(),
    );

    // A live endpoint on the node answering, and a pod answering on the dead node.
    let live = node.run({
        let at = socket(plan.node, 8080);
        move || std::net::TcpListener::bind(at).unwrap()
    });
    let answering = dead.run({
        let at = socket(plan.answering_pod, 9090);
        move || std::net::TcpListener::bind(at).unwrap()
    });
    let echo = std::thread::spawn(move || {
        let (mut stream, _) = answering.accept().unwrap();
        let mut buffer = [0; 16];
        while let Ok(n @ 1..) = stream.read(&mut buffer) {
            stream.write_all(&buffer[..n]).unwrap();
        }
    });
    // IPv6 forwards only once the links' own addresses have finished their duplicate address
    // detection (a second or two): the first connection waits for the path.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut answered = loop {
        match connect_from(
            &client,
            socket(plan.client, 0),
            socket(plan.answering_pod, 9090),
        ) {
            Ok(stream) => break stream,
            Err(e) if std::time::Instant::now() > deadline => {
                panic!("the pod on the dead node's loopback answers: {e}")
            }
            Err(_) => {}
        }
    };

    let reused = socket(plan.client, 40001);
    let service = socket(plan.service, 80);
    connect_from(&client, reused, service).expect_err("the dead pod does not answer");
    connect_from(&client, socket(plan.client, 0), socket(plan.elsewhere, 80))
        .expect_err("the address elsewhere does not answer");

    // kube-proxy catches up: the Service's rule now points at the live endpoint.
    let mut replace = dnat.clone();
    replace[2] = "-R".into();
    replace.insert(4, "1".into());
    *replace.last_mut().unwrap() = backend(plan.node, 8080);
    run(
        &node,
        plan.iptables,
        &replace.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    connect_from(&client, socket(plan.client, 40002), service)
        .expect("a new client port follows the new rule");
    let stale = connect_from(&client, reused, service)
        .expect_err("the reused port follows the stale entry to the dead pod");
    assert!(stale.contains("no answer"), "{stale}");

    let conntrack = ipam_netlink::conntrack::Conntrack::open_in(&node.path()).unwrap();
    let block: ipam_core::cidr::Cidr = plan.dead_block.parse().unwrap();
    let flows = conntrack.flows().unwrap();
    let to_dead: Vec<_> = flows
        .iter()
        .filter(|f| f.reply.source == ip(plan.dead_pod))
        .collect();
    assert!(
        to_dead.len() == 1
            && !to_dead[0].replied
            && to_dead[0].tcp_state == Some(ipam_netlink::conntrack::TCP_SYN_SENT)
            && to_dead[0].original.destination == ip(plan.service)
            && to_dead[0].original.source_port == Some(40001),
        "one flow DNATed from the Service to the dead pod, in SYN_SENT: {flows:#?}"
    );
    // Over IPv6 the first connections to the answering pod may have gone out before the path
    // was ready (duplicate address detection): their unanswered entries are in the block too,
    // and go with the sweep. Every unanswered flow into the block, and nothing else.
    let unanswered_in_block = flows
        .iter()
        .filter(|f| !f.replied && block.contains(f.reply.source))
        .count();
    let deleted = conntrack.delete_unreplied(|ip| block.contains(ip)).unwrap();
    assert_eq!(deleted.len(), unanswered_in_block, "{flows:#?}");
    assert!(
        deleted
            .iter()
            .all(|f| !f.replied && block.contains(f.reply.source)),
        "{deleted:#?}"
    );
    assert!(
        deleted
            .iter()
            .any(|f| f.original.source_port == Some(40001)),
        "the reused port's flow to the dead pod swept: {deleted:#?}"
    );

    connect_from(&client, reused, service)
        .expect("after the sweep the reused port follows the rule to the live endpoint");
    answered.write_all(b"still").unwrap();
    let mut back = [0; 5];
    answered.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"still", "the flow that had its answer goes on");
    let flows = conntrack.flows().unwrap();
    assert!(
        flows
            .iter()
            .any(|f| !f.replied && f.reply.source == ip(plan.elsewhere)),
        "the unanswered flow outside the block stays: {flows:#?}"
    );
    assert!(
        flows
            .iter()
            .any(|f| f.replied && f.reply.source == ip(plan.answering_pod)),
        "the answered flow from the block stays: {flows:#?}"
    );
    drop(answered);
    echo.join().unwrap();
    drop(live);
}
