//! `cargo xtask lab bgp`: Service IPs over BGP. Three agents driving BIRD, an FRR router on
//! their segment (BFD 3 x 100 ms, hold time 3 s), a client behind the router on a subnet of its
//! own, etcd and an operator; a LoadBalancer Service with a backend on every node. Shows the
//! router learning the Service's route over the three nodes (ECMP), then the client requesting
//! every 50 ms (a new connection each, hashed over the next hops) while one node loses power
//! (link cut, agent SIGKILLed). Prints the timeline (last success, the loss, first failure, the
//! router's withdrawal, first success on another node, failed requests) and writes it with a
//! plot (SVG: requests over time by answering node) to `target/lab/`, as the L2 failover lab
//! does. Everything is cleaned up, also on failure.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use ipam_tests::{
    bgp_rig::{BgpRig, PORT},
    failover::{self, Fault, KillRun, lb_service},
};

const BEFORE: Duration = Duration::from_secs(5);
const AFTER: Duration = Duration::from_secs(10);

fn main() {
    println!(
        "BGP lab: etcd, an operator, three agents (BIRD), an FRR router on their segment and a \
         client behind it; a service with a backend on every node."
    );
    let mut rig = BgpRig::start("lbg", 3, true, &[]);
    rig.cluster.put("default/web", &lb_service(PORT));
    let ip = rig.wait_for_ip("default/web", false);
    rig.wait_for_hops(ip, &[0, 1, 2], "the route over the three nodes");
    println!("\nthe router learned {ip} from every node:\n");
    println!("{}", rig.router.vtysh(&[&format!("show ip route {ip}")]));
    println!("{}", rig.router.vtysh(&["show bgp summary"]));
    let victim = 0;
    println!(
        "the client requests every 50 ms (a new connection each); in {} s node-{victim} loses \
         power\n",
        BEFORE.as_secs()
    );

    let start = Instant::now();
    let samples = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicBool::new(false));
    let requests = {
        let (samples, done) = (samples.clone(), done.clone());
        rig.client
            .spawn(move || failover::requests(ip, start, &done, &samples))
    };
    std::thread::sleep(BEFORE);
    let killed_at = start.elapsed();
    rig.power_off(victim);
    while rig.routed_to(ip).contains(&victim) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let withdrawn_at = start.elapsed();
    std::thread::sleep(AFTER.saturating_sub(withdrawn_at - killed_at));
    done.store(true, Ordering::SeqCst);
    let _ = requests.join();
    let samples = samples.lock().unwrap().clone();
    let run = KillRun {
        fault: Fault::PowerOff,
        victim: format!("node-{victim}"),
        killed_at,
        samples,
        gratuitous: Vec::new(),
        arp: Vec::new(),
    };
    let withdrawn = format!(
        "{:+7.3} s  the router withdrew node-{victim}'s route (BFD)",
        (withdrawn_at - killed_at).as_secs_f64()
    );
    // With ECMP the other nodes keep serving their flows: what ends the outage is the last
    // failed request, around the withdrawal. Both join the timeline, in time order.
    let rel = |at: Duration| format!("{:+7.3} s", at.as_secs_f64() - killed_at.as_secs_f64());
    let mut lines: Vec<String> = run.timeline().lines().map(str::to_owned).collect();
    let summary = lines.pop().unwrap_or_default();
    lines.push(withdrawn);
    if let Some(last) = run
        .samples
        .iter()
        .rev()
        .find(|s| s.at >= killed_at && s.node.is_none())
    {
        lines.push(format!(
            "{}  last failed request (a flow hashed to node-{victim})",
            rel(last.at)
        ));
    }
    lines.sort_by(|a, b| {
        let at = |l: &str| {
            l.trim()
                .split(' ')
                .next()
                .and_then(|t| t.parse::<f64>().ok())
        };
        at(a)
            .partial_cmp(&at(b))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    lines.push(summary);
    let timeline = lines.join("\n");
    println!("{timeline}");
    println!(
        "\nafter: {}",
        rig.router.vtysh(&[&format!("show ip route {ip}")])
    );

    let (log, plot) = run.write_lab_files("bgp-failover", &timeline);
    println!(
        "timeline and every request: {}\nplot: {}",
        log.display(),
        plot.display()
    );
    let withdrawal = (withdrawn_at - killed_at).as_secs_f64();
    if withdrawal <= 1.0 {
        println!("withdrawal: {withdrawal:.2} s (aim with BFD: 1 s at most)");
    } else {
        println!("withdrawal: {withdrawal:.2} s: over the 1 s aim");
    }
    rig.stop_backends();
}
