//! Leases on top of the store (the model of Kubernetes' coordination.k8s.io Lease): an object
//! naming its holder, renewed by rewriting it. Acquiring, renewing and taking over are
//! update-if-revision writes, so the same code works on every store and two candidates can
//! never both win one round.
//!
//! Expiry is judged by the observer's own monotonic clock, never by comparing the holder's
//! wall-clock time with ours: a lease is expired when its revision has not changed for its
//! whole duration *as seen here*. A holder on a host whose clock is off can therefore not look
//! dead (or alive) to others, and an observer that just started waits a full duration before
//! it calls anything expired.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

use super::{Resource, Revision, StoreError, TypedStore};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// Who holds it; empty when released.
    pub holder: String,
    pub duration_ms: u64,
    /// Wall-clock milliseconds since the Unix epoch at the last renewal: for people reading
    /// the lease, not for deciding expiry.
    pub renew_time_ms: u64,
    /// How many times the lease changed hands.
    pub transitions: u64,
}

impl Resource for Lease {
    const KIND: &'static str = "Lease";
}

impl Lease {
    pub fn duration(&self) -> Duration {
        Duration::from_millis(self.duration_ms)
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Watches leases change, by name, on the local clock.
#[derive(Debug, Default)]
pub struct LeaseObserver {
    /// name -> (revision last seen, or None for "no lease", and when it was first seen so).
    seen: HashMap<String, (Option<Revision>, Instant)>,
}

impl LeaseObserver {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the revision of lease `name` now (`None`: there is none).
    pub fn observe(&mut self, name: &str, revision: Option<&Revision>, now: Instant) {
        match self.seen.get_mut(name) {
            Some((seen, since)) if seen.as_ref() != revision => {
                let revision = revision.cloned();
                *seen = revision;
                *since = now;
            }
            Some(_) => {}
            None => {
                self.seen.insert(name.to_owned(), (revision.cloned(), now));
            }
        }
    }

    /// How long lease `name` has stayed as it is, as seen here (zero if never observed).
    pub fn unchanged_for(&self, name: &str, now: Instant) -> Duration {
        self.seen.get(name).map_or(Duration::ZERO, |(_, since)| {
            now.saturating_duration_since(*since)
        })
    }

    pub fn forget(&mut self, name: &str) {
        self.seen.remove(name);
    }
}

/// What a step of an election found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leadership {
    /// We lead; `acquired` on the step that made us leader.
    Leading { acquired: bool },
    /// Someone else leads (empty when the lease was released and another won the race).
    Following { holder: String },
}

/// Who leads, as a replica last saw the lease.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Leader {
    /// Not yet seen, or the lease could not be read.
    #[default]
    Unknown,
    /// This replica.
    Us,
    /// Another replica: the identity holding the lease.
    Other(String),
}

/// One candidate in an election over lease `name`.
///
/// Call `step` every `renew_interval`. The leader acts only while `is_leading` holds, which
/// ends `renew_deadline` after its last successful renewal; another candidate takes over only
/// after seeing the lease unchanged for the full `duration`. The gap between the two keeps two
/// leaders from ever acting at once, as long as a pass of the leader's work is shorter than
/// the gap (it checks `is_leading` before each write).
#[derive(Debug)]
pub struct LeaderElection {
    name: String,
    identity: String,
    duration: Duration,
    renew_deadline: Duration,
    observer: LeaseObserver,
    renewed_at: Option<Instant>,
}

impl LeaderElection {
    /// Leadership lasts `duration` without renewal; the leader stops acting after two thirds
    /// of it.
    pub fn new(name: &str, identity: &str, duration: Duration) -> Self {
        Self {
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration,
            renew_deadline: duration * 2 / 3,
            observer: LeaseObserver::new(),
            renewed_at: None,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// How often to call `step`.
    pub fn renew_interval(&self) -> Duration {
        self.duration / 5
    }

    /// Whether we may act as leader now.
    pub fn is_leading(&self) -> bool {
        self.leading_until()
            .is_some_and(|until| Instant::now() < until)
    }

    /// Until when we may act as leader, if we lead.
    pub fn leading_until(&self) -> Option<Instant> {
        self.renewed_at.map(|at| at + self.renew_deadline)
    }

    /// Acquires, renews or takes over the lease, or observes who holds it.
    pub async fn step<S: TypedStore>(&mut self, store: &S) -> Result<Leadership, StoreError> {
        // Taken before the request: the leader's deadline counts from before its write landed,
        // every follower's patience from after it saw the write.
        let now = Instant::now();
        let was_leading = self.is_leading();
        let mine = |transitions| Lease {
            holder: self.identity.clone(),
            duration_ms: self.duration.as_millis() as u64,
            renew_time_ms: now_ms(),
            transitions,
        };
        let current = store.get_typed::<Lease>(&self.name).await?;
        self.observer
            .observe(&self.name, current.as_ref().map(|c| &c.revision), now);
        let written = match current {
            None => store.create_typed(&self.name, &mine(0)).await,
            Some(c) if c.value.holder == self.identity => {
                store
                    .update_typed(&self.name, &mine(c.value.transitions), &c.revision)
                    .await
            }
            Some(c)
                if c.value.holder.is_empty()
                    || self.observer.unchanged_for(&self.name, now) >= c.value.duration() =>
            {
                store
                    .update_typed(&self.name, &mine(c.value.transitions + 1), &c.revision)
                    .await
            }
            Some(c) => {
                self.renewed_at = None;
                return Ok(Leadership::Following {
                    holder: c.value.holder,
                });
            }
        };
        match written {
            Ok(_) => {
                self.renewed_at = Some(now);
                Ok(Leadership::Leading {
                    acquired: !was_leading,
                })
            }
            // Lost a race: whoever won holds it.
            Err(StoreError::Conflict { .. } | StoreError::AlreadyExists { .. }) => {
                self.renewed_at = None;
                let holder = store
                    .get_typed::<Lease>(&self.name)
                    .await?
                    .map(|c| c.value.holder)
                    .unwrap_or_default();
                Ok(Leadership::Following { holder })
            }
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up (on a clean shutdown), so another candidate takes over at once.
    pub async fn release<S: TypedStore>(&mut self, store: &S) -> Result<(), StoreError> {
        self.renewed_at = None;
        if let Some(c) = store.get_typed::<Lease>(&self.name).await?
            && c.value.holder == self.identity
        {
            let released = Lease {
                holder: String::new(),
                ..c.value
            };
            match store.update_typed(&self.name, &released, &c.revision).await {
                Ok(_) | Err(StoreError::Conflict { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Renews the lease `name` held by `holder` unconditionally (a node's liveness lease: only the
/// node itself writes it).
pub async fn renew<S: TypedStore>(
    store: &S,
    name: &str,
    holder: &str,
    duration: Duration,
) -> Result<(), StoreError> {
    LeaseRenewal::new(name, holder, duration).renew(store).await
}

/// Renews one lease again and again with one write each time: an update conditioned on the
/// revision its own last write produced. Only the first renewal, or one after someone else
/// wrote the lease (or deleted it), reads it first.
#[derive(Debug)]
pub struct LeaseRenewal {
    name: String,
    holder: String,
    duration: Duration,
    /// The revision of our last write, and the lease's transitions then.
    held: Option<(Revision, u64)>,
}

impl LeaseRenewal {
    pub fn new(name: &str, holder: &str, duration: Duration) -> Self {
        Self {
            name: name.to_owned(),
            holder: holder.to_owned(),
            duration,
            held: None,
        }
    }

    fn lease(&self, transitions: u64) -> Lease {
        Lease {
            holder: self.holder.clone(),
            duration_ms: self.duration.as_millis() as u64,
            renew_time_ms: now_ms(),
            transitions,
        }
    }

    /// Renews the lease (creating it if there is none).
    pub async fn renew<S: TypedStore>(&mut self, store: &S) -> Result<(), StoreError> {
        if let Some((revision, transitions)) = self.held.take() {
            match store
                .update_typed(&self.name, &self.lease(transitions), &revision)
                .await
            {
                Ok(revision) => {
                    self.held = Some((revision, transitions));
                    return Ok(());
                }
                // Written or deleted by someone else: read what is there.
                Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => {}
                Err(e) => {
                    // The write may or may not have landed: if it did, the next one
                    // conflicts and reads.
                    self.held = Some((revision, transitions));
                    return Err(e);
                }
            }
        }
        loop {
            let (result, transitions) = match store.get_typed::<Lease>(&self.name).await? {
                None => (store.create_typed(&self.name, &self.lease(0)).await, 0),
                Some(c) => {
                    let transitions = c.value.transitions;
                    let lease = self.lease(transitions);
                    (
                        store.update_typed(&self.name, &lease, &c.revision).await,
                        transitions,
                    )
                }
            };
            match result {
                Ok(revision) => {
                    self.held = Some((revision, transitions));
                    return Ok(());
                }
                Err(StoreError::Conflict { .. } | StoreError::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{conformance, embedded::EmbeddedStore};

    #[test]
    fn observer_counts_from_the_last_change_it_saw() {
        let mut o = LeaseObserver::new();
        let t0 = Instant::now();
        o.observe("n", Some(&Revision::Number(5)), t0);
        o.observe("n", Some(&Revision::Number(5)), t0 + Duration::from_secs(3));
        assert_eq!(
            o.unchanged_for("n", t0 + Duration::from_secs(4)),
            Duration::from_secs(4)
        );
        o.observe("n", Some(&Revision::Number(6)), t0 + Duration::from_secs(5));
        assert_eq!(
            o.unchanged_for("n", t0 + Duration::from_secs(6)),
            Duration::from_secs(1)
        );
        // Never seen: no time has passed, whatever the clock says.
        assert_eq!(o.unchanged_for("m", t0), Duration::ZERO);
    }

    #[tokio::test]
    async fn one_leader_and_takeover_after_the_duration() {
        let path = crate::test_util::TempPath::new("lease.redb");
        conformance::one_leader_and_takeover_after_the_duration(
            &EmbeddedStore::open(&path).unwrap(),
        )
        .await;
    }

    #[tokio::test]
    async fn a_renewal_survives_someone_else_writing_or_deleting_the_lease() {
        let path = crate::test_util::TempPath::new("lease-renewal.redb");
        let store = EmbeddedStore::open(&path).unwrap();
        let mut renewal = LeaseRenewal::new("node-a", "a", Duration::from_secs(15));
        renewal.renew(&store).await.unwrap();
        let first = store.get_typed::<Lease>("node-a").await.unwrap().unwrap();
        renewal.renew(&store).await.unwrap();
        let second = store.get_typed::<Lease>("node-a").await.unwrap().unwrap();
        assert_ne!(first.revision, second.revision, "renewed");
        assert_eq!(renewal.held.as_ref().map(|h| &h.0), Some(&second.revision));

        // Someone else's write: the conditional update conflicts, the renewal reads and wins.
        let mut other = second.value.clone();
        other.transitions = 7;
        store
            .update_typed("node-a", &other, &second.revision)
            .await
            .unwrap();
        renewal.renew(&store).await.unwrap();
        let third = store.get_typed::<Lease>("node-a").await.unwrap().unwrap();
        assert_eq!(
            (third.value.holder.as_str(), third.value.transitions),
            ("a", 7)
        );

        // Deleted: created again.
        crate::store::Store::delete(&store, Lease::KIND, "node-a", None)
            .await
            .unwrap();
        renewal.renew(&store).await.unwrap();
        let fourth = store.get_typed::<Lease>("node-a").await.unwrap().unwrap();
        assert_eq!(fourth.value.holder, "a");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_candidates_never_both_lead() {
        let path = crate::test_util::TempPath::new("lease-race.redb");
        conformance::concurrent_candidates_never_both_lead(std::sync::Arc::new(
            EmbeddedStore::open(&path).unwrap(),
        ))
        .await;
    }
}
