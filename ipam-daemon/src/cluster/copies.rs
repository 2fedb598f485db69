//! The typed copies of the store's kinds: one per kind for the whole process, decoded once and
//! read by every controller that declares the kind, each woken once for any number of changes
//! to the kinds it reads.
//!
//! A controller used to open a watch per kind it read, decode every event into a copy of its
//! own, and wait on all of them in a `select!` of its own: the L2 owners and the BGP announcer
//! each decoded every Service, endpoint and node record. Now a controller asks the store for
//! the kinds it reads (`ClusterStore::follow`), with one `Wake` for all of them; one task per
//! kind applies the kind's shared watch (`shared_watch`) to its copy, in batches, and wakes
//! every controller that reads it. The controller reads the copies when it decides, at one
//! `Moment` (no copy changes while it holds one, so a decision never sees one kind before a
//! change and another after it), and asks each whether it changed since (`Copy::changed`) for
//! work only that kind calls for. Copies are level-based: a controller sees the latest state
//! of each kind, never a stream of events, which is all a decision from a snapshot needs.
//!
//! One gate for every kind, not a lock per kind: a controller reading several kinds under
//! locks of their own, in another order than a second controller, with a change of each
//! kind waiting, would wait for ever. A moment is a read of the gate, a batch of changes a
//! write; neither a moment nor a reading is `Send`, so a task cannot hold one across an await
//! (none waits on the network while holding every change back). A batch is decoded before
//! the gate is taken, so the write lasts only as long as moving the decoded objects in.

use std::{
    any::Any,
    collections::BTreeMap,
    marker::PhantomData,
    sync::{
        Arc, Mutex, PoisonError, RwLockReadGuard, Weak,
        atomic::{AtomicU64, Ordering},
    },
};

use ipam_core::store::{Resource, Store, Watch};
use tokio::sync::{Notify, OnceCell, OwnedRwLockReadGuard, RwLock};

use super::cache::{Cache, Decoded, watch_until_it_works};

/// Wakes one controller when any copy it reads changes. Changes made while it works wake it
/// once more, not once each.
#[derive(Clone, Default)]
pub struct Wake(Arc<Notify>);

impl Wake {
    /// Returns at the next change of a copy this controller reads (at once if one changed
    /// since the last call).
    pub async fn changed(&self) {
        self.0.notified().await;
    }
}

/// The gate every copy of one store changes behind.
type Gate = Arc<RwLock<()>>;

/// A moment of the copies: while it is held, none of them changes. Not `Send`, so a task
/// cannot hold one across an await (a moment that waited on anything else would hold every
/// change of every kind back meanwhile).
pub struct Moment {
    gate: OwnedRwLockReadGuard<()>,
    not_send: PhantomData<*const ()>,
}

/// One controller's handle on the process's copy of `T`'s kind.
pub struct Copy<T> {
    shared: Arc<Shared<T>>,
    /// The copy's generation when this controller last asked `changed`.
    seen: u64,
}

impl<T: Resource> Copy<T> {
    /// The copy as it is at `moment`.
    pub fn read<'a>(&'a self, moment: &'a Moment) -> RwLockReadGuard<'a, Cache<T>> {
        debug_assert!(
            Arc::ptr_eq(
                OwnedRwLockReadGuard::rwlock(&moment.gate),
                &self.shared.gate
            ),
            "a moment of the copies of another store"
        );
        // Uncontended: changes are written only under the gate, which `moment` holds.
        self.shared
            .cache
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the copy changed since the last call (the first call says whether it changed
    /// since this handle was made).
    pub fn changed(&mut self) -> bool {
        let now = self.shared.generation.load(Ordering::Acquire);
        let changed = now != self.seen;
        self.seen = now;
        changed
    }
}

/// The copy of one kind and the controllers it wakes.
struct Shared<T> {
    gate: Gate,
    cache: std::sync::RwLock<Cache<T>>,
    /// Bumped after every batch of changes applied.
    generation: AtomicU64,
    /// The controllers that read the copy (gone ones are dropped at the next change).
    wakers: Mutex<Vec<Weak<Notify>>>,
}

impl<T> Shared<T> {
    fn subscribe(&self, wake: &Wake) {
        self.lock_wakers().push(Arc::downgrade(&wake.0));
    }

    fn wake_all(&self) {
        self.lock_wakers().retain(|w| match w.upgrade() {
            Some(notify) => {
                notify.notify_one();
                true
            }
            None => false,
        });
    }

    fn lock_wakers(&self) -> std::sync::MutexGuard<'_, Vec<Weak<Notify>>> {
        self.wakers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

type AnyShared = Arc<dyn Any + Send + Sync>;

/// The copies of one store's kinds, made at the first `follow` of each.
#[derive(Default)]
pub struct Copies {
    gate: Gate,
    kinds: Mutex<BTreeMap<&'static str, Arc<OnceCell<AnyShared>>>>,
}

impl Copies {
    /// The copies as they are now, until the moment is dropped (changes wait meanwhile).
    pub async fn moment(&self) -> Moment {
        Moment {
            gate: self.gate.clone().read_owned().await,
            not_send: PhantomData,
        }
    }

    /// `T`'s copy for a controller woken by `wake`: the first call for a kind starts following
    /// it (retrying with backoff, said in the log with `for_what`, until the store answers) and
    /// returns once the copy holds the kind's first list; later calls share that copy.
    pub async fn follow<T, S>(&self, store: &S, wake: &Wake, for_what: &str) -> Copy<T>
    where
        T: Resource + 'static,
        S: Store,
    {
        let cell = self
            .kinds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(T::KIND)
            .or_default()
            .clone();
        let any = cell
            .get_or_init(|| async {
                let watch = watch_until_it_works::<T, _>(store, for_what).await;
                let shared = Arc::new(Shared {
                    gate: self.gate.clone(),
                    cache: std::sync::RwLock::new(Cache::<T>::new(&watch.initial)),
                    generation: AtomicU64::new(0),
                    wakers: Mutex::new(Vec::new()),
                });
                tokio::spawn(keep_current(shared.clone(), watch));
                shared as AnyShared
            })
            .await
            .clone();
        let shared = any
            .downcast::<Shared<T>>()
            .unwrap_or_else(|_| unreachable!("one kind name is one type: {}", T::KIND));
        shared.subscribe(wake);
        Copy {
            seen: shared.generation.load(Ordering::Acquire),
            shared,
        }
    }
}

/// Applies the kind's watch to its copy for the life of the process: every change ready is
/// decoded first, then applied under one write of the gate, then the readers are woken once.
/// The gate is held only to move decoded objects into the copy: a relist of thousands of
/// Services decoded under it held every controller back, whatever kinds it reads.
async fn keep_current<T: Resource>(shared: Arc<Shared<T>>, mut watch: Watch) {
    loop {
        let mut batch = vec![Decoded::<T>::from_event(watch.next().await)];
        while let Some(more) = watch.try_next() {
            batch.push(Decoded::from_event(more));
        }
        {
            let _gate = shared.gate.write().await;
            let mut cache = shared.cache.write().unwrap_or_else(PoisonError::into_inner);
            for decoded in batch {
                cache.apply_decoded(decoded);
            }
            // Inside the write: a moment that sees the changes sees the generation that
            // says so.
            shared.generation.fetch_add(1, Ordering::AcqRel);
        }
        shared.wake_all();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ipam_core::{
        lb::resources::Namespace,
        store::{TypedStore as _, embedded::EmbeddedStore},
    };

    use super::*;

    fn namespace(labels: &[(&str, &str)]) -> Namespace {
        Namespace {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    async fn woken(wake: &Wake) -> bool {
        tokio::time::timeout(Duration::from_secs(5), wake.changed())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn controllers_share_one_copy_and_each_is_woken_by_its_changes() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = EmbeddedStore::open(&dir.path().join("state.redb")).expect("store");
        store
            .create_typed("team-a", &namespace(&[("tier", "one")]))
            .await
            .expect("create");
        let copies = Copies::default();
        let (l2, bgp) = (Wake::default(), Wake::default());
        let mut for_l2 = copies.follow::<Namespace, _>(&store, &l2, "test L2").await;
        let mut for_bgp = copies
            .follow::<Namespace, _>(&store, &bgp, "test BGP")
            .await;
        assert!(Arc::ptr_eq(&for_l2.shared, &for_bgp.shared), "one copy");
        let at = copies.moment().await;
        assert!(for_l2.read(&at).get("team-a").is_some(), "first list");
        drop(at);
        assert!(!for_l2.changed(), "nothing changed yet");

        store
            .create_typed("team-b", &namespace(&[]))
            .await
            .expect("create");
        assert!(woken(&l2).await && woken(&bgp).await, "both woken");
        assert!(for_l2.changed() && !for_l2.changed(), "changed once");
        let at = copies.moment().await;
        assert!(for_bgp.read(&at).get("team-b").is_some());
        drop(at);
        assert!(for_bgp.changed());

        // A burst while nobody waits: the next wake sees all of it.
        for name in ["team-c", "team-d", "team-e"] {
            store
                .create_typed(name, &namespace(&[]))
                .await
                .expect("create");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(woken(&l2).await);
        let at = copies.moment().await;
        assert_eq!(for_l2.read(&at).iter().count(), 5);
        drop(at);

        // A controller gone is not woken, and holds nothing up.
        drop(bgp);
        store
            .create_typed("team-f", &namespace(&[]))
            .await
            .expect("create");
        assert!(woken(&l2).await);
        assert_eq!(for_l2.shared.lock_wakers().len(), 1);
    }

    #[tokio::test]
    async fn no_copy_changes_while_a_moment_is_held() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = EmbeddedStore::open(&dir.path().join("state.redb")).expect("store");
        let copies = Copies::default();
        let wake = Wake::default();
        let namespaces = copies.follow::<Namespace, _>(&store, &wake, "test").await;
        let at = copies.moment().await;
        store
            .create_typed("team-a", &namespace(&[]))
            .await
            .expect("create");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(namespaces.read(&at).iter().count(), 0, "held: not applied");
        drop(at);
        assert!(woken(&wake).await);
        let at = copies.moment().await;
        assert_eq!(
            namespaces.read(&at).iter().count(),
            1,
            "applied once let go"
        );
    }
}
