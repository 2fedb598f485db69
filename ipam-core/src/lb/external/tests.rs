use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::lb::resources::Namespace;

fn pool(blocks: &[&str], extra: serde_json::Value) -> LbIpPool {
    let mut spec =
        json!({ "blocks": blocks.iter().map(|c| json!({ "cidr": c })).collect::<Vec<_>>() });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    serde_json::from_value(json!({ "spec": spec })).expect("a pool")
}

fn service(name: &str, spec: serde_json::Value, ingress: &[&str]) -> ServiceRow {
    let spec: ServiceSpec = serde_json::from_value(spec).expect("a Service spec");
    let status = ServiceStatus {
        ingress: ingress.iter().map(|ip| ip.parse().unwrap()).collect(),
        ..Default::default()
    };
    (name.to_owned(), spec, status)
}

fn clusterip_with(ips: &[&str]) -> serde_json::Value {
    json!({ "type": "ClusterIP", "externalIPs": ips })
}

/// Tenant A's pool (`a-only`, 192.0.2.0/28, namespace `tenant-a` by name), a pool for every
/// namespace labelled `tier: shared` (`shared`, 198.51.100.0/28), and no pool for 203.0.113.0/24.
fn pools() -> Vec<(String, LbIpPool)> {
    vec![
        (
            "a-only".into(),
            pool(&["192.0.2.0/28"], json!({ "namespaces": ["tenant-a"] })),
        ),
        (
            "shared".into(),
            pool(
                &["198.51.100.0/28"],
                json!({ "namespaceSelector": { "matchLabels": { "tier": "shared" } } }),
            ),
        ),
    ]
}

fn labelled(mut rows: Vec<ServiceRow>) -> Vec<ServiceRow> {
    let known: BTreeMap<String, Namespace> = ["tenant-a", "tenant-b"]
        .into_iter()
        .map(|ns| {
            let labels = [("tier".to_owned(), "shared".to_owned())].into();
            (ns.to_owned(), Namespace { labels })
        })
        .collect();
    for (name, spec, _) in &mut rows {
        spec.namespace_labels = Namespace::labels_of(&known, namespace_of(name));
    }
    rows
}

fn no_nodes() -> BTreeMap<IpAddr, String> {
    BTreeMap::new()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn an_external_ip_is_admitted_only_inside_a_pool_serving_the_services_namespace() {
    let rows = labelled(vec![
        service("tenant-a/web", clusterip_with(&["192.0.2.5"]), &[]),
        service("tenant-b/steal", clusterip_with(&["192.0.2.6"]), &[]),
        service("tenant-b/anywhere", clusterip_with(&["203.0.113.9"]), &[]),
        service("tenant-b/shared", clusterip_with(&["198.51.100.3"]), &[]),
        service("other/shared", clusterip_with(&["198.51.100.4"]), &[]),
    ]);
    let judged = judge(&rows, &pools(), no_nodes);
    assert!(judged.refused(0).is_empty(), "{:?}", judged.refused(0));
    assert_eq!(
        judged.refused(1),
        [(ip("192.0.2.6"), Refusal::NotServed(vec!["a-only".into()]))]
    );
    assert_eq!(
        judged.refused(2),
        [(ip("203.0.113.9"), Refusal::OutsidePools)]
    );
    assert!(judged.refused(3).is_empty());
    // `other` carries no `tier: shared` label (it is not a known namespace).
    assert_eq!(
        judged.refused(4),
        [(
            ip("198.51.100.4"),
            Refusal::NotServed(vec!["shared".into()])
        )]
    );
    let admitted = judged.admitted(&rows);
    let kept: Vec<&[IpAddr]> = admitted
        .iter()
        .map(|(_, s, _)| &s.external_ips[..])
        .collect();
    assert_eq!(
        kept,
        [&[ip("192.0.2.5")][..], &[], &[], &[ip("198.51.100.3")], &[]]
    );
    let problems = judged.problems(&rows, |_| true);
    assert_eq!(problems.len(), 3);
    let said = &problems["tenant-b/steal"];
    assert!(
        said.contains("192.0.2.6") && said.contains("a-only") && said.contains("tenant-b"),
        "{said}"
    );
    assert!(problems["tenant-b/anywhere"].contains("no LBIPPool"));
}

#[test]
fn another_services_assigned_ip_and_a_nodes_address_are_refused_whoever_lists_them() {
    let lb = json!({ "type": "LoadBalancer" });
    let rows = labelled(vec![
        service("tenant-a/lb", lb.clone(), &["192.0.2.1"]),
        service("tenant-a/copy", clusterip_with(&["192.0.2.1"]), &[]),
        // Its own LB IP listed again is not a refusal.
        service(
            "tenant-a/own",
            json!({ "type": "LoadBalancer", "externalIPs": ["192.0.2.2"] }),
            &["192.0.2.2"],
        ),
        service("tenant-a/node", clusterip_with(&["192.0.2.3"]), &[]),
    ]);
    let nodes = || [(ip("192.0.2.3"), "node-1".to_owned())].into();
    let judged = judge(&rows, &pools(), nodes);
    assert_eq!(
        judged.refused(1),
        [(ip("192.0.2.1"), Refusal::AssignedTo("tenant-a/lb".into()))]
    );
    assert!(judged.refused(2).is_empty());
    assert_eq!(
        judged.refused(3),
        [(ip("192.0.2.3"), Refusal::NodeAddress("node-1".into()))]
    );
    // An LB IP shared by two Services (a sharing key) is assigned to both.
    let shared = vec![
        service("tenant-a/x", lb.clone(), &["192.0.2.7"]),
        service(
            "tenant-a/y",
            json!({ "type": "LoadBalancer", "externalIPs": ["192.0.2.7"] }),
            &["192.0.2.7"],
        ),
    ];
    assert!(
        judge(&labelled(shared), &pools(), no_nodes)
            .refused(1)
            .is_empty()
    );
}

#[test]
fn an_address_two_namespaces_may_have_is_answered_for_neither_unless_both_allow_it() {
    let both = |a: serde_json::Value, b: serde_json::Value| {
        labelled(vec![
            service("tenant-a/one", a, &[]),
            service("tenant-b/two", b, &[]),
            // Not admitted to the pool: its listing contests nothing.
            service("intruder/three", clusterip_with(&["198.51.100.5"]), &[]),
        ])
    };
    let rows = both(
        clusterip_with(&["198.51.100.5"]),
        clusterip_with(&["198.51.100.5"]),
    );
    let judged = judge(&rows, &pools(), no_nodes);
    assert_eq!(
        judged.refused(0),
        [(
            ip("198.51.100.5"),
            Refusal::Contested(vec!["tenant-b/two".into()])
        )]
    );
    assert_eq!(
        judged.refused(1),
        [(
            ip("198.51.100.5"),
            Refusal::Contested(vec!["tenant-a/one".into()])
        )]
    );
    assert!(matches!(judged.refused(2), [(_, Refusal::NotServed(_))]));
    // One of the two alone: admitted, whatever the intruder lists.
    let alone = labelled(vec![
        service("tenant-a/one", clusterip_with(&["198.51.100.5"]), &[]),
        service("intruder/three", clusterip_with(&["198.51.100.5"]), &[]),
    ]);
    assert!(judge(&alone, &pools(), no_nodes).refused(0).is_empty());
    // Each allowing the other's namespace: both admitted.
    let allowing = |other: &str| {
        json!({ "type": "ClusterIP", "externalIPs": ["198.51.100.5"],
                "sharingCrossNamespace": [other] })
    };
    let agreed = both(allowing("tenant-b"), allowing("tenant-a"));
    let judged = judge(&agreed, &pools(), no_nodes);
    assert!(judged.refused(0).is_empty() && judged.refused(1).is_empty());
    // One allowing alone is not enough.
    let one_sided = both(allowing("tenant-b"), clusterip_with(&["198.51.100.5"]));
    assert!(!judge(&one_sided, &pools(), no_nodes).refused(0).is_empty());
}

#[test]
fn without_external_ips_nothing_is_asked_of_the_nodes_and_nothing_copied() {
    let rows = crate::lb::fixtures::services(3);
    let judged = judge(&rows, &pools(), || {
        panic!("the nodes' addresses are not needed")
    });
    assert!(matches!(judged.admitted(&rows), Cow::Borrowed(_)));
    assert!(judged.problems(&rows, |_| true).is_empty());
}

#[test]
fn node_addresses_come_from_the_records_addresses_and_interfaces() {
    let record: NodeIpam = serde_json::from_value(json!({ "spec": {
        "addresses": ["10.77.0.1"],
        "interfaces": [{ "name": "eth0", "addresses": ["10.77.0.1/24", "fd77::1/64"] }],
    } }))
    .expect("a record");
    let addresses = node_addresses([("node-0", &record)]);
    assert_eq!(
        addresses,
        [
            (ip("10.77.0.1"), "node-0".to_owned()),
            (ip("fd77::1"), "node-0".to_owned())
        ]
        .into()
    );
}
