//! The task behind an etcd watch: follows one kind from a revision on, reopens the etcd watch
//! from the last revision it delivered whenever the stream breaks (a member died, the leader
//! changed), and lists the kind again (`Resync`) when etcd compacted the revisions it needed.

use std::time::Duration;

use etcd_client::{Client, EventType, KeyValue, WatchOptions, WatchResponse};
use ipam_core::{
    backoff::Backoff,
    store::{RawObject, Revision, StoreError, WatchEvent},
};
use tokio::{sync::mpsc::Sender, time::Instant};

/// What a watch task needs of the store it follows (`EtcdStore` in `store.rs`). A trait here
/// keeps the task free of the store's module, which starts it.
pub(crate) trait WatchedStore: Send + Sync + 'static {
    fn client(&self) -> Client;
    /// The key prefix of `kind`'s objects.
    fn kind_prefix(&self, kind: &str) -> String;
    fn backend_error(&self, e: &etcd_client::Error) -> StoreError;
    /// How long the member may take to answer a request (`request_timeout_ms`).
    fn answer_within(&self) -> Duration;
    /// The object a key-value holds, if the key is one of `kind`'s.
    fn object(&self, kind: &str, kv: &KeyValue) -> Option<RawObject>;
    fn name_of(&self, kind: &str, key: &[u8]) -> Option<String>;
    /// The objects of `kind` and the store revision they were read at.
    fn list_at(
        &self,
        kind: &str,
    ) -> impl Future<Output = Result<(Vec<RawObject>, u64), StoreError>> + Send;
}

/// How long a watch may go without a message before it asks its member for one (a progress
/// request, answered at once with the member's revision). A member that lost power or was cut
/// off says nothing, and the watch would wait for the connection's keep-alive, which etcd
/// allows only every 10 s or so (`store::KEEP_ALIVE_EVERY`); meanwhile the copy fed by the
/// watch passes for current. Asked after 3 s of quiet and unanswered within the request
/// timeout, the watch counts as broken: a dead member is found within about 7 s with the
/// defaults. One small request per quiet watch every 3 s, nothing while events flow.
const QUIET_FOR: Duration = Duration::from_secs(3);

/// How often a watch looks at how long it has been quiet.
const QUIET_CHECK: Duration = Duration::from_millis(500);

/// Longest pause between two attempts to reopen a broken watch.
const REOPEN_CAP: Duration = Duration::from_secs(5);

type Events = Sender<Result<WatchEvent, StoreError>>;

/// Why a watch stream ended.
enum Ended {
    /// The reader dropped the watch.
    Dropped,
    /// The stream broke; reopen after a pause.
    Broken,
    /// Revisions after `since` are compacted away; list again.
    Compacted,
}

pub(crate) async fn feed_watch<S: WatchedStore>(
    store: S,
    kind: String,
    mut since: u64,
    tx: Events,
) {
    let mut backoff = Backoff::with(Duration::from_millis(100), 2.0, 0.2, REOPEN_CAP);
    // Trouble is reported once per outage, not once per attempt.
    let mut reported = false;
    loop {
        let ended = follow(&store, &kind, &mut since, &tx, &mut reported).await;
        match ended {
            Ended::Dropped => return,
            Ended::Compacted => match store.list_at(&kind).await {
                Ok((objects, revision)) => {
                    tracing::info!(
                        kind,
                        since,
                        revision,
                        "etcd compacted the watched revisions; listed the kind again"
                    );
                    since = revision;
                    let resync = WatchEvent::Resync {
                        kind: kind.clone(),
                        revision: revision.into(),
                        objects,
                    };
                    if tx.send(Ok(resync)).await.is_err() {
                        return;
                    }
                    backoff.reset();
                    continue;
                }
                Err(e) => {
                    if !std::mem::replace(&mut reported, true) && tx.send(Err(e)).await.is_err() {
                        return;
                    }
                }
            },
            Ended::Broken => {}
        }
        tokio::select! {
            () = tokio::time::sleep(backoff.next_delay()) => {}
            () = tx.closed() => return,
        }
    }
}

/// Delivers the events of one etcd watch stream until it ends.
async fn follow(
    store: &impl WatchedStore,
    kind: &str,
    since: &mut u64,
    tx: &Events,
    reported: &mut bool,
) -> Ended {
    // From `since` itself, not the next revision: a watch that starts past the store's
    // revision is not answered a progress request by etcd 3.6.2 and later (nor the 3.5 and
    // 3.4 releases that took the change), and would be counted broken on a quiet store. The
    // events of `since`, delivered already (or listed), are dropped below.
    let start = *since;
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(start as i64);
    let mut client = store.client();
    let opened = tokio::select! {
        opened = client.watch(store.kind_prefix(kind), Some(options)) => opened,
        () = tx.closed() => return Ended::Dropped,
    };
    let mut stream = match opened {
        Ok(stream) => stream,
        Err(e) => return report(store, &e, tx, reported).await,
    };
    let mut heard = Instant::now();
    let mut asked: Option<Instant> = None;
    let mut check = tokio::time::interval(QUIET_CHECK);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let message = tokio::select! {
            message = stream.message() => message,
            _ = check.tick() => {
                match asked {
                    Some(at) if at.elapsed() >= store.answer_within() => {
                        let quiet = heard.elapsed().as_millis();
                        let e = etcd_client::Error::WatchError(format!(
                            "no answer to a progress request within {} ms, after {quiet} ms \
                             without a message: the member is unreachable or stuck",
                            store.answer_within().as_millis()
                        ));
                        return report(store, &e, tx, reported).await;
                    }
                    None if heard.elapsed() >= QUIET_FOR => {
                        if let Err(e) = stream.request_progress().await {
                            return report(store, &e, tx, reported).await;
                        }
                        asked = Some(Instant::now());
                    }
                    _ => {}
                }
                continue;
            }
            () = tx.closed() => return Ended::Dropped,
        };
        heard = Instant::now();
        asked = None;
        let response = match message {
            Ok(Some(response)) => response,
            Ok(None) => return Ended::Broken,
            Err(e) => return report(store, &e, tx, reported).await,
        };
        if response.compact_revision() > 0 {
            return Ended::Compacted;
        }
        if response.canceled() {
            // Cancelled by the server for another reason (lost leader): reopen.
            tracing::debug!(
                kind,
                reason = response.cancel_reason(),
                "etcd watch cancelled"
            );
            return Ended::Broken;
        }
        *reported = false;
        for event in events(store, kind, &response) {
            // Every revision this store makes is a number.
            let revision = event.revision().number().unwrap_or(*since);
            if revision <= start {
                continue;
            }
            *since = revision;
            if tx.send(Ok(event)).await.is_err() {
                return Ended::Dropped;
            }
        }
    }
}

fn events(store: &impl WatchedStore, kind: &str, response: &WatchResponse) -> Vec<WatchEvent> {
    response
        .events()
        .iter()
        .filter_map(|event| {
            let kv = event.kv()?;
            match event.event_type() {
                EventType::Put => store.object(kind, kv).map(WatchEvent::Put),
                EventType::Delete => Some(WatchEvent::Deleted {
                    kind: kind.to_owned(),
                    name: store.name_of(kind, kv.key())?,
                    revision: Revision::Number(kv.mod_revision() as u64),
                }),
            }
        })
        .collect()
}

async fn report(
    store: &impl WatchedStore,
    e: &etcd_client::Error,
    tx: &Events,
    reported: &mut bool,
) -> Ended {
    if !std::mem::replace(reported, true) && tx.send(Err(store.backend_error(e))).await.is_err() {
        return Ended::Dropped;
    }
    Ended::Broken
}
