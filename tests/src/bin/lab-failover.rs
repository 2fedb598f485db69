//! `cargo xtask lab failover`: the seed's failover measurement, on our system. Three nodes and a
//! client on one segment, etcd and an operator; the agents tell each other who is alive over UDP
//! (`[gossip]`, the lease renewed every 10 s); a LoadBalancer service with a backend on every
//! node; the client requests every 50 ms; the node answering for the service IP loses power
//! (agent SIGKILLed, link cut). Prints the timeline (last success, first failure, first
//! gratuitous ARP seen by the client, first success again, failed requests) and writes it with a
//! plot (SVG: requests over time by answering node, failures in their own row) to
//! `target/lab/`. Everything is cleaned up, also on failure.

use std::time::Duration;

use ipam_tests::failover::FailoverRig;

fn main() {
    println!(
        "Failover lab: etcd, an operator, three agents and a client on one segment; a service \
         with a backend on every node."
    );
    let mut rig = FailoverRig::start_gossip("lfo", 30_000);
    println!(
        "service IP {} answered by {}; the agents gossip (a member unanswered is suspected, and \
         declared dead 400 ms later unless it refutes), responders silent 300 ms after a node's \
         last heartbeat",
        rig.ip,
        rig.owner().unwrap_or_else(|| "?".into()),
    );
    println!("the client requests every 50 ms; in 5 s the answering node loses power\n");
    let run = rig.kill_owner(Duration::from_secs(5), Duration::from_secs(30));
    let timeline = run.timeline();
    println!("{timeline}");
    let (log, plot) = run.write_lab_files("failover", &timeline);
    println!(
        "\ntimeline and every request: {}\nplot: {}",
        log.display(),
        plot.display()
    );
    match run.failover_s() {
        Some(s) if s <= 1.0 => println!("failover: {s:.2} s (aim: 1 s at most)"),
        Some(s) => println!("failover: {s:.2} s: over the 1 s aim"),
        None => panic!("the service never answered again"),
    }
}
