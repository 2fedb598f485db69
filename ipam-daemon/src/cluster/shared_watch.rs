//! One store watch per kind for the whole process, shared by every controller that follows the
//! kind: the first `watch` of a kind starts the store's watch and a hub task that keeps the
//! kind's objects; every later `watch` gets the hub's current objects as its initial list and
//! the hub's events from then on, in the store's order. So an agent whose L2 owners, BGP
//! announcer, routes, gossip and pod IPAM all follow the node records holds one watch on the
//! store (one on the API server at 1,000 nodes: 1,000, not 5,000), and they all judge the same
//! sequence of states.
//!
//! A subscriber that stops reading is not allowed to hold the others up: when its buffer is
//! full it misses events, and once it has room again it gets the kind's whole current state as
//! a `Resync` (the same event a store's watch sends when it fell behind), at the next event or
//! within a second.
//!
//! The counts show in `ipam_store_watches` (store watches open, per kind: 1 at most) and
//! `ipam_store_watch_subscribers` (controllers following each).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, OnceLock, PoisonError},
    time::Duration,
};

use ipam_core::store::{RawObject, Revision, Store, StoreError, WATCH_BUFFER, Watch, WatchEvent};
use prometheus_client::metrics::{family::Family, gauge::Gauge};
use tokio::sync::{mpsc, oneshot};

use crate::metrics::{KindLabel, Metrics};

/// How often a subscriber that fell behind is offered the current state again when no event
/// comes.
const CATCH_UP: Duration = Duration::from_secs(1);

/// The hubs of one store, one per kind followed so far.
#[derive(Default)]
pub struct SharedWatches {
    hubs: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<Option<Hub>>>>>,
    gauges: OnceLock<WatchGauges>,
}

/// Where the hubs count what they serve.
#[derive(Clone)]
struct WatchGauges {
    watches: Family<KindLabel, Gauge>,
    subscribers: Family<KindLabel, Gauge>,
}

/// A running hub: where to ask it for a watch.
struct Hub {
    requests: mpsc::UnboundedSender<oneshot::Sender<Watch>>,
}

impl SharedWatches {
    /// Counts the watches in `metrics` from now on (once; later calls change nothing).
    pub fn count_in(&self, metrics: &Metrics) {
        let _ = self.gauges.set(WatchGauges {
            watches: metrics.store_watches.clone(),
            subscribers: metrics.store_watch_subscribers.clone(),
        });
    }

    /// A watch of `kind`, served by the kind's hub (started, with the store's watch, on first
    /// use). Fails as the store's `watch` fails while no hub of the kind runs.
    pub async fn watch<S>(&self, store: &S, kind: &str) -> Result<Watch, StoreError>
    where
        S: Store + Sync,
    {
        let slot = self
            .hubs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(kind.to_owned())
            .or_default()
            .clone();
        // Held while the store's watch starts, so concurrent first subscribers share it.
        let mut hub = slot.lock().await;
        loop {
            if let Some(running) = hub.as_ref() {
                let (reply, watch) = oneshot::channel();
                if running.requests.send(reply).is_ok()
                    && let Ok(watch) = watch.await
                {
                    return Ok(watch);
                }
            }
            // None yet, or it ended (its runtime shut down): start one.
            let upstream = store.watch(kind).await?;
            let (requests, requests_rx) = mpsc::unbounded_channel();
            let gauges = self.gauges.get().cloned();
            tokio::spawn(run(kind.to_owned(), upstream, requests_rx, gauges));
            *hub = Some(Hub { requests });
        }
    }
}

/// One subscriber's end, and whether it missed events.
struct Subscriber {
    events: mpsc::Sender<Result<WatchEvent, StoreError>>,
    behind: bool,
}

/// The kind's objects as the hub last saw them.
struct State {
    kind: String,
    objects: BTreeMap<String, RawObject>,
    revision: Revision,
}

impl State {
    fn apply(&mut self, event: &WatchEvent) {
        match event {
            WatchEvent::Put(o) => {
                self.objects.insert(o.name.clone(), o.clone());
            }
            WatchEvent::Deleted { name, .. } => {
                self.objects.remove(name);
            }
            WatchEvent::Resync { objects, .. } => {
                self.objects = objects
                    .iter()
                    .map(|o| (o.name.clone(), o.clone()))
                    .collect();
            }
        }
        self.revision = event.revision().clone();
    }

    fn snapshot(&self) -> Vec<RawObject> {
        self.objects.values().cloned().collect()
    }

    fn resync(&self) -> WatchEvent {
        WatchEvent::Resync {
            kind: self.kind.clone(),
            revision: self.revision.clone(),
            objects: self.snapshot(),
        }
    }
}

impl Subscriber {
    /// Passes `event` on, or the whole state to one that missed events and has room again.
    fn offer(&mut self, event: &WatchEvent, state: &State) {
        if self.behind {
            self.catch_up(state);
        } else if let Err(mpsc::error::TrySendError::Full(_)) =
            self.events.try_send(Ok(event.clone()))
        {
            self.behind = true;
        }
    }

    fn catch_up(&mut self, state: &State) {
        if self.events.try_send(Ok(state.resync())).is_ok() {
            self.behind = false;
        }
    }
}

/// The hub of one kind: follows the store's watch for as long as anyone can subscribe.
async fn run(
    kind: String,
    mut upstream: Watch,
    mut requests: mpsc::UnboundedReceiver<oneshot::Sender<Watch>>,
    gauges: Option<WatchGauges>,
) {
    let label = KindLabel { kind: kind.clone() };
    let count = |subscribers: usize| {
        if let Some(g) = &gauges {
            g.subscribers.get_or_create(&label).set(subscribers as i64);
        }
    };
    if let Some(g) = &gauges {
        g.watches.get_or_create(&label).inc();
    }
    let mut state = State {
        objects: std::mem::take(&mut upstream.initial)
            .into_iter()
            .map(|o| (o.name.clone(), o))
            .collect(),
        revision: upstream.revision.clone(),
        kind,
    };
    let mut subscribers: Vec<Subscriber> = Vec::new();
    let mut catch_up = tokio::time::interval(CATCH_UP);
    catch_up.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let behind = subscribers.iter().any(|s| s.behind);
        tokio::select! {
            request = requests.recv() => {
                // Every handle of the store is gone: nobody can subscribe any more.
                let Some(reply) = request else { break };
                let (events, rx) = mpsc::channel(WATCH_BUFFER);
                let watch = Watch::new(state.snapshot(), state.revision.clone(), rx);
                if reply.send(watch).is_ok() {
                    subscribers.push(Subscriber { events, behind: false });
                }
            }
            event = upstream.next() => match event {
                Ok(event) => {
                    state.apply(&event);
                    for s in &mut subscribers {
                        s.offer(&event, &state);
                    }
                }
                // The store's watch resumes by itself; its subscribers need not know.
                Err(e) => tracing::warn!(
                    kind = state.kind.as_str(),
                    "store watch interrupted, resuming where it was: {e}"
                ),
            },
            _ = catch_up.tick(), if behind => {
                for s in subscribers.iter_mut().filter(|s| s.behind) {
                    s.catch_up(&state);
                }
            }
        }
        subscribers.retain(|s| !s.events.is_closed());
        count(subscribers.len());
    }
    if let Some(g) = &gauges {
        g.watches.get_or_create(&label).dec();
    }
    count(0);
}

#[cfg(test)]
mod tests {
    use ipam_core::store::{Resource as _, TypedStore as _, embedded::EmbeddedStore};

    use super::*;
    use crate::metrics::Metrics;

    #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
    struct Thing {
        size: u32,
    }

    impl ipam_core::store::Resource for Thing {
        const KIND: &'static str = "Thing";
    }

    fn put_name(event: &WatchEvent) -> &str {
        match event {
            WatchEvent::Put(o) => &o.name,
            other => panic!("expected a put, got {other:?}"),
        }
    }

    /// Subscribers of one kind share one store watch; a late subscriber starts from the
    /// current objects; each sees every change after its start, in order.
    #[tokio::test]
    async fn one_store_watch_serves_every_subscriber_in_order() {
        let path = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&path.path().join("state.redb")).unwrap();
        let metrics = Metrics::new();
        let shared = SharedWatches::default();
        shared.count_in(&metrics);
        store.create_typed("a", &Thing { size: 1 }).await.unwrap();

        let mut first = shared.watch(&store, Thing::KIND).await.unwrap();
        assert_eq!(first.initial.len(), 1);
        store.create_typed("b", &Thing { size: 2 }).await.unwrap();
        assert_eq!(put_name(&first.next().await.unwrap()), "b");

        let mut second = shared.watch(&store, Thing::KIND).await.unwrap();
        let names: Vec<&str> = second.initial.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(
            names,
            ["a", "b"],
            "a late subscriber starts from the current objects"
        );
        store.create_typed("c", &Thing { size: 3 }).await.unwrap();
        assert_eq!(put_name(&first.next().await.unwrap()), "c");
        assert_eq!(put_name(&second.next().await.unwrap()), "c");

        let label = KindLabel {
            kind: Thing::KIND.to_owned(),
        };
        assert_eq!(metrics.store_watches.get_or_create(&label).get(), 1);
        assert_eq!(
            metrics.store_watch_subscribers.get_or_create(&label).get(),
            2
        );
        drop(second);
        store.create_typed("d", &Thing { size: 4 }).await.unwrap();
        assert_eq!(put_name(&first.next().await.unwrap()), "d");
        assert_eq!(
            metrics.store_watch_subscribers.get_or_create(&label).get(),
            1
        );
    }

    /// A subscriber that does not read misses events rather than holding the others up, and
    /// gets the whole state once it reads again.
    #[tokio::test]
    async fn a_subscriber_that_falls_behind_gets_the_whole_state() {
        let path = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&path.path().join("state.redb")).unwrap();
        let shared = SharedWatches::default();
        let mut reader = shared.watch(&store, Thing::KIND).await.unwrap();
        let mut sleeper = shared.watch(&store, Thing::KIND).await.unwrap();
        let changes = WATCH_BUFFER + 10;
        for i in 0..changes {
            let name = format!("t{i}");
            store.create_typed(&name, &Thing { size: 0 }).await.unwrap();
            assert_eq!(put_name(&reader.next().await.unwrap()), name);
        }
        // The sleeper's buffer holds the first WATCH_BUFFER changes; then the whole state.
        for _ in 0..WATCH_BUFFER {
            assert!(matches!(sleeper.next().await.unwrap(), WatchEvent::Put(_)));
        }
        match sleeper.next().await.unwrap() {
            WatchEvent::Resync { objects, .. } => assert_eq!(objects.len(), changes),
            other => panic!("expected the whole state, got {other:?}"),
        }
    }
}
