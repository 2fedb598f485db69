//! Telling users what happened to their objects where they look, beside the log and the
//! metrics: on a Kubernetes store, Events on the objects (`kubectl describe podippool default`);
//! on the other stores, the objects' conditions and the log say it already.

use std::net::IpAddr;

use ipam_core::pod::operator::PoolEvent;
use ipam_kube::events::{EventPublisher, Severity};

use super::store::ClusterStore;

pub enum Events {
    /// No event API: conditions, log lines and metrics carry it.
    None,
    /// Boxed: a publisher holds a client and a cache; most stores need neither.
    Kubernetes(Box<EventPublisher>),
}

impl Events {
    /// Events for `store`, reported by `controller` replica `instance`.
    pub fn for_store(store: &ClusterStore, controller: &str, instance: &str) -> Self {
        match store.kube() {
            Some(s) => Self::Kubernetes(Box::new(EventPublisher::new(s, controller, instance))),
            None => Self::None,
        }
    }

    /// Whether events go anywhere (a Kubernetes store).
    pub fn publishes(&self) -> bool {
        matches!(self, Self::Kubernetes(_))
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
        let Self::Kubernetes(publisher) = self else {
            return;
        };
        if let Err(e) = publisher
            .publish(severity, kind, name, reason, action, note)
            .await
        {
            // The condition and the log still say it.
            tracing::warn!(kind, name, reason, "cannot publish a Kubernetes event: {e}");
        }
    }
}
