//! Pods wired by `ipam-cni` as the main plugin, routed by the TC pod datapath of a real
//! `ipamd`: connectivity both ways for IPv4 and IPv6, anti-spoofing, DEL and GC cleaning the
//! endpoint map, and pods staying connected while the daemon is killed and restarted.

use std::{net::IpAddr, time::Duration};

use ipam_api::{
    client::call,
    types::{AttachmentId, Request, Response},
};
use ipam_datapath::PodMaps;
use ipam_tests::pod_net::{CLIENT_V4, CLIENT_V6, Pod, PodNode, reaches, reaches_from};
use serde_json::json;

fn map_ips(node: &PodNode) -> Vec<IpAddr> {
    PodMaps::from_pins(node.ipam.bpffs_root())
        .expect("pinned pod maps")
        .list()
        .expect("list endpoint map")
        .into_iter()
        .map(|(ip, _)| ip)
        .collect()
}

fn ips(pod: &Pod) -> [IpAddr; 2] {
    [pod.v4.parse().unwrap(), pod.v6.parse().unwrap()]
}

fn assert_matrix(node: &PodNode, pods: &[&Pod]) {
    let mut failures = Vec::new();
    for from in pods {
        for to in pods {
            if from.container == to.container {
                continue;
            }
            for addr in [&to.v4, &to.v6] {
                if !reaches(&from.ns, addr) {
                    failures.push(format!("{} -> {addr}", from.v4));
                }
            }
        }
        // Pod <-> host: the router addresses (the host device) and back.
        for gw in ["10.250.0.1", "fd00:250::1"] {
            if !reaches(&from.ns, gw) {
                failures.push(format!("{} -> host {gw}", from.v4));
            }
        }
        for addr in [&from.v4, &from.v6] {
            if !reaches(&node.ipam.ns, addr) {
                failures.push(format!("host -> {addr}"));
            }
            // From another host, through the uplink program.
            if !reaches(&node.client, addr) {
                failures.push(format!("client -> {addr}"));
            }
        }
        for client in [CLIENT_V4, CLIENT_V6] {
            if !reaches(&from.ns, client) {
                failures.push(format!("{} -> client {client}", from.v4));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "unreachable: {failures:?}\nnode addresses:\n{}\ndaemon log:\n{}",
        node.ipam.ns.describe(),
        node.daemon
            .as_ref()
            .map(ipam_tests::daemon::Daemon::log_text)
            .unwrap_or_default()
    );
}

#[test]
fn connectivity_matrix_spoofing_del_and_gc() {
    let node = PodNode::start("pnode");
    let a = node.add_pod("poda");
    let b = node.add_pod("podb");
    let c = node.add_pod("podc");

    // A spec-conformant result: both interfaces, addresses on the pod's, routes via the router.
    let r = &a.result;
    assert_eq!(r["cniVersion"], "1.1.0");
    assert_eq!(r["interfaces"][1]["name"], "eth0");
    assert_eq!(
        r["interfaces"][1]["sandbox"],
        a.ns.path().display().to_string()
    );
    assert_eq!(r["ips"][0]["interface"], 1);
    assert_eq!(r["ips"][0]["gateway"], "10.250.0.1");
    assert_eq!(r["ips"][1]["gateway"], "fd00:250::1");
    assert!(
        r["ips"][0]["address"].as_str().unwrap().ends_with("/32"),
        "{r}"
    );
    let routes = a.ns.routes(false);
    let eth0 = a.ns.ifindex("eth0");
    assert!(
        routes.iter().any(|r| r.prefix_len == 0
            && r.gateway == Some("10.250.0.1".parse().unwrap())
            && r.output == Some(eth0)),
        "the pod's default route is via 10.250.0.1 on eth0: {routes:?}"
    );
    // ADD again (the runtime retries) gives the same answer and keeps the pod as it is.
    let (ok, again) = node.cni("ADD", &a.container, Some(&a.ns));
    assert!(ok, "{again}");
    assert_eq!(again["ips"], r["ips"]);
    assert!(node.cni("CHECK", &a.container, Some(&a.ns)).0);

    let delivered_before = node.stat("delivered");
    assert_matrix(&node, &[&a, &b, &c]);
    assert!(
        node.stat("delivered") > delivered_before,
        "pod-to-pod traffic went through bpf_redirect_peer"
    );

    // A pod that sends from an address that is not its own is dropped and counted.
    let spoofed_before = node.stat("spoof_dropped");
    a.ns.add_address("eth0", "10.250.0.250/32");
    a.ns.add_address("eth0", "fd00:250::fa/128");
    assert!(!reaches_from(&a.ns, "10.250.0.250", &b.v4));
    assert!(!reaches_from(&a.ns, "fd00:250::fa", &b.v6));
    assert!(!reaches_from(&a.ns, "10.250.0.250", "10.250.0.1"));
    assert!(node.stat("spoof_dropped") >= spoofed_before + 4);
    // The datapath logs them too (aya-log at warn level, see IpamNode::dual_stack), naming the
    // spoofed source, in both families.
    let daemon = node.daemon.as_ref().expect("daemon running");
    daemon.wait_log(
        "dropped packet from spoofed source 10.250.0.250",
        Duration::from_secs(10),
    );
    daemon.wait_log(
        "dropped packet from spoofed source fd00:250::fa",
        Duration::from_secs(10),
    );
    // Another pod's address is as foreign as an unallocated one.
    a.ns.add_address("eth0", &format!("{}/32", c.v4));
    assert!(!reaches_from(&a.ns, &c.v4, &b.v4));
    assert!(reaches(&a.ns, &b.v4), "the pod's own address still works");
    for extra in [
        "10.250.0.250/32",
        "fd00:250::fa/128",
        &format!("{}/32", c.v4),
    ] {
        a.ns.delete_address("eth0", extra);
    }

    // DEL frees the addresses and removes the map entries and the veth; DEL again succeeds.
    let in_map = map_ips(&node);
    assert!(ips(&c).iter().all(|ip| in_map.contains(ip)), "{in_map:?}");
    assert!(node.cni("DEL", &c.container, Some(&c.ns)).0);
    let in_map = map_ips(&node);
    assert!(ips(&c).iter().all(|ip| !in_map.contains(ip)), "{in_map:?}");
    assert!(!node.cni("CHECK", &c.container, Some(&c.ns)).0);
    let host_veth = ipam_cni::pod_network::host_veth_name(&AttachmentId {
        network: "podnet".into(),
        container_id: c.container.clone(),
        ifname: "eth0".into(),
    });
    assert!(
        node.ipam.ns.links().iter().all(|l| l.name != host_veth),
        "the host side of the veth is gone"
    );
    assert!(node.cni("DEL", &c.container, Some(&c.ns)).0);
    assert!(
        node.cni("DEL", "never-added", None).0,
        "DEL of the unknown succeeds"
    );

    // A pod that vanished without DEL (its namespace is gone) is collected by GC; live pods are
    // untouched and stay connected.
    let d = node.add_pod("podd");
    let d_ips = ips(&d);
    drop(d.ns);
    let mut gc = node.conf();
    gc["cni.dev/valid-attachments"] = json!([
        { "containerID": a.container, "ifname": "eth0" },
        { "containerID": b.container, "ifname": "eth0" },
    ]);
    let (ok, out) = ipam_tests::cni::run_cni(
        &ipam_tests::workspace_binary("ipam-cni"),
        Some(&node.ipam.ns),
        "GC",
        "",
        "",
        None,
        &gc,
    );
    assert!(ok, "{out}");
    let in_map = map_ips(&node);
    assert!(d_ips.iter().all(|ip| !in_map.contains(ip)), "{in_map:?}");
    assert!(
        ips(&a)
            .iter()
            .chain(ips(&b).iter())
            .all(|ip| in_map.contains(ip))
    );
    match call(
        &node.ipam.socket(),
        &Request::Endpoints,
        Duration::from_secs(5),
    ) {
        Ok(Response::Endpoints { endpoints, .. }) => assert_eq!(endpoints.len(), 2),
        other => panic!("{other:?}"),
    }
    assert_matrix(&node, &[&a, &b]);
}

#[test]
fn pods_stay_connected_through_daemon_sigkill_and_restart() {
    let mut node = PodNode::start("rnode");
    let a = node.add_pod("rpoda");
    let b = node.add_pod("rpodb");
    assert!(reaches(&a.ns, &b.v4));

    // 400 echo requests over ~4 s, while the daemon is killed and started again.
    let pinger =
        a.ns.command("ping")
            .args(["-c", "400", "-i", "0.01", "-W", "1", "-q", &b.v4])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("ping");
    std::thread::sleep(Duration::from_millis(500));
    node.daemon.take().unwrap().kill();
    std::thread::sleep(Duration::from_millis(500));
    node.daemon = Some(node.ipam.start_daemon());
    let out = pinger.wait_with_output().expect("ping output");
    let summary = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        summary.contains("400 received"),
        "every echo request was answered across the restart: {summary}"
    );

    // Same addresses, entries still in the map, and the restarted daemon still routes.
    for pod in [&a, &b] {
        let (ok, _) = node.cni("CHECK", &pod.container, Some(&pod.ns));
        assert!(ok, "{} keeps its addresses", pod.container);
    }
    let in_map = map_ips(&node);
    assert!(
        ips(&a)
            .iter()
            .chain(ips(&b).iter())
            .all(|ip| in_map.contains(ip))
    );
    let delivered = node.stat("delivered");
    assert!(reaches(&a.ns, &b.v6) && reaches(&b.ns, &a.v4));
    assert!(node.stat("delivered") > delivered);
    let new_pod = node.add_pod("rpodc");
    assert!(reaches(&new_pod.ns, &a.v6));

    // A pod deleted while the daemon is down (no CNI DEL): the restarted daemon finds its veth
    // gone and removes its map entries; the others stay.
    node.daemon.take().unwrap().kill();
    let gone = ips(&new_pod);
    drop(new_pod);
    node.daemon = Some(node.ipam.start_daemon());
    let in_map = map_ips(&node);
    assert!(gone.iter().all(|ip| !in_map.contains(ip)), "{in_map:?}");
    assert!(
        ips(&a)
            .iter()
            .chain(ips(&b).iter())
            .all(|ip| in_map.contains(ip))
    );
    assert!(reaches(&a.ns, &b.v6));
}
