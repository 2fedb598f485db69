//! Liveness between the agents (`[gossip]`) with real agents, real etcd and a client on the
//! segment: the service IP moves when its node loses power, when its agent is killed or
//! stopped, when the node is cut off from the other nodes (while the client and the store
//! still reach it), and when its gossip no longer leaves it (it still hears the others); a
//! client asking for the IP all along never gets two answers to one request; a minority of two
//! cut off from three goes silent and the majority answers for its IPs;
//! forged packets from a host on the segment are dropped and change nothing; and at rest the
//! agents write one lease renewal each per renewal period, nothing else.
//!
//! The bad link is 20 % loss (iptables' `statistic` match) on the owner's gossip, both ways.
//! This kernel has no netem (no `sch_netem`, no modules to load); delay and jitter come from
//! NFQUEUE and a thread that holds each packet for its draw (`ipam_tests::delay`, checked
//! below); the simulator runs loss with delay and jitter for minutes
//! (`ipam-gossip/tests/simulation.rs`).

use std::{collections::BTreeMap, net::Ipv4Addr, sync::Arc, time::Duration};

use foca::{Codec, Header, Message, PostcardCodec};
use ipam_core::{
    lb::resources::Service,
    resources::{NodeIpam, NodeIpamSpec, node_lease_name},
};
use ipam_gossip::{Keyring, NodeKey, PeerId, Signers, Speaker, Timing, envelope::Envelope};
use ipam_tests::{
    arp_watch::{ArpWatch, WINDOW, double_answers},
    cluster::{Cluster, NODE_GRACE_MS, node_addresses, wait_until},
    delay::Delay,
    failover::{
        AGENT_METRICS_PORT, CLIENT, FailoverRig, Fault, KillRun, lb_service, segment_pool,
        uplink_policy,
    },
};

const BEFORE: Duration = Duration::from_secs(1);
const AFTER: Duration = Duration::from_secs(4);

/// The requests two nodes answered, and what the client saw around them.
fn assert_one_answer_at_a_time(run: &KillRun, macs: &BTreeMap<[u8; 6], String>) {
    let doubles = double_answers(&run.arp);
    assert!(
        doubles.is_empty(),
        "{:?}: two nodes answered one request for the service IP at {:?}\n{}",
        run.fault,
        doubles
            .iter()
            .map(|s| (
                s.at,
                s.macs
                    .iter()
                    .map(|m| macs.get(m).cloned())
                    .collect::<Vec<_>>()
            ))
            .collect::<Vec<_>>(),
        run.timeline()
    );
}

#[test]
fn faults_move_the_service_ip_with_never_two_answers_and_forged_packets_move_nothing() {
    let mut rig = FailoverRig::start_gossip("gsp", NODE_GRACE_MS);
    // Every agent sees the two others alive, by node name.
    for i in 0..3 {
        wait_until(
            Duration::from_secs(10),
            "every agent seeing the two others alive",
            || {
                rig.cluster
                    .ipamctl(i, &["members"])
                    .matches(" alive ")
                    .count()
                    == 2
            },
            || rig.cluster.ipamctl(i, &["members"]),
        );
    }
    let members = rig.cluster.ipamctl(0, &["members"]);
    assert!(
        members.contains("answering for its service IPs")
            && members.contains("node-1")
            && members.contains("node-2"),
        "{members}"
    );

    for fault in [
        Fault::PowerOff,
        Fault::Kill,
        Fault::Stop,
        Fault::CutOff,
        Fault::Muted,
    ] {
        let run = rig.fault_owner(fault, BEFORE, AFTER);
        println!("{:?}\n{}", fault, run.timeline());
        assert_one_answer_at_a_time(&run, &rig.macs);
        // From 2 s on, one other node answers every request. (Right after a kill with the link
        // up the old node still serves: the IP is on its loopback and the client's ARP entry
        // points at it until the new owner's gratuitous ARP.)
        let answered: Vec<Option<String>> = run
            .samples
            .iter()
            .filter(|s| s.at > run.killed_at + Duration::from_secs(2))
            .map(|s| s.node.clone())
            .collect();
        let after = answered.first().cloned().flatten();
        assert!(
            after.as_ref().is_some_and(|n| *n != run.victim)
                && answered.iter().all(|n| *n == after),
            "{fault:?}: one other node answers once the IP has moved: {answered:?}\n{}",
            run.timeline()
        );
    }

    // The node cut off knew it was silent, and said why.
    let cut_off_log = rig
        .cluster
        .nodes
        .iter()
        .map(ipam_tests::cluster::ClusterNode::log)
        .collect::<String>();
    assert!(
        cut_off_log.contains("gossip fence closed, responders silent"),
        "no agent logged its fence closing"
    );

    a_lossy_link_moves_nothing(&rig);
    forged_packets_move_nothing(&rig);
}

/// A fifth of the owner's gossip packets lost and the rest held for 0–100 ms, both ways, for
/// 20 s (netem's `loss 20% delay 50ms 50ms`): suspicions at most, no death, no rejoin, the IP
/// stays, no other node ever answers for it, and the owner answers nearly every request (its
/// fence closes now and then on a link this bad: about 1 % of the time in the simulator,
/// `ipam-gossip/tests/simulation.rs`).
fn a_lossy_link_moves_nothing(rig: &FailoverRig) {
    let owner = rig.owner().expect("one node answers");
    let node = rig.cluster.nodes.iter().find(|n| n.name == owner).unwrap();
    let owner_mac = node.mac();
    let rules = [["INPUT", "--dport"], ["OUTPUT", "--dport"]];
    let iptables = |action: &str| {
        for [chain, port] in rules {
            let status = node
                .ns
                .command("iptables")
                .args([action, chain, "-p", "udp", port, "7946"])
                .args(ipam_tests::delay::random_loss("0.2"))
                .status()
                .expect("run iptables");
            assert!(status.success(), "iptables {action} {chain}");
        }
    };
    let count = |line: &str| {
        rig.cluster
            .nodes
            .iter()
            .map(|n| n.log().matches(line).count())
            .sum::<usize>()
    };
    let deaths = || count("member declared dead");
    // A refuted suspicion must end there, not in a rejoin under a new generation.
    let rejoins = || count("declared dead by the others while alive");
    let (deaths_before, rejoins_before) = (deaths(), rejoins());
    let start = std::time::Instant::now();
    let watch = ArpWatch::start(&rig.client, CLIENT, rig.ip, start);
    // The loss rules come first: a dropped packet never reaches the delay's queue.
    iptables("-A");
    let delay = Delay::start(
        &node.ns,
        7946,
        2,
        Duration::ZERO,
        Duration::from_millis(100),
    );
    std::thread::sleep(Duration::from_secs(20));
    let held = delay.stop();
    iptables("-D");
    let samples = watch.stop();
    assert!(held > 100, "the delay held {held} packets");
    assert!(
        double_answers(&samples).is_empty(),
        "two answers on a lossy link"
    );
    let others: Vec<_> = samples
        .iter()
        .filter(|s| s.macs.iter().any(|m| *m != owner_mac))
        .collect();
    assert!(
        others.is_empty(),
        "another node answered on a lossy link: {others:?}"
    );
    let unanswered = samples.iter().filter(|s| s.macs.is_empty()).count();
    let share = unanswered as f64 / samples.len() as f64;
    println!(
        "lossy link: the owner left {unanswered} of {} requests unanswered ({share:.3})",
        samples.len()
    );
    assert!(
        share < 0.1,
        "the owner left {unanswered} of {} requests unanswered",
        samples.len()
    );
    assert_eq!(
        deaths(),
        deaths_before,
        "a member was declared dead on a lossy link"
    );
    assert_eq!(
        rejoins(),
        rejoins_before,
        "a member rejoined on a lossy link"
    );
    // Its fence may have closed just before the link healed: it reopens within
    // `Timing::fence_reopen`.
    wait_until(
        Duration::from_secs(3),
        "the owner answering again after the link healed",
        || rig.owner().as_deref() == Some(owner.as_str()),
        || format!("{:?}", rig.owner()),
    );
}

/// A compromised node (the client, given the cluster key, a signing key of its own and a node
/// record that publishes it, as root on a node has) and a host without the key send the
/// owner's gossip port what they can make: each packet is dropped for its reason, whether it
/// speaks as another node (signed with its own key, or unsigned as the previous release),
/// replays, or was sealed for another member; and the IP stays where it is with every member
/// alive (issue 58: a node speaks only as itself).
fn forged_packets_move_nothing(rig: &FailoverRig) {
    let owner = rig.owner().expect("one node answers");
    let index = rig
        .cluster
        .nodes
        .iter()
        .position(|n| n.name == owner)
        .unwrap();
    let address = |i: usize| -> std::net::SocketAddr {
        format!("{}:7946", node_addresses(i).0).parse().unwrap()
    };
    let target = address(index);
    let neighbour = address((index + 1) % 3);
    let key = std::fs::read_to_string(rig.cluster.gossip_key().unwrap()).unwrap();
    let cluster_key = || Keyring::new(("cluster", key.trim().as_bytes()), []).unwrap();
    let from: std::net::SocketAddr = format!("{CLIENT}:7946").parse().unwrap();

    // Mallory's record, as the compromised node's own would be.
    let mallory_key = NodeKey::from_seed(&[66; 32]);
    let record = NodeIpam {
        spec: NodeIpamSpec {
            addresses: vec![from.ip()],
            gossip_key: Some(mallory_key.public().to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    rig.cluster.put("mallory", &record);
    // Who speaks for each address, as Mallory reads the records.
    let records = rig.cluster.records();
    let speakers: Vec<(&str, &[std::net::IpAddr], Speaker)> = records
        .iter()
        .map(|(name, r)| {
            let speaker = r
                .value
                .spec
                .gossip_key
                .as_deref()
                .map_or(Speaker::Unsigned, |k| {
                    Speaker::Signed(k.parse().expect("a readable key"))
                });
            (name.as_str(), r.value.spec.addresses.as_slice(), speaker)
        })
        .collect();
    let (signers, contested) = Signers::from_records(speakers);
    assert!(contested.is_empty(), "{contested:?}");
    let signers = Arc::new(signers);
    let mallory_at = |at: std::net::SocketAddr| {
        let mut envelope = Envelope::new(cluster_key(), NodeKey::from_seed(&[66; 32]), at);
        envelope.set_signers(signers.clone());
        envelope
    };
    // The target's agent takes Mallory's record in before her packets come.
    std::thread::sleep(Duration::from_secs(1));

    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64
    };
    let mut stranger = Envelope::new(
        Keyring::new(("stranger", &[9; 32]), []).unwrap(),
        NodeKey::from_seed(&[9; 32]),
        from,
    );
    let mut mallory = mallory_at(from);
    let foreign = stranger.seal(now(), target, b"node-0 is dead");
    // The key id travels in clear: a forger can copy it, not the tag.
    let mut tampered = mallory.seal(now(), target, b"node-0 is dead");
    let last = tampered.len() - 40;
    tampered[last] ^= 0xff;
    // Authentic, from Mallory as herself: taken by the envelope, refused by the protocol.
    let authentic = mallory.seal(now(), target, b"not a protocol message");
    // Authentic and never seen by the owner, but sealed for another member.
    let to_another = mallory.seal(now(), neighbour, b"not a protocol message");
    // Mallory speaking as the neighbour: signed with her own key, then unsigned (version 2,
    // as if the neighbour ran the previous release).
    let as_neighbour = mallory_at(neighbour).seal(now(), target, b"node-0 is dead");
    let mut downgraded = Envelope::new(cluster_key(), NodeKey::from_seed(&[66; 32]), neighbour);
    downgraded.set_signers(Arc::new(
        [(target.ip(), Speaker::Unsigned)].into_iter().collect(),
    ));
    let unsigned = downgraded.seal(now(), target, b"node-0 is dead");
    // Signed as herself, but the protocol message inside names the neighbour as its sender.
    let mut message = Vec::new();
    let header = Header {
        src: PeerId::new(neighbour, 1),
        src_incarnation: 0,
        dst: PeerId::new(target, 1),
        message: Message::Ping(1),
    };
    PostcardCodec.encode_header(&header, &mut message).unwrap();
    let impersonating = mallory.seal(now(), target, &message);
    let packets: Vec<Vec<u8>> = vec![
        b"hello".to_vec(),
        foreign,
        tampered,
        authentic.clone(),
        authentic,
        to_another,
        as_neighbour,
        unsigned,
        impersonating,
    ];
    // Each packet counted by the owner's agent under its reason (read from its metrics before
    // and after: its log says a reason once a minute, and earlier faults had their own drops).
    let dropped = |reason: &str| -> u64 {
        let text = rig.cluster.nodes[index]
            .metrics(AGENT_METRICS_PORT)
            .expect("the owner's metrics");
        let line = format!("ipam_gossip_dropped_packets_total{{reason=\"{reason}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .map_or(0, |n| n.trim().parse().expect("a count"))
    };
    let expected = [
        ("truncated", 1),
        ("unknown_key", 1),
        ("bad_tag", 1),
        ("malformed", 1),
        ("replayed", 1),
        ("misaddressed", 1),
        ("unknown_signer", 1),
        ("unsigned", 1),
        ("impersonating", 1),
    ];
    let before: Vec<u64> = expected.iter().map(|(r, _)| dropped(r)).collect();
    rig.client.run(move || {
        let socket = std::net::UdpSocket::bind((CLIENT, 0)).unwrap();
        for p in packets {
            socket.send_to(&p, target).unwrap();
        }
    });
    wait_until(
        Duration::from_secs(5),
        "the owner dropping each packet for its reason",
        || {
            expected
                .iter()
                .zip(&before)
                .all(|((reason, n), was)| dropped(reason) == was + n)
        },
        || {
            expected
                .iter()
                .zip(&before)
                .map(|((reason, _), was)| {
                    format!("{reason}: {}", dropped(reason).saturating_sub(*was))
                })
                .collect::<Vec<_>>()
                .join(", ")
        },
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        rig.owner().as_deref(),
        Some(owner.as_str()),
        "the IP stayed"
    );
    let members = rig.cluster.ipamctl(index, &["members"]);
    assert_eq!(members.matches(" alive ").count(), 2, "{members}");
    rig.cluster.delete::<NodeIpam>("mallory");
}

#[test]
fn at_rest_the_store_sees_one_lease_renewal_per_node_and_period() {
    let mut c = Cluster::start("gsw", 1);
    c.enable_gossip();
    for _ in 0..3 {
        c.add_node("gsw");
    }
    wait_until(
        Duration::from_secs(30),
        "every agent ready",
        || c.nodes.iter().all(ipam_tests::cluster::ClusterNode::ready),
        || c.nodes[0].log(),
    );
    std::thread::sleep(Duration::from_secs(3));
    let window = Duration::from_secs(12);
    let writes = c.count_writes_by(true, || std::thread::sleep(window));
    // Renewed every node_grace_ms / 3 = 2 s here (10 s by default): six each in 12 s, give or
    // take the one in flight at either end.
    let renew_s = NODE_GRACE_MS as f64 / 3.0 / 1000.0;
    let expected = window.as_secs_f64() / renew_s;
    for node in &c.nodes {
        let key = format!("/Lease/{}", node_lease_name(&node.name));
        let renewals = writes.get(&key).copied().unwrap_or(0) as f64;
        assert!(
            (expected - 1.0..=expected + 1.0).contains(&renewals),
            "{key}: {renewals} writes in {window:?}, expected {expected}: {writes:?}"
        );
    }
    // Besides, only the operator's own lease is renewed (one writer, whatever the cluster's
    // size): no node writes anything else at rest, and nobody watches the nodes' leases.
    let others: Vec<&String> = writes
        .keys()
        .filter(|k| !k.starts_with("/Lease/node-") && *k != "/Lease/ipam-operator")
        .collect();
    assert!(others.is_empty(), "writes at rest: {writes:?}");
}

#[test]
fn a_minority_of_two_falls_silent_and_the_majority_answers_for_its_ips() {
    let mut c = Cluster::start("gmn", 1);
    c.enable_gossip();
    for _ in 0..5 {
        c.add_node("gmn");
    }
    let client = c.add_client("gmnc");
    c.put("lb", &segment_pool());
    c.put("uplinks", &uplink_policy());
    for i in 0..12 {
        c.put(&format!("default/s{i}"), &lb_service(80));
    }
    let macs: BTreeMap<[u8; 6], String> =
        c.nodes.iter().map(|n| (n.mac(), n.name.clone())).collect();
    // Who answers each service IP, as the client sees it.
    let owners = || -> BTreeMap<Ipv4Addr, Vec<String>> {
        service_ips(&c)
            .into_iter()
            .map(|ip| {
                let answers = client.run(move || {
                    ipam_tests::resolve::Resolver::new("eth0").arp_all(
                        CLIENT,
                        ip,
                        Duration::from_millis(150),
                    )
                });
                let nodes = answers
                    .iter()
                    .map(|m| macs.get(m).cloned().unwrap_or_default());
                (ip, nodes.collect())
            })
            .collect()
    };
    // Waits until each of the 12 IPs has one answer, from a node `want` accepts.
    let settled = |want: &dyn Fn(&str) -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let seen = owners();
            if seen.len() == 12 && seen.values().all(|o| o.len() == 1 && want(&o[0])) {
                return seen;
            }
            assert!(std::time::Instant::now() < deadline, "answers: {seen:?}");
        }
    };
    let minority = ["node-3", "node-4"];
    let before = settled(&|_| true);
    let watched: Vec<Ipv4Addr> = before
        .iter()
        .filter(|(_, o)| minority.contains(&o[0].as_str()))
        .map(|(ip, _)| *ip)
        .collect();
    assert!(
        !watched.is_empty(),
        "the minority answers for some IPs: {before:?}"
    );

    let start = std::time::Instant::now();
    let watches: Vec<ArpWatch> = watched
        .iter()
        .map(|ip| ArpWatch::start(&client, CLIENT, *ip, start))
        .collect();
    c.partition(&[3, 4]);
    std::thread::sleep(Duration::from_secs(3));
    // The fence promises no overlap at all: the minority is silent before the majority may
    // take over, and stays so (its fence reopens only after `Timing::fence_reopen`; with a
    // reopening after one probe period it answered again for up to 80 ms in some runs). The
    // issue's bound is the fencing margin, the takeover hold here: anything longer fails,
    // anything at all is printed.
    let margin = Timing::default().takeover_hold;
    for (ip, watch) in watched.iter().zip(watches) {
        let samples = watch.stop();
        let doubles = double_answers(&samples);
        let overlap = WINDOW * u32::try_from(doubles.len()).unwrap();
        if !doubles.is_empty() {
            println!("{ip}: two answers for {overlap:?} during the partition: {doubles:?}");
        }
        assert!(
            overlap <= margin,
            "{ip}: two answers for {overlap:?}, longer than the fencing margin {margin:?}: \
             {doubles:?}"
        );
    }
    // Every IP is answered by the majority; the minority knows it is silent.
    let cut = settled(&|o| !minority.contains(&o));
    println!("before: {before:?}\nduring: {cut:?}");
    for i in [3, 4] {
        let members = c.ipamctl(i, &["members"]);
        assert!(members.contains("responders SILENT"), "{members}");
    }

    // Healed: all five alive again everywhere, one answer per IP, and the minority's IPs back
    // on it (ownership is a function of who is alive).
    c.heal(&[3, 4]);
    for i in 0..5 {
        wait_until(
            Duration::from_secs(20),
            "every agent seeing the four others alive",
            || c.ipamctl(i, &["members"]).matches(" alive ").count() == 4,
            || c.ipamctl(i, &["members"]),
        );
    }
    let after = settled(&|_| true);
    assert_eq!(after, before, "the same owners as before the partition");
}

fn service_ips(c: &Cluster) -> Vec<Ipv4Addr> {
    c.list::<Service>()
        .into_iter()
        .filter_map(|s| match s.value.status.ingress.first() {
            Some(std::net::IpAddr::V4(v4)) => Some(*v4),
            _ => None,
        })
        .collect()
}

/// The netem stand-in the lossy-link test relies on really holds packets: on loopback each
/// packet passes OUTPUT and INPUT, so a fixed 30 ms hold is 60 ms on the way.
#[test]
fn the_delay_holds_each_packet_for_its_draw() {
    let ns = ipam_tests::netns::Netns::new("dly");
    let hold = Duration::from_millis(30);
    let delay = Delay::start(&ns, 7946, 1, hold, hold);
    let late = ns.run(|| {
        let rx = std::net::UdpSocket::bind("127.0.0.1:7946").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut took = Vec::new();
        for _ in 0..10 {
            let sent = std::time::Instant::now();
            tx.send_to(b"x", "127.0.0.1:7946").unwrap();
            let mut buf = [0u8; 8];
            rx.recv_from(&mut buf).expect("the packet arrives");
            took.push(sent.elapsed());
        }
        took
    });
    assert_eq!(delay.stop(), 20, "each packet queued twice");
    assert!(
        late.iter().all(|t| *t >= 2 * hold),
        "packets arrived before their hold: {late:?}"
    );
}
