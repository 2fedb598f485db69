//! Reconciles the responder with the wanted announcements: attaches the responder where needed,
//! writes new entries (and sends a gratuitous announcement for each), removes entries nobody
//! wants any more, and detaches from interfaces with nothing left to announce.
//!
//! It works by difference, never by clearing and refilling, so entries that stay are answered
//! without a gap while the daemon restarts or reloads its configuration.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use thiserror::Error;

use crate::{
    config::Config,
    datapath::{Attachment, Datapath, DatapathError},
    net::iface,
};

/// What a reconciliation changed.
#[derive(Debug, Default)]
pub struct ReconcileReport {
    pub attachments: Vec<Attachment>,
    /// (IP, interface) newly answered.
    pub announced: Vec<(IpAddr, String)>,
    /// (IP, interface) answered before and still answered, untouched.
    pub kept: Vec<(IpAddr, String)>,
    /// (IP, ifindex) no longer answered.
    pub withdrawn: Vec<(IpAddr, u32)>,
    /// Interfaces the responder was detached from.
    pub detached: Vec<String>,
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

/// Brings the datapath in line with `config.announcements`.
pub fn reconcile(
    datapath: &mut Datapath,
    config: &Config,
) -> Result<ReconcileReport, AnnounceError> {
    let mut report = ReconcileReport::default();

    // Group by interface: one attachment and one MAC lookup per interface.
    let mut by_interface: BTreeMap<&str, Vec<IpAddr>> = BTreeMap::new();
    for a in &config.announcements {
        by_interface.entry(&a.interface).or_default().push(a.ip);
    }

    let mut wanted: BTreeSet<(IpAddr, u32)> = BTreeSet::new();
    let mut plan = Vec::new();
    for (&interface, ips) in &by_interface {
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
                let attachment =
                    datapath.attach_responder(interface, config.attach_mode(interface))?;
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
            if let Err(e) = super::gratuitous::announce(ifindex, mac, ip) {
                // Not fatal: neighbours still learn the address from the first reply.
                tracing::warn!(%ip, interface, "cannot send gratuitous announcement: {e}");
            }
            report.announced.push((ip, interface.to_owned()));
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
    Ok(report)
}
