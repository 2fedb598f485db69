//! The L2 responder under BPF_PROG_TEST_RUN: both attach forms run every frame, must agree,
//! must pass what they do not answer untouched, and must answer exactly right. Shared by the
//! test-run tests and the fuzz target that feeds it generated frames.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipam_common::l2::ResponderStat;
use ipam_daemon::net::frames::{
    ARP_REPLY, ArpFrame, ICMPV6_NA, ICMPV6_NS, NA_SOLICITED_OVERRIDE, NdpFrame,
};
use ipam_datapath::Datapath;

use crate::{BpffsRoot, oracle, test_run};

pub const XDP_ABORTED: u32 = 0;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
/// `TC_ACT_UNSPEC`, tcx's "next program": what the TC form returns for a frame it leaves alone,
/// so the programs after it on the interface (the pod datapath's) still run.
pub const TCX_NEXT: u32 = -1i32 as u32;
pub const TC_ACT_REDIRECT: u32 = 7;

/// `BPF_PROG_TEST_RUN` runs the program as if the frame arrived on loopback.
pub const LO: u32 = 1;
pub const OUR_MAC: [u8; 6] = [0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0x01];
pub const CLIENT_MAC: [u8; 6] = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
pub const ANNOUNCED_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
pub const OTHER_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 11);
pub const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
pub const ANNOUNCED_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0xabcd, 0x10);
pub const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);

pub struct Harness {
    pub datapath: Datapath,
    _root: BpffsRoot,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Reply(Vec<u8>),
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    pub fn new() -> Self {
        Self::in_root(BpffsRoot::new())
    }

    /// A harness with its pins under `root`, which it removes when dropped.
    pub fn in_root(root: BpffsRoot) -> Self {
        let mut datapath = Datapath::open(&root.0).expect("load datapath");
        let maps = datapath.responder();
        maps.announce(IpAddr::V4(ANNOUNCED_V4), LO, OUR_MAC)
            .unwrap();
        maps.announce(IpAddr::V6(ANNOUNCED_V6), LO, OUR_MAC)
            .unwrap();
        datapath
            .heartbeat(std::time::Duration::from_secs(60))
            .unwrap();
        Self {
            datapath,
            _root: root,
        }
    }

    /// Runs `frame` through both forms, checks they agree, and returns the common outcome.
    pub fn run(&mut self, frame: &[u8]) -> Outcome {
        let xdp = self.run_xdp(frame);
        if !skb_harness_refuses(frame) {
            let tc = self.run_tc(frame);
            assert_eq!(xdp, tc, "XDP and TC disagree on frame {frame:02x?}");
        }
        xdp
    }

    /// Runs `frame` as `run` does and, when it is answered, checks the answer: the frame must be
    /// a valid request for an announced IP, the reply exactly the one expected, and the
    /// independent oracle (etherparse) must accept it. Panics on any violation, so tests and the
    /// fuzzer catch it alike.
    pub fn check(&mut self, frame: &[u8]) -> Outcome {
        let outcome = self.run(frame);
        if let Outcome::Reply(out) = &outcome {
            if let Some(req) = ArpFrame::parse(frame) {
                assert_eq!(req.op, 1, "answered a non-request {frame:02x?}");
                assert_eq!(req.target_ip, ANNOUNCED_V4, "answered for another IP");
                assert_eq!(
                    out,
                    &expected_arp_reply(frame),
                    "wrong reply to {frame:02x?}"
                );
                oracle::check_arp_reply(frame, out, OUR_MAC)
                    .unwrap_or_else(|e| panic!("oracle refuses the reply to {frame:02x?}: {e}"));
            } else {
                let req = NdpFrame::parse(frame)
                    .unwrap_or_else(|| panic!("answered a frame that asks nothing: {frame:02x?}"));
                assert!(
                    req.checksum_valid() && req.icmp_type == ICMPV6_NS,
                    "answered an invalid solicitation {frame:02x?}"
                );
                assert_eq!(req.target, ANNOUNCED_V6, "answered for another IP");
                assert_eq!(out, &expected_na(&req), "wrong reply to {frame:02x?}");
                oracle::check_neighbour_advertisement(frame, out, OUR_MAC)
                    .unwrap_or_else(|e| panic!("oracle refuses the reply to {frame:02x?}: {e}"));
            }
        }
        outcome
    }

    fn run_xdp(&mut self, frame: &[u8]) -> Outcome {
        let (verdict, out) = test_run(self.datapath.responder_xdp(), frame);
        match verdict {
            XDP_PASS => {
                assert_eq!(out, frame, "XDP passed a modified frame");
                Outcome::Pass
            }
            XDP_TX => Outcome::Reply(out),
            XDP_ABORTED => panic!("XDP_ABORTED on frame {frame:02x?}"),
            other => panic!("unexpected XDP verdict {other} on frame {frame:02x?}"),
        }
    }

    fn run_tc(&mut self, frame: &[u8]) -> Outcome {
        let (verdict, out) = test_run(self.datapath.responder_tc(), frame);
        match verdict {
            TCX_NEXT => {
                assert_eq!(out, frame, "TC passed a modified frame");
                Outcome::Pass
            }
            TC_ACT_REDIRECT => Outcome::Reply(out),
            other => panic!("unexpected TC verdict {other} on frame {frame:02x?}"),
        }
    }

    pub fn stat(&mut self, stat: ResponderStat) -> u64 {
        self.datapath.responder().stats().unwrap().get(stat)
    }
}

/// One `BPF_PROG_TEST_RUN` of `program` on `frame`: the verdict and the frame as it left.
/// The kernel's skb test harness (not our program) rejects IPv4/IPv6 frames too short for an IP
/// header with EINVAL. Those frames still run through the same responder logic in XDP form.
pub fn skb_harness_refuses(frame: &[u8]) -> bool {
    match frame.get(12..14).map(|t| u16::from_be_bytes([t[0], t[1]])) {
        None => true,
        Some(0x0800) => frame.len() < 14 + 20,
        Some(0x86dd) => frame.len() < 14 + 40,
        Some(_) => false,
    }
}

pub fn arp_request(target: Ipv4Addr) -> ArpFrame {
    ArpFrame::request(CLIENT_MAC, CLIENT_V4, target)
}

/// The exact reply the responder must produce for `req`, keeping any Ethernet padding.
pub fn expected_arp_reply(req: &[u8]) -> Vec<u8> {
    let r = ArpFrame::parse(req).expect("a request");
    let mut reply = ArpFrame {
        eth_dst: r.sender_mac,
        eth_src: OUR_MAC,
        op: ARP_REPLY,
        sender_mac: OUR_MAC,
        sender_ip: r.target_ip,
        target_mac: r.sender_mac,
        target_ip: r.sender_ip,
    }
    .to_bytes();
    reply.extend_from_slice(&req[42..]);
    reply
}

pub fn ns(target: Ipv6Addr) -> NdpFrame {
    NdpFrame::solicitation(CLIENT_MAC, CLIENT_V6, target)
}

pub fn expected_na(req: &NdpFrame) -> Vec<u8> {
    NdpFrame {
        eth_dst: req.eth_src,
        eth_src: OUR_MAC,
        src: req.target,
        dst: req.src,
        hop_limit: 255,
        icmp_type: ICMPV6_NA,
        flags: NA_SOLICITED_OVERRIDE,
        target: req.target,
        lladdr_option: req.lladdr_option.map(|_| (2, OUR_MAC)),
        checksum: 0,
    }
    .to_bytes()
}
