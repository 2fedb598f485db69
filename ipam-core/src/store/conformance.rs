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
    // Names are Kubernetes' on every store: one that could break a file written from it (a
    // quote in BIRD's configuration) is refused, naming the rule.
    let e = s
        .create_typed("peer\"one", &Thing { size: 1 })
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cannot be stored") && e.contains("DNS-1123 subdomain"),
        "{e}"
    );
    let r2 = s.update_typed("a", &Thing { size: 2 }, &r1).await.unwrap();
    // Revisions are only compared for equality: a Kubernetes resourceVersion has no order.
    assert_ne!(r2, r1);
    let e = s
        .update_typed("a", &Thing { size: 3 }, &r1)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("changed by someone else") && e.contains(&format!("revision {r2}")),
        "{e}"
    );
    let e = s
        .update_typed("missing", &Thing { size: 3 }, &r1)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("Thing missing does not exist"), "{e}");
    let got = s.get_typed::<Thing>("a").await.unwrap().unwrap();
    assert_eq!((&got.revision, got.value), (&r2, Thing { size: 2 }));
    s.create_typed("b", &Thing { size: 5 }).await.unwrap();
    // Another kind with a name prefix in common does not leak into the list.
    s.create("Things", "x", b"{}".to_vec()).await.unwrap();
    let all = s.list_typed::<Thing>().await.unwrap();
    assert_eq!(
        all.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert!(s.delete("Thing", "a", Some(&r1)).await.is_err());
    s.delete("Thing", "a", Some(&r2)).await.unwrap();
    s.delete("Thing", "a", None).await.unwrap();
    s.delete("Thing", "a", Some(&r2)).await.unwrap();
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
    s.update_typed("x", &Thing { size: 3 }, &r).await.unwrap();
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

/// One candidate leads; another takes over only after seeing the lease unchanged for its whole
/// duration, by which time the old leader has stopped acting; a released lease is taken at once.
pub async fn one_leader_and_takeover_after_the_duration<S: Store>(s: &S) {
    use std::time::{Duration, Instant};

    use super::lease::{LeaderElection, Leadership};
    let duration = Duration::from_millis(600);
    let mut a = LeaderElection::new("operator", "a", duration);
    let mut b = LeaderElection::new("operator", "b", duration);
    assert_eq!(
        a.step(s).await.unwrap(),
        Leadership::Leading { acquired: true }
    );
    let mut renewed = Instant::now();
    for _ in 0..8 {
        assert_eq!(
            b.step(s).await.unwrap(),
            Leadership::Following { holder: "a".into() }
        );
        let renewing = Instant::now();
        let stepped = a.step(s).await.unwrap();
        // A pause longer than the renew deadline (a loaded machine) left `a` not acting until
        // this step, which takes the lease it still holds up again: acquired anew.
        let lapsed = renewed.elapsed() >= duration * 2 / 3;
        assert!(
            stepped == Leadership::Leading { acquired: false }
                || (lapsed && stepped == Leadership::Leading { acquired: true }),
            "{stepped:?} {:?} after a's last renewal",
            renewed.elapsed()
        );
        renewed = renewing;
        // A renewal slower than the deadline (a loaded machine) rightly leaves `a` not acting.
        // Read after `is_leading`: if `a` no longer leads, its deadline had passed by then.
        let leading = a.is_leading();
        let slow = renewing.elapsed() >= duration * 2 / 3;
        assert!(
            (leading || slow) && !b.is_leading(),
            "a leads after its renewal ({:?}), b never does",
            renewing.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // a stops renewing (its process died).
    let last_renewal = Instant::now();
    loop {
        match b.step(s).await.unwrap() {
            Leadership::Leading { acquired } => {
                assert!(acquired);
                break;
            }
            Leadership::Following { holder } => assert_eq!(holder, "a"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        last_renewal.elapsed() >= duration,
        "{:?}",
        last_renewal.elapsed()
    );
    assert!(
        !a.is_leading(),
        "the old leader stopped acting before the takeover"
    );
    b.release(s).await.unwrap();
    assert!(!b.is_leading());
    assert_eq!(
        a.step(s).await.unwrap(),
        Leadership::Leading { acquired: true }
    );
}

/// Candidates that step, pause (as a stalled or dead process) and come back: the intervals in
/// which each may act never overlap with another's.
pub async fn concurrent_candidates_never_both_lead<S: Store + 'static>(s: std::sync::Arc<S>) {
    concurrent_candidates_never_both_lead_with(s, std::time::Duration::from_millis(300)).await;
}

/// As `concurrent_candidates_never_both_lead`, with leases of `lease` (a store that keeps a
/// lease's duration in whole seconds, as Kubernetes does, needs at least a second); the pauses
/// and the run scale with it.
pub async fn concurrent_candidates_never_both_lead_with<S: Store + 'static>(
    s: std::sync::Arc<S>,
    lease: std::time::Duration,
) {
    use std::time::{Duration, Instant};

    use rand::{Rng as _, SeedableRng as _};

    use super::lease::LeaderElection;
    let name = format!("race-{}", rand::random::<u32>());
    let tasks: Vec<_> = (0..6)
        .map(|c| {
            let (s, name) = (s.clone(), name.clone());
            tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(c);
                let mut e = LeaderElection::new(&name, &format!("c{c}"), lease);
                let mut acting: Vec<(Instant, Instant)> = Vec::new();
                let end = Instant::now() + lease * 10;
                let mut leading_since: Option<Instant> = None;
                while Instant::now() < end {
                    let _ = e.step(&*s).await;
                    let now = Instant::now();
                    if let Some(until) = e.leading_until()
                        && now < until
                    {
                        acting.push((now, until));
                    }
                    leading_since = e.is_leading().then(|| leading_since.unwrap_or(now));
                    // Random stalls anywhere, and a leader that has led for two leases stalls
                    // for two (as a process stopped mid-term): leadership moves in every run,
                    // even when steps are slow on a loaded machine.
                    let pause = if leading_since.is_some_and(|t| now.duration_since(t) >= lease * 2)
                    {
                        leading_since = None;
                        lease * 2
                    } else if rng.random_ratio(1, 12) {
                        lease * 4 / 3
                    } else {
                        Duration::from_millis(20)
                    };
                    tokio::time::sleep(pause).await;
                }
                acting
            })
        })
        .collect();
    let mut all = Vec::new();
    for (c, t) in tasks.into_iter().enumerate() {
        for interval in t.await.unwrap() {
            all.push((c, interval));
        }
    }
    let leaders: std::collections::BTreeSet<usize> = all.iter().map(|(c, _)| *c).collect();
    assert!(
        leaders.len() > 1,
        "the pauses made leadership move: {leaders:?}"
    );
    for (i, (c1, (s1, e1))) in all.iter().enumerate() {
        for (c2, (s2, e2)) in &all[i + 1..] {
            if c1 != c2 {
                assert!(
                    e1 <= s2 || e2 <= s1,
                    "c{c1} and c{c2} both acted as leader at once"
                );
            }
        }
    }
}
