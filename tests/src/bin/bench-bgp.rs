//! `cargo xtask bench bgp`: Service IPs over BGP with real agents (BIRD) and a real router
//! (FRR) in namespaces (docs/benchmarks.md):
//! - `bgp_failover_s`: a node's power loss (link cut, agent killed) to the router's route
//!   without it and the client behind the router served by another node; median of 5 kills,
//!   the node back between kills; the clock starts at the power loss, before the link is cut,
//!   as the L2 failover's does. With BFD (3 x 100 ms) and, `bgp_failover_hold_s`, without
//!   (hold time 3 s). Printed beside each, as configured values and not as measurements: the
//!   detection the configuration allows (BFD's 0.3 s, the hold time's 3 s).
//! - `routes_per_s`: 1,000 Services created (store writes, LB-IPAM, the agents, BIRD) to their
//!   1,000 routes on the router; beside it `reference_routes_per_s`: the same router learning
//!   1,000 routes from a BIRD given them in one configuration (no store, no agent), the path's
//!   own ceiling on this machine. Both are timed by the same tight poll of the router's table
//!   (no fixed sleep between looks); the time one look takes is printed beside them as the
//!   resolution (`route_poll_ms`).
//!
//! Last line: `bgp_failover_s=… bgp_failover_hold_s=… routes_per_s=… reference_routes_per_s=…
//! route_poll_ms=… bfd_detect_configured_s=0.30 hold_time_configured_s=3`

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use ipam_tests::{
    TempDir,
    bgp_rig::{BgpRig, PASSWORD, PORT, ROUTER_V4},
    cluster::{UPLINK, wait_until},
    failover::lb_service,
    netns::{Netns, veth},
};

const KILLS: usize = 5;
const SERVICES: usize = 1000;
/// The reference speaker's address on the segment (a router neighbour of the rig).
const REFERENCE: &str = "10.77.0.50";

fn main() {
    let (with_bfd, _) = failovers("bgb", true, false);
    let (hold, routes) = failovers("bgh", false, true);
    let (routes_per_s, reference_per_s, poll_ms) = routes.expect("routes were measured");
    println!(
        "bgp_failover_s (BFD 3 x 100 ms: configured detection 0.30 s): median {:.2} s of {:?}",
        median(&with_bfd),
        rounded(&with_bfd)
    );
    println!(
        "bgp_failover_hold_s (no BFD: configured hold time 3 s, keepalives every 1 s): median \
         {:.2} s of {:?}",
        median(&hold),
        rounded(&hold)
    );
    println!(
        "routes_per_s: {routes_per_s:.0} (1,000 Services to 1,000 routes); reference, BIRD \
         given 1,000 routes at once: {reference_per_s:.0}; one look at the router's table \
         takes {poll_ms:.1} ms (the resolution of both)"
    );
    println!(
        "bgp_failover_s={:.2} bgp_failover_hold_s={:.2} routes_per_s={routes_per_s:.0} \
         reference_routes_per_s={reference_per_s:.0} route_poll_ms={poll_ms:.1} \
         bfd_detect_configured_s=0.30 hold_time_configured_s=3",
        median(&with_bfd),
        median(&hold)
    );
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn rounded(values: &[f64]) -> Vec<String> {
    values.iter().map(|v| format!("{v:.2}")).collect()
}

/// Five power losses on a rig with BFD or without; with `routes`, then the routes figures on
/// the same rig.
fn failovers(tag: &str, bfd: bool, routes: bool) -> (Vec<f64>, Option<(f64, f64, f64)>) {
    let mut rig = BgpRig::start(tag, 3, bfd, &[REFERENCE]);
    rig.cluster.put("default/web", &lb_service(PORT));
    let ip = rig.wait_for_ip("default/web", false);
    let mut figures = Vec::new();
    for kill in 0..KILLS {
        rig.wait_for_hops(ip, &[0, 1, 2], "the route over the three nodes");
        let victim = kill % 3;
        let took = power_loss(&mut rig, ip, victim);
        println!(
            "{} kill {}: node-{victim} withdrawn and the client served in {took:.2} s",
            if bfd { "BFD" } else { "hold timer" },
            kill + 1
        );
        figures.push(took);
        rig.power_on(victim);
    }
    let routes = routes.then(|| {
        rig.wait_for_hops(ip, &[0, 1, 2], "the route over the three nodes");
        (
            services_to_routes(&rig),
            reference_routes(&rig),
            poll_time(&rig) * 1e3,
        )
    });
    rig.stop_backends();
    (figures, routes)
}

/// Cuts `victim`'s link, kills its agent; seconds until the router's route leaves it out and a
/// request from the client is answered after that.
fn power_loss(rig: &mut BgpRig, ip: IpAddr, victim: usize) -> f64 {
    // The power goes now: the link is cut first, then the agent is killed and reaped, and that
    // time counts (it once did not).
    let lost = Instant::now();
    rig.power_off(victim);
    while rig.routed_to(ip).contains(&victim) {
        assert!(lost.elapsed() < Duration::from_secs(30), "never withdrawn");
        std::thread::sleep(Duration::from_millis(5));
    }
    loop {
        if rig
            .request(ip, Duration::from_millis(200))
            .is_some_and(|by| by != format!("node-{victim}"))
        {
            return lost.elapsed().as_secs_f64();
        }
        assert!(
            lost.elapsed() < Duration::from_secs(30),
            "never served again"
        );
    }
}

/// The router's BGP routes within 198.51.100.0/22 (the rig's pool) or 100.64.0.0/22 (the
/// reference's).
fn bgp_routes(rig: &BgpRig, prefix: &str) -> usize {
    let out = rig
        .router
        .ns
        .command("ip")
        .args(["-4", "route", "show", "proto", "bgp"])
        .output()
        .expect("ip route");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with(prefix))
        .count()
}

/// Waits until the router holds at least `count` BGP routes under `prefix`, looking again as
/// soon as a look is done.
fn wait_for_routes(rig: &BgpRig, prefix: &str, count: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while bgp_routes(rig, prefix) < count {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {} routes",
            bgp_routes(rig, prefix)
        );
    }
}

/// Seconds one look at the router's table takes (the mean of 20).
fn poll_time(rig: &BgpRig) -> f64 {
    let start = Instant::now();
    for _ in 0..20 {
        bgp_routes(rig, "198.51.10");
    }
    start.elapsed().as_secs_f64() / 20.0
}

/// 1,000 Services created one after the other, to all their routes on the router.
fn services_to_routes(rig: &BgpRig) -> f64 {
    let before = bgp_routes(rig, "198.51.10");
    let start = Instant::now();
    // Written as a controller would: one connection, 64 writes in flight (the test kit's `put`
    // connects per call and would measure itself).
    rig.cluster.with_store(async |store| {
        use futures_util::StreamExt as _;
        use ipam_core::store::TypedStore as _;
        futures_util::stream::iter(0..SERVICES)
            .map(|i| {
                let store = &store;
                async move {
                    store
                        .create_typed(&format!("bulk/svc-{i:04}"), &lb_service(PORT))
                        .await
                        .expect("create a Service");
                }
            })
            .buffer_unordered(64)
            .collect::<Vec<()>>()
            .await;
    });
    let written = start.elapsed();
    wait_until(
        Duration::from_secs(300),
        "1,000 Services with IPs",
        || {
            rig.cluster
                .list::<ipam_core::lb::resources::Service>()
                .iter()
                .filter(|s| s.name.starts_with("bulk/") && !s.value.status.ingress.is_empty())
                .count()
                == SERVICES
        },
        || "LB-IPAM has not assigned them all".to_owned(),
    );
    let assigned = start.elapsed();
    wait_for_routes(
        rig,
        "198.51.10",
        before + SERVICES,
        "1,000 more routes on the router",
    );
    let took = start.elapsed().as_secs_f64();
    println!(
        "1,000 Services: written in {:.2} s, all given IPs by LB-IPAM in {:.2} s, all routed in \
         {took:.2} s",
        written.as_secs_f64(),
        assigned.as_secs_f64()
    );
    SERVICES as f64 / took
}

/// The same router learning 1,000 routes from a BIRD of its own (a namespace on the segment),
/// given them in one reconfiguration.
fn reference_routes(rig: &BgpRig) -> f64 {
    let ns = Netns::new("bgref");
    veth(&ns, UPLINK, &rig.cluster.fabric, "bgrefp");
    rig.cluster.fabric.add_port("bgrefp", "br0");
    ns.add_address(UPLINK, &format!("{REFERENCE}/24"));
    let dir = TempDir::new("bgp-ref-");
    let config = dir.0.join("bird.conf");
    let socket = dir.0.join("bird.ctl");
    let write = |routes: usize| {
        let mut text = format!(
            "router id {REFERENCE};\nprotocol device {{}}\nprotocol static services {{\n ipv4;\n"
        );
        for i in 0..routes {
            text.push_str(&format!(
                " route 100.64.{}.{}/32 unreachable;\n",
                i / 250,
                i % 250 + 1
            ));
        }
        text.push_str(&format!(
            "}}\nprotocol bgp router_peer {{\n local as 64512;\n neighbor {ROUTER_V4} as 64500;\n \
             password \"{PASSWORD}\";\n hold time 3; keepalive time 1;\n \
             ipv4 {{ import none; export all; next hop self; }};\n}}\n"
        ));
        std::fs::write(&config, text).expect("write BIRD's configuration");
    };
    write(0);
    let mut bird = ns
        .command("bird")
        .arg("-f")
        .arg("-c")
        .arg(&config)
        .arg("-s")
        .arg(&socket)
        .spawn()
        .expect("start the reference BIRD");
    let birdc = |args: &[&str]| {
        let out = std::process::Command::new("birdc")
            .arg("-s")
            .arg(&socket)
            .args(args)
            .output()
            .expect("birdc");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    wait_until(
        Duration::from_secs(30),
        "the reference session established",
        || birdc(&["show", "protocols", "router_peer"]).contains("Established"),
        || birdc(&["show", "protocols", "all", "router_peer"]),
    );
    write(SERVICES);
    let start = Instant::now();
    birdc(&["configure"]);
    wait_for_routes(
        rig,
        "100.64.",
        SERVICES,
        "the reference's 1,000 routes on the router",
    );
    let took = start.elapsed().as_secs_f64();
    let _ = bird.kill();
    let _ = bird.wait();
    println!("reference: 1,000 routes from one BIRD configuration in {took:.2} s");
    SERVICES as f64 / took
}
