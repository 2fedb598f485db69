//! The responder controller: keeps the datapath answering exactly the wanted announcements. It
//! reconciles whenever the wanted value or the host's links change, retries interfaces that are
//! not there yet with backoff, tells the link about every IP it starts answering, and holds the multicast groups
//! the IPv6 ones need. It also writes the hand-overs (`HandedOver`) before the announcements
//! they come with: the connections an IP's old owner still holds are passed on to it from the
//! first frame this node answers.

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
    Announcements, HandedOver,
    announcer::{self, AnnounceError, ReconcileReport},
    gratuitous::Repeats,
    multicast::SolicitedNodeGroups,
};

/// Longest wait between two attempts at an interface that is not there yet.
const RETRY_CAP: Duration = Duration::from_secs(10);

/// Runs until the producer of `wanted` is gone; an error of the datapath itself ends it.
pub async fn run(
    datapath: Arc<Mutex<Datapath>>,
    mut wanted: watch::Receiver<Announcements>,
    mut handed_over: watch::Receiver<HandedOver>,
    mut link_changes: watch::Receiver<u64>,
) -> Result<(), AnnounceError> {
    let mut retry = Backoff::new(RETRY_CAP);
    let mut repeats = Repeats::default();
    let mut groups = SolicitedNodeGroups::default();
    let mut handing_on = BTreeSet::new();
    let mut handing_over = true;
    // The hand-overs last written (with the links' generation they were resolved in): most
    // passes change none, and rewriting them would cost map writes each time.
    let mut written: Option<(HandedOver, u64)> = None;
    loop {
        let current = wanted.borrow_and_update().clone();
        let now = std::time::Instant::now();
        let hand_ons: HandedOver = handed_over
            .borrow_and_update()
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
        let span = tracing::debug_span!("responder_pass", pairs = current.len());
        let report = span.in_scope(|| {
            announcer::reconcile(&mut datapath.lock().expect("datapath lock"), &current)
        })?;
        for answered in &report.announced {
            repeats.start(answered);
        }
        for &(ip, ifindex) in &report.withdrawn {
            repeats.stop(ip, ifindex);
        }
        log_report(&report);
        let membership_errors = groups.apply(report.answering.iter().copied());
        for e in &membership_errors {
            tracing::warn!("{e}");
        }
        let retry_at = next_retry(&report, !membership_errors.is_empty(), &mut retry);
        loop {
            tokio::select! {
                changed = wanted.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                    break;
                }
                // Standalone, no owners controller sends any: the channel closes at once.
                changed = handed_over.changed(), if handing_over => match changed {
                    Ok(()) => break,
                    Err(_) => handing_over = false,
                },
                () = sleep_until(retry_at) => break,
                () = sleep_until(handover_ends) => break,
                // An interface made anew (or renamed back) gets the responder again at once.
                changed = link_changes.changed() => if changed.is_ok() { break },
                () = sleep_until(repeats.next_due()) => repeats.send_due(),
            }
        }
    }
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
