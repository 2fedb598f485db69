//! `ipam-cni` as a container runtime and main plugins use it, against a real `ipamd`.
//!
//! The plugin is run as a process with the CNI environment and configuration on stdin, directly
//! and through Debian's real `bridge` and `ptp` plugins (containernetworking-plugins), which
//! delegate IPAM to it and wire pods in network namespaces the tests create.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use ipam_tests::{
    cni::{CniTarget, DEBIAN_CNI, run_cni, run_cni_for},
    daemon::Daemon,
    ipam_node::IpamNode,
    netns::Netns,
    workspace_binary,
};
use serde_json::{Value, json};

/// An address of the node's first block that only a pod asking for it gets.
const RESERVED: &str = "10.244.0.200";
/// An address of the node's first block kept for the pods of namespace `tenant-a`.
const KEPT_FOR_TENANT_A: &str = "10.244.0.201";

struct Node {
    ipam: IpamNode,
    daemon: Option<Daemon>,
}

impl Node {
    fn start() -> Self {
        let ipam = IpamNode::with_reserved(
            "cninode",
            "10.244.0.0/16",
            24,
            &[RESERVED],
            &[(KEPT_FOR_TENANT_A, "tenant-a")],
        );
        let daemon = Some(ipam.start_daemon());
        Self { ipam, daemon }
    }

    fn socket(&self) -> PathBuf {
        self.ipam.socket()
    }

    fn ipam_conf(&self, main: &str) -> Value {
        json!({
            "cniVersion": "1.0.0",
            "name": "testnet",
            "type": main,
            "ipam": { "type": "ipam-cni", "socket": self.socket(), "timeoutMs": 5000 }
        })
    }

    /// Runs `ipam-cni` directly, as a main plugin would: (success, stdout JSON).
    fn plugin(&self, command: &str, container: &str, ifname: &str, conf: &Value) -> (bool, Value) {
        run_cni(
            &workspace_binary("ipam-cni"),
            None,
            command,
            container,
            ifname,
            None,
            conf,
        )
    }
}

fn address(result: &Value) -> String {
    result["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no address in {result}"))
        .to_owned()
}

#[test]
fn add_del_check_gc_status_and_daemon_down() {
    let mut node = Node::start();
    let conf = node.ipam_conf("bridge");

    let (ok, first) = node.plugin("ADD", "c-main", "eth0", &conf);
    assert!(ok, "{first}");
    assert_eq!(first["cniVersion"], "1.0.0");
    let addr = address(&first);
    assert!(
        addr.starts_with("10.244.0.") && addr.ends_with("/24"),
        "{first}"
    );
    assert_eq!(
        first["ips"][0]["gateway"], "10.244.0.1",
        "the node's router address is the gateway"
    );
    assert_eq!(
        first["routes"][0],
        json!({"dst": "0.0.0.0/0", "gw": "10.244.0.1"})
    );
    assert_eq!(
        address(&node.plugin("ADD", "c-main", "eth0", &conf).1),
        addr,
        "ADD is idempotent"
    );

    let mut check = conf.clone();
    check["prevResult"] = first.clone();
    assert!(node.plugin("CHECK", "c-main", "eth0", &check).0);
    let (ok, e) = node.plugin("CHECK", "c-unknown", "eth0", &check);
    assert!(!ok && e["code"] == 101, "{e}");

    // 100 ADDs at once: 100 distinct addresses.
    let threads: Vec<_> = (0..100)
        .map(|i| {
            let conf = conf.clone();
            let bin = workspace_binary("ipam-cni");
            std::thread::spawn(move || {
                run_cni(&bin, None, "ADD", &format!("c{i}"), "eth0", None, &conf)
            })
        })
        .collect();
    let results: Vec<(bool, Value)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(results.iter().all(|(ok, r)| *ok || panic!("{r}")));
    let distinct: HashSet<String> = results.iter().map(|(_, r)| address(r)).collect();
    assert_eq!(distinct.len(), 100);
    assert!(!distinct.contains(&addr));

    // GC keeps the valid attachments and releases the leaked ones.
    let mut gc = conf.clone();
    gc["cniVersion"] = json!("1.1.0");
    let mut valid: Vec<Value> = (0..50)
        .map(|i| json!({"containerID": format!("c{i}"), "ifname": "eth0"}))
        .collect();
    valid.push(json!({"containerID": "c-main", "ifname": "eth0"}));
    gc["cni.dev/valid-attachments"] = json!(valid);
    assert!(node.plugin("GC", "", "", &gc).0);
    assert!(
        node.plugin("CHECK", "c10", "eth0", &conf).0,
        "a live attachment survives GC"
    );
    assert!(node.plugin("CHECK", "c-main", "eth0", &conf).0);
    assert!(
        !node.plugin("CHECK", "c60", "eth0", &conf).0,
        "a leaked attachment is released by GC"
    );

    assert!(node.plugin("DEL", "c-main", "eth0", &conf).0);
    assert!(
        node.plugin("DEL", "c-main", "eth0", &conf).0,
        "DEL of something unknown succeeds"
    );
    assert!(!node.plugin("CHECK", "c-main", "eth0", &conf).0);

    legacy_allocations_are_adopted_by_their_network(&node, &conf);

    // The daemon stops: ADD fails at once with "try again later", STATUS says not available.
    node.daemon.take().unwrap().kill();
    let start = Instant::now();
    let (ok, e) = node.plugin("ADD", "c-late", "eth0", &conf);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "the plugin must not hang"
    );
    assert!(!ok && e["code"] == 11, "{e}");
    assert!(e["msg"].as_str().unwrap().contains("ipamd.sock"), "{e}");
    let (ok, e) = node.plugin("STATUS", "", "", &gc);
    assert!(!ok && e["code"] == 50, "{e}");
}

/// An allocation made through a plugin older than per-network attachments (its requests name no
/// network) belongs to the first network that names its attachment, and no GC of another network
/// frees it.
fn legacy_allocations_are_adopted_by_their_network(node: &Node, conf: &Value) {
    use ipam_api::types::{Attachment, AttachmentId, Request, Response};
    let call = |request: Request| {
        ipam_api::client::call(&node.socket(), &request, Duration::from_secs(5)).unwrap()
    };
    let old = AttachmentId {
        network: String::new(),
        container_id: "c-old".into(),
        ifname: "eth0".into(),
    };
    let Response::Allocated { ips } = call(Request::Allocate(Attachment {
        ips: Vec::new(),
        id: old.clone(),
        pod: None,
        pool: None,
    })) else {
        panic!("an old plugin's ADD is served");
    };
    // The GC of another network does not see it.
    let Response::Collected { released } = call(Request::Gc {
        network: "othernet".into(),
        valid: Vec::new(),
    }) else {
        panic!("GC of othernet");
    };
    assert!(released.is_empty(), "othernet's GC freed {released:?}");
    // A CHECK through today's plugin (network testnet) finds it: adopted by testnet.
    let (ok, e) = node.plugin("CHECK", "c-old", "eth0", conf);
    assert!(ok, "the adopted allocation is found by its network: {e}");
    let Response::Checked { ips: held } = call(Request::Check(Attachment {
        ips: Vec::new(),
        id: old.in_network("testnet"),
        pod: None,
        pool: None,
    })) else {
        panic!("CHECK in testnet");
    };
    assert_eq!(held, ips, "adopted with its address");
    // From now on it is testnet's: othernet's GC still leaves it, testnet's GC frees it.
    call(Request::Gc {
        network: "othernet".into(),
        valid: Vec::new(),
    });
    assert!(node.plugin("CHECK", "c-old", "eth0", conf).0);
    let mut gc = conf.clone();
    gc["cniVersion"] = json!("1.1.0");
    gc["cni.dev/valid-attachments"] = json!([]);
    assert!(node.plugin("GC", "", "", &gc).0);
    assert!(!node.plugin("CHECK", "c-old", "eth0", conf).0);
}

/// A second network on a pod (as Multus attaches `net1`), also served by this ipamd: the GC of
/// the first network, whose valid list cannot name `net1`, must leave its address alone. The
/// second network's addresses are asked for as its main plugin would delegate them (a second
/// main plugin in the pod would fight the first over the default route).
fn gc_of_one_network_keeps_another_networks_addresses(node: &Node, pod: &Netns, first: &Value) {
    let mut second = node.ipam_conf("macvlan");
    second["name"] = json!("storagenet");
    let (ok, result) = node.plugin("ADD", "br0", "net1", &second);
    assert!(ok, "ADD of net1: {result}");
    let net1 = address(&result);

    // The runtime collects the first network: its valid list holds its own attachments only.
    let mut gc = first.clone();
    gc["cniVersion"] = json!("1.1.0");
    gc["cni.dev/valid-attachments"] = json!([
        {"containerID": "br0", "ifname": "eth0"},
        {"containerID": "br1", "ifname": "eth0"},
        {"containerID": "ptp0", "ifname": "eth0"},
    ]);
    let (ok, e) = node.plugin("GC", "", "", &gc);
    assert!(ok, "GC of testnet: {e}");
    assert!(
        node.plugin("CHECK", "br0", "net1", &second).0,
        "testnet's GC freed storagenet's address {net1}"
    );
    // The address is still the pod's: another pod's ADD does not get it.
    let (ok, other) = node.plugin("ADD", "c-next", "eth0", &second);
    assert!(ok, "{other}");
    assert_ne!(address(&other), net1, "net1's address was handed out again");
    assert!(node.plugin("DEL", "c-next", "eth0", &second).0);
    // And the pod's first network still carries its traffic.
    ping(pod, "10.244.0.1");

    // The GC of storagenet itself, with net1 gone from its list, frees it.
    let mut gc = second.clone();
    gc["cniVersion"] = json!("1.1.0");
    gc["cni.dev/valid-attachments"] = json!([]);
    assert!(node.plugin("GC", "", "", &gc).0);
    assert!(
        !node.plugin("CHECK", "br0", "net1", &second).0,
        "storagenet's GC releases its leaked net1"
    );
    assert!(
        node.plugin("CHECK", "br0", "eth0", first).0,
        "storagenet's GC left testnet alone"
    );
}

fn pod_ip(ns: &Netns, dev: &str) -> String {
    ns.addresses(dev)
        .iter()
        .find(|(ip, _)| ip.is_ipv4())
        .map(|(ip, len)| format!("{ip}/{len}"))
        .unwrap_or_else(|| panic!("no IPv4 address on {dev} in namespace {}", ns.name))
}

fn ping(from: &Netns, to: &str) {
    let to = to.split('/').next().unwrap().to_owned();
    // Links come up asynchronously after ADD: wait up to 5 s for two replies.
    from.run(move || ipam_tests::run("ping", &["-c", "2", "-i", "0.2", "-w", "5", &to]));
}

#[test]
fn debian_bridge_and_ptp_delegate_ipam_to_ipam_cni() {
    let mut node = Node::start();
    let bridge = Path::new(DEBIAN_CNI).join("bridge");
    let mut conf = node.ipam_conf("bridge");
    conf["bridge"] = json!("ipbr0");
    conf["isGateway"] = json!(true);

    let pods = [Netns::new("poda"), Netns::new("podb")];
    let mut addrs = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let (ok, result) = run_cni(
            &bridge,
            Some(&node.ipam.ns),
            "ADD",
            &format!("br{i}"),
            "eth0",
            Some(pod),
            &conf,
        );
        assert!(ok, "bridge ADD: {result}");
        let a = address(&result);
        assert_eq!(
            pod_ip(pod, "eth0"),
            a,
            "the pod has the address ipam-cni gave"
        );
        addrs.push(a);
    }
    ping(&pods[0], &addrs[1]);
    ping(&pods[1], &addrs[0]);
    ping(&pods[0], "10.244.0.1");

    // ptp: a point-to-point veth, the node's side holding the gateway address.
    let ptp_conf = node.ipam_conf("ptp");
    let pod_c = Netns::new("podc");
    let (ok, result) = run_cni(
        &Path::new(DEBIAN_CNI).join("ptp"),
        Some(&node.ipam.ns),
        "ADD",
        "ptp0",
        "eth0",
        Some(&pod_c),
        &ptp_conf,
    );
    assert!(ok, "ptp ADD: {result}");
    assert_eq!(pod_ip(&pod_c, "eth0"), address(&result));
    ping(&pod_c, "10.244.0.1");

    gc_of_one_network_keeps_another_networks_addresses(&node, &pods[0], &conf);

    fixed_addresses_are_given_refused_kept_and_freed(&mut node, &conf);

    // DEL through the main plugins releases the addresses.
    for (i, pod) in pods.iter().enumerate() {
        assert!(
            run_cni(
                &bridge,
                Some(&node.ipam.ns),
                "DEL",
                &format!("br{i}"),
                "eth0",
                Some(pod),
                &conf
            )
            .0
        );
        assert!(
            !node.plugin("CHECK", &format!("br{i}"), "eth0", &conf).0,
            "DEL released br{i}"
        );
    }
    assert!(
        run_cni(
            &Path::new(DEBIAN_CNI).join("ptp"),
            Some(&node.ipam.ns),
            "DEL",
            "ptp0",
            "eth0",
            Some(&pod_c),
            &ptp_conf
        )
        .0
    );
    assert!(!node.plugin("CHECK", "ptp0", "eth0", &conf).0);
}

/// Fixed addresses, asked for as a runtime asks (the CNI `ips` capability in `runtimeConfig`,
/// which Debian's bridge plugin hands on to its IPAM plugin): the pool's reserved address is
/// given to the pod that asks for it and to no other; another pod asking for it, or for an
/// address outside the node's block, is refused with the pod, the address and the reason, and
/// holds nothing afterwards; the address survives a daemon restart; DEL frees it for the next
/// pod that asks.
fn fixed_addresses_are_given_refused_kept_and_freed(node: &mut Node, conf: &Value) {
    let bridge = Path::new(DEBIAN_CNI).join("bridge");
    let asking = |ip: &str| {
        let mut conf = conf.clone();
        conf["runtimeConfig"] = json!({ "ips": [format!("{ip}/24")] });
        conf
    };
    // Unasked, nobody gets the reserved address.
    for i in 0..3 {
        let (ok, result) = node.plugin("ADD", &format!("any{i}"), "eth0", conf);
        assert!(
            ok && !address(&result).starts_with(&format!("{RESERVED}/")),
            "{result}"
        );
    }
    let pod = Netns::new("fixd");
    let fixed = asking(RESERVED);
    let (ok, result) = run_cni(
        &bridge,
        Some(&node.ipam.ns),
        "ADD",
        "fixed",
        "eth0",
        Some(&pod),
        &fixed,
    );
    assert!(ok, "bridge ADD asking for {RESERVED}: {result}");
    assert_eq!(address(&result), format!("{RESERVED}/24"));
    assert_eq!(pod_ip(&pod, "eth0"), format!("{RESERVED}/24"));
    ping(&pod, "10.244.0.1");

    let (ok, e) = node.plugin("ADD", "thief", "eth0", &fixed);
    let msg = e["msg"].as_str().unwrap_or_default();
    assert!(
        !ok && msg.contains("pod default/thief") && msg.contains(RESERVED) && msg.contains("holds"),
        "{e}"
    );
    assert!(
        !node.plugin("CHECK", "thief", "eth0", conf).0,
        "a refused ADD holds nothing"
    );
    // The address kept for tenant-a: another tenant's pod asking for it is refused, with the
    // pod, the address and why, and holds nothing; tenant-a's pod gets it.
    let ipam_cni = workspace_binary("ipam-cni");
    let kept = asking(KEPT_FOR_TENANT_A);
    let pod_of = |container, pod| CniTarget {
        container,
        ifname: "eth0",
        pod,
    };
    let (ok, e) = run_cni_for(
        &ipam_cni,
        None,
        "ADD",
        &pod_of("b-thief", ("tenant-b", "thief")),
        None,
        &kept,
    );
    let msg = e["msg"].as_str().unwrap_or_default();
    assert!(
        !ok && msg.contains("pod tenant-b/thief")
            && msg.contains(KEPT_FOR_TENANT_A)
            && msg.contains("tenant-a, not tenant-b"),
        "{e}"
    );
    assert!(
        !node.plugin("CHECK", "b-thief", "eth0", conf).0,
        "a refused ADD holds nothing"
    );
    let tenant_a = pod_of("a-db", ("tenant-a", "db-0"));
    let (ok, given) = run_cni_for(&ipam_cni, None, "ADD", &tenant_a, None, &kept);
    assert!(
        ok && address(&given) == format!("{KEPT_FOR_TENANT_A}/24"),
        "{given}"
    );
    assert!(run_cni_for(&ipam_cni, None, "DEL", &tenant_a, None, &kept).0);

    let (ok, e) = node.plugin("ADD", "far", "eth0", &asking("10.244.9.9"));
    let msg = e["msg"].as_str().unwrap_or_default();
    assert!(
        !ok && msg.contains("10.244.9.9") && msg.contains("cluster-pool"),
        "{e}"
    );
    assert!(!node.plugin("CHECK", "far", "eth0", conf).0);

    // A restart keeps it with its pod.
    node.daemon.take().expect("the daemon runs").kill();
    node.daemon = Some(node.ipam.start_daemon());
    let mut check = conf.clone();
    check["prevResult"] = result;
    assert!(
        node.plugin("CHECK", "fixed", "eth0", &check).0,
        "the fixed address survives a restart"
    );
    let (ok, e) = node.plugin("ADD", "thief", "eth0", &fixed);
    assert!(!ok, "still held after the restart: {e}");

    // DEL frees it: the next pod asking gets it.
    assert!(
        run_cni(
            &bridge,
            Some(&node.ipam.ns),
            "DEL",
            "fixed",
            "eth0",
            Some(&pod),
            &fixed
        )
        .0
    );
    let (ok, result) = node.plugin("ADD", "next", "eth0", &fixed);
    assert!(
        ok && address(&result) == format!("{RESERVED}/24"),
        "{result}"
    );
    for container in ["next", "any0", "any1", "any2"] {
        assert!(node.plugin("DEL", container, "eth0", conf).0);
    }
}
