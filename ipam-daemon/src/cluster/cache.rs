//! A controller's copy of one kind of object, kept current by the store's watch: it starts
//! from the watch's initial list and applies every change, so a controller that needs all nodes
//! or all services never lists them per change.

use std::{collections::BTreeMap, time::Duration};

use ipam_core::{
    backoff::Backoff,
    store::{RawObject, Resource, Store, Versioned, Watch, WatchEvent, decode},
};

/// Longest wait between two attempts to start a watch while the store is unreachable.
const RETRY_CAP: Duration = Duration::from_secs(10);

/// Starts watching `T`'s kind, retrying with backoff (and saying so) until the store answers.
pub async fn watch_until_it_works<T: Resource, S: Store>(store: &S, for_what: &str) -> Watch {
    watch_kind_until_it_works(store, T::KIND, for_what).await
}

/// Starts watching `kind`, retrying with backoff (and saying so) until the store answers.
pub async fn watch_kind_until_it_works<S: Store>(store: &S, kind: &str, for_what: &str) -> Watch {
    let mut backoff = Backoff::new(RETRY_CAP);
    loop {
        match store.watch(kind).await {
            Ok(w) => return w,
            Err(e) => {
                let delay = backoff.next_delay();
                tracing::warn!(
                    kind,
                    retry_in_ms = delay.as_millis() as u64,
                    "cannot follow the store for {for_what} yet: {e}"
                );
                tokio::time::sleep(delay).await;
            }
        }
    }
}

pub struct Cache<T> {
    objects: BTreeMap<String, Versioned<T>>,
    /// False from a watch error until the watch's next event: the copy may be behind the
    /// store meanwhile (`shared_watch` sends the error to every subscriber, then a fresh
    /// list).
    fresh: bool,
}

impl<T: Resource> Cache<T> {
    pub fn new(initial: &[RawObject]) -> Self {
        let mut cache = Self {
            objects: BTreeMap::new(),
            fresh: true,
        };
        cache.replace(initial);
        cache
    }

    /// Applies one watch event; an `Err` (store trouble the watch retries, said in the log by
    /// the shared watch) leaves the copy not known fresh until the next event.
    pub fn apply(&mut self, event: Result<WatchEvent, ipam_core::store::StoreError>) {
        self.fresh = event.is_ok();
        match event {
            Ok(WatchEvent::Put(o)) => self.insert(&o),
            Ok(WatchEvent::Deleted { name, .. }) => {
                self.objects.remove(&name);
            }
            Ok(WatchEvent::Resync { objects, .. }) => self.replace(&objects),
            Err(e) => tracing::debug!(kind = T::KIND, "watch in trouble, resuming: {e}"),
        }
    }

    fn replace(&mut self, objects: &[RawObject]) {
        self.objects.clear();
        for o in objects {
            self.insert(o);
        }
    }

    fn insert(&mut self, o: &RawObject) {
        match decode::<T>(o) {
            Ok(v) => {
                self.objects.insert(v.name.clone(), v);
            }
            Err(e) => tracing::warn!("{e}"),
        }
    }

    /// Whether the copy follows the store: no watch error since its last event. A decision
    /// that cannot be undone (a node reported dead) waits for a fresh copy.
    pub fn is_fresh(&self) -> bool {
        self.fresh
    }

    pub fn get(&self, name: &str) -> Option<&Versioned<T>> {
        self.objects.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Versioned<T>> {
        self.objects.values()
    }
}
