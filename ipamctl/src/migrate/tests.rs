//! What `ipamctl migrate` adds to the converters: the output read back by `ipamctl apply`'s
//! parser, the exit codes, and `--check`'s verdicts. The conversions themselves are tested in
//! `ipam_migrate`.

use std::net::IpAddr;

use ipam_core::lb::resources::{Service, ServiceSpec, ServiceStatus};
use ipam_migrate::examples::{CILIUM, CILIUM_BGP, METALLB};

use super::*;

fn migrate(yaml: &str) -> Migration {
    ipam_migrate::convert(&ipam_migrate::read("in.yaml", yaml).unwrap()).unwrap()
}

#[test]
fn the_exit_code_says_whether_anything_was_dropped() {
    let m = migrate("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: b}\n");
    assert_eq!(report(&m), EXIT_DROPPED);
    assert_eq!(report(&migrate(CILIUM)), 0);
}

/// What `ipamctl migrate` prints, `ipamctl apply` reads: every object, same spec, no unknown
/// field.
#[test]
fn the_output_is_what_ipamctl_apply_reads() {
    use crate::objects::parse::{Object, parse};
    let mut all = CILIUM.to_owned();
    for more in [METALLB, CILIUM_BGP] {
        all.push_str("---\n");
        all.push_str(more);
    }
    let m = migrate(&all);
    let text = render(&m).unwrap();
    assert!(text.contains("apiVersion: ipam-ebpf.io/v1alpha1"), "{text}");
    assert!(
        text.contains("# from in.yaml: document 1 (CiliumLoadBalancerIPPool blue-pool)"),
        "{text}"
    );
    let parsed = parse(
        "migrated.yaml",
        &text,
        &ipam_core::lb::annotations::AnnotationSources::default(),
    )
    .unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(parsed.notes.is_empty(), "{:?}", parsed.notes);
    assert_eq!(parsed.objects.len(), m.converted.len());
    for (object, converted) in parsed.objects.iter().zip(&m.converted) {
        assert_eq!(object.name(), converted.name);
        match (object, &converted.target) {
            (Object::LbPool(_, p), Target::LbPool(spec)) => {
                assert_eq!((&p.spec, &p.labels), (spec, &converted.labels));
            }
            (Object::L2Policy(_, p), Target::L2Policy(spec)) => assert_eq!(&p.spec, spec),
            (Object::PodPool(_, p), Target::PodPool(spec)) => assert_eq!(&p.spec, spec),
            (Object::BgpPeer(_, p), Target::BgpPeer(spec)) => assert_eq!(&p.spec, &**spec),
            (Object::BgpAdvertisement(_, a), Target::BgpAdvertisement(spec)) => {
                assert_eq!(&a.spec, spec);
            }
            (object, target) => panic!("{object:?} read back from {target:?}"),
        }
    }
}

fn holding(ips: &[&str]) -> Service {
    let spec: ServiceSpec = serde_json::from_value(serde_json::json!({
        "type": "LoadBalancer",
        "ipFamilyPolicy": "PreferDualStack",
    }))
    .unwrap();
    Service {
        spec,
        status: ServiceStatus {
            ingress: ips.iter().map(|ip| ip.parse::<IpAddr>().unwrap()).collect(),
            conditions: Vec::new(),
        },
    }
}

/// `--check`: Services holding any address of the converted pools keep it, the first of a
/// CIDR too (written out for Cilium's pools), in both families; one outside every pool is
/// named, and one of another controller's class is judged as served here with a note.
#[test]
fn check_says_which_services_keep_their_ips() {
    let m = migrate(CILIUM);
    let mut classed = holding(&["20.0.20.150"]);
    classed.spec.load_balancer_class = Some("io.cilium/l2-announcer".into());
    let verdicts = check::verdicts(
        &m,
        [
            ("default/first".into(), holding(&["10.0.10.0", "2004::1"])),
            ("default/single".into(), holding(&["1.2.3.4"])),
            ("default/gone".into(), holding(&["10.99.0.1"])),
            ("default/classed".into(), classed),
        ]
        .into(),
        &Default::default(),
    );
    let by_name = |n: &str| verdicts.iter().find(|v| v.service == n).unwrap();
    assert!(
        by_name("default/first").keeps,
        "{:?}",
        by_name("default/first")
    );
    assert!(by_name("default/single").keeps);
    let gone = by_name("default/gone");
    assert!(!gone.keeps);
    assert!(
        gone.note
            .as_deref()
            .unwrap_or_default()
            .contains("10.99.0.1"),
        "{gone:?}"
    );
    let classed = by_name("default/classed");
    assert!(classed.keeps, "{classed:?}");
    assert!(
        classed
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("io.cilium/l2-announcer")
    );
}
