//! The operator's LB-IPAM controller: reads pools, services, policies and node records from the
//! store, runs the assignment, and writes what changed: each service's IPs and condition, each
//! pool's counts and conditions, and the warning for pools no announced interface reaches.

use super::{
    announce::{announce_problems, unreachable_pools},
    assign::assign,
    resources::{L2AnnouncementPolicy, LbIpPool, Service},
    rows,
};
use crate::{
    resources::{Condition, NodeIpam},
    store::{StoreError, TypedStore},
};

pub use super::assign::{ANNOUNCED, REACHABLE};

/// What a pass changed, for the log.
#[derive(Debug, Default)]
pub struct LbReport {
    /// (service, IPs) whose IPs changed.
    pub assigned: Vec<(String, Vec<std::net::IpAddr>)>,
    /// (object, message) for every service or pool that is not as asked.
    pub problems: Vec<(String, String)>,
}

/// One LB-IPAM pass. Safe to run at any time and as often as wanted.
pub async fn reconcile<S: TypedStore>(store: &S) -> Result<LbReport, StoreError> {
    let pools = store.list_typed::<LbIpPool>().await?;
    let services = store.list_typed::<Service>().await?;
    let policies = store.list_typed::<L2AnnouncementPolicy>().await?;
    let nodes = store.list_typed::<NodeIpam>().await?;
    let pool_specs = rows::pools(&pools);
    let policy_specs = rows::policies(&policies);
    let mut decided = assign(&rows::pools_with_status(&pools), &rows::services(&services));
    let node_views: Vec<_> = nodes.iter().map(rows::node).collect();
    let (unreachable, bad_policies) = unreachable_pools(&pool_specs, &policy_specs, &node_views);
    // Judged on the statuses this pass decides, so a new IP is judged as it is written.
    let decided_rows: Vec<_> = rows::services(&services)
        .into_iter()
        .map(|(name, spec, status)| {
            let status = decided.services.get(&name).cloned().unwrap_or(status);
            (name, spec, status)
        })
        .collect();
    let unannounced = announce_problems(&policy_specs, &decided_rows, &node_views);
    let mut report = LbReport::default();
    for (policy, message) in bad_policies {
        report
            .problems
            .push((format!("L2AnnouncementPolicy {policy}"), message));
    }
    // Policies decide reachability only once there are some: without any, nothing is announced.
    let judge_reach = !policy_specs.is_empty();
    for p in &pools {
        let Some(mut status) = decided.pools.remove(&p.name) else {
            continue;
        };
        if judge_reach {
            status.conditions.push(match unreachable.get(&p.name) {
                Some(message) => Condition::new(REACHABLE, false, message.clone()),
                None => Condition::new(REACHABLE, true, "inside an announced subnet"),
            });
        }
        for c in status
            .conditions
            .iter()
            .filter(|c| c.kind != "Conflict" && !c.status)
        {
            report
                .problems
                .push((format!("LoadBalancerIPPool {}", p.name), c.message.clone()));
        }
        if status != p.value.status {
            let mut updated = p.value.clone();
            updated.status = status;
            store
                .update_unless_changed(&p.name, &updated, &p.revision)
                .await?;
        }
    }
    for s in &services {
        let Some(mut status) = decided.services.remove(&s.name) else {
            continue;
        };
        if judge_reach {
            // The seed's silent failure made loud: an assigned IP nothing on the link reaches.
            let unreachable_pool = pools.iter().find(|p| {
                unreachable.contains_key(&p.name)
                    && status.ingress.iter().any(|ip| p.value.spec.contains(*ip))
            });
            if let Some(p) = unreachable_pool {
                status.conditions.push(Condition::new(
                    REACHABLE,
                    false,
                    format!(
                        "its IP comes from pool {}: {}",
                        p.name, unreachable[&p.name]
                    ),
                ));
            }
            if !status.ingress.is_empty() {
                status.conditions.push(match unannounced.get(&s.name) {
                    Some(problem) => Condition::new(ANNOUNCED, false, problem.clone()),
                    None => Condition::new(ANNOUNCED, true, "a node may answer for its IPs"),
                });
            }
        }
        for c in status.conditions.iter().filter(|c| !c.status) {
            report
                .problems
                .push((format!("Service {}", s.name), c.message.clone()));
        }
        if status != s.value.status {
            if status.ingress != s.value.status.ingress {
                report
                    .assigned
                    .push((s.name.clone(), status.ingress.clone()));
            }
            let mut updated = s.value.clone();
            updated.status = status;
            store
                .update_unless_changed(&s.name, &updated, &s.revision)
                .await?;
        }
    }
    Ok(report)
}
