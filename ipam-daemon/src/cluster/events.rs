//! Telling users what happened to their objects where they look, beside the log and the
//! metrics: on a Kubernetes store, Events on the objects (`kubectl describe podippool default`);
//! on the other stores, the objects' conditions and the log say it already.

use std::{
    net::IpAddr,
    sync::Mutex,
    time::{Duration, Instant},
};

use ipam_core::pod::operator::PoolEvent;
use ipam_kube::events::{EventPublisher, Severity};

use super::store::ClusterStore;

pub enum Events {
    /// No event API: conditions, log lines and metrics carry it.
    None,
    /// Boxed: a publisher holds a client and a cache; most stores need neither.
    Kubernetes(Box<EventPublisher>, Mutex<Budget>),
}

/// How many Events one publisher sends in a burst, and how many a second after it: a burst
/// of happenings (an agent starting to answer for 10,000 Service IPs at once) is told in the
/// log line by line and as a few Events, not as 10,000 Events and as many reads of the
/// Services, which kept a real API server busy for minutes. client-go's event recorder
/// limits its events the same way.
const BURST: f64 = 25.0;
const PER_SECOND: f64 = 1.0;
/// How often the Events left out are said in the log.
const SAY_DROPPED: Duration = Duration::from_secs(60);

/// What is left of the publisher's Events budget (a token bucket).
pub struct Budget {
    tokens: f64,
    at: Instant,
    /// Left out since the log last said so, and when it did.
    dropped: u64,
    said: Option<Instant>,
}

impl Budget {
    fn new(now: Instant) -> Self {
        Self {
            tokens: BURST,
            at: now,
            dropped: 0,
            said: None,
        }
    }

    /// Takes one Event from the budget at `now`; false when it is spent (and says, at most once
    /// a minute, how many were left out).
    fn take(&mut self, now: Instant) -> bool {
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * PER_SECOND;
        self.tokens = (self.tokens + refill).min(BURST);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return true;
        }
        self.dropped += 1;
        if self
            .said
            .is_none_or(|at| now.saturating_duration_since(at) >= SAY_DROPPED)
        {
            tracing::info!(
                left_out = self.dropped,
                "more Kubernetes Events than {BURST} at once and {PER_SECOND} a second: these \
                 were left out (the log says each happening)"
            );
            self.dropped = 0;
            self.said = Some(now);
        }
        false
    }
}

impl Events {
    /// Events for `store`, reported by `controller` replica `instance`.
    pub fn for_store(store: &ClusterStore, controller: &str, instance: &str) -> Self {
        match store.kube() {
            Some(s) => Self::Kubernetes(
                Box::new(EventPublisher::new(s, controller, instance)),
                Mutex::new(Budget::new(Instant::now())),
            ),
            None => Self::None,
        }
    }

    /// Whether events go anywhere (a Kubernetes store).
    pub fn publishes(&self) -> bool {
        matches!(self, Self::Kubernetes(..))
    }

    /// An event the operator reported once, when it happened.
    pub async fn pool_event(&self, event: &PoolEvent) {
        match event {
            PoolEvent::Exhausted { pool, family, node } => {
                let note = format!(
                    "no {} block left for node {node}; append a CIDR to the pool's spec.{}.cidrs",
                    family.name(),
                    if family.bits() == 32 { "ipv4" } else { "ipv6" }
                );
                self.warn("PodIPPool", pool, "PoolExhausted", "AssignBlock", &note)
                    .await;
                let note = format!(
                    "pool {pool} has no {} block left for this node",
                    family.name()
                );
                self.warn("NodeIPAM", node, "PoolExhausted", "AssignBlock", &note)
                    .await;
            }
            PoolEvent::Refused { pool, message } => {
                self.warn("PodIPPool", pool, "SpecRefused", "ValidateSpec", message)
                    .await;
            }
        }
    }

    /// A problem of LB-IPAM that was not there on the previous pass; `object` is
    /// `<Kind> <name>` as the controller reports it.
    pub async fn lb_problem(&self, object: &str, message: &str) {
        let Some((kind, name)) = object.split_once(' ') else {
            return;
        };
        let reason = match kind {
            "LoadBalancerIPPool" => "PoolProblem",
            "Service" => "LoadBalancerProblem",
            _ => "PolicyProblem",
        };
        self.warn(kind, name, reason, "AssignLoadBalancerIPs", message)
            .await;
    }

    /// A service IP this node started answering for, and why: `reason` `IPAnnounced` (its
    /// agent started, a new IP), `IPTakenOver` (from a dead node) or `IPMoved` (from a node
    /// that may no longer announce it). Users see on the Service which node answers since
    /// when (`kubectl describe service`).
    pub async fn service_ip_answered(
        &self,
        service: &str,
        ip: IpAddr,
        node: &str,
        interfaces: &[String],
        reason: &str,
        why: &str,
    ) {
        let note = format!(
            "node {node} answers ARP/NDP for {ip} on {}: {why}",
            interfaces.join(", ")
        );
        self.publish(
            Severity::Normal,
            "Service",
            service,
            reason,
            "AnnounceIP",
            &note,
        )
        .await;
    }

    /// The pods of a node a majority of the nodes reported dead were set not ready: on the
    /// node's NodeIPAM, which `kubectl describe nodeipam <node>` shows.
    pub async fn pods_marked_not_ready(&self, node: &str, note: &str) {
        self.warn(
            "NodeIPAM",
            node,
            "PodsMarkedNotReady",
            "MarkPodsNotReady",
            note,
        )
        .await;
    }

    async fn warn(&self, kind: &str, name: &str, reason: &str, action: &str, note: &str) {
        self.publish(Severity::Warning, kind, name, reason, action, note)
            .await;
    }

    async fn publish(
        &self,
        severity: Severity,
        kind: &str,
        name: &str,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        let Self::Kubernetes(publisher, budget) = self else {
            return;
        };
        let allowed = budget
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take(Instant::now());
        if !allowed {
            return;
        }
        if let Err(e) = publisher
            .publish(severity, kind, name, reason, action, note)
            .await
        {
            // The condition and the log still say it.
            tracing::warn!(kind, name, reason, "cannot publish a Kubernetes event: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_told_up_to_the_budget_then_one_a_second() {
        let start = Instant::now();
        let mut budget = Budget::new(start);
        let told = (0..10_000).filter(|_| budget.take(start)).count();
        assert_eq!(told, BURST as usize, "a burst of 10,000 at once");
        assert!(!budget.take(start + Duration::from_millis(500)));
        assert!(
            budget.take(start + Duration::from_secs(1)),
            "refilled after a second"
        );
        assert!(!budget.take(start + Duration::from_secs(1)));
        // After a quiet while, a whole burst again, never more.
        let later = start + Duration::from_secs(600);
        let told = (0..100).filter(|_| budget.take(later)).count();
        assert_eq!(told, BURST as usize);
    }
}
