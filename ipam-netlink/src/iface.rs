//! Interfaces of the current network namespace. Names and indexes through nix, the hardware
//! address through route netlink (`ipam-netlink`). The driver name needs the ethtool ioctl:
//! ethtool's netlink interface has no driver information and no library we link wraps
//! `ETHTOOL_GDRVINFO`, hence the one `ifreq` call below.

use std::io;

/// The ifindex of `name`.
pub fn index(name: &str) -> io::Result<u32> {
    nix::net::if_::if_nametoindex(name).map_err(|_| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("no interface named {name} in this network namespace"),
        )
    })
}

/// The name of interface `ifindex`, or its number when it no longer exists.
pub fn name(ifindex: u32) -> String {
    nix::net::if_::if_indextoname(ifindex)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("if#{ifindex}"))
}

/// Whether interface `ifindex` exists in this network namespace.
pub fn exists(ifindex: u32) -> bool {
    nix::net::if_::if_indextoname(ifindex).is_ok()
}

/// The hardware address of `name`, from route netlink in the caller's network namespace (sysfs
/// shows the namespace it was mounted in, not necessarily ours).
pub fn mac(name: &str) -> io::Result<[u8; 6]> {
    let netlink = crate::Netlink::open().map_err(io::Error::other)?;
    match netlink.link_by_name(name) {
        Ok(Some(link)) => Ok(link.mac),
        Ok(None) => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no interface named {name} in this network namespace"),
        )),
        Err(e) => Err(io::Error::other(e)),
    }
}

/// Runs an interface ioctl on `name` with `req` (its name field is filled in here).
fn ifreq_ioctl(name: &str, request: libc::c_ulong, req: &mut libc::ifreq) -> io::Result<()> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    if name.len() >= libc::IF_NAMESIZE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {name} is too long"),
        ));
    }
    // SAFETY: plain socket(2) call.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: the caller passes a request that reads and writes only inside `req` and the
    // buffer `req` points at.
    if unsafe { libc::ioctl(fd.as_raw_fd(), request, req as *mut libc::ifreq) } < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("interface {name}: {e}")));
    }
    Ok(())
}

/// Drivers of software devices, where TC measured faster than XDP (no skb to avoid) and native
/// XDP_TX has caveats (see docs/datapath.md).
const SOFTWARE_DRIVERS: &[&str] = &[
    "veth",
    "bridge",
    "dummy",
    "tun",
    "vxlan",
    "geneve",
    "macvlan",
    "ipvlan",
    "bonding",
    "802.1Q VLAN Support",
    "netkit",
    "wireguard",
];

/// `true` for software devices (veth, bridge, dummy, ...), decided from the driver name the
/// device reports through ethtool, which is right in any network namespace (sysfs may show
/// another one). A device whose driver cannot be read counts as software: `auto` then uses TC,
/// which works on every device.
pub fn is_virtual(name: &str) -> bool {
    driver(name).is_none_or(|d| SOFTWARE_DRIVERS.contains(&d.as_str()))
}

/// The driver name of `name` (ETHTOOL_GDRVINFO), e.g. `veth`, `virtio_net`, `mlx5_core`.
pub fn driver(name: &str) -> Option<String> {
    const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;
    #[repr(C)]
    struct DrvInfo {
        cmd: u32,
        driver: [u8; 32],
        version: [u8; 32],
        fw_version: [u8; 32],
        bus_info: [u8; 32],
        erom_version: [u8; 32],
        reserved2: [u8; 12],
        counts: [u32; 5],
    }
    // SAFETY: plain data; all-zero is valid.
    let mut info: DrvInfo = unsafe { std::mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    // SAFETY: as above.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    req.ifr_ifru.ifru_data = (&mut info as *mut DrvInfo).cast();
    // GDRVINFO writes at most size_of::<DrvInfo>() bytes into `info`.
    ifreq_ioctl(name, libc::SIOCETHTOOL, &mut req).ok()?;
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(32);
    Some(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}
