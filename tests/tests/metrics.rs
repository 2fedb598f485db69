//! The metrics and health endpoints of a real `ipamd` (standalone role): N allocations and
//! releases over the local API move the counters by N, the node's addresses and the pool's
//! blocks are shown, the readiness checks name what they checked, and Prometheus' own
//! `promtool check metrics` (Debian's `prometheus` package) accepts the exposition.
//!
//! And the exhausted-pool incident of the seeds on a cluster over real etcd: what
//! docs/operations.md says the operator sees in `ipamctl` and in the metrics, and its fix.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    time::{Duration, Instant},
};

use ipam_api::{
    client::call,
    types::{Attachment, AttachmentId, Request, Response},
};
use ipam_tests::{
    cluster::{Cluster, NODE_GRACE_MS, wait_until},
    ipam_node::IpamNode,
    netns::Netns,
};

/// GET `path` from the daemon's endpoint in the node's namespace: (status line, body).
fn get(ns: &Netns, path: &str) -> (String, String) {
    get_from(ns, 9963, path)
}

fn get_from(ns: &Netns, port: u16, path: &str) -> (String, String) {
    let path = path.to_owned();
    ns.run(move || {
        let mut s =
            TcpStream::connect(("127.0.0.1", port)).expect("connect to the metrics endpoint");
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        (
            head.lines().next().unwrap_or("").to_owned(),
            body.to_owned(),
        )
    })
}

/// The value of the sample `name{labels}` (exact label text) in an exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn attachment(i: usize) -> Attachment {
    Attachment {
        ips: Vec::new(),
        id: AttachmentId {
            network: "podnet".into(),
            container_id: format!("metrics-{i}"),
            ifname: "eth0".into(),
        },
        pod: None,
        pool: None,
    }
}

#[test]
fn counters_follow_what_was_done_and_promtool_accepts_them() {
    let node = IpamNode::with_metrics("met", "10.71.0.0/16", 24);
    let _daemon = node.start_daemon();
    let (status, body) = get(&node.ns, "/healthz");
    assert!(status.contains("200") && body == "ok\n", "{status} {body}");

    const N: usize = 7;
    for i in 0..N {
        let r = call(
            &node.socket(),
            &Request::Allocate(attachment(i)),
            Duration::from_secs(5),
        );
        assert!(matches!(r, Ok(Response::Allocated { .. })), "{r:?}");
    }
    for i in 0..3 {
        let r = call(
            &node.socket(),
            &Request::Release(attachment(i)),
            Duration::from_secs(5),
        );
        assert!(matches!(r, Ok(Response::Released { .. })), "{r:?}");
    }
    // Gauges follow on the next local pass (twice a second).
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let (_, text) = get(&node.ns, "/metrics");
        // Router and health addresses, and the 4 pods still allocated.
        if sample(&text, "ipam_node_addresses{family=\"IPv4\",state=\"used\"}") == Some(6.0) {
            break text;
        }
        assert!(Instant::now() < deadline, "gauges never caught up:\n{text}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        sample(&text, "ipam_pod_allocations_total{result=\"ok\"}"),
        Some(N as f64),
        "{text}"
    );
    assert_eq!(
        sample(&text, "ipam_pod_releases_total{result=\"ok\"}"),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "ipam_node_addresses{family=\"IPv4\",state=\"capacity\"}"
        ),
        Some(254.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "ipam_pool_blocks{pool=\"default\",family=\"IPv4\",state=\"total\"}"
        ),
        Some(256.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "ipam_node_addresses{family=\"IPv4\",state=\"available\"}"
        ),
        Some(248.0),
        "{text}"
    );
    // One /24 of the /16 is held: its 256 addresses count as used pool-wide.
    for (state, want) in [
        ("capacity", 65536.0),
        ("used", 256.0),
        ("available", 65280.0),
    ] {
        assert_eq!(
            sample(
                &text,
                &format!(
                    "ipam_pool_addresses{{pool=\"default\",family=\"IPv4\",state=\"{state}\"}}"
                )
            ),
            Some(want),
            "{text}"
        );
    }
    assert!(text.contains("ipam_pod_datapath_packets_total"), "{text}");
    // One store watch per kind for the whole daemon, however many controllers follow it: the
    // node records feed at least pod IPAM and the operator beside it (standalone).
    let watches: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("ipam_store_watches{"))
        .collect();
    assert!(!watches.is_empty(), "{text}");
    for line in &watches {
        assert!(
            line.ends_with(" 1"),
            "more than one store watch of a kind: {line}"
        );
    }
    let node_records = sample(&text, "ipam_store_watch_subscribers{kind=\"NodeIPAM\"}");
    assert!(node_records >= Some(2.0), "{text}");

    // The same node through `ipamctl -o json`: the published status and the pod datapath.
    let state_dir = node.dir.0.join("node").display().to_string();
    let root = node.bpffs_root().display().to_string();
    let ipamctl_json = |args: &[&str]| -> serde_json::Value {
        let ipamctl = ipam_tests::workspace_binary("ipamctl");
        let text = ipam_tests::run(ipamctl.to_str().unwrap(), args);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("ipamctl {args:?}: {e}\n{text}"))
    };
    let status = ipamctl_json(&["ipam", "status", "--state-dir", &state_dir, "-o", "json"]);
    // 7 pods in, 3 out, and the router and health addresses.
    assert_eq!(status["node"]["allocations"], N - 3 + 2, "{status}");
    assert_eq!(status["node"]["pools"][0]["name"], "default", "{status}");
    let endpoints = ipamctl_json(&[
        "endpoints",
        "--bpffs-root",
        &root,
        "--state-dir",
        &state_dir,
        "-o",
        "json",
    ]);
    assert!(endpoints["endpoints"].is_array(), "{endpoints}");
    assert!(endpoints["counters"]["delivered"].is_u64(), "{endpoints}");

    let (status, body) = get(&node.ns, "/readyz");
    assert!(status.contains("200"), "{status}\n{body}");
    for check in ["ok datapath", "ok restored", "ok store"] {
        assert!(body.contains(check), "{body}");
    }

    // Prometheus' own checker on the exposition.
    let file = ipam_tests::TempFile::new("metrics", "txt");
    std::fs::write(&file.0, &text).unwrap();
    let out = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&file.0).unwrap())
        .output()
        .expect("promtool (Debian's prometheus package, installed by cargo xtask setup)");
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One /24 and one /120 for the whole cluster: the second node finds the pool exhausted. It is
/// told once (event counter, node condition), `ipamctl pools` shows the full bar and the node
/// waiting, and appending a CIDR serves the node; a mask change is refused and counted.
#[test]
fn exhausted_pool_is_told_once_and_appending_a_cidr_fixes_it() {
    const OPERATOR_METRICS: u16 = 9971;
    let pools = format!(
        "[[ipam.pool]]\nname = \"default\"\n\
         ipv4 = {{ cidrs = [\"10.241.0.0/24\"], maskSize = 24 }}\n\
         ipv6 = {{ cidrs = [\"fd00:241::/120\"], maskSize = 120 }}\n\n\
         [metrics]\nlisten = \"127.0.0.1:{OPERATOR_METRICS}\"\n"
    );
    let mut c = Cluster::start_with("mx", 1, &pools, NODE_GRACE_MS);
    c.add_node("mx");
    c.add_node("mx");
    let operator_metrics = |c: &Cluster| get_from(&c.fabric, OPERATOR_METRICS, "/metrics").1;
    let events = |text: &str, reason: &str| {
        sample(
            text,
            &format!("ipam_pool_events_total{{pool=\"default\",reason=\"{reason}\"}}"),
        )
    };
    wait_until(
        Duration::from_secs(30),
        "node-1 to be told the pool is exhausted",
        || {
            c.records().get("node-1").is_some_and(|n| {
                n.value
                    .status
                    .conditions
                    .iter()
                    .any(|c| !c.status && c.message.contains("is exhausted"))
            }) && events(&operator_metrics(&c), "exhausted") == Some(2.0)
        },
        || format!("{:?}\n{}", c.records(), operator_metrics(&c)),
    );

    let pools = c.ipamctl(1, &["pools"]);
    assert!(
        pools.contains("[####################] 1/1 blocks")
            && pools.contains("node node-1: pool default (IPv4) is exhausted")
            && pools.contains("Append a CIDR"),
        "{pools}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&c.ipamctl(1, &["pools", "-o", "json"])).expect("pools -o json");
    let default = &json["pools"][0];
    assert_eq!(default["name"], "default", "{json}");
    assert_eq!(
        (&default["usage"][0]["used"], &default["usage"][0]["total"]),
        (&serde_json::json!(1), &serde_json::json!(1)),
        "{json}"
    );
    let node_status = |c: &Cluster| -> serde_json::Value {
        serde_json::from_str(&c.ipamctl(1, &["ipam", "status", "-o", "json"]))
            .expect("ipam status -o json")
    };
    // The node publishes its status at its next local pass, twice a second.
    wait_until(
        Duration::from_secs(10),
        "node-1's published status to carry its condition",
        || {
            node_status(&c)["node"]["nodeConditions"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
        },
        || c.nodes[1].log(),
    );
    let status = node_status(&c);
    let cluster = &status["cluster"];
    assert!(cluster["leadingOperator"].is_string(), "{status}");
    assert_eq!(
        cluster["nodes"].as_array().map(Vec::len),
        Some(2),
        "{status}"
    );
    assert!(
        status["node"]["nodeConditions"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("is exhausted")),
        "{status}\nnode-1:\n{}",
        c.nodes[1].log()
    );
    let text = operator_metrics(&c);
    assert_eq!(
        sample(
            &text,
            "ipam_pool_addresses{pool=\"default\",family=\"IPv4\",state=\"available\"}"
        ),
        Some(0.0),
        "{text}"
    );
    // Several passes later (a pass runs at least every node_grace/4), still told once.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(events(&operator_metrics(&c), "exhausted"), Some(2.0));

    // The fix from the operations guide: append a CIDR; node-1 gets a block from it.
    let fix = ipam_tests::TempFile::new("mx-pool", "yaml");
    let pool_yaml = |v4: &str, mask: u8| {
        format!(
            "kind: PodIPPool\nmetadata:\n  name: default\nspec:\n  ipv4:\n    cidrs: [{v4}]\n    \
             maskSize: {mask}\n  ipv6:\n    cidrs: [\"fd00:241::/120\", \"fd00:242::/120\"]\n    \
             maskSize: 120\n"
        )
    };
    std::fs::write(&fix.0, pool_yaml("10.241.0.0/24, 10.242.0.0/24", 24)).unwrap();
    c.ipamctl(1, &["apply", "-f", &fix.0.display().to_string()]);
    wait_until(
        Duration::from_secs(20),
        "node-1 to get blocks from the appended CIDRs",
        || c.blocks().get("node-1").is_some_and(|b| b.len() == 2),
        || format!("{:?}", c.records()),
    );
    assert!(
        c.blocks()["node-1"]
            .iter()
            .any(|b| b.to_string() == "10.242.0.0/24"),
        "{:?}",
        c.blocks()
    );

    // A mask change on a pool in use is refused, counted once, and the pool keeps working.
    std::fs::write(&fix.0, pool_yaml("10.241.0.0/24, 10.242.0.0/24", 25)).unwrap();
    c.ipamctl(1, &["apply", "-f", &fix.0.display().to_string()]);
    wait_until(
        Duration::from_secs(20),
        "the mask change to be refused",
        || events(&operator_metrics(&c), "refused") == Some(1.0),
        || operator_metrics(&c),
    );
    let listed = c.ipamctl(1, &["get", "podpools"]);
    assert!(
        listed.contains("Ready=false") && listed.contains("/24 to /25"),
        "{listed}"
    );

    // A LoadBalancer pool of ten addresses, one of them held by a Service: its counts.
    let lb = ipam_tests::TempFile::new("mx-lb", "yaml");
    std::fs::write(
        &lb.0,
        "kind: LoadBalancerIPPool\nmetadata: { name: lb }\n\
         spec: { blocks: [ { start: 10.77.0.10, stop: 10.77.0.19 } ] }\n---\n\
         kind: Service\nmetadata: { name: web }\nspec: { type: LoadBalancer }\n",
    )
    .unwrap();
    c.ipamctl(1, &["apply", "-f", &lb.0.display().to_string()]);
    let lb_sample = |text: &str, state: &str| {
        sample(
            text,
            &format!("ipam_lb_pool_addresses{{pool=\"lb\",family=\"IPv4\",state=\"{state}\"}}"),
        )
    };
    wait_until(
        Duration::from_secs(20),
        "the LoadBalancer pool's counts",
        || lb_sample(&operator_metrics(&c), "used") == Some(1.0),
        || operator_metrics(&c),
    );
    let text = operator_metrics(&c);
    assert_eq!(lb_sample(&text, "capacity"), Some(10.0), "{text}");
    assert_eq!(lb_sample(&text, "available"), Some(9.0), "{text}");
}
