//! The node side of the pod network, kept by the daemon: the host device (a veth pair, of which
//! one end holds the router addresses (the pods' gateway, like Cilium's `cilium_host`), IP forwarding, and the pod
//! program on the uplinks.
//!
//! Everything here is idempotent and retried on every IPAM pass, so a missing uplink or a
//! router address that is not allocated yet only delays it, with a log line saying what it
//! waits for.

use std::{
    collections::BTreeSet,
    net::IpAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use ipam_common::Family;
use ipam_netlink::{Netlink, NetlinkError};
use thiserror::Error;

use ipam_datapath::{Datapath, PodProgram};
use ipam_netlink::iface;

/// Why the host device is not complete yet; every case is retried on the next pass.
#[derive(Debug, Error)]
pub(super) enum HostDeviceError {
    #[error("waiting for the node's {} router address", family.name())]
    NoRouterAddress { family: Family },
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
}

pub(super) struct HostNetwork {
    device: String,
    uplinks: Vec<String>,
    netlink: Option<Netlink>,
    forwarding: bool,
    /// Router addresses already on the device.
    on_device: BTreeSet<IpAddr>,
    /// Uplinks (name, ifindex) with the pod program attached by this daemon.
    attached: BTreeSet<(String, u32)>,
    /// What was last reported as missing, so it is logged once, not on every pass.
    last_wait: Option<String>,
    /// The device holds every router address: pods have a gateway. The API reports not ready
    /// until then.
    gateway_ready: Arc<AtomicBool>,
}

impl HostNetwork {
    pub(super) fn new(device: String, uplinks: Vec<String>) -> Self {
        Self {
            device,
            uplinks,
            netlink: None,
            forwarding: false,
            on_device: BTreeSet::new(),
            attached: BTreeSet::new(),
            last_wait: None,
            gateway_ready: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether pods have their gateway (shared with the API).
    pub(super) fn gateway_ready(&self) -> Arc<AtomicBool> {
        self.gateway_ready.clone()
    }

    pub(super) fn set_uplinks(&mut self, uplinks: Vec<String>) {
        self.uplinks = uplinks;
    }

    /// One pass: forwarding on, the device with the `routers` addresses, uplinks attached.
    pub(super) fn sync(
        &mut self,
        routers: &[IpAddr],
        families: &[Family],
        datapath: &Arc<Mutex<Datapath>>,
    ) {
        let mut waiting = Vec::new();
        if !self.forwarding {
            match enable_forwarding() {
                Ok(()) => self.forwarding = true,
                Err(e) => waiting.push(format!("IP forwarding: {e}")),
            }
        }
        let device = self.sync_device(routers, families);
        self.gateway_ready.store(device.is_ok(), Ordering::SeqCst);
        if let Err(e) = device {
            waiting.push(format!("host device {}: {e}", self.device));
        }
        for uplink in self.uplinks.clone() {
            let ifindex = match iface::index(&uplink) {
                Ok(i) => i,
                Err(e) => {
                    waiting.push(format!("uplink {uplink}: {e}"));
                    continue;
                }
            };
            if self.attached.contains(&(uplink.clone(), ifindex)) {
                continue;
            }
            let attached = {
                let mut datapath = datapath.lock().expect("datapath lock");
                PodProgram::UPLINK
                    .into_iter()
                    .try_fold(false, |adopted, program| {
                        Ok::<_, ipam_datapath::DatapathError>(
                            datapath.attach_pod_program(program, &uplink, ifindex)? || adopted,
                        )
                    })
            };
            match attached {
                Ok(adopted) => {
                    tracing::info!(
                        uplink = uplink.as_str(),
                        adopted,
                        "pod datapath attached to uplink"
                    );
                    self.attached.insert((uplink, ifindex));
                }
                Err(e) => waiting.push(format!("uplink {uplink}: {e}")),
            }
        }
        let wait = (!waiting.is_empty()).then(|| waiting.join("; "));
        if wait != self.last_wait {
            match &wait {
                Some(w) => tracing::warn!("pod network not complete, retrying: {w}"),
                None => tracing::info!(device = self.device.as_str(), "pod network ready"),
            }
            self.last_wait = wait;
        }
    }

    /// Puts every router address known so far on the device; complete (pods have a gateway in
    /// every family) only once each of `families` has one there. Netlink answers in
    /// microseconds, so this blocking work runs inline in the IPAM pass.
    fn sync_device(
        &mut self,
        routers: &[IpAddr],
        families: &[Family],
    ) -> Result<(), HostDeviceError> {
        if iface::index(&self.device).is_err() {
            // Not created yet, or deleted behind our back: (re)create it with every address.
            self.on_device.clear();
        }
        if !routers.iter().all(|ip| self.on_device.contains(ip)) {
            self.add_routers(routers)?;
        }
        // A pod set up before its family's router exists would get a gateway nobody answers
        // for: the API stays not ready until every family has one on the device.
        match families
            .iter()
            .find(|f| !self.on_device.iter().any(|ip| Family::of(*ip) == **f))
        {
            Some(&family) => Err(HostDeviceError::NoRouterAddress { family }),
            None => Ok(()),
        }
    }

    fn add_routers(&mut self, routers: &[IpAddr]) -> Result<(), HostDeviceError> {
        let netlink = match &mut self.netlink {
            Some(n) => n,
            slot => slot.insert(Netlink::open()?),
        };
        let peer = format!("{}_peer", self.device.chars().take(10).collect::<String>());
        let link = netlink.ensure_host_pair(&self.device, &peer)?;
        netlink.set_up(link.index)?;
        let missing: Vec<IpAddr> = routers
            .iter()
            .filter(|ip| !self.on_device.contains(ip))
            .copied()
            .collect();
        for ip in &missing {
            netlink.add_address(link.index, *ip, Family::of(*ip).bits())?;
            self.on_device.insert(*ip);
            tracing::info!(device = self.device.as_str(), %ip, "router address on host device");
        }
        Ok(())
    }
}

/// Pods reach other nodes and the outside through the host: it must forward.
fn enable_forwarding() -> std::io::Result<()> {
    for knob in [
        "/proc/sys/net/ipv4/ip_forward",
        "/proc/sys/net/ipv6/conf/all/forwarding",
    ] {
        if std::fs::read_to_string(knob)?.trim() != "1" {
            std::fs::write(knob, "1")?;
            tracing::info!(sysctl = knob, "enabled forwarding for pods");
        }
    }
    Ok(())
}
