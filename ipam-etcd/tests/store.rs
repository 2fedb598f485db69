//! The etcd store against real etcd members on loopback: the store conformance tests, watches
//! across a member's death and a compaction, and errors that name the endpoint.

use std::time::Duration;

use ipam_core::store::{Store, TypedStore, WatchEvent, conformance, conformance::Thing};
use ipam_etcd::{EtcdConfig, EtcdStore, testing::EtcdCluster};

async fn shared(name: &str) -> EtcdStore {
    EtcdStore::connect(EtcdCluster::shared_config(name))
        .await
        .unwrap()
}

#[tokio::test]
async fn crud_with_optimistic_concurrency() {
    conformance::crud_with_optimistic_concurrency(&shared("crud").await).await;
}

#[tokio::test]
async fn watch_sees_the_snapshot_then_every_change_in_order() {
    conformance::watch_sees_the_snapshot_then_every_change_in_order(&shared("watch").await).await;
}

/// A watch whose revisions were compacted away lists the kind again and goes on.
#[tokio::test]
async fn a_compacted_watch_lists_again_and_goes_on() {
    let s = shared("compact").await;
    s.create_typed("a", &Thing { size: 1 }).await.unwrap();
    let mut w = s.watch("Thing").await.unwrap();
    let start = w.revision.clone();
    // Changes the watch has not delivered yet, then a compaction past them: a watch reopened
    // from `start` now finds its revisions gone.
    let mut rev = s.create_typed("b", &Thing { size: 2 }).await.unwrap();
    for size in 3..6 {
        rev = s.update_typed("b", &Thing { size }, &rev).await.unwrap();
    }
    s.delete("Thing", "a", None).await.unwrap();
    let mut client = etcd_client::Client::connect(s.config().endpoints.clone(), None)
        .await
        .unwrap();
    let compact_at = s.create_typed("c", &Thing { size: 9 }).await.unwrap();
    let compact_at = compact_at.number().expect("etcd revisions are numbers");
    client.compact(compact_at as i64, None).await.unwrap();
    // The watch may already have followed some or all changes; either way it must end with the
    // set of objects there are now.
    let mut names: std::collections::BTreeSet<String> =
        w.initial.iter().map(|o| o.name.clone()).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while names != ["b", "c"].map(String::from).into() {
        let event = tokio::time::timeout_at(deadline, w.next())
            .await
            .expect("watch caught up within 10 s");
        match event {
            Ok(WatchEvent::Put(o)) => {
                names.insert(o.name);
            }
            Ok(WatchEvent::Deleted { name, .. }) => {
                names.remove(&name);
            }
            Ok(WatchEvent::Resync { objects, .. }) => {
                names = objects.into_iter().map(|o| o.name).collect();
            }
            Err(e) => eprintln!("watch reported: {e}"),
        }
    }
    assert!(start.number().unwrap() < compact_at);
}

/// A watch on a store where nothing changes stays open for 25 s and then delivers the next
/// change: neither the client's keep-alive pings nor its progress requests on a quiet watch
/// break anything. Pinging every 2 s, etcd closed the connection (`too_many_pings`, at its
/// default `--grpc-keepalive-min-time` of 5 s) within 6-8 s of quiet, and every agent's copies
/// went stale for a second each time.
#[tokio::test]
async fn a_quiet_watch_stays_open() {
    let s = shared("quiet").await;
    let mut w = s.watch("Thing").await.unwrap();
    tokio::time::sleep(Duration::from_secs(25)).await;
    s.create_typed("a", &Thing { size: 1 }).await.unwrap();
    // A `Resync` is a watch's own (another test of this binary compacts the shared store);
    // an error is what the pings or a progress request gone wrong would give.
    let errors = sees(&mut w, "a", Duration::from_secs(5)).await;
    assert!(
        errors.is_empty(),
        "after 25 s of quiet the watch failed: {errors:?}"
    );
}

/// Reads `w` until it delivers object `name` (put, or in a relisting) within `within`; the
/// errors it said meanwhile.
async fn sees(w: &mut ipam_core::store::Watch, name: &str, within: Duration) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + within;
    let mut errors = Vec::new();
    loop {
        let event = tokio::time::timeout_at(deadline, w.next())
            .await
            .unwrap_or_else(|_| panic!("{name} not delivered within {within:?}: {errors:?}"));
        match event {
            Ok(WatchEvent::Put(o)) if o.name == name => return errors,
            Ok(WatchEvent::Resync { objects, .. }) if objects.iter().any(|o| o.name == name) => {
                return errors;
            }
            Ok(_) => {}
            Err(e) => errors.push(e.to_string()),
        }
    }
}

/// A watch on a member that stops answering (frozen: its connection stays open) says so within
/// seconds, not at the connection's keep-alive, and follows the store again once the member
/// answers: until then the copy it feeds is known stale, not taken for current.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_member_that_stops_answering_says_so_within_seconds() {
    let cluster = EtcdCluster::start(1).unwrap();
    let mut config = cluster.config("/frozen");
    config.request_timeout_ms = 1_000;
    let s = EtcdStore::connect(config).await.unwrap();
    let mut w = s.watch("Thing").await.unwrap();
    // The member's watch is open once it delivered a change.
    s.create_typed("before", &Thing { size: 0 }).await.unwrap();
    let event = tokio::time::timeout(Duration::from_secs(5), w.next()).await;
    assert!(
        matches!(&event, Ok(Ok(WatchEvent::Put(o))) if o.name == "before"),
        "{event:?}"
    );
    cluster.freeze(0);
    let frozen = tokio::time::Instant::now();
    let said = tokio::time::timeout(Duration::from_secs(8), w.next()).await;
    let after = frozen.elapsed();
    cluster.thaw(0);
    let said = said.expect("the watch said something within 8 s of the member freezing");
    assert!(
        said.as_ref()
            .is_err_and(|e| e.to_string().contains("progress request")),
        "the watch said {said:?} {after:?} after the member froze"
    );
    s.create_typed("a", &Thing { size: 1 }).await.unwrap();
    sees(&mut w, "a", Duration::from_secs(15)).await;
}

/// Errors say which endpoint failed and what to check.
#[tokio::test]
async fn errors_name_the_endpoint_and_the_cause() {
    let dead = "http://127.0.0.1:9".to_owned();
    let mut config = EtcdConfig::new(vec![dead.clone()]);
    config.request_timeout_ms = 500;
    config.dial_timeout_ms = 300;
    let store = EtcdStore::connect(config).await.unwrap();
    let e = store.get("Thing", "x").await.unwrap_err().to_string();
    assert!(e.contains("127.0.0.1:9") && e.contains("refused"), "{e}");
    let checked = store.check_members().await;
    let e = checked[0].1.as_ref().unwrap_err().to_string();
    assert!(e.contains(&dead) && e.contains("refused"), "{e}");

    let e = match EtcdStore::connect(EtcdConfig::new(vec![])).await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("no endpoints accepted"),
    };
    assert!(e.contains("no endpoints"), "{e}");
}

/// One member of three SIGKILLed while writing: every write still lands, and a watch keeps
/// following; the member comes back and catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_member_down_changes_nothing_for_clients() {
    let mut cluster = EtcdCluster::start(3).unwrap();
    let s = EtcdStore::connect(cluster.config("/one-down"))
        .await
        .unwrap();
    let mut w = s.watch("Thing").await.unwrap();
    for i in 0..20 {
        s.create_typed(&format!("before-{i}"), &Thing { size: i })
            .await
            .unwrap();
    }
    cluster.kill(0);
    for i in 0..50 {
        s.create_typed(&format!("during-{i}"), &Thing { size: i })
            .await
            .unwrap_or_else(|e| panic!("write {i} with one member down: {e}"));
    }
    cluster.restart(0).unwrap();
    cluster.wait_ready(Duration::from_secs(20)).unwrap();
    for i in 0..10 {
        s.create_typed(&format!("after-{i}"), &Thing { size: i })
            .await
            .unwrap();
    }
    let mut seen = 0;
    while seen < 80 {
        match tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .expect("watch follows through the member's death")
        {
            Ok(WatchEvent::Put(_)) => seen += 1,
            Ok(other) => panic!("unexpected {other:?}"),
            Err(e) => eprintln!("watch reported: {e}"),
        }
    }
    assert_eq!(s.list("Thing").await.unwrap().len(), 80);
}

/// Two members of three down: no quorum. Requests fail within the timeout with an error that
/// says so (no hang); when the members are back, the same store works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_lost_fails_clearly_and_recovers_without_reconnecting() {
    let mut cluster = EtcdCluster::start(3).unwrap();
    let mut config = cluster.config("/quorum");
    config.request_timeout_ms = 1000;
    let s = EtcdStore::connect(config).await.unwrap();
    s.create_typed("a", &Thing { size: 1 }).await.unwrap();
    cluster.kill(1);
    cluster.kill(2);
    let started = std::time::Instant::now();
    let e = s
        .create_typed("b", &Thing { size: 2 })
        .await
        .unwrap_err()
        .to_string();
    eprintln!("with two of three members down: {e}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "failed only after {:?}",
        started.elapsed()
    );
    assert!(
        e.contains("etcd")
            && (e.contains("leader") || e.contains("no answer") || e.contains("refused")),
        "{e}"
    );
    cluster.restart(1).unwrap();
    cluster.restart(2).unwrap();
    cluster.wait_ready(Duration::from_secs(20)).unwrap();
    // The refused write may still land once the majority is back (etcd had taken the proposal
    // before the deadline): the next write goes to another key.
    let mut last_error = String::new();
    for attempt in 0..50 {
        match s
            .create_typed(&format!("c{attempt}"), &Thing { size: 2 })
            .await
        {
            Ok(_) => return,
            Err(e) => last_error = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("store does not work again once a majority is back: {last_error}");
}

#[tokio::test]
async fn one_leader_and_takeover_after_the_duration() {
    conformance::one_leader_and_takeover_after_the_duration(&shared("lead").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_candidates_never_both_lead() {
    conformance::concurrent_candidates_never_both_lead(std::sync::Arc::new(shared("race").await))
        .await;
}
