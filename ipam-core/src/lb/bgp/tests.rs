use super::*;
use serde_json::json;

use crate::resources::NodeIpam;

fn peer(address: &str, selector: serde_json::Value) -> BgpPeerSpec {
    serde_json::from_value(json!({
        "peerAddress": address, "peerASN": 64500, "myASN": 64512, "nodeSelector": selector
    }))
    .expect("a peer spec")
}

fn advertisement(spec: serde_json::Value) -> BgpAdvertisementSpec {
    serde_json::from_value(spec).expect("an advertisement spec")
}

fn service(name: &str, local: bool, ips: &[&str]) -> (String, ServiceSpec, ServiceStatus) {
    let policy = if local { "Local" } else { "Cluster" };
    let spec = serde_json::from_value(json!({
        "type": "LoadBalancer", "externalTrafficPolicy": policy, "labels": { "app": name }
    }))
    .expect("a service spec");
    let status = ServiceStatus {
        ingress: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
        ..Default::default()
    };
    (format!("default/{name}"), spec, status)
}

fn pool(cidr: &str) -> LbIpPool {
    serde_json::from_value(json!({ "spec": { "blocks": [ { "cidr": cidr } ] } })).expect("a pool")
}

struct World {
    labels: BTreeMap<String, String>,
    peers: Vec<(String, BgpPeerSpec)>,
    advertisements: Vec<(String, BgpAdvertisementSpec)>,
    pools: Vec<(String, LbIpPool)>,
    services: Vec<(String, ServiceSpec, ServiceStatus)>,
    ready: ReadyNodes,
}

impl World {
    fn new() -> Self {
        Self {
            labels: [("rack".to_owned(), "a".to_owned())].into(),
            peers: vec![
                ("tor4".into(), peer("10.0.0.1", json!({}))),
                ("tor6".into(), peer("fd00::1", json!({}))),
            ],
            advertisements: vec![("all".into(), advertisement(json!({})))],
            pools: vec![
                ("public".into(), pool("198.51.100.0/24")),
                ("private".into(), pool("10.96.0.0/24")),
            ],
            services: vec![
                service("web", false, &["198.51.100.10", "2001:db8::10"]),
                service("db", true, &["10.96.0.5"]),
            ],
            ready: [("default/db".to_owned(), ["node-b".to_owned()].into())].into(),
        }
    }

    fn on(&self, node: &str, excluded: Option<&str>) -> NodeAdvertisements {
        node_advertisements(&Inputs {
            node,
            labels: &self.labels,
            excluded,
            peers: &self.peers,
            advertisements: &self.advertisements,
            pools: &self.pools,
            services: &self.services,
            ready: &self.ready,
            records: &BTreeMap::<String, NodeIpam>::new(),
        })
    }
}

/// The routes to `peer`, host routes written as their IP.
fn ips(out: &NodeAdvertisements, peer: &str) -> Vec<String> {
    out.routes
        .get(peer)
        .map(|r| {
            r.keys()
                .map(|c| match c.host_bits() {
                    0 => c.network().to_string(),
                    _ => c.to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn host(ip: &str) -> Cidr {
    host_route(ip.parse().unwrap())
}

#[test]
fn each_family_goes_to_the_peer_of_its_family() {
    let out = World::new().on("node-a", None);
    assert_eq!(ips(&out, "tor4"), ["198.51.100.10"]);
    assert_eq!(ips(&out, "tor6"), ["2001:db8::10"]);
}

#[test]
fn a_local_service_is_advertised_only_where_it_has_a_ready_endpoint() {
    let world = World::new();
    assert!(!ips(&world.on("node-a", None), "tor4").contains(&"10.96.0.5".to_owned()));
    assert_eq!(
        ips(&world.on("node-b", None), "tor4"),
        ["10.96.0.5", "198.51.100.10"]
    );
}

#[test]
fn an_advertisement_limited_to_a_pool_leaves_the_others_out() {
    let mut world = World::new();
    world.advertisements = vec![(
        "public".into(),
        advertisement(json!({ "ipPools": ["public"], "communities": ["64512:100"] })),
    )];
    let out = world.on("node-b", None);
    assert_eq!(ips(&out, "tor4"), ["198.51.100.10"]);
    let route = &out.routes["tor4"][&host("198.51.100.10")];
    assert_eq!(route.communities, [Community::Standard(64512, 100)].into());
    assert_eq!(route.services, ["default/web".to_owned()].into());
}

#[test]
fn advertisements_to_the_same_ip_merge_their_attributes() {
    let mut world = World::new();
    world.advertisements = vec![
        (
            "a".into(),
            advertisement(json!({ "communities": ["1:1"], "localPreference": 50 })),
        ),
        (
            "b".into(),
            advertisement(
                json!({ "communities": ["2:2"], "localPreference": 200, "peers": ["tor4"] }),
            ),
        ),
    ];
    let out = world.on("node-a", None);
    let route = &out.routes["tor4"][&host("198.51.100.10")];
    assert_eq!(
        route.communities,
        [Community::Standard(1, 1), Community::Standard(2, 2)].into()
    );
    assert_eq!(route.local_preference, Some(200));
    let v6 = &out.routes["tor6"][&host("2001:db8::10")];
    assert_eq!(
        v6.communities,
        [Community::Standard(1, 1)].into(),
        "b names tor4 only"
    );
}

#[test]
fn a_node_outside_the_selectors_opens_no_session_and_advertises_nothing() {
    let mut world = World::new();
    world.peers[0].1 = peer("10.0.0.1", json!({ "matchLabels": { "rack": "b" } }));
    world.advertisements = vec![(
        "rack-b".into(),
        advertisement(json!({ "nodeSelector": { "matchLabels": { "rack": "b" } } })),
    )];
    let out = world.on("node-a", None);
    assert_eq!(out.peers.keys().collect::<Vec<_>>(), ["tor6"]);
    assert!(out.routes.is_empty());
}

#[test]
fn an_excluded_node_keeps_its_sessions_and_withdraws_its_routes() {
    let out = World::new().on("node-a", Some("drained"));
    assert_eq!(out.peers.len(), 2);
    assert!(out.routes.is_empty());
}

#[test]
fn bad_specs_are_refused_with_their_name_and_why() {
    let mut world = World::new();
    world.peers[0].1.hold_time_seconds = 2;
    world.advertisements = vec![(
        "typo".into(),
        advertisement(json!({ "communities": ["64512-100"] })),
    )];
    let out = world.on("node-a", None);
    assert!(!out.peers.contains_key("tor4"));
    let refused: Vec<String> = out
        .refused
        .iter()
        .map(|(n, w)| format!("{n}: {w}"))
        .collect();
    assert!(
        refused[0].starts_with("BGPPeer tor4: holdTimeSeconds 2"),
        "{refused:?}"
    );
    assert!(
        refused[1].starts_with("BGPAdvertisement typo: community \"64512-100\""),
        "{refused:?}"
    );
}

#[test]
fn peer_defaults_and_metallb_spelling() {
    let spec = peer("10.0.0.1", json!({}));
    assert_eq!(spec.local_asn, 64512);
    assert_eq!((spec.peer_port, spec.hold_time_seconds), (179, 90));
    assert!(check_peer(&spec).is_ok());
    let mut gtsm = spec.clone();
    (gtsm.ttl_security, gtsm.ebgp_multihop) = (true, Some(2));
    assert!(
        check_peer(&gtsm)
            .unwrap_err()
            .contains("exclude each other")
    );
}

#[test]
fn a_password_comes_one_way_and_fits_a_tcp_md5_key() {
    let mut spec = peer("10.0.0.1", json!({}));
    spec.password_secret_ref = serde_json::from_value(json!({ "name": "bgp-tor" })).unwrap();
    assert_eq!(
        spec.password_secret_ref.as_ref().map(|r| r.key.as_str()),
        Some("password"),
        "the key defaults to password, as MetalLB's and Cilium's Secrets have it"
    );
    assert!(check_peer(&spec).is_ok());
    spec.password = Some("inline".into());
    assert!(
        check_peer(&spec)
            .unwrap_err()
            .contains("password and passwordSecretRef exclude each other")
    );
    spec.password_secret_ref = None;
    spec.password = Some("x".repeat(81));
    assert!(
        check_peer(&spec)
            .unwrap_err()
            .contains("1 to 80 characters")
    );
    assert!(check_password("with \"quotes\"").is_err());
}

#[test]
fn communities_standard_and_large() {
    assert_eq!(
        parse_community("64512:100"),
        Ok(Community::Standard(64512, 100))
    );
    assert_eq!(
        parse_community("4200000000:1:2"),
        Ok(Community::Large(4_200_000_000, 1, 2))
    );
    assert_eq!(
        parse_community("large:64512:7:9"),
        Ok(Community::Large(64512, 7, 9)),
        "MetalLB's spelling"
    );
    for bad in ["70000:1", "1:2:3:4", "large:1:2", "a:b", "64512"] {
        assert!(parse_community(bad).is_err(), "{bad}");
    }
    assert_eq!(Community::Large(1, 2, 3).to_string(), "1:2:3");
}

/// A Service that labels itself with another tenant's namespace is not advertised by that
/// tenant's advertisement, in either family; the tenant's own Service is.
#[test]
fn a_service_claiming_another_namespace_by_label_is_not_advertised_for_it() {
    let mut world = World::new();
    world.advertisements = vec![(
        "tenant-one".into(),
        advertisement(json!({ "serviceSelector": { "matchLabels": {
            "io.kubernetes.service.namespace": "tenant-one" } } })),
    )];
    let (_, mut impostor, status) = service("web", false, &["198.51.100.20", "2001:db8::20"]);
    impostor.labels.insert(
        "io.kubernetes.service.namespace".into(),
        "tenant-one".into(),
    );
    let (_, real, real_status) = service("web", false, &["198.51.100.30", "2001:db8::30"]);
    world.services = vec![
        ("tenant-two/web".into(), impostor, status),
        ("tenant-one/web".into(), real, real_status),
    ];
    let out = world.on("node-a", None);
    assert_eq!(ips(&out, "tor4"), ["198.51.100.30"]);
    assert_eq!(ips(&out, "tor6"), ["2001:db8::30"]);
}

#[test]
fn an_advertisement_chooses_pools_by_their_labels() {
    let mut world = World::new();
    world.pools[1].1.labels = [("reach".to_owned(), "internal".to_owned())].into();
    world.advertisements = vec![(
        "internal".into(),
        advertisement(json!({ "ipPoolSelector": { "matchLabels": { "reach": "internal" } } })),
    )];
    assert_eq!(ips(&world.on("node-b", None), "tor4"), ["10.96.0.5"]);
    // Names and labels both: a pool must pass both.
    world.advertisements[0].1.ip_pools = vec!["public".into()];
    assert!(world.on("node-b", None).routes.is_empty());
}

#[test]
fn an_aggregate_replaces_the_host_routes_of_its_services() {
    let mut world = World::new();
    world
        .services
        .push(service("api", false, &["198.51.100.77", "2001:db8::77"]));
    world.pools.push(("public6".into(), pool("2001:db8::/64")));
    world.advertisements = vec![(
        "agg".into(),
        advertisement(json!({ "aggregationLength": 24, "aggregationLengthV6": 64 })),
    )];
    let out = world.on("node-b", None);
    // The Local Service db keeps its host route (only the nodes with its endpoints draw its
    // traffic); web and api share one aggregate per family.
    assert_eq!(ips(&out, "tor4"), ["10.96.0.5", "198.51.100.0/24"]);
    assert_eq!(ips(&out, "tor6"), ["2001:db8::/64"]);
    let aggregate = &out.routes["tor4"][&"198.51.100.0/24".parse::<Cidr>().unwrap()];
    assert_eq!(
        aggregate.services,
        ["default/api".to_owned(), "default/web".to_owned()].into()
    );
    // The addresses to accept traffic for stay the Services' own.
    let ips: Vec<String> = out.ips().iter().map(ToString::to_string).collect();
    assert_eq!(
        ips,
        [
            "10.96.0.5",
            "198.51.100.10",
            "198.51.100.77",
            "2001:db8::10",
            "2001:db8::77"
        ]
    );
}

#[test]
fn an_aggregate_shorter_than_a_pool_block_is_refused() {
    let mut world = World::new();
    world.advertisements = vec![(
        "wide".into(),
        advertisement(json!({ "aggregationLength": 16 })),
    )];
    let out = world.on("node-b", None);
    assert!(out.routes.is_empty());
    let (what, why) = &out.refused[0];
    assert_eq!(what, "BGPAdvertisement wide");
    assert!(
        why.contains("aggregationLength 16") && why.contains("198.51.100.0/24"),
        "{why}"
    );
    // Limited to a pool it fits, it is taken; a range aligned to the aggregate fits too.
    world.advertisements[0].1.ip_pools = vec!["aligned".into()];
    world.advertisements[0].1.aggregation_length = Some(28);
    world.pools.push((
        "aligned".into(),
        serde_json::from_value(json!({ "spec": { "blocks": [
            { "start": "198.51.100.16", "stop": "198.51.100.47" } ] } }))
        .unwrap(),
    ));
    let out = world.on("node-b", None);
    assert!(out.refused.is_empty(), "{:?}", out.refused);
    world.pools[2].1.spec.blocks[0].stop = Some("198.51.100.50".into());
    let out = world.on("node-b", None);
    assert!(
        out.refused[0].1.contains("198.51.100.16-198.51.100.50"),
        "{:?}",
        out.refused
    );
    // Longer than an address: refused by itself.
    world.advertisements[0].1.aggregation_length = Some(33);
    assert!(check_advertisement(&world.advertisements[0].1).is_err());
}

/// An advertisement with `externalIPs: true` advertises a Service's external IPs only where
/// `lb::external` admits them: inside a pool serving the Service, not another's LB IP, not a
/// node's address; the others are not advertised.
#[test]
fn external_ips_are_advertised_only_where_a_pool_gives_them() {
    let mut world = World::new();
    world.advertisements = vec![("all".into(), advertisement(json!({ "externalIPs": true })))];
    let (name, mut spec, _) = service("ext", false, &[]);
    spec.service_type = crate::lb::resources::ServiceType::ClusterIP;
    // Public's, no pool's, web's LB IP, node-b's address.
    spec.external_ips = [
        "198.51.100.77",
        "203.0.113.9",
        "198.51.100.10",
        "198.51.100.200",
    ]
    .iter()
    .map(|ip| ip.parse().unwrap())
    .collect();
    world.services.push((name, spec, ServiceStatus::default()));
    let record: NodeIpam = serde_json::from_value(json!({
        "spec": { "addresses": ["198.51.100.200"] }
    }))
    .unwrap();
    let records = BTreeMap::from([("node-b".to_owned(), record)]);
    let out = node_advertisements(&Inputs {
        node: "node-a",
        labels: &world.labels,
        excluded: None,
        peers: &world.peers,
        advertisements: &world.advertisements,
        pools: &world.pools,
        services: &world.services,
        ready: &world.ready,
        records: &records,
    });
    let routes = &out.routes["tor4"];
    assert!(routes.contains_key(&host("198.51.100.77")), "{routes:?}");
    for refused in ["203.0.113.9", "198.51.100.200"] {
        assert!(
            !routes.contains_key(&host(refused)),
            "{refused}: {routes:?}"
        );
    }
    // Web's own IP stays web's route.
    assert!(routes.contains_key(&host("198.51.100.10")));
}
