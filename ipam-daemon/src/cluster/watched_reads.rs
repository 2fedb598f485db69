//! The operator's reads served from its watches, as a Kubernetes controller reads from its
//! informers: one watch per kind feeds a copy of every object of the kind, a pass lists from
//! that copy, and writes go to the store as before. Without it each pass listed every kind
//! from the store (every Service, node record and lease: at 10,000 Services a 10 MB read from
//! the API server every few seconds at rest, growing with the Services).
//!
//! Read your writes: a write through `WatchedReads` is awaited in the copy (its revision, or
//! its deletion, seen on the watch) before the kind is listed again, so a pass never decides
//! from a state older than the last pass's writes. Revisions are only compared for equality
//! (the Kubernetes API's resourceVersions are opaque). A write the watch has not shown within
//! `CATCH_UP` makes that list a direct one from the store, said in the log.
//!
//! Writes stay conditional on the revision read, so a copy a moment behind another writer
//! costs a conflict and another pass, never a lost update.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use ipam_core::store::{RawObject, Revision, Store, StoreError, Watch, WatchEvent};
use tokio::sync::{Notify, watch};

use super::cache::watch_kind_until_it_works;

/// How long a list waits for the watch to show the writes before it reads the store itself.
const CATCH_UP: Duration = Duration::from_secs(5);

/// A kind the operator reads, and whether a change of it is reason for a pass (a node lease
/// renewed every few seconds is not: lapses are looked for on a timer).
#[derive(Debug, Clone, Copy)]
pub struct Followed {
    pub kind: &'static str,
    pub wakes: bool,
}

/// The store, with the lists of the followed kinds served from their watches.
#[derive(Clone)]
pub struct WatchedReads<S> {
    store: S,
    copies: Arc<BTreeMap<&'static str, KindCopy>>,
    /// Reads go to the store itself (`reading_the_store`); writes are still awaited.
    direct: bool,
}

/// One kind's copy, shared between its follower task and the readers.
#[derive(Clone)]
struct KindCopy {
    state: Arc<Mutex<KindState>>,
    /// Bumped at every change of `state`, for readers waiting on it.
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct KindState {
    /// Whether the copy follows the store: false until the watch's first list arrived, and
    /// from a watch error until the watch delivers again (a watch refused for good, a 403,
    /// say, must not leave the operator deciding from a copy that stopped changing).
    synced: bool,
    objects: BTreeMap<String, RawObject>,
    /// Writes made through `WatchedReads` that the watch has not shown yet.
    awaited: BTreeMap<String, Awaited>,
    /// Changes the watch delivered so far.
    generation: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Awaited {
    Revision(Revision),
    Gone,
}

impl KindState {
    /// Takes one event in. A store's watch resumes where it was after an error, or resyncs:
    /// either way the copy follows the store again.
    fn apply(&mut self, event: WatchEvent) {
        self.synced = true;
        self.generation += 1;
        match event {
            WatchEvent::Put(object) => {
                let awaited = Awaited::Revision(object.revision.clone());
                if self.awaited.get(&object.name) == Some(&awaited) {
                    self.awaited.remove(&object.name);
                }
                self.objects.insert(object.name.clone(), object);
            }
            WatchEvent::Deleted { name, .. } => {
                if self.awaited.get(&name) == Some(&Awaited::Gone) {
                    self.awaited.remove(&name);
                }
                self.objects.remove(&name);
            }
            WatchEvent::Resync { objects, .. } => self.replace(objects),
        }
    }

    /// The whole kind afresh (the watch's first list, or a resync after it fell behind): what
    /// was awaited is in it or was overtaken.
    fn replace(&mut self, objects: Vec<RawObject>) {
        self.generation += 1;
        self.objects = objects.into_iter().map(|o| (o.name.clone(), o)).collect();
        self.awaited.clear();
        self.synced = true;
    }

    /// A write of `name` the store took at `revision`, to be seen before the next list.
    fn wrote(&mut self, name: &str, revision: &Revision) {
        // A write that changed nothing keeps its revision, and no event comes for it.
        let shown = self
            .objects
            .get(name)
            .is_some_and(|o| o.revision == *revision);
        if !shown {
            self.awaited
                .insert(name.to_owned(), Awaited::Revision(revision.clone()));
        }
    }

    fn deleted(&mut self, name: &str) {
        if self.objects.contains_key(name) {
            self.awaited.insert(name.to_owned(), Awaited::Gone);
        }
    }
}

impl<S: Store + Clone + 'static> WatchedReads<S> {
    /// Starts following `kinds` on `store`; the `Notify` is signalled when one whose `wakes`
    /// changes (and once each watch has started).
    pub fn follow(store: S, kinds: &[Followed]) -> (Self, Arc<Notify>) {
        let wake = Arc::new(Notify::new());
        let mut copies = BTreeMap::new();
        for followed in kinds {
            let copy = KindCopy {
                state: Arc::default(),
                changed: watch::Sender::new(0),
            };
            tokio::spawn(feed(store.clone(), *followed, copy.clone(), wake.clone()));
            copies.insert(followed.kind, copy);
        }
        let reads = Self {
            store,
            copies: Arc::new(copies),
            direct: false,
        };
        (reads, wake)
    }

    /// The same, reading from the store itself: for reads that must not come from a copy (a
    /// new leader restoring what it must never hand out twice reads what the store holds now,
    /// not what its watch has shown so far). Its writes are awaited in the copies all the same.
    pub fn reading_the_store(&self) -> Self {
        Self {
            direct: true,
            ..self.clone()
        }
    }
}

/// Follows one kind's watch into its copy until the process ends.
async fn feed<S: Store>(store: S, followed: Followed, copy: KindCopy, wake: Arc<Notify>) {
    let mut watch = watch_kind_until_it_works(&store, followed.kind, "the operator").await;
    copy.update(|state| state.replace(std::mem::take(&mut watch.initial)));
    wake.notify_one();
    loop {
        match watch.next().await {
            Ok(event) => {
                copy.update(|state| state.apply(event));
                if followed.wakes {
                    wake.notify_one();
                }
            }
            Err(e) => {
                // Until the watch delivers again (the shared watch lists the kind again after
                // an error, and sends the fresh list), lists read the store itself. The
                // shared watch says the trouble in the log, once for every subscriber.
                copy.update(|state| state.synced = false);
                tracing::debug!(
                    kind = followed.kind,
                    "store watch in trouble, reading the store itself until it delivers: {e}"
                );
            }
        }
    }
}

impl KindCopy {
    fn update(&self, change: impl FnOnce(&mut KindState)) {
        change(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner));
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn with<T>(&self, read: impl FnOnce(&KindState) -> T) -> T {
        read(&self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The kind's objects once the copy holds every write made through it, or `None` when it
    /// did not within `CATCH_UP`, or does not follow the store now.
    async fn caught_up_list(&self) -> Option<Vec<RawObject>> {
        let mut changed = self.changed.subscribe();
        let waited = tokio::time::timeout(CATCH_UP, async {
            loop {
                let now = self.with(|s| match (s.synced, s.awaited.is_empty()) {
                    (false, _) => Some(None),
                    (true, true) => Some(Some(s.objects.values().cloned().collect())),
                    (true, false) => None,
                });
                if let Some(objects) = now {
                    return objects;
                }
                if changed.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        })
        .await;
        waited.ok().flatten()
    }
}

impl<S: Store> WatchedReads<S> {
    /// A number that changes whenever the watch of one of `kinds` delivers a change, or `None`
    /// when one of them is not followed now (not yet synced, or its watch in trouble): a
    /// controller may skip a pass whose inputs have the same generation as its last one.
    pub fn generation(&self, kinds: &[&str]) -> Option<u64> {
        kinds.iter().try_fold(0u64, |sum, kind| {
            let copy = self.copies.get(kind)?;
            copy.with(|s| s.synced.then_some(sum.wrapping_add(s.generation)))
        })
    }

    fn copy(&self, kind: &str) -> Option<&KindCopy> {
        if self.direct {
            return None;
        }
        self.copies.get(kind)
    }
}

impl<S: Store> Store for WatchedReads<S> {
    async fn get(&self, kind: &str, name: &str) -> Result<Option<RawObject>, StoreError> {
        if let Some(copy) = self.copy(kind) {
            let cached = copy.with(|s| {
                (s.synced && !s.awaited.contains_key(name)).then(|| s.objects.get(name).cloned())
            });
            if let Some(object) = cached {
                return Ok(object);
            }
        }
        self.store.get(kind, name).await
    }

    async fn list(&self, kind: &str) -> Result<Vec<RawObject>, StoreError> {
        if let Some(copy) = self.copy(kind) {
            match copy.caught_up_list().await {
                // In name order, as the stores list.
                Some(objects) => return Ok(objects),
                None => tracing::debug!(
                    kind,
                    "the watch does not follow the store now, or has not shown this operator's \
                     last writes within {} s: listing from the store",
                    CATCH_UP.as_secs()
                ),
            }
        }
        self.store.list(kind).await
    }

    async fn create(&self, kind: &str, name: &str, value: Vec<u8>) -> Result<Revision, StoreError> {
        let revision = self.store.create(kind, name, value).await?;
        self.wrote(kind, name, &revision);
        Ok(revision)
    }

    async fn update(
        &self,
        kind: &str,
        name: &str,
        value: Vec<u8>,
        expected: &Revision,
    ) -> Result<Revision, StoreError> {
        let revision = self.store.update(kind, name, value, expected).await?;
        self.wrote(kind, name, &revision);
        Ok(revision)
    }

    async fn update_status(
        &self,
        kind: &str,
        name: &str,
        value: Vec<u8>,
        expected: &Revision,
    ) -> Result<Revision, StoreError> {
        let revision = self
            .store
            .update_status(kind, name, value, expected)
            .await?;
        self.wrote(kind, name, &revision);
        Ok(revision)
    }

    async fn delete(
        &self,
        kind: &str,
        name: &str,
        expected: Option<&Revision>,
    ) -> Result<(), StoreError> {
        self.store.delete(kind, name, expected).await?;
        if let Some(copy) = self.copy(kind) {
            copy.update(|s| s.deleted(name));
        }
        Ok(())
    }

    async fn watch(&self, kind: &str) -> Result<Watch, StoreError> {
        self.store.watch(kind).await
    }
}

impl<S> WatchedReads<S> {
    fn wrote(&self, kind: &str, name: &str, revision: &Revision) {
        if let Some(copy) = self.copies.get(kind) {
            copy.update(|s| s.wrote(name, revision));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use ipam_core::store::{Resource as _, TypedStore as _, embedded::EmbeddedStore};

    use super::*;

    #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Thing {
        size: u32,
    }

    impl ipam_core::store::Resource for Thing {
        const KIND: &'static str = "Thing";
    }

    /// A real embedded store whose watches show each change `LATE` after it happened (as a
    /// busy API server's do), and which counts the lists it serves.
    #[derive(Clone)]
    struct LateWatches {
        store: EmbeddedStore,
        lists: Arc<AtomicUsize>,
        /// Where each watch's events are fed, for a test to add an error of its own.
        feeds: Arc<Mutex<Vec<Feed>>>,
    }

    type Feed = tokio::sync::mpsc::Sender<Result<WatchEvent, StoreError>>;

    const LATE: Duration = Duration::from_millis(300);

    impl Store for LateWatches {
        async fn get(&self, kind: &str, name: &str) -> Result<Option<RawObject>, StoreError> {
            self.store.get(kind, name).await
        }
        async fn list(&self, kind: &str) -> Result<Vec<RawObject>, StoreError> {
            self.lists.fetch_add(1, Ordering::Relaxed);
            self.store.list(kind).await
        }
        async fn create(
            &self,
            kind: &str,
            name: &str,
            value: Vec<u8>,
        ) -> Result<Revision, StoreError> {
            self.store.create(kind, name, value).await
        }
        async fn update(
            &self,
            kind: &str,
            name: &str,
            value: Vec<u8>,
            expected: &Revision,
        ) -> Result<Revision, StoreError> {
            self.store.update(kind, name, value, expected).await
        }
        async fn update_status(
            &self,
            kind: &str,
            name: &str,
            value: Vec<u8>,
            expected: &Revision,
        ) -> Result<Revision, StoreError> {
            self.store.update_status(kind, name, value, expected).await
        }
        async fn delete(
            &self,
            kind: &str,
            name: &str,
            expected: Option<&Revision>,
        ) -> Result<(), StoreError> {
            self.store.delete(kind, name, expected).await
        }
        async fn watch(&self, kind: &str) -> Result<Watch, StoreError> {
            let mut inner = self.store.watch(kind).await?;
            let (tx, rx) = tokio::sync::mpsc::channel(64);
            let initial = std::mem::take(&mut inner.initial);
            let revision = inner.revision.clone();
            self.feeds.lock().unwrap().push(tx.clone());
            tokio::spawn(async move {
                loop {
                    let event = inner.next().await;
                    tokio::time::sleep(LATE).await;
                    if tx.send(event).await.is_err() {
                        return;
                    }
                }
            });
            Ok(Watch::new(initial, revision, rx))
        }
    }

    async fn late_store(dir: &tempfile::TempDir) -> LateWatches {
        LateWatches {
            store: EmbeddedStore::open(&dir.path().join("state.redb")).unwrap(),
            lists: Arc::default(),
            feeds: Arc::default(),
        }
    }

    /// `Thing`s followed on `store`, once the watch's first list is in: until then lists read
    /// the store, from then on the copy.
    async fn following_things(store: &LateWatches) -> (WatchedReads<LateWatches>, Arc<Notify>) {
        let (reads, wake) = WatchedReads::follow(
            store.clone(),
            &[Followed {
                kind: Thing::KIND,
                wakes: true,
            }],
        );
        tokio::time::timeout(Duration::from_secs(5), wake.notified())
            .await
            .expect("the watch starts");
        (reads, wake)
    }

    fn sizes(things: &[ipam_core::store::Versioned<Thing>]) -> Vec<(String, u32)> {
        things
            .iter()
            .map(|t| (t.name.clone(), t.value.size))
            .collect()
    }

    /// Lists are served from the watch's copy, never from the store, and a list right after a
    /// write through it shows that write although the watch shows it later.
    #[tokio::test]
    async fn lists_come_from_the_watch_and_show_this_operators_own_writes() {
        let dir = tempfile::tempdir().unwrap();
        let store = late_store(&dir).await;
        store.create_typed("a", &Thing { size: 1 }).await.unwrap();
        let (reads, _wake) = following_things(&store).await;
        assert_eq!(
            sizes(&reads.list_typed::<Thing>().await.unwrap()),
            [("a".into(), 1)]
        );

        reads.create_typed("b", &Thing { size: 2 }).await.unwrap();
        let listed = reads.list_typed::<Thing>().await.unwrap();
        assert_eq!(sizes(&listed), [("a".into(), 1), ("b".into(), 2)]);

        let b = listed.into_iter().find(|t| t.name == "b").unwrap();
        reads
            .update_typed("b", &Thing { size: 3 }, &b.revision)
            .await
            .unwrap();
        assert_eq!(
            sizes(&reads.list_typed::<Thing>().await.unwrap()),
            [("a".into(), 1), ("b".into(), 3)]
        );
        reads.delete("Thing", "a", None).await.unwrap();
        assert_eq!(
            sizes(&reads.list_typed::<Thing>().await.unwrap()),
            [("b".into(), 3)]
        );
        // The same object read back by name comes from the copy too.
        let got = reads.get_typed::<Thing>("b").await.unwrap().unwrap();
        assert_eq!(got.value.size, 3);
        assert_eq!(
            store.lists.load(Ordering::Relaxed),
            0,
            "no list reached the store"
        );
    }

    /// Another writer's change shows once its watch event arrives, and wakes the operator;
    /// `reading_the_store` reads what the store holds at once.
    #[tokio::test]
    async fn another_writers_change_shows_with_its_event_and_wakes() {
        let dir = tempfile::tempdir().unwrap();
        let store = late_store(&dir).await;
        let (reads, wake) = following_things(&store).await;
        assert!(reads.list_typed::<Thing>().await.unwrap().is_empty());

        store.create_typed("x", &Thing { size: 7 }).await.unwrap();
        assert_eq!(
            sizes(
                &reads
                    .reading_the_store()
                    .list_typed::<Thing>()
                    .await
                    .unwrap()
            ),
            [("x".into(), 7)],
            "read from the store itself"
        );
        assert!(
            reads.list_typed::<Thing>().await.unwrap().is_empty(),
            "the copy shows the change only with its event"
        );
        tokio::time::timeout(Duration::from_secs(5), wake.notified())
            .await
            .expect("the change wakes the operator");
        assert_eq!(
            sizes(&reads.list_typed::<Thing>().await.unwrap()),
            [("x".into(), 7)]
        );
        assert_eq!(
            store.lists.load(Ordering::Relaxed),
            1,
            "only the direct read"
        );
    }

    /// A watch in trouble (a refused watch, a lost connection) makes lists read the store
    /// itself until it delivers again: a copy that stopped changing is not decided from.
    #[tokio::test]
    async fn lists_read_the_store_while_the_watch_is_in_trouble() {
        let dir = tempfile::tempdir().unwrap();
        let store = late_store(&dir).await;
        let (reads, _wake) = following_things(&store).await;
        reads.list_typed::<Thing>().await.unwrap();
        assert_eq!(store.lists.load(Ordering::Relaxed), 0);

        let feed = store.feeds.lock().unwrap()[0].clone();
        let refused = StoreError::Backend {
            location: "the test".into(),
            source: "watch refused".into(),
        };
        feed.send(Err(refused)).await.unwrap();
        // The error comes `LATE` after it was fed, as every event here.
        tokio::time::sleep(LATE * 2).await;
        store.create_typed("y", &Thing { size: 9 }).await.unwrap();
        assert_eq!(
            sizes(&reads.list_typed::<Thing>().await.unwrap()),
            [("y".into(), 9)],
            "read from the store while the watch is in trouble"
        );
        assert_eq!(store.lists.load(Ordering::Relaxed), 1);

        // The watch delivers again (the create's event): the copy serves once more.
        tokio::time::sleep(LATE * 2).await;
        assert_eq!(
            sizes(&reads.list_typed::<Thing>().await.unwrap()),
            [("y".into(), 9)]
        );
        assert_eq!(
            store.lists.load(Ordering::Relaxed),
            1,
            "served from the copy"
        );
    }
}
