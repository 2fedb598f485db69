//! Service IPs across nodes with real etcd, real agents and a client on the segment: LB-IPAM
//! assigns from a pool, exactly one node answers ARP for each IP (the client sees no second
//! answer), the IP moves within seconds when its node loses power, a node cut off from the store
//! goes silent before another takes over and takes its IPs back when it returns, 200 services
//! spread over the nodes without per-service store writes, and a pool outside every announced
//! subnet is flagged.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use ipam_core::lb::resources::{
    LbIpBlock, LbIpPool, LbIpPoolSpec, LbIpPoolStatus, Selector, Service,
};
use ipam_tests::{
    cluster::{Cluster, NODE_LEASE_MS, wait_until},
    failover::lb_service,
    netns::Netns,
    resolve::Resolver,
};

const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 100);

fn range(start: &str, stop: &str) -> LbIpBlock {
    LbIpBlock {
        cidr: None,
        start: Some(start.into()),
        stop: Some(stop.into()),
    }
}

fn pool(blocks: Vec<LbIpBlock>) -> LbIpPool {
    LbIpPool {
        spec: LbIpPoolSpec {
            blocks,
            service_selector: Selector::default(),
            allow_first_last_ips: false,
            disabled: false,
        },
        status: LbIpPoolStatus::default(),
    }
}

/// Every service's IPv4 address, by service name.
fn service_ips(c: &Cluster) -> BTreeMap<String, Ipv4Addr> {
    c.list::<Service>()
        .into_iter()
        .filter_map(|s| match s.value.status.ingress.first() {
            Some(IpAddr::V4(v4)) => Some((s.name, *v4)),
            _ => None,
        })
        .collect()
}

/// The MACs that answer one ARP request for `ip`, as the client sees them.
fn answers(client: &Netns, ip: Ipv4Addr) -> Vec<[u8; 6]> {
    client.run(move || Resolver::new("eth0").arp_all(CLIENT, ip, Duration::from_millis(250)))
}

/// Which node's MAC is `mac`.
fn node_of(macs: &BTreeMap<[u8; 6], String>, mac: [u8; 6]) -> String {
    macs.get(&mac)
        .cloned()
        .unwrap_or_else(|| format!("{mac:x?}"))
}

/// The node answering for `ip`; panics unless exactly one answers (within a few seconds).
fn owner_of(c: &Cluster, client: &Netns, macs: &BTreeMap<[u8; 6], String>, ip: Ipv4Addr) -> String {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        got = answers(client, ip);
        if !got.is_empty() {
            break;
        }
    }
    assert_eq!(
        got.len(),
        1,
        "{ip}: answers from {got:x?}\n{}",
        c.nodes
            .iter()
            .map(ipam_tests::cluster::ClusterNode::log)
            .collect::<Vec<_>>()
            .join("\n---\n")
    );
    node_of(macs, got[0])
}

#[test]
fn one_node_answers_each_service_ip_and_it_moves_when_that_node_dies() {
    let mut c = Cluster::start("sv", 1);
    for _ in 0..3 {
        c.add_node("sv");
    }
    wait_until(
        Duration::from_secs(30),
        "every agent ready",
        || c.nodes.iter().all(ipam_tests::cluster::ClusterNode::ready),
        || format!("{:?}", c.blocks()),
    );
    let macs: BTreeMap<[u8; 6], String> =
        c.nodes.iter().map(|n| (n.mac(), n.name.clone())).collect();
    // Pool (inside the segment, around the client's address) and policy, as a user writes them.
    let manifest = ipam_tests::TempFile::new("svlb", "yaml");
    std::fs::write(
        &manifest.0,
        "kind: LoadBalancerIPPool\nmetadata: { name: lb }\nspec:\n  blocks:\n\
         \x20   - { start: 10.77.0.10, stop: 10.77.0.99 }\n\
         \x20   - { start: 10.77.0.101, stop: 10.77.0.250 }\n---\n\
         kind: L2AnnouncementPolicy\nmetadata: { name: uplinks }\nspec: { interfaces: [ \"up[0-9]+\" ] }\n",
    )
    .unwrap();
    let applied = c.ipamctl(0, &["apply", "-f", &manifest.0.display().to_string()]);
    assert!(
        applied.contains("LoadBalancerIPPool lb created")
            && applied.contains("L2AnnouncementPolicy uplinks created"),
        "{applied}"
    );
    for i in 0..6 {
        c.put(&format!("default/web-{i}"), &lb_service(80));
    }
    wait_until(
        Duration::from_secs(20),
        "the services' IPs",
        || service_ips(&c).len() == 6,
        || c.operator_log(0),
    );
    let ips = service_ips(&c);
    let client = c.add_client("svcl");
    let listed = c.ipamctl(0, &["get", "services"]);
    assert!(
        listed.contains("default/web-0") && listed.contains(&ips["default/web-0"].to_string()),
        "{listed}"
    );

    // Exactly one MAC answers for each IP.
    let owners: BTreeMap<String, String> = ips
        .iter()
        .map(|(s, ip)| (s.clone(), owner_of(&c, &client, &macs, *ip)))
        .collect();
    eprintln!("owners: {owners:?}");

    // Power loss of the node answering for web-0: another node answers within seconds.
    let victim_name = owners["default/web-0"].clone();
    let victim = c.nodes.iter().position(|n| n.name == victim_name).unwrap();
    let ip = ips["default/web-0"];
    c.nodes[victim].power_off();
    let lost = Instant::now();
    let new_owner = loop {
        let got = answers(&client, ip);
        assert!(got.len() <= 1, "two nodes answered for {ip}: {got:x?}");
        if let Some(mac) = got.first() {
            break node_of(&macs, *mac);
        }
        assert!(lost.elapsed() < Duration::from_secs(10), "{ip} never moved");
    };
    let took = lost.elapsed();
    assert_ne!(new_owner, victim_name);
    eprintln!("{ip} moved from {victim_name} to {new_owner} after {took:?}");
    assert!(
        took < Duration::from_millis(NODE_LEASE_MS * 3),
        "took {took:?} with a {NODE_LEASE_MS} ms node lease"
    );

    // A node that loses the store but stays on the link goes silent before another answers,
    // and takes its IPs back when the store returns.
    let survivors: Vec<usize> = (0..3).filter(|i| *i != victim).collect();
    let cut = survivors[0];
    let cut_name = c.nodes[cut].name.clone();
    let cut_ips: Vec<Ipv4Addr> = ips
        .iter()
        .filter(|(_, ip)| owner_of(&c, &client, &macs, **ip) == cut_name)
        .map(|(_, ip)| *ip)
        .collect();
    assert!(!cut_ips.is_empty(), "{cut_name} owns something to lose");
    c.nodes[cut].ns.blackhole("10.77.0.254/32");
    let started = Instant::now();
    let mut moved: BTreeSet<Ipv4Addr> = BTreeSet::new();
    while moved.len() < cut_ips.len() {
        for ip in &cut_ips {
            let got = answers(&client, *ip);
            assert!(got.len() <= 1, "two nodes answered for {ip}: {got:x?}");
            if got.first().is_some_and(|m| node_of(&macs, *m) != cut_name) {
                moved.insert(*ip);
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the cut-off node's IPs never moved: {moved:?} of {cut_ips:?}\n{}",
            c.nodes[cut].log()
        );
    }
    assert!(c.nodes[cut].log().contains("responders go silent"));
    c.nodes[cut].ns.delete_route("10.77.0.254/32");
    wait_until(
        Duration::from_secs(15),
        "the returning node to answer for its IPs again",
        || {
            cut_ips.iter().all(|ip| {
                let got = answers(&client, *ip);
                assert!(got.len() <= 1, "two nodes answered for {ip}: {got:x?}");
                got.first().is_some_and(|m| node_of(&macs, *m) == cut_name)
            })
        },
        || c.nodes[cut].log(),
    );

    // 200 services spread over the live nodes, with no store write per service in steady state.
    for i in 6..206 {
        c.put(&format!("default/many-{i}"), &lb_service(80));
    }
    wait_until(
        Duration::from_secs(30),
        "206 services with IPs",
        || service_ips(&c).len() == 206,
        || c.operator_log(0),
    );
    let live: Vec<usize> = (0..3).filter(|i| *i != victim).collect();
    wait_until(
        Duration::from_secs(10),
        "the live nodes to announce all 206 IPs",
        || {
            live.iter()
                .map(|i| {
                    ipam_daemon::datapath::ResponderMaps::from_pins(c.nodes[*i].bpffs_root())
                        .and_then(|m| m.list())
                        .map(|l| l.len())
                        .unwrap_or(0)
                })
                .sum::<usize>()
                == 206
        },
        String::new,
    );
    for i in &live {
        let n = ipam_daemon::datapath::ResponderMaps::from_pins(c.nodes[*i].bpffs_root())
            .unwrap()
            .list()
            .unwrap()
            .len();
        assert!(n > 50, "{} announces only {n} of 206", c.nodes[*i].name);
    }
    std::thread::sleep(Duration::from_secs(1));
    let writes = c.count_writes(|| std::thread::sleep(Duration::from_secs(3)));
    eprintln!("steady-state writes in 3 s: {writes:?}");
    assert!(
        writes.keys().all(|k| k.contains("Lease")),
        "only leases are written in steady state: {writes:?}"
    );

    // The announcing node shown by ipamctl is the one that answers.
    let listed = c.ipamctl(0, &["get", "services"]);
    let line = listed
        .lines()
        .find(|l| l.contains("default/web-1 "))
        .unwrap_or_else(|| panic!("{listed}"));
    let answering = owner_of(&c, &client, &macs, ips["default/web-1"]);
    assert!(
        line.contains(&answering),
        "{line} (answered by {answering})"
    );
    // who-has answers for a service IP, a node's address and a free pool address.
    let ip1 = ips["default/web-1"].to_string();
    let said = c.ipamctl(0, &["who-has", &ip1]);
    assert!(
        said.contains("service default/web-1")
            && said.contains(&format!("announced by {answering}")),
        "{said}"
    );
    let said = c.ipamctl(0, &["who-has", "10.77.0.2"]);
    assert!(
        said.contains("node node-1's address between nodes"),
        "{said}"
    );
    let said = c.ipamctl(0, &["who-has", "10.77.0.249", "-o", "json"]);
    let json: serde_json::Value = serde_json::from_str(&said).unwrap();
    assert_eq!(json["findings"][0]["what"], "free-in-pool", "{said}");
    assert_eq!(json["findings"][0]["pool"], "lb", "{said}");
    let pools = c.ipamctl(0, &["pools"]);
    assert!(
        pools.contains("pod pool default")
            && pools.contains("load-balancer pool lb")
            && pools.contains("node-0: 10.240.0.0/24"),
        "{pools}"
    );
    c.ipamctl(0, &["delete", "services", "default/web-1"]);
    assert!(!service_ips(&c).contains_key("default/web-1"));

    // The seed's silently unreachable pool: flagged on the pool and on its services.
    c.put("far", &pool(vec![range("172.18.250.1", "172.18.250.9")]));
    wait_until(
        Duration::from_secs(10),
        "the unreachable pool's warning",
        || {
            c.list::<LbIpPool>().iter().any(|p| {
                p.name == "far"
                    && p.value.status.conditions.iter().any(|c| {
                        c.kind == "Reachable" && !c.status && c.message.contains("172.18.250.1")
                    })
            })
        },
        || format!("{:?}", c.list::<LbIpPool>()),
    );
    let listed = c.ipamctl(0, &["get", "lbpools"]);
    let far = listed
        .lines()
        .find(|l| l.contains("far"))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(
        far.contains("Reachable=false") && far.contains("172.18.250.1"),
        "{far}"
    );
}

/// LB-IPAM through the operator over real etcd: adding a pool that overlaps the one in use,
/// named to sort first, moves no IP (the newcomer is flagged); a Service that turns NodePort
/// gives its IP back at once and its status is cleared; the released IP serves the next Service.
#[test]
fn a_new_pool_renumbers_nothing_and_a_service_leaving_releases_its_ip() {
    let c = Cluster::start("lbo", 1);
    let mut in_use = pool(vec![range("10.77.0.10", "10.77.0.19")]);
    in_use.spec.blocks.push(LbIpBlock {
        cidr: Some("fd77::100/124".into()),
        start: None,
        stop: None,
    });
    c.put("zzz-in-use", &in_use);
    let mut dual = lb_service(80);
    dual.spec.ip_family_policy = ipam_core::lb::resources::IpFamilyPolicy::RequireDualStack;
    for name in ["default/web", "default/api"] {
        c.put(name, &dual);
    }
    let held = || -> BTreeMap<String, Vec<IpAddr>> {
        c.list::<Service>()
            .into_iter()
            .map(|s| (s.name, s.value.status.ingress))
            .collect()
    };
    wait_until(
        Duration::from_secs(20),
        "both services' IPv4 and IPv6 addresses",
        || held().values().filter(|ips| ips.len() == 2).count() == 2,
        || c.operator_log(0),
    );
    let before = held();

    // The newcomer overlaps both families of the pool in use and sorts first by name.
    let mut newcomer = pool(vec![range("10.77.0.5", "10.77.0.30")]);
    newcomer.spec.blocks.push(LbIpBlock {
        cidr: Some("fd77::100/120".into()),
        start: None,
        stop: None,
    });
    c.put("aaa-newcomer", &newcomer);
    let conflict = || {
        c.list::<LbIpPool>()
            .into_iter()
            .find(|p| p.name == "aaa-newcomer")
            .and_then(|p| {
                p.value
                    .status
                    .conditions
                    .into_iter()
                    .find(|c| c.kind == "Conflict")
            })
    };
    wait_until(
        Duration::from_secs(20),
        "the newcomer flagged",
        || conflict().is_some(),
        || c.operator_log(0),
    );
    let flagged = conflict().unwrap();
    assert!(
        flagged.status && flagged.message.contains("overlaps pool zzz-in-use"),
        "{flagged:?}"
    );
    // A few passes later, still no IP has moved.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(held(), before, "adding a pool moved an IP");

    // web turns NodePort: its IPs are released and its status cleared.
    let web = c
        .list::<Service>()
        .into_iter()
        .find(|s| s.name == "default/web")
        .unwrap();
    let released = web.value.status.ingress.clone();
    let mut node_port = web.value.clone();
    node_port.spec.service_type = ipam_core::lb::resources::ServiceType::NodePort;
    c.put("default/web", &node_port);
    let web_status = || {
        c.list::<Service>()
            .into_iter()
            .find(|s| s.name == "default/web")
            .map(|s| s.value.status)
            .unwrap_or_default()
    };
    wait_until(
        Duration::from_secs(20),
        "web's status cleared",
        || {
            let status = web_status();
            status.ingress.is_empty() && !status.conditions.iter().any(|c| c.kind == "IPAssigned")
        },
        || format!("{:?}\n{}", web_status(), c.operator_log(0)),
    );
    // The released addresses are free: the next Service takes them (the lowest free).
    c.put("default/next", &dual);
    wait_until(
        Duration::from_secs(20),
        "the next Service served from the released IPs",
        || held().get("default/next") == Some(&released),
        || format!("{:?}\n{}", held(), c.operator_log(0)),
    );
    assert_eq!(held()["default/api"], before["default/api"]);
}
