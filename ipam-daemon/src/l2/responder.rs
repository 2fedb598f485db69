//! The responder controller, the one applier of what this node answers ARP/NDP for: the IPs
//! the daemon's file configures, and the Service IPs the owners controller decided
//! (`ServiceAnswers`, one whole value). Each pass brings the node in line with both, in the
//! order that keeps one answer per IP and loses no traffic: the IPs new on `lo` asked for, the
//! hand-overs (the connections an IP's old owner still holds are passed on to it from the
//! first frame answered here), the IPs given up withdrawn at once (the node taking one answers
//! once its hand-over wait ends), the new IPs answered once they are on `lo` (the link told of
//! each), and the IPs no longer accepted off `lo` last. It runs whenever either value or the
//! host's links change, retries interfaces that are not there yet with backoff, and holds the
//! multicast groups the IPv6 ones need.

use std::{
    collections::BTreeSet,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use ipam_core::backoff::Backoff;
use ipam_datapath::Datapath;
use ipam_netlink::iface;
use tokio::{sync::watch, time::Instant};

use super::{
    Announcements, Configured, HandedOver, ServiceAnswers,
    announcer::{self, AnnounceError, ReconcileReport},
    gratuitous::Repeats,
    multicast::SolicitedNodeGroups,
};
use crate::net::local_address::{HeldBy, Holder, LocalAddresses};

/// Longest wait between two attempts at an interface that is not there yet.
const RETRY_CAP: Duration = Duration::from_secs(10);

/// What the responder answers, as the daemon's file and the owners controller say.
pub struct Wanted {
    pub configured: watch::Receiver<Configured>,
    /// The owners controller's value. When it ends (it never runs on a store of one), no
    /// Service IP is answered any more.
    pub services: watch::Receiver<ServiceAnswers>,
    /// The Service IPs on `lo`, shared with the BGP announcer.
    pub local_addresses: LocalAddresses,
}

/// Runs until the daemon's configuration is gone; an error of the datapath itself ends it.
pub async fn run(
    datapath: Arc<Mutex<Datapath>>,
    wanted: Wanted,
    mut link_changes: watch::Receiver<u64>,
) -> Result<(), AnnounceError> {
    let Wanted {
        mut configured,
        services,
        local_addresses,
    } = wanted;
    let mut services = Some(services);
    let mut lo = HeldBy::new(local_addresses, Holder::L2);
    let mut retry = Backoff::new(RETRY_CAP);
    let mut repeats = Repeats::default();
    let mut groups = SolicitedNodeGroups::default();
    let mut handing_on = BTreeSet::new();
    // The hand-overs last written (with the links' generation they were resolved in): most
    // passes change none, and rewriting them would cost map writes each time.
    let mut written: Option<(HandedOver, u64)> = None;
    // Whether IPs asked for on `lo` may not be there yet (a wait for them was cut short).
    let mut lo_pending = false;
    loop {
        let service = services
            .as_mut()
            .map(|s| s.borrow_and_update().clone())
            .unwrap_or_else(ServiceAnswers::none);
        let current = configured
            .borrow_and_update()
            .with(&service.answers.answering);
        // Traffic for an IP is accepted before it is asked for: the IPs new on `lo` are put
        // there now and answered once they are (below).
        lo_pending |= !lo.queue(&service.answers.accepting).is_empty();
        let now = std::time::Instant::now();
        let hand_ons: HandedOver = service
            .answers
            .handed_over
            .iter()
            .filter(|(_, h)| h.until > now)
            .map(|(k, h)| (k.clone(), *h))
            .collect();
        let links = *link_changes.borrow();
        if written
            .as_ref()
            .is_none_or(|(before, at)| *before != hand_ons || *at != links)
        {
            let all = hand_on(
                &mut datapath.lock().expect("datapath lock"),
                &hand_ons,
                &mut handing_on,
            );
            written = all.then(|| (hand_ons.clone(), links));
        }
        // Ended when they run out (the gate closes with the last), not at the next change.
        let handover_ends = hand_ons.values().map(|h| Instant::from_std(h.until)).min();
        if lo_pending {
            // What this node let go of is withdrawn now, not after the adds: the node taking
            // it answers once its hand-over wait ends, and counts on the withdrawal within
            // `DELIVERY` (`ipam_core::l2::handover`). Nothing else changes before they land.
            let withdrawn = announcer::withdraw_unwanted(
                &mut datapath.lock().expect("datapath lock"),
                &current,
            )?;
            for &(ip, ifindex) in &withdrawn {
                repeats.stop(ip, ifindex);
                tracing::info!(%ip, interface = iface::name(ifindex), "withdrawn");
            }
            // A newer decision meanwhile starts the pass again with it: what that one lets go
            // of must not wait for the adds either (they stay pending).
            let newer = tokio::select! {
                () = lo.applied() => false,
                changed = changed_or_never(services.as_mut()) => {
                    if changed.is_err() {
                        services = None;
                    }
                    true
                }
            };
            if newer {
                continue;
            }
            lo_pending = false;
        }
        let report = reconcile(&datapath, &current, &mut repeats)?;
        // No longer answered here: their traffic may go (lingering IPs stay accepted).
        lo.keep_only(&service.answers.accepting);
        if service.decided {
            lo.decided();
        }
        let membership_errors = groups.apply(report.answering.iter().copied());
        for e in &membership_errors {
            tracing::warn!("{e}");
        }
        let retry_at = next_retry(&report, !membership_errors.is_empty(), &mut retry);
        loop {
            tokio::select! {
                changed = configured.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                    break;
                }
                changed = changed_or_never(services.as_mut()) => {
                    if changed.is_err() {
                        // The owners controller ended (or never runs): no Service IP is
                        // this node's to answer any more.
                        services = None;
                    }
                    break;
                }
                () = sleep_until(retry_at) => break,
                () = sleep_until(handover_ends) => break,
                // An interface made anew (or renamed back) gets the responder again at once.
                changed = link_changes.changed() => if changed.is_ok() { break },
                () = sleep_until(repeats.next_due()) => repeats.send_due(),
            }
        }
    }
}

async fn changed_or_never<T>(
    rx: Option<&mut watch::Receiver<T>>,
) -> Result<(), watch::error::RecvError> {
    match rx {
        Some(rx) => rx.changed().await,
        None => std::future::pending().await,
    }
}

/// Brings the responder maps in line with `wanted` (`announcer::reconcile`), starts telling
/// the link of each IP answered anew and stops for each withdrawn, and logs what changed.
fn reconcile(
    datapath: &Mutex<Datapath>,
    wanted: &Announcements,
    repeats: &mut Repeats,
) -> Result<ReconcileReport, AnnounceError> {
    let span = tracing::debug_span!("responder_pass", pairs = wanted.len());
    let report = span
        .in_scope(|| announcer::reconcile(&mut datapath.lock().expect("datapath lock"), wanted))?;
    for answered in &report.announced {
        repeats.start(answered);
    }
    for &(ip, ifindex) in &report.withdrawn {
        repeats.stop(ip, ifindex);
    }
    log_report(&report);
    Ok(report)
}

/// Writes the hand-overs to the datapath and ends those no longer wanted (`handing_on`: the
/// (IP, ifindex) pairs written before). An error costs the connections of that one IP at
/// worst; it is said and the rest go on. Whether every one was written.
fn hand_on(
    datapath: &mut Datapath,
    wanted: &HandedOver,
    handing_on: &mut BTreeSet<(IpAddr, u32)>,
) -> bool {
    let now = std::time::Instant::now();
    let monotonic_now = ipam_datapath::clock::monotonic_ns();
    let mut written = BTreeSet::new();
    let mut all = true;
    for ((ip, interface), hand_on) in wanted {
        let Some(left) = hand_on.until.checked_duration_since(now) else {
            continue;
        };
        let Ok(ifindex) = iface::index(interface) else {
            all = false;
            continue;
        };
        let until_ns = monotonic_now + left.as_nanos() as u64;
        match datapath
            .responder()
            .hand_over(*ip, ifindex, hand_on.old_owner, until_ns)
        {
            Ok(()) => {
                written.insert((*ip, ifindex));
            }
            Err(e) => {
                all = false;
                tracing::warn!(
                    %ip,
                    interface = interface.as_str(),
                    "connections the old owner holds are not passed on to it: {e}"
                );
            }
        }
    }
    for &(ip, ifindex) in handing_on.difference(&written) {
        if let Err(e) = datapath.responder().end_handover(ip, ifindex) {
            all = false;
            tracing::debug!(%ip, ifindex, "ending a hand-over: {e}");
        }
    }
    *handing_on = written;
    all
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// When to try again if some interface could not be served (or a multicast group not
/// joined), saying what it waits for.
fn next_retry(
    report: &ReconcileReport,
    memberships_failed: bool,
    retry: &mut Backoff,
) -> Option<Instant> {
    if report.failed.is_empty() && !memberships_failed {
        retry.reset();
        return None;
    }
    let delay = retry.next_delay();
    for (interface, error) in &report.failed {
        tracing::warn!(
            interface = interface.as_str(),
            retry_in_ms = delay.as_millis() as u64,
            "waiting for interface: {error}"
        );
    }
    Some(Instant::now() + delay)
}

fn log_report(report: &ReconcileReport) {
    for a in report.attachments.iter().filter(|a| !a.kept) {
        tracing::info!(
            interface = a.interface.as_str(),
            form = a.form.name(),
            adopted = a.adopted,
            "responder attached"
        );
        if let Some(caveat) = a.caveat() {
            tracing::warn!(interface = a.interface.as_str(), "{caveat}");
        }
    }
    for a in &report.announced {
        tracing::info!(ip = %a.ip, interface = a.interface.as_str(), "announcing (gratuitous announcement sent)");
    }
    for (ip, ifindex) in &report.withdrawn {
        tracing::info!(%ip, interface = iface::name(*ifindex), "withdrawn");
    }
    for interface in &report.detached {
        tracing::info!(interface = interface.as_str(), "responder detached");
    }
    if !report.kept.is_empty() {
        tracing::info!(
            count = report.kept.len(),
            "announcements kept from the previous run"
        );
    }
}
