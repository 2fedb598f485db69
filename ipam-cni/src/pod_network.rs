//! Main-plugin mode: the pod's interface, made by the plugin and handed to the datapath.
//!
//! ADD creates a veth pair whose pod end is created directly in the pod's namespace under the
//! requested name, gives it the allocated addresses (host routes: /32 and /128), routes
//! everything via the node's router address, and pins the router's MAC (the host side of the
//! pair) as a permanent neighbour, so the pod never needs ARP or NDP to leave. The host side gets
//! a route and a permanent neighbour for each pod address. Then the daemon registers the
//! endpoint: map entries and the TC program on the host side.

use std::{net::IpAddr, path::Path};

use crate::{
    invocation::Invocation,
    result::{AddResult, CniError, Code, Interface, ipam_result},
};
use ipam_api::types::{AllocatedIp, AttachmentId, Endpoint, Mac};
use ipam_netlink::{LinkInfo, Netlink, NetlinkError};

/// The host-side name of an attachment's veth: `ipam` + 11 hex digits of a hash of the
/// container and interface, so it is stable across retries and fits IFNAMSIZ (15). The network
/// is left out: container and interface are unique among live attachments, and the name must
/// stay what it was before attachments carried their network (a DEL after an upgrade finds it).
pub fn host_veth_name(id: &AttachmentId) -> String {
    // FNV-1a, 64 bit: stable across builds and platforms (std's hasher is not).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in id.legacy_owner().bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("ipam{:011x}", hash >> 20)
}

fn netlink_error(e: NetlinkError) -> CniError {
    CniError::new(Code::Io, e.to_string())
}

/// Names the attachment in a netlink failure and says what to do about it.
fn for_attachment(id: &AttachmentId, action: &str) -> impl FnOnce(CniError) -> CniError {
    let who = format!("container {} interface {}", id.container_id, id.ifname);
    let action = action.to_owned();
    move |e| {
        if e.code != Code::Io {
            return e;
        }
        CniError::new(e.code, format!("{who}: {}; {action}", e.msg))
    }
}

/// The two ends of a pod's veth, as set up.
pub struct PodInterface {
    pub host: LinkInfo,
    pub pod: LinkInfo,
}

/// Creates (or, on a repeated ADD, completes) the pod's interface with `ips`.
pub fn set_up(
    id: &AttachmentId,
    netns: &str,
    mtu: u32,
    ips: &[AllocatedIp],
) -> Result<PodInterface, CniError> {
    let host_name = host_veth_name(id);
    let result = (|| {
        let host = Netlink::open()
            .map_err(|e| CniError::new(Code::Io, format!("cannot open netlink: {e}")))?;
        let pod = Netlink::open_in(Path::new(netns)).map_err(netlink_error)?;
        let mut created = false;
        let host_link = match host.link_by_name(&host_name).map_err(netlink_error)? {
            Some(link) => link,
            None => {
                if pod
                    .link_by_name(&id.ifname)
                    .map_err(netlink_error)?
                    .is_some()
                {
                    return Err(CniError::new(
                        Code::Io,
                        format!(
                            "container {}: interface {} already exists in {netns} and is not ours; \
                             pick another CNI_IFNAME or remove it",
                            id.container_id, id.ifname
                        ),
                    ));
                }
                host.create_veth(&host_name, &id.ifname, Path::new(netns), mtu)
                    .map_err(netlink_error)?;
                created = true;
                host.link_by_name(&host_name)
                    .map_err(netlink_error)?
                    .ok_or_else(|| CniError::new(Code::Io, format!("veth {host_name} vanished")))?
            }
        };
        let configured = configure(&host, &pod, &host_link, &id.ifname, netns, ips);
        if configured.is_err() && created {
            // Leave no half-made interface behind; the runtime's DEL and retry start clean.
            let _ = host.delete_link(host_link.index);
        }
        configured
    })();
    result.map_err(for_attachment(
        id,
        "nothing half-made is left on the node; DEL and ADD again",
    ))
}

fn configure(
    host: &Netlink,
    pod: &Netlink,
    host_link: &LinkInfo,
    ifname: &str,
    netns: &str,
    ips: &[AllocatedIp],
) -> Result<PodInterface, CniError> {
    let pod_link = pod
        .link_by_name(ifname)
        .map_err(netlink_error)?
        .ok_or_else(|| {
            CniError::new(
                Code::Io,
                format!("interface {ifname} is missing in {netns}; DEL and ADD again"),
            )
        })?;
    host.set_up(host_link.index).map_err(netlink_error)?;
    pod.set_up(pod_link.index).map_err(netlink_error)?;
    for ip in ips {
        let gateway = ip.gateway.ok_or_else(|| {
            CniError::new(
                Code::TryAgainLater,
                format!(
                    "the node has no {} router address yet; try again later",
                    ip.family.name()
                ),
            )
        })?;
        let bits = ip.family.bits();
        let any = if ip.address.is_ipv4() {
            IpAddr::from([0u8; 4])
        } else {
            IpAddr::from([0u8; 16])
        };
        pod.add_address(pod_link.index, ip.address, bits)
            .map_err(netlink_error)?;
        pod.add_route(gateway, bits, None, pod_link.index)
            .map_err(netlink_error)?;
        pod.add_permanent_neighbour(pod_link.index, gateway, host_link.mac)
            .map_err(netlink_error)?;
        pod.add_route(any, 0, Some(gateway), pod_link.index)
            .map_err(netlink_error)?;
        host.add_route(ip.address, bits, None, host_link.index)
            .map_err(netlink_error)?;
        host.add_permanent_neighbour(host_link.index, ip.address, pod_link.mac)
            .map_err(netlink_error)?;
    }
    Ok(PodInterface {
        host: host_link.clone(),
        pod: pod_link,
    })
}

/// Deletes the attachment's veth pair if it is still there (the pod end goes with it).
pub fn tear_down(id: &AttachmentId) -> Result<(), CniError> {
    let name = host_veth_name(id);
    let result = (|| {
        let host = Netlink::open()
            .map_err(|e| CniError::new(Code::Io, format!("cannot open netlink: {e}")))?;
        if let Some(link) = host.link_by_name(&name).map_err(netlink_error)? {
            match host.delete_link(link.index) {
                Ok(()) => {}
                // Gone in the meantime (the pod's namespace was destroyed): what DEL wants.
                Err(e) if e.is_no_such_device() => {}
                Err(e) => return Err(netlink_error(e)),
            }
        }
        Ok(())
    })();
    result.map_err(for_attachment(
        id,
        &format!("delete the host veth {name} by hand if it is still there, then DEL again"),
    ))
}

/// CHECK: the pod's interface exists in `netns` with every address in `ips`.
pub fn check(id: &AttachmentId, netns: &str, ips: &[AllocatedIp]) -> Result<(), CniError> {
    (|| {
        let host = Netlink::open()
            .map_err(|e| CniError::new(Code::Io, format!("cannot open netlink: {e}")))?;
        let failed = |msg: String| CniError::new(Code::CheckFailed, msg);
        if host
            .link_by_name(&host_veth_name(id))
            .map_err(netlink_error)?
            .is_none()
        {
            return Err(failed(format!(
                "container {}: host-side veth {} is missing",
                id.container_id,
                host_veth_name(id)
            )));
        }
        let pod = Netlink::open_in(Path::new(netns)).map_err(netlink_error)?;
        let link = pod
            .link_by_name(&id.ifname)
            .map_err(netlink_error)?
            .ok_or_else(|| failed(format!("interface {} is missing in {netns}", id.ifname)))?;
        let present = pod.addresses(link.index).map_err(netlink_error)?;
        for ip in ips {
            if !present.iter().any(|(a, _)| *a == ip.address) {
                return Err(failed(format!(
                    "interface {} in {netns} lacks its address {}",
                    id.ifname, ip.address
                )));
            }
        }
        Ok(())
    })()
}

/// What the daemon is told about the new interface.
pub fn endpoint(
    inv: &Invocation,
    network: &str,
    netns: &str,
    iface: &PodInterface,
    ips: &[AllocatedIp],
) -> Endpoint {
    Endpoint {
        id: inv.attachment(network),
        pod: inv.pod(),
        netns: netns.to_owned(),
        host_ifname: iface.host.name.clone(),
        host_ifindex: iface.host.index,
        host_mac: Mac(iface.host.mac),
        pod_mac: Mac(iface.pod.mac),
        ips: ips.iter().map(|i| i.address).collect(),
    }
}

/// The ADD result of the main plugin: both interfaces, the pod's addresses (as host routes, as
/// configured) on the pod interface, and the default routes.
pub fn result(
    cni_version: &str,
    netns: &str,
    iface: &PodInterface,
    ips: &[AllocatedIp],
) -> AddResult {
    let as_configured: Vec<AllocatedIp> = ips
        .iter()
        .map(|ip| AllocatedIp {
            prefix_len: ip.family.bits(),
            ..ip.clone()
        })
        .collect();
    let mut out = ipam_result(cni_version, &as_configured);
    out.interfaces = vec![
        Interface {
            name: iface.host.name.clone(),
            mac: Mac(iface.host.mac),
            sandbox: None,
        },
        Interface {
            name: iface.pod.name.clone(),
            mac: Mac(iface.pod.mac),
            sandbox: Some(netns.to_owned()),
        },
    ];
    for ip in &mut out.ips {
        ip.interface = Some(1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_veth_names_are_stable_distinct_and_short() {
        let a = AttachmentId {
            network: "podnet".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
        };
        let b = AttachmentId {
            ifname: "eth1".into(),
            ..a.clone()
        };
        assert_eq!(host_veth_name(&a), host_veth_name(&a.clone()));
        assert_ne!(host_veth_name(&a), host_veth_name(&b));
        assert_eq!(host_veth_name(&a).len(), 15);
        // The name a pod's veth got before attachments carried their network: a DEL after an
        // upgrade must find it.
        assert_eq!(host_veth_name(&a), host_veth_name(&a.in_network("")));
        assert_eq!(host_veth_name(&a), "ipam9e27a0abdbb");
    }
}
