//! The host's links and addresses changing, from netlink: a count that moves once per burst of
//! changes, for the controllers that look at the interfaces again then (the node's record, the
//! responder's attachments) rather than every few seconds. A dead NIC, a link set down, an
//! address removed, an interface renamed or made anew are all seen within milliseconds.

use std::time::Duration;

use ipam_netlink::LinkEvents;
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::watch,
};

/// A burst of notifications is gathered this long and counts as one change: a link coming up
/// brings its carrier, then its addresses, one notification each.
const SETTLE: Duration = Duration::from_millis(20);
/// Wait before reading again after the socket failed (it does not, short of a kernel bug).
const AFTER_ERROR: Duration = Duration::from_secs(1);

/// Follows the changes; the count starts at 0. Without netlink notifications (never on Linux,
/// but said if it happens) the count stays put and the controllers' own rechecks remain. The
/// sender lives as long as any receiver: a receiver's `changed()` never fails.
pub fn follow() -> watch::Receiver<u64> {
    let (changes, receiver) = watch::channel(0);
    match LinkEvents::open().and_then(|events| {
        // SAFETY: `LinkEvents` owns its socket for as long as it lives and always gives the
        // same descriptor, as registering asks.
        unsafe { AsyncFd::register_with_interest(events, Interest::READABLE) }.map_err(|e| {
            ipam_netlink::NetlinkError {
                what: "cannot wait for link and address changes".into(),
                source: e.into_parts().1,
            }
        })
    }) {
        Ok(events) => {
            tokio::spawn(run(events, changes));
        }
        Err(e) => {
            tracing::warn!(
                "{e}; interfaces are looked at again every few seconds instead, so a link that \
                 goes down moves its Service IPs that much later"
            );
            tokio::spawn(async move { changes.closed().await });
        }
    }
    receiver
}

async fn run(mut events: AsyncFd<LinkEvents>, changes: watch::Sender<u64>) {
    loop {
        let drained = {
            let mut ready = match events.readable_mut().await {
                Ok(ready) => ready,
                Err(e) => {
                    tracing::warn!(
                        "cannot wait for link and address changes any more ({e}); interfaces \
                         are looked at again every few seconds instead"
                    );
                    changes.closed().await;
                    return;
                }
            };
            let drained = ready.get_inner_mut().drain();
            ready.clear_ready();
            drained
        };
        match drained {
            Ok(0) => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("cannot read link and address changes, reading again: {e}");
                tokio::time::sleep(AFTER_ERROR).await;
                continue;
            }
        }
        tokio::time::sleep(SETTLE).await;
        // The rest of the burst is part of this change; the readiness it left is cleared by
        // the next read, which finds nothing.
        let _ = events.get_mut().drain();
        if changes.is_closed() {
            return;
        }
        changes.send_modify(|n| *n += 1);
    }
}
