//! eBPF programs of the IPAM datapath.
//!
//! `l2_responder` answers ARP requests and IPv6 neighbour solicitations for announced IPs. Its
//! logic is written once (`l2_responder::respond`) and attached in two forms: XDP, for NICs with
//! native XDP, and TC ingress, for veth and other virtual devices where TC measured faster.
//!
//! `pod_datapath` routes pod traffic at TC: `pod_from_container` (ingress) and
//! `pod_to_container` (egress) on each pod's host-side veth, `pod_from_uplink` (ingress) and
//! `pod_to_uplink` (egress) on the node's uplink.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod l2_responder;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod packet;
#[cfg(target_arch = "bpf")]
mod pod_datapath;

#[cfg(target_arch = "bpf")]
mod programs {
    use aya_ebpf::{
        bindings::{TC_ACT_OK, TC_ACT_SHOT, TC_ACT_UNSPEC, bpf_redir_neigh, xdp_action},
        helpers::{bpf_redirect, bpf_redirect_neigh, bpf_redirect_peer},
        macros::{classifier, xdp},
        programs::{TcContext, XdpContext},
    };

    use ipam_common::pod::FORWARDED_MARK;

    use crate::{
        l2_responder::{self, Verdict},
        packet::Frame,
        pod_datapath,
    };

    /// Longest prefix of a frame the responder reads: Ethernet + IPv6 + NS with one option, or
    /// Ethernet + IPv4 with options + the start of TCP (a hand-over).
    const RESPONDER_HEADROOM: u32 = 14 + 60 + 14;

    #[xdp]
    pub fn l2_responder_xdp(ctx: XdpContext) -> u32 {
        let mut frame = Frame::new(ctx.data(), ctx.data_end());
        match l2_responder::respond(&mut frame, ctx.ingress_ifindex() as u32) {
            Verdict::Pass => xdp_action::XDP_PASS,
            Verdict::Reply | Verdict::HandOn => xdp_action::XDP_TX,
        }
    }

    /// The daemon's heartbeat (`BPF_PROG_TEST_RUN` only; never attached).
    #[xdp]
    pub fn l2_heartbeat(_ctx: XdpContext) -> u32 {
        l2_responder::heartbeat();
        xdp_action::XDP_PASS
    }

    /// What the responder returns for every frame it does not answer: the next program of the
    /// interface's tcx chain runs (the pod datapath's `pod_from_uplink` on a shared uplink),
    /// and with none left the frame goes up the stack. `TC_ACT_OK` would end the chain there:
    /// on a node answering for a Service IP, the uplink's pod program would never run, and
    /// replies to its pods' requests would meet kube-proxy's INVALID drop in the stack (found
    /// on the real-cluster lab after a node's return).
    const TCX_NEXT: i32 = TC_ACT_UNSPEC;

    #[classifier]
    pub fn l2_responder_tc(ctx: TcContext) -> i32 {
        // The kernel moves an 802.1Q/802.1ad tag into the skb's metadata before TC runs, so the
        // frame below would look untagged. A tagged request belongs to the VLAN, not to this
        // interface: pass it, as the XDP form (which sees the tag in the frame) does.
        // SAFETY: `skb` is the context pointer the kernel passed to this program.
        if unsafe { (*ctx.skb.skb).vlan_present } != 0 {
            return TCX_NEXT;
        }
        if !pull_headers(&ctx, RESPONDER_HEADROOM) {
            return TCX_NEXT;
        }
        // SAFETY: `skb` is the context pointer the kernel passed to this program.
        let ifindex = unsafe { (*ctx.skb.skb).ifindex };
        let mut frame = Frame::new(ctx.data(), ctx.data_end());
        match l2_responder::respond(&mut frame, ifindex) {
            Verdict::Pass => TCX_NEXT,
            // Send the rewritten frame back out of the interface it came in on.
            // SAFETY: plain helper call; flags 0 means egress.
            Verdict::Reply | Verdict::HandOn => unsafe { bpf_redirect(ifindex, 0) as i32 },
        }
    }

    #[classifier]
    pub fn pod_from_container(ctx: TcContext) -> i32 {
        if !pull_headers(&ctx, pod_datapath::HEADROOM) {
            return TC_ACT_SHOT;
        }
        // SAFETY: `skb` is the context pointer the kernel passed to this program.
        let ifindex = unsafe { (*ctx.skb.skb).ifindex };
        let mut frame = Frame::new(ctx.data(), ctx.data_end());
        pod_action(&ctx, pod_datapath::from_container(&mut frame, ifindex))
    }

    #[classifier]
    pub fn pod_from_uplink(ctx: TcContext) -> i32 {
        if !pull_headers(&ctx, pod_datapath::HEADROOM) {
            return TC_ACT_OK;
        }
        let mut frame = Frame::new(ctx.data(), ctx.data_end());
        pod_action(&ctx, pod_datapath::from_uplink(&mut frame))
    }

    #[classifier]
    pub fn pod_to_container(ctx: TcContext) -> i32 {
        if pull_headers(&ctx, pod_datapath::HEADROOM) {
            // SAFETY: `skb` is the context pointer the kernel passed to this program.
            let ifindex = unsafe { (*ctx.skb.skb).ifindex };
            pod_datapath::to_container(&Frame::new(ctx.data(), ctx.data_end()), ifindex);
        }
        TC_ACT_OK
    }

    #[classifier]
    pub fn pod_to_uplink(ctx: TcContext) -> i32 {
        // SAFETY: `skb` is the context pointer the kernel passed to this program.
        let (mark, ifindex) = unsafe { ((*ctx.skb.skb).mark, (*ctx.skb.skb).ifindex) };
        let forwarded = mark == FORWARDED_MARK;
        if forwarded {
            // The mark only told this program where the packet came from.
            ctx.set_mark(0);
        }
        if pull_headers(&ctx, pod_datapath::HEADROOM) {
            let frame = Frame::new(ctx.data(), ctx.data_end());
            pod_datapath::to_uplink(&frame, ifindex, forwarded);
        }
        TC_ACT_OK
    }

    #[inline(always)]
    fn pod_action(ctx: &TcContext, verdict: pod_datapath::Verdict) -> i32 {
        match verdict {
            pod_datapath::Verdict::Stack => TC_ACT_OK,
            pod_datapath::Verdict::Drop => TC_ACT_SHOT,
            // Into the pod's namespace directly: the frame skips the host's backlog queue and
            // the veth transmit path (SAFETY: plain helper call, flags must be 0).
            pod_datapath::Verdict::Deliver { host_ifindex } => unsafe {
                bpf_redirect_peer(host_ifindex, 0) as i32
            },
            pod_datapath::Verdict::Forward { route } => forward(ctx, &route),
        }
    }

    /// Out of the uplink to the node that holds the destination's block: the kernel finds the
    /// next hop's MAC in its neighbour table (resolving it when needed), so no route of the
    /// host is consulted. The mark tells the uplink's egress program that the packet is ours.
    #[inline(always)]
    fn forward(ctx: &TcContext, route: &ipam_common::pod::RemoteRoute) -> i32 {
        ctx.set_mark(FORWARDED_MARK);
        let nh = route.next_hop;
        let mut params = bpf_redir_neigh {
            nh_family: route.family,
            __bindgen_anon_1: if route.family == ipam_common::pod::AF_INET {
                aya_ebpf::bindings::bpf_redir_neigh__bindgen_ty_1 {
                    ipv4_nh: u32::from_ne_bytes([nh[12], nh[13], nh[14], nh[15]]),
                }
            } else {
                aya_ebpf::bindings::bpf_redir_neigh__bindgen_ty_1 {
                    ipv6_nh: [
                        u32::from_ne_bytes([nh[0], nh[1], nh[2], nh[3]]),
                        u32::from_ne_bytes([nh[4], nh[5], nh[6], nh[7]]),
                        u32::from_ne_bytes([nh[8], nh[9], nh[10], nh[11]]),
                        u32::from_ne_bytes([nh[12], nh[13], nh[14], nh[15]]),
                    ],
                }
            },
        };
        // SAFETY: plain helper call with a parameter block on our stack; flags must be 0.
        unsafe {
            bpf_redirect_neigh(
                route.uplink_ifindex,
                &mut params,
                core::mem::size_of::<bpf_redir_neigh>() as i32,
                0,
            ) as i32
        }
    }

    /// Makes sure the first `want` bytes of the packet (or all of it, when shorter) are in the
    /// linear area, where the programs read headers directly. A frame split over pages would
    /// otherwise hide its headers; pulling is only done in that rare case. `false` when the
    /// kernel could not pull.
    #[inline(always)]
    fn pull_headers(ctx: &TcContext, want: u32) -> bool {
        let linear = (ctx.data_end() - ctx.data()) as u32;
        if linear >= want || ctx.len() <= linear {
            return true;
        }
        let want = if ctx.len() < want { ctx.len() } else { want };
        ctx.pull_data(want).is_ok()
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
