//! Service IPs across nodes with real etcd, real agents and a client on the segment: LB-IPAM
//! assigns from a pool, exactly one node answers ARP for each IP (the client sees no second
//! answer), the IP moves within seconds when its node loses power, a node cut off from the store
//! goes silent before another takes over and takes its IPs back when it returns, 200 services
//! spread over the nodes without per-service store writes, a pool outside every announced
//! subnet is flagged, a Service with `externalTrafficPolicy: Local` is answered for only where a
//! ready endpoint of it runs, an IP two Services share on two L2 policies gets one answer, and
//! an external IP is answered for only inside a pool that serves the Service's namespace.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
    path::Path,
    time::{Duration, Instant},
};

use ipam_core::{
    lb::resources::{
        LbIpBlock, LbIpPool, LbIpPoolSpec, LbIpPoolStatus, Service, ServiceEndpoint,
        ServiceEndpoints, ServiceEndpointsSpec, TrafficPolicy,
    },
    meta::Selector,
};
use ipam_tests::{
    arp_watch::{ArpSample, ArpWatch, double_answers},
    cluster::{Cluster, NODE_LEASE_MS, wait_until},
    cni::{DEBIAN_CNI, run_cni},
    failover::{lb_service, uplink_policy},
    netns::{Netns, command_in, veth},
    resolve::Resolver,
    traffic::{Backends, HeldConnection, PORT, RequestLoop, Requests},
};

const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 100);

/// The tests that assert every request answered by one owner through restarts and moves take
/// turns: two of them side by side (agents of two clusters starting at once, on 2 CPUs) once
/// delayed a node's lease renewal past half a lease, and the node rightly fenced itself for a
/// moment: an overload of the machine, not what they test. Run alone, 8 runs in a row passed.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn range(start: &str, stop: &str) -> LbIpBlock {
    LbIpBlock {
        cidr: None,
        start: Some(start.into()),
        stop: Some(stop.into()),
    }
}

fn pool(blocks: Vec<LbIpBlock>) -> LbIpPool {
    LbIpPool {
        labels: Default::default(),
        spec: LbIpPoolSpec {
            blocks,
            service_selector: Selector::default(),
            allow_first_last_ips: false,
            auto_assign: true,
            avoid_buggy_ips: false,
            namespaces: Vec::new(),
            priority: None,
            disabled: false,
            namespace_selector: Default::default(),
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
    // Its return is a handover between two live nodes: the node answering meanwhile lets go
    // before the returning one answers, asked all along every 40 ms.
    let returned = Instant::now();
    let watches: Vec<ArpWatch> = cut_ips
        .iter()
        .map(|ip| ArpWatch::start(&client, CLIENT, *ip, returned))
        .collect();
    c.nodes[cut].ns.delete_route("10.77.0.254/32");
    wait_until(
        Duration::from_secs(15),
        "the returning node to answer for its IPs again",
        || {
            ipam_datapath::ResponderMaps::from_pins(c.nodes[cut].bpffs_root())
                .and_then(|m| m.list())
                .is_ok_and(|l| {
                    cut_ips
                        .iter()
                        .all(|ip| l.iter().any(|e| e.ip == IpAddr::V4(*ip)))
                })
        },
        || c.nodes[cut].log(),
    );
    std::thread::sleep(Duration::from_secs(1));
    for (ip, watch) in cut_ips.iter().zip(watches) {
        let samples = watch.stop();
        let doubles = double_answers(&samples);
        assert!(
            doubles.is_empty(),
            "two nodes answered for {ip} while {cut_name} returned: {doubles:x?}\n{}",
            c.nodes[cut].log()
        );
        let last = samples.last().and_then(|s| s.macs.first());
        assert_eq!(
            last.map(|m| node_of(&macs, *m)).as_deref(),
            Some(cut_name.as_str()),
            "{ip} answered by its owner again"
        );
    }

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
                    ipam_datapath::ResponderMaps::from_pins(c.nodes[*i].bpffs_root())
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
        let n = ipam_datapath::ResponderMaps::from_pins(c.nodes[*i].bpffs_root())
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

    let live: Vec<&str> = live.iter().map(|i| c.nodes[*i].name.as_str()).collect();
    external_ips_are_answered_only_where_a_pool_gives_them(&c, &client, &macs, &live);
}

/// The policy now announces `externalIPs` too (the class of CVE-2020-8554: anyone who may
/// create a Service may list any address there). A pool gives 10.77.0.251-252 to the
/// namespaces labelled `tenant: a` (tenant-a alone). What the client on the segment sees: tenant-a's ClusterIP Service listing
/// 10.77.0.251 is answered by one node; tenant-b's listing 10.77.0.252 (tenant-a's), node-1's
/// own address, another Service's LB IP, or an address in no pool gets no answer of ours (the
/// node's own kernel alone answers for its address, the LB IP keeps its one owner), and each
/// is told why in its `Announced` condition.
fn external_ips_are_answered_only_where_a_pool_gives_them(
    c: &Cluster,
    client: &Netns,
    macs: &BTreeMap<[u8; 6], String>,
    live: &[&str],
) {
    // By the namespace's label, so the agents' copy of the Namespaces decides.
    let mut tenant_a = pool(vec![range("10.77.0.251", "10.77.0.252")]);
    tenant_a.spec.auto_assign = false;
    tenant_a.spec.namespace_selector =
        serde_json::from_value(serde_json::json!({ "matchLabels": { "tenant": "a" } })).unwrap();
    c.put(
        "tenant-a",
        &ipam_core::lb::resources::Namespace {
            labels: [("tenant".to_owned(), "a".to_owned())].into(),
        },
    );
    c.put("tenant-a-external", &tenant_a);
    let mut policy = uplink_policy();
    policy.spec.external_ips = true;
    c.put("uplinks", &policy);
    let lb_ip = service_ips(c)["default/web-2"];
    let lb_owner = owner_of(c, client, macs, lb_ip);
    let node_1 = Ipv4Addr::new(10, 77, 0, 2);
    let listing = |ips: &[Ipv4Addr]| {
        let mut service = lb_service(80);
        service.spec.service_type = ipam_core::lb::resources::ServiceType::ClusterIP;
        service.spec.external_ips = ips.iter().map(|ip| IpAddr::V4(*ip)).collect();
        service
    };
    let own = Ipv4Addr::new(10, 77, 0, 251);
    let theirs = Ipv4Addr::new(10, 77, 0, 252);
    let nowhere = Ipv4Addr::new(10, 77, 0, 253);
    c.put("tenant-a/own", &listing(&[own]));
    c.put("tenant-b/theirs", &listing(&[theirs]));
    c.put("tenant-b/node", &listing(&[node_1]));
    c.put("tenant-b/lb-ip", &listing(&[lb_ip]));
    c.put("tenant-b/nowhere", &listing(&[nowhere]));
    let refused = |service: &str| {
        c.service_status(service)
            .conditions
            .into_iter()
            .find(|c| c.kind == "Announced" && !c.status)
            .map(|c| c.message)
    };
    let said: BTreeMap<&str, &str> = [
        ("tenant-b/theirs", "pool tenant-a-external"),
        ("tenant-b/node", "address of node node-1"),
        ("tenant-b/lb-ip", "assigned to default/web-2 by LB-IPAM"),
        ("tenant-b/nowhere", "in no LBIPPool"),
    ]
    .into();
    wait_until(
        Duration::from_secs(20),
        "each refused external IP told on its Service",
        || {
            said.iter()
                .all(|(s, why)| refused(s).is_some_and(|m| m.contains(why)))
        },
        || {
            let got: Vec<_> = said.keys().map(|s| (s, refused(s))).collect();
            format!("{got:?}\n{}", c.operator_log(0))
        },
    );
    assert_eq!(refused("tenant-a/own"), None);
    let owner = owner_of(c, client, macs, own);
    assert!(live.contains(&owner.as_str()), "{own} answered by {owner}");
    // Given time to be answered wrongly: the refused ones stay as they were.
    std::thread::sleep(Duration::from_secs(2));
    for ip in [theirs, nowhere] {
        let got = answers(client, ip);
        assert!(got.is_empty(), "{ip} answered by {got:x?}");
    }
    let got = answers(client, node_1);
    assert_eq!(
        got,
        [c.nodes[1].mac()],
        "{node_1}: only node-1's kernel answers"
    );
    assert_eq!(owner_of(c, client, macs, lb_ip), lb_owner);
    let announced: Vec<IpAddr> = c
        .nodes
        .iter()
        .filter(|n| live.contains(&n.name.as_str()))
        .flat_map(|n| {
            ipam_datapath::ResponderMaps::from_pins(n.bpffs_root())
                .and_then(|m| m.list())
                .unwrap_or_else(|e| panic!("{}'s responder map: {e}", n.name))
                .into_iter()
                .map(|e| e.ip)
        })
        .collect();
    for ip in [theirs, nowhere, node_1] {
        assert!(
            !announced.contains(&IpAddr::V4(ip)),
            "{ip} in a responder map"
        );
    }
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
    let web_status = || c.service_status("default/web");
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

    a_service_cannot_claim_another_tenants_pool_by_label(&c);
}

/// Through the operator over real etcd: a pool for tenant-one's Services (by the label Cilium
/// derives from the namespace), and a Service of tenant-two that asks for that pool and labels
/// itself as tenant-one's: refused, told the label is reserved; tenant-one's own is served.
fn a_service_cannot_claim_another_tenants_pool_by_label(c: &Cluster) {
    let mut tenant = pool(vec![range("10.77.0.40", "10.77.0.49")]);
    tenant.spec.service_selector = serde_json::from_value(serde_json::json!({
        "matchLabels": { "io.kubernetes.service.namespace": "tenant-one" } }))
    .unwrap();
    c.put("tenant-one", &tenant);
    let mut asking = lb_service(80);
    asking.spec.pool = Some("tenant-one".into());
    let mut impostor = asking.clone();
    impostor.spec.labels.insert(
        "io.kubernetes.service.namespace".into(),
        "tenant-one".into(),
    );
    c.put("tenant-two/web", &impostor);
    c.put("tenant-one/web", &asking);
    let service = |name: &str| c.service_status(name);
    wait_until(
        Duration::from_secs(20),
        "tenant-one's Service served from its pool, the impostor told why not",
        || {
            !service("tenant-one/web").ingress.is_empty()
                && service("tenant-two/web")
                    .conditions
                    .iter()
                    .any(|c| c.kind == "LabelsAccepted" && !c.status)
        },
        || format!("{:?}\n{}", service("tenant-two/web"), c.operator_log(0)),
    );
    let ip = service("tenant-one/web").ingress[0];
    assert!(tenant.spec.contains(ip), "{ip} is not tenant-one's");
    let impostor = service("tenant-two/web");
    assert!(
        impostor.ingress.is_empty(),
        "the impostor got {:?}",
        impostor.ingress
    );
    let labels = impostor
        .conditions
        .iter()
        .find(|c| c.kind == "LabelsAccepted")
        .unwrap();
    assert!(
        labels
            .message
            .contains("io.kubernetes.service.namespace=tenant-one (it is tenant-two)"),
        "{labels:?}"
    );
}

/// A pod on `node` wired as a cluster with another CNI wires it: Debian's bridge plugin with
/// host-local addresses from the node's own subnet (10.88.i.0/24); neither ipam-cni nor the
/// agent takes part. Returns the pod's namespace and address.
fn bridge_pod(c: &Cluster, node: usize, tag: &str) -> (Netns, Ipv4Addr) {
    let n = &c.nodes[node];
    let pod = Netns::new(tag);
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "other-cni",
        "type": "bridge",
        "bridge": "cni0",
        "isGateway": true,
        "isDefaultGateway": true,
        "ipMasq": false,
        "ipam": {
            "type": "host-local",
            "ranges": [[{ "subnet": format!("10.88.{node}.0/24") }]],
            "dataDir": n.dir.0.join("host-local"),
        },
    });
    let (ok, result) = run_cni(
        &Path::new(DEBIAN_CNI).join("bridge"),
        Some(&n.ns),
        "ADD",
        &format!("ctr-{}", pod.name),
        "eth0",
        Some(&pod),
        &conf,
    );
    assert!(ok, "bridge ADD on {}: {result}", n.name);
    let address = result["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no IPv4 in the bridge plugin's result: {result}"));
    (pod, address)
}

/// Serves one line naming `who` to every connection on port 8080, from inside `pod`.
fn serve_name(pod: &Netns, who: String) {
    let listener =
        pod.run(|| std::net::TcpListener::bind("0.0.0.0:8080").expect("bind in the pod"));
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = std::io::Write::write_all(&mut stream, format!("{who}\n").as_bytes());
        }
    });
}

/// What the backend behind `ip:80` says to the client, or the error.
fn ask(client: &Netns, ip: Ipv4Addr) -> Result<String, String> {
    client.run(move || {
        let mut stream =
            std::net::TcpStream::connect_timeout(&(ip, 80).into(), Duration::from_secs(2))
                .map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        std::io::Read::read_to_string(&mut stream, &mut line).map_err(|e| e.to_string())?;
        Ok(line.trim().to_owned())
    })
}

/// The add-on mode over real etcd, beside another CNI: no `[ipam]` anywhere, pods wired by
/// Debian's bridge and host-local plugins. The operator assigns the Service's IP, exactly one
/// node answers ARP for it and a client reaches the pod behind it; the agents leave the node's
/// routes, links and TC hooks alone and record no pod IPAM; the IP moves when its node dies.
///
/// kube-proxy cannot run here (no API server): each node gets the DNAT rule kube-proxy's
/// iptables mode would write for the Service (LB IP:80 to the node's pod), which is the part of
/// it the announced IP relies on.
#[test]
fn the_add_on_mode_announces_service_ips_for_pods_another_cni_wired() {
    let mut c = Cluster::start_add_on("ao", 1);
    c.enable_gossip();
    let mut pods = Vec::new();
    for i in 0..3 {
        c.add_node("ao");
        let (pod, address) = bridge_pod(&c, i, &format!("aop{i}"));
        serve_name(&pod, format!("pod on node-{i}"));
        pods.push((pod, address));
    }
    let macs: BTreeMap<[u8; 6], String> =
        c.nodes.iter().map(|n| (n.mac(), n.name.clone())).collect();
    c.put("lb", &pool(vec![range("10.77.0.10", "10.77.0.20")]));
    c.put("uplinks", &uplink_policy());
    c.put("default/web", &lb_service(80));
    wait_until(
        Duration::from_secs(20),
        "the service's IP",
        || service_ips(&c).contains_key("default/web"),
        || c.operator_log(0),
    );
    let ip = service_ips(&c)["default/web"];
    for (i, (_, pod_ip)) in pods.iter().enumerate() {
        let rule = ipam_tests::netns::dnat_args(&ip.to_string(), 80, &format!("{pod_ip}:8080"));
        let status = c.nodes[i]
            .ns
            .command("iptables")
            .args(rule)
            .status()
            .unwrap();
        assert!(status.success(), "iptables DNAT on node-{i}");
    }
    let client = c.add_client("aocl");
    let owner = owner_of(&c, &client, &macs, ip);
    let reply = ask(&client, ip);
    assert_eq!(reply.as_deref(), Ok(format!("pod on {owner}").as_str()));

    // Nothing of pod IPAM: no mode recorded, no blocks, no host device, no pod datapath on the
    // uplink, and the node's routes are the kernel's own (segment and the bridge's subnet).
    assert!(
        c.list::<ipam_core::resources::IpamConfig>().is_empty(),
        "an add-on cluster records no pod IPAM mode"
    );
    for (name, record) in c.records() {
        assert!(
            record.value.status.allocated.is_empty() && !record.value.spec.addresses.is_empty(),
            "{name}: {:?}",
            record.value
        );
    }
    for (i, n) in c.nodes.iter().enumerate() {
        assert!(
            n.ns.links()
                .iter()
                .all(|l| !l.name.starts_with("ipam_host")),
            "{}",
            n.ns.describe()
        );
        let hooks =
            n.ns.command("tc")
                .args(["filter", "show", "dev", "up0", "ingress"])
                .output()
                .unwrap();
        let hooks = String::from_utf8_lossy(&hooks.stdout);
        assert!(!hooks.contains("pod_from_uplink"), "{}: {hooks}", n.name);
        let routes: BTreeSet<String> =
            n.ns.routes(false)
                .iter()
                .map(|r| format!("{}/{}", r.destination, r.prefix_len))
                .collect();
        let expected = BTreeSet::from(["10.77.0.0/24".to_owned(), format!("10.88.{i}.0/24")]);
        assert_eq!(routes, expected, "{}: only the kernel's routes", n.name);
    }
    // The local API answers `ipamctl members` from the gossip.
    wait_until(
        Duration::from_secs(10),
        "node-0's gossip to know the two others",
        || {
            let members = c.ipamctl(0, &["members"]);
            members.contains("node-1") && members.contains("node-2")
        },
        || c.ipamctl(0, &["members"]),
    );

    // The owner loses power: another node answers and its pod serves.
    let dead = c.nodes.iter().position(|n| n.name == owner).unwrap();
    c.nodes[dead].power_off();
    let mut moved = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while moved.is_none() && Instant::now() < deadline {
        moved = answers(&client, ip).first().map(|mac| node_of(&macs, *mac));
        if moved.as_deref() == Some(owner.as_str()) {
            moved = None;
        }
    }
    let survivor = moved.unwrap_or_else(|| panic!("{ip} never moved off {owner}"));
    // The client's ARP cache still names the dead node; a fresh answer replaces it.
    client
        .command("ip")
        .args(["neigh", "flush", "dev", "eth0"])
        .status()
        .unwrap();
    let reply = ask(&client, ip);
    assert_eq!(reply.as_deref(), Ok(format!("pod on {survivor}").as_str()));
}

/// The condition the operator writes on `service` about its announcement.
fn announced_condition(c: &Cluster, service: &str) -> Option<(bool, String)> {
    c.list::<Service>()
        .into_iter()
        .find(|s| s.name == service)?
        .value
        .status
        .conditions
        .into_iter()
        .find(|c| c.kind == "Announced")
        .map(|c| (c.status, c.message))
}

/// Nodes that may not announce, judged by their own agents: a node labelled
/// `node.kubernetes.io/exclude-from-external-load-balancers` never answers, not even when it
/// is the last live node, and the Service's condition says so by name; a node where
/// kube-proxy's IPVS mode runs without strictARP (a `kube-ipvs0` device made by hand, with
/// `arp_ignore` left at 0 by an agent told not to set it: `strict_arp = false`) turns the
/// Service's condition false with what to do, and back once strictARP's sysctl is set. NotReady and cordoned Nodes need a Kubernetes store: their
/// reading is tested on Node objects (ipam-kube) and their rule in `node_record::eligibility`.
#[test]
fn excluded_nodes_never_answer_and_a_node_s_ipvs_without_strict_arp_is_reported() {
    let mut c = Cluster::start_add_on("ex", 1);
    c.enable_gossip();
    c.add_node("ex");
    c.add_node_with("ex", "[node.announce]\nstrict_arp = false\n");
    c.add_node_with(
        "ex",
        "[node.labels]\n\"node.kubernetes.io/exclude-from-external-load-balancers\" = \"true\"\n",
    );
    let macs: BTreeMap<[u8; 6], String> =
        c.nodes.iter().map(|n| (n.mac(), n.name.clone())).collect();
    c.put("lb", &pool(vec![range("10.77.0.10", "10.77.0.20")]));
    c.put("uplinks", &uplink_policy());
    for i in 0..6 {
        c.put(&format!("default/web-{i}"), &lb_service(80));
    }
    wait_until(
        Duration::from_secs(20),
        "the services' IPs, announced",
        || {
            (0..6).all(|i| {
                announced_condition(&c, &format!("default/web-{i}")).is_some_and(|(ok, _)| ok)
            })
        },
        || {
            format!(
                "{:?}\n{}",
                announced_condition(&c, "default/web-0"),
                c.operator_log(0)
            )
        },
    );
    let excluded = c.records()["node-2"].value.spec.announcing.excluded.clone();
    assert!(
        excluded
            .as_deref()
            .is_some_and(|why| why.contains("exclude-from-external-load-balancers")),
        "{excluded:?}"
    );
    let client = c.add_client("excl");
    let ips = service_ips(&c);
    for ip in ips.values() {
        assert_ne!(owner_of(&c, &client, &macs, *ip), "node-2");
    }

    // kube-proxy's IPVS mode without strictARP on node-1: reported on every Service, and in
    // node-1's log, within the agent's 10 s look at the host.
    let n1 = &c.nodes[1].ns;
    // kube-proxy makes a dummy device; this kernel has no dummy driver, and the agent goes by
    // the name, so a bridge stands in for it.
    n1.add_bridge("kube-ipvs0");
    wait_until(
        Duration::from_secs(15),
        "the IPVS warning on the service",
        || {
            announced_condition(&c, "default/web-0")
                .is_some_and(|(ok, m)| !ok && m.contains("strictARP"))
        },
        || {
            format!(
                "{:?}\n{}",
                announced_condition(&c, "default/web-0"),
                c.nodes[1].log()
            )
        },
    );
    assert!(c.nodes[1].log().contains("strictARP"));
    let status = n1
        .command("sysctl")
        .args(["-qw", "net.ipv4.conf.all.arp_ignore=1"])
        .status()
        .unwrap();
    assert!(status.success());
    wait_until(
        Duration::from_secs(15),
        "the warning gone once strictARP's sysctl is set",
        || announced_condition(&c, "default/web-0").is_some_and(|(ok, _)| ok),
        || format!("{:?}", announced_condition(&c, "default/web-0")),
    );

    // node-0 and node-1 lose power: node-2, the last live node, still never answers.
    c.nodes[0].power_off();
    c.nodes[1].power_off();
    std::thread::sleep(Duration::from_secs(2));
    for ip in ips.values() {
        let got = answers(&client, *ip);
        assert!(
            got.is_empty(),
            "{ip} answered by {got:x?} with only the excluded node alive"
        );
    }
}

/// The MACs that answer one neighbour solicitation for `ip`, as the client sees them.
fn answers_v6(client: &Netns, ip: std::net::Ipv6Addr) -> Vec<[u8; 6]> {
    let src: std::net::Ipv6Addr = "fd77::100".parse().unwrap();
    client.run(move || Resolver::new("eth0").ndp_all(src, ip, Duration::from_millis(250)))
}

/// The failover of an IPv6 Service IP across namespaces with real processes: LB-IPAM assigns
/// from an IPv6 range, exactly one node answers the client's neighbour solicitations, and when
/// it loses power another one does, within the gossip's bound.
#[test]
fn an_ipv6_service_ip_is_answered_by_one_node_and_moves_when_it_dies() {
    let mut c = Cluster::start_add_on("v6", 1);
    c.enable_gossip();
    for _ in 0..3 {
        c.add_node("v6");
    }
    let macs: BTreeMap<[u8; 6], String> =
        c.nodes.iter().map(|n| (n.mac(), n.name.clone())).collect();
    c.put("lb6", &pool(vec![range("fd77::10", "fd77::20")]));
    c.put("uplinks", &uplink_policy());
    let mut web = lb_service(80);
    web.spec.ip_families = vec![ipam_core::Family::V6];
    c.put("default/web6", &web);
    let ip = || {
        c.list::<Service>()
            .into_iter()
            .find_map(|s| match s.value.status.ingress.first() {
                Some(IpAddr::V6(v6)) if s.name == "default/web6" => Some(*v6),
                _ => None,
            })
    };
    wait_until(
        Duration::from_secs(20),
        "the service's IPv6 address",
        || ip().is_some(),
        || c.operator_log(0),
    );
    let ip = ip().unwrap();
    let client = c.add_client("v6cl");
    let one_owner = |deadline: Duration| {
        let until = Instant::now() + deadline;
        let mut got = Vec::new();
        while Instant::now() < until {
            got = answers_v6(&client, ip);
            if !got.is_empty() {
                break;
            }
        }
        assert_eq!(got.len(), 1, "{ip}: answers from {got:x?}");
        node_of(&macs, got[0])
    };
    let owner = one_owner(Duration::from_secs(10));
    let dead = c.nodes.iter().position(|n| n.name == owner).unwrap();
    c.nodes[dead].power_off();
    let lost = Instant::now();
    let mut next = owner.clone();
    while next == owner {
        assert!(
            lost.elapsed() < Duration::from_secs(10),
            "{ip} still answered by {owner} (or by nobody) 10 s after it lost power"
        );
        next = one_owner(Duration::from_secs(10));
    }
    println!("{ip} moved from {owner} to {next} in {:?}", lost.elapsed());
}

/// Where a Service's endpoints run, as the etcd store keeps it (an EndpointSlice's part that
/// matters here): `ready` endpoints on `nodes`.
fn endpoints_on(service: &str, nodes: &[&str], ready: bool) -> ServiceEndpoints {
    ServiceEndpoints {
        spec: ServiceEndpointsSpec {
            service: service.to_owned(),
            endpoints: nodes
                .iter()
                .map(|n| ServiceEndpoint {
                    node_name: (*n).to_owned(),
                    ready,
                })
                .collect(),
        },
    }
}

/// `externalTrafficPolicy: Local` across namespaces with real processes: only the node with
/// the Service's ready endpoint answers (the client sees its MAC alone), whatever the IP's
/// weight; the endpoint moving to another node moves the IP there; with no ready endpoint
/// anywhere nobody answers and the Service's condition says why; an endpoint again brings the
/// IP back. A Service with the default policy beside it keeps its owner throughout. Then, on
/// the same nodes, one IP shared by two Services on two L2 policies gets one MAC per request.
#[test]
fn external_traffic_policy_local_is_announced_only_where_a_ready_endpoint_runs() {
    let mut c = Cluster::start_add_on("etp", 1);
    c.enable_gossip();
    for _ in 0..3 {
        c.add_node("etp");
    }
    let macs: BTreeMap<[u8; 6], String> =
        c.nodes.iter().map(|n| (n.mac(), n.name.clone())).collect();
    c.put("lb", &pool(vec![range("10.77.0.10", "10.77.0.20")]));
    c.put("uplinks", &uplink_policy());
    let mut local = lb_service(80);
    local.spec.external_traffic_policy = TrafficPolicy::Local;
    c.put("default/local", &local);
    c.put("default/cluster", &lb_service(81));
    // Two objects for one Service, as Kubernetes splits a Service's endpoints into slices: the
    // endpoint on node-1 is ready, the one on node-2 is not.
    c.put(
        "default/local-a",
        &endpoints_on("default/local", &["node-1"], true),
    );
    c.put(
        "default/local-b",
        &endpoints_on("default/local", &["node-2"], false),
    );
    wait_until(
        Duration::from_secs(20),
        "both services' IPs",
        || service_ips(&c).len() == 2,
        || c.operator_log(0),
    );
    let ips = service_ips(&c);
    let (local_ip, cluster_ip) = (ips["default/local"], ips["default/cluster"]);
    let client = c.add_client("etpc");
    let cluster_owner = owner_of(&c, &client, &macs, cluster_ip);
    wait_until(
        Duration::from_secs(10),
        "node-1, the node with the ready endpoint, answering alone",
        || answers(&client, local_ip) == [c.nodes[1].mac()],
        || format!("{:x?}\n{}", answers(&client, local_ip), c.nodes[1].log()),
    );
    for _ in 0..5 {
        assert_eq!(owner_of(&c, &client, &macs, local_ip), "node-1");
    }

    // The endpoint moves to node-2 (a pod rescheduled): the IP follows it.
    c.put(
        "default/local-a",
        &endpoints_on("default/local", &["node-1"], false),
    );
    c.put(
        "default/local-b",
        &endpoints_on("default/local", &["node-2"], true),
    );
    let moved = Instant::now();
    wait_until(
        Duration::from_secs(10),
        "node-2 answering alone once the endpoint moved there",
        || answers(&client, local_ip) == [c.nodes[2].mac()],
        || format!("{:x?}\n{}", answers(&client, local_ip), c.nodes[2].log()),
    );
    println!(
        "{local_ip} followed its endpoint to node-2 in {:?}",
        moved.elapsed()
    );

    // No ready endpoint anywhere: nobody answers, and the Service says why.
    c.put(
        "default/local-b",
        &endpoints_on("default/local", &["node-2"], false),
    );
    wait_until(
        Duration::from_secs(10),
        "the condition saying no endpoint is ready",
        || {
            announced_condition(&c, "default/local")
                .is_some_and(|(ok, m)| !ok && m.contains("no ready endpoint on any node"))
        },
        || format!("{:?}", announced_condition(&c, "default/local")),
    );
    wait_until(
        Duration::from_secs(10),
        "nobody answering for the Service with no ready endpoint",
        || answers(&client, local_ip).is_empty(),
        || format!("{:x?}", answers(&client, local_ip)),
    );

    // A ready endpoint on node-0 again: it answers, and the condition turns true.
    c.put(
        "default/local-a",
        &endpoints_on("default/local", &["node-0"], true),
    );
    wait_until(
        Duration::from_secs(10),
        "node-0 answering once it has a ready endpoint",
        || answers(&client, local_ip) == [c.nodes[0].mac()],
        || format!("{:x?}", answers(&client, local_ip)),
    );
    wait_until(
        Duration::from_secs(10),
        "the Service's condition true again",
        || announced_condition(&c, "default/local").is_some_and(|(ok, _)| ok),
        || format!("{:?}", announced_condition(&c, "default/local")),
    );
    assert_eq!(owner_of(&c, &client, &macs, cluster_ip), cluster_owner);

    // On the same nodes (a cluster of its own would cost CI a minute): one IP shared by two
    // Services that two L2 policies select on different nodes.
    one_answer_for_an_ip_shared_on_two_policies(&c, &client, &macs);
}

/// Two Services sharing one IP (a sharing key) and selected by two L2 policies that select
/// different nodes: every ARP request for the IP gets exactly one MAC, the node both policies
/// select; with no such node nobody answers (never two) and both Services say why, naming the
/// other. The nodes are labelled after their rendezvous weights for the IP, so that each
/// policy's own heaviest node differs: deciding per Service answers every request twice.
fn one_answer_for_an_ip_shared_on_two_policies(
    c: &Cluster,
    client: &Netns,
    macs: &BTreeMap<[u8; 6], String>,
) {
    let shared_ip = Ipv4Addr::new(10, 77, 0, 40);
    c.put("shared", &pool(vec![range("10.77.0.40", "10.77.0.40")]));
    // The policy of the Services before stays with their pool.
    let mut uplinks = uplink_policy();
    uplinks.spec.ip_pools = vec!["lb".into()];
    c.put("uplinks", &uplinks);
    let mut by_weight: Vec<&ipam_tests::cluster::ClusterNode> = c.nodes.iter().collect();
    by_weight.sort_by_key(|n| {
        std::cmp::Reverse(ipam_core::lb::announce::weight(shared_ip.into(), &n.name))
    });
    let [heavy, middle, light] = by_weight[..] else {
        panic!("the scenario's three nodes");
    };
    // a: heavy and light; b: middle and light. Per Service, a would be answered by heavy and
    // b by middle; per IP, light is the only node that may answer for both.
    heavy.set_node_label("l2-a", Some("yes"));
    middle.set_node_label("l2-b", Some("yes"));
    light.set_node_label("l2-a", Some("yes"));
    light.set_node_label("l2-b", Some("yes"));
    for team in ["a", "b"] {
        let mut policy = uplink_policy();
        policy.spec.ip_pools = vec!["shared".into()];
        policy
            .spec
            .node_selector
            .match_labels
            .insert(format!("l2-{team}"), "yes".into());
        policy
            .spec
            .service_selector
            .match_labels
            .insert("team".into(), team.into());
        c.put(&format!("shared-{team}"), &policy);
    }
    for (team, port) in [("a", 90), ("b", 91)] {
        let mut service = lb_service(port);
        service.spec.labels.insert("team".into(), team.into());
        service.spec.sharing_key = Some("pair".into());
        service.spec.pool = Some("shared".into());
        c.put(&format!("default/shared-{team}"), &service);
    }
    let names = ["default/shared-a", "default/shared-b"];
    wait_until(
        Duration::from_secs(20),
        "both Services holding the shared IP, announced",
        || {
            let ips = service_ips(c);
            names.iter().all(|s| {
                ips.get(*s) == Some(&shared_ip)
                    && announced_condition(c, s).is_some_and(|(ok, _)| ok)
            })
        },
        || {
            format!(
                "{:?} {:?}\n{}",
                service_ips(c),
                names.map(|s| announced_condition(c, s)),
                c.operator_log(0)
            )
        },
    );
    wait_until(
        Duration::from_secs(10),
        "the node both policies select answering alone",
        || answers(client, shared_ip) == [light.mac()],
        || {
            let got = answers(client, shared_ip);
            format!(
                "{shared_ip} answered by {:?} (heavy {}, middle {}, light {})",
                got.iter().map(|m| node_of(macs, *m)).collect::<Vec<_>>(),
                heavy.name,
                middle.name,
                light.name
            )
        },
    );
    let watch = ArpWatch::start(client, CLIENT, shared_ip, Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let samples = watch.stop();
    let not_light: Vec<&ArpSample> = samples.iter().filter(|s| s.macs != [light.mac()]).collect();
    assert!(
        not_light.is_empty(),
        "{} of {} requests for {shared_ip} not answered by {} alone: {:?}",
        not_light.len(),
        samples.len(),
        light.name,
        not_light
            .iter()
            .map(|s| (
                s.at,
                s.macs.iter().map(|m| node_of(macs, *m)).collect::<Vec<_>>()
            ))
            .collect::<Vec<_>>()
    );

    // light leaves b's policy: no node may answer for both. Nobody answers rather than two,
    // and each Service names the other and what to do.
    light.set_node_label("l2-b", None);
    wait_until(
        Duration::from_secs(10),
        "both Services told the IP they share has no node both policies select",
        || {
            names.iter().zip(names.iter().rev()).all(|(s, other)| {
                announced_condition(c, s).is_some_and(|(ok, m)| {
                    !ok && m.contains(&format!("shared with service {other}"))
                        && m.contains("stop sharing")
                })
            })
        },
        || format!("{:?}", names.map(|s| announced_condition(c, s))),
    );
    wait_until(
        Duration::from_secs(10),
        "nobody answering for the shared IP",
        || answers(client, shared_ip).is_empty(),
        || format!("{:x?}", answers(client, shared_ip)),
    );
    let watch = ArpWatch::start(client, CLIENT, shared_ip, Instant::now());
    std::thread::sleep(Duration::from_secs(1));
    let samples = watch.stop();
    let answered: Vec<&ArpSample> = samples.iter().filter(|s| !s.macs.is_empty()).collect();
    assert!(
        answered.is_empty(),
        "{shared_ip} answered with no node both policies select: {answered:?}"
    );
}

/// The MACs that answer one ARP request for `ip` from `client`, a host at `sender`.
fn answers_from(client: &Netns, sender: Ipv4Addr, ip: Ipv4Addr) -> Vec<[u8; 6]> {
    client.run(move || Resolver::new("eth0").arp_all(sender, ip, Duration::from_millis(250)))
}

/// L2 policies that choose pools (MetalLB's `ipAddressPools` and `ipAddressPoolSelectors`):
/// two pools, one per segment, and a policy per segment choosing its pool, one by name, one by
/// the pool's labels. Each Service IP is answered on its own segment by exactly one node and
/// on the other segment by none, as a client on each segment sees it. Policies that choose by
/// Service alone would answer both IPs on both segments.
#[test]
fn l2_policies_by_pool_answer_each_ip_only_on_its_own_segment() {
    let mut c = Cluster::start_add_on("seg", 1);
    c.enable_gossip();
    c.add_segment("br1", "edge0", "10.79.0");
    c.add_node("seg");
    c.add_node("seg");
    let macs: BTreeMap<[u8; 6], String> = c
        .nodes
        .iter()
        .flat_map(|n| {
            [
                (n.mac(), n.name.clone()),
                (n.ns.mac("edge0"), n.name.clone()),
            ]
        })
        .collect();
    let core = pool(vec![range("10.77.0.30", "10.77.0.39")]);
    let mut edge = pool(vec![range("10.79.0.30", "10.79.0.39")]);
    edge.labels = [("segment".to_owned(), "edge".to_owned())].into();
    c.put("core", &core);
    c.put("edge", &edge);
    let mut by_name = uplink_policy();
    by_name.spec.ip_pools = vec!["core".into()];
    let mut by_label = uplink_policy();
    by_label.spec.interfaces = vec!["edge[0-9]+".into()];
    by_label.spec.ip_pool_selector.match_labels = edge.labels.clone();
    c.put("core-l2", &by_name);
    c.put("edge-l2", &by_label);
    for (name, from) in [("default/in-core", "core"), ("default/in-edge", "edge")] {
        let mut service = lb_service(80);
        service.spec.pool = Some(from.into());
        c.put(name, &service);
    }
    wait_until(
        Duration::from_secs(20),
        "both Services' IPs, announced",
        || {
            ["default/in-core", "default/in-edge"]
                .iter()
                .all(|s| announced_condition(&c, s).is_some_and(|(ok, _)| ok))
        },
        || {
            format!(
                "{:?}\n{}",
                announced_condition(&c, "default/in-edge"),
                c.operator_log(0)
            )
        },
    );
    let ips = service_ips(&c);
    let (core_ip, edge_ip) = (ips["default/in-core"], ips["default/in-edge"]);
    assert!(core.spec.contains(core_ip.into()) && edge.spec.contains(edge_ip.into()));
    let core_client = c.add_client("segc");
    let edge_client = c.add_client_on("sege", "br1");
    let edge_sender = Ipv4Addr::new(10, 79, 0, 100);
    owner_of(&c, &core_client, &macs, core_ip);
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.is_empty() && Instant::now() < deadline {
        got = answers_from(&edge_client, edge_sender, edge_ip);
    }
    assert_eq!(got.len(), 1, "{edge_ip} on the edge segment: {got:x?}");
    assert!(
        c.nodes.iter().any(|n| n.ns.mac("edge0") == got[0]),
        "{edge_ip} answered from {:x?}, not a node's edge0",
        got[0]
    );
    for _ in 0..3 {
        let wrong = answers_from(&edge_client, edge_sender, core_ip);
        assert!(
            wrong.is_empty(),
            "{core_ip} answered on the edge segment by {wrong:x?}"
        );
        let wrong = answers(&core_client, edge_ip);
        assert!(
            wrong.is_empty(),
            "{edge_ip} answered on the core segment by {wrong:x?}"
        );
    }
    // Each pool is judged by the policy that announces it: both reachable.
    for p in c.list::<LbIpPool>() {
        let reachable = p
            .value
            .status
            .conditions
            .iter()
            .find(|c| c.kind == "Reachable");
        assert!(
            reachable.is_some_and(|c| c.status),
            "{}: {reachable:?}",
            p.name
        );
    }
}

/// The node that answers, as the last answered sample of `samples` says.
fn last_answer(samples: &[ArpSample], macs: &BTreeMap<[u8; 6], String>) -> Option<String> {
    samples
        .iter()
        .rev()
        .find_map(|s| s.macs.first())
        .map(|m| node_of(macs, *m))
}

/// The first request after `from` that a node other than `owner` answered, and when.
fn answered_elsewhere(
    samples: &[ArpSample],
    macs: &BTreeMap<[u8; 6], String>,
    owner: &str,
    from: Duration,
) -> Option<(String, Duration)> {
    samples.iter().filter(|s| s.at >= from).find_map(|s| {
        let node = node_of(macs, *s.macs.first()?);
        (node != owner).then(|| (node, s.at - from))
    })
}

/// A client watching who answers an IP (asking as `sender`) while something happens.
struct MoveWatch<'a> {
    c: &'a Cluster,
    client: &'a Netns,
    sender: Ipv4Addr,
    ip: Ipv4Addr,
    macs: &'a BTreeMap<[u8; 6], String>,
}

impl MoveWatch<'_> {
    /// Does `what` to `owner` with the client asking every 40 ms, until another node answers;
    /// asserts that no request got two MACs, and returns who answered and how long after.
    fn moved_from(&self, owner: &str, what: impl FnOnce()) -> (String, Duration) {
        let (client, sender, ip, macs) = (self.client, self.sender, self.ip, self.macs);
        let start = Instant::now();
        let watch = ArpWatch::start(client, sender, ip, start);
        std::thread::sleep(Duration::from_millis(300));
        let cut = start.elapsed();
        what();
        wait_until(
            Duration::from_secs(10),
            "another node to answer for the IP",
            || {
                answers_from(client, sender, ip)
                    .first()
                    .is_some_and(|m| node_of(macs, *m) != owner)
            },
            || {
                self.c
                    .nodes
                    .iter()
                    .map(ipam_tests::cluster::ClusterNode::log)
                    .collect::<Vec<_>>()
                    .join("\n---\n")
            },
        );
        std::thread::sleep(Duration::from_millis(500));
        let samples = watch.stop();
        let doubles = double_answers(&samples);
        assert!(doubles.is_empty(), "two MACs answered {ip}: {doubles:x?}");
        answered_elsewhere(&samples, macs, owner, cut).expect("answered by another node")
    }
}

/// A dead NIC on a live node (Cilium's users report it: node alive, lease renewed, NIC dead):
/// the owner's announcing interface loses its carrier (its switch port goes down; the gossip
/// and the store still reach it over its other link), later its address. Each time another
/// node answers the IP on that segment, never two MACs to one request; the owner says why in
/// its record, its metrics and `ipamctl who-has`, and answers again once it can (the IP
/// answered by exactly one node then too). The agents follow link and address changes through
/// netlink's notifications, not their 10-second recheck: the IP moves within the few seconds
/// the test allows.
#[test]
fn an_owner_whose_announcing_link_dies_hands_its_ip_to_another_node_and_says_why() {
    const METRICS_PORT: u16 = 9964;
    let mut c = Cluster::start_add_on("nic", 1);
    c.enable_gossip();
    c.add_segment("br1", "edge0", "10.79.0");
    let metrics = format!("[metrics]\nlisten = \"127.0.0.1:{METRICS_PORT}\"\n");
    for _ in 0..3 {
        c.add_node_with("nic", &metrics);
    }
    let macs: BTreeMap<[u8; 6], String> = c
        .nodes
        .iter()
        .map(|n| (n.ns.mac("edge0"), n.name.clone()))
        .collect();
    c.put("edge", &pool(vec![range("10.79.0.30", "10.79.0.39")]));
    let mut policy = uplink_policy();
    policy.spec.interfaces = vec!["edge[0-9]+".into()];
    c.put("edge-l2", &policy);
    c.put("default/web", &lb_service(80));
    wait_until(
        Duration::from_secs(20),
        "the Service's IP, announced",
        || announced_condition(&c, "default/web").is_some_and(|(ok, _)| ok),
        || format!("{:?}", announced_condition(&c, "default/web")),
    );
    let ip = service_ips(&c)["default/web"];
    let client = c.add_client_on("nicc", "br1");
    let sender = Ipv4Addr::new(10, 79, 0, 100);
    let owner = {
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() != 1 && Instant::now() < deadline {
            got = answers_from(&client, sender, ip);
        }
        assert_eq!(got.len(), 1, "{ip} on the edge segment: {got:x?}");
        node_of(&macs, got[0])
    };
    let at = c.nodes.iter().position(|n| n.name == owner).expect("owner");
    let port = port_of(at);

    // The link dies: the switch's side of the owner's edge0 goes down, edge0 loses its carrier.
    let watcher = MoveWatch {
        c: &c,
        client: &client,
        sender,
        ip,
        macs: &macs,
    };
    let (taker, after) = watcher.moved_from(&owner, || c.fabric.down(&port));
    println!("{owner}'s edge0 lost its carrier: {ip} answered by {taker} after {after:?}");

    // The owner says why, in its record, its metrics and who-has.
    let down = c.records()[&owner].value.spec.interfaces_down.clone();
    assert!(
        down.iter()
            .any(|d| d.name == "edge0" && d.why.contains("no carrier")),
        "{owner}'s record: {down:?}"
    );
    let text = c.nodes[at].metrics(METRICS_PORT).unwrap_or_default();
    assert!(
        text.contains("ipam_interface_down{interface=\"edge0\"} 1"),
        "{owner}'s metrics: {text}"
    );
    let ip_text = ip.to_string();
    let who = c.ipamctl((at + 1) % 3, &["who-has", &ip_text]);
    assert!(
        who.contains(&format!("{owner}: edge0: no carrier")),
        "who-has {ip}: {who}"
    );

    // The link is back: the owner may announce again; still one MAC per request.
    let watch = ArpWatch::start(&client, sender, ip, Instant::now());
    c.fabric.up(&port);
    wait_until(
        Duration::from_secs(10),
        "the owner's record to list edge0 as usable again",
        || c.records()[&owner].value.spec.interfaces_down.is_empty(),
        || c.nodes[at].log(),
    );
    std::thread::sleep(Duration::from_secs(2));
    let samples = watch.stop();
    let doubles = double_answers(&samples);
    assert!(
        doubles.is_empty(),
        "two MACs answered {ip} on the link's return: {doubles:x?}"
    );
    assert!(
        last_answer(&samples, &macs).is_some(),
        "{ip} answered after the return"
    );
    let text = c.nodes[at].metrics(METRICS_PORT).unwrap_or_default();
    assert!(
        text.contains("ipam_interface_down{interface=\"edge0\"} 0"),
        "{owner}'s metrics after the return: {text}"
    );

    // The address goes (the link stays up): the same, with its own reason.
    let owner = last_answer(&samples, &macs).expect("an owner");
    let at = c.nodes.iter().position(|n| n.name == owner).expect("owner");
    let address = format!("10.79.0.{}/24", at + 1);
    let (taker, after) =
        watcher.moved_from(&owner, || c.nodes[at].ns.delete_address("edge0", &address));
    println!("{owner}'s edge0 lost its address: {ip} answered by {taker} after {after:?}");
    let down = c.records()[&owner].value.spec.interfaces_down.clone();
    assert!(
        down.iter()
            .any(|d| d.name == "edge0" && d.why == "no address"),
        "{owner}'s record: {down:?}"
    );
    c.nodes[at].ns.add_address("edge0", &address);
    wait_until(
        Duration::from_secs(10),
        "the owner's record to list edge0 as usable again",
        || c.records()[&owner].value.spec.interfaces_down.is_empty(),
        || c.nodes[at].log(),
    );

    // The interface is made anew (deleted, then created again: a new MAC and ifindex): the
    // node says it went, and once it is back the responder is attached to the new one, which
    // answers when the IP comes back to its owner.
    let deleted = c.nodes[at]
        .ns
        .command("ip")
        .args(["link", "del", "edge0"])
        .status()
        .expect("run ip");
    assert!(deleted.success());
    wait_until(
        Duration::from_secs(10),
        "the owner's record to say edge0 went",
        || {
            c.records()[&owner]
                .value
                .spec
                .interfaces_down
                .iter()
                .any(|d| d.name == "edge0" && d.why.starts_with("gone"))
        },
        || c.nodes[at].log(),
    );
    veth(&c.nodes[at].ns, "edge0", &c.fabric, &port_of(at));
    c.fabric.add_port(&port_of(at), "br1");
    c.nodes[at].ns.add_address("edge0", &address);
    let new_mac = c.nodes[at].ns.mac("edge0");
    wait_until(
        Duration::from_secs(10),
        "the owner's new edge0 to answer for the IP",
        || answers_from(&client, sender, ip) == [new_mac],
        || {
            format!(
                "answers: {:x?}, new MAC {new_mac:x?}\n{}",
                answers_from(&client, sender, ip),
                c.nodes[at].log()
            )
        },
    );
}

/// The switch's side of node `at`'s first extra segment (`Cluster::add_segment`).
fn port_of(at: usize) -> String {
    format!("s0p{at}")
}

/// A rolling restart of every agent, each stop said to be a restart (`[node] on_stop =
/// "restart"`, with the gossip): the stopping agent's responders go on answering, its record
/// says it will be back, the others keep its IPs where they are, and the next agent takes them
/// up without a hand-over. A client asking for every IP every 40 ms sees each answered by its
/// one owner's MAC throughout: no request unanswered, no IP moved. Then an agent that stops for
/// a restart and does not come back within its `restart_within_ms` is taken over as a dead
/// node, with never two MACs to one request.
#[test]
fn a_rolling_restart_moves_no_service_ip_and_leaves_no_request_unanswered() {
    // Pod IPAM's mode, as deploy/ runs the agents (the add-on mode's node record is the other
    // writer of the restart notice's end, and the NIC test above runs it).
    let mut c = Cluster::start("rr", 1);
    c.enable_gossip();
    rolling_restart(c, "rr");
}

/// The same without the gossip: the nodes' liveness from their store leases (a stopping
/// agent's lease lapses while it is away; its restart notice holds its IPs all the same).
#[test]
fn a_rolling_restart_over_store_leases_moves_no_service_ip() {
    rolling_restart(Cluster::start("rl", 1), "rl");
}

/// Three agents on `c` restarted one by one, then one not back in time (see above).
fn rolling_restart(mut c: Cluster, tag: &str) {
    let _turn = one_at_a_time();
    for _ in 0..3 {
        c.add_node(tag);
    }
    for n in &c.nodes {
        n.set_node_setting("on_stop", Some("\"restart\""));
    }
    let macs: BTreeMap<[u8; 6], String> =
        c.nodes.iter().map(|n| (n.mac(), n.name.clone())).collect();
    c.put("lb", &pool(vec![range("10.77.0.40", "10.77.0.49")]));
    c.put("uplinks", &uplink_policy());
    let services = ["default/a", "default/b", "default/c", "default/d"];
    for name in services {
        c.put(name, &lb_service(80));
    }
    wait_until(
        Duration::from_secs(20),
        "every Service's IP, announced",
        || {
            services
                .iter()
                .all(|s| announced_condition(&c, s).is_some_and(|(ok, _)| ok))
        },
        || format!("{:?}", services.map(|s| announced_condition(&c, s))),
    );
    let ips: Vec<Ipv4Addr> = service_ips(&c).into_values().collect();
    let client = c.add_client(&format!("{tag}c"));
    let owners: BTreeMap<Ipv4Addr, String> = ips
        .iter()
        .map(|ip| (*ip, owner_of(&c, &client, &macs, *ip)))
        .collect();

    let start = Instant::now();
    let watches: Vec<ArpWatch> = ips
        .iter()
        .map(|ip| ArpWatch::start(&client, CLIENT, *ip, start))
        .collect();
    for i in 0..c.nodes.len() {
        c.nodes[i].stop();
        // Away for longer than the gossip takes to declare a silent member dead.
        std::thread::sleep(Duration::from_millis(1500));
        c.nodes[i].start();
        let name = c.nodes[i].name.clone();
        wait_until(
            Duration::from_secs(10),
            "the next agent to clear its node's restart notice",
            || c.records()[&name].value.spec.restarting.is_none(),
            || c.nodes[i].log(),
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    for (ip, watch) in ips.iter().zip(watches) {
        let samples = watch.stop();
        let owner = &owners[ip];
        let wrong: Vec<_> = samples
            .iter()
            .filter(|s| s.macs.len() != 1 || node_of(&macs, s.macs[0]) != *owner)
            .collect();
        assert!(
            wrong.is_empty(),
            "{ip} (owned by {owner}) during the rolling restart, {} requests: {} not answered \
             by {owner} alone: {:x?}\n{}",
            samples.len(),
            wrong.len(),
            wrong.iter().take(10).collect::<Vec<_>>(),
            c.nodes
                .iter()
                .map(ipam_tests::cluster::ClusterNode::log)
                .collect::<Vec<_>>()
                .join("\n---\n")
        );
    }
    for n in &c.nodes {
        assert!(
            n.log()
                .contains("answering its Service IPs on without a wait"),
            "{}: {}",
            n.name,
            n.log()
        );
    }

    // A restart that does not come back in time: taken over as a dead node.
    let (ip, owner) = owners.iter().next().map(|(i, o)| (*i, o.clone())).unwrap();
    let at = c.nodes.iter().position(|n| n.name == owner).unwrap();
    c.nodes[at].set_node_setting("restart_within_ms", Some("2000"));
    let agent = c.nodes[at].daemon.take().expect("the agent runs");
    let watcher = MoveWatch {
        c: &c,
        client: &client,
        sender: CLIENT,
        ip,
        macs: &macs,
    };
    let (taker, after) = watcher.moved_from(&owner, || {
        agent.terminate();
    });
    println!(
        "{owner} did not come back from its restart: {ip} answered by {taker} after {after:?}"
    );
    assert!(
        after >= Duration::from_millis(1500),
        "{ip} moved after {after:?}, before the promise (2 s) ran out"
    );
    if c.gossip_key().is_some() {
        a_dead_node_s_notice_holds_nothing_at_an_agent_start(
            &mut c, &client, &macs, &owners, &owner,
        );
    }
    // The agent that stopped for the restart left its IPs on `lo` (the responders answered
    // them). Its IP's Service is deleted while no agent runs there: the next agent takes that
    // address off `lo` once it has decided, and keeps those it owns again.
    let (service, _) = service_ips(&c)
        .into_iter()
        .find(|(_, i)| *i == ip)
        .expect("the IP's Service");
    assert!(on_lo(&c.nodes[at], ip), "{owner} left {ip} on lo");
    c.delete::<Service>(&service);
    c.nodes[at].start();
    let kept: Vec<Ipv4Addr> = owners
        .iter()
        .filter(|(i, o)| **i != ip && **o == owner)
        .map(|(i, _)| *i)
        .collect();
    wait_until(
        Duration::from_secs(15),
        &format!("{owner}'s next agent to take {ip} (Service {service} deleted) off lo"),
        || !on_lo(&c.nodes[at], ip) && kept.iter().all(|k| on_lo(&c.nodes[at], *k)),
        || {
            format!(
                "lo: {:?}\n{}",
                c.nodes[at].ns.addresses("lo"),
                c.nodes[at].log()
            )
        },
    );
    if c.gossip_key().is_none() {
        a_restart_promise_that_fails_leaves_one_mac(&mut c, &client, &macs);
    }
}

/// Issue 56, item 7, with leases: a node whose store refuses it stops for a restart. Its
/// notice cannot be written, so the promise fails and the stop is a leave: the others take its
/// IPs over once its lease lapses (1.5 s here), and its responders must be silent by then. A
/// client asking for one of its IPs every 40 ms gets never two MACs, and another node answers.
/// (The responders used to be extended for `restart_within_ms`, 10 s, before the write, and
/// left so: two MACs from the lapse on.)
fn a_restart_promise_that_fails_leaves_one_mac(
    c: &mut Cluster,
    client: &Netns,
    macs: &BTreeMap<[u8; 6], String>,
) {
    let ip = *service_ips(c).values().next().expect("a Service IP");
    let owner = owner_of(c, client, macs, ip);
    let at = c.nodes.iter().position(|n| n.name == owner).unwrap();
    // The promise as long as by default, whatever an earlier step set here.
    c.nodes[at].set_node_setting("restart_within_ms", Some("10000"));
    // The store's members, on the fabric: unreachable from this node alone.
    let store_hosts: std::collections::BTreeSet<String> = c
        .store
        .endpoints
        .iter()
        .map(|e| {
            let host = e.split("://").last().unwrap_or(e);
            host.rsplit_once(':').map_or(host, |(h, _)| h).to_owned()
        })
        .collect();
    let agent = c.nodes[at].daemon.take().expect("the agent runs");
    let c: &Cluster = c;
    let mut log = String::new();
    let watcher = MoveWatch {
        c,
        client,
        sender: CLIENT,
        ip,
        macs,
    };
    // Refused at once (a reset), so the write fails at once and the agent exits before its
    // own controllers see its fence close and withdraw the IPs (a store that hangs gives them
    // that time): what the responders were left to do is what the network sees.
    let store_rules = |action: &str| {
        for host in &store_hosts {
            let status = command_in(&c.nodes[at].ns.path(), "iptables")
                .args([action, "OUTPUT", "-p", "tcp", "-d", host])
                .args(["-j", "REJECT", "--reject-with", "tcp-reset"])
                .status()
                .expect("run iptables");
            assert!(status.success(), "iptables {action} OUTPUT to {host}");
        }
    };
    let (taker, after) = watcher.moved_from(&owner, || {
        store_rules("-A");
        log = agent.terminate();
    });
    store_rules("-D");
    println!(
        "{owner}'s restart promise failed (store unreachable): {ip} answered by {taker} after \
         {after:?}"
    );
    assert!(
        log.contains("cannot stop for a restart"),
        "{owner} stopped without its restart promise failing:\n{log}"
    );
}

/// Issue 56, item 2: `owner` stopped for a restart and never came back, leaving its restart
/// notice in its record. Another agent restarting later (a rollout's next step) must not hold
/// the dead node live for the notice's time: the IPs it took over from it would be handed back
/// to nobody. Restarts the node that answers one of `owner`'s former IPs now, under a client
/// asking for each of those it answers every 40 ms: every request answered by one MAC
/// throughout, until past the time the notice would have held the node (2 s).
///
/// With the gossip only. Over leases a starting agent counts every lease live until it has
/// seen it unrenewed for a whole lease (`liveness::peers`: it cannot tell how old it is), so
/// the dead node is live in its view for 1.5 s here, notice or not. The restarted node's IPs
/// alone are watched: the third node, alone while one is dead and one restarts, hears no
/// other member and silences its own (its gossip fence), by design.
fn a_dead_node_s_notice_holds_nothing_at_an_agent_start(
    c: &mut Cluster,
    client: &Netns,
    macs: &BTreeMap<[u8; 6], String>,
    owners: &BTreeMap<Ipv4Addr, String>,
    owner: &str,
) {
    let former: Vec<Ipv4Addr> = owners
        .iter()
        .filter(|(_, o)| *o == owner)
        .map(|(i, _)| *i)
        .collect();
    wait_until(
        Duration::from_secs(10),
        &format!("every IP of {owner} (not back from its restart) answered elsewhere"),
        || {
            former.iter().all(|ip| {
                answers(client, *ip)
                    .first()
                    .is_some_and(|m| node_of(macs, *m) != owner)
            })
        },
        || {
            c.nodes
                .iter()
                .map(ipam_tests::cluster::ClusterNode::log)
                .collect::<Vec<_>>()
                .join("\n---\n")
        },
    );
    assert!(
        c.records()[owner].value.spec.restarting.is_some(),
        "{owner}'s notice is left in its record"
    );
    let taker = owner_of(c, client, macs, former[0]);
    let at = c.nodes.iter().position(|n| n.name == taker).unwrap();
    let former: Vec<Ipv4Addr> = former
        .into_iter()
        .filter(|ip| owner_of(c, client, macs, *ip) == taker)
        .collect();
    let start = Instant::now();
    let watches: Vec<ArpWatch> = former
        .iter()
        .map(|ip| ArpWatch::start(client, CLIENT, *ip, start))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    c.nodes[at].stop();
    std::thread::sleep(Duration::from_millis(300));
    c.nodes[at].start();
    wait_until(
        Duration::from_secs(10),
        "the next agent to clear its node's restart notice",
        || c.records()[&taker].value.spec.restarting.is_none(),
        || c.nodes[at].log(),
    );
    // Past the 2 s the dead node's notice held it at the first record event before the fix.
    std::thread::sleep(Duration::from_millis(2500));
    for (ip, watch) in former.iter().zip(watches) {
        let samples = watch.stop();
        let wrong: Vec<_> = samples.iter().filter(|s| s.macs.len() != 1).collect();
        assert!(
            wrong.is_empty(),
            "{ip} (taken over from {owner}, which did not come back from its restart) while \
             {taker}'s agent restarted, {} requests: {} not answered by one MAC: {:x?}\n{}",
            samples.len(),
            wrong.len(),
            wrong.iter().take(10).collect::<Vec<_>>(),
            c.nodes
                .iter()
                .map(|n| format!("{}:\n{}", n.name, n.log()))
                .collect::<Vec<_>>()
                .join("\n---\n")
        );
    }
    println!(
        "{owner}'s stale restart notice: {former:?} answered throughout {taker}'s restart, \
         {:?} in all",
        start.elapsed()
    );
}

/// Whether `ip` is on `node`'s `lo`.
fn on_lo(node: &ipam_tests::cluster::ClusterNode, ip: Ipv4Addr) -> bool {
    node.ns
        .addresses("lo")
        .iter()
        .any(|(a, _)| *a == IpAddr::V4(ip))
}

/// A drain and its undoing, the planned moves between live nodes: the node owning the most IPs
/// gets the exclusion label (`node.kubernetes.io/exclude-from-external-load-balancers`, by a
/// reload, as a host's owner drains a node) and its IPs go to the others; the label goes and
/// they come back. A client requests every IP every 20 ms throughout, from a backend on every
/// node: no request fails, and each of the drained node's IPs is served by it, by another
/// node, then by it again (the old owner stops answering ARP first and accepts the IP's
/// traffic for a while after, `l2::owners::LINGER`; the new owner passes it the segments of
/// connections opened there), while the others' never move; an ARP watch sees never two MACs
/// for one request. Connections held open across both moves stay with the node they were
/// opened with. The moves are counted by where they came from
/// (`ipam_service_ips_taken_total{from="live_node"}`).
#[test]
fn a_drain_and_its_undoing_move_ips_between_live_nodes_with_no_request_lost() {
    let _turn = one_at_a_time();
    const METRICS_PORT: u16 = 9965;
    const EXCLUDE: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
    let mut c = Cluster::start("dr", 1);
    c.enable_gossip();
    let metrics = format!("[metrics]\nlisten = \"127.0.0.1:{METRICS_PORT}\"\n");
    for _ in 0..3 {
        c.add_node_with("dr", &metrics);
    }
    let Settled {
        macs,
        ips,
        client,
        owners,
    } = settled_services(&c, "d", 6);
    let (at, theirs) = c.busiest_node(&owners, &[]);
    let drained = c.nodes[at].name.clone();

    let _backends = Backends::start(&c);
    let traffic = traffic_to(&client, &ips);
    // Connections held open across the moves: each stays with the node it was opened with.
    let mut held_before = open_held(&client, &theirs);
    for (ip, node, _) in &held_before {
        assert_eq!(*node, drained, "a connection to {ip} before the drain");
    }
    std::thread::sleep(Duration::from_millis(500));
    c.nodes[at].set_node_label(EXCLUDE, Some("true"));
    wait_until_answered(
        &client,
        &macs,
        &theirs,
        "the drained node's IPs answered by the others",
        |node| node != drained,
        || c.nodes[at].log(),
    );
    still_held_by(&mut held_before, "after the drain", &c);
    let mut held_during = open_held(&client, &theirs);
    std::thread::sleep(Duration::from_secs(2));
    c.nodes[at].set_node_label(EXCLUDE, None);
    wait_until_answered(
        &client,
        &macs,
        &theirs,
        "the drained node's IPs back with it",
        |node| node == drained,
        || c.nodes[at].log(),
    );
    still_held_by(&mut held_during, "after the drain's undoing", &c);
    still_held_by(&mut held_before, "after the drain and its undoing", &c);
    // Past the linger of the IPs given back: a request lost when the other node lets go of
    // them would show.
    std::thread::sleep(ipam_daemon::l2::owners::LINGER + Duration::from_secs(1));

    for (ip, requests, watch) in traffic {
        let seen = requests.stop();
        let samples = watch.stop();
        let doubles = double_answers(&samples);
        let unanswered = samples.iter().filter(|s| s.macs.is_empty()).count();
        println!(
            "{ip} (owned by {}): {} requests answered, {} failed, served by {:?}; ARP: {} \
             requests, {unanswered} unanswered",
            owners[&ip],
            seen.answered,
            seen.failed.len(),
            seen.served_by,
            samples.len()
        );
        // Not even a connection in flight at a move is lost: the new owner passes its
        // segments on to the old one.
        assert!(
            seen.failed.is_empty(),
            "requests to {ip} failed: {:?} (drain of {drained})\n{}",
            seen.failed,
            c.nodes
                .iter()
                .map(ipam_tests::cluster::ClusterNode::log)
                .collect::<Vec<_>>()
                .join("\n---\n")
        );
        assert!(doubles.is_empty(), "two MACs answered {ip}: {doubles:x?}");
        if owners[&ip] == drained {
            assert_eq!(seen.moves(), 2, "{ip}: served by {:?}", seen.served_by);
            assert_eq!(seen.served_by.first(), Some(&drained));
            assert_eq!(seen.served_by.last(), Some(&drained));
        } else {
            assert_eq!(
                seen.served_by,
                [owners[&ip].clone()],
                "{ip} moved though its owner was not drained"
            );
        }
    }
    let taken = |text: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with("ipam_service_ips_taken_total{from=\"live_node\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0)
    };
    let text = c.nodes[at].metrics(METRICS_PORT).unwrap_or_default();
    assert_eq!(
        taken(&text) as usize,
        theirs.len(),
        "{drained} took its IPs back from live nodes: {text}"
    );
    let others: f64 = (0..c.nodes.len())
        .filter(|i| *i != at)
        .map(|i| taken(&c.nodes[i].metrics(METRICS_PORT).unwrap_or_default()))
        .sum();
    assert_eq!(
        others as usize,
        theirs.len(),
        "the others took them from {drained}"
    );

    // Stops that are not restarts, under the client's traffic. With `on_stop = "auto"`, the
    // drained node's agent stops as for a leave; a node owning IPs stopped with "leave" hands
    // them over at once (its responders silent first, its IPs left on `lo` for the clients
    // still sending to it): no request lost, never two MACs. The last node, with "auto" and
    // not drained, stops as for a restart.
    let (leaving, last) = ((at + 1) % 3, (at + 2) % 3);
    c.nodes[at].set_node_setting("on_stop", Some("\"auto\""));
    c.nodes[leaving].set_node_setting("on_stop", Some("\"leave\""));
    c.nodes[last].set_node_setting("on_stop", Some("\"auto\""));
    c.nodes[at].set_node_label(EXCLUDE, Some("true"));
    wait_until_answered(
        &client,
        &macs,
        &theirs,
        "the drained node's IPs answered by the others",
        |node| node != drained,
        || c.nodes[at].log(),
    );
    std::thread::sleep(ipam_daemon::l2::owners::LINGER);
    let traffic = traffic_to(&client, &ips);
    let minority_before = minority_closings(&c.nodes[last]);
    std::thread::sleep(Duration::from_millis(500));
    stop_as(&mut c, at, "a leave");
    stop_as(&mut c, leaving, "a leave");
    wait_until_answered(
        &client,
        &macs,
        &ips,
        "every IP answered by the last node",
        |node| node == c.nodes[last].name,
        || c.nodes[last].log(),
    );
    std::thread::sleep(Duration::from_secs(2));
    // The two that left noted it in their records (`liveness::leave`): the last reckons its
    // majority without them and never fell silent. Counted as members, they left it a minority
    // of one until the operator released their leases (about 7 s here), and a client whose
    // neighbour entry aged meanwhile lost requests (1 run in 6).
    let records = c.records();
    for i in [at, leaving] {
        let name = &c.nodes[i].name;
        assert!(
            records[name].value.spec.left.is_some(),
            "{name} left without noting it in its record"
        );
    }
    assert_eq!(
        minority_closings(&c.nodes[last]),
        minority_before,
        "the last node fell silent as a minority after two nodes left\n{}",
        c.nodes[last].log()
    );
    for (ip, requests, watch) in traffic {
        let seen = requests.stop();
        let samples = watch.stop();
        println!(
            "{ip} while two agents left: {} answered, {} failed, served by {:?}",
            seen.answered,
            seen.failed.len(),
            seen.served_by
        );
        none_lost_but_in_flight_at_a_move(&seen, &format!("{ip} as two agents left"), || {
            c.nodes[last].log()
        });
        let doubles = double_answers(&samples);
        assert!(doubles.is_empty(), "two MACs answered {ip}: {doubles:x?}");
    }
    stop_as(&mut c, last, "a restart");
    let last_name = c.nodes[last].name.clone();
    assert!(
        c.records()[&last_name].value.spec.restarting.is_some(),
        "{last_name} stopped for a restart"
    );
}

/// How often `node`'s gossip fence closed because it saw no majority (the drain test's
/// agents serve their metrics on 9965).
fn minority_closings(node: &ipam_tests::cluster::ClusterNode) -> usize {
    let text = node.metrics(9965).expect("the agent's metrics");
    text.lines()
        .find(|l| l.starts_with("ipam_gossip_fence_closings_total{reason=\"minority\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map_or(0, |n| n as usize)
}

/// No request to an IP failed but the connections in flight at one of its moves, at most one
/// per move, when the IP moved from a node whose agent left: nobody passes such a connection on
/// (the new owner does only for an old owner that still runs, docs/service-ips.md, "Handing
/// over between live nodes"), so its segments reach a node that knows no such connection and
/// resets it. A request nobody answered, or one refused, is lost, and fails the test.
fn none_lost_but_in_flight_at_a_move(seen: &Requests, what: &str, logs: impl Fn() -> String) {
    assert!(
        seen.lost().is_empty(),
        "requests to {what} lost: {:?}\n{}",
        seen.lost(),
        logs()
    );
    assert!(
        seen.reset_in_flight() <= seen.moves(),
        "requests to {what}: {} connections reset in {} moves (served by {:?}): {:?}\n{}",
        seen.reset_in_flight(),
        seen.moves(),
        seen.served_by,
        seen.failed,
        logs()
    );
}

/// A connection held open to each of `ips` ([`HeldConnection`]), with the node answering it.
fn open_held(client: &Netns, ips: &[Ipv4Addr]) -> Vec<(Ipv4Addr, String, HeldConnection)> {
    ips.iter()
        .map(|ip| {
            let mut held = HeldConnection::open(client, (*ip).into())
                .unwrap_or_else(|e| panic!("a connection to {ip}: {e}"));
            let node = held
                .ask()
                .unwrap_or_else(|e| panic!("a connection to {ip} not answered: {e}"));
            (*ip, node, held)
        })
        .collect()
}

/// Each held connection still answered by the node it was opened with, `when`: after its IP
/// moved, the new owner passes its segments on to the old one, which keeps the IP on `lo`
/// (docs/service-ips.md, "Handing over between live nodes").
fn still_held_by(held: &mut [(Ipv4Addr, String, HeldConnection)], when: &str, c: &Cluster) {
    for (ip, node, connection) in held {
        match connection.ask() {
            Ok(answer) => assert_eq!(
                answer, *node,
                "a connection to {ip} opened with {node} {when}"
            ),
            Err(e) => panic!(
                "a connection to {ip} opened with {node}, {when}: {e}\n{}",
                c.nodes
                    .iter()
                    .map(ipam_tests::cluster::ClusterNode::log)
                    .collect::<Vec<_>>()
                    .join("\n---\n")
            ),
        }
    }
}

/// Waits until each of `ips` is answered by a node (by name) that `wanted` accepts.
fn wait_until_answered(
    client: &Netns,
    macs: &BTreeMap<[u8; 6], String>,
    ips: &[Ipv4Addr],
    what: &str,
    wanted: impl Fn(&str) -> bool,
    log: impl Fn() -> String,
) {
    wait_until(
        Duration::from_secs(10),
        what,
        || {
            ips.iter().all(|ip| {
                answers(client, *ip)
                    .first()
                    .is_some_and(|m| wanted(&macs[m]))
            })
        },
        log,
    );
}

/// Stops node `i`'s agent (SIGTERM) and waits until its log says it stops as for `stop` ("a
/// leave", "a restart").
fn stop_as(c: &mut Cluster, i: usize, stop: &str) {
    let agent = c.nodes[i].daemon.take().expect("the agent runs");
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    wait_until(
        Duration::from_secs(10),
        &format!("{} to stop as for {stop}", c.nodes[i].name),
        || {
            agent
                .log_text()
                .contains(&format!("stopping as for {stop}"))
        },
        || agent.log_text(),
    );
    agent.terminate();
}

/// A rolling upgrade from the previous release (xtask/previous-release; `cargo xtask test`
/// builds its `ipamd`) to this one, as a DaemonSet's rollout goes: three agents of the previous
/// release with the gossip and `on_stop = "restart"`, each stopped and replaced by this
/// release's agent in turn. Agents of the two releases hear each other in the gossip (each sees
/// the others alive, whichever release they run), this release's `ipamctl` reads the previous
/// release's agents, this release's agent takes up what the previous one's responders answer
/// (its pinned maps), and a client asking for every IP every 40 ms and requesting each every
/// 20 ms sees every IP answered by its one owner throughout: no IP moved, no request failed.
/// The records say which release each node runs (`agentVersion`, absent before this one).
#[test]
fn a_rolling_upgrade_from_the_previous_release_moves_no_service_ip() {
    let _turn = one_at_a_time();
    let what = "the rolling upgrade from the previous release";
    let Some(previous) = ipam_tests::previous_release_ipamd(what) else {
        return;
    };
    let mut c = Cluster::start("up", 1);
    c.enable_gossip();
    for _ in 0..3 {
        let i = c.prepare_node("up", "");
        c.nodes[i].binary = Some(previous.clone());
        c.nodes[i].start();
    }
    for n in &c.nodes {
        n.set_node_setting("on_stop", Some("\"restart\""));
    }
    let Settled {
        macs,
        ips,
        client,
        owners,
    } = settled_services(&c, "u", 4);
    assert!(
        c.records()
            .values()
            .all(|r| r.value.spec.agent_version.is_none()),
        "the previous release writes no agentVersion"
    );

    let _backends = Backends::start(&c);
    let traffic = traffic_to(&client, &ips);
    for i in 0..c.nodes.len() {
        c.nodes[i].stop();
        c.nodes[i].binary = None;
        c.nodes[i].start();
        let name = c.nodes[i].name.clone();
        wait_until(
            Duration::from_secs(10),
            "this release's agent to clear its node's restart notice",
            || {
                let record = &c.records()[&name].value.spec;
                record.restarting.is_none() && record.agent_version.is_some()
            },
            || c.nodes[i].log(),
        );
        // Two releases side by side: each hears the others.
        every_agent_sees_the_others_alive(&c);
        std::thread::sleep(Duration::from_secs(1));
    }
    for (ip, requests, watch) in traffic {
        let seen = requests.stop();
        let samples = watch.stop();
        let owner = &owners[&ip];
        let wrong: Vec<_> = samples
            .iter()
            .filter(|s| s.macs.len() != 1 || node_of(&macs, s.macs[0]) != *owner)
            .collect();
        println!(
            "{ip} (owned by {owner}) through the upgrade: {} requests answered, {} failed, \
             served by {:?}; ARP: {} requests, {} not answered by {owner} alone",
            seen.answered,
            seen.failed.len(),
            seen.served_by,
            samples.len(),
            wrong.len()
        );
        let logs = || {
            c.nodes
                .iter()
                .map(ipam_tests::cluster::ClusterNode::log)
                .collect::<Vec<_>>()
                .join("\n---\n")
        };
        assert!(
            wrong.is_empty(),
            "{ip}: {:x?}\n{}",
            wrong.iter().take(10).collect::<Vec<_>>(),
            logs()
        );
        assert!(
            seen.failed.is_empty() && seen.served_by == [owner.clone()],
            "{ip}: failed at {:?}, served by {:?}\n{}",
            seen.failed,
            seen.served_by,
            logs()
        );
    }
    let version = c.records()["node-0"].value.spec.agent_version.clone();
    assert_eq!(version.as_deref(), Some(env!("CARGO_PKG_VERSION")));
}

/// What [`settled_services`] set up.
struct Settled {
    /// Each node's MAC on the segment, to its name.
    macs: BTreeMap<[u8; 6], String>,
    ips: Vec<Ipv4Addr>,
    /// A client on the segment (`CLIENT`).
    client: Netns,
    /// The node answering for each IP once settled.
    owners: BTreeMap<Ipv4Addr, String>,
}

/// `count` LoadBalancer Services (`default/<prefix>N`) from a pool the rendezvous hash spreads
/// over three nodes (10.77.0.70-79; 10.77.0.50-55 would all go to node-0, by chance), announced
/// on the uplinks; returned once every Service says so and every agent sees the others alive
/// (and has decided since), with a client and each IP's owner.
fn settled_services(c: &Cluster, prefix: &str, count: usize) -> Settled {
    let macs = c.nodes.iter().map(|n| (n.mac(), n.name.clone())).collect();
    c.put("lb", &pool(vec![range("10.77.0.70", "10.77.0.79")]));
    c.put("uplinks", &uplink_policy());
    let services: Vec<String> = (0..count).map(|i| format!("default/{prefix}{i}")).collect();
    for name in &services {
        c.put(name, &lb_service(PORT));
    }
    wait_until(
        Duration::from_secs(20),
        "every Service's IP, announced",
        || {
            services
                .iter()
                .all(|s| announced_condition(c, s).is_some_and(|(ok, _)| ok))
        },
        || format!("{:?}", services.iter().map(|s| announced_condition(c, s))),
    );
    every_agent_sees_the_others_alive(c);
    std::thread::sleep(Duration::from_secs(1));
    let ips: Vec<Ipv4Addr> = service_ips(c).into_values().collect();
    let client = c.add_client(&format!("{prefix}c"));
    let owners = ips
        .iter()
        .map(|ip| (*ip, owner_of(c, &client, &macs, *ip)))
        .collect();
    Settled {
        macs,
        ips,
        client,
        owners,
    }
}

/// Waits until every agent's gossip has every other member alive.
fn every_agent_sees_the_others_alive(c: &Cluster) {
    let others = c.nodes.len() - 1;
    for i in 0..c.nodes.len() {
        wait_until(
            Duration::from_secs(10),
            &format!("every agent seeing the {others} others alive"),
            || c.ipamctl(i, &["members"]).matches(" alive ").count() == others,
            || format!("{}\n{}", c.ipamctl(i, &["members"]), c.nodes[i].log()),
        );
    }
}

/// The client's traffic to each IP: a request every 20 ms and an ARP request every 40 ms.
fn traffic_to(client: &Netns, ips: &[Ipv4Addr]) -> Vec<(Ipv4Addr, RequestLoop, ArpWatch)> {
    let start = Instant::now();
    ips.iter()
        .map(|ip| {
            let requests = RequestLoop::start(client, (*ip).into(), Duration::from_millis(20));
            (*ip, requests, ArpWatch::start(client, CLIENT, *ip, start))
        })
        .collect()
}
