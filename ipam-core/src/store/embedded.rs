//! The embedded store: one redb database file (ACID, fsync on every commit), for a single node
//! or a standalone cluster. It survives SIGKILL and power loss: a write returns only after it is
//! on disk.

use std::{
    path::{Path, PathBuf},
    sync::Mutex,
};

use redb::{Database, ReadableDatabase as _, ReadableTable as _, TableDefinition};
use tokio::sync::broadcast;

use super::{RawObject, Store, StoreError, Watch, WatchEvent};

/// key: "<kind>/<name>", value: revision (8 bytes, little endian) followed by the JSON value.
const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const REVISION: &str = "revision";

pub struct EmbeddedStore {
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
        revision: u64::from_le_bytes(rev.try_into().unwrap_or([0; 8])),
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
            path: path.to_owned(),
            db,
            writer: Mutex::new(()),
            events,
        })
    }

    /// The revision of the last change.
    pub fn revision(&self) -> Result<u64, StoreError> {
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
                return Ok(current.map_or(0, |c| c.revision));
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
                revision,
                value,
            }),
            None => WatchEvent::Deleted {
                kind: kind.to_owned(),
                name: name.to_owned(),
                revision,
            },
        };
        let _ = self.events.send(event);
        Ok(revision)
    }
}

fn backend(path: &Path, e: impl Into<redb::Error>) -> StoreError {
    StoreError::Backend {
        location: path.display().to_string(),
        source: Box::new(e.into()),
    }
}

impl Store for EmbeddedStore {
    async fn get(&self, kind: &str, name: &str) -> Result<Option<RawObject>, StoreError> {
        self.read(kind, name)
    }

    async fn list(&self, kind: &str) -> Result<Vec<RawObject>, StoreError> {
        self.read_kind(kind)
    }

    async fn create(&self, kind: &str, name: &str, value: Vec<u8>) -> Result<u64, StoreError> {
        self.write(kind, name, Some(value), |current| match current {
            Some(_) => Err(StoreError::AlreadyExists {
                kind: kind.to_owned(),
                name: name.to_owned(),
            }),
            None => Ok(true),
        })
    }

    async fn update(
        &self,
        kind: &str,
        name: &str,
        value: Vec<u8>,
        expected: u64,
    ) -> Result<u64, StoreError> {
        self.write(kind, name, Some(value), |current| match current {
            None => Err(StoreError::NotFound {
                kind: kind.to_owned(),
                name: name.to_owned(),
            }),
            Some(c) if c.revision != expected => Err(StoreError::Conflict {
                kind: kind.to_owned(),
                name: name.to_owned(),
                expected,
                actual: c.revision,
            }),
            Some(_) => Ok(true),
        })
    }

    async fn delete(
        &self,
        kind: &str,
        name: &str,
        expected: Option<u64>,
    ) -> Result<(), StoreError> {
        self.write(kind, name, None, |current| match (current, expected) {
            (None, _) => Ok(false),
            (Some(c), Some(e)) if c.revision != e => Err(StoreError::Conflict {
                kind: kind.to_owned(),
                name: name.to_owned(),
                expected: e,
                actual: c.revision,
            }),
            _ => Ok(true),
        })
        .map(|_| ())
    }

    async fn watch(&self, kind: &str) -> Result<Watch, StoreError> {
        // Subscribe before reading, so no change between the two is missed; changes already in
        // the snapshot are skipped by revision.
        let events = self.events.subscribe();
        let _writer = self.writer.lock().expect("writer lock");
        let initial = self.read_kind(kind)?;
        let since = self.revision()?;
        Ok(Watch {
            initial,
            kind: kind.to_owned(),
            since,
            events,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::store::{Resource, TypedStore};

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Thing {
        size: u32,
    }
    impl Resource for Thing {
        const KIND: &'static str = "Thing";
    }

    fn temp(name: &str) -> crate::test_util::TempPath {
        crate::test_util::TempPath::new(&format!("store-{name}.redb"))
    }

    #[tokio::test]
    async fn crud_with_optimistic_concurrency() {
        let path = temp("crud");
        let s = EmbeddedStore::open(&path).unwrap();
        let r1 = s.create_typed("a", &Thing { size: 1 }).await.unwrap();
        let e = s
            .create_typed("a", &Thing { size: 2 })
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("Thing a already exists"), "{e}");
        let r2 = s.update_typed("a", &Thing { size: 2 }, r1).await.unwrap();
        assert!(r2 > r1);
        let e = s
            .update_typed("a", &Thing { size: 3 }, r1)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("changed by someone else") && e.contains(&format!("revision {r2}")),
            "{e}"
        );
        let got = s.get_typed::<Thing>("a").await.unwrap().unwrap();
        assert_eq!((got.revision, got.value), (r2, Thing { size: 2 }));
        s.create_typed("b", &Thing { size: 5 }).await.unwrap();
        // Another kind with a name prefix in common does not leak into the list.
        s.create("Things", "x", b"{}".to_vec()).await.unwrap();
        let all = s.list_typed::<Thing>().await.unwrap();
        assert_eq!(
            all.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(s.delete("Thing", "a", Some(r1)).await.is_err());
        s.delete("Thing", "a", Some(r2)).await.unwrap();
        s.delete("Thing", "a", None).await.unwrap();
        assert!(s.get("Thing", "a").await.unwrap().is_none());
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
        assert!(s.create_typed("b", &Thing { size: 1 }).await.unwrap() > rev);
    }

    #[tokio::test]
    async fn watch_sees_the_snapshot_then_every_change_in_order() {
        let path = temp("watch");
        let s = EmbeddedStore::open(&path).unwrap();
        s.create_typed("before", &Thing { size: 1 }).await.unwrap();
        let mut w = s.watch("Thing").await.unwrap();
        assert_eq!(w.initial.len(), 1);
        let r = s.create_typed("x", &Thing { size: 2 }).await.unwrap();
        s.create("Other", "y", b"{}".to_vec()).await.unwrap();
        s.update_typed("x", &Thing { size: 3 }, r).await.unwrap();
        s.delete("Thing", "before", None).await.unwrap();
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(match w.next().await.unwrap() {
                WatchEvent::Put(o) => {
                    format!("put {} {}", o.name, String::from_utf8_lossy(&o.value))
                }
                WatchEvent::Deleted { name, .. } => format!("del {name}"),
            });
        }
        assert_eq!(
            seen,
            ["put x {\"size\":2}", "put x {\"size\":3}", "del before"]
        );
    }
}
