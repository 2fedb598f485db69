//! The userspace ARP and NDP frame parsers: arbitrary frames never panic, and what parses prints
//! back to a frame that parses to the same thing.
#![no_main]

use ipam_daemon::net::frames::{ArpFrame, NdpFrame};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(arp) = ArpFrame::parse(data) {
        assert_eq!(ArpFrame::parse(&arp.to_bytes()), Some(arp));
    }
    if let Some(nd) = NdpFrame::parse(data) {
        let again = NdpFrame::parse(&nd.to_bytes()).expect("printed NDP frame parses");
        assert_eq!(
            (again.src, again.dst, again.target),
            (nd.src, nd.dst, nd.target)
        );
        assert_eq!(
            (again.icmp_type, again.lladdr_option),
            (nd.icmp_type, nd.lladdr_option)
        );
        assert!(again.checksum_valid(), "to_bytes writes a valid checksum");
    }
});
