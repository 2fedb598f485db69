//! eBPF programs of the IPAM datapath.
//!
//! `l2_responder` answers ARP requests and IPv6 neighbour solicitations for announced IPs. Its
//! logic is written once (`l2_responder::respond`) and attached in two forms: XDP, for NICs with
//! native XDP, and TC ingress, for veth and other virtual devices where TC measured faster.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod l2_responder;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod packet;

#[cfg(target_arch = "bpf")]
mod programs {
    use aya_ebpf::{
        bindings::{TC_ACT_OK, xdp_action},
        helpers::bpf_redirect,
        macros::{classifier, xdp},
        programs::{TcContext, XdpContext},
    };

    use crate::{
        l2_responder::{self, Verdict},
        packet::Frame,
    };

    /// Longest prefix of a frame the responder reads: Ethernet + IPv6 + NS with one option.
    const RESPONDER_HEADROOM: u32 = 14 + 40 + 32;

    #[xdp]
    pub fn l2_responder_xdp(ctx: XdpContext) -> u32 {
        let mut frame = Frame::new(ctx.data(), ctx.data_end());
        match l2_responder::respond(&mut frame, ctx.ingress_ifindex() as u32) {
            Verdict::Pass => xdp_action::XDP_PASS,
            Verdict::Reply => xdp_action::XDP_TX,
        }
    }

    #[classifier]
    pub fn l2_responder_tc(ctx: TcContext) -> i32 {
        // A frame split over pages would hide its headers from direct access: pull the few bytes
        // the responder reads into the linear area, only in the rare case they are not there yet.
        let linear = (ctx.data_end() - ctx.data()) as u32;
        if linear < RESPONDER_HEADROOM && ctx.len() > linear {
            let want = if ctx.len() < RESPONDER_HEADROOM {
                ctx.len()
            } else {
                RESPONDER_HEADROOM
            };
            if ctx.pull_data(want).is_err() {
                return TC_ACT_OK as i32;
            }
        }
        // SAFETY: `skb` is the context pointer the kernel passed to this program.
        let ifindex = unsafe { (*ctx.skb.skb).ifindex };
        let mut frame = Frame::new(ctx.data(), ctx.data_end());
        match l2_responder::respond(&mut frame, ifindex) {
            Verdict::Pass => TC_ACT_OK as i32,
            // Send the rewritten frame back out of the interface it came in on.
            // SAFETY: plain helper call; flags 0 means egress.
            Verdict::Reply => unsafe { bpf_redirect(ifindex, 0) as i32 },
        }
    }
}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic path, so this is never executed.
    loop {}
}

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!(
        "ipam-ebpf only builds for the bpfel-unknown-none target; see `cargo xtask build-ebpf`"
    );
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
