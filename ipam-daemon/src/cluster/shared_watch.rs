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
//! A watch in trouble is everyone's business. A watch can fail for good while get and list
//! work (no `watch` right on the kind, an API server or proxy that closes watches, a store
//! member whose watches break), and a store's watch that resumes by itself may never deliver
//! again: a copy that silently stops changing makes the operator skip every LB-IPAM pass and
//! see live nodes' leases as unrenewed. So at a watch error the hub
//! - passes the error on to every subscriber: until its next event, a subscriber's copy is
//!   stale (`WatchedReads` lists from the store itself meanwhile; `Cache::is_fresh` is false,
//!   and what destroys on a node's word, reports of dead nodes, waits);
//! - drops the store's watch and lists and watches the kind again, with backoff
//!   (`REWATCH_FIRST` to `REWATCH_CAP`), giving every subscriber the fresh list as a `Resync`:
//!   a watch refused for good still leaves every copy at most `REWATCH_CAP` behind;
//! - counts the kind stale (`ipam_store_watch_stale`, `ipam_store_watch_errors_total`) until
//!   a watch started again has run `SETTLE` without an error (or delivered a change), says so
//!   in the log (the kind, the store and why; once, then every `SAY_AGAIN` while it lasts), and
//!   turns `/readyz` false once it has lasted `STALE_NOT_READY`.
//!
//! The counts show in `ipam_store_watches` (store watches open, per kind: 1 at most) and
//! `ipam_store_watch_subscribers` (controllers following each).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, OnceLock, PoisonError},
    time::Duration,
};

use ipam_core::{
    backoff::Backoff,
    store::{RawObject, Revision, Store, StoreError, WATCH_BUFFER, Watch, WatchEvent},
};
use tokio::{
    sync::{mpsc, oneshot},
    time::Instant,
};

use crate::metrics::{KindLabel, Observed};

/// How often a subscriber that fell behind is offered the current state again when no event
/// comes.
const CATCH_UP: Duration = Duration::from_secs(1);

/// The first pause before a kind whose watch failed is listed and watched again; it doubles
/// up to `REWATCH_CAP` while the trouble lasts. Each attempt lists the whole kind, so it is
/// paced: at the cap, a watch refused for good costs one list of the kind per 10 s.
const REWATCH_FIRST: Duration = Duration::from_secs(1);
const REWATCH_CAP: Duration = Duration::from_secs(10);

/// A watch started again is trusted once it has run this long without an error (a refused
/// watch fails at once; a store that breaks watches breaks them within this).
const SETTLE: Duration = Duration::from_secs(3);

/// How long a kind may be stale before `/readyz` says the process is not ready.
pub const STALE_NOT_READY: Duration = Duration::from_secs(30);

/// Trouble that goes on is said in the log again this often.
const SAY_AGAIN: Duration = Duration::from_secs(60);

/// The readiness check a stale kind fails.
const CHECK: &str = "store watches";

/// The hubs of one store, one per kind followed so far.
pub struct SharedWatches {
    hubs: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<Option<Hub>>>>>,
    board: Arc<Board>,
}

impl Default for SharedWatches {
    fn default() -> Self {
        Self::new("the store".into())
    }
}

/// What the hubs of one store report: to the metrics and readiness, and to whoever asks.
struct Board {
    /// Where the store is, for the logs.
    location: String,
    observed: OnceLock<Observed>,
    /// The kinds whose copies are stale now.
    stale: Mutex<BTreeMap<String, Stale>>,
}

/// A copy that may be behind the store: since when, and the last error's words.
#[derive(Debug, Clone)]
pub struct Stale {
    pub since: Instant,
    pub why: String,
}

/// A running hub: where to ask it for a watch.
struct Hub {
    requests: mpsc::UnboundedSender<oneshot::Sender<Watch>>,
}

impl SharedWatches {
    /// The hubs of the store at `location` (as logs name it).
    pub fn new(location: String) -> Self {
        Self {
            hubs: Mutex::default(),
            board: Arc::new(Board {
                location,
                observed: OnceLock::new(),
                stale: Mutex::default(),
            }),
        }
    }

    /// Counts the watches in `observed`'s metrics and fails its readiness for a kind stale too
    /// long, from now on (once; later calls change nothing).
    pub fn count_in(&self, observed: &Observed) {
        let _ = self.board.observed.set(observed.clone());
    }

    /// Whether `kind`'s copy is stale now, and since when: `None` while its watch follows the
    /// store (or nobody follows the kind).
    pub fn stale(&self, kind: &str) -> Option<Stale> {
        self.board.stale_kinds().remove(kind)
    }

    /// A watch of `kind`, served by the kind's hub (started, with the store's watch, on first
    /// use). Fails as the store's `watch` fails while no hub of the kind runs.
    pub async fn watch<S>(&self, store: &S, kind: &str) -> Result<Watch, StoreError>
    where
        S: Store + Clone + 'static,
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
            let hub_task = HubTask::new(kind, store.clone(), self.board.clone());
            tokio::spawn(hub_task.run(upstream, requests_rx));
            *hub = Some(Hub { requests });
        }
    }
}

impl Board {
    fn stale_kinds(&self) -> BTreeMap<String, Stale> {
        self.stale
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records `kind` stale (or not), in the metric and readiness too.
    fn set_stale(&self, kind: &str, stale: Option<Stale>) {
        {
            let mut kinds = self.stale.lock().unwrap_or_else(PoisonError::into_inner);
            match &stale {
                Some(s) => kinds.insert(kind.to_owned(), s.clone()),
                None => kinds.remove(kind),
            };
        }
        if let Some(o) = self.observed.get() {
            let label = KindLabel { kind: kind.into() };
            let gauge = o.metrics.store_watch_stale.get_or_create(&label);
            gauge.set(i64::from(stale.is_some()));
        }
        self.judge_readiness();
    }

    /// Not ready while a kind has been stale `STALE_NOT_READY` or longer, saying which and why.
    fn judge_readiness(&self) {
        let Some(o) = self.observed.get() else { return };
        let now = Instant::now();
        let too_long: Vec<String> = self
            .stale_kinds()
            .iter()
            .filter(|(_, s)| now.duration_since(s.since) >= STALE_NOT_READY)
            .map(|(kind, s)| {
                format!(
                    "the {kind} watch on {} has failed for {} s ({}); {kind} objects are read \
                     from the store itself meanwhile",
                    self.location,
                    now.duration_since(s.since).as_secs(),
                    s.why
                )
            })
            .collect();
        if too_long.is_empty() {
            // Said only once something was stale, so that `/readyz` lists no check it never
            // failed.
            if o.health.has(CHECK) {
                o.health.set(CHECK, Ok(()));
            }
        } else {
            o.health.set(CHECK, Err(too_long.join("; ")));
        }
    }

    fn count_error(&self, kind: &str) {
        if let Some(o) = self.observed.get() {
            let label = KindLabel { kind: kind.into() };
            o.metrics.store_watch_errors.get_or_create(&label).inc();
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

    /// Tells it its copy is stale. One that is behind gets the whole state later, and with it
    /// a copy as fresh as the hub's.
    fn warn(&mut self, trouble: StoreError) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.events.try_send(Err(trouble)) {
            self.behind = true;
        }
    }
}

/// Gives the subscribers that fell behind the hub's whole state, each followed by `stale`
/// when the hub's copy is not known fresh: a subscriber whose buffer was full when the watch
/// failed lost that warning, and would otherwise take the hub's copy for a fresh one.
fn catch_up_all(subscribers: &mut [Subscriber], state: &State, stale: Option<&StoreError>) {
    for s in subscribers.iter_mut().filter(|s| s.behind) {
        // The state and its warning go together or not at all: the state alone, with no room
        // left for the warning, would pass for fresh. The hub is the channel's one sender, so
        // the room seen here is still there below.
        if stale.is_some() && s.events.capacity() < 2 {
            continue;
        }
        s.catch_up(state);
        if let Some(notice) = stale
            && !s.behind
        {
            s.warn(copy_of(notice));
        }
    }
}

/// The same notice again, for another subscriber (store errors are not `Clone`).
fn copy_of(notice: &StoreError) -> StoreError {
    StoreError::Backend {
        location: "the shared watch".into(),
        source: notice.to_string().into(),
    }
}

/// A watch in trouble: since when, the last error, when the log said it.
struct Trouble {
    since: Instant,
    why: String,
    said_at: Instant,
}

/// The hub of one kind and what it needs to list and watch the kind again.
struct HubTask<S> {
    kind: String,
    store: S,
    board: Arc<Board>,
    trouble: Option<Trouble>,
    backoff: Backoff,
}

/// Sleeps until `at`; forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A watch being started again, in a task of its own so that the hub serves meanwhile.
type Restart = oneshot::Receiver<Result<Watch, StoreError>>;

async fn restarted(restart: &mut Option<Restart>) -> Result<Watch, StoreError> {
    match restart {
        Some(rx) => rx.await.unwrap_or_else(|_| {
            Err(StoreError::Backend {
                location: "the watch's hub".into(),
                source: "the task starting the watch ended".into(),
            })
        }),
        None => std::future::pending().await,
    }
}

impl<S: Store + Clone + 'static> HubTask<S> {
    fn new(kind: &str, store: S, board: Arc<Board>) -> Self {
        Self {
            kind: kind.to_owned(),
            store,
            board,
            trouble: None,
            backoff: Backoff::with(REWATCH_FIRST, 2.0, 0.2, REWATCH_CAP),
        }
    }

    /// The error a subscriber gets for the trouble.
    fn notice(&self, why: &str) -> StoreError {
        StoreError::Backend {
            location: self.board.location.clone(),
            source: format!(
                "the {} watch failed ({why}); this copy may be behind the store until the \
                 next event",
                self.kind
            )
            .into(),
        }
    }

    /// Takes a watch error in: the kind is stale, every subscriber told, the log says it.
    fn failed(&mut self, e: &StoreError, subscribers: &mut [Subscriber]) {
        let (kind, location) = (self.kind.as_str(), self.board.location.as_str());
        let now = Instant::now();
        let why = e.to_string();
        self.board.count_error(kind);
        match &mut self.trouble {
            None => {
                tracing::warn!(
                    kind,
                    store = location,
                    "the {kind} watch on {location} failed: {why}. Until a watch of {kind} \
                     follows the store again, its objects are listed from the store (at most \
                     {} s apart), nothing is reclaimed or reported dead from a copy of them, and \
                     after {} s the process reports not ready. Check that this process may \
                     watch {kind} (RBAC `watch`) and that the store keeps watches open",
                    REWATCH_CAP.as_secs(),
                    STALE_NOT_READY.as_secs()
                );
                self.trouble = Some(Trouble {
                    since: now,
                    why: why.clone(),
                    said_at: now,
                });
            }
            Some(t) => {
                t.why.clone_from(&why);
                if now.duration_since(t.said_at) >= SAY_AGAIN {
                    t.said_at = now;
                    tracing::warn!(
                        kind,
                        store = location,
                        stale_s = now.duration_since(t.since).as_secs(),
                        "the {kind} watch on {location} still fails: {why}"
                    );
                } else {
                    tracing::debug!(
                        kind,
                        store = location,
                        "the {kind} watch failed again: {why}"
                    );
                }
            }
        }
        if let Some(t) = &self.trouble {
            self.board.set_stale(
                kind,
                Some(Stale {
                    since: t.since,
                    why: why.clone(),
                }),
            );
        }
        for s in subscribers {
            s.warn(self.notice(&why));
        }
    }

    /// A watch started again has followed the store long enough (or delivered a change).
    fn recovered(&mut self) {
        let Some(t) = self.trouble.take() else { return };
        self.backoff.reset();
        tracing::info!(
            kind = self.kind.as_str(),
            store = self.board.location.as_str(),
            stale_s = t.since.elapsed().as_secs(),
            "the {} watch follows the store again",
            self.kind
        );
        self.board.set_stale(&self.kind, None);
    }

    /// Lists and watches the kind again, in a task of its own.
    fn restart(&self) -> Restart {
        let (tx, rx) = oneshot::channel();
        let (store, kind) = (self.store.clone(), self.kind.clone());
        tokio::spawn(async move {
            let _ = tx.send(store.watch(&kind).await);
        });
        rx
    }

    /// The hub: follows the store's watch, and lists and watches again after it fails, for as
    /// long as anyone can subscribe.
    async fn run(
        mut self,
        upstream: Watch,
        mut requests: mpsc::UnboundedReceiver<oneshot::Sender<Watch>>,
    ) {
        let label = KindLabel {
            kind: self.kind.clone(),
        };
        let observed = self.board.observed.get().cloned();
        let count = |subscribers: usize| {
            if let Some(o) = &observed {
                let gauge = o.metrics.store_watch_subscribers.get_or_create(&label);
                gauge.set(subscribers as i64);
            }
        };
        if let Some(o) = &observed {
            o.metrics.store_watches.get_or_create(&label).inc();
        }
        let mut upstream = Some(upstream);
        let mut state = State {
            objects: upstream
                .as_mut()
                .map(|u| std::mem::take(&mut u.initial))
                .unwrap_or_default()
                .into_iter()
                .map(|o| (o.name.clone(), o))
                .collect(),
            revision: upstream
                .as_ref()
                .map(|u| u.revision.clone())
                .unwrap_or(Revision::Number(0)),
            kind: self.kind.clone(),
        };
        let mut subscribers: Vec<Subscriber> = Vec::new();
        let mut catch_up = tokio::time::interval(CATCH_UP);
        catch_up.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // While in trouble: when to start again, the start under way, when a started watch is
        // trusted, when readiness is judged again.
        let mut restart_at: Option<Instant> = None;
        let mut restarting: Option<Restart> = None;
        let mut settle_at: Option<Instant> = None;
        let mut judge_at: Option<Instant> = None;
        loop {
            let behind = subscribers.iter().any(|s| s.behind);
            tokio::select! {
                request = requests.recv() => {
                    // Every handle of the store is gone: nobody can subscribe any more.
                    let Some(reply) = request else { break };
                    let (events, rx) = mpsc::channel(WATCH_BUFFER);
                    let watch = Watch::new(state.snapshot(), state.revision.clone(), rx);
                    if reply.send(watch).is_ok() {
                        let mut new = Subscriber { events, behind: false };
                        // A copy taken while no watch follows is not known fresh.
                        if let (Some(t), None) = (&self.trouble, settle_at) {
                            new.warn(self.notice(&t.why));
                        }
                        subscribers.push(new);
                    }
                }
                event = async {
                    match upstream.as_mut() {
                        Some(u) => Some(u.next().await),
                        None => None,
                    }
                }, if upstream.is_some() => {
                    match event {
                        Some(Ok(event)) => {
                            state.apply(&event);
                            for s in &mut subscribers {
                                s.offer(&event, &state);
                            }
                            // It delivers: the watch follows again.
                            settle_at = None;
                            self.recovered();
                        }
                        Some(Err(e)) => {
                            self.failed(&e, &mut subscribers);
                            // The store would resume it, but a refused watch never delivers
                            // again: list and watch anew, paced.
                            upstream = None;
                            settle_at = None;
                            restart_at = Some(Instant::now() + self.backoff.next_delay());
                            judge_at = self.trouble.as_ref().map(|t| t.since + STALE_NOT_READY);
                        }
                        None => {}
                    }
                }
                () = sleep_until(restart_at), if restart_at.is_some() => {
                    restart_at = None;
                    restarting = Some(self.restart());
                }
                started = restarted(&mut restarting), if restarting.is_some() => {
                    restarting = None;
                    match started {
                        Ok(mut watch) => {
                            // The fresh list, to everyone: their copies follow the store again
                            // (at most `REWATCH_CAP` behind while the trouble lasts).
                            let fresh = WatchEvent::Resync {
                                kind: self.kind.clone(),
                                revision: watch.revision.clone(),
                                objects: std::mem::take(&mut watch.initial),
                            };
                            state.apply(&fresh);
                            for s in &mut subscribers {
                                s.offer(&fresh, &state);
                            }
                            upstream = Some(watch);
                            settle_at = Some(Instant::now() + SETTLE);
                        }
                        Err(e) => {
                            self.failed(&e, &mut subscribers);
                            restart_at = Some(Instant::now() + self.backoff.next_delay());
                            judge_at = self.trouble.as_ref().map(|t| t.since + STALE_NOT_READY);
                        }
                    }
                }
                () = sleep_until(settle_at), if settle_at.is_some() => {
                    settle_at = None;
                    self.recovered();
                }
                () = sleep_until(judge_at), if judge_at.is_some() => {
                    judge_at = None;
                    self.board.judge_readiness();
                }
                _ = catch_up.tick(), if behind => {
                    // Between a failure and the next list, the hub's own copy is not known
                    // fresh either: the warning a full buffer lost follows it.
                    let stale = match (&self.trouble, settle_at) {
                        (Some(t), None) => Some(self.notice(&t.why)),
                        _ => None,
                    };
                    catch_up_all(&mut subscribers, &state, stale.as_ref());
                }
            }
            subscribers.retain(|s| !s.events.is_closed());
            count(subscribers.len());
        }
        if let Some(o) = &observed {
            o.metrics.store_watches.get_or_create(&label).dec();
        }
        count(0);
    }
}

#[cfg(test)]
mod tests {
    use ipam_core::store::{Resource as _, TypedStore as _, embedded::EmbeddedStore};

    use super::*;

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
        let observed = Observed::default();
        let metrics = observed.metrics.clone();
        let shared = SharedWatches::default();
        shared.count_in(&observed);
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

    /// A subscriber whose buffer was full when the watch failed lost the warning; caught up
    /// while the hub's copy is not known fresh, it gets the warning after the state, so its
    /// copy does not count fresh.
    #[test]
    fn a_subscriber_caught_up_in_trouble_is_told_its_copy_is_stale() {
        let (events, mut rx) = mpsc::channel(2);
        let mut lagging = Subscriber {
            events,
            behind: true,
        };
        let state = State {
            kind: Thing::KIND.to_owned(),
            objects: BTreeMap::new(),
            revision: Revision::Number(7),
        };
        let notice = StoreError::Backend {
            location: "the test's store".into(),
            source: "Thing is forbidden: cannot watch".into(),
        };
        catch_up_all(std::slice::from_mut(&mut lagging), &state, Some(&notice));
        assert!(matches!(rx.try_recv(), Ok(Ok(WatchEvent::Resync { .. }))));
        let told = rx.try_recv().expect("the warning after the state");
        assert!(
            told.as_ref()
                .is_err_and(|e| e.to_string().contains("forbidden")),
            "{told:?}"
        );
        // One slot free only: nothing now, rather than a state that passes for fresh.
        let (events, mut one_slot) = mpsc::channel(2);
        events.try_send(Ok(state.resync())).unwrap();
        let mut crowded = Subscriber {
            events,
            behind: true,
        };
        catch_up_all(std::slice::from_mut(&mut crowded), &state, Some(&notice));
        assert!(crowded.behind);
        assert!(matches!(one_slot.try_recv(), Ok(Ok(_))));
        assert!(
            one_slot.try_recv().is_err(),
            "a state sent without its warning"
        );
        // Fresh again: the state alone.
        lagging.behind = true;
        catch_up_all(std::slice::from_mut(&mut lagging), &state, None);
        assert!(matches!(rx.try_recv(), Ok(Ok(WatchEvent::Resync { .. }))));
        assert!(rx.try_recv().is_err());
    }

    /// A real embedded store whose watches fail at once after their first list while
    /// `refused` (as one without the `watch` right, or behind a proxy that cuts watches):
    /// gets and lists work, and the broken watch says nothing more, as a store's watch that
    /// retries in vain.
    #[derive(Clone)]
    struct RefusedWatches {
        store: EmbeddedStore,
        refused: Arc<std::sync::atomic::AtomicBool>,
        /// The broken watches' feeds, kept open.
        broken: Arc<Mutex<Vec<Feed>>>,
    }

    type Feed = mpsc::Sender<Result<WatchEvent, StoreError>>;

    impl Store for RefusedWatches {
        async fn get(&self, kind: &str, name: &str) -> Result<Option<RawObject>, StoreError> {
            self.store.get(kind, name).await
        }
        async fn list(&self, kind: &str) -> Result<Vec<RawObject>, StoreError> {
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
            let watch = self.store.watch(kind).await?;
            if !self.refused.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(watch);
            }
            let (tx, rx) = mpsc::channel(4);
            tx.try_send(Err(StoreError::Backend {
                location: "the test's store".into(),
                source: format!("{kind} is forbidden: cannot watch").into(),
            }))
            .unwrap();
            self.broken.lock().unwrap().push(tx);
            Ok(Watch::new(watch.initial, watch.revision, rx))
        }
    }

    async fn next_within(watch: &mut Watch, within: Duration) -> Result<WatchEvent, StoreError> {
        tokio::time::timeout(within, watch.next())
            .await
            .expect("an event within the time")
    }

    /// A watch that fails is told to every subscriber, which then gets the kind listed afresh
    /// (with what changed while no watch followed); the kind counts stale until a watch
    /// follows again.
    #[tokio::test]
    async fn a_failed_watch_is_told_to_every_subscriber_and_listed_again() {
        let path = tempfile::tempdir().unwrap();
        let store = RefusedWatches {
            store: EmbeddedStore::open(&path.path().join("state.redb")).unwrap(),
            refused: Arc::new(true.into()),
            broken: Arc::default(),
        };
        let observed = Observed::default();
        let shared = SharedWatches::new("the test's store".into());
        shared.count_in(&observed);
        store.create_typed("a", &Thing { size: 1 }).await.unwrap();
        let mut first = shared.watch(&store, Thing::KIND).await.unwrap();
        assert_eq!(first.initial.len(), 1);

        let told = next_within(&mut first, Duration::from_secs(1)).await;
        let told = told.expect_err("the failure is told").to_string();
        assert!(
            told.contains("Thing watch failed") && told.contains("forbidden"),
            "{told}"
        );
        assert!(shared.stale(Thing::KIND).is_some());
        let label = KindLabel {
            kind: Thing::KIND.to_owned(),
        };
        assert_eq!(
            observed
                .metrics
                .store_watch_stale
                .get_or_create(&label)
                .get(),
            1
        );
        // A subscriber that comes now is told its copy is not known fresh.
        let mut late = shared.watch(&store, Thing::KIND).await.unwrap();
        assert!(
            next_within(&mut late, Duration::from_secs(1))
                .await
                .is_err()
        );

        // Changed while no watch shows it; the kind listed again shows it to everyone.
        store.create_typed("b", &Thing { size: 2 }).await.unwrap();
        for watch in [&mut first, &mut late] {
            match next_within(watch, Duration::from_secs(3)).await {
                Ok(WatchEvent::Resync { objects, .. }) => assert_eq!(objects.len(), 2),
                other => panic!("expected the kind listed again, got {other:?}"),
            }
            // The watch started again fails again, and says so.
            assert!(next_within(watch, Duration::from_secs(1)).await.is_err());
        }
        assert!(shared.stale(Thing::KIND).is_some());
        assert!(
            observed
                .metrics
                .store_watch_errors
                .get_or_create(&label)
                .get()
                >= 2
        );

        // Watches work again: after the next start, and `SETTLE` without trouble, fresh.
        store
            .refused
            .store(false, std::sync::atomic::Ordering::SeqCst);
        assert!(matches!(
            next_within(&mut first, REWATCH_CAP).await,
            Ok(WatchEvent::Resync { .. })
        ));
        store.create_typed("c", &Thing { size: 3 }).await.unwrap();
        assert_eq!(
            put_name(
                &next_within(&mut first, Duration::from_secs(1))
                    .await
                    .unwrap()
            ),
            "c"
        );
        assert!(shared.stale(Thing::KIND).is_none(), "a change came: fresh");
        assert_eq!(
            observed
                .metrics
                .store_watch_stale
                .get_or_create(&label)
                .get(),
            0
        );
    }

    /// Readiness fails once a kind has been stale `STALE_NOT_READY`, naming it and why, and
    /// comes back with the watch.
    #[tokio::test]
    async fn a_kind_stale_too_long_makes_the_process_not_ready() {
        let observed = Observed::default();
        observed.health.set("datapath", Ok(()));
        let shared = SharedWatches::new("etcd at e1".into());
        shared.count_in(&observed);
        let board = &shared.board;
        board.set_stale(
            "Service",
            Some(Stale {
                since: Instant::now(),
                why: "forbidden".into(),
            }),
        );
        assert!(observed.health.report().0, "not stale for long yet");
        let long_ago = Instant::now()
            .checked_sub(STALE_NOT_READY + Duration::from_secs(1))
            .unwrap();
        board.set_stale(
            "Service",
            Some(Stale {
                since: long_ago,
                why: "forbidden".into(),
            }),
        );
        let (ready, body) = observed.health.report();
        assert!(!ready);
        assert!(
            body.contains("the Service watch on etcd at e1 has failed for")
                && body.contains("forbidden"),
            "{body}"
        );
        board.set_stale("Service", None);
        assert!(observed.health.report().0);
    }
}
