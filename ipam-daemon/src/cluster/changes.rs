//! Wakes the controllers when the store changes: one task per watched kind follows the store's
//! watch and signals a `Notify`. Controllers then run a pass (which reads what they need), so
//! bursts of changes cost one pass, and a periodic resync covers anything a watch could miss.

use std::sync::Arc;

use ipam_core::store::{Store, WatchEvent};
use tokio::sync::Notify;

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
    let mut watch =
        super::cache::watch_kind_until_it_works(&store, interest.kind(), "a controller's pass")
            .await;
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
