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

/// One watch event of `T`'s kind, decoded and ready to apply to a copy.
pub enum Decoded<T> {
    Put(Versioned<T>),
    Deleted(String),
    /// The whole kind listed again.
    Resync(Vec<Versioned<T>>),
    /// An object that does not decode (said in the log, with its name): the copy keeps what
    /// it had.
    Undecodable,
    /// Store trouble the watch retries: the copy is not known fresh until the next event.
    Trouble,
}

impl<T: Resource> Decoded<T> {
    pub fn from_event(event: Result<WatchEvent, ipam_core::store::StoreError>) -> Self {
        match event {
            Ok(WatchEvent::Put(o)) => decode_logged(&o).map_or(Self::Undecodable, Self::Put),
            Ok(WatchEvent::Deleted { name, .. }) => Self::Deleted(name),
            Ok(WatchEvent::Resync { objects, .. }) => Self::Resync(decode_all(&objects)),
            Err(e) => {
                tracing::debug!(kind = T::KIND, "watch in trouble, resuming: {e}");
                Self::Trouble
            }
        }
    }
}

/// `o` decoded, or `None` with a warning that names it.
fn decode_logged<T: Resource>(o: &RawObject) -> Option<Versioned<T>> {
    decode::<T>(o).map_err(|e| tracing::warn!("{e}")).ok()
}

/// The objects of `objects` that decode (each other one said in the log).
fn decode_all<T: Resource>(objects: &[RawObject]) -> Vec<Versioned<T>> {
    objects.iter().filter_map(decode_logged).collect()
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
        self.apply_decoded(Decoded::from_event(event));
    }

    /// Applies one event decoded beforehand ([`Decoded::from_event`]): what a copy many
    /// readers share does, so that a relist of thousands of objects is decoded before the
    /// copy is locked, not while every reader waits.
    pub fn apply_decoded(&mut self, decoded: Decoded<T>) {
        self.fresh = !matches!(decoded, Decoded::Trouble);
        match decoded {
            Decoded::Put(v) => {
                self.objects.insert(v.name.clone(), v);
            }
            Decoded::Deleted(name) => {
                self.objects.remove(&name);
            }
            Decoded::Resync(objects) => {
                self.objects = objects.into_iter().map(|v| (v.name.clone(), v)).collect();
            }
            Decoded::Undecodable | Decoded::Trouble => {}
        }
    }

    fn replace(&mut self, objects: &[RawObject]) {
        self.objects = decode_all::<T>(objects)
            .into_iter()
            .map(|v| (v.name.clone(), v))
            .collect();
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

#[cfg(test)]
mod tests {
    use ipam_core::{
        lb::resources::Namespace,
        store::{Resource as _, StoreError},
    };

    use super::*;

    fn namespace(name: &str, json: &str) -> RawObject {
        RawObject {
            kind: Namespace::KIND.to_owned(),
            name: name.to_owned(),
            revision: 1.into(),
            value: json.as_bytes().to_vec(),
        }
    }

    fn names(cache: &Cache<Namespace>) -> Vec<&str> {
        cache.iter().map(|v| v.name.as_str()).collect()
    }

    /// A shared copy applies events decoded before its lock is taken: each kind of event
    /// leaves it as applying the event itself did, an object that does not decode leaves
    /// what the copy had, and store trouble leaves it not known fresh until the next event.
    #[test]
    fn a_copy_follows_decoded_events_and_keeps_what_it_had_when_one_does_not_decode() {
        let labelled = r#"{"labels":{"tier":"one"}}"#;
        let mut cache = Cache::<Namespace>::new(&[
            namespace("team-a", labelled),
            namespace("broken", "not json"),
        ]);
        assert_eq!(names(&cache), ["team-a"], "the undecodable one left out");
        cache.apply_decoded(Decoded::from_event(Ok(WatchEvent::Put(namespace(
            "team-b", "{}",
        )))));
        assert_eq!(names(&cache), ["team-a", "team-b"]);
        cache.apply_decoded(Decoded::from_event(Ok(WatchEvent::Put(namespace(
            "team-a", "{",
        )))));
        let kept = &cache.get("team-a").expect("kept").value;
        assert_eq!(kept.labels["tier"], "one", "what it had");
        assert!(cache.is_fresh());
        let trouble = StoreError::Backend {
            location: "test".into(),
            source: "connection reset".into(),
        };
        cache.apply_decoded(Decoded::from_event(Err(trouble)));
        assert!(!cache.is_fresh(), "not known fresh after trouble");
        assert_eq!(names(&cache), ["team-a", "team-b"], "and unchanged");
        cache.apply_decoded(Decoded::from_event(Ok(WatchEvent::Resync {
            kind: Namespace::KIND.to_owned(),
            revision: 7.into(),
            objects: vec![namespace("team-c", "{}"), namespace("bad", "[")],
        })));
        assert!(cache.is_fresh());
        assert_eq!(names(&cache), ["team-c"], "a relist replaces the copy");
        cache.apply_decoded(Decoded::from_event(Ok(WatchEvent::Deleted {
            kind: Namespace::KIND.to_owned(),
            name: "team-c".into(),
            revision: 8.into(),
        })));
        assert!(names(&cache).is_empty());
    }
}
