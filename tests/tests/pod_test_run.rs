//! The pod datapath's decisions, packet by packet, through `BPF_PROG_TEST_RUN`: local delivery
//! (rewritten headers, TTL and a checksum that verifies), anti-spoofing, what is left to the
//! kernel untouched, and the replies that must take the kernel because their requests did.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipam_common::pod::{PodEndpoint, PodStat};
use ipam_datapath::{Datapath, PodProgram, RouteTarget};
use ipam_tests::BpffsRoot;

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;
const TC_ACT_REDIRECT: u32 = 7;

/// `BPF_PROG_TEST_RUN` runs the program as if the packet arrived on loopback: pod A "lives" there.
const LO: u32 = 1;
const A_V4: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 5);
const B_V4: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 6);
const A_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 9, 0, 0, 0, 0, 0, 5);
const B_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 9, 0, 0, 0, 0, 0, 6);
const B_HOST_IFINDEX: u32 = 4242;
/// A pod of another node (its block is in the route map).
const R_V4: Ipv4Addr = Ipv4Addr::new(10, 8, 0, 7);
const R_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 8, 0, 0, 0, 0, 0, 7);
/// Another host (not a pod anywhere).
const HOST_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
const A_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
const B_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
const HOST_A_MAC: [u8; 6] = [0x02, 0, 0, 0, 1, 0x0a];
const HOST_B_MAC: [u8; 6] = [0x02, 0, 0, 0, 1, 0x0b];

struct Harness {
    datapath: Datapath,
    _root: BpffsRoot,
}

impl Harness {
    fn new() -> Self {
        let root = BpffsRoot::new();
        let mut datapath = Datapath::open(&root.0).expect("load datapath");
        let a = PodEndpoint {
            host_ifindex: LO,
            pod_mac: A_MAC,
            host_mac: HOST_A_MAC,
        };
        let b = PodEndpoint {
            host_ifindex: B_HOST_IFINDEX,
            pod_mac: B_MAC,
            host_mac: HOST_B_MAC,
        };
        let maps = datapath.pods();
        for (ip, e) in [
            (IpAddr::V4(A_V4), a),
            (IpAddr::V6(A_V6), a),
            (IpAddr::V4(B_V4), b),
            (IpAddr::V6(B_V6), b),
        ] {
            maps.insert(ip, e).unwrap();
        }
        for (cidr, next_hop) in [
            ("10.8.0.0/24", IpAddr::V4(Ipv4Addr::new(192, 0, 2, 8))),
            ("fd00:8::/64", IpAddr::V6("2001:db8::8".parse().unwrap())),
        ] {
            let target = RouteTarget {
                next_hop,
                uplink_ifindex: LO,
            };
            datapath
                .routes()
                .insert(cidr.parse().unwrap(), target)
                .unwrap();
        }
        Self {
            datapath,
            _root: root,
        }
    }

    fn run(&mut self, program: PodProgram, frame: &[u8]) -> (u32, Vec<u8>) {
        ipam_tests::test_run(self.datapath.pod_program(program), frame)
    }

    fn stat(&mut self, stat: PodStat) -> u64 {
        self.datapath.pods().stats().unwrap().get(stat)
    }
}

fn ones_complement_sum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Ethernet (pod A → its gateway) + IPv4 header (checksummed) + 8 bytes of ICMP echo.
fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, ttl: u8) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&HOST_A_MAC);
    f.extend_from_slice(&A_MAC);
    f.extend_from_slice(&[0x08, 0x00]);
    let mut ip = vec![0x45, 0, 0, 28, 0x12, 0x34, 0x40, 0, ttl, 1, 0, 0];
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    let check = !ones_complement_sum(&ip);
    ip[10..12].copy_from_slice(&check.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&[8, 0, 0xf7, 0xff, 0, 0, 0, 0]);
    f
}

/// Ethernet + IPv4 header + a TCP header from `src`:`sport` to `dst`:`dport` (the datapath
/// reads its ports, never its checksum).
fn tcp4(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    let mut f = ipv4(src, dst, 64);
    f.truncate(14 + 20);
    f[14 + 3] = 40;
    f[14 + 9] = 6;
    f[14 + 10..14 + 12].copy_from_slice(&[0, 0]);
    let check = !ones_complement_sum(&f[14..34]);
    f[14 + 10..14 + 12].copy_from_slice(&check.to_be_bytes());
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
    f
}

/// Ethernet + IPv6 header + 8 bytes of ICMPv6 echo (checksum not checked by the datapath).
fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, hop_limit: u8) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&HOST_A_MAC);
    f.extend_from_slice(&A_MAC);
    f.extend_from_slice(&[0x86, 0xdd]);
    f.extend_from_slice(&[0x60, 0, 0, 0, 0, 8, 58, hop_limit]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&[128, 0, 0, 0, 0, 1, 0, 1]);
    f
}

#[test]
fn packets_for_a_local_pod_are_delivered_with_rewritten_headers() {
    let mut h = Harness::new();
    let before = h.stat(PodStat::Delivered);
    // From pod A on this node, and from pod R on another node through the uplink.
    for (program, v4, v6) in [
        (PodProgram::FromContainer, A_V4, A_V6),
        (PodProgram::FromUplink, R_V4, R_V6),
    ] {
        let frame = ipv4(v4, B_V4, 64);
        let (verdict, out) = h.run(program, &frame);
        assert_eq!(verdict, TC_ACT_REDIRECT, "{program:?}");
        assert_eq!(out[0..6], B_MAC, "to the pod's MAC");
        assert_eq!(out[6..12], HOST_B_MAC, "from its gateway's MAC");
        assert_eq!(out[14 + 8], 63, "TTL decremented");
        assert_eq!(
            ones_complement_sum(&out[14..34]),
            0xffff,
            "the IPv4 header checksum still verifies"
        );
        assert_eq!(out[34..], frame[34..], "payload untouched");

        let (verdict, out) = h.run(program, &ipv6(v6, B_V6, 64));
        assert_eq!(verdict, TC_ACT_REDIRECT);
        assert_eq!(out[0..6], B_MAC);
        assert_eq!(out[6..12], HOST_B_MAC);
        assert_eq!(out[14 + 7], 63, "hop limit decremented");
    }
    assert_eq!(h.stat(PodStat::Delivered), before + 4);
}

#[test]
fn spoofed_sources_are_dropped_and_counted() {
    let mut h = Harness::new();
    let cases = [
        ipv4(Ipv4Addr::new(10, 9, 0, 99), B_V4, 64),
        // Another pod's address, sent from pod A's veth.
        ipv4(B_V4, Ipv4Addr::new(10, 9, 0, 1), 64),
        ipv4(Ipv4Addr::UNSPECIFIED, Ipv4Addr::BROADCAST, 64),
        ipv6(Ipv6Addr::new(0xfd00, 9, 0, 0, 0, 0, 0, 99), B_V6, 64),
        ipv6(B_V6, A_V6, 64),
        // A link-local source to a global destination leaves the link: not allowed either.
        ipv6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 5), B_V6, 64),
    ];
    for (i, frame) in cases.iter().enumerate() {
        let before = h.stat(PodStat::SpoofDropped);
        let (verdict, _) = h.run(PodProgram::FromContainer, frame);
        assert_eq!(verdict, TC_ACT_SHOT, "case {i}");
        assert_eq!(h.stat(PodStat::SpoofDropped), before + 1, "case {i}");
    }
    // The uplink program does not judge sources: traffic from other hosts is not a pod's (it
    // takes the stack, which answers for it).
    let (verdict, _) = h.run(PodProgram::FromUplink, &cases[0]);
    assert_eq!(verdict, TC_ACT_OK);
}

/// What another host sends a local pod (kube-proxy's forwarded Service traffic, a node's own
/// request) takes the stack, so that the pod's reply, which takes it too, meets a conntrack
/// entry; a request the stack delivered to a pod, or routed from one to another node's pod, has
/// its replies sent through the stack rather than straight to the pod that asked.
#[test]
fn replies_take_the_stack_when_their_requests_did() {
    let mut h = Harness::new();
    let from_host = tcp4(HOST_V4, 40000, B_V4, 80);
    let (verdict, out) = h.run(PodProgram::FromUplink, &from_host);
    assert_eq!(verdict, TC_ACT_OK, "another host's packet takes the stack");
    assert_eq!(out, from_host, "untouched");

    // Remote pod R asked pod A (on this node) through the stack, after a DNAT say: A's reply
    // takes the stack, A's other flows to R still go straight out.
    assert_eq!(
        h.run(PodProgram::ToContainer, &tcp4(R_V4, 40001, A_V4, 8080))
            .0,
        TC_ACT_OK
    );
    let reply = tcp4(A_V4, 8080, R_V4, 40001);
    let (verdict, out) = h.run(PodProgram::FromContainer, &reply);
    assert_eq!(verdict, TC_ACT_OK, "the reply takes the stack");
    assert_eq!(out, reply, "untouched (TTL too)");
    let other = tcp4(A_V4, 8080, R_V4, 40002);
    assert_eq!(
        h.run(PodProgram::FromContainer, &other).0,
        TC_ACT_REDIRECT,
        "another flow is forwarded straight to R's node"
    );

    // Pod A asked a Service that the stack DNATed to remote pod R: R's reply comes in on the
    // uplink and takes the stack (which undoes the DNAT); R's other packets go straight to A.
    assert_noted_flow_takes_the_stack(
        &mut h,
        (PodProgram::ToUplink, &tcp4(A_V4, 50000, R_V4, 53)),
        PodProgram::FromUplink,
        &tcp4(R_V4, 53, A_V4, 50000),
        &tcp4(R_V4, 53, A_V4, 50001),
    );

    // Pod B asked a Service that the stack DNATed to pod A, both on this node: A's reply, which
    // would otherwise be handed straight to B, takes the stack as well.
    assert_noted_flow_takes_the_stack(
        &mut h,
        (PodProgram::ToContainer, &tcp4(B_V4, 40003, A_V4, 8080)),
        PodProgram::FromContainer,
        &tcp4(A_V4, 8080, B_V4, 40003),
        &tcp4(A_V4, 8080, B_V4, 40004),
    );

    // What the stack sends a pod from another host is not noted: its reply goes to a host,
    // through the stack anyway.
    assert_eq!(
        h.run(PodProgram::ToContainer, &tcp4(HOST_V4, 40005, A_V4, 8080))
            .0,
        TC_ACT_OK
    );
}

/// The stack passed `request` to `program` (a flow the programs note), so its `reply`, seen by
/// `back`, takes the stack too, while `other`, a flow on the same path that was not noted, is
/// redirected.
fn assert_noted_flow_takes_the_stack(
    h: &mut Harness,
    (program, request): (PodProgram, &[u8]),
    back: PodProgram,
    reply: &[u8],
    other: &[u8],
) {
    assert_eq!(
        h.run(program, request).0,
        TC_ACT_OK,
        "{program:?}: the request"
    );
    assert_eq!(h.run(back, reply).0, TC_ACT_OK, "{back:?}: its reply");
    assert_eq!(
        h.run(back, other).0,
        TC_ACT_REDIRECT,
        "{back:?}: another flow"
    );
}

#[test]
fn everything_else_goes_to_the_kernel_untouched() {
    let mut h = Harness::new();
    let mut ndp = ipv6(
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 5),
        "ff02::1:ff00:1".parse().unwrap(),
        255,
    );
    ndp[14 + 40] = 135;
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&A_MAC);
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    arp.extend_from_slice(&A_MAC);
    arp.extend_from_slice(&A_V4.octets());
    arp.extend_from_slice(&[0; 6]);
    arp.extend_from_slice(&[10, 9, 0, 1]);
    let cases = [
        ("to the host", ipv4(A_V4, Ipv4Addr::new(10, 9, 0, 1), 64)),
        (
            "to another network",
            ipv4(A_V4, Ipv4Addr::new(192, 0, 2, 1), 64),
        ),
        ("TTL would expire", ipv4(A_V4, B_V4, 1)),
        (
            "v6 to the host",
            ipv6(A_V6, "fd00:9::1".parse().unwrap(), 64),
        ),
        ("v6 hop limit would expire", ipv6(A_V6, B_V6, 1)),
        ("neighbour solicitation", ndp),
        ("ARP", arp),
    ];
    for (what, frame) in &cases {
        let (verdict, out) = h.run(PodProgram::FromContainer, frame);
        assert_eq!(verdict, TC_ACT_OK, "{what}");
        assert_eq!(&out, frame, "{what}: passed unmodified");
    }
    // Not IP, not ARP, from a pod: dropped.
    let mut lldp = cases[0].1.clone();
    lldp[12..14].copy_from_slice(&[0x88, 0xcc]);
    let before = h.stat(PodStat::UnsupportedDropped);
    assert_eq!(h.run(PodProgram::FromContainer, &lldp).0, TC_ACT_SHOT);
    assert_eq!(h.stat(PodStat::UnsupportedDropped), before + 1);
    // ... but left alone on the uplink, which is the host's.
    assert_eq!(h.run(PodProgram::FromUplink, &lldp).0, TC_ACT_OK);
}
