//! The responder controller: keeps the datapath answering exactly the wanted announcements. It
//! reconciles whenever the wanted value or the host's links change, retries interfaces that are
//! not there yet with backoff, tells the link about every IP it starts answering, and holds the multicast groups
//! the IPv6 ones need.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use ipam_core::backoff::Backoff;
use ipam_datapath::Datapath;
use ipam_netlink::iface;
use tokio::{sync::watch, time::Instant};

use super::{
    Announcements,
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
    mut link_changes: watch::Receiver<u64>,
) -> Result<(), AnnounceError> {
    let mut retry = Backoff::new(RETRY_CAP);
    let mut repeats = Repeats::default();
    let mut groups = SolicitedNodeGroups::default();
    loop {
        let current = wanted.borrow_and_update().clone();
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
                () = sleep_until(retry_at) => break,
                // An interface made anew (or renamed back) gets the responder again at once.
                changed = link_changes.changed() => if changed.is_ok() { break },
                () = sleep_until(repeats.next_due()) => repeats.send_due(),
            }
        }
    }
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
