//! Table tests of LB-IPAM: every rule, IPv4 and IPv6.

use std::net::IpAddr;

use super::{
    assign::{CONFLICT, IP_ASSIGNED, READY, assign},
    resources::{
        IpFamilyPolicy, LbIpBlock, LbIpPoolSpec, LbIpPoolStatus, Protocol, ServicePort,
        ServiceSpec, ServiceStatus, ServiceType,
    },
};
use crate::{Family, meta::Condition};

fn cidr_pool(cidrs: &[&str]) -> LbIpPoolSpec {
    LbIpPoolSpec {
        blocks: cidrs
            .iter()
            .map(|c| LbIpBlock {
                cidr: Some((*c).to_owned()),
                ..LbIpBlock::default()
            })
            .collect(),
        ..LbIpPoolSpec::default()
    }
}

fn range_pool(start: &str, stop: &str) -> LbIpPoolSpec {
    LbIpPoolSpec {
        blocks: vec![LbIpBlock {
            cidr: None,
            start: Some(start.into()),
            stop: Some(stop.into()),
        }],
        ..cidr_pool(&[])
    }
}

fn svc(family: Family) -> ServiceSpec {
    ServiceSpec {
        service_type: ServiceType::LoadBalancer,
        labels: Default::default(),
        ports: vec![ServicePort {
            port: 80,
            protocol: Protocol::TCP,
        }],
        load_balancer_class: None,
        requested_ips: vec![],
        sharing_key: None,
        ip_families: vec![family],
        ip_family_policy: IpFamilyPolicy::SingleStack,
        external_ips: vec![],
        external_traffic_policy: Default::default(),
        selector: Default::default(),
        conflict: None,
        sharing_cross_namespace: Vec::new(),
        pool: None,
        namespace_labels: Default::default(),
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A service's name, IPs (as text), whether its condition is true, and its message.
type Row = (String, Vec<String>, bool, String);

/// Runs LB-IPAM once; returns each service's IPs (as text) and condition message.
fn run(
    pools: &[(&str, LbIpPoolSpec)],
    services: &[(&str, ServiceSpec, Vec<&str>)],
) -> (Vec<Row>, super::assign::Assignment) {
    let pools: Vec<(String, LbIpPoolSpec, LbIpPoolStatus)> = pools
        .iter()
        .map(|(n, p)| ((*n).to_owned(), p.clone(), LbIpPoolStatus::default()))
        .collect();
    let services: Vec<(String, ServiceSpec, ServiceStatus)> = services
        .iter()
        .map(|(n, s, held)| {
            (
                (*n).to_owned(),
                s.clone(),
                ServiceStatus {
                    ingress: held.iter().map(|h| ip(h)).collect(),
                    conditions: vec![],
                },
            )
        })
        .collect();
    let out = assign(&pools, &services);
    let rows = out
        .services
        .iter()
        .map(|(n, st)| {
            let c = &st.conditions[0];
            assert_eq!(c.kind, IP_ASSIGNED);
            (
                n.clone(),
                st.ingress.iter().map(ToString::to_string).collect(),
                c.status,
                c.message.clone(),
            )
        })
        .collect();
    (rows, out)
}

/// (family, pool CIDR, first usable, second usable, last usable with allowFirstLastIPs)
const FAMILIES: [(Family, &str, &str, &str, &str); 2] = [
    (
        Family::V4,
        "192.0.2.0/30",
        "192.0.2.1",
        "192.0.2.2",
        "192.0.2.3",
    ),
    (
        Family::V6,
        "2001:db8::/126",
        "2001:db8::1",
        "2001:db8::2",
        "2001:db8::3",
    ),
];

#[test]
fn lowest_free_address_without_first_and_last_then_exhaustion() {
    for (family, cidr, first, second, _) in FAMILIES {
        let (rows, out) = run(
            &[("a", cidr_pool(&[cidr]))],
            &[
                ("ns/s1", svc(family), vec![]),
                ("ns/s2", svc(family), vec![]),
                ("ns/s3", svc(family), vec![]),
            ],
        );
        assert_eq!(rows[0].1, [first], "{family:?}");
        assert_eq!(rows[1].1, [second]);
        assert!(
            !rows[2].2 && rows[2].3.contains("pool a exhausted"),
            "{rows:?}"
        );
        let counts = &out.pools["a"].counts[0];
        assert_eq!((counts.total, counts.used, counts.available), (2, 2, 0));
    }
}

#[test]
fn first_and_last_when_allowed_and_ranges_used_whole() {
    for (family, cidr, _, _, last) in FAMILIES {
        let mut pool = cidr_pool(&[cidr]);
        pool.allow_first_last_ips = true;
        let services: Vec<_> = (0..4).map(|i| (format!("ns/s{i}"), svc(family))).collect();
        let input: Vec<(&str, ServiceSpec, Vec<&str>)> = services
            .iter()
            .map(|(n, s)| (n.as_str(), s.clone(), vec![]))
            .collect();
        let (rows, _) = run(&[("a", pool)], &input);
        assert_eq!(rows[3].1, [last], "{family:?}");
    }
    let (rows, _) = run(
        &[("r", range_pool("10.9.0.7", "10.9.0.8"))],
        &[
            ("ns/a", svc(Family::V4), vec![]),
            ("ns/b", svc(Family::V4), vec![]),
        ],
    );
    assert_eq!(
        (rows[0].1[0].as_str(), rows[1].1[0].as_str()),
        ("10.9.0.7", "10.9.0.8")
    );
}

#[test]
fn overlapping_pools_conflict_and_are_not_used() {
    for (family, cidr, first, _, _) in FAMILIES {
        let wider = if family == Family::V4 {
            "192.0.2.0/24"
        } else {
            "2001:db8::/120"
        };
        let (rows, out) = run(
            &[("a", cidr_pool(&[cidr])), ("b", cidr_pool(&[wider]))],
            &[("ns/s", svc(family), vec![])],
        );
        let b = &out.pools["b"].conditions[0];
        assert!(
            b.kind == CONFLICT && b.status && b.message.contains("overlaps pool a"),
            "{b:?}"
        );
        assert!(out.pools["b"].counts.is_empty());
        assert_eq!(rows[0].1, [first]);
    }
}

#[test]
fn disabled_pool_keeps_assignments_and_gives_no_new_ones() {
    for (family, cidr, first, _, _) in FAMILIES {
        let mut pool = cidr_pool(&[cidr]);
        pool.disabled = true;
        let (rows, out) = run(
            &[("a", pool)],
            &[
                ("ns/old", svc(family), vec![first]),
                ("ns/new", svc(family), vec![]),
            ],
        );
        let new = rows.iter().find(|r| r.0 == "ns/new").unwrap();
        let old = rows.iter().find(|r| r.0 == "ns/old").unwrap();
        assert_eq!(old.1, [first], "{family:?}");
        assert!(!new.2 && new.3.contains("no enabled pool"), "{new:?}");
        assert!(out.pools["a"].conditions[0].message.contains("disabled"));
    }
}

#[test]
fn an_ip_removed_from_its_pool_is_replaced_with_a_reason() {
    for (family, cidr, _, _, _) in FAMILIES {
        let (old, new_cidr, new_first) = if family == Family::V4 {
            ("198.51.100.1", "192.0.2.0/30", "192.0.2.1")
        } else {
            ("2001:db8:1::1", "2001:db8::/126", "2001:db8::1")
        };
        let _ = cidr;
        let (rows, _) = run(
            &[("a", cidr_pool(&[new_cidr]))],
            &[("ns/s", svc(family), vec![old])],
        );
        assert_eq!(rows[0].1, [new_first]);
        assert!(
            rows[0].2
                && rows[0].3.contains(&format!("gave up {old}"))
                && rows[0].3.contains("no longer in a pool"),
            "{rows:?}"
        );
    }
    // Nowhere to go: the condition says why, no dead address is kept.
    let (rows, _) = run(&[], &[("ns/s", svc(Family::V4), vec!["198.51.100.1"])]);
    assert!(rows[0].1.is_empty() && !rows[0].2, "{rows:?}");
    assert!(rows[0].3.contains("gave up") && rows[0].3.contains("no enabled pool"));
}

#[test]
fn requested_ips_inside_and_outside_pools_and_taken() {
    for (family, cidr, first, second, _) in FAMILIES {
        let outside = if family == Family::V4 {
            "203.0.113.9"
        } else {
            "2001:db8:ff::9"
        };
        let mut want = svc(family);
        want.requested_ips = vec![ip(second)];
        let mut lost = svc(family);
        lost.requested_ips = vec![ip(outside)];
        let mut late = svc(family);
        late.requested_ips = vec![ip(second)];
        let (rows, _) = run(
            &[("a", cidr_pool(&[cidr]))],
            &[
                ("ns/a-want", want, vec![]),
                ("ns/b-outside", lost, vec![]),
                ("ns/c-other", svc(family), vec![]),
                ("ns/d-late", late, vec![]),
            ],
        );
        assert_eq!(rows[0].1, [second], "{family:?}");
        assert!(
            !rows[1].2 && rows[1].3.contains("outside every pool"),
            "{rows:?}"
        );
        assert_eq!(rows[2].1, [first]);
        assert!(
            !rows[3].2 && rows[3].3.contains("taken by service ns/a-want"),
            "{rows:?}"
        );
    }
}

#[test]
fn sharing_key_shares_without_port_clash_and_refuses_with_one() {
    for (family, cidr, first, second, _) in FAMILIES {
        let shared = |port| {
            let mut s = svc(family);
            s.sharing_key = Some("web".into());
            s.ports = vec![ServicePort {
                port,
                protocol: Protocol::TCP,
            }];
            s
        };
        let (rows, _) = run(
            &[("a", cidr_pool(&[cidr]))],
            &[
                ("ns/http", shared(80), vec![]),
                ("ns/https", shared(443), vec![]),
                ("ns/http2", shared(80), vec![]),
            ],
        );
        let of = |name: &str| rows.iter().find(|r| r.0 == name).unwrap().1.clone();
        assert_eq!(of("ns/http"), [first], "{family:?}");
        assert_eq!(of("ns/https"), [first], "shared");
        // Port 80 clashes with ns/http: it gets its own address.
        assert_eq!(of("ns/http2"), [second]);
        // Asking for the shared IP with a clashing port gets a condition naming the clash.
        let mut clash = shared(80);
        clash.requested_ips = vec![ip(first)];
        let (rows, _) = run(
            &[("a", cidr_pool(&[cidr]))],
            &[
                ("ns/http", shared(80), vec![first]),
                ("ns/x", clash, vec![]),
            ],
        );
        assert!(
            !rows[1].2 && rows[1].3.contains("both use port 80"),
            "{rows:?}"
        );
    }
}

/// Services with one sharing key share only when their traffic policies agree, and with the
/// Local policy only when they select the same pods; a requested shared IP says why not.
#[test]
fn sharing_needs_the_same_traffic_policy_and_with_local_the_same_pods() {
    use crate::lb::resources::TrafficPolicy;
    for (family, cidr, first, second, _) in FAMILIES {
        let shared = |port, policy, app: &str| {
            let mut s = svc(family);
            s.sharing_key = Some("web".into());
            s.ports = vec![ServicePort {
                port,
                protocol: Protocol::TCP,
            }];
            s.external_traffic_policy = policy;
            s.selector.insert("app".into(), app.into());
            s
        };
        let (rows, _) = run(
            &[("a", cidr_pool(&[cidr]))],
            &[
                ("ns/a", shared(80, TrafficPolicy::Cluster, "x"), vec![]),
                ("ns/b", shared(443, TrafficPolicy::Cluster, "y"), vec![]),
                ("ns/c", shared(444, TrafficPolicy::Local, "x"), vec![]),
                ("ns/d", shared(445, TrafficPolicy::Local, "x"), vec![]),
                ("ns/e", shared(446, TrafficPolicy::Local, "z"), vec![]),
            ],
        );
        let of = |name: &str| rows.iter().find(|r| r.0 == name).unwrap().1.clone();
        assert_eq!(of("ns/a"), [first], "{family:?}");
        assert_eq!(of("ns/b"), [first], "Cluster: selectors may differ");
        assert_eq!(of("ns/c"), [second], "another policy: its own address");
        assert_eq!(of("ns/d"), [second], "Local with the same pods: shared");
        assert_ne!(of("ns/e"), [second], "Local with other pods: not shared");
        let mut asks = shared(81, TrafficPolicy::Local, "x");
        asks.requested_ips = vec![ip(first)];
        let (rows, _) = run(
            &[("a", cidr_pool(&[cidr]))],
            &[
                ("ns/a", shared(80, TrafficPolicy::Cluster, "x"), vec![first]),
                ("ns/x", asks, vec![]),
            ],
        );
        assert!(
            !rows[1].2 && rows[1].3.contains("externalTrafficPolicy differ"),
            "{rows:?}"
        );
    }
}

#[test]
fn service_selector_class_and_type_decide_who_is_served() {
    for (family, cidr, first, _, _) in FAMILIES {
        let mut pool = cidr_pool(&[cidr]);
        pool.service_selector
            .match_labels
            .insert("tier".into(), "edge".into());
        let mut edge = svc(family);
        edge.labels.insert("tier".into(), "edge".into());
        let mut other_class = svc(family);
        other_class.load_balancer_class = Some("metallb".into());
        let mut cluster_ip = svc(family);
        cluster_ip.service_type = ServiceType::ClusterIP;
        let (rows, _) = run(
            &[("a", pool)],
            &[
                ("ns/edge", edge, vec![]),
                ("ns/plain", svc(family), vec![]),
                ("ns/metallb", other_class, vec![]),
                ("ns/internal", cluster_ip, vec![]),
            ],
        );
        let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        assert_eq!(names, ["ns/edge", "ns/plain"], "others are left alone");
        assert_eq!(rows[0].1, [first]);
        assert!(
            !rows[1].2 && rows[1].3.contains("no enabled pool"),
            "{rows:?}"
        );
    }
}

#[test]
fn dual_stack_policies() {
    let pools = [("a", cidr_pool(&["192.0.2.0/30", "2001:db8::/126"]))];
    let only_v4 = [("v4", cidr_pool(&["192.0.2.0/30"]))];
    let mut prefer = svc(Family::V4);
    prefer.ip_family_policy = IpFamilyPolicy::PreferDualStack;
    let mut require = svc(Family::V6);
    require.ip_family_policy = IpFamilyPolicy::RequireDualStack;
    let (rows, _) = run(
        &pools,
        &[
            ("ns/p", prefer.clone(), vec![]),
            ("ns/r", require.clone(), vec![]),
        ],
    );
    assert_eq!(rows[0].1, ["192.0.2.1", "2001:db8::1"]);
    assert_eq!(rows[1].1, ["192.0.2.2", "2001:db8::2"]);
    let (rows, _) = run(
        &only_v4,
        &[("ns/p", prefer, vec![]), ("ns/r", require, vec![])],
    );
    assert!(
        rows[0].2 && rows[0].1 == ["192.0.2.1"],
        "prefer: one family is enough"
    );
    assert!(
        !rows[1].2 && rows[1].3.contains("IPv6"),
        "require: {rows:?}"
    );
}

#[test]
fn invalid_pools_say_what_is_wrong() {
    let bad = [
        ("host-bits", cidr_pool(&["192.0.2.1/24"]), "host bits"),
        ("backwards", range_pool("10.0.0.9", "10.0.0.1"), "swap them"),
        (
            "mixed",
            range_pool("10.0.0.1", "2001:db8::1"),
            "different families",
        ),
        ("empty", cidr_pool(&[]), "no blocks"),
    ];
    for (name, pool, expected) in bad {
        let (_, out) = run(&[(name, pool)], &[]);
        let c = &out.pools[name].conditions[0];
        assert!(
            c.kind == READY && !c.status && c.message.contains(expected),
            "{c:?}"
        );
    }
}

#[test]
fn assignments_are_stable_across_passes() {
    for (family, cidr, ..) in FAMILIES {
        let (rows, _) = run(
            &[("a", cidr_pool(&[cidr]))],
            &[("ns/b", svc(family), vec![])],
        );
        let held = rows[0].1.clone();
        // A service sorted before it arrives later: the held IP stays where it is.
        let (rows, _) = run(
            &[("a", cidr_pool(&[cidr]))],
            &[
                ("ns/a", svc(family), vec![]),
                (
                    "ns/b",
                    svc(family),
                    held.iter().map(String::as_str).collect(),
                ),
            ],
        );
        assert_eq!(rows[1].1, held, "{family:?}");
        assert_ne!(rows[0].1, held);
    }
}

/// (family, the pool in use, a wider pool overlapping it)
const OVERLAPS: [(Family, &str, &str); 2] = [
    (Family::V4, "192.0.2.0/28", "192.0.2.0/24"),
    (Family::V6, "2001:db8::/124", "2001:db8::/120"),
];

/// Adding a pool never renumbers a running Service: a newcomer that overlaps the pool in use
/// is flagged, whatever its name, and the Services keep their IPs. (Pools decided by name once
/// let a new pool named `aaa` take the overlap from the pool in use and renumber its Services.)
#[test]
fn a_new_overlapping_pool_is_flagged_and_no_ip_moves() {
    for (family, in_use, wider) in OVERLAPS {
        // First pass: only the pool in use; its Service gets an IP and the pool is accepted.
        let first = assign(
            &[(
                "zzz-old".into(),
                cidr_pool(&[in_use]),
                LbIpPoolStatus::default(),
            )],
            &[("ns/web".into(), svc(family), ServiceStatus::default())],
        );
        let held = first.services["ns/web"].ingress.clone();
        assert_eq!(held.len(), 1, "{family:?}");
        // Second pass: a pool sorting first by name overlaps it.
        let second = assign(
            &[
                (
                    "aaa-new".into(),
                    cidr_pool(&[wider]),
                    LbIpPoolStatus::default(),
                ),
                (
                    "zzz-old".into(),
                    cidr_pool(&[in_use]),
                    first.pools["zzz-old"].clone(),
                ),
            ],
            &[(
                "ns/web".into(),
                svc(family),
                first.services["ns/web"].clone(),
            )],
        );
        assert_eq!(
            second.services["ns/web"].ingress, held,
            "{family:?}: no IP moves"
        );
        let new = &second.pools["aaa-new"].conditions[0];
        assert!(
            new.kind == CONFLICT
                && new.status
                && new
                    .message
                    .contains("overlaps pool zzz-old, which was there first"),
            "{new:?}"
        );
        let old = &second.pools["zzz-old"].conditions[0];
        assert!(old.kind == READY && old.status, "{old:?}");
        // And on the pass after (the statuses as written), still so: the decision is stable.
        let third = assign(
            &[
                (
                    "aaa-new".into(),
                    cidr_pool(&[wider]),
                    second.pools["aaa-new"].clone(),
                ),
                (
                    "zzz-old".into(),
                    cidr_pool(&[in_use]),
                    second.pools["zzz-old"].clone(),
                ),
            ],
            &[(
                "ns/web".into(),
                svc(family),
                second.services["ns/web"].clone(),
            )],
        );
        assert_eq!(third.services["ns/web"].ingress, held);
        assert_eq!(third.pools["aaa-new"].conditions[0].kind, CONFLICT);
        // The old pool removed: the newcomer is used, and the Service's IP (inside it) stays.
        let fourth = assign(
            &[(
                "aaa-new".into(),
                cidr_pool(&[wider]),
                third.pools["aaa-new"].clone(),
            )],
            &[(
                "ns/web".into(),
                svc(family),
                third.services["ns/web"].clone(),
            )],
        );
        assert_eq!(fourth.pools["aaa-new"].conditions[0].kind, READY);
        assert_eq!(fourth.services["ns/web"].ingress, held);
    }
}

/// A Service that stops being LB-IPAM's (another type, another class) gives its IP back in the
/// same pass: its status loses the IP and LB-IPAM's conditions, and the IP can go to another
/// Service, with no two Services claiming it.
#[test]
fn a_service_leaving_lb_ipam_releases_its_ip_and_status() {
    for (family, cidr, first, _, _) in FAMILIES {
        let pools = [(
            "a".to_owned(),
            cidr_pool(&[cidr]),
            LbIpPoolStatus::default(),
        )];
        let held = ServiceStatus {
            ingress: vec![ip(first)],
            conditions: vec![
                Condition::new(IP_ASSIGNED, true, format!("assigned {first}")),
                Condition::new("Reachable", true, "inside an announced subnet"),
                Condition::new("SomeoneElses", true, "kept"),
            ],
        };
        for leave in ["NodePort", "ClusterIP", "class"] {
            let mut gone = svc(family);
            match leave {
                "NodePort" => gone.service_type = ServiceType::NodePort,
                "ClusterIP" => gone.service_type = ServiceType::ClusterIP,
                _ => gone.load_balancer_class = Some("example.com/other".into()),
            }
            let out = assign(
                &pools,
                &[
                    ("ns/gone".into(), gone, held.clone()),
                    ("ns/next".into(), svc(family), ServiceStatus::default()),
                ],
            );
            let released = &out.services["ns/gone"];
            assert!(released.ingress.is_empty(), "{leave}: {released:?}");
            let kinds: Vec<&str> = released
                .conditions
                .iter()
                .map(|c| c.kind.as_str())
                .collect();
            assert_eq!(kinds, ["SomeoneElses"], "{leave}");
            assert_eq!(
                out.services["ns/next"].ingress,
                [ip(first)],
                "{leave}: reused"
            );
        }
        // A Service of another class LB-IPAM never served keeps its status untouched.
        let mut theirs = svc(family);
        theirs.load_balancer_class = Some("example.com/other".into());
        let status = ServiceStatus {
            ingress: vec![ip(first)],
            conditions: vec![],
        };
        let out = assign(&pools, &[("ns/theirs".into(), theirs, status)]);
        assert!(!out.services.contains_key("ns/theirs"));
    }
}

/// A pool whose own blocks overlap is flagged, naming both blocks, and none of its blocks is
/// used until it is fixed.
#[test]
fn a_pool_whose_own_blocks_overlap_is_flagged_and_unused() {
    let cases = [
        (
            Family::V4,
            cidr_pool(&["192.0.2.0/24", "192.0.2.128/25"]),
            "192.0.2.0/24",
            "192.0.2.128/25",
        ),
        (
            Family::V6,
            cidr_pool(&["2001:db8::/120", "2001:db8::80/121"]),
            "2001:db8::/120",
            "2001:db8::80/121",
        ),
    ];
    for (family, mut pool, a, b) in cases {
        // With a range too: a range inside a CIDR's left-out first address still overlaps.
        let (start, stop) = match family {
            Family::V4 => ("198.51.100.10", "198.51.100.20"),
            Family::V6 => ("2001:db8:1::10", "2001:db8:1::20"),
        };
        pool.blocks.push(range_pool(start, stop).blocks[0].clone());
        let out = assign(
            &[("p".into(), pool, LbIpPoolStatus::default())],
            &[("ns/s".into(), svc(family), ServiceStatus::default())],
        );
        let c = &out.pools["p"].conditions[0];
        assert!(
            c.kind == CONFLICT
                && c.status
                && c.message
                    .contains(&format!("block 0 ({a}) and block 1 ({b}) overlap")),
            "{c:?}"
        );
        let s = &out.services["ns/s"];
        assert!(
            s.ingress.is_empty(),
            "{family:?}: nothing from a flagged pool"
        );
        assert!(!s.conditions[0].status);
        // Blocks that only touch do not overlap.
        let touching = match family {
            Family::V4 => cidr_pool(&["192.0.2.0/25", "192.0.2.128/25"]),
            Family::V6 => cidr_pool(&["2001:db8::/121", "2001:db8::80/121"]),
        };
        let out = assign(&[("t".into(), touching, LbIpPoolStatus::default())], &[]);
        assert_eq!(out.pools["t"].conditions[0].kind, READY, "{family:?}");
    }
}

/// A pool with autoAssign false serves only the IPs a service asks for: a service asking for
/// nothing gets the automatic pool's address, or, when that pool is the only one, a condition
/// naming it and saying what to do. In v4 and v6.
#[test]
fn a_pool_without_auto_assign_serves_only_requested_ips() {
    for (family, cidr, first, _, _) in FAMILIES {
        let mut public = cidr_pool(&[cidr]);
        public.auto_assign = false;
        let private_cidr = match family {
            Family::V4 => "192.168.7.0/30",
            Family::V6 => "fd99::/126",
        };
        let mut asks = svc(family);
        asks.requested_ips = vec![ip(first)];
        let (rows, _) = run(
            &[
                ("a-public", public.clone()),
                ("b-private", cidr_pool(&[private_cidr])),
            ],
            &[("ns/asks", asks, vec![]), ("ns/plain", svc(family), vec![])],
        );
        let of = |name: &str| rows.iter().find(|r| r.0 == name).unwrap().clone();
        assert_eq!(of("ns/asks").1, [first], "{family:?}");
        let plain = of("ns/plain").1;
        assert!(
            cidr_pool(&[private_cidr]).contains(ip(&plain[0])),
            "{family:?}: {plain:?} is not from the automatic pool"
        );
        let (rows, _) = run(
            &[("a-public", public)],
            &[("ns/plain", svc(family), vec![])],
        );
        assert!(
            !rows[0].2 && rows[0].3.contains("a-public") && rows[0].3.contains("autoAssign: false"),
            "{rows:?}"
        );
    }
}

/// avoidBuggyIPs: no .0 or .255 address is handed out unasked, one asked for is, and the pool's
/// counts leave them out of what is available.
#[test]
fn avoid_buggy_ips_skips_dot_zero_and_dot_255_unless_asked() {
    let mut pool = range_pool("10.0.0.254", "10.0.1.1");
    pool.avoid_buggy_ips = true;
    let (rows, out) = run(
        &[("p", pool.clone())],
        &[
            ("ns/a", svc(Family::V4), vec![]),
            ("ns/b", svc(Family::V4), vec![]),
            ("ns/c", svc(Family::V4), vec![]),
        ],
    );
    let of = |name: &str| rows.iter().find(|r| r.0 == name).unwrap().clone();
    assert_eq!(of("ns/a").1, ["10.0.0.254"]);
    assert_eq!(of("ns/b").1, ["10.0.1.1"], ".255 and .0 skipped");
    assert!(
        !of("ns/c").2 && of("ns/c").3.contains("exhausted"),
        "{rows:?}"
    );
    let counts = &out.pools["p"].counts[0];
    assert_eq!((counts.total, counts.used, counts.available), (4, 2, 0));
    let mut asks = svc(Family::V4);
    asks.requested_ips = vec![ip("10.0.0.255")];
    let (rows, out) = run(&[("p", pool)], &[("ns/asks", asks, vec![])]);
    assert_eq!(rows[0].1, ["10.0.0.255"], "asked for: given");
    let counts = &out.pools["p"].counts[0];
    assert_eq!((counts.total, counts.used, counts.available), (4, 1, 2));
}

/// A pool limited to namespaces serves only their Services, by its `namespaces` or by Cilium's
/// `io.kubernetes.service.namespace` in its selector; a Service of another namespace asking for
/// one of its IPs is told which namespaces it serves. In v4 and v6.
#[test]
fn a_pool_limited_to_namespaces_serves_only_their_services() {
    for (family, cidr, first, second, _) in FAMILIES {
        let other_cidr = match family {
            Family::V4 => "198.51.100.0/30",
            Family::V6 => "2001:db8:1::/126",
        };
        let other_first = match family {
            Family::V4 => "198.51.100.1",
            Family::V6 => "2001:db8:1::1",
        };
        let mut shop_only = cidr_pool(&[cidr]);
        shop_only.namespaces = vec!["shop".into()];
        let mut by_cilium_label = cidr_pool(&[other_cidr]);
        by_cilium_label
            .service_selector
            .match_labels
            .insert("io.kubernetes.service.namespace".into(), "tools".into());
        let mut asks = svc(family);
        asks.requested_ips = vec![ip(second)];
        let (rows, _) = run(
            &[("a-shop", shop_only), ("b-tools", by_cilium_label)],
            &[
                ("shop/web", svc(family), vec![]),
                ("tools/ci", svc(family), vec![]),
                ("other/x", svc(family), vec![]),
                ("other/asks", asks, vec![]),
            ],
        );
        let row = |name: &str| rows.iter().find(|r| r.0 == name).unwrap().clone();
        assert_eq!(row("shop/web").1, [first], "{family:?}");
        assert_eq!(row("tools/ci").1, [other_first]);
        let x = row("other/x");
        assert!(
            x.1.is_empty() && !x.2 && x.3.contains("no enabled pool"),
            "{x:?}"
        );
        let asks = row("other/asks");
        assert!(
            asks.1.is_empty()
                && asks.3.contains(
                    "is in pool a-shop, which serves only the namespaces shop, not other"
                ),
            "{asks:?}"
        );
    }
}

/// New IPs come from the pool of lowest priority that serves the Service, pools without one
/// after, then by name; an IP a Service holds stays where it is when a pool of higher priority
/// appears. In v4 and v6.
#[test]
fn pools_are_chosen_by_priority_then_name_and_held_ips_stay() {
    for (family, cidr, first, _, _) in FAMILIES {
        let (second_cidr, third_cidr, third_first) = match family {
            Family::V4 => ("198.51.100.0/30", "203.0.113.0/30", "203.0.113.1"),
            Family::V6 => ("2001:db8:1::/126", "2001:db8:2::/126", "2001:db8:2::1"),
        };
        let with_priority = |cidr: &str, priority: Option<u32>| {
            let mut p = cidr_pool(&[cidr]);
            p.priority = priority;
            p
        };
        let pools = [
            ("a-none", with_priority(cidr, None)),
            ("b-ten", with_priority(second_cidr, Some(10))),
            ("c-five", with_priority(third_cidr, Some(5))),
        ];
        let (rows, _) = run(&pools, &[("ns/new", svc(family), vec![])]);
        assert_eq!(rows[0].1, [third_first], "{family:?}: {rows:?}");
        // c-five has two usable addresses: the third Service gets b-ten's, the fifth a-none's.
        let five: Vec<(String, ServiceSpec, Vec<&str>)> = (0..5)
            .map(|i| (format!("ns/s{i}"), svc(family), vec![]))
            .collect();
        let five: Vec<(&str, ServiceSpec, Vec<&str>)> = five
            .iter()
            .map(|(n, s, h)| (n.as_str(), s.clone(), h.clone()))
            .collect();
        let (rows, _) = run(&pools, &five);
        let pool_of = |row: &Row| {
            let got = ip(&row.1[0]);
            pools
                .iter()
                .find(|(_, p)| p.contains(got))
                .map(|(n, _)| *n)
                .unwrap()
        };
        let order: Vec<&str> = rows.iter().map(pool_of).collect();
        assert_eq!(
            order,
            ["c-five", "c-five", "b-ten", "b-ten", "a-none"],
            "{rows:?}"
        );
        // A Service holding a-none's address keeps it beside pools of higher priority.
        let (rows, _) = run(&pools, &[("ns/held", svc(family), vec![first])]);
        assert_eq!(rows[0].1, [first]);
    }
}

/// A pool with a namespaceSelector serves only Services of namespaces whose labels it selects
/// (the labels LB-IPAM reads from the Namespace objects, with the name label every namespace
/// has); with `namespaces` too, a namespace must pass both. A request for one of its IPs from
/// another namespace is told why. In v4 and v6.
#[test]
fn a_pool_with_a_namespace_selector_serves_only_the_namespaces_it_selects() {
    use super::resources::Namespace;
    use crate::meta::{SelectorOperator, SelectorRequirement};
    let known: std::collections::BTreeMap<String, Namespace> = [
        ("gold", [("tier", "gold")]),
        ("gold-too", [("tier", "gold")]),
        ("plain", [("tier", "basic")]),
    ]
    .into_iter()
    .map(|(name, labels)| {
        let labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        (name.to_owned(), Namespace { labels })
    })
    .collect();
    for (family, cidr, first, second, _) in FAMILIES {
        let mut gold = cidr_pool(&[cidr]);
        gold.namespace_selector
            .match_labels
            .insert("tier".into(), "gold".into());
        // Not gold-too, by the name label Kubernetes sets (and LB-IPAM sets elsewhere).
        gold.namespace_selector
            .match_expressions
            .push(SelectorRequirement {
                key: "kubernetes.io/metadata.name".into(),
                operator: SelectorOperator::NotIn,
                values: vec!["gold-too".into()],
            });
        let in_ns = |ns: &str, mut spec: ServiceSpec| {
            spec.namespace_labels = Namespace::labels_of(&known, ns);
            spec
        };
        let mut asks = svc(family);
        asks.requested_ips = vec![ip(second)];
        let (rows, _) = run(
            &[("gold", gold)],
            &[
                ("gold/web", in_ns("gold", svc(family)), vec![]),
                ("gold-too/web", in_ns("gold-too", svc(family)), vec![]),
                ("plain/web", in_ns("plain", svc(family)), vec![]),
                ("plain/asks", in_ns("plain", asks), vec![]),
            ],
        );
        let row = |name: &str| rows.iter().find(|r| r.0 == name).unwrap().clone();
        assert_eq!(row("gold/web").1, [first], "{family:?}");
        for name in ["gold-too/web", "plain/web"] {
            let r = row(name);
            assert!(
                r.1.is_empty() && !r.2 && r.3.contains("no enabled pool"),
                "{r:?}"
            );
        }
        let asks = row("plain/asks");
        assert!(
            asks.1.is_empty()
                && asks.3.contains(
                    "is in pool gold, which serves only namespaces its namespaceSelector \
                     selects, and plain's labels do not match it"
                ),
            "{asks:?}"
        );
    }
}

/// Services of different namespaces share an IP only when each allows the other's namespace
/// (by name or `*`); one side's permission is not enough; the same namespace needs none.
#[test]
fn sharing_across_namespaces_needs_both_to_allow_it() {
    for (family, cidr, first, second, _) in FAMILIES {
        let keyed = |port, allow: &[&str]| {
            let mut s = svc(family);
            s.sharing_key = Some("k".into());
            s.ports = vec![ServicePort {
                port,
                protocol: Protocol::TCP,
            }];
            s.sharing_cross_namespace = allow.iter().map(|n| (*n).to_owned()).collect();
            s
        };
        let case = |a_allow: &[&str], b_name: &str, b_allow: &[&str]| {
            let (rows, _) = run(
                &[("p", cidr_pool(&[cidr]))],
                &[
                    ("shop/a", keyed(80, a_allow), vec![first]),
                    (b_name, keyed(443, b_allow), vec![]),
                ],
            );
            rows.into_iter().find(|r| r.0 == b_name).unwrap()
        };
        assert_eq!(case(&[], "shop/b", &[]).1, [first], "{family:?}");
        assert_eq!(case(&["tools"], "tools/b", &["shop"]).1, [first]);
        assert_eq!(case(&["*"], "tools/b", &["*"]).1, [first]);
        // Only one side allows it: tools/b gets an address of its own.
        assert_eq!(case(&["tools"], "tools/b", &[]).1, [second]);
        assert_eq!(case(&[], "tools/b", &["shop"]).1, [second]);
        // Asking for the other namespace's shared IP says why not.
        let mut asks = keyed(443, &[]);
        asks.requested_ips = vec![ip(first)];
        let (rows, _) = run(
            &[("p", cidr_pool(&[cidr]))],
            &[
                ("shop/a", keyed(80, &[]), vec![first]),
                ("tools/b", asks, vec![]),
            ],
        );
        let b = rows.iter().find(|r| r.0 == "tools/b").unwrap();
        assert!(
            !b.2 && b.3.contains("namespaces tools and shop")
                && b.3.contains("sharing-cross-namespace"),
            "{b:?}"
        );
    }
}

/// A Service asking for a pool by name gets its new IP from that pool only, also from a pool
/// that does not assign automatically; an IP it holds in another pool is given up for one of
/// the asked pool; a pool that is missing, disabled or does not serve it is named. In v4 and v6.
#[test]
fn a_service_asking_for_a_pool_gets_its_ip_from_that_pool_only() {
    for (family, cidr, first, _, _) in FAMILIES {
        let (public_cidr, public_first) = match family {
            Family::V4 => ("198.51.100.0/30", "198.51.100.1"),
            Family::V6 => ("2001:db8:1::/126", "2001:db8:1::1"),
        };
        let mut public = cidr_pool(&[public_cidr]);
        public.auto_assign = false;
        let pools = [("a-private", cidr_pool(&[cidr])), ("public", public)];
        let asking = |pool: &str| {
            let mut s = svc(family);
            s.pool = Some(pool.into());
            s
        };
        let (rows, _) = run(
            &pools,
            &[
                ("ns/plain", svc(family), vec![]),
                ("ns/public", asking("public"), vec![]),
                ("ns/moved", asking("public"), vec![first]),
                ("ns/missing", asking("gone"), vec![]),
            ],
        );
        let row = |name: &str| rows.iter().find(|r| r.0 == name).unwrap().clone();
        assert_eq!(row("ns/plain").1.len(), 1, "{family:?}");
        assert_ne!(row("ns/plain").1, [public_first]);
        let in_public = |row: &Row| row.1.len() == 1 && pools[1].1.contains(ip(&row.1[0]));
        // ns/moved comes first by name and takes the first public address.
        let moved = row("ns/moved");
        assert!(
            moved.1 == [public_first]
                && moved.3.contains(&format!("{first} is not in pool public")),
            "{moved:?}"
        );
        assert!(in_public(&row("ns/public")), "{rows:?}");
        let missing = row("ns/missing");
        assert!(
            missing.1.is_empty() && !missing.2 && missing.3.contains("asks for pool gone"),
            "{missing:?}"
        );
        let mut shop_only = cidr_pool(&[public_cidr]);
        shop_only.namespaces = vec!["shop".into()];
        let (rows, _) = run(
            &[("public", shop_only)],
            &[("ns/x", asking("public"), vec![])],
        );
        assert!(rows[0].3.contains("which does not serve it"), "{rows:?}");
    }
}

/// Every requested IP is honoured, not only the first of its family: a Service asking for two
/// gets both; when one is taken it keeps the other and its condition names the one it could
/// not get; the next pass keeps what it got. In v4 and v6.
#[test]
fn every_requested_ip_is_taken_or_named() {
    for (family, cidr, first, second, _) in FAMILIES {
        let mut both = svc(family);
        both.requested_ips = vec![ip(first), ip(second), ip(first)];
        let (rows, _) = run(
            &[("p", cidr_pool(&[cidr]))],
            &[("ns/both", both.clone(), vec![])],
        );
        assert_eq!(rows[0].1, [first, second], "{family:?}: {rows:?}");
        assert!(rows[0].2, "{rows:?}");
        let (rows, _) = run(
            &[("p", cidr_pool(&[cidr]))],
            &[
                ("ns/a-holder", svc(family), vec![second]),
                ("ns/both", both.clone(), vec![]),
            ],
        );
        let got = rows.iter().find(|r| r.0 == "ns/both").unwrap();
        assert_eq!(got.1, [first], "{got:?}");
        assert!(
            !got.2
                && got.3.contains(&format!(
                    "requested IP {second} is taken by service ns/a-holder"
                )),
            "{got:?}"
        );
        // Held IPs stay held on the next pass, and the missing one is still named.
        let (rows, _) = run(
            &[("p", cidr_pool(&[cidr]))],
            &[
                ("ns/a-holder", svc(family), vec![second]),
                ("ns/both", both, vec![first]),
            ],
        );
        let got = rows.iter().find(|r| r.0 == "ns/both").unwrap();
        assert_eq!(got.1, [first]);
        assert!(!got.2 && got.3.contains(&second.to_string()), "{got:?}");
    }
}

#[test]
fn pools_as_large_as_the_address_space_count_to_the_ceiling_without_overflow() {
    // The whole IPv6 space as a CIDR used whole, as a range, and as two halves: 2^128
    // addresses, one more than a u128 holds. Once a panic in debug and a wrapped count in
    // release.
    let mut whole = cidr_pool(&["::/0"]);
    whole.allow_first_last_ips = true;
    let mut halves = cidr_pool(&["::/1", "8000::/1"]);
    halves.allow_first_last_ips = true;
    let range = range_pool("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff");
    let mut v4_whole = cidr_pool(&["0.0.0.0/0"]);
    v4_whole.allow_first_last_ips = true;
    v4_whole.avoid_buggy_ips = true;
    for (name, pool, family, total) in [
        ("whole", whole, Family::V6, u128::MAX),
        ("halves", halves, Family::V6, u128::MAX),
        ("range", range, Family::V6, u128::MAX),
        ("v4", v4_whole, Family::V4, 1u128 << 32),
    ] {
        let (rows, out) = run(&[(name, pool)], &[("ns/s", svc(family), vec![])]);
        assert!(rows[0].2, "{name}: {rows:?}");
        let counts = &out.pools[name].counts[0];
        assert_eq!((counts.total, counts.used), (total, 1), "{name}");
        assert!(counts.available < counts.total, "{name}: {counts:?}");
    }
}

/// Cilium's derived labels come from the Service's name: a Service of tenant-two that labels
/// itself `io.kubernetes.service.namespace: tenant-one` (or names itself by label) gets no IP
/// from tenant-one's pool; tenant-one's own Service does. In IPv4 and IPv6.
#[test]
fn a_service_claiming_another_namespace_by_label_gets_nothing_from_its_pool() {
    for (family, cidr, first) in [
        (Family::V4, "192.0.2.0/30", "192.0.2.1"),
        (Family::V6, "2001:db8::/126", "2001:db8::1"),
    ] {
        let mut tenant_pool = cidr_pool(&[cidr]);
        tenant_pool.service_selector.match_labels.insert(
            super::resources::SERVICE_NAMESPACE_LABEL.into(),
            "tenant-one".into(),
        );
        let mut by_name = cidr_pool(&[cidr]);
        by_name.service_selector.match_labels.insert(
            super::resources::SERVICE_NAME_LABEL.into(),
            "payments".into(),
        );
        for pool in [tenant_pool, by_name] {
            let mut impostor = svc(family);
            impostor.labels.insert(
                super::resources::SERVICE_NAMESPACE_LABEL.into(),
                "tenant-one".into(),
            );
            impostor.labels.insert(
                super::resources::SERVICE_NAME_LABEL.into(),
                "payments".into(),
            );
            let (rows, _) = run(
                &[("a", pool)],
                &[
                    ("tenant-two/web", impostor, vec![]),
                    ("tenant-one/payments", svc(family), vec![]),
                ],
            );
            let by: std::collections::BTreeMap<&str, &Row> =
                rows.iter().map(|r| (r.0.as_str(), r)).collect();
            assert!(
                by["tenant-two/web"].1.is_empty() && !by["tenant-two/web"].2,
                "{family:?}: the impostor was served: {rows:?}"
            );
            assert_eq!(by["tenant-one/payments"].1, [first], "{family:?}");
        }
    }
    let why = super::resources::reserved_labels_ignored(
        "tenant-two/web",
        &[(
            super::resources::SERVICE_NAMESPACE_LABEL.to_owned(),
            "tenant-one".to_owned(),
        )]
        .into(),
    )
    .unwrap();
    assert!(
        why.contains("io.kubernetes.service.namespace=tenant-one (it is tenant-two)")
            && why.contains("reserved"),
        "{why}"
    );
    assert_eq!(
        super::resources::reserved_labels_ignored(
            "tenant-one/web",
            &[(
                super::resources::SERVICE_NAMESPACE_LABEL.to_owned(),
                "tenant-one".to_owned(),
            )]
            .into(),
        ),
        None,
        "the label's own value is no problem"
    );
}

/// Thousands of new Services in one pass each take the lowest free address, around the ones
/// already held, and none twice (the search for a free address resumes where the last one
/// ended, which must skip no hole).
#[test]
fn many_new_services_fill_the_holes_first_then_take_the_lowest_free_in_order() {
    let pools = [("big", cidr_pool(&["10.96.0.0/18"]))];
    let held = ["10.96.0.1", "10.96.0.3", "10.96.0.4", "10.96.0.9"];
    let mut services: Vec<(String, ServiceSpec, Vec<&str>)> = held
        .iter()
        .enumerate()
        .map(|(i, ip)| (format!("a-held-{i}"), svc(Family::V4), vec![*ip]))
        .collect();
    services.extend((0..5000).map(|i| (format!("b-new-{i:05}"), svc(Family::V4), vec![])));
    let services: Vec<(&str, ServiceSpec, Vec<&str>)> = services
        .iter()
        .map(|(n, s, h)| (n.as_str(), s.clone(), h.clone()))
        .collect();
    let (rows, _) = run(&pools, &services);
    let new: Vec<IpAddr> = rows
        .iter()
        .filter(|r| r.0.starts_with("b-new-"))
        .map(|r| ip(&r.1[0]))
        .collect();
    assert_eq!(new.len(), 5000);
    // The network address is not handed out; then the holes between the held ones.
    let first: Vec<IpAddr> = [
        "10.96.0.2",
        "10.96.0.5",
        "10.96.0.6",
        "10.96.0.7",
        "10.96.0.8",
    ]
    .map(ip)
    .to_vec();
    assert_eq!(new[..5], first[..]);
    assert_eq!(new[5], ip("10.96.0.10"));
    let mut distinct = new.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 5000, "an address given twice");
    assert!(
        new.windows(2).all(|w| w[0] < w[1]),
        "taken lowest first, in order"
    );
}

/// An external IP a pool gives a Service is in use: LB-IPAM gives it to no other Service
/// unasked, refuses it to one that asks (another tenant taking it through its own LoadBalancer
/// Service), and never takes an IP it assigned from its Service because another lists it.
#[test]
fn an_external_ip_a_pool_gives_is_neither_handed_out_nor_given_on_request() {
    for (family, cidr, first, second, _) in FAMILIES {
        let mut listing = svc(family);
        listing.service_type = ServiceType::ClusterIP;
        listing.external_ips = vec![ip(first)];
        let mut asking = svc(family);
        asking.requested_ips = vec![ip(first)];
        // Listing the IP LB-IPAM gave another: that Service keeps it.
        let mut late_listing = svc(family);
        late_listing.service_type = ServiceType::ClusterIP;
        late_listing.external_ips = vec![ip(second)];
        let pool = LbIpPoolSpec {
            allow_first_last_ips: true,
            ..cidr_pool(&[cidr])
        };
        let (rows, out) = run(
            &[("shared", pool)],
            &[
                ("tenant-a/listing", listing, vec![]),
                ("tenant-b/asking", asking, vec![]),
                ("tenant-b/auto", svc(family), vec![]),
                ("tenant-c/holder", svc(family), vec![second]),
                ("tenant-d/late", late_listing, vec![]),
            ],
        );
        let of = |name: &str| rows.iter().find(|r| r.0 == name).unwrap().clone();
        let asking = of("tenant-b/asking");
        assert!(
            !asking.2 && asking.3.contains("taken by service tenant-a/listing"),
            "{family:?}: {asking:?}"
        );
        let auto = of("tenant-b/auto");
        assert!(
            auto.2 && auto.1 != [first] && auto.1 != [second],
            "{family:?}: {auto:?}"
        );
        assert_eq!(of("tenant-c/holder").1, [second], "{family:?}");
        // The pool counts the listed address as used.
        let counts = &out.pools["shared"].counts[0];
        assert_eq!(counts.used, 3, "{family:?}: {counts:?}");
    }
}
