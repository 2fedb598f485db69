//! The embedded store: one redb database file (ACID, fsync on every commit), for a single node
//! or a standalone cluster. It survives SIGKILL and power loss: a write returns only after it is
//! on disk.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use redb::{Database, ReadableDatabase as _, ReadableTable as _, TableDefinition};
use tokio::sync::broadcast;

use super::{RawObject, Revision, Store, StoreError, WATCH_BUFFER, Watch, WatchEvent};

/// key: "<kind>/<name>", value: revision (8 bytes, little endian) followed by the JSON value.
const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const REVISION: &str = "revision";

#[derive(Clone)]
pub struct EmbeddedStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    db: Database,
    /// Writers go one at a time so revisions and events are in commit order.
    writer: Mutex<()>,
    events: broadcast::Sender<WatchEvent>,
}

fn object_key(kind: &str, name: &str) -> String {
    format!("{kind}/{name}")
}

fn split_value(kind: &str, name: &str, bytes: &[u8]) -> RawObject {
    let (rev, value) = bytes.split_at(8.min(bytes.len()));
    RawObject {
        kind: kind.to_owned(),
        name: name.to_owned(),
        revision: Revision::Number(u64::from_le_bytes(rev.try_into().unwrap_or([0; 8]))),
        value: value.to_vec(),
    }
}

impl EmbeddedStore {
    /// Opens the database file, creating it on first use.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = Database::create(path).map_err(|e| backend(path, e))?;
        let txn = db.begin_write().map_err(|e| backend(path, e))?;
        txn.open_table(OBJECTS).map_err(|e| backend(path, e))?;
        txn.open_table(META).map_err(|e| backend(path, e))?;
        txn.commit().map_err(|e| backend(path, e))?;
        let (events, _) = broadcast::channel(4096);
        Ok(Self {
            inner: Arc::new(Inner {
                path: path.to_owned(),
                db,
                writer: Mutex::new(()),
                events,
            }),
        })
    }

    /// The revision of the last change.
    pub fn revision(&self) -> Result<u64, StoreError> {
        self.inner.revision()
    }
}

impl Inner {
    fn revision(&self) -> Result<u64, StoreError> {
        let read = self.db.begin_read().map_err(|e| backend(&self.path, e))?;
        let meta = read.open_table(META).map_err(|e| backend(&self.path, e))?;
        Ok(meta
            .get(REVISION)
            .map_err(|e| backend(&self.path, e))?
            .map_or(0, |v| v.value()))
    }

    fn read(&self, kind: &str, name: &str) -> Result<Option<RawObject>, StoreError> {
        let read = self.db.begin_read().map_err(|e| backend(&self.path, e))?;
        let table = read
            .open_table(OBJECTS)
            .map_err(|e| backend(&self.path, e))?;
        Ok(table
            .get(object_key(kind, name).as_str())
            .map_err(|e| backend(&self.path, e))?
            .map(|v| split_value(kind, name, v.value())))
    }

    fn read_kind(&self, kind: &str) -> Result<Vec<RawObject>, StoreError> {
        let read = self.db.begin_read().map_err(|e| backend(&self.path, e))?;
        let table = read
            .open_table(OBJECTS)
            .map_err(|e| backend(&self.path, e))?;
        let prefix = format!("{kind}/");
        let mut out = Vec::new();
        for entry in table
            .range(prefix.as_str()..)
            .map_err(|e| backend(&self.path, e))?
        {
            let (k, v) = entry.map_err(|e| backend(&self.path, e))?;
            let Some(name) = k.value().strip_prefix(&prefix) else {
                break;
            };
            out.push(split_value(kind, name, v.value()));
        }
        Ok(out)
    }

    /// One write: checks `precondition` against the current object, then stores `value`
    /// (or deletes with `None`) under a new revision, durably, and publishes the event.
    fn write(
        &self,
        kind: &str,
        name: &str,
        value: Option<Vec<u8>>,
        precondition: impl FnOnce(Option<&RawObject>) -> Result<bool, StoreError>,
    ) -> Result<u64, StoreError> {
        let _writer = self.writer.lock().expect("writer lock");
        let key = object_key(kind, name);
        let txn = self.db.begin_write().map_err(|e| backend(&self.path, e))?;
        let revision;
        {
            let mut objects = txn
                .open_table(OBJECTS)
                .map_err(|e| backend(&self.path, e))?;
            let current = objects
                .get(key.as_str())
                .map_err(|e| backend(&self.path, e))?
                .map(|v| split_value(kind, name, v.value()));
            if !precondition(current.as_ref())? {
                return Ok(current.map_or(0, |c| number(&c.revision)));
            }
            let mut meta = txn.open_table(META).map_err(|e| backend(&self.path, e))?;
            revision = meta
                .get(REVISION)
                .map_err(|e| backend(&self.path, e))?
                .map_or(0, |v| v.value())
                + 1;
            meta.insert(REVISION, revision)
                .map_err(|e| backend(&self.path, e))?;
            match &value {
                Some(v) => {
                    let mut stored = revision.to_le_bytes().to_vec();
                    stored.extend_from_slice(v);
                    objects
                        .insert(key.as_str(), stored.as_slice())
                        .map_err(|e| backend(&self.path, e))?;
                }
                None => {
                    objects
                        .remove(key.as_str())
                        .map_err(|e| backend(&self.path, e))?;
                }
            }
        }
        txn.commit().map_err(|e| backend(&self.path, e))?;
        let event = match value {
            Some(value) => WatchEvent::Put(RawObject {
                kind: kind.to_owned(),
                name: name.to_owned(),
                revision: revision.into(),
                value,
            }),
            None => WatchEvent::Deleted {
                kind: kind.to_owned(),
                name: name.to_owned(),
                revision: revision.into(),
            },
        };
        let _ = self.events.send(event);
        Ok(revision)
    }
}

/// This store's revisions are numbers; it never makes another kind.
fn number(revision: &Revision) -> u64 {
    revision.number().unwrap_or(0)
}

fn backend(path: &Path, e: impl Into<redb::Error>) -> StoreError {
    StoreError::Backend {
        location: path.display().to_string(),
        source: Box::new(e.into()),
    }
}

impl Store for EmbeddedStore {
    async fn get(&self, kind: &str, name: &str) -> Result<Option<RawObject>, StoreError> {
        self.inner.read(kind, name)
    }

    async fn list(&self, kind: &str) -> Result<Vec<RawObject>, StoreError> {
        self.inner.read_kind(kind)
    }

    async fn create(&self, kind: &str, name: &str, value: Vec<u8>) -> Result<Revision, StoreError> {
        super::check_name(kind, name)?;
        self.inner
            .write(kind, name, Some(value), |current| match current {
                Some(_) => Err(StoreError::AlreadyExists {
                    kind: kind.to_owned(),
                    name: name.to_owned(),
                }),
                None => Ok(true),
            })
            .map(Revision::from)
    }

    async fn update(
        &self,
        kind: &str,
        name: &str,
        value: Vec<u8>,
        expected: &Revision,
    ) -> Result<Revision, StoreError> {
        self.inner
            .write(kind, name, Some(value), |current| match current {
                None => Err(StoreError::NotFound {
                    kind: kind.to_owned(),
                    name: name.to_owned(),
                }),
                Some(c) if &c.revision != expected => Err(StoreError::Conflict {
                    kind: kind.to_owned(),
                    name: name.to_owned(),
                    expected: expected.clone(),
                    actual: c.revision.clone(),
                }),
                Some(_) => Ok(true),
            })
            .map(Revision::from)
    }

    /// The object is kept whole here: its status is written with the rest.
    async fn update_status(
        &self,
        kind: &str,
        name: &str,
        value: Vec<u8>,
        expected: &Revision,
    ) -> Result<Revision, StoreError> {
        self.update(kind, name, value, expected).await
    }

    async fn delete(
        &self,
        kind: &str,
        name: &str,
        expected: Option<&Revision>,
    ) -> Result<(), StoreError> {
        self.inner
            .write(kind, name, None, |current| match (current, expected) {
                (None, _) => Ok(false),
                (Some(c), Some(e)) if &c.revision != e => Err(StoreError::Conflict {
                    kind: kind.to_owned(),
                    name: name.to_owned(),
                    expected: e.clone(),
                    actual: c.revision.clone(),
                }),
                _ => Ok(true),
            })
            .map(|_| ())
    }

    async fn watch(&self, kind: &str) -> Result<Watch, StoreError> {
        // Subscribe before reading, so no change between the two is missed; changes already in
        // the snapshot are skipped by revision.
        let events = self.inner.events.subscribe();
        let (initial, since) = {
            let _writer = self.inner.writer.lock().expect("writer lock");
            (self.inner.read_kind(kind)?, self.inner.revision()?)
        };
        let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BUFFER);
        tokio::spawn(feed_watch(
            self.inner.clone(),
            kind.to_owned(),
            since,
            events,
            tx,
        ));
        Ok(Watch::new(initial, since.into(), rx))
    }
}

/// The whole kind as a `Resync`, read again until it can be (a failed read is reported to the
/// watch); `None` when the watch is gone.
async fn resync(
    store: &Inner,
    kind: &str,
    tx: &tokio::sync::mpsc::Sender<Result<WatchEvent, StoreError>>,
) -> Option<WatchEvent> {
    loop {
        let snapshot = {
            let _writer = store.writer.lock().expect("writer lock");
            store
                .read_kind(kind)
                .and_then(|objects| Ok((objects, store.revision()?)))
        };
        match snapshot {
            Ok((objects, revision)) => {
                return Some(WatchEvent::Resync {
                    kind: kind.to_owned(),
                    revision: revision.into(),
                    objects,
                });
            }
            Err(e) => {
                tx.send(Err(e)).await.ok()?;
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }
}

/// Forwards the changes of `kind` after revision `since` to one watch, until it is dropped. A
/// watch that fell behind the broadcast gets the whole kind again (`Resync`) and goes on.
async fn feed_watch(
    store: Arc<Inner>,
    kind: String,
    mut since: u64,
    mut events: broadcast::Receiver<WatchEvent>,
    tx: tokio::sync::mpsc::Sender<Result<WatchEvent, StoreError>>,
) {
    use broadcast::error::RecvError;
    loop {
        let event = match events.recv().await {
            Ok(e) if e.kind() == kind && number(e.revision()) > since => e,
            Ok(_) => continue,
            Err(RecvError::Lagged(_)) => {
                events = store.events.subscribe();
                match resync(&store, &kind, &tx).await {
                    Some(event) => event,
                    None => return,
                }
            }
            Err(RecvError::Closed) => return,
        };
        since = number(event.revision());
        if tx.send(Ok(event)).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{TypedStore, conformance, conformance::Thing};

    fn temp(name: &str) -> crate::test_util::TempPath {
        crate::test_util::TempPath::new(&format!("store-{name}.redb"))
    }

    #[tokio::test]
    async fn crud_with_optimistic_concurrency() {
        let path = temp("crud");
        conformance::crud_with_optimistic_concurrency(&EmbeddedStore::open(&path).unwrap()).await;
    }

    #[tokio::test]
    async fn watch_sees_the_snapshot_then_every_change_in_order() {
        let path = temp("watch");
        conformance::watch_sees_the_snapshot_then_every_change_in_order(
            &EmbeddedStore::open(&path).unwrap(),
        )
        .await;
    }

    #[tokio::test]
    async fn survives_reopening_with_monotonic_revisions() {
        let path = temp("reopen");
        let rev = {
            let s = EmbeddedStore::open(&path).unwrap();
            s.create_typed("a", &Thing { size: 7 }).await.unwrap()
        };
        let s = EmbeddedStore::open(&path).unwrap();
        assert_eq!(
            s.get_typed::<Thing>("a").await.unwrap().unwrap().value.size,
            7
        );
        // This store's revisions are numbers that only grow, across reopening too.
        let next = s.create_typed("b", &Thing { size: 1 }).await.unwrap();
        assert!(next.number() > rev.number(), "{next} after {rev}");
    }

    #[tokio::test]
    async fn a_watch_that_falls_behind_gets_the_whole_kind_again() {
        let path = temp("lag");
        let s = EmbeddedStore::open(&path).unwrap();
        let mut w = s.watch("Thing").await.unwrap();
        // More changes than the broadcast holds, before the watch task runs.
        for i in 0..5000 {
            s.create_typed(&format!("t{i}"), &Thing { size: i })
                .await
                .unwrap();
        }
        s.delete("Thing", "t0", None).await.unwrap();
        let last = s.revision().unwrap();
        let mut names = std::collections::BTreeSet::new();
        let mut resynced = false;
        loop {
            match w.next().await.unwrap() {
                WatchEvent::Put(o) => {
                    names.insert(o.name);
                }
                WatchEvent::Deleted { name, .. } => {
                    names.remove(&name);
                }
                WatchEvent::Resync { objects, .. } => {
                    resynced = true;
                    names = objects.into_iter().map(|o| o.name).collect();
                }
            }
            if w.try_next().is_none() && names.len() == 4999 {
                break;
            }
        }
        assert!(resynced);
        assert!(!names.contains("t0"));
        assert_eq!(s.revision().unwrap(), last);
    }
}
