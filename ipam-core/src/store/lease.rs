//! Leases on top of the store (the model of Kubernetes' coordination.k8s.io Lease): an object
//! naming its holder, when it was last renewed and for how long it holds. Acquiring, renewing
//! and taking over an expired lease are update-if-revision writes, so the same code works on
//! every store and two candidates can never both win.

use serde::{Deserialize, Serialize};

use super::{Resource, StoreError, TypedStore};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    pub holder: String,
    pub duration_ms: u64,
    /// Wall-clock milliseconds since the Unix epoch.
    pub renew_time_ms: u64,
    /// How many times the lease changed hands.
    pub transitions: u64,
}

impl Resource for Lease {
    const KIND: &'static str = "Lease";
}

impl Lease {
    pub fn expired(&self, now_ms: u64) -> bool {
        now_ms > self.renew_time_ms.saturating_add(self.duration_ms)
    }
}

/// What an acquisition attempt gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// We hold it now (new, renewed, or taken over from an expired holder).
    Held { transitions: u64 },
    /// Someone else holds it for `remaining_ms` more.
    HeldBy { holder: String, remaining_ms: u64 },
}

/// Acquires or renews lease `name` for `holder`, at wall-clock time `now_ms`.
pub async fn try_acquire<S: TypedStore>(
    store: &S,
    name: &str,
    holder: &str,
    duration_ms: u64,
    now_ms: u64,
) -> Result<LeaseOutcome, StoreError> {
    let mine = |transitions| Lease {
        holder: holder.to_owned(),
        duration_ms,
        renew_time_ms: now_ms,
        transitions,
    };
    let result = match store.get_typed::<Lease>(name).await? {
        None => store.create_typed(name, &mine(0)).await.map(|_| 0),
        Some(current) if current.value.holder == holder || current.value.expired(now_ms) => {
            let transitions = current.value.transitions + u64::from(current.value.holder != holder);
            store
                .update_typed(name, &mine(transitions), current.revision)
                .await
                .map(|_| transitions)
        }
        Some(current) => {
            return Ok(LeaseOutcome::HeldBy {
                remaining_ms: (current.value.renew_time_ms + current.value.duration_ms)
                    .saturating_sub(now_ms),
                holder: current.value.holder,
            });
        }
    };
    match result {
        Ok(transitions) => Ok(LeaseOutcome::Held { transitions }),
        // Lost a race: whoever won holds it.
        Err(StoreError::Conflict { .. } | StoreError::AlreadyExists { .. }) => {
            let current = store.get_typed::<Lease>(name).await?;
            Ok(match current {
                Some(c) => LeaseOutcome::HeldBy {
                    remaining_ms: (c.value.renew_time_ms + c.value.duration_ms)
                        .saturating_sub(now_ms),
                    holder: c.value.holder,
                },
                None => LeaseOutcome::HeldBy {
                    holder: String::new(),
                    remaining_ms: 0,
                },
            })
        }
        Err(e) => Err(e),
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::embedded::EmbeddedStore;

    #[tokio::test]
    async fn one_holder_at_a_time_and_takeover_after_expiry() {
        let path = crate::test_util::TempPath::new("lease.redb");
        let s = EmbeddedStore::open(&path).unwrap();
        let t0 = 1_000_000;
        assert_eq!(
            try_acquire(&s, "l2-svc", "node-a", 2000, t0).await.unwrap(),
            LeaseOutcome::Held { transitions: 0 }
        );
        assert_eq!(
            try_acquire(&s, "l2-svc", "node-b", 2000, t0 + 500)
                .await
                .unwrap(),
            LeaseOutcome::HeldBy {
                holder: "node-a".into(),
                remaining_ms: 1500
            }
        );
        // node-a renews; node-b still waits.
        assert!(matches!(
            try_acquire(&s, "l2-svc", "node-a", 2000, t0 + 1500)
                .await
                .unwrap(),
            LeaseOutcome::Held { .. }
        ));
        assert!(matches!(
            try_acquire(&s, "l2-svc", "node-b", 2000, t0 + 3000)
                .await
                .unwrap(),
            LeaseOutcome::HeldBy { .. }
        ));
        // node-a stops renewing (its node died): node-b takes over after expiry.
        assert_eq!(
            try_acquire(&s, "l2-svc", "node-b", 2000, t0 + 3600)
                .await
                .unwrap(),
            LeaseOutcome::Held { transitions: 1 }
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_candidates_never_both_win() {
        let path = crate::test_util::TempPath::new("lease-race.redb");
        let s = Arc::new(EmbeddedStore::open(&path).unwrap());
        for round in 0..20u64 {
            let name = format!("lease-{round}");
            let tasks: Vec<_> = (0..8)
                .map(|c| {
                    let (s, name) = (s.clone(), name.clone());
                    tokio::spawn(async move {
                        try_acquire(&*s, &name, &format!("node-{c}"), 1000, 5000)
                            .await
                            .unwrap()
                    })
                })
                .collect();
            let mut winners = 0;
            for t in tasks {
                if matches!(t.await.unwrap(), LeaseOutcome::Held { .. }) {
                    winners += 1;
                }
            }
            assert_eq!(winners, 1, "round {round}");
        }
    }
}
