//! Reconciles the responder with the wanted announcements: attaches the responder where needed,
//! writes new entries (reporting them, so the caller tells the link), removes entries nobody
//! wants any more, and detaches from interfaces with nothing left to announce.
//!
//! It works by difference, never by clearing and refilling, so entries that stay are answered
//! without a gap while the daemon restarts or reloads its configuration.

use std::{collections::BTreeSet, net::IpAddr};

use ipam_datapath::{Attachment, Datapath, DatapathError};
use ipam_netlink::iface;
use thiserror::Error;

use super::Announcements;

/// An IP newly answered on an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answered {
    pub ip: IpAddr,
    pub interface: String,
    pub ifindex: u32,
    pub mac: [u8; 6],
}

/// What a reconciliation changed.
#[derive(Debug, Default)]
pub struct ReconcileReport {
    pub attachments: Vec<Attachment>,
    /// Newly answered: the link has not been told yet.
    pub announced: Vec<Answered>,
    /// (IP, interface) answered before and still answered, untouched.
    pub kept: Vec<(IpAddr, String)>,
    /// (IP, ifindex) no longer answered.
    pub withdrawn: Vec<(IpAddr, u32)>,
    /// Interfaces the responder was detached from.
    pub detached: Vec<String>,
    /// Every (IP, ifindex) answered after this pass, new or kept.
    pub answering: BTreeSet<(IpAddr, u32)>,
    /// Interfaces that could not be served this time (missing, no MAC, attach refused), with
    /// the reason; the daemon retries them with backoff.
    pub failed: Vec<(String, AnnounceError)>,
}

#[derive(Debug, Error)]
pub enum AnnounceError {
    #[error(
        "cannot announce {ips} on interface {interface}: {source}; check that the interface \
         exists in the daemon's network namespace"
    )]
    Interface {
        ips: String,
        interface: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Datapath(#[from] DatapathError),
}

/// Brings the datapath in line with `wanted`.
pub fn reconcile(
    datapath: &mut Datapath,
    announcements: &Announcements,
) -> Result<ReconcileReport, AnnounceError> {
    let mut report = ReconcileReport::default();
    let mut wanted: BTreeSet<(IpAddr, u32)> = BTreeSet::new();
    let mut plan = Vec::new();
    // One attachment and one MAC lookup per interface.
    for (interface, on) in announcements.interfaces() {
        let ips = &on.ips;
        let prepared = iface::mac(interface)
            .map_err(|source| AnnounceError::Interface {
                ips: ips
                    .iter()
                    .map(IpAddr::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                interface: interface.to_owned(),
                source,
            })
            .and_then(|mac| {
                let attachment = datapath.attach_responder(interface, on.attach)?;
                Ok((mac, attachment))
            });
        let (mac, attachment) = match prepared {
            Ok(ok) => ok,
            Err(e) => {
                report.failed.push((interface.to_owned(), e));
                continue;
            }
        };
        for &ip in ips {
            wanted.insert((ip, attachment.ifindex));
            plan.push((ip, interface, attachment.ifindex, mac));
        }
        report.attachments.push(attachment);
    }

    for (ip, interface, ifindex, mac) in plan {
        if datapath.responder().announce(ip, ifindex, mac)? {
            report.announced.push(Answered {
                ip,
                interface: interface.to_owned(),
                ifindex,
                mac,
            });
        } else {
            report.kept.push((ip, interface.to_owned()));
        }
    }

    for entry in datapath.responder().list()? {
        if !wanted.contains(&(entry.ip, entry.ifindex)) {
            datapath.responder().withdraw(entry.ip, entry.ifindex)?;
            report.withdrawn.push((entry.ip, entry.ifindex));
        }
    }
    report.detached = datapath.detach_responders_except(&report.attachments)?;
    report.answering = wanted;
    Ok(report)
}

/// Withdraws the entries of IPs `announcements` has on no interface, and changes nothing else:
/// what the node let go of stops being answered at once, while the IPs it takes wait to be
/// accepted on `lo`. Returns the (IP, ifindex) pairs withdrawn.
pub fn withdraw_unwanted(
    datapath: &mut Datapath,
    announcements: &Announcements,
) -> Result<Vec<(IpAddr, u32)>, AnnounceError> {
    let wanted: BTreeSet<IpAddr> = announcements
        .interfaces()
        .flat_map(|(_, on)| on.ips.iter().copied())
        .collect();
    let mut withdrawn = Vec::new();
    for entry in datapath.responder().list()? {
        if !wanted.contains(&entry.ip) {
            datapath.responder().withdraw(entry.ip, entry.ifindex)?;
            withdrawn.push((entry.ip, entry.ifindex));
        }
    }
    Ok(withdrawn)
}
