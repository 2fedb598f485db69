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
