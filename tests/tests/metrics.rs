//! The metrics and health endpoints of a real `ipamd` (standalone role): N allocations and
//! releases over the local API move the counters by N, the node's addresses and the pool's
//! blocks are shown, the readiness checks name what they checked, and Prometheus' own
//! `promtool check metrics` (Debian's `prometheus` package) accepts the exposition.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    time::{Duration, Instant},
};

use ipam_api::{
    client::call,
    types::{Attachment, AttachmentId, Request, Response},
};
use ipam_tests::{ipam_node::IpamNode, netns::Netns};

/// GET `path` from the daemon's endpoint in the node's namespace: (status line, body).
fn get(ns: &Netns, path: &str) -> (String, String) {
    let path = path.to_owned();
    ns.run(move || {
        let mut s =
            TcpStream::connect(("127.0.0.1", 9963)).expect("connect to the metrics endpoint");
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
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
        id: AttachmentId {
            container_id: format!("metrics-{i}"),
            ifname: "eth0".into(),
        },
        pod: None,
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
    assert!(text.contains("ipam_pod_datapath_packets_total"), "{text}");

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
