//! Conversions of Cilium's and MetalLB's resources in the shapes of their documentation
//! (`examples`), in IPv4 and IPv6; what is dropped and why; malformed input. `ipamctl`'s own
//! tests read the output back with `ipamctl apply`'s parser and check `--check`'s verdicts.

use std::net::IpAddr;

use ipam_core::{
    lb::{
        bgp::BgpAdvertisementSpec,
        resources::{L2PolicySpec, LbIpBlock, LbIpPoolSpec},
    },
    meta::{Selector, SelectorOperator},
};

use super::*;
use crate::examples::{CILIUM, CILIUM_BGP, METALLB};

fn migrate(yaml: &str) -> Migration {
    convert(&read("in.yaml", yaml).unwrap()).unwrap()
}

fn error(yaml: &str) -> String {
    read("in.yaml", yaml)
        .and_then(|s| convert(&s))
        .map(|m| format!("converted: {:?}", m.converted))
        .unwrap_or_else(|e| e.to_string())
}

/// What was dropped: from which object, which field.
fn dropped(m: &Migration) -> Vec<(&str, &str)> {
    m.dropped
        .iter()
        .map(|d| (d.from.as_str(), d.field.as_str()))
        .collect()
}

/// The converted object `name` of the kind `pick` takes.
fn find<T>(m: &Migration, name: &str, pick: impl Fn(&Target) -> Option<T>) -> T {
    m.converted
        .iter()
        .filter(|c| c.name == name)
        .find_map(|c| pick(&c.target))
        .unwrap_or_else(|| panic!("no {name} of that kind in {:?}", m.converted))
}

fn lb_pool(m: &Migration, name: &str) -> LbIpPoolSpec {
    find(m, name, |t| match t {
        Target::LbPool(s) => Some(s.clone()),
        _ => None,
    })
}

fn l2_policy(m: &Migration, name: &str) -> L2PolicySpec {
    find(m, name, |t| match t {
        Target::L2Policy(s) => Some(s.clone()),
        _ => None,
    })
}

fn cidr(c: &str) -> LbIpBlock {
    LbIpBlock {
        cidr: Some(c.into()),
        ..LbIpBlock::default()
    }
}

fn range(a: &str, z: &str) -> LbIpBlock {
    LbIpBlock {
        cidr: None,
        start: Some(a.into()),
        stop: Some(z.into()),
    }
}

#[test]
fn cilium_resources_convert_with_their_defaults_written_out() {
    let m = migrate(CILIUM);
    assert!(m.dropped.is_empty(), "{:?}", m.dropped);
    let blue = lb_pool(&m, "blue-pool");
    assert_eq!(
        blue.blocks,
        vec![
            cidr("10.0.10.0/24"),
            cidr("2004::/64"),
            range("20.0.20.100", "20.0.20.200"),
            range("1.2.3.4", "1.2.3.4"),
        ]
    );
    assert!(
        blue.allow_first_last_ips,
        "Cilium hands them out unless told No"
    );
    assert!(blue.auto_assign && !blue.disabled);
    let red = lb_pool(&m, "red-pool");
    assert_eq!(
        red.blocks,
        vec![cidr("fd00:20::/120")],
        "the old name cidrs"
    );
    assert!(!red.allow_first_last_ips && red.disabled);
    assert_eq!(red.service_selector.match_expressions[0].key, "color");

    let policy = l2_policy(&m, "policy1");
    assert_eq!(policy.service_selector.match_labels["color"], "blue");
    assert_eq!(
        policy.node_selector.match_expressions[0].operator,
        SelectorOperator::DoesNotExist
    );
    assert_eq!(policy.interfaces, vec!["(?:^eth[0-9]+).*".to_owned()]);
    assert!(policy.external_ips && policy.load_balancer_ips);
    assert!(
        m.notes
            .iter()
            .any(|n| n.contains("spec.interfaces[0]") && n.contains("whole names")),
        "{:?}",
        m.notes
    );

    let green = m
        .converted
        .iter()
        .find_map(|c| match &c.target {
            Target::PodPool(s) => Some(s.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(green.ipv4.as_ref().unwrap().mask_size, 27);
    assert_eq!(
        green.ipv6.as_ref().unwrap().cidrs,
        vec!["fd00:20::/104".to_owned()]
    );
}

#[test]
fn a_cilium_policy_announces_only_what_it_says() {
    let m = migrate(
        "kind: CiliumL2AnnouncementPolicy\nmetadata: {name: quiet}\nspec: {externalIPs: true}\n",
    );
    let p = l2_policy(&m, "quiet");
    assert!(
        p.external_ips && !p.load_balancer_ips,
        "Cilium's defaults are false"
    );
}

#[test]
fn metallb_resources_convert_and_what_has_no_counterpart_is_named() {
    let m = migrate(METALLB);
    let first = lb_pool(&m, "first-pool");
    assert_eq!(
        first.blocks,
        vec![
            cidr("192.168.10.0/24"),
            range("192.168.9.1", "192.168.9.5"),
            cidr("fc00:f853:ccd:e799::/124"),
            range("fc00:f853:ccd:e800::10", "fc00:f853:ccd:e800::20"),
        ]
    );
    assert!(
        first.allow_first_last_ips,
        "MetalLB hands out a CIDR's every address"
    );
    assert!(first.auto_assign && !first.avoid_buggy_ips && first.namespaces.is_empty());

    let expensive = lb_pool(&m, "expensive");
    assert!(!expensive.auto_assign && expensive.avoid_buggy_ips);
    assert_eq!(expensive.priority, Some(50));
    assert_eq!(
        expensive.namespaces,
        vec!["shop".to_owned(), "pay".to_owned()]
    );
    assert_eq!(
        expensive.service_selector.match_expressions[0].values,
        vec!["web".to_owned()]
    );

    // Two node selectors: two policies, which add up as MetalLB's list does.
    let a = l2_policy(&m, "east-1");
    let b = l2_policy(&m, "east-2");
    assert_eq!(
        a.node_selector.match_labels["kubernetes.io/hostname"],
        "node-a"
    );
    assert_eq!(
        b.node_selector.match_labels["kubernetes.io/hostname"],
        "node-b"
    );
    assert_eq!(
        a.interfaces,
        vec!["eth0".to_owned(), "bond0\\.100".to_owned()]
    );
    assert!(a.load_balancer_ips && !a.external_ips);
    let everywhere = l2_policy(&m, "everywhere");
    assert_eq!(everywhere.node_selector, Selector::default());

    // The pools chosen by label, carried as the label selector they are, with the labels
    // on the converted pool.
    assert_eq!(a.ip_pool_selector.match_labels["zone"], "east");
    assert_eq!(b.ip_pool_selector, a.ip_pool_selector);
    assert!(a.ip_pools.is_empty() && everywhere.ip_pools.is_empty());
    let labels = &m
        .converted
        .iter()
        .find(|c| c.name == "first-pool")
        .unwrap()
        .labels;
    assert_eq!(labels["zone"], "east");

    assert_eq!(
        dropped(&m),
        vec![("in.yaml: document 5 (BGPPeer router)", "spec.sourceAddress")],
        "{:#?}",
        m.dropped
    );

    // The BGP peer with its BFDProfile, and the advertisement with its Community alias.
    let peer = m
        .converted
        .iter()
        .find_map(|c| match &c.target {
            Target::BgpPeer(p) if c.name == "router" => Some(p.clone()),
            _ => None,
        })
        .expect("the BGPPeer converted");
    assert_eq!(
        (peer.local_asn, peer.peer_asn, peer.hold_time_seconds),
        (64500, 64501, 9)
    );
    assert_eq!(peer.password.as_deref(), Some("s3cret"));
    let bfd = peer.bfd.expect("the BFDProfile's timers");
    assert_eq!(
        (
            bfd.receive_interval_ms,
            bfd.transmit_interval_ms,
            bfd.detect_multiplier
        ),
        (100, 150, 5)
    );
    assert!(peer.graceful_restart.is_some());
    assert_eq!(peer.node_selector.match_labels["rack"], "a");
    let public = m
        .converted
        .iter()
        .find_map(|c| match &c.target {
            Target::BgpAdvertisement(a) if c.name == "public" => Some(a.clone()),
            _ => None,
        })
        .expect("the BGPAdvertisement converted");
    assert_eq!(public.ip_pools, ["first-pool"]);
    assert_eq!(public.aggregation_length, Some(24));
    assert_eq!(
        public.communities,
        ["64500:666", "64500:1", "4200000000:1:2"],
        "aliases resolved, MetalLB's large: prefix dropped"
    );
    assert_eq!(
        (public.local_preference, public.peers.clone()),
        (Some(200), vec!["router".to_owned()])
    );
}

#[test]
fn several_namespace_selectors_are_reported_not_merged() {
    let m = migrate(
        "kind: IPAddressPool\napiVersion: metallb.io/v1beta1\nmetadata: {name: p}\n\
         spec: {addresses: [\"fd05::/120\"], serviceAllocation: {namespaceSelectors: \
         [{matchLabels: {a: b}}, {matchLabels: {c: d}}]}}\n",
    );
    assert!(lb_pool(&m, "p").namespace_selector.is_empty());
    assert_eq!(m.dropped.len(), 1, "{:?}", m.dropped);
    assert_eq!(
        m.dropped[0].field,
        "spec.serviceAllocation.namespaceSelectors"
    );
    assert!(
        m.dropped[0].why.contains("2 selectors"),
        "{}",
        m.dropped[0].why
    );
}

/// Names and selectors together (MetalLB: either), or several selectors, cannot be one
/// `ipPools` and one `ipPoolSelector` (here: each must pass): they become the names of the
/// input's pools they choose, with a note; without the pools in the input, they are dropped.
#[test]
fn pool_names_and_selectors_together_become_the_names_they_choose() {
    let pools = "kind: IPAddressPool\napiVersion: metallb.io/v1beta1\n\
                 metadata: {name: a, labels: {zone: east}}\nspec: {addresses: [10.1.0.0/24]}\n---\n\
                 kind: IPAddressPool\napiVersion: metallb.io/v1beta1\n\
                 metadata: {name: b}\nspec: {addresses: [10.2.0.0/24]}\n---\n\
                 kind: IPAddressPool\napiVersion: metallb.io/v1beta1\n\
                 metadata: {name: c}\nspec: {addresses: [10.3.0.0/24]}\n---\n";
    let advertisement = "kind: L2Advertisement\napiVersion: metallb.io/v1beta1\n\
                         metadata: {name: l2}\nspec: {ipAddressPools: [b], \
                         ipAddressPoolSelectors: [{matchLabels: {zone: east}}]}\n";
    let m = migrate(&format!("{pools}{advertisement}"));
    assert!(m.dropped.is_empty(), "{:?}", m.dropped);
    let policy = l2_policy(&m, "l2");
    assert_eq!(policy.ip_pools, ["a", "b"]);
    assert!(policy.ip_pool_selector.is_empty());
    assert!(
        m.notes.iter().any(|n| n.contains("a pool labelled later")),
        "{:?}",
        m.notes
    );

    let m = migrate(advertisement);
    assert_eq!(
        dropped(&m),
        [(
            "in.yaml: document 1 (L2Advertisement l2)",
            "spec.ipAddressPoolSelectors"
        )]
    );
    assert_eq!(l2_policy(&m, "l2").ip_pools, ["b"]);
}

#[test]
fn an_advertisement_of_every_pool_drops_nothing() {
    let m = migrate(
        "kind: IPAddressPool\napiVersion: metallb.io/v1beta1\nmetadata: {name: only}\n\
         spec: {addresses: [10.1.0.0/24]}\n---\nkind: L2Advertisement\n\
         apiVersion: metallb.io/v1beta1\nmetadata: {name: l2}\nspec: {ipAddressPools: [only]}\n",
    );
    assert!(m.dropped.is_empty(), "{:?}", m.dropped);
}

#[test]
fn unknown_fields_and_kinds_are_reported_not_lost() {
    let m = migrate(
        "kind: CiliumLoadBalancerIPPool\napiVersion: cilium.io/v2\nmetadata: {name: p}\n\
         spec: {blocks: [{cidr: 10.2.0.0/24, mystery: 1}], futureField: x}\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: b}\n",
    );
    let fields: Vec<&str> = m.dropped.iter().map(|d| d.field.as_str()).collect();
    assert_eq!(
        fields,
        vec![
            "spec.blocks[0].mystery",
            "spec.futureField",
            "(the whole object)"
        ]
    );
    assert!(m.dropped[2].why.contains("ConfigMap is not a kind"));
    assert!(migrate(CILIUM).dropped.is_empty());
}

#[test]
fn a_list_from_kubectl_get_is_read_item_by_item() {
    let m = migrate(
        "apiVersion: v1\nkind: List\nitems:\n\
         - {apiVersion: metallb.io/v1beta1, kind: IPAddressPool, metadata: {name: a, resourceVersion: \"9\"}, spec: {addresses: [10.3.0.0/24]}, status: {}}\n\
         - {apiVersion: metallb.io/v1beta1, kind: IPAddressPool, metadata: {name: b}, spec: {addresses: [\"fd03::/120\"]}}\n",
    );
    assert_eq!(m.converted.len(), 2);
    assert_eq!(
        m.converted[1].from,
        "in.yaml: document 1 item 2 (IPAddressPool b)"
    );
    assert!(m.dropped.is_empty(), "{:?}", m.dropped);
}

#[test]
fn malformed_input_names_the_document_and_field() {
    for (yaml, expected) in [
        (
            "kind: CiliumLoadBalancerIPPool\nmetadata: {name: p}\nspec: {blocks: [{stop: 10.0.0.9}]}\n",
            "in.yaml: document 1 (CiliumLoadBalancerIPPool p): spec.blocks[0]: a block has either",
        ),
        (
            "kind: CiliumLoadBalancerIPPool\nmetadata: {name: p}\nspec: {allowFirstLastIPs: maybe, blocks: [{cidr: 10.0.0.0/24}]}\n",
            "spec.allowFirstLastIPs: expected \"Yes\" or \"No\"",
        ),
        (
            "---\nkind: IPAddressPool\nmetadata: {name: q}\nspec: {addresses: [10.0.0.1-nine]}\n",
            "in.yaml: document 1 (IPAddressPool q): spec.addresses[0]: \"nine\" in \"10.0.0.1-nine\" is not an IP address",
        ),
        (
            "kind: IPAddressPool\nmetadata: {name: q}\nspec: {addresses: [10.0.0.300/24]}\n",
            "neither a CIDR nor a range",
        ),
        (
            "kind: IPAddressPool\nmetadata: {name: q}\nspec: {autoAssign: \"no\", addresses: [10.0.0.0/24]}\n",
            "spec.autoAssign: expected true or false, found the string \"no\"",
        ),
        (
            "kind: CiliumPodIPPool\nmetadata: {name: r}\nspec: {ipv4: {cidrs: [10.0.0.0/8]}}\n",
            "spec.ipv4.maskSize: missing",
        ),
        (
            "kind: L2Advertisement\nmetadata: {name: s}\nspec: {nodeSelectors: {a: b}}\n",
            "spec.nodeSelectors: expected a list",
        ),
        (
            "kind: IPAddressPool\nspec: {}\n",
            "in.yaml: document 1: metadata: missing",
        ),
        ("a: [\n", "in.yaml: document 1 is not valid YAML"),
        (
            "kind: IPAddressPool\nmetadata: {name: x}\nspec: {addresses: [10.0.0.0/24]}\n---\n\
             kind: CiliumLoadBalancerIPPool\nmetadata: {name: x}\nspec: {blocks: [{cidr: 10.1.0.0/24}]}\n",
            "document 1 (IPAddressPool x) and in.yaml: document 2 (CiliumLoadBalancerIPPool x) would both become the LoadBalancerIPPool x",
        ),
    ] {
        let e = error(yaml);
        assert!(e.contains(expected), "{yaml}\n=> {e}");
    }
}

fn bgp_peer(m: &Migration, name: &str) -> ipam_core::lb::bgp::BgpPeerSpec {
    find(m, name, |t| match t {
        Target::BgpPeer(s) => Some((**s).clone()),
        _ => None,
    })
}

fn bgp_advertisement(m: &Migration, name: &str) -> BgpAdvertisementSpec {
    find(m, name, |t| match t {
        Target::BgpAdvertisement(s) => Some(s.clone()),
        _ => None,
    })
}

#[test]
fn cilium_bgp_control_plane_converts_peers_and_the_advertisements_they_select() {
    let m = migrate(CILIUM_BGP);
    let names: Vec<(&str, &str)> = m
        .converted
        .iter()
        .map(|c| (c.target.kind(), c.name.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("BGPPeer", "peer-65000-tor1"),
            ("BGPPeer", "peer-65000-tor2"),
            ("BGPPeer", "peer-lonely"),
            // Named by its place in the list: a second Service advertisement is in it.
            ("BGPAdvertisement", "bgp-advertisements-1")
        ]
    );
    // Both families' peers take the peer config's settings; the cluster config's node selector
    // and local AS.
    for (name, address) in [
        ("peer-65000-tor1", "10.0.0.1"),
        ("peer-65000-tor2", "fd00:11::1"),
    ] {
        let peer = bgp_peer(&m, name);
        assert_eq!(peer.peer_address, address.parse::<IpAddr>().unwrap());
        assert_eq!(
            (peer.local_asn, peer.peer_asn, peer.peer_port),
            (65000, 65001, 1179)
        );
        assert_eq!(
            (peer.hold_time_seconds, peer.keep_alive_time_seconds),
            (9, Some(3))
        );
        assert_eq!(peer.connect_retry_time_seconds, 120, "Cilium's default");
        assert_eq!(peer.ebgp_multihop, Some(4));
        assert_eq!(
            peer.graceful_restart.map(|g| g.restart_time_seconds),
            Some(15)
        );
        assert_eq!(peer.node_selector.match_labels["rack"], "rack0");
        assert_eq!(ipam_core::lb::bgp::check_peer(&bgp_peer(&m, name)), Ok(()));
    }
    // The only Service advertisement with a selector goes to the two peers whose config
    // selects its object, with every attribute that has a counterpart.
    let ad = bgp_advertisement(&m, "bgp-advertisements-1");
    assert_eq!(ad.peers, ["peer-65000-tor1", "peer-65000-tor2"]);
    assert!(ad.load_balancer_ips && ad.external_ips);
    assert_eq!(
        ad.communities,
        ["65000:99", "65000:100", "65535:65281", "1111:1111:1111"]
    );
    assert_eq!(ad.local_preference, Some(99));
    assert_eq!(ad.service_selector.match_expressions[0].key, "bgp");
    assert!(ad.ip_pools.is_empty() && ad.node_selector.is_empty());

    assert_eq!(
        dropped(&m),
        [
            (
                "in.yaml: document 1 (CiliumBGPClusterConfig cilium-bgp)",
                "spec.bgpInstances[0].localPort"
            ),
            (
                "in.yaml: document 1 (CiliumBGPClusterConfig cilium-bgp)",
                "spec.bgpInstances[0].peers[0]"
            ),
            (
                "in.yaml: document 1 (CiliumBGPClusterConfig cilium-bgp)",
                "spec.bgpInstances[0].peers[1]"
            ),
            (
                "in.yaml: document 3 (CiliumBGPAdvertisement bgp-advertisements)",
                "spec.advertisements[0]"
            ),
            (
                "in.yaml: document 3 (CiliumBGPAdvertisement bgp-advertisements)",
                "spec.advertisements[1].service.addresses[0]"
            ),
        ],
        "{:#?}",
        m.dropped
    );
    // Each session carries its own family: the IPv6 family of the IPv4 peer is named.
    assert!(
        m.dropped[1]
            .why
            .contains("ipv6 family over a session with 10.0.0.1")
    );
    assert!(
        m.dropped[2]
            .why
            .contains("ipv4 family over a session with fd00:11::1")
    );
    assert!(m.dropped[4].why.contains("ClusterIPs are not advertised"));
    // The Secret is named in both peers; a note says where it must be.
    let notes = m.notes.join("\n");
    for name in ["peer-65000-tor1", "peer-65000-tor2"] {
        let secret = bgp_peer(&m, name).password_secret_ref.expect("the Secret");
        assert_eq!(
            (secret.name.as_str(), secret.key.as_str()),
            ("bgp-auth-secret", "password")
        );
    }
    assert!(
        notes.contains("spec.authSecretRef: the password is read from the Secret bgp-auth-secret")
            && notes.contains("copy the Secret there"),
        "{notes}"
    );
    // What converts to nothing says why: no peer config, no selector, no peer selecting it.
    assert!(notes.contains("peers[2]: no peerConfigRef"), "{notes}");
    assert!(
        notes.contains("advertisements[2]: no selector, so it matches no Service"),
        "{notes}"
    );
    assert!(
        notes.contains("(CiliumBGPAdvertisement unselected)") && notes.contains("goes to no peer"),
        "{notes}"
    );
}

#[test]
fn a_cilium_peering_policy_becomes_peers_and_an_advertisement() {
    let policy = r#"
apiVersion: cilium.io/v2alpha1
kind: CiliumLoadBalancerIPPool
metadata: {name: prod, labels: {environment: production}}
spec: {blocks: [{cidr: 10.9.0.0/24}]}
---
apiVersion: "cilium.io/v2alpha1"
kind: CiliumBGPPeeringPolicy
metadata:
  name: rack0
spec:
  nodeSelector:
    matchLabels:
      rack: rack0
  virtualRouters:
  - localASN: 64512
    exportPodCIDR: true
    serviceSelector:
      matchLabels:
        app: foo
    serviceAdvertisements: [LoadBalancerIP, ExternalIP]
    neighbors:
    - peerAddress: '10.0.0.1/32'
      peerASN: 64512
      peerPort: 1179
      eBGPMultihopTTL: 1
      connectRetryTimeSeconds: 5
      holdTimeSeconds: 9
      keepAliveTimeSeconds: 3
      authSecretRef: bgp-password
      gracefulRestart: {enabled: true}
      advertisedPathAttributes:
      - selectorType: CiliumLoadBalancerIPPool
        selector: {matchLabels: {environment: production}}
        communities: {standard: ["64512:100"]}
        localPreference: 150
      - selectorType: PodCIDR
        localPreference: 150
    - peerAddress: 'fd00::1/128'
      peerASN: 64513
"#;
    let m = migrate(policy);
    let peer = bgp_peer(&m, "rack0-10-0-0-1");
    assert_eq!(peer.peer_address, "10.0.0.1".parse::<IpAddr>().unwrap());
    assert_eq!(
        (peer.local_asn, peer.peer_asn, peer.peer_port),
        (64512, 64512, 1179)
    );
    assert_eq!(
        (
            peer.hold_time_seconds,
            peer.keep_alive_time_seconds,
            peer.connect_retry_time_seconds,
            peer.ebgp_multihop
        ),
        (9, Some(3), 5, None)
    );
    assert_eq!(
        peer.graceful_restart.map(|g| g.restart_time_seconds),
        Some(120)
    );
    assert_eq!(peer.node_selector.match_labels["rack"], "rack0");
    assert_eq!(
        peer.password_secret_ref.map(|s| s.name).as_deref(),
        Some("bgp-password")
    );
    let v6 = bgp_peer(&m, "rack0-fd00--1");
    assert_eq!((v6.peer_asn, v6.hold_time_seconds), (64513, 90));

    let ad = bgp_advertisement(&m, "rack0");
    assert_eq!(ad.peers, ["rack0-10-0-0-1", "rack0-fd00--1"]);
    assert!(ad.load_balancer_ips && ad.external_ips);
    assert_eq!(ad.service_selector.match_labels["app"], "foo");
    // The path attributes of the production pool's routes, to that neighbour only.
    let attributes = bgp_advertisement(&m, "rack0-10-0-0-1-attributes-0");
    assert_eq!(attributes.ip_pools, ["prod"]);
    assert_eq!(attributes.peers, ["rack0-10-0-0-1"]);
    assert_eq!(
        (attributes.communities.clone(), attributes.local_preference),
        (vec!["64512:100".to_owned()], Some(150))
    );
    assert_eq!(attributes.service_selector, ad.service_selector);

    let fields: Vec<&str> = m
        .dropped
        .iter()
        .filter(|d| d.from.contains("CiliumBGPPeeringPolicy"))
        .map(|d| d.field.as_str())
        .collect();
    assert_eq!(
        fields,
        [
            "spec.virtualRouters[0].exportPodCIDR",
            "spec.virtualRouters[0].neighbors[0].advertisedPathAttributes[1]",
        ]
    );
}

#[test]
fn cilium_bgp_mistakes_name_the_field() {
    let peer = |fields: &str| {
        format!(
            "apiVersion: cilium.io/v2\nkind: CiliumBGPClusterConfig\nmetadata: {{name: c}}\n\
             spec: {{bgpInstances: [{{name: i, localASN: 65000, peers: [{{name: p, {fields}}}]}}]}}\n"
        )
    };
    let e = error(&peer("peerAddress: 10.0.0.0/24, peerASN: 1"));
    assert!(
        e.contains("spec.bgpInstances[0].peers[0].peerAddress") && e.contains("is a network"),
        "{e}"
    );
    let e = error(&peer("peerAddress: 10.0.0.1, peerASN: 0"));
    assert!(
        e.contains("peers[0].peerASN") && e.contains("router's AS number"),
        "{e}"
    );
    let e = error(&peer("peerAddress: 10.0.0.1"));
    assert!(e.contains("peers[0].peerASN"), "{e}");
    // A peer found by auto-discovery has no address to convert: dropped, named.
    let m = migrate(&peer("autoDiscovery: {mode: DefaultGateway}, peerASN: 1"));
    assert!(m.converted.is_empty());
    assert_eq!(m.dropped[0].field, "spec.bgpInstances[0].peers[0]");
    let e = error(
        "apiVersion: cilium.io/v2\nkind: CiliumBGPAdvertisement\nmetadata: {name: a}\n\
         spec: {advertisements: [{advertisementType: Service, service: {addresses: [NodeIP]}}]}\n",
    );
    assert!(
        e.contains("spec.advertisements[0].service.addresses[0]") && e.contains("\"NodeIP\""),
        "{e}"
    );
    let m = migrate(
        "apiVersion: cilium.io/v2\nkind: CiliumBGPNodeConfigOverride\nmetadata: {name: node-1}\n\
         spec: {bgpInstances: [{name: i, routerID: 10.0.0.9}]}\n",
    );
    assert!(m.dropped[0].why.contains("router_id"), "{:?}", m.dropped);
}
