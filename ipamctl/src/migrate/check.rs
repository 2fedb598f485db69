//! `ipamctl migrate --check`: would the converted pools give every Service the IPs it holds?
//! LB-IPAM's own rules (`ipam_core::lb::assign`) run over the Services of the store (on
//! Kubernetes, their `status.loadBalancer.ingress` as the old controller wrote it) and the
//! converted pools alone; nothing is written.

use std::{collections::BTreeMap, net::IpAddr};

use ipam_core::lb::{
    assign::assign,
    resources::{LbIpPoolStatus, Namespace, Service, ServiceStatus, ServiceType, namespace_of},
};
use ipam_migrate::{Migration, Target};
use ipam_store::AnyStore;
use serde::Serialize;

use super::EXIT_RENUMBERED;
use crate::{
    objects::named,
    output::{Output, emit, joined, table},
};

/// One LoadBalancer Service: the IPs it has, those it would have.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Verdict {
    pub service: String,
    pub current: Vec<IpAddr>,
    pub migrated: Vec<IpAddr>,
    /// It holds IPs now and would keep every one of them (it may gain one of a family it
    /// lacks, as a PreferDualStack Service does when a pool has both).
    pub keeps: bool,
    /// Why not, or what to do first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Each LoadBalancer Service of `services` under the converted pools of `migration`, with the
/// labels of its namespace from `namespaces`.
pub(crate) fn verdicts(
    migration: &Migration,
    services: BTreeMap<String, Service>,
    namespaces: &BTreeMap<String, Namespace>,
) -> Vec<Verdict> {
    let pools: Vec<_> = migration
        .converted
        .iter()
        .filter_map(|c| match &c.target {
            Target::LbPool(spec) => Some((c.name.clone(), spec.clone(), LbIpPoolStatus::default())),
            _ => None,
        })
        .collect();
    let mut notes = BTreeMap::new();
    let services: Vec<_> = services
        .into_iter()
        .filter(|(_, s)| s.spec.service_type == ServiceType::LoadBalancer)
        .map(|(name, mut s)| {
            // A Service of the old controller's class is judged as if it had none: it is
            // served here once recreated without it (docs/migration.md).
            if !s.spec.is_ours() {
                let class = s.spec.load_balancer_class.take().unwrap_or_default();
                notes.insert(
                    name.clone(),
                    format!(
                        "its loadBalancerClass {class} is not served here, and a class cannot \
                         change: recreate the Service without it, asking for its IPs \
                         (ipam-ebpf.io/ips), when switching"
                    ),
                );
            }
            s.spec.namespace_labels = Namespace::labels_of(namespaces, namespace_of(&name));
            (name, s.spec, s.status)
        })
        .collect();
    let assignment = assign(&pools, &services);
    services
        .into_iter()
        .map(|(name, _, status)| {
            let new = assignment.services.get(&name).cloned().unwrap_or_default();
            let (mut current, mut migrated) = (status.ingress.clone(), new.ingress.clone());
            current.sort();
            migrated.sort();
            let keeps = !current.is_empty() && current.iter().all(|ip| migrated.contains(ip));
            let why = (!keeps).then(|| why_not(&current, &new)).flatten();
            let note = match (notes.remove(&name), why) {
                (Some(a), Some(b)) => Some(format!("{b}; {a}")),
                (a, b) => b.or(a),
            };
            Verdict {
                service: name,
                current,
                migrated,
                keeps,
                note,
            }
        })
        .collect()
}

/// The first failing condition of the new status, else what differs.
fn why_not(current: &[IpAddr], new: &ServiceStatus) -> Option<String> {
    if current.is_empty() {
        return Some("holds no IP now".to_owned());
    }
    new.conditions
        .iter()
        .find(|c| !c.status)
        .map(|c| c.message.clone())
        .or_else(|| {
            let lost: Vec<_> = current
                .iter()
                .filter(|ip| !new.ingress.contains(ip))
                .collect();
            (!lost.is_empty()).then(|| {
                format!(
                    "{} would not be kept: no converted pool holds it",
                    joined(lost)
                )
            })
        })
}

/// Prints the verdicts; the exit code (`EXIT_RENUMBERED` over `EXIT_DROPPED` over 0).
pub(crate) async fn check(
    store: &AnyStore,
    migration: &Migration,
    output: Output,
) -> anyhow::Result<i32> {
    let services = named::<Service>(store).await?;
    let namespaces = named::<Namespace>(store).await?;
    let verdicts = verdicts(migration, services, &namespaces);
    emit(output, &verdicts, |verdicts| {
        let mut t = table(["SERVICE", "CURRENT", "MIGRATED", "KEEPS", "NOTE"]);
        for v in verdicts {
            t.add_row([
                v.service.clone(),
                joined(&v.current),
                joined(&v.migrated),
                if v.keeps { "yes" } else { "no" }.to_owned(),
                v.note.clone().unwrap_or_default(),
            ]);
        }
        println!("{t}");
    })?;
    let renumbered = verdicts
        .iter()
        .filter(|v| !v.current.is_empty() && !v.keeps)
        .count();
    let dropped = super::report(migration);
    if renumbered > 0 {
        eprintln!(
            "{renumbered} Service(s) would not keep their IPs under the converted pools (listed \
             above): extend the pools before switching"
        );
        Ok(EXIT_RENUMBERED)
    } else {
        Ok(dropped)
    }
}
