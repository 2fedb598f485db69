//! The L2 responder's decisions, frame by frame, through `BPF_PROG_TEST_RUN`: both attach forms
//! (XDP and TC) run the same frames (`ipam_tests::responder_harness`). Replies are compared byte
//! for byte with frames built by the userspace code in `ipam_daemon::net::frames`, and judged by
//! an independent packet library (`ipam_tests::oracle`, etherparse).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipam_common::l2::{ResponderConfig, ResponderStat};
use ipam_daemon::net::frames::{
    ARP_REPLY, ArpFrame, ICMPV6_NA, ICMPV6_NS, NA_SOLICITED_OVERRIDE, NdpFrame,
};
use ipam_tests::responder_harness::*;
use rand::{Rng as _, RngCore as _, SeedableRng as _, rngs::StdRng};

#[test]
fn arp_request_for_announced_ip_gets_exact_reply_in_both_forms() {
    let mut h = Harness::new();
    let req = arp_request(ANNOUNCED_V4).to_bytes();
    assert_eq!(h.check(&req), Outcome::Reply(expected_arp_reply(&req)));

    // Minimum-size Ethernet frames carry 18 bytes of padding; it is kept as it is.
    let mut padded = req.clone();
    padded.extend_from_slice(&[0xee; 18]);
    assert_eq!(
        h.check(&padded),
        Outcome::Reply(expected_arp_reply(&padded))
    );

    // A unicast request to our MAC (cache refresh) is answered too.
    let mut unicast = arp_request(ANNOUNCED_V4);
    unicast.eth_dst = OUR_MAC;
    let unicast = unicast.to_bytes();
    assert_eq!(
        h.run(&unicast),
        Outcome::Reply(expected_arp_reply(&unicast))
    );

    // Two forms ran each frame: 6 replies in total, counted per entry and globally.
    assert_eq!(h.stat(ResponderStat::ArpReplies), 6);
    let entry = h.datapath.responder().list().unwrap();
    let v4 = entry
        .iter()
        .find(|e| e.ip == IpAddr::V4(ANNOUNCED_V4))
        .unwrap();
    assert_eq!(v4.replies, 6);
    assert_eq!(v4.mac, OUR_MAC);
}

#[test]
fn frames_that_are_not_questions_for_us_pass_untouched() {
    let mut h = Harness::new();
    let valid = arp_request(ANNOUNCED_V4);
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();

    cases.push((
        "request for an unannounced IP",
        arp_request(OTHER_V4).to_bytes(),
    ));
    let mut reply = valid;
    reply.op = ARP_REPLY;
    cases.push(("ARP reply", reply.to_bytes()));
    cases.push((
        "gratuitous ARP for the announced IP",
        ArpFrame::gratuitous(CLIENT_MAC, ANNOUNCED_V4, 1).to_bytes(),
    ));
    let mut probe = valid;
    probe.sender_ip = Ipv4Addr::UNSPECIFIED;
    cases.push(("RFC 5227 probe", probe.to_bytes()));
    let mut other_station = valid;
    other_station.eth_dst = [0x02, 9, 9, 9, 9, 9];
    cases.push((
        "request unicast to another station",
        other_station.to_bytes(),
    ));
    let mut group_sender = valid;
    group_sender.sender_mac = [0x01, 0, 0x5e, 0, 0, 1];
    cases.push((
        "request from a multicast sender MAC",
        group_sender.to_bytes(),
    ));
    for (name, at, value) in [
        ("hardware type not Ethernet", 15, 6u8),
        ("protocol type not IPv4", 16, 0x86),
        ("hardware length not 6", 18, 8),
        ("protocol length not 4", 19, 16),
        ("unknown opcode", 21, 9),
    ] {
        let mut f = valid.to_bytes();
        f[at] = value;
        cases.push((name, f));
    }
    // 802.1Q-tagged request: the tag shifts the ARP header; the VLAN interface handles it.
    let mut tagged = valid.to_bytes();
    tagged.splice(12..12, [0x81, 0x00, 0x00, 0x64]);
    cases.push(("VLAN-tagged request", tagged));
    let mut wrong_ethertype = valid.to_bytes();
    wrong_ethertype[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    cases.push(("IPv4 ethertype", wrong_ethertype));
    for len in 14..42 {
        cases.push(("truncated request", valid.to_bytes()[..len].to_vec()));
    }

    for (name, frame) in cases {
        assert_eq!(h.run(&frame), Outcome::Pass, "{name} must pass untouched");
    }
    assert_eq!(h.stat(ResponderStat::ArpReplies), 0);
    assert!(
        h.stat(ResponderStat::Malformed) > 0,
        "truncated/odd ARP frames are counted"
    );
}

#[test]
fn neighbour_solicitations_get_exact_advertisements() {
    let mut h = Harness::new();
    let multicast = ns(ANNOUNCED_V6);
    let out = h.run(&multicast.to_bytes());
    assert_eq!(out, Outcome::Reply(expected_na(&multicast)));
    let Outcome::Reply(bytes) = out else {
        unreachable!()
    };
    let na = NdpFrame::parse(&bytes).unwrap();
    assert!(na.checksum_valid(), "advertisement checksum");
    assert_eq!(na.flags, NA_SOLICITED_OVERRIDE);

    // Unicast NS (neighbour unreachability detection) without a source link-layer option.
    let mut unicast = ns(ANNOUNCED_V6);
    unicast.eth_dst = OUR_MAC;
    unicast.dst = ANNOUNCED_V6;
    unicast.lladdr_option = None;
    let out = h.run(&unicast.to_bytes());
    assert_eq!(out, Outcome::Reply(expected_na(&unicast)));
    assert_eq!(h.stat(ResponderStat::NdpReplies), 4);
}

#[test]
fn odd_or_malformed_solicitations_pass_untouched() {
    let mut h = Harness::new();
    let valid = ns(ANNOUNCED_V6);
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    cases.push((
        "NS for an unannounced address",
        ns("2001:db8::99".parse().unwrap()).to_bytes(),
    ));
    let mut dad = valid;
    dad.src = Ipv6Addr::UNSPECIFIED;
    dad.lladdr_option = None;
    cases.push(("duplicate address detection", dad.to_bytes()));
    let mut hop = valid;
    hop.hop_limit = 64;
    cases.push(("hop limit not 255", hop.to_bytes()));
    let mut wrong_group = valid;
    wrong_group.dst = "ff02::1:ff00:1".parse().unwrap();
    cases.push((
        "solicited-node group of another address",
        wrong_group.to_bytes(),
    ));
    let mut no_option_multicast = valid;
    no_option_multicast.lladdr_option = None;
    cases.push((
        "multicast NS without source link-layer option",
        no_option_multicast.to_bytes(),
    ));
    // Found by the etherparse oracle: a version field other than 6 is not IPv6 at all.
    let mut not_v6 = valid.to_bytes();
    not_v6[14] = 0x70 | (not_v6[14] & 0x0f);
    cases.push(("IP version 7 behind the IPv6 ethertype", not_v6));
    let mut nonce = valid;
    nonce.lladdr_option = Some((14, [1, 2, 3, 4, 5, 6]));
    cases.push(("NS with a nonce option instead", nonce.to_bytes()));
    let mut advert = valid;
    advert.icmp_type = ICMPV6_NA;
    cases.push(("neighbour advertisement", advert.to_bytes()));
    let mut bad_sum = valid.to_bytes();
    bad_sum[56] ^= 0x01;
    cases.push(("bad checksum", bad_sum));
    let mut bad_code = valid.to_bytes();
    bad_code[55] = 1;
    cases.push(("ICMPv6 code not 0", bad_code));
    let mut other_station = valid;
    other_station.eth_dst = [0x33, 0x33, 0xff, 0, 0, 1];
    cases.push((
        "Ethernet group of another address",
        other_station.to_bytes(),
    ));
    let mut not_icmp = valid.to_bytes();
    not_icmp[20] = 17;
    cases.push(("IPv6 UDP", not_icmp));
    for len in 14..86 {
        cases.push(("truncated NS", valid.to_bytes()[..len].to_vec()));
    }
    assert_eq!(valid.icmp_type, ICMPV6_NS);
    for (name, frame) in cases {
        assert_eq!(h.run(&frame), Outcome::Pass, "{name} must pass untouched");
    }
    assert_eq!(h.stat(ResponderStat::NdpReplies), 0);
}

#[test]
fn stale_heartbeat_silences_the_responder_and_fresh_one_revives_it() {
    let mut h = Harness::new();
    let req = arp_request(ANNOUNCED_V4).to_bytes();
    let solicitation = ns(ANNOUNCED_V6).to_bytes();

    // A deadline long past (jiffies start far above 1): silent.
    let mut config = h.datapath.responder().config().unwrap();
    config.deadline_jiffies = 1;
    h.datapath.responder().write_config(config).unwrap();
    assert_eq!(h.run(&req), Outcome::Pass);
    assert_eq!(h.run(&solicitation), Outcome::Pass);
    assert_eq!(h.stat(ResponderStat::StaleSkipped), 4);

    // Never written: silent too.
    h.datapath
        .responder()
        .write_config(ResponderConfig::default())
        .unwrap();
    assert_eq!(h.run(&req), Outcome::Pass);

    h.datapath
        .heartbeat(std::time::Duration::from_secs(3))
        .unwrap();
    assert_eq!(h.check(&req), Outcome::Reply(expected_arp_reply(&req)));
    assert!(matches!(h.run(&solicitation), Outcome::Reply(_)));
}

#[test]
fn withdrawn_ip_is_no_longer_answered() {
    let mut h = Harness::new();
    let req = arp_request(ANNOUNCED_V4).to_bytes();
    assert!(matches!(h.run(&req), Outcome::Reply(_)));
    h.datapath
        .responder()
        .withdraw(IpAddr::V4(ANNOUNCED_V4), LO)
        .unwrap();
    assert_eq!(h.run(&req), Outcome::Pass);
    // Announced on another interface only: not answered on this one.
    h.datapath
        .responder()
        .announce(IpAddr::V4(ANNOUNCED_V4), LO + 1000, OUR_MAC)
        .unwrap();
    assert_eq!(h.run(&req), Outcome::Pass);
}

/// Random frames, and valid requests with random bytes changed: the programs never abort, pass
/// anything they do not answer untouched, and every reply is the exact reply to a valid request
/// for an announced IP.
#[test]
fn randomised_frames_are_never_answered_wrongly() {
    let mut h = Harness::new();
    let seed = 0x1b5e_ed00_u64 ^ u64::from(std::process::id());
    let mut rng = StdRng::seed_from_u64(seed);
    // Shown when the test fails: the seed replays the run.
    eprintln!("seed {seed:#x}");
    let arp = arp_request(ANNOUNCED_V4).to_bytes();
    let nd = ns(ANNOUNCED_V6).to_bytes();
    let mut replies = 0;
    for i in 0..4000 {
        let frame = match i % 4 {
            0 => {
                let mut f = vec![0u8; 14 + rng.random_range(0..100)];
                rng.fill_bytes(&mut f);
                let ethertype: u16 = [0x0806, 0x86dd, 0x8100, 0x0800][rng.random_range(0..4)];
                f[12..14].copy_from_slice(&ethertype.to_be_bytes());
                f
            }
            1 | 2 => {
                let mut f = if i % 4 == 1 { arp.clone() } else { nd.clone() };
                for _ in 0..=rng.random_range(0..3) {
                    let at = rng.random_range(0..f.len());
                    f[at] = rng.next_u64() as u8;
                }
                f
            }
            _ => {
                let f = if rng.random_range(0..2) == 0 {
                    arp.clone()
                } else {
                    nd.clone()
                };
                f[..14 + rng.random_range(0..f.len() - 13)].to_vec()
            }
        };
        if let Outcome::Reply(_) = h.check(&frame) {
            replies += 1;
        }
    }
    // Mutations that leave a request valid (e.g. a changed sender MAC) are answered: the test
    // exercised the reply path, not only the pass path.
    assert!(replies > 0, "seed {seed:#x}: no frame was answered");
}

/// An upgrade from a version whose liveness gate had another layout: the daemon replaces the
/// pinned gate (it holds nothing worth keeping) instead of refusing to start.
#[test]
fn a_liveness_gate_pinned_by_an_older_version_is_replaced() {
    let root = ipam_tests::BpffsRoot::new();
    let maps = root.0.join("maps");
    std::fs::create_dir_all(&maps).unwrap();
    let gate = maps.join("L2_RESPONDER_CONFIG");
    let gate = gate.to_str().unwrap();
    // The 0.1 layout: heartbeat and staleness in nanoseconds, 16 bytes.
    ipam_tests::run(
        "bpftool",
        &[
            "map",
            "create",
            gate,
            "type",
            "array",
            "key",
            "4",
            "value",
            "16",
            "entries",
            "1",
            "name",
            "L2_RESPONDER_C",
        ],
    );
    let mut datapath = ipam_datapath::Datapath::open(&root.0)
        .expect("an outdated liveness gate does not stop the datapath from loading");
    datapath
        .heartbeat(std::time::Duration::from_secs(3))
        .unwrap();
    let shown: serde_json::Value = serde_json::from_str(&ipam_tests::run(
        "bpftool",
        &["--json", "map", "show", "pinned", gate],
    ))
    .unwrap();
    assert_eq!(shown["bytes_value"], 32, "{shown}");
    assert!(datapath.responder().config().unwrap().deadline_jiffies > 0);
}

/// A TCP segment from the client to `dst`, port 80, from `port`, with `syn`/`ack` flags, sent
/// from `src_mac` to this node's MAC.
fn tcp_segment(src_mac: [u8; 6], dst: IpAddr, port: u16, syn: bool, ack: bool) -> Vec<u8> {
    let builder = etherparse::PacketBuilder::ethernet2(src_mac, OUR_MAC);
    let builder = match dst {
        IpAddr::V4(dst) => builder.ipv4(CLIENT_V4.octets(), dst.octets(), 64),
        IpAddr::V6(dst) => builder.ipv6(CLIENT_V6.octets(), dst.octets(), 64),
    };
    let mut builder = builder.tcp(port, 80, 1000, 64_000);
    if syn {
        builder = builder.syn();
    }
    if ack {
        builder = builder.ack(1);
    }
    let payload = if syn {
        &[][..]
    } else {
        b"GET / HTTP/1.1\r\n\r\n"
    };
    let mut frame = Vec::with_capacity(builder.size(payload.len()));
    builder.write(&mut frame, payload).unwrap();
    frame
}

/// After an IP moved here from a node that still runs (`L2_HANDOVER`), the segments of
/// connections not opened here go on to the old owner's MAC, rewritten in the Ethernet header
/// only; a connection opened here (its SYN seen) stays, and so does everything else.
#[test]
fn connections_an_ip_s_old_owner_holds_are_passed_on_to_it() {
    const OLD_OWNER: [u8; 6] = [0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0x02];
    let mut h = Harness::new();
    let until = |from_now: i64| {
        (ipam_datapath::clock::monotonic_ns() as i64 + from_now * 1_000_000_000) as u64
    };
    let passed_on = |frame: &[u8]| {
        let mut out = frame.to_vec();
        out[0..6].copy_from_slice(&OLD_OWNER);
        out[6..12].copy_from_slice(&OUR_MAC);
        Outcome::Reply(out)
    };
    for ip in [IpAddr::V4(ANNOUNCED_V4), IpAddr::V6(ANNOUNCED_V6)] {
        let old = tcp_segment(CLIENT_MAC, ip, 40_000, false, true);
        // No hand-over: the kernel's.
        assert_eq!(h.run(&old), Outcome::Pass, "{ip}");
        h.datapath
            .responder()
            .hand_over(ip, LO, OLD_OWNER, until(10))
            .unwrap();
        assert_eq!(
            h.run(&old),
            passed_on(&old),
            "{ip}: a connection opened there"
        );
        // A connection opened here: its SYN stays, and so do its later segments.
        let syn = tcp_segment(CLIENT_MAC, ip, 40_001, true, false);
        assert_eq!(h.run(&syn), Outcome::Pass, "{ip}: a SYN");
        let mine = tcp_segment(CLIENT_MAC, ip, 40_001, false, true);
        assert_eq!(
            h.run(&mine),
            Outcome::Pass,
            "{ip}: a connection opened here"
        );
        // Never back to the old owner's own frames.
        let from_old = tcp_segment(OLD_OWNER, ip, 40_000, false, true);
        assert_eq!(h.run(&from_old), Outcome::Pass, "{ip}: from the old owner");
        // Once the hand-over is over, or ended, the kernel's again.
        h.datapath
            .responder()
            .hand_over(ip, LO, OLD_OWNER, until(-1))
            .unwrap();
        assert_eq!(h.run(&old), Outcome::Pass, "{ip}: after its time");
        h.datapath
            .responder()
            .hand_over(ip, LO, OLD_OWNER, until(10))
            .unwrap();
        assert!(h.datapath.responder().handover_gate_open().unwrap());
        h.datapath.responder().end_handover(ip, LO).unwrap();
        assert_eq!(h.run(&old), Outcome::Pass, "{ip}: ended");
        assert!(
            !h.datapath.responder().handover_gate_open().unwrap(),
            "{ip}: the last hand-over ended, segments skip the lookup"
        );
    }
    // A node that does not answer for the IP passes nothing on (the old owner itself).
    let other = IpAddr::V4(OTHER_V4);
    h.datapath
        .responder()
        .hand_over(other, LO, OLD_OWNER, until(10))
        .unwrap();
    let old = tcp_segment(CLIENT_MAC, other, 40_000, false, true);
    assert_eq!(h.run(&old), Outcome::Pass, "not answered here");
    // A SYN seen while this node answered for the IP, before any hand-over, keeps its
    // connection here when the IP comes back with one (moved away and back within the linger).
    let ip = IpAddr::V4(ANNOUNCED_V4);
    assert_eq!(
        h.run(&tcp_segment(CLIENT_MAC, ip, 40_002, true, false)),
        Outcome::Pass
    );
    h.datapath
        .responder()
        .hand_over(ip, LO, OLD_OWNER, until(10))
        .unwrap();
    let earlier = tcp_segment(CLIENT_MAC, ip, 40_002, false, true);
    assert_eq!(
        h.run(&earlier),
        Outcome::Pass,
        "opened here before the move"
    );
}
