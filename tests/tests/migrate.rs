//! `ipamctl migrate` end to end over real etcd: Services hold the IPs another controller (Cilium
//! or MetalLB) gave them; the operator, installed before any pool exists, leaves them alone; the
//! converted resources pass `--check`, are applied with `ipamctl apply`, and every Service keeps
//! its IPs under the operator. A pool that misses an address in use fails the check, naming the
//! Service. New Services ask with Cilium's and MetalLB's annotations, as on Kubernetes. (On etcd
//! no old controller runs: the test writes the Services' status as it would
//! have; on Kubernetes the status is the Service's `status.loadBalancer.ingress`.)

use std::{collections::BTreeMap, net::IpAddr, time::Duration};

use ipam_core::lb::resources::{LbIpPool, Service};
use ipam_tests::{
    cluster::{Cluster, wait_until},
    failover::lb_service,
};

const CILIUM: &str = r#"
apiVersion: cilium.io/v2alpha1
kind: CiliumLoadBalancerIPPool
metadata: {name: blue}
spec:
  blocks:
  - cidr: 10.77.0.32/28
  - start: 10.77.0.50
    stop: 10.77.0.60
  - cidr: fd77::200/124
---
apiVersion: cilium.io/v2alpha1
kind: CiliumL2AnnouncementPolicy
metadata: {name: all}
spec:
  interfaces: ["^eth[0-9]+"]
  loadBalancerIPs: true
"#;

const METALLB: &str = r#"
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: shop-pool, namespace: metallb-system}
spec:
  addresses: [10.77.0.64/28]
  serviceAllocation: {namespaceSelectors: [{matchLabels: {team: shop}}], priority: 10}
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: l2, namespace: metallb-system}
spec: {ipAddressPools: [shop-pool]}
"#;

fn ingress(c: &Cluster) -> BTreeMap<String, Vec<IpAddr>> {
    c.list::<Service>()
        .into_iter()
        .map(|s| (s.name, s.value.status.ingress))
        .collect()
}

fn text(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn migrated_pools_keep_every_service_ip() {
    let c = Cluster::start("mig", 1);
    // As the old controllers left them: the first address of a Cilium CIDR (Cilium hands it
    // out), a range address with an IPv6 one, and the address of a MetalLB pool selecting namespace shop by label.
    let mut held = BTreeMap::new();
    for (name, ips) in [
        ("default/web", vec!["10.77.0.32"]),
        ("default/api", vec!["10.77.0.55", "fd77::201"]),
        ("shop/cart", vec!["10.77.0.64"]),
    ] {
        let mut s = lb_service(80);
        s.spec.ip_family_policy = ipam_core::lb::resources::IpFamilyPolicy::PreferDualStack;
        s.status.ingress = ips.iter().map(|ip| ip.parse().unwrap()).collect();
        held.insert(name.to_owned(), s.status.ingress.clone());
        c.put(name, &s);
    }
    // The operator runs with no pool yet: it waits, and takes no IP away.
    wait_until(
        Duration::from_secs(30),
        "the operator waiting for a pool",
        || {
            c.operator_log(0)
                .contains("LB-IPAM waits for a LoadBalancerIPPool")
        },
        || c.operator_log(0),
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(ingress(&c), held, "the dormant operator changed a Service");

    let dir = ipam_tests::TempDir::new("migrate-");
    // The shop pool selects its namespace by label: on etcd the labels are a Namespace object.
    let labels = dir.0.join("namespaces.yaml");
    std::fs::write(
        &labels,
        "kind: Namespace\nmetadata: { name: shop, labels: { team: shop } }\n",
    )
    .unwrap();
    let out = c.ipamctl_beside_store(&["apply", "-f", labels.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let both = dir.0.join("old.yaml");
    std::fs::write(&both, format!("{CILIUM}---\n{METALLB}")).unwrap();
    let both = both.to_str().unwrap();

    // A pool that lost its range: the check fails and names the Service and its address.
    let short = dir.0.join("short.yaml");
    std::fs::write(
        &short,
        CILIUM.replace("  - start: 10.77.0.50\n    stop: 10.77.0.60\n", ""),
    )
    .unwrap();
    let out = c.ipamctl_beside_store(&["migrate", "--check", "-f", short.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let table = text(&out);
    assert!(
        table
            .lines()
            .any(|l| l.contains("default/api") && l.contains(" no ") && l.contains("10.77.0.55")),
        "{table}"
    );

    let out = c.ipamctl_beside_store(&["migrate", "--check", "-f", both, "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let verdicts: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(verdicts.len(), 3, "{}", text(&out));
    assert!(
        verdicts.iter().all(|v| v["keeps"] == true),
        "{}",
        text(&out)
    );

    let out = c.ipamctl_beside_store(&["migrate", "-f", both]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "nothing dropped: {}",
        text(&out)
    );
    let converted = dir.0.join("new.yaml");
    std::fs::write(&converted, &out.stdout).unwrap();
    let out = c.ipamctl_beside_store(&["apply", "-f", converted.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));

    // The operator wakes with the pools and serves every Service: the same IPs.
    let assigned = || {
        c.list::<Service>().iter().all(|s| {
            s.value
                .status
                .conditions
                .iter()
                .any(|c| c.kind == "IPAssigned" && c.status)
        })
    };
    wait_until(
        Duration::from_secs(30),
        "every Service served under the migrated pools",
        assigned,
        || format!("{:?}\n{}", c.list::<Service>(), c.operator_log(0)),
    );
    // Past the pools' settling time (3 s), when an IP in no pool would be given up.
    std::thread::sleep(Duration::from_secs(4));
    let now = ingress(&c);
    for (name, ips) in &held {
        for ip in ips {
            assert!(now[name].contains(ip), "{name} lost {ip}: {now:?}");
        }
    }
    let pools: Vec<String> = c.list::<LbIpPool>().into_iter().map(|p| p.name).collect();
    assert_eq!(pools, vec!["blue".to_owned(), "shop-pool".to_owned()]);

    // New Services ask with the annotations they brought along, as on Kubernetes: MetalLB's IP
    // and pool; two IP annotations that disagree give the first, and the condition names both.
    let services = dir.0.join("services.yaml");
    std::fs::write(
        &services,
        "kind: Service\nmetadata:\n  name: till\n  namespace: shop\n  annotations:\n    \
         metallb.io/loadBalancerIPs: 10.77.0.70\n    metallb.io/address-pool: shop-pool\n\
         spec: { type: LoadBalancer, ports: [ { port: 80 } ] }\n---\n\
         kind: Service\nmetadata:\n  name: moved\n  annotations:\n    \
         ipam-ebpf.io/ips: 10.77.0.40\n    lbipam.cilium.io/ips: 10.77.0.41\n\
         spec: { type: LoadBalancer, ports: [ { port: 81 } ] }\n",
    )
    .unwrap();
    let out = c.ipamctl_beside_store(&["apply", "-f", services.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let status = |name: &str| c.service_status(name);
    wait_until(
        Duration::from_secs(30),
        "the annotated Services served",
        || !status("shop/till").ingress.is_empty() && !status("default/moved").ingress.is_empty(),
        || c.operator_log(0),
    );
    assert_eq!(
        status("shop/till").ingress,
        ["10.77.0.70".parse::<IpAddr>().unwrap()]
    );
    let moved = status("default/moved");
    assert_eq!(moved.ingress, ["10.77.0.40".parse::<IpAddr>().unwrap()]);
    let agree = moved
        .conditions
        .iter()
        .find(|c| c.kind == "AnnotationsAgree")
        .unwrap_or_else(|| panic!("{moved:?}"));
    assert!(
        !agree.status && agree.message.contains("lbipam.cilium.io/ips (10.77.0.41)"),
        "{agree:?}"
    );
}
