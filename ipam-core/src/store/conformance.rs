//! What every store must do, as tests any store can run: the embedded store runs them in its
//! unit tests, the etcd store against real members. A store passes when every function here
//! returns; they panic with what differed.

use serde::{Deserialize, Serialize};

use super::{Resource, Store, TypedStore, WatchEvent};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Thing {
    pub size: u32,
}

impl Resource for Thing {
    const KIND: &'static str = "Thing";
}

/// Create, conflicting create, update-if-revision, stale update, list (kinds that share a
/// prefix stay apart), conditional and plain delete.
pub async fn crud_with_optimistic_concurrency<S: Store>(s: &S) {
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
    let e = s
        .update_typed("missing", &Thing { size: 3 }, r1)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("Thing missing does not exist"), "{e}");
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
    s.delete("Thing", "a", Some(r2)).await.unwrap();
    assert!(s.get("Thing", "a").await.unwrap().is_none());
}

/// A watch starts with the objects there are, then sees every later change of its kind, in
/// order, and nothing of other kinds.
pub async fn watch_sees_the_snapshot_then_every_change_in_order<S: Store>(s: &S) {
    s.create_typed("before", &Thing { size: 1 }).await.unwrap();
    let mut w = s.watch("Thing").await.unwrap();
    assert_eq!(w.initial.len(), 1);
    let r = s.create_typed("x", &Thing { size: 2 }).await.unwrap();
    s.create("Other", "y", b"{}".to_vec()).await.unwrap();
    s.update_typed("x", &Thing { size: 3 }, r).await.unwrap();
    s.delete("Thing", "before", None).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), w.next())
            .await
            .expect("a watch event within 10 s");
        seen.push(match event {
            Ok(WatchEvent::Put(o)) => {
                format!("put {} {}", o.name, String::from_utf8_lossy(&o.value))
            }
            Ok(WatchEvent::Deleted { name, .. }) => format!("del {name}"),
            Ok(WatchEvent::Resync { .. }) => panic!("no resync expected"),
            // Trouble the store retries: the watch goes on.
            Err(_) => continue,
        });
    }
    assert_eq!(
        seen,
        ["put x {\"size\":2}", "put x {\"size\":3}", "del before"]
    );
}
