//! Wakes the controllers when the store changes: one task per watched kind follows the store's
//! watch and signals a `Notify`. Controllers then run a pass (which reads what they need), so
//! bursts of changes cost one pass, and a periodic resync covers anything a watch could miss.

use std::{sync::Arc, time::Duration};

use ipam_core::{
    backoff::Backoff,
    store::{Store, WatchEvent},
};
use tokio::sync::Notify;

/// Longest wait between two attempts to start a watch while the store is unreachable.
const RETRY_CAP: Duration = Duration::from_secs(10);

/// Which changes of a kind wake the controller.
#[derive(Debug, Clone)]
pub enum Interest {
    /// Every change of the kind.
    All(&'static str),
    /// Changes of one object only (an agent and its own node's record).
    Named(&'static str, String),
}

impl Interest {
    fn kind(&self) -> &'static str {
        match self {
            Self::All(kind) | Self::Named(kind, _) => kind,
        }
    }

    fn wants(&self, event: &WatchEvent) -> bool {
        match (self, event) {
            (Self::All(_), _) | (Self::Named(..), WatchEvent::Resync { .. }) => true,
            (Self::Named(_, name), WatchEvent::Put(o)) => &o.name == name,
            (Self::Named(_, name), WatchEvent::Deleted { name: n, .. }) => n == name,
        }
    }
}

/// Starts following `interests`; the returned `Notify` is signalled on every matching change.
pub fn wake_on_changes<S: Store + Clone + 'static>(
    store: S,
    interests: Vec<Interest>,
) -> Arc<Notify> {
    let notify = Arc::new(Notify::new());
    for interest in interests {
        tokio::spawn(follow(store.clone(), interest, notify.clone()));
    }
    notify
}

async fn follow<S: Store>(store: S, interest: Interest, notify: Arc<Notify>) {
    let mut backoff = Backoff::new(RETRY_CAP);
    let mut watch = loop {
        match store.watch(interest.kind()).await {
            Ok(w) => break w,
            Err(e) => {
                let delay = backoff.next_delay();
                tracing::warn!(
                    kind = interest.kind(),
                    retry_in_ms = delay.as_millis() as u64,
                    "cannot watch the store, waiting: {e}"
                );
                tokio::time::sleep(delay).await;
            }
        }
    };
    // Whatever happened before the watch started is covered by the first pass.
    notify.notify_one();
    loop {
        match watch.next().await {
            Ok(event) if interest.wants(&event) => notify.notify_one(),
            Ok(_) => {}
            Err(e) => tracing::warn!(
                kind = interest.kind(),
                "store watch interrupted, resuming where it was: {e}"
            ),
        }
    }
}
