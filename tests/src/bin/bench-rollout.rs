//! `cargo xtask bench rollout`: the planned operations of a cluster with both announcers
//! (docs/benchmarks.md, "rollout"). Three agents with the gossip and `[node] on_stop =
//! "restart"`, an FRR router peering with each (graceful restart on the peers, no BFD), Service
//! IPs over L2 on a segment of their own (`edge0`) and over BGP; a backend on every node
//! answering with its name.
//! - **A rolling restart of every agent**, one by one as a DaemonSet's rollout goes (each away
//!   1.5 s, more than the gossip takes to declare a silent member dead; the next one stopped
//!   once its predecessor cleared its restart notice and its BGP session is back), with a
//!   client on the L2 segment requesting each L2 IP every 20 ms and a client behind the router
//!   requesting a BGP IP (`Cluster`, ECMP over the three nodes) and a `Local` Service's IP (its
//!   one endpoint on node-1, so its only route is node-1's) every 20 ms.
//!   `l2_rollout_failed_requests`, `bgp_rollout_failed_requests`: the requests that failed;
//!   `rollout_ip_moves`: how often an L2 IP's answering node changed, as the client saw it.
//! - **A dead NIC**: the owner of an L2 IP loses its `edge0` carrier (the switch port goes
//!   down; the gossip and the store still reach it over its other link), three times (the link
//!   back between), with a request every 50 ms. `nic_down_failover_s`: the median time from the
//!   cut to the first request answered by another node; `nic_down_failed_requests_pct`: failed
//!   requests from 5 s before each cut to 30 s after it (the link back 10 s after the cut, so
//!   the hand-back is inside the window), as `bench failover` counts them.
//!
//! Aims (issue 38): 0, 0, 0, <= 1.0 s, <= 3 %.
//!
//! Last line: `l2_rollout_failed_requests=… bgp_rollout_failed_requests=… rollout_ip_moves=…
//! rollout_requests=… nic_down_failover_s=… nic_down_failed_requests_pct=…`

use std::{
    collections::BTreeMap,
    net::IpAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use ipam_core::{
    lb::{
        bgp::{BgpAdvertisement, GracefulRestart},
        resources::{LbIpPool, Service, ServiceEndpoint, ServiceEndpoints, ServiceEndpointsSpec},
    },
    meta::Selector,
};
use ipam_tests::{
    bgp_rig::{BgpRig, PASSWORD, ROUTER_V4, ROUTER_V6, ip_of, peer, session_of},
    cluster::{Cluster, node_addresses, wait_until},
    failover::{self, Sample, lb_service, uplink_policy},
    netns::Netns,
    traffic::{PORT, RequestLoop, Requests},
};
use serde_json::json;

const L2_SERVICES: usize = 3;
const CUTS: usize = 3;
/// How long each agent is away in the rolling restart.
const AWAY: Duration = Duration::from_millis(1500);
const EVERY: Duration = Duration::from_millis(20);

fn main() {
    let mut rig = BgpRig::start_prepared("ro", 3, false, &[], |c| {
        c.enable_gossip();
        c.add_segment("br1", "edge0", "10.79.0");
    });
    let (l2_ips, bgp_ips) = services(&rig);
    let l2_client = rig.cluster.add_client_on("roc", "br1");
    for ip in &l2_ips {
        served_by(&l2_client, *ip);
    }
    for n in &rig.cluster.nodes {
        n.set_node_setting("on_stop", Some("\"restart\""));
    }

    let (l2, bgp) = rolling_restart(&mut rig, &l2_client, &l2_ips, &bgp_ips);
    let l2_failed: usize = l2.iter().map(|r| r.failed.len()).sum();
    let bgp_failed: usize = bgp.iter().map(|r| r.failed.len()).sum();
    let moves: usize = l2.iter().map(Requests::moves).sum();
    let requests: usize = l2
        .iter()
        .chain(&bgp)
        .map(|r| r.answered + r.failed.len())
        .sum();
    for (ip, seen) in l2_ips.iter().zip(&l2) {
        println!(
            "rollout, L2 {ip}: {} answered, {} failed at {:?}, served by {:?}",
            seen.answered,
            seen.failed.len(),
            seen.failed,
            seen.served_by
        );
    }
    for (ip, seen) in bgp_ips.iter().zip(&bgp) {
        println!(
            "rollout, BGP {ip}: {} answered, {} failed at {:?}",
            seen.answered,
            seen.failed.len(),
            seen.failed
        );
    }

    let (failovers, failed_pct) = dead_nics(&rig, &l2_client, l2_ips[0]);
    let mut sorted = failovers.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    println!(
        "rolling restart of 3 agents: {l2_failed} L2 and {bgp_failed} BGP requests failed of \
         {requests}; L2 IPs moved {moves} times"
    );
    println!(
        "dead NIC: answered elsewhere after {:?} s (median {median:.2} s); {failed_pct:.2} % of \
         requests failed",
        failovers
            .iter()
            .map(|f| format!("{f:.2}"))
            .collect::<Vec<_>>()
    );
    rig.stop_backends();
    println!(
        "l2_rollout_failed_requests={l2_failed} bgp_rollout_failed_requests={bgp_failed} \
         rollout_ip_moves={moves} rollout_requests={requests} nic_down_failover_s={median:.2} \
         nic_down_failed_requests_pct={failed_pct:.2}"
    );
}

/// The Services: three over L2 on the edge segment (pool `edge`), one over BGP (`Cluster`)
/// and one `Local` with its one endpoint on node-1 (pool `routed`), each pool chosen by a
/// label; the peers with graceful restart. Returns the L2 IPs and the BGP ones, once each is
/// announced (the BGP ones routed as they should be).
fn services(rig: &BgpRig) -> (Vec<IpAddr>, Vec<IpAddr>) {
    let c = &rig.cluster;
    let by_label = |value: &str| Selector {
        match_labels: BTreeMap::from([("announce".to_owned(), value.to_owned())]),
        ..Selector::default()
    };
    let mut routed: LbIpPool = ipam_tests::bgp_rig::pool(&["198.51.100.0/22"]);
    routed.spec.service_selector = by_label("bgp");
    c.put("routed", &routed);
    let mut edge: LbIpPool = ipam_tests::bgp_rig::pool(&["10.79.0.32/28"]);
    edge.spec.service_selector = by_label("l2");
    c.put("edge", &edge);
    let mut policy = uplink_policy();
    policy.spec.interfaces = vec!["edge[0-9]+".into()];
    policy.spec.ip_pools = vec!["edge".into()];
    c.put("edge-l2", &policy);
    let advertisement: BgpAdvertisement =
        serde_json::from_value(json!({ "spec": { "ipPools": ["routed"] } })).unwrap();
    c.put("all", &advertisement);
    for (name, address) in [("tor", ROUTER_V4), ("tor6", ROUTER_V6)] {
        let mut p = peer(address, PASSWORD, 64512, false);
        p.spec.graceful_restart = Some(GracefulRestart {
            restart_time_seconds: 30,
        });
        c.put(name, &p);
    }
    let labelled = |value: &str| {
        let mut s: Service = lb_service(PORT);
        s.spec.labels = BTreeMap::from([("announce".to_owned(), value.to_owned())]);
        s
    };
    let l2: Vec<String> = (0..L2_SERVICES)
        .map(|i| format!("default/l2-{i}"))
        .collect();
    for name in &l2 {
        c.put(name, &labelled("l2"));
    }
    c.put("default/web", &labelled("bgp"));
    let mut local = labelled("bgp");
    local.spec.external_traffic_policy = ipam_core::lb::resources::TrafficPolicy::Local;
    c.put("default/local", &local);
    c.put(
        "default/local",
        &ServiceEndpoints {
            spec: ServiceEndpointsSpec {
                service: "default/local".into(),
                endpoints: vec![ServiceEndpoint {
                    node_name: "node-1".into(),
                    ready: true,
                }],
            },
        },
    );
    let l2_ips = l2.iter().map(|s| wait_for_ip(c, s)).collect();
    let web = wait_for_ip(c, "default/web");
    let local_ip = wait_for_ip(c, "default/local");
    rig.wait_for_hops(web, &[0, 1, 2], "default/web's route over the three nodes");
    rig.wait_for_hops(local_ip, &[1], "default/local's route from node-1");
    for node in ["node-0", "node-1", "node-2"] {
        wait_until(
            Duration::from_secs(20),
            &format!("the router to hear {node} offer graceful restart"),
            || {
                let address = node_addresses(node_index(node)).0;
                rig.router
                    .vtysh(&[&format!("show bgp neighbors {address}")])
                    .contains("Remote GR Mode: Restart")
            },
            || rig.router.vtysh(&["show bgp summary"]),
        );
    }
    (l2_ips, vec![web, local_ip])
}

fn node_index(name: &str) -> usize {
    name.trim_start_matches("node-").parse().expect("node-N")
}

fn wait_for_ip(c: &Cluster, service: &str) -> IpAddr {
    wait_until(
        Duration::from_secs(30),
        &format!("an address for {service}"),
        || ip_of(c, service, false).is_some(),
        || format!("{:?}", c.list::<Service>()),
    );
    ip_of(c, service, false).unwrap()
}

/// Every agent restarted one by one under the clients' requests; what each L2 IP's and each
/// BGP IP's requests saw.
fn rolling_restart(
    rig: &mut BgpRig,
    l2_client: &Netns,
    l2_ips: &[IpAddr],
    bgp_ips: &[IpAddr],
) -> (Vec<Requests>, Vec<Requests>) {
    let l2: Vec<RequestLoop> = l2_ips
        .iter()
        .map(|ip| RequestLoop::start(l2_client, *ip, EVERY))
        .collect();
    let bgp: Vec<RequestLoop> = bgp_ips
        .iter()
        .map(|ip| RequestLoop::start(&rig.client, *ip, EVERY))
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    for i in 0..rig.cluster.nodes.len() {
        let started = Instant::now();
        rig.cluster.nodes[i].stop();
        std::thread::sleep(AWAY);
        rig.cluster.nodes[i].start();
        let c = &rig.cluster;
        let name = c.nodes[i].name.clone();
        wait_until(
            Duration::from_secs(15),
            "the next agent to clear its node's restart notice",
            || c.records()[&name].value.spec.restarting.is_none(),
            || c.nodes[i].log(),
        );
        wait_until(
            Duration::from_secs(30),
            &format!("{name}'s BGP session established again"),
            || session_of(c, "tor", &name).is_some_and(|(state, _)| state == "Established"),
            || c.nodes[i].log(),
        );
        println!(
            "{name} restarted and back in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    std::thread::sleep(Duration::from_secs(2));
    (
        l2.into_iter().map(RequestLoop::stop).collect(),
        bgp.into_iter().map(RequestLoop::stop).collect(),
    )
}

/// `CUTS` times: the owner of `ip` loses its edge0 carrier and gets it back 10 s later. The
/// seconds from each cut to the first request answered elsewhere, and the share of requests
/// that failed from 5 s before each cut to 30 s after.
fn dead_nics(rig: &BgpRig, client: &Netns, ip: IpAddr) -> (Vec<f64>, f64) {
    let c = &rig.cluster;
    let mut failovers = Vec::new();
    let (mut failed, mut total) = (0, 0);
    for cut in 0..CUTS {
        let start = Instant::now();
        let done = Arc::new(AtomicBool::new(false));
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        let requests = {
            let (done, samples) = (done.clone(), samples.clone());
            client.spawn(move || failover::requests(ip, start, &done, &samples))
        };
        std::thread::sleep(Duration::from_secs(5));
        let owner = served_by(client, ip);
        let at = node_index(&owner);
        let port = format!("s0p{at}");
        let cut_at = start.elapsed();
        c.fabric.down(&port);
        std::thread::sleep(Duration::from_secs(10));
        c.fabric.up(&port);
        std::thread::sleep(Duration::from_secs(20));
        done.store(true, Ordering::SeqCst);
        requests.join().expect("requests");
        let samples = samples.lock().unwrap();
        let after = samples
            .iter()
            .find(|s| s.at > cut_at && s.node.as_ref().is_some_and(|n| *n != owner))
            .map(|s| (s.at - cut_at).as_secs_f64())
            .expect("answered by another node after the cut");
        let lost = samples.iter().filter(|s| s.node.is_none()).count();
        println!(
            "cut {}: {owner}'s edge0 lost its carrier; answered elsewhere after {after:.2} s; \
             {lost} of {} requests failed",
            cut + 1,
            samples.len()
        );
        failovers.push(after);
        failed += lost;
        total += samples.len();
    }
    (failovers, 100.0 * failed as f64 / total as f64)
}

/// The node serving `ip` to `client` now.
fn served_by(client: &Netns, ip: IpAddr) -> String {
    let mut by = None;
    wait_until(
        Duration::from_secs(20),
        &format!("{ip} served"),
        || {
            by = client.run(move || ipam_tests::traffic::request(ip, Duration::from_millis(500)));
            by.is_some()
        },
        String::new,
    );
    by.expect("served")
}
