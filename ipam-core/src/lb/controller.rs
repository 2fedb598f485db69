//! The operator's LB-IPAM controller: reads pools, services, policies and node records from the
//! store, runs the assignment, and writes what changed: each service's IPs and condition, each
//! pool's counts and conditions, and the warning for pools no announced interface reaches.

use super::{
    announce::{announce_problems, unreachable_pools},
    assign::assign,
    resources::{L2AnnouncementPolicy, LbIpPool, Service, ServiceEndpoints},
    rows,
};
use crate::{
    resources::{Condition, NodeIpam},
    store::{StoreError, TypedStore},
};

pub use super::assign::{ANNOTATIONS_AGREE, ANNOUNCED, REACHABLE};

/// What a pass changed, for the log.
#[derive(Debug, Default)]
pub struct LbReport {
    /// (service, IPs) whose IPs changed.
    pub assigned: Vec<(String, Vec<std::net::IpAddr>)>,
    /// (object, message) for every service or pool that is not as asked.
    pub problems: Vec<(String, String)>,
    /// Every pool's addresses per family, as this pass counted them.
    pub pool_counts: Vec<(String, Vec<super::resources::LbFamilyCount>)>,
}

/// One LB-IPAM pass. Safe to run at any time and as often as wanted.
pub async fn reconcile<S: TypedStore>(store: &S) -> Result<LbReport, StoreError> {
    let pools = store.list_typed::<LbIpPool>().await?;
    let services = store.list_typed::<Service>().await?;
    let policies = store.list_typed::<L2AnnouncementPolicy>().await?;
    let nodes = store.list_typed::<NodeIpam>().await?;
    let endpoints = store.list_typed::<ServiceEndpoints>().await?;
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
    let unannounced = announce_problems(
        &policy_specs,
        &decided_rows,
        &rows::ready_nodes(&endpoints),
        &node_views,
    );
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
        report
            .pool_counts
            .push((p.name.clone(), status.counts.clone()));
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
        if let Some(conflict) = &s.value.spec.conflict {
            status
                .conditions
                .push(Condition::new(ANNOTATIONS_AGREE, false, conflict.clone()));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        lb::resources::{LbIpBlock, LbIpPoolSpec, LbIpPoolStatus, ServiceSpec, ServiceStatus},
        store::embedded::EmbeddedStore,
    };

    /// A Service whose annotations disagree keeps getting its IP (the first annotation in
    /// precedence decides) and carries a false `AnnotationsAgree` condition naming both; the
    /// condition goes once they agree.
    #[tokio::test]
    async fn a_service_whose_annotations_disagree_is_told_and_still_served() {
        let dir = crate::test_util::TempPath::new("lb-controller");
        std::fs::create_dir_all(&*dir).unwrap();
        let store = EmbeddedStore::open(&dir.join("store.redb")).unwrap();
        let pool = LbIpPool {
            spec: LbIpPoolSpec {
                blocks: vec![LbIpBlock {
                    cidr: Some("10.9.0.0/28".into()),
                    ..LbIpBlock::default()
                }],
                service_selector: Default::default(),
                allow_first_last_ips: false,
                auto_assign: true,
                avoid_buggy_ips: false,
                namespaces: Vec::new(),
                priority: None,
                disabled: false,
            },
            status: LbIpPoolStatus::default(),
        };
        store.create_typed("lb", &pool).await.unwrap();
        let mut spec: ServiceSpec = serde_json::from_value(serde_json::json!({
            "type": "LoadBalancer",
            "conflict": "annotations a (1) and b (2) disagree",
        }))
        .unwrap();
        let service = Service {
            spec: spec.clone(),
            status: ServiceStatus::default(),
        };
        store.create_typed("ns/web", &service).await.unwrap();
        let report = reconcile(&store).await.unwrap();
        assert!(
            report
                .problems
                .iter()
                .any(|(o, p)| o == "Service ns/web" && p.contains("disagree")),
            "{:?}",
            report.problems
        );
        let stored = store.get_typed::<Service>("ns/web").await.unwrap().unwrap();
        assert_eq!(stored.value.status.ingress.len(), 1, "served all the same");
        let agree = |s: &Service| {
            s.status
                .conditions
                .iter()
                .find(|c| c.kind == ANNOTATIONS_AGREE)
                .map(|c| c.status)
        };
        assert_eq!(agree(&stored.value), Some(false));
        spec.conflict = None;
        let mut fixed = stored.value.clone();
        fixed.spec = spec;
        store
            .update_typed("ns/web", &fixed, &stored.revision)
            .await
            .unwrap();
        reconcile(&store).await.unwrap();
        let stored = store.get_typed::<Service>("ns/web").await.unwrap().unwrap();
        assert_eq!(agree(&stored.value), None);
        assert_eq!(
            stored.value.status.ingress, fixed.status.ingress,
            "the IP kept"
        );
    }
}
